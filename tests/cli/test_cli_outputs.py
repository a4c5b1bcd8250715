"""Files `wse-emu run` writes besides its report: --trace (Chrome / Perfetto trace JSON),
--plot (PNG heatmaps) and --dump-dir, as a user would open them."""

import json
import os
import stat

import numpy as np
import pytest

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TENSOR_OPS = {"vmov", "vadd", "mv"}  # the tensor ops the gemv program runs
P = Q = 4  # small_gemv's rectangle


@pytest.fixture(scope="module")
def traced(small_gemv, cli):
    root = small_gemv["root"]
    out = cli("run", "small.bin", "--input", "x=x.npy", "--trace", "t.json", "--plot", "p.png",
              "--json", cwd=root)
    assert out.code == 0, out.stderr
    return json.loads(out.stdout), root


def test_trace_is_chrome_trace_json(traced):
    d, root = traced
    doc = json.loads((root / "t.json").read_text())
    events = doc["traceEvents"]
    assert d["trace_events"] == len(events)
    slices = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    assert len(slices) + len(meta) == len(events)
    us_per_cycle = 1e6 / 1.1e9
    for e in slices:
        assert {"ts", "dur", "pid", "tid", "name"} <= set(e)
        assert e["dur"] > 0 and e["ts"] >= 0
        assert e["name"] in TENSOR_OPS and e["args"]["instr"].split()[0] == e["name"]
        start, end = e["args"]["start_cycle"], e["args"]["end_cycle"]
        assert e["ts"] == pytest.approx(start * us_per_cycle)
        assert e["dur"] == pytest.approx((end - start) * us_per_cycle)
        assert end <= d["cycles"]
    # every PE ran one mv: one slice each, on its own named thread
    mv_threads = sorted(e["tid"] for e in slices if e["name"] == "mv")
    assert mv_threads == list(range(P * Q))
    names = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert set(names) == {e["tid"] for e in slices}
    assert sorted(names.values()) == sorted(f"PE ({x},{y})" for x in range(Q) for y in range(P))
    assert any(e["name"] == "process_name" for e in meta)


def test_trace_slices_of_one_pe_do_not_overlap(traced):
    _, root = traced
    slices = [e for e in json.loads((root / "t.json").read_text())["traceEvents"]
              if e["ph"] == "X"]
    for tid in {e["tid"] for e in slices}:
        spans = sorted((e["args"]["start_cycle"], e["args"]["end_cycle"])
                       for e in slices if e["tid"] == tid)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_plot_is_a_real_png(traced):
    import matplotlib.image

    _, root = traced
    data = (root / "p.png").read_bytes()
    assert data[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(root / "p.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert len(np.unique(image.reshape(-1, image.shape[2]), axis=0)) > 16  # not a blank canvas
    assert not [p.name for p in root.iterdir() if "tmp" in p.name]


def test_a_deadlocked_run_writes_no_trace_or_plot(tmp_path, assemble, cli):
    """A run that did not halt has no results: no output file at all, and it says so."""
    assemble(tmp_path, "wait", ".region w, 0, 0, 2, 1\n    .alloc buf, 16\n"
             "    dmem d1, f32, buf, 4\n    dfin d0, f32, 3, 4\n    vmov d1, d0\n    halt\n"
             ".endregion\n")
    out = cli("run", "wait.bin", "--trace", "t.json", "--plot", "p.png", cwd=tmp_path)
    assert out.code == 1
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "p.png").exists()
    assert out.stderr.rstrip().endswith("(no output file written)")


def test_dump_dir_holds_every_output(small_gemv, cli, tmp_path):
    out = cli("run", small_gemv["bin"], "--input", f"x={small_gemv['root'] / 'x.npy'}",
              "--dump-dir", "out", cwd=tmp_path)
    assert out.code == 0, out.stderr
    [y_file] = (tmp_path / "out").iterdir()
    assert y_file.name == "y.npy"
    y = np.load(y_file)
    W, x = small_gemv["W"].astype(np.float64), small_gemv["x"].astype(np.float64)
    np.testing.assert_array_less(np.abs(y - W @ x), 1e-5 * (np.abs(W) @ np.abs(x)))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_written_files_get_the_usual_permissions(small_gemv, traced, cli, tmp_path):
    expected = 0o666 & ~_umask()
    cli("disasm", small_gemv["bin"], "-o", tmp_path, cwd=tmp_path)
    assert cli("asm", tmp_path / "small.wsa", "-o", "again.bin", cwd=tmp_path).code == 0
    _, root = traced
    for path in (tmp_path / "again.bin", root / "t.json", root / "p.png", tmp_path / "small.wsa"):
        assert stat.S_IMODE(path.stat().st_mode) == expected, path.name


@pytest.mark.parametrize("option", ["--trace", "--plot"])
def test_output_into_a_missing_folder_is_refused_up_front(small_gemv, cli, user_error,
                                                          tmp_path, option):
    line = user_error(cli("run", small_gemv["bin"], "--input",
                          f"x={small_gemv['root'] / 'x.npy'}", "--dump-dir", "out", option,
                          "missing/f", cwd=tmp_path))
    assert "missing/f" in line and "tmp" not in line
    assert not (tmp_path / "out").exists()

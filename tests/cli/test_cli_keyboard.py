"""Issue 27, at the keyboard: Ctrl-C stops every long command (exit 130, one line); a run that
does not halt writes no file; nothing wrong or empty passes as a success; the machine comes
from program.bin; the rough edges of the inputs a user gives (ids, dtypes, paths)."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from wse_emu.apps.demo import write_gpt2

TINY = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2,
        "n_head": 4, "vocab_size": 128, "n_positions": 32, "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new", "tie_word_embeddings": True}

SPIN = ".region spin, 0, 0, 2, 2\nloop:\n    addi r1, r1, 1\n    jmp loop\n.endregion\n"

DEADLOCK = """\
.route 0, 0, 1, 1, 3, rx=RAMP, tx=E
.route 1, 0, 1, 1, 3, rx=W, tx=RAMP
.route 1, 0, 1, 1, 5, rx=RAMP, tx=W
.route 0, 0, 1, 1, 5, rx=E, tx=RAMP
.region pair, 0, 0, 2, 1
    .alloc buf, 16
    dmem d1, f32, buf, 4
    beq X, r0, left
    dfin d0, f32, 3, 4
    vmov d1, d0
    halt
left:
    dfin d0, f32, 5, 4
    vmov d1, d0
    halt
.endregion
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory, wse):
    """A tiny random GPT-2 folder compiled for wse3, wse2 and shape-only, and ids files."""
    root = tmp_path_factory.mktemp("keyboard")
    write_gpt2(root / "tiny", TINY)
    for args in (("-o", "m.bin"), ("--machine", "wse2", "-o", "m2.bin"),
                 ("--shape-only", "-o", "s.bin")):
        out = wse("compile", "tiny", *args, cwd=root)
        assert out.code == 0, out.stderr
    np.save(root / "ids.npy", np.array([5], dtype=np.int32))
    return root


@pytest.fixture
def spin(tmp_path, assemble):
    return assemble(tmp_path, "spin", SPIN)


# -- Ctrl-C -----------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", [(), ("--reference",)], ids=["core", "reference"])
@pytest.mark.parametrize("signals", [1, 2])
def test_ctrl_c_stops_an_endless_run_with_130(spin, engine, signals):
    import sys

    exe = Path(sys.executable).parent / "wse-emu"
    p = subprocess.Popen([str(exe), "run", "spin.bin", *engine, "--dump-dir", "D"],
                         cwd=spin.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    time.sleep(4)  # into the run (imports and a cached core take ~1-2 s)
    for _ in range(signals):
        p.send_signal(signal.SIGINT)
        time.sleep(0.2)
    try:
        out, err = p.communicate(timeout=120)  # without the fix: never (the loop ignores it)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("wse-emu run did not stop on SIGINT")
    assert p.returncode == 130, err
    assert err.splitlines() == ["wse-emu: interrupted"], err
    assert not (spin.parent / "D").exists()


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_ctrl_c_in_generate_and_bench_is_130(model, cli, monkeypatch, command):
    import wse_emu.apps.benchsuite as bs
    import wse_emu.emulator.generate as g

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(g.Generator, "generate", interrupted)
    monkeypatch.setattr(bs, "run_suite", interrupted)
    args = (("generate", "m.bin", "--prompt-ids", "1") if command == "generate"
            else ("bench", "--models", "gpt2-small", "-o", "b"))
    out = cli(*args, cwd=model)
    assert out.code == 130
    assert out.stderr.splitlines() == ["wse-emu: interrupted"]
    assert not (model / "b").exists()


# -- runs that do not halt write nothing ------------------------------------------------------

def test_max_cycles_writes_no_output_and_does_not_contradict_itself(spin, cli, wse):
    folder = spin.parent
    out = wse("run", "spin.bin", "--max-cycles", "100", "--dump-dir", "D", "--trace", "t.json",
              "--plot", "p.png", cwd=folder)
    assert out.code == 1
    assert not (folder / "D").exists() and not (folder / "t.json").exists()
    assert not (folder / "p.png").exists()
    assert out.stderr.splitlines() == ["wse-emu: stopped at --max-cycles 100: the program had "
                                       "not halted (no output file written)"]
    blocked = [line for line in out.stdout.splitlines() if line.startswith("  PE")]
    assert blocked and all(line.endswith("still running at --max-cycles 100")
                           for line in blocked), blocked


def test_deadlock_writes_no_output_and_says_what_its_utilisation_covers(tmp_path, assemble,
                                                                        cli):
    assemble(tmp_path, "pair", DEADLOCK)
    out = cli("run", "pair.bin", "--dump-dir", "D", cwd=tmp_path)
    assert out.code == 1, out.stderr
    assert not (tmp_path / "D").exists()
    assert "mean utilisation until the deadlock 100.0%" in out.stdout


def test_dump_dir_of_a_halted_run_has_every_output_and_no_temporary_file(small_gemv, cli,
                                                                          tmp_path):
    out = cli("run", small_gemv["bin"], "--input", f"x={small_gemv['root'] / 'x.npy'}",
              "--dump-dir", tmp_path / "D", cwd=tmp_path)
    assert out.code == 0, out.stderr
    assert sorted(os.listdir(tmp_path / "D")) == ["y.npy"]
    y = np.load(tmp_path / "D" / "y.npy")
    np.testing.assert_allclose(y, small_gemv["W"] @ small_gemv["x"], rtol=1e-4, atol=1e-4)


# -- nothing wrong passes as success ----------------------------------------------------------

@pytest.mark.parametrize("args", [
    ("run", "s.bin", "--input", "input_ids=ids.npy"),
    ("generate", "s.bin", "--prompt-ids", "1,2"),
])
def test_shape_only_program_needs_timing_only(model, cli, user_error, args):
    user_error(cli(*args, cwd=model), "s.bin", "--shape-only", "--timing-only")


@pytest.mark.parametrize("values, fragment", [
    (np.array([100000], dtype=np.int32), "token id 100000 is outside the vocabulary (0..127)"),
    (np.array([-1], dtype=np.int32), "token id -1 is outside the vocabulary"),
    (np.array([1.0]), "is i32, but the values given are float64"),
    (np.array([True]), "is i32, but the values given are bool"),
])
def test_run_refuses_bad_token_ids(model, cli, user_error, values, fragment):
    np.save(model / "bad.npy", values)
    user_error(cli("run", "m.bin", "--input", "input_ids=bad.npy", cwd=model),
               "--input input_ids=bad.npy", fragment)


def test_run_refuses_a_position_past_the_cache(model, cli, user_error):
    np.save(model / "pos.npy", np.array([32], dtype=np.int32))
    user_error(cli("run", "s.bin", "--timing-only", "--input", "input_ids=ids.npy",
                   "--input", "position_ids=pos.npy", cwd=model),
               "position 32 is outside the KV cache (0..31)")


@pytest.mark.parametrize("dtype", ["bool", "int64", "float16", "float64"])
def test_f32_input_refuses_other_dtypes(small_gemv, cli, user_error, tmp_path, dtype):
    np.save(tmp_path / "x.npy", small_gemv["x"].astype(dtype))
    user_error(cli("run", small_gemv["bin"], "--input", "x=x.npy", cwd=tmp_path),
               "--input x=x.npy", f"input 'x' is f32, but the values given are {dtype}")


@pytest.mark.parametrize("ids, fragment", [
    ("1,,2", "'' is not a token id"),
    ("1,2.5", "'2.5' is not a token id"),
    ("-3", "'-3' is not a token id"),
    ("999", "token id 999 is outside the vocabulary (0..127)"),
    ("1,999", "token id 999 is outside the vocabulary (0..127)"),
])
def test_generate_refuses_bad_prompt_ids_before_running(model, cli, user_error, ids, fragment):
    user_error(cli("generate", "m.bin", "--prompt-ids", ids, cwd=model), fragment)


def test_generate_checks_the_kv_cache_before_starting(model, cli, user_error, monkeypatch):
    import wse_emu.emulator.generate as g

    def no_run(self, token_id):
        raise AssertionError("a step ran before the capacity was checked")

    monkeypatch.setattr(g.Generator, "step", no_run)
    user_error(cli("generate", "m.bin", "--prompt-ids", "1,2", "--tokens", "40", cwd=model),
               "a prompt of 2 and 40 tokens need 41 cached positions",
               "max_context 32", "at most 31 tokens")
    user_error(cli("generate", "s.bin", "--timing-only", "--position", "30", "--tokens", "3",
                   cwd=model), "at most 2 tokens")
    # no room left at all: the bound that would fit, not "at most 0 tokens"
    user_error(cli("generate", "s.bin", "--timing-only", "--position", "40", "--tokens", "3",
                   cwd=model), "start at position 29 at most")
    prompt = ",".join(["1"] * 33)
    user_error(cli("generate", "m.bin", "--prompt-ids", prompt, "--tokens", "2", cwd=model),
               "a prompt of 33 and 2 tokens need 34", "give a prompt of at most 31 tokens")
    user_error(cli("generate", "s.bin", "--timing-only", "--position", "0", "--tokens", "40",
                   cwd=model), "ask for at most 32 tokens")


def test_generate_fills_the_cache_exactly(model, cli):
    out = cli("generate", "s.bin", "--timing-only", "--prompt-ids", "1,2", "--tokens", "31",
              "--json", cwd=model)
    assert out.code == 0, out.stderr
    assert len(json.loads(out.stdout)["cycles_per_token"]) == 31


# -- decode at a position without the prefill (issue 26 item 10) -----------------------------

def test_generate_from_a_position_times_the_step_a_prefill_would_reach(model, cli):
    n = 20
    prefilled = cli("generate", "s.bin", "--timing-only", "--prompt-ids",
                    ",".join(["3"] * (n + 1)), "--tokens", "3", "--json", cwd=model)
    direct = cli("generate", "s.bin", "--timing-only", "--position", str(n), "--decode-token",
                 "3", "--tokens", "3", "--json", cwd=model)
    assert prefilled.code == 0 and direct.code == 0, prefilled.stderr + direct.stderr
    a, b = json.loads(prefilled.stdout), json.loads(direct.stdout)
    assert a["cycles_per_token"] == b["cycles_per_token"]
    assert a["start_position"] is None and b["start_position"] == n
    np.save(model / "pos.npy", np.array([n], dtype=np.int32))
    np.save(model / "tok.npy", np.array([3], dtype=np.int32))
    run = cli("run", "s.bin", "--timing-only", "--input", "input_ids=tok.npy", "--input",
              "position_ids=pos.npy", "--json", cwd=model)
    assert run.code == 0, run.stderr
    assert json.loads(run.stdout)["cycles"] == b["cycles_per_token"][0]
    early = cli("generate", "s.bin", "--timing-only", "--position", "0", "--tokens", "1",
                "--json", cwd=model)
    # the wafer mapping's step costs the slots a PE holds, not the position: never more early
    assert early.code == 0, early.stderr
    assert json.loads(early.stdout)["cycles_per_token"][0] <= b["cycles_per_token"][0]


def test_position_needs_timing_only(model, cli, user_error):
    user_error(cli("generate", "m.bin", "--position", "4", cwd=model),
               "--position needs --timing-only")


# -- the machine from program.bin -------------------------------------------------------------

def test_run_generate_info_take_the_machine_from_program_bin(model, cli, user_error):
    run = cli("run", "m2.bin", "--input", "input_ids=ids.npy", "--json", cwd=model)
    assert run.code == 0, run.stderr
    assert json.loads(run.stdout)["machine"] == "wse2"
    gen = cli("generate", "m2.bin", "--prompt-ids", "1", "--tokens", "1", cwd=model)
    assert gen.code == 0 and "tokens/s on wse2" in gen.stdout, gen.stderr
    info = cli("info", "m2.bin", cwd=model)
    assert info.code == 0 and "machine: wse2 (compiled for it); fits" in info.stdout
    for args in (("run", "m2.bin", "--input", "input_ids=ids.npy"),
                 ("generate", "m2.bin", "--prompt-ids", "1"), ("info", "m2.bin")):
        user_error(cli(*args, "--machine", "wse3", cwd=model),
                   "m2.bin was compiled for machine 'wse2', not 'wse3'")


def test_hbm_program_on_a_mesh_machine_gets_a_hint(tmp_path, cli, user_error, monkeypatch):
    repo = Path(__file__).resolve().parents[2]
    np.save(tmp_path / "W.npy", np.ones((128, 64), dtype=np.float32))
    out = cli("asm", repo / "programs" / "hbm_gemv" / "hbm_gemv.wsa", "-D", "M=128", "-D",
              "K=64", "-D", "C=2", "--data", "W=W.npy", "-o", "h.bin", cwd=tmp_path)
    assert out.code == 0, out.stderr
    np.save(tmp_path / "x.npy", np.ones(64, dtype=np.float32))
    user_error(cli("run", "h.bin", "--input", "x=x.npy", cwd=tmp_path),
               "machine wse3 has no HBM", "--machine h100")
    # on its machine, --plot shows the cores' DMA waits and the HBM channels
    import matplotlib.axes

    titles = []
    original = matplotlib.axes.Axes.set_title

    def set_title(self, label, *a, **k):
        titles.append(label)
        return original(self, label, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", set_title)
    out = cli("run", "h.bin", "--machine", "h100", "--input", "x=x.npy", "--plot", "h.png",
              cwd=tmp_path)
    assert out.code == 0, out.stderr
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
    assert "each core's cycles" in titles and any(t.startswith("HBM channels") for t in titles)


def test_hbm_program_too_big_for_a_mesh_pe_gets_the_hint_too(tmp_path, cli, user_error):
    """The hbm_gemv of the README needs 135 KB of SRAM a core: on wse3 the SRAM check fires
    first, and still says where the program belongs."""
    repo = Path(__file__).resolve().parents[2]
    np.save(tmp_path / "W.npy", np.ones((4096, 1024), dtype=np.float32))
    out = cli("asm", repo / "programs" / "hbm_gemv" / "hbm_gemv.wsa", "-D", "M=4096", "-D",
              "K=1024", "-D", "C=64", "--data", "W=W.npy", "-o", "h.bin", cwd=tmp_path)
    assert out.code == 0, out.stderr
    np.save(tmp_path / "x.npy", np.ones(1024, dtype=np.float32))
    user_error(cli("run", "h.bin", "--input", "x=x.npy", cwd=tmp_path),
               "bytes of SRAM", "the program uses HBM", "--machine h100")


def test_demo_refuses_an_hbm_machine(cli, user_error, tmp_path):
    user_error(cli("demo", "--machine", "h100", cwd=tmp_path), "'h100' keeps its weights in HBM")


# -- compile's inputs -------------------------------------------------------------------------

def test_compile_refuses_a_weights_file_and_takes_config_json(model, cli, user_error, tmp_path):
    user_error(cli("compile", model / "tiny" / "model.safetensors", "-o", "x.bin",
                   cwd=tmp_path), "give the model's folder")
    (tmp_path / "notes.json").write_bytes(b"\xff\xfe\x00binary")
    user_error(cli("compile", "notes.json", "-o", "x.bin", cwd=tmp_path), "not a *.graph.json")
    out = cli("compile", model / "tiny" / "config.json", "-o", "c.bin", cwd=tmp_path)
    assert out.code == 0, out.stderr
    assert (tmp_path / "c.bin").is_file()


@pytest.mark.parametrize("args", [
    ("compile", "tiny", "-o", "deep/er/c.bin"),
    ("asm", "spin.wsa", "-o", "deep/er/c.bin"),
    ("disasm", "m.bin", "-o", "deep/er/dis"),
    ("run", "m.bin", "--input", "input_ids=ids.npy", "--dump-dir", "deep/er/D"),
    ("run", "m.bin", "--input", "input_ids=ids.npy", "--trace", "deep/er/t.json"),
    ("run", "m.bin", "--input", "input_ids=ids.npy", "--plot", "deep/er/p.png"),
    ("bench", "--models", "tiny/config.json", "--machines", "test64", "-o", "deep/er/b"),
])
def test_every_output_refuses_a_missing_folder_alike(model, cli, user_error, args):
    (model / "spin.wsa").write_text(SPIN)
    user_error(cli(*args, cwd=model), "deep/er/", "No such file or directory",
               "create it first")
    assert not (model / "deep").exists()


def test_truncated_checkpoint_is_refused_at_compile_time(model, cli, user_error, tmp_path):
    folder = tmp_path / "cut"
    folder.mkdir()
    (folder / "config.json").write_text((model / "tiny" / "config.json").read_text())
    data = (model / "tiny" / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:len(data) // 2])
    user_error(cli("compile", "cut", "-o", "c.bin", cwd=tmp_path), "truncated")
    assert not (tmp_path / "c.bin").exists()


def test_weights_cut_short_after_the_compile_are_one_line(model, cli, user_error, tmp_path):
    folder = tmp_path / "later"
    folder.mkdir()
    for f in ("config.json", "model.safetensors"):
        (folder / f).write_bytes((model / "tiny" / f).read_bytes())
    assert cli("compile", "later", "-o", "l.bin", cwd=tmp_path).code == 0
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:len(data) // 2])
    user_error(cli("run", "l.bin", "--input", f"input_ids={model / 'ids.npy'}", cwd=tmp_path),
               "model.safetensors", "shorter or other than when the program was compiled")
    user_error(cli("generate", "l.bin", "--prompt-ids", "1", cwd=tmp_path),
               "shorter or other than when the program was compiled")


def test_missing_weights_name_the_flag(tmp_path, cli, user_error):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY))
    line = user_error(cli("compile", "m", "-o", "c.bin", cwd=tmp_path), "--shape-only")
    assert line.index("--shape-only") < line.index("shape_only=True")


def test_compile_dtype_defaults_to_the_checkpoints(tmp_path, cli):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file
    from safetensors.numpy import load_file

    write_gpt2(tmp_path / "f32", TINY)
    (tmp_path / "b16").mkdir()
    (tmp_path / "b16" / "config.json").write_text((tmp_path / "f32" / "config.json").read_text())
    tensors = load_file(str(tmp_path / "f32" / "model.safetensors"))
    save_file({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tensors.items()},
              str(tmp_path / "b16" / "model.safetensors"))
    dtypes = {}
    for name in ("f32", "b16"):
        out = cli("compile", name, "--json", "-o", f"{name}.bin", cwd=tmp_path)
        assert out.code == 0, out.stderr
        dtypes[name] = json.loads(out.stdout)["dtype"]
    assert dtypes == {"f32": "f32", "b16": "bf16"}
    out = cli("compile", "b16", "--dtype", "fp32", "--json", "-o", "x.bin", cwd=tmp_path)
    assert json.loads(out.stdout)["dtype"] == "f32"


# -- outputs and input files ------------------------------------------------------------------

def test_a_text_file_given_as_npy_says_so(small_gemv, cli, user_error, tmp_path):
    (tmp_path / "x.npy").write_text("1 2 3\n")
    line = user_error(cli("run", small_gemv["bin"], "--input", "x=x.npy", cwd=tmp_path),
                      "x.npy is not a .npy file", "numpy.save")
    assert "pickle" not in line


def test_conflicting_duplicates_are_refused_alike(cli, user_error, tmp_path, gemv_wsa):
    np.save(tmp_path / "W.npy", np.ones((64, 32), dtype=np.float32))
    np.save(tmp_path / "V.npy", np.ones((64, 32), dtype=np.float32))
    user_error(cli("asm", gemv_wsa, "-D", "M=64", "-D", "K=32", "-D", "P=4", "-D", "Q=4",
                   "--data", "W=W.npy", "--data", "W=V.npy", "-o", "g.bin", cwd=tmp_path),
               "--data W is given twice")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root may write anywhere")
def test_permission_errors_name_the_users_path(small_gemv, cli, user_error, tmp_path,
                                               gemv_wsa):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        np.save(tmp_path / "W.npy", np.ones((64, 32), dtype=np.float32))
        line = user_error(cli("asm", gemv_wsa, "-D", "M=64", "-D", "K=32", "-D", "P=4", "-D",
                              "Q=4", "--data", "W=W.npy", "-o", "locked/g.bin", cwd=tmp_path),
                          "locked/g.bin", "permission denied")
        assert ".tmp" not in line
        user_error(cli("run", small_gemv["bin"], "--input",
                       f"x={small_gemv['root'] / 'x.npy'}", "--dump-dir", "locked/D",
                       cwd=tmp_path), "locked/D", "permission denied")
    finally:
        locked.chmod(0o755)


# -- trace and plot ---------------------------------------------------------------------------

def test_trace_at_its_cap_says_so(small_gemv, cli, tmp_path):
    x = f"x={small_gemv['root'] / 'x.npy'}"
    out = cli("run", small_gemv["bin"], "--input", x, "--trace", "t.json", "--trace-cap", "10",
              cwd=tmp_path)
    assert out.code == 0, out.stderr
    [note] = out.stderr.splitlines()
    assert note.startswith("wse-emu: note: --trace stopped at its cap of 10 events")
    assert "--trace-cap" in note
    d = json.loads(cli("run", small_gemv["bin"], "--input", x, "--trace", "t.json", "--json",
                       cwd=tmp_path).stdout)
    assert "trace_truncated" not in d


def test_plot_colour_scales_are_fixed(small_gemv, cli, tmp_path, monkeypatch):
    import matplotlib.axes

    seen = []
    original = matplotlib.axes.Axes.imshow

    def imshow(self, data, **kw):
        seen.append((kw.get("vmin"), kw.get("vmax"), float(np.nanmax(data))))
        return original(self, data, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", imshow)
    out = cli("run", small_gemv["bin"], "--input", f"x={small_gemv['root'] / 'x.npy'}",
              "--plot", "p.png", cwd=tmp_path)
    assert out.code == 0, out.stderr
    assert (tmp_path / "p.png").stat().st_size > 0
    assert [(lo, hi) for lo, hi, _ in seen] == [(0.0, 100.0), (0.0, 100.0)]
    assert all(top <= 100.0 for _, _, top in seen)


# -- progress and notices ---------------------------------------------------------------------

def test_compile_notice_only_when_numba_compiles():
    from numba import njit

    from wse_emu.apps.progress import NOTICE, compile_notice

    lines = []

    @njit
    def fresh(a):
        return a + 1

    with compile_notice(True, lines.append):
        fresh(1)
        fresh(2)  # compiled already: nothing more
    assert lines == [NOTICE]
    with compile_notice(True, lines.append):
        fresh(3)
    assert lines == [NOTICE]
    with compile_notice(False, lines.append):
        fresh(4.5)  # a new signature compiles, but nothing is shown
    assert lines == [NOTICE]


def test_progress_bar_draws_only_when_shown(capsys):
    from wse_emu.apps.progress import Bar

    bar = Bar(4, "runs", show=False)
    bar.step()
    bar.clear()
    assert capsys.readouterr().err == ""
    bar = Bar(4, "runs", show=True)
    bar.step()
    bar.step()
    err = capsys.readouterr().err
    assert "[############------------] 2/4 runs" in err
    bar.clear()
    assert capsys.readouterr().err.strip() == ""


def test_run_progress_draws_a_bar_against_max_cycles_only_when_shown(capsys):
    from wse_emu.apps.cli import clear_status, run_progress

    run_progress(False, 100)(50, 7)
    assert capsys.readouterr().err == ""
    run_progress(True, 100)(50, 7)
    err = capsys.readouterr().err
    assert "cycle 50 [############------------] of --max-cycles 100" in err
    clear_status()
    assert capsys.readouterr().err.strip() == ""

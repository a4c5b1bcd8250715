"""The issue's bar, end to end as a new user meets it: assemble gemv 512 x 512 on 8 x 8 PEs with
resident W, run it with x from a .npy, read y and the JSON report; disassemble and reassemble;
run again and get the same report."""

import json
import shutil

import numpy as np
import pytest

from wse_emu.isa.machine import load_machine
from wse_emu.isa.spec import COST_CLASSES

WSE3_CLOCK_HZ = 1.1e9
M = K = 512
P = Q = 8
MT, KT = M // P, K // Q


@pytest.fixture(scope="module")
def bar_run(gemv_bar, wse):
    root = gemv_bar["root"]
    out = wse("run", "g.bin", "--input", "x=x.npy", "--dump-dir", "out", "--json", cwd=root)
    assert out.code == 0, out.stderr
    return out, root


def test_asm_writes_the_binary_and_says_so_on_stderr(gemv_bar):
    asm = gemv_bar["asm"]
    assert asm.code == 0, asm.stderr
    assert asm.stdout == ""
    assert asm.stderr.strip() == "wrote g.bin: 16 regions, 64 PEs"  # row 0, rows 1-7 per column
    assert gemv_bar["bin"].read_bytes()[:8] == b"WSEPROG\0"


def test_run_dumps_y_equal_to_w_times_x(bar_run, gemv_bar):
    out, root = bar_run
    assert out.stderr == ""  # no progress line, warning or log when stderr is not a terminal
    assert sorted(p.name for p in (root / "out").iterdir()) == ["y.npy"]
    y = np.load(root / "out" / "y.npy")
    assert y.dtype == np.float32 and y.shape == (M,)
    W, x = gemv_bar["W"].astype(np.float64), gemv_bar["x"].astype(np.float64)
    # relative to the sum of magnitudes of each dot product, the scale of its fp32 rounding
    np.testing.assert_array_less(np.abs(y - W @ x), 1e-4 * (np.abs(W) @ np.abs(x)))


def test_run_json_reports_cycles_time_and_work(bar_run):
    out, _ = bar_run
    d = json.loads(out.stdout)  # stdout is exactly one JSON object
    assert d["status"] == "halted"
    assert d["program"] == "gemv" and d["machine"] == "wse3"
    assert d["dumped"] == ["y"]
    assert "problem" not in d and "blocked" not in d
    cycles = d["cycles"]
    assert isinstance(cycles, int)
    m = load_machine("wse3")
    mv = KT * (m.issue_overhead + MT // m.simd_width("fmac_f32"))  # one column op a column
    per_hop = m.hop_latency + 2 * m.ramp_latency + m.issue_overhead
    # the x multicast and the streamed row reduction add about KT + P hops and MT + Q hops on
    # top of the mv; forwarding whole vectors hop by hop would add (Q - 1) * MT
    assert mv < cycles < mv + KT + MT + 2 * (P + Q) * per_hop < mv + (Q - 1) * MT
    assert d["seconds"] == pytest.approx(cycles / WSE3_CLOCK_HZ, rel=1e-12)
    assert d["pes"] == d["pes_active"] == P * Q
    assert isinstance(d["host_seconds"], float) and d["host_seconds"] > 0
    assert d["host_threads"] == 1  # 1 MB of tiles: too little for the helper thread to pay

    classes = d["classes"]
    assert list(classes) == list(COST_CLASSES)
    assert sum(classes.values()) == d["instructions"]
    assert classes["fmac"] == P * Q  # one mv per PE
    # vmov: row 0 sends its x piece, rows 1.. receive it, column 0 starts each row's chain
    assert classes["move"] == Q + (P - 1) * Q + P
    assert classes["add"] == (Q - 1) * P  # one streaming vadd per PE right of column 0
    assert classes["special"] == classes["fspecial"] == 0

    pc = d["pe_cycles"]
    assert pc["busy"] + pc["recv_stall"] + pc["backpressure_stall"] <= cycles * d["pes"]
    assert pc["mean_utilisation"] == pytest.approx(pc["busy"] / (cycles * d["pes"]), abs=1e-4)
    assert pc["max_busy"] <= cycles


def test_run_json_fabric_totals_match_the_routes(bar_run):
    d = json.loads(bar_run[0].stdout)
    fab = d["fabric"]
    x_messages, y_messages = Q, (Q - 1) * P  # one multicast per column, one per row link
    assert fab["messages"] == x_messages + y_messages
    assert fab["wavelets"] == x_messages * KT + y_messages * MT
    # an x tree crosses P-1 south links and delivers on P-1 ramps; a partial sum one east
    # link and one ramp
    assert fab["wavelet_hops"] == x_messages * 2 * (P - 1) * KT + y_messages * 2 * MT
    # ramps into columns 1.. of rows 1.. carry both x and a partial sum: one link, counted once
    ramps = Q * (P - 1) + (Q - 1)
    assert fab["links_used"] == Q * (P - 1) + P * (Q - 1) + ramps
    busiest = fab["busiest_links"]
    assert busiest and [b["wavelets"] for b in busiest] == sorted(
        (b["wavelets"] for b in busiest), reverse=True)
    top = busiest[0]
    assert (top["port"], top["wavelets"]) == ("RAMP", KT + MT)
    assert top["x"] >= 1 and top["y"] >= 1
    for b in busiest:
        assert b["utilisation"] == pytest.approx(b["wavelets"] / d["cycles"], abs=1e-4)


def test_disasm_then_plain_asm_is_byte_identical(gemv_bar, wse, tmp_path):
    shutil.copy(gemv_bar["bin"], tmp_path / "g.bin")
    dis = wse("disasm", "g.bin", "-o", "dir", cwd=tmp_path)
    assert dis.code == 0, dis.stderr
    assert dis.stdout.strip() == "dir/g.wsa"
    # the resident W leaves as a .npy beside the .wsa, with the same values
    np.testing.assert_array_equal(np.load(tmp_path / "dir" / "g.W.npy"), gemv_bar["W"])
    again = wse("asm", "dir/g.wsa", "-o", "g2.bin", cwd=tmp_path)
    assert again.code == 0, again.stderr
    assert (tmp_path / "g2.bin").read_bytes() == gemv_bar["bin"].read_bytes()


def _without_host_time(stdout: str) -> dict:
    d = json.loads(stdout)
    assert d.pop("host_seconds") > 0
    assert d.pop("load_seconds") > 0  # the program's load, before the run
    assert d.pop("compile_seconds") >= 0
    assert d.pop("host_threads") in (1, 2)  # the reference: 1; the core: 2 given two CPUs
    return d


def test_two_runs_and_both_engines_give_the_same_report(bar_run, wse):
    first, root = bar_run
    second = wse("run", "g.bin", "--input", "x=x.npy", "--dump-dir", "out2", "--json", cwd=root)
    ref = wse("run", "g.bin", "--input", "x=x.npy", "--dump-dir", "out3", "--json",
              "--reference", cwd=root)
    assert second.code == ref.code == 0, second.stderr + ref.stderr
    assert _without_host_time(first.stdout) == _without_host_time(second.stdout) \
        == _without_host_time(ref.stdout)
    y = (root / "out" / "y.npy").read_bytes()
    assert (root / "out2" / "y.npy").read_bytes() == y == (root / "out3" / "y.npy").read_bytes()


def test_text_report_shows_the_same_numbers(bar_run, wse):
    d = json.loads(bar_run[0].stdout)
    text = wse("run", "g.bin", "--input", "x=x.npy", cwd=bar_run[1])
    assert text.code == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "program   gemv on wse3: halted"
    assert lines[1].startswith(f"cycles    {d['cycles']:,}  ")
    assert f"{d['instructions']:,}" in text.stdout and f"{d['fabric']['wavelets']:,}" in text.stdout


def test_info_describes_the_binary(gemv_bar, wse):
    info = wse("info", "g.bin", cwd=gemv_bar["root"])
    assert info.code == 0, info.stderr
    # 16 regions list whole: --all changes nothing (tests/isa/test_isa_info.py: the limit)
    assert wse("info", "--all", "g.bin", cwd=gemv_bar["root"]).stdout == info.stdout
    # two regions a column: row 0 (gemv_0_c) and rows 1-7 (gemv_1_c)
    assert info.stdout.startswith("program 'gemv': 16 region(s), 64 PEs used, bounding box 8 x "
                                  "8, 3 color(s)")
    assert "params: M=512, K=512, P=8, Q=8, DT=f32" in info.stdout
    rows = {line.split()[0]: line.split() for line in info.stdout.splitlines()
            if line.strip().startswith("gemv_")}
    assert sorted(rows) == sorted(f"gemv_{h}_{c}" for h in (0, 1) for c in range(8))
    assert rows["gemv_0_3"][1:6] == ["(3,", "0,", "1", "x", "1)"]
    assert rows["gemv_1_3"][1:7] == ["(3,", "1,", "1", "x", "7)", "7"]
    for name, y in (("gemv_1_0", 0), ("gemv_1_7", MT)):  # only column 7 holds y
        instructions, sram = int(rows[name][-2]), int(rows[name][-1].replace(",", ""))
        # code, then the W tile, the x piece, the partial sum (and y): allocs 8-byte aligned
        assert sram == 8 * instructions + 4 * (MT * KT + KT + MT) + 4 * y
    assert "(512, 512)" in info.stdout and "1,048,576" in info.stdout

"""Runs that do not halt: deadlock, --max-cycles and faults. Each exits 1 with the usual report
on stdout followed by what went wrong, one headline line on stderr (not in --json mode, where
the JSON carries it), and names every PE it blames by coordinates, pc and instruction text.
One real process per outcome checks the exit status; the variations run in-process."""

import json

import pytest

# PE (1,0) waits on color 3 for PE (0,0), which waits on color 5 for PE (1,0).
DEADLOCK = """\
.route 0, 0, 1, 1, 3, rx=RAMP, tx=E
.route 1, 0, 1, 1, 3, rx=W, tx=RAMP
.route 1, 0, 1, 1, 5, rx=RAMP, tx=W
.route 0, 0, 1, 1, 5, rx=E, tx=RAMP
.region pair, 0, 0, 2, 1
    .alloc buf, 16
    dmem d1, f32, buf, 4            ; pc 0
    beq X, r0, left                 ; pc 1
    dfin d0, f32, 3, 4              ; pc 2
    vmov d1, d0                     ; pc 3: PE (1,0) blocks here
    dfout d2, f32, 5, 4
    vmov d2, d1
    halt
left:
    dfin d0, f32, 5, 4              ; pc 7
    vmov d1, d0                     ; pc 8: PE (0,0) blocks here
    dfout d2, f32, 3, 4
    vmov d2, d1
    halt
.endregion
"""

CROWD = """\
.region crowd, 0, 0, 8, 5           ; 40 PEs, all waiting for a color nobody sends
    .alloc buf, 16
    dmem d1, f32, buf, 4
    dfin d0, f32, 7, 4
    vmov d1, d0
    halt
.endregion
"""

SPIN = """\
.region spin, 0, 0, 2, 2
loop:
    addi r1, r1, 1
    jmp loop
.endregion
"""

# PE (1,0) moves its descriptor by OFF bytes, then writes through it at pc 4.
FAULT = """\
.param OFF = 0
.region pair, 0, 0, 2, 1
    .alloc buf, 16
    dmem d0, f32, buf, 4
    beq X, r0, done
    li r1, OFF
    daddr d0, r1, buf
    vfill d0, f0
done:
    halt
.endregion
"""

STUCK = "deadlock at cycle 3: 2 PEs blocked, none can run"  # three scalar instructions each


def test_deadlock_report_names_both_pes(tmp_path, assemble, wse):
    assemble(tmp_path, "pair", DEADLOCK)
    out = wse("run", "pair.bin", cwd=tmp_path)
    assert out.code == 1, out.stderr
    assert out.stderr.splitlines() == [f"wse-emu: {STUCK}"]
    lines = out.stdout.splitlines()
    assert lines[0] == "program   pair on wse3: deadlock"
    assert lines[-3:] == [
        STUCK,
        "  PE (0,0) pc 8 `vmov d1, d0`: waiting for wavelets on color 5",
        "  PE (1,0) pc 3 `vmov d1, d0`: waiting for wavelets on color 3",
    ]


def test_deadlock_json(tmp_path, assemble, cli):
    assemble(tmp_path, "pair", DEADLOCK)
    out = cli("run", "pair.bin", "--json", cwd=tmp_path)
    assert out.code == 1 and out.stderr == ""
    d = json.loads(out.stdout)
    assert d["status"] == "deadlock" and d["cycles"] == 3
    assert d["problem"] == STUCK
    assert d["blocked"] == ["PE (0,0) pc 8 `vmov d1, d0`: waiting for wavelets on color 5",
                            "PE (1,0) pc 3 `vmov d1, d0`: waiting for wavelets on color 3"]
    assert d["fabric"]["messages"] == 0


def test_big_deadlock_listing_is_capped(tmp_path, assemble, cli):
    assemble(tmp_path, "crowd", CROWD)
    out = cli("run", "crowd.bin", cwd=tmp_path)
    assert out.code == 1
    assert out.stderr.splitlines() == ["wse-emu: deadlock at cycle 2: 40 PEs blocked, "
                                       "none can run"]
    lines = out.stdout.splitlines()
    listed = lines[lines.index("deadlock at cycle 2: 40 PEs blocked, none can run") + 1:]
    assert listed[-1].startswith("  ... and 24 more")
    # the first PEs in row-major order, each with what it waits for
    assert listed[:-1] == [f"  PE ({x},{y}) pc 2 `vmov d1, d0`: waiting for wavelets on color 7"
                           for y in range(2) for x in range(8)]


def test_max_cycles_stops_an_infinite_loop(tmp_path, assemble, cli, wse):
    assemble(tmp_path, "spin", SPIN)
    out = cli("run", "spin.bin", "--max-cycles", "1000", "--json", cwd=tmp_path)
    assert out.code == 1 and out.stderr == ""
    d = json.loads(out.stdout)
    assert d["status"] == "max-cycles" and d["cycles"] == 1000
    assert d["problem"] == "stopped at --max-cycles 1000: the program had not halted"
    assert len(d["blocked"]) == 4
    assert all("still running" in line and "pc " in line for line in d["blocked"])
    text = wse("run", "spin.bin", "--max-cycles", "1000", cwd=tmp_path)
    assert text.code == 1
    assert text.stderr.splitlines() == [f"wse-emu: {d['problem']}"]
    assert "program   spin on wse3: max-cycles" in text.stdout


def test_max_cycles_utilisation_is_at_most_one(tmp_path, assemble, cli):
    assemble(tmp_path, "spin", SPIN)
    d = json.loads(cli("run", "spin.bin", "--max-cycles", "1000", "--json", cwd=tmp_path).stdout)
    assert d["pe_cycles"]["mean_utilisation"] <= 1.0
    assert d["pe_cycles"]["max_busy"] <= d["cycles"]


def _without_host_time(stdout):
    d = json.loads(stdout)
    d.pop("host_seconds")
    assert d.pop("load_seconds") > 0  # the program's load, before the run
    assert d.pop("compile_seconds") >= 0
    assert d.pop("host_threads") in (1, 2)
    return d


def test_max_cycles_above_the_run_changes_nothing(small_gemv, cli):
    root = small_gemv["root"]
    free = cli("run", "small.bin", "--input", "x=x.npy", "--json", cwd=root)
    assert free.code == 0, free.stderr
    cycles = json.loads(free.stdout)["cycles"]
    exact = cli("run", "small.bin", "--input", "x=x.npy", "--json", "--max-cycles", cycles,
                cwd=root)
    assert exact.code == 0, exact.stderr
    assert _without_host_time(exact.stdout) == _without_host_time(free.stdout)
    half = cli("run", "small.bin", "--input", "x=x.npy", "--json", "--max-cycles",
               cycles // 2, cwd=root)
    assert half.code == 1
    assert json.loads(half.stdout)["status"] == "max-cycles"


@pytest.mark.parametrize("offset, reason", [
    (100000, "descriptor outside SRAM"),  # past the machine's 48 KB
    (1000, "descriptor outside SRAM"),  # inside 48 KB but past what the program declares
    (2, "misaligned descriptor address"),
])
@pytest.mark.parametrize("engine", [(), ("--reference",)], ids=["core", "reference"])
def test_fault_names_pe_pc_instruction_and_reason(tmp_path, assemble, cli, offset, reason,
                                                 engine):
    assemble(tmp_path, "pair", FAULT, "-D", f"OFF={offset}")
    headline = f"fault at PE (1,0) pc 4 `vfill d0, f0`: {reason}"
    out = cli("run", "pair.bin", *engine, cwd=tmp_path)
    assert out.code == 1
    assert out.stderr.splitlines() == [f"wse-emu: {headline}"]
    assert headline in out.stdout.splitlines()
    d = json.loads(cli("run", "pair.bin", "--json", *engine, cwd=tmp_path).stdout)
    assert d["status"] == "fault" and d["problem"] == headline


def test_fault_exits_1_from_the_console_script(tmp_path, assemble, wse):
    assemble(tmp_path, "pair", FAULT, "-D", "OFF=2")
    out = wse("run", "pair.bin", cwd=tmp_path)
    assert out.code == 1
    assert out.stderr.splitlines() == ["wse-emu: fault at PE (1,0) pc 4 `vfill d0, f0`: "
                                       "misaligned descriptor address"]
    assemble(tmp_path, "pair", FAULT)  # OFF = 0: the same code, writing inside its buffer
    out = wse("run", "pair.bin", cwd=tmp_path)
    assert out.code == 0 and out.stderr == ""


@pytest.mark.parametrize("source, headline", [
    (".region a, 0, 0, 1, 1\n    .alloc buf, 16\n    dmem d1, f32, buf, 4\n"
     "    dfout d0, f32, 9, 4\n    vmov d0, d1\n    halt\n.endregion\n",
     "fault at PE (0,0) pc 2 `vmov d0, d1`: no route for this color here"),
    (".region a, 0, 0, 1, 1\n    .alloc buf, 16\n    li r1, 2\n    lw r2, r1, buf\n"
     "    halt\n.endregion\n",
     "fault at PE (0,0) pc 1 `lw r2, r1, 24`: scalar access outside SRAM or misaligned"),
    (".region a, 0, 0, 1, 1\n    li r1, 1\n.endregion\n",
     "fault at PE (0,0) pc 1 `<past the end of the code>`: pc past the end of the code"),
])
def test_other_faults(tmp_path, assemble, cli, source, headline):
    assemble(tmp_path, "f", source)
    out = cli("run", "f.bin", cwd=tmp_path)
    assert out.code == 1
    [line] = out.stderr.splitlines()
    assert line.startswith(f"wse-emu: {headline}"), line

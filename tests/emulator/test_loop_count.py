"""The counting build of the core (WSE_EMU_COUNT=loop, core_state.COUNT_LOOP): it splits the
loop's host time into its parts (core.loop_profile) and changes no result; the default build
counts nothing and reports nothing of it."""

import json
import os
import subprocess
import sys
from pathlib import Path

from wse_emu.emulator import core_state
from wse_emu.emulator.api import execute
from wse_emu.emulator.report import summary
from wse_emu.isa.asm import assemble_file

ROOT = Path(__file__).resolve().parents[2]
STRESS = ROOT / "programs" / "stress" / "stress.wsa"
PARAMS = {"NX": 8, "NY": 8, "L": 20, "N": 8}
PARTS = core_state.LOOP_PARTS


def _program():
    return assemble_file(str(STRESS), defines={k: str(v) for k, v in PARAMS.items()})


def test_default_build_counts_nothing():
    assert not core_state.COUNT_LOOP  # (the suite runs the default build)
    ex = execute(_program(), "test64")
    assert ex.result.loop_profile == {}
    assert "loop_profile" not in summary(ex.loaded, ex.result)


def test_counting_build_splits_the_loop_and_keeps_the_results(tmp_path):
    ex = execute(_program(), "test64")
    plain = summary(ex.loaded, ex.result)
    binary = tmp_path / "stress.bin"
    params = [a for k, v in PARAMS.items() for a in ("-D", f"{k}={v}")]
    env = dict(os.environ, WSE_EMU_COUNT="loop", NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    cli = [str(Path(sys.executable).parent / "wse-emu")]  # the console script, as a user runs it
    done = subprocess.run(cli + ["asm", str(STRESS), *params, "-o", str(binary)], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    done = subprocess.run(cli + ["run", str(binary), "--machine", "test64", "--json"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    counted = json.loads(done.stdout)
    for key in ("status", "cycles", "instructions", "classes", "pe_cycles", "fabric"):
        assert counted[key] == plain[key], key
    lp = counted["loop_profile"]
    if lp.get("counter") == "unavailable":  # a host whose cycle counter user code cannot read
        return
    visits = lp["heap"]["count"]
    assert visits > 0 and lp["first_step"]["count"] == visits
    steps = sum(lp[p]["count"] for p in PARTS[:3])
    assert steps >= counted["instructions"]
    # stress runs vadd, vmov and vmax ahead of its sends, and branches between them
    assert lp["tensor_ahead"]["count"] > 0 and lp["scalar_ahead"]["count"] > 0
    assert lp["counter_reads"] == 2 * steps + 3 * visits
    assert all(lp[p]["seconds"] >= 0 for p in PARTS)
    assert sum(lp[p]["seconds"] for p in PARTS) <= lp["visits_seconds"] + 1e-5  # (rounding)
    assert lp["visits_seconds"] <= counted["host_seconds"]
    # the text report says it in one line (the counts of another run: where slices end, which
    # the host's speed sets, ends visits too)
    done = subprocess.run(cli + ["run", str(binary), "--machine", "test64"], env=env,
                          capture_output=True, text=True)
    line = [x for x in done.stdout.splitlines() if x.startswith("loop ")]
    assert len(line) == 1, done.stdout
    assert all(f"{p.replace('_', ' ')} " in line[0] for p in PARTS) and "visits" in line[0]

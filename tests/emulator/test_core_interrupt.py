"""Ctrl-C stops a run: the Numba loop returns to Python within a slice of host time, so the
KeyboardInterrupt of Python's SIGINT handler propagates out of the run call (core.py)."""

import signal
import subprocess
import sys
import time

import pytest

from wse_emu.emulator import core
from wse_emu.emulator.api import execute
from wse_emu.isa.asm import assemble

LOOP = ".region all, 0, 0, 1, 1\nloop:\n    jmp loop\n.endregion\n"

SCRIPT = f"""
import sys
from wse_emu.emulator.api import execute
from wse_emu.isa.asm import assemble
program = assemble({LOOP!r}, "loop.wsa", {{}}, {{}})
execute(program, "tiny", engine=sys.argv[1], max_cycles=1000)  # warm: compiled first
print("running", flush=True)
try:
    execute(program, "tiny", engine=sys.argv[1])
except KeyboardInterrupt:
    print("interrupted", flush=True)
    raise
"""


@pytest.mark.parametrize("engine", ["core", "reference"])
def test_sigint_stops_an_endless_run(engine):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, engine], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline() == "running\n"
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert out == "interrupted\n"
    assert err.rstrip().endswith("KeyboardInterrupt")
    assert proc.returncode != 0


def test_a_run_cut_short_leaves_the_next_run_exact(monkeypatch):
    """An interrupt raised where the loop returns (here from the progress callback) leaves the
    program's buffers so that running it again gives the same bits and cycles."""
    src = (".param N = 64\n.region all, 0, 0, 1, 1\n    .alloc a, N * 4\n    dmem d0, f32, a, N\n"
           "    fli f0, 1.0\n    li r1, 0\n    li r2, 5000\nloop:\n    vadds d0, d0, f0\n"
           "    addi r1, r1, 1\n    blt r1, r2, loop\n    halt\n.endregion\n")
    program = assemble(src, "count.wsa", {}, {})
    plain = execute(program, "tiny")
    monkeypatch.setattr(core, "SLICE_SECONDS", 0.0)
    monkeypatch.setattr(core, "PROGRESS_SECONDS", 0.0)

    def interrupt(cycles, instructions):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute(program, "tiny", progress=interrupt)
    again = execute(program, "tiny")
    assert again.result.cycles == plain.result.cycles
    assert again.result.instructions.tolist() == plain.result.instructions.tolist()

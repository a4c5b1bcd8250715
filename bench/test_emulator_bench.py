"""Host speed of the emulator, each figure beside a reference measured in the same run.

Run: .venv/bin/python -m pytest bench -o addopts=""  (the test suite skips benchmarks)
Each case stores its ratio to the reference in the benchmark's extra_info (shown with
--benchmark-verbose / in --benchmark-json output); bench/README.md lists the figures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.conftest import best_of, record
from wse_emu.emulator.core import run
from wse_emu.emulator.load import load, write_input
from wse_emu.isa.asm import assemble
from wse_emu.isa.machine import load_machine
from programs.conftest import build

ROOT = Path(__file__).resolve().parents[1]
GEMV_ROUNDS = 15  # a round of the 4096 gemv is ~10 ms: a few rounds' min would be mostly noise


@pytest.mark.parametrize("n,pes", [(4096, 64), (16384, 256)], ids=["4096-64x64", "16384-256x256"])
def test_gemv_vs_numpy(benchmark, n, pes):
    """Functional gemv (the run itself, loading excluded) beside NumPy's W @ x."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, n), dtype=np.float32)
    x = rng.standard_normal(n, dtype=np.float32)
    loaded = load(build("gemv", {"W": w}, M=n, K=n, P=pes, Q=pes), load_machine("wse3"))
    write_input(loaded, "x", x)
    run(loaded)  # compile / warm the caches
    # the min of 15 rounds on each side (after 2 more warm-up runs: the first runs of a Loaded
    # map its run buffers' pages); NumPy after the emulator, because OpenBLAS's threads keep
    # spinning for a while after a call and would take the CPU the emulator's helper runs on
    result = benchmark.pedantic(run, args=(loaded,), rounds=GEMV_ROUNDS, iterations=1,
                                warmup_rounds=2)
    numpy_s = best_of(lambda: w @ x, GEMV_ROUNDS)
    record(benchmark, numpy_seconds=numpy_s, ratio_to_numpy=lambda emu_s: emu_s / numpy_s,
           instructions=int(result.instructions.sum()), emulated_cycles=int(result.cycles))
    del w, loaded


def test_dispatch_heavy_instructions_per_second(benchmark):
    """Every PE of 256 x 256 looping over short vector ops and neighbour sends."""
    loaded = load(build("stress", NX=256, NY=256, L=20), load_machine("wse3"))
    run(loaded)
    result = benchmark.pedantic(run, args=(loaded,), rounds=3, iterations=1)
    instructions = int(result.instructions.sum())
    record(benchmark, instructions=instructions,
           instructions_per_second=lambda seconds: instructions / seconds)


# Scalar control code, as a compiled model's PEs run it between fabric operations (role
# set-up, descriptor set-up, loop counters): every PE loops over integer and descriptor
# instructions with no fabric operation, so the host time is the core's scalar dispatch alone.
SCALAR_LOOP = """
.region all, 0, 0, 64, 64
    li r1, 2000
    li r2, 0
loop:
    addi r3, r2, 5
    add r4, r3, r2
    dmem d0, f32, 0, 8
    addi r2, r2, 1
    blt r2, r1, loop
    halt
.endregion
"""


def test_scalar_instructions_per_second(benchmark):
    """Every PE of 64 x 64 running 10,000 scalar instructions (41 M); min of 5."""
    loaded = load(assemble(SCALAR_LOOP), load_machine("wse3"))
    run(loaded)
    result = benchmark.pedantic(run, args=(loaded,), rounds=5, iterations=1)
    instructions = int(result.instructions.sum())
    assert result.cycles == 10_003 and instructions == 4096 * 10_003
    record(benchmark, instructions=instructions,
           instructions_per_second=lambda seconds: instructions / seconds)


def _cli() -> str:
    exe = shutil.which("wse-emu", path=str(Path(sys.executable).parent)) or shutil.which("wse-emu")
    if exe is None:
        pytest.skip("wse-emu is not installed in this environment")
    return exe


def test_warm_run_vs_python_startup(benchmark, tmp_path):
    """Wall time of a warm `wse-emu run` of a small program (Numba cache hit) vs `python -c pass`."""
    exe = _cli()
    rng = np.random.default_rng(0)
    np.save(tmp_path / "W.npy", rng.standard_normal((64, 64), dtype=np.float32))
    np.save(tmp_path / "x.npy", rng.standard_normal(64, dtype=np.float32))
    binary = tmp_path / "g.bin"
    subprocess.run([exe, "asm", str(ROOT / "programs/gemv/gemv.wsa"), "-D", "M=64", "-D", "K=64",
                    "-D", "P=4", "-D", "Q=4", "--data", f"W={tmp_path / 'W.npy'}", "-o",
                    str(binary)], check=True, capture_output=True)
    cmd = [exe, "run", str(binary), "--input", f"x={tmp_path / 'x.npy'}", "--json"]
    subprocess.run(cmd, check=True, capture_output=True)  # fill the Numba cache
    benchmark.pedantic(subprocess.run, args=(cmd,), kwargs={"check": True, "capture_output": True},
                       rounds=5, iterations=1)
    python_s = best_of(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))
    record(benchmark, python_startup_seconds=python_s,
           ratio_to_python_startup=lambda seconds: seconds / python_s)


def test_help_starts_fast(benchmark):
    """`wse-emu --help` must not import Numba."""
    exe = _cli()
    benchmark.pedantic(subprocess.run, args=([exe, "--help"],),
                       kwargs={"check": True, "capture_output": True}, rounds=5, iterations=1)
    python_s = best_of(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))
    benchmark.extra_info.update(python_startup_seconds=python_s)
    env = dict(os.environ)
    probe = subprocess.run([sys.executable, "-c", "import sys, wse_emu.apps.cli; "
                            "print('numba' in sys.modules)"], capture_output=True, text=True,
                           env=env, check=True)
    assert probe.stdout.strip() == "False"

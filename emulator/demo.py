"""The built-in demo: the `gemv` example program at a real size, checked against NumPy.

It assembles programs/gemv/gemv.wsa for a 4096 x 4096 fp32 matrix on 64 x 64 PEs, runs it on
the emulated mesh, compares y with NumPy's W @ x and prints the cycle report.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


def run_demo(machine_name: str = "wse3", m: int = 4096, k: int = 4096, p: int = 64,
             q: int = 64, seed: int = 0) -> int:
    from emulator import report
    from emulator.api import execute
    from isa.asm import assemble

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k), dtype=np.float32)
    x = rng.standard_normal(k, dtype=np.float32)
    print(f"gemv: y = W x, W {m} x {k} fp32 ({w.nbytes / 2**20:.0f} MiB) resident on "
          f"{p} x {q} PEs of {machine_name}, one {m // p} x {k // q} tile each", flush=True)
    t0 = time.perf_counter()
    source = PROGRAMS / "gemv" / "gemv.wsa"
    program = assemble(source.read_text(), str(source),
                       {"M": str(m), "K": str(k), "P": str(p), "Q": str(q)}, {"W": w})
    t1 = time.perf_counter()
    ex = execute(program, machine_name, inputs={"x": x})
    t2 = time.perf_counter()
    y = ex.outputs["y"]
    ref = w.astype(np.float64) @ x.astype(np.float64)
    err = float(np.max(np.abs(y - ref)) / np.max(np.abs(ref)))
    ok = bool(np.allclose(y, ref, rtol=1e-4, atol=1e-4 * np.max(np.abs(ref))))
    d = report.summary(ex.loaded, ex.result)
    print(report.text(d))
    m_ = ex.loaded.machine
    flops = 2.0 * m * k
    print(f"result    y matches NumPy W @ x: {'yes' if ok else 'NO'} "
          f"(max error {err:.2e} of max |y|)")
    print(f"speed     {d['seconds'] * 1e6:.2f} us emulated on {m_.name} = "
          f"{flops / d['seconds'] / 1e12:.2f} TFLOP/s on {p * q:,} of its {m_.pes:,} PEs")
    print(f"host      assemble {t1 - t0:.2f} s, load + run {t2 - t1:.2f} s")
    return 0 if ok and ex.result.outcome_name == "halted" else 1

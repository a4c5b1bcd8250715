"""gemm (SUMMA): C = A B against NumPy; the Numba core against the reference."""

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.kernels.convert import bf16_to_f32_array, f32_to_bf16_array
from programs.conftest import build, same_run


def gemm(rng, m, k, n, p, dt="f32", engine="core"):
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    ex = execute(build("gemm", {"A": a, "B": b}, M=m, K=k, N=n, P=p, DT=dt), "tiny",
                 engine=engine)
    assert ex.result.outcome_name == "halted"
    if dt == "bf16":
        a, b = (bf16_to_f32_array(f32_to_bf16_array(t)) for t in (a, b))
    return ex, a @ b


@pytest.mark.parametrize("p", [2, 4])
def test_matches_numpy(rng, p):
    ex, ref = gemm(rng, 64, 48, 32, p)
    np.testing.assert_allclose(ex.outputs["C"], ref, rtol=1e-4, atol=1e-4)


def test_bf16_storage(rng):
    ex, ref = gemm(rng, 32, 32, 32, 2, "bf16")
    np.testing.assert_allclose(ex.outputs["C"], ref, rtol=1e-4, atol=1e-4)


def test_core_equals_reference():
    a, _ = gemm(np.random.default_rng(3), 16, 8, 12, 2, engine="core")
    b, _ = gemm(np.random.default_rng(3), 16, 8, 12, 2, engine="reference")
    same_run(a, b)

"""softmax across a row of PEs, against NumPy."""

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from programs.conftest import build, same_run


def softmax_run(x, q, engine="core"):
    ex = execute(build("softmax", N=x.size, Q=q), "tiny", {"x": x}, engine=engine)
    assert ex.result.outcome_name == "halted"
    return ex


@pytest.mark.parametrize("q", [2, 3, 8])
def test_matches_numpy(rng, q):
    x = (rng.standard_normal(q * 40) * 4).astype(np.float32)
    y = softmax_run(x, q).outputs["y"]
    e = np.exp(x.astype(np.float64) - x.max())
    np.testing.assert_allclose(y, e / e.sum(), rtol=1e-5, atol=1e-8)
    assert abs(float(y.sum()) - 1.0) < 1e-5


def test_large_values_do_not_overflow(rng):
    x = np.linspace(80.0, 120.0, 64, dtype=np.float32)  # exp(120) overflows fp32
    y = softmax_run(x, 4).outputs["y"]
    assert np.isfinite(y).all()
    e = np.exp(x.astype(np.float64) - 120.0)
    np.testing.assert_allclose(y, e / e.sum(), rtol=1e-5, atol=1e-9)


def test_core_equals_reference(rng):
    x = rng.standard_normal(48).astype(np.float32)
    same_run(softmax_run(x, 4, "core"), softmax_run(x, 4, "reference"))

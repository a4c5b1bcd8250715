"""Scalar float functions: float64 evaluation rounded once to fp32, numpy max/min rules."""

import math

import numpy as np
import pytest

from wse_emu.kernels.scalar import fdiv, fexp, fmax, fmin, frsqrt, fsqrt


def f32(x):
    return np.float32(x)


def same(a, b):
    """Equal fp32 values, with NaN equal to NaN and the sign of zero compared."""
    a, b = f32(a), f32(b)
    if np.isnan(a) or np.isnan(b):
        return bool(np.isnan(a) and np.isnan(b))
    return a == b and np.signbit(a) == np.signbit(b)


VALUES = [0.0, -0.0, 1.0, -1.0, 0.1, 3.0, 1e-40, 2.5e38, np.inf, -np.inf, np.nan, 88.5, -103.0]


@pytest.mark.parametrize("x", VALUES)
def test_exp_sqrt_rsqrt_are_float64_results_rounded_to_fp32(x):
    x64 = np.float64(f32(x))
    with np.errstate(all="ignore"):
        assert same(fexp(x), f32(np.exp(x64)))
        assert same(fsqrt(x), f32(np.sqrt(x64)))
        assert same(frsqrt(x), f32(1.0 / np.sqrt(x64)))


def test_special_values_give_ieee_results_not_exceptions():
    assert fexp(100.0) == np.inf and fexp(-np.inf) == 0.0
    assert frsqrt(0.0) == np.inf and frsqrt(-0.0) == -np.inf and np.isnan(frsqrt(-1.0))
    assert np.isnan(fsqrt(-1.0)) and same(fsqrt(-0.0), -0.0)
    assert fdiv(1.0, 0.0) == np.inf and fdiv(-1.0, 0.0) == -np.inf
    assert np.isnan(fdiv(0.0, 0.0)) and np.isnan(fdiv(np.inf, np.inf))


def test_fdiv_is_the_correctly_rounded_fp32_quotient():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(300).astype(np.float32)
    b = (rng.standard_normal(300) * 1e3).astype(np.float32)
    for x, y in zip(a, b):
        assert same(fdiv(x, y), x / y)  # numpy fp32 division is IEEE, correctly rounded


def test_arguments_are_rounded_to_fp32_before_use():
    # 1 + 2**-30 is 1.0 in fp32; a float64 computation would see the difference.
    x = 1.0 + 2.0**-30
    assert fexp(x) == f32(math.e)
    assert fdiv(x, 1.0) == 1.0
    assert fsqrt(x) == 1.0 and frsqrt(x) == 1.0


@pytest.mark.parametrize("a", VALUES)
@pytest.mark.parametrize("b", [0.0, -0.0, 1.0, -np.inf, np.nan])
def test_fmax_fmin_follow_numpy_maximum_minimum(a, b):
    assert same(fmax(a, b), np.maximum(f32(a), f32(b)))
    assert same(fmin(a, b), np.minimum(f32(a), f32(b)))

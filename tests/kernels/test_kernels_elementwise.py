"""Elementwise kernels against numpy: fp32 arithmetic exactly, activations within an ulp."""

import math

import numpy as np
import pytest
from numba import njit

from wse_emu.kernels import elementwise as ew

SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 3e38, -3e38, 88.7, 89.0,
                     -104.0, 1e-7, 20.0, -20.0], dtype=np.float32)


def inputs(seed=0, n=4000):
    rng = np.random.default_rng(seed)
    return np.concatenate([SPECIALS, (rng.standard_normal(n) * 6).astype(np.float32),
                           rng.uniform(-0.01, 0.01, 200).astype(np.float32)])


def ulp_distance(a, b):
    """ulps between fp32 arrays (0 for equal values, NaN == NaN, +0 == -0)."""
    def ordered(x):
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    both_nan = np.isnan(a) & np.isnan(b)
    dist = np.abs(ordered(a) - ordered(b))
    dist[both_nan] = 0
    dist[np.isnan(a) != np.isnan(b)] = 1 << 40
    return dist


def unary(op, a):
    out = np.empty_like(a)
    ew.unary(op, a, out, a.size)
    return out


def f64(a):
    return a.astype(np.float64)


def exact_unary(op, a):
    """fp32 rounding of each activation computed with 40 significant digits (mpmath).

    The GELU tails use exact identities (1 + tanh(u) = 2 / (1 + exp(-2u)), 1 + erf(v) =
    erfc(-v)): at 40 digits mpmath would cancel just as float64 does, only further out.
    """
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 40
    half, c = mp.mpf(1) / 2, mp.sqrt(2 / mp.pi)

    def f(v):
        if not math.isfinite(v) or v == 0:
            return float(reference_float64(op, np.float32([v]))[0])
        x = mp.mpf(float(v))
        if op == ew.UN_EXP:
            return mp.exp(x)
        if op == ew.UN_GELU_TANH:
            return x / (1 + mp.exp(-2 * c * (x + mp.mpf(0.044715) * x**3)))
        if op == ew.UN_GELU_ERF:
            return half * x * mp.erfc(-x / mp.sqrt(2))
        if op == ew.UN_SILU:
            return x / (1 + mp.exp(-x))
        return 1 / mp.sqrt(x) if x > 0 else mp.nan

    # mpf -> float64 -> fp32 is a double rounding, which can cost at most the last half ulp
    with np.errstate(over="ignore"):
        return np.array([float(f(v)) for v in a], dtype=np.float64).astype(np.float32)


def reference_float64(op, a):
    """The documented formulas evaluated naively in float64 with numpy (and math.erf)."""
    x = f64(a)
    with np.errstate(all="ignore"):
        if op == ew.UN_EXP:
            r = np.exp(x)
        elif op == ew.UN_GELU_TANH:
            r = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
        elif op == ew.UN_GELU_ERF:
            r = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
        elif op == ew.UN_SILU:
            r = x / (1 + np.exp(-x))
        else:
            r = 1 / np.sqrt(x)
        return r.astype(np.float32)


ACTIVATIONS = [ew.UN_EXP, ew.UN_GELU_TANH, ew.UN_GELU_ERF, ew.UN_SILU, ew.UN_RSQRT]


@pytest.mark.parametrize("op", ACTIVATIONS)
def test_activations_match_the_formulas_in_float64_where_those_are_well_conditioned(op):
    a = inputs()
    if op in (ew.UN_GELU_TANH, ew.UN_GELU_ERF):
        a = a[~(a < -3)]  # below -3 the naive formulas cancel catastrophically in float64
    dist = ulp_distance(unary(op, a), reference_float64(op, a))
    assert dist.max() <= 1, (a[dist.argmax()], dist.max())
    assert (dist == 0).mean() > 0.99


@pytest.mark.parametrize("op", ACTIVATIONS)
def test_activations_are_within_an_ulp_of_the_exact_value_everywhere(op):
    a = inputs(n=1500)
    a = np.concatenate([a, -np.geomspace(3, 80, 200, dtype=np.float32)])  # the GELU tails
    dist = ulp_distance(unary(op, a), exact_unary(op, a))
    assert dist.max() <= 1, (a[dist.argmax()], dist.max())


def test_activation_values_at_the_edges():
    a = np.array([0.0, 1.0, -1.0, np.inf, 1000.0, -1000.0, 4.0], dtype=np.float32)
    np.testing.assert_array_equal(unary(ew.UN_EXP, a)[:5], np.float32([1, math.e, 1 / math.e,
                                                                         np.inf, np.inf]))
    gelu = unary(ew.UN_GELU_ERF, a)
    assert gelu[0] == 0 and gelu[3] == np.inf and gelu[4] == 1000.0 and gelu[5] == 0
    assert gelu[1] == np.float32(0.8413447460685429)  # x * Phi(x) at 1
    silu = unary(ew.UN_SILU, a)
    assert silu[4] == 1000.0 and silu[5] == 0 and silu[6] == np.float32(4 / (1 + math.exp(-4)))
    rs = unary(ew.UN_RSQRT, np.float32([4.0, 0.0, -1.0, np.inf]))
    assert rs[0] == 0.5 and rs[1] == np.inf and np.isnan(rs[2]) and rs[3] == 0


def test_mov_copies_bits_including_nan_payloads():
    a = np.array([0x7FA00001, 0xFFC00123, 0x80000000, 1], dtype=np.uint32).view(np.float32)
    np.testing.assert_array_equal(unary(ew.UN_MOV, a).view(np.uint32), a.view(np.uint32))


def test_only_the_first_k_elements_are_written():
    a = np.ones(8, dtype=np.float32)
    out = np.full(8, -5.0, dtype=np.float32)
    ew.unary(ew.UN_EXP, a, out, 3)
    ew.binary(ew.BIN_ADD, a, a, out[3:], 2)
    np.testing.assert_array_equal(out, np.float32([math.e] * 3 + [2, 2] + [-5] * 3))


BINARY_NUMPY = {ew.BIN_ADD: np.add, ew.BIN_SUB: np.subtract, ew.BIN_MUL: np.multiply,
                ew.BIN_MAX: np.maximum, ew.BIN_MIN: np.minimum}


@pytest.mark.parametrize("op", list(BINARY_NUMPY))
def test_binary_ops_match_numpy_fp32_exactly(op):
    a = inputs(1)
    b = np.roll(inputs(2), 7)  # every special meets every other kind of value somewhere
    b[:SPECIALS.size] = SPECIALS[::-1]
    out = np.empty_like(a)
    ew.binary(op, a, b, out, a.size)
    with np.errstate(all="ignore"):
        want = BINARY_NUMPY[op](a, b)
    assert want.dtype == np.float32
    np.testing.assert_array_equal(out, want)
    # bits too, where numpy's NaN is not ambiguous: signed zeros must come out as numpy's
    num = ~np.isnan(want)
    np.testing.assert_array_equal(out[num].view(np.uint32), want[num].view(np.uint32))


def test_max_min_of_signed_zeros_give_the_second_operand_like_numpy():
    a = np.float32([-0.0, 0.0])
    b = np.float32([0.0, -0.0])
    out = np.empty(2, dtype=np.float32)
    for op, fn in ((ew.BIN_MAX, np.maximum), (ew.BIN_MIN, np.minimum)):
        ew.binary(op, a, b, out, 2)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(fn(a, b)))
        np.testing.assert_array_equal(np.signbit(out), [False, True])


def test_max_min_propagate_nan_from_either_side():
    nan = np.float32(np.nan)
    a = np.float32([nan, 1.0, nan, -np.inf])
    b = np.float32([2.0, nan, nan, -np.inf])
    out = np.empty(4, dtype=np.float32)
    for op in (ew.BIN_MAX, ew.BIN_MIN):
        ew.binary(op, a, b, out, 4)
        assert np.isnan(out[:3]).all() and out[3] == -np.inf


@pytest.mark.parametrize("op", list(BINARY_NUMPY))
def test_binary_scalar_matches_numpy_and_rounds_python_floats_to_fp32(op):
    a = inputs(3)
    out = np.empty_like(a)
    s = 0.1  # a Python float from the reference interpreter: must act as fp32(0.1)
    ew.binary_scalar(op, a, s, out, a.size)
    with np.errstate(all="ignore"):
        want = BINARY_NUMPY[op](a, np.float32(s))
    np.testing.assert_array_equal(out, want)
    num = ~np.isnan(want)
    np.testing.assert_array_equal(out[num].view(np.uint32), want[num].view(np.uint32))


def test_fma_scalar_rounds_the_product_before_the_sum():
    # a * s = 1 + 2**-11 + 2**-24 exactly; fp32 rounds the product to 1 + 2**-11 (tie to even),
    # so d + fp32(a * s) is 0 where a fused multiply-add would give 2**-24.
    a = np.float32([1 + 2**-12])
    d = np.float32([-(1 + 2**-11)])
    out = np.empty(1, dtype=np.float32)
    ew.fma_scalar(d, a, np.float32(1 + 2**-12), out, 1)
    assert out[0] == 0.0


def test_fma_scalar_matches_two_rounding_numpy_reference_and_may_write_in_place():
    rng = np.random.default_rng(4)
    d = rng.standard_normal(1000).astype(np.float32)
    a = rng.standard_normal(1000).astype(np.float32)
    s = np.float32(-1.7)
    want = d + a * s
    ew.fma_scalar(d, a, s, d, d.size)
    np.testing.assert_array_equal(d, want)


@njit
def unary_from_jit(op, a, out):
    ew.unary(op, a, out, a.size)


def test_same_bits_from_python_and_from_jitted_callers():
    a = inputs(5, n=500)
    for op in (ew.UN_EXP, ew.UN_GELU_TANH, ew.UN_GELU_ERF, ew.UN_SILU):
        from_jit = np.empty_like(a)
        unary_from_jit(op, a, from_jit)
        np.testing.assert_array_equal(unary(op, a).view(np.uint32), from_jit.view(np.uint32))

"""fp16 and bf16 conversions: exhaustive reads, rounding of writes, against numpy and integers."""

import numpy as np
import pytest
from numba import njit

from wse_emu.kernels.convert import (bf16_to_f32, bf16_to_f32_array, f16_to_f32, f32_to_bf16,
                             f32_to_bf16_array, f32_to_f16)

ALL16 = np.arange(1 << 16, dtype=np.uint16)


@njit
def widen_all(bits, fn_is_f16, out):
    for i in range(bits.size):
        out[i] = f16_to_f32(bits[i]) if fn_is_f16 else bf16_to_f32(bits[i])


@njit
def narrow_all(vals, to_f16, out):
    for i in range(vals.size):
        out[i] = f32_to_f16(vals[i]) if to_f16 else f32_to_bf16(vals[i])


def widen(bits, is_f16):
    out = np.empty(bits.size, dtype=np.float32)
    widen_all(bits, is_f16, out)
    return out


def narrow(vals, to_f16):
    out = np.empty(vals.size, dtype=np.uint16)
    narrow_all(np.ascontiguousarray(vals, dtype=np.float32), to_f16, out)
    return out


def f32_from_bits(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def awkward_f32(seed=7, n=200_000):
    """fp32 values that stress 16-bit rounding: random bit patterns, fp16/bf16 ties and their
    neighbours, subnormals of both formats, overflow edges, infinities and NaN payloads."""
    rng = np.random.default_rng(seed)
    random_bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    # every exponent an fp16 can round into, with random significands
    exps = rng.integers(95, 146, n, dtype=np.uint32)
    ranged = (exps << 23) | rng.integers(0, 1 << 23, n, dtype=np.uint32)
    ranged |= rng.integers(0, 2, n, dtype=np.uint32) << 31
    # exact halfway points between adjacent fp16 values, and one fp32 ulp either side
    f16_vals = ALL16.view(np.float16).astype(np.float64)
    finite = np.sort(np.unique(f16_vals[np.isfinite(f16_vals)]))
    mids = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)
    mid_bits = mids.view(np.uint32)
    edges = np.array([65504.0, 65519.996, 65520.0, 65536.0, 1e5, 3.4e38, 2.0**-24, 2.0**-25,
                      2.0**-25 * 1.0000001, 2.0**-26, 1e-45, 0.0, -0.0, np.inf, -np.inf],
                     dtype=np.float32).view(np.uint32)
    nans = np.array([0x7F800001, 0x7FC00000, 0x7F802000, 0xFFA00000, 0x7FFFFFFF, 0xFF801FFF,
                     0x7FBFFFFF, 0xFFC00001], dtype=np.uint32)
    bits = np.concatenate([random_bits, ranged, mid_bits, mid_bits + 1, mid_bits - 1, edges, nans,
                           edges | np.uint32(0x80000000)])
    return f32_from_bits(bits)


def bf16_reference(vals):
    """Independent RNE to bf16 by comparing the discarded half with one half-ulp."""
    bits = np.ascontiguousarray(vals, dtype=np.float32).view(np.uint32).astype(np.int64)
    upper, lower = bits >> 16, bits & 0xFFFF
    round_up = (lower > 0x8000) | ((lower == 0x8000) & ((upper & 1) == 1))
    out = upper + round_up
    is_nan = ((bits >> 23) & 0xFF == 0xFF) & ((bits & 0x7FFFFF) != 0)
    return np.where(is_nan, upper | 0x40, out).astype(np.uint16)


def test_f16_to_f32_exhaustive_matches_numpy_bit_for_bit():
    want = ALL16.view(np.float16).astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal(widen(ALL16, True).view(np.uint32), want)


def test_f16_to_f32_callable_from_python_with_plain_ints():
    for h, want in [(0x3C00, 1.0), (0x0001, 2.0**-24), (0x03FF, 1023 * 2.0**-24),
                    (0xC000, -2.0), (0x7BFF, 65504.0), (0xFC00, -np.inf), (0x8000, -0.0)]:
        got = f16_to_f32(h)
        assert got == want and np.signbit(got) == np.signbit(want), hex(h)
    assert np.isnan(f16_to_f32(0x7E00))


def test_f32_to_f16_matches_numpy_including_ties_overflow_subnormals_and_nan_payloads():
    vals = awkward_f32()
    with np.errstate(over="ignore"):  # overflow to inf is one of the cases under test
        want = vals.astype(np.float16).view(np.uint16)
    got = narrow(vals, True)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(vals.view(np.uint32)[i]), hex(got[i]), hex(want[i]))
                           for i in bad[:5]]


def test_f32_to_f16_round_trips_every_fp16_value():
    finite = ALL16[np.isfinite(ALL16.view(np.float16))]
    np.testing.assert_array_equal(narrow(widen(finite, True), True), finite)


def test_f32_to_f16_rounds_ties_to_even():
    one_ulp = 2.0**-10
    assert f32_to_f16(np.float32(1 + one_ulp / 2)) == 0x3C00  # tie, 1.0 is even: down
    assert f32_to_f16(np.float32(1 + 3 * one_ulp / 2)) == 0x3C02  # tie, odd below: up
    assert f32_to_f16(np.float32(2.0**-25)) == 0x0000  # tie between 0 and the least subnormal
    assert f32_to_f16(np.float32(3 * 2.0**-25)) == 0x0002
    assert f32_to_f16(np.float32(65519.0)) == 0x7BFF
    assert f32_to_f16(np.float32(65520.0)) == 0x7C00  # rounds past the largest finite value


def test_bf16_to_f32_exhaustive_is_the_upper_half():
    want = ALL16.astype(np.uint32) << 16
    np.testing.assert_array_equal(widen(ALL16, False).view(np.uint32), want)
    np.testing.assert_array_equal(bf16_to_f32_array(ALL16).view(np.uint32), want)


def test_f32_to_bf16_matches_integer_reference():
    vals = awkward_f32(seed=11)
    bits = vals.view(np.uint32)
    lower_ties = (bits & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    vals = np.concatenate([vals, f32_from_bits(lower_ties), f32_from_bits(lower_ties + 1)])
    want = bf16_reference(vals)
    np.testing.assert_array_equal(narrow(vals, False), want)
    np.testing.assert_array_equal(f32_to_bf16_array(vals), want)


def test_f32_to_bf16_edges():
    assert f32_to_bf16(np.float32(1.0)) == 0x3F80
    assert f32_to_bf16(f32_from_bits(0x3F808000)) == 0x3F80  # tie, even stays
    assert f32_to_bf16(f32_from_bits(0x3F818000)) == 0x3F82  # tie, odd rounds up
    assert f32_to_bf16(f32_from_bits(0x7F7FFFFF)) == 0x7F80  # largest fp32 overflows to inf
    assert f32_to_bf16(f32_from_bits(0x00000001)) == 0x0000  # fp32 subnormal underflows
    for nan_bits in (0x7F800001, 0xFF800001, 0x7FC00000):
        h = f32_to_bf16(f32_from_bits(nan_bits))
        assert (h & 0x7F80) == 0x7F80 and (h & 0x0040) and (h >> 15) == (nan_bits >> 31)


def test_f32_to_bf16_agrees_with_torch_on_non_nan_values():
    torch = pytest.importorskip("torch")
    vals = awkward_f32(seed=3, n=50_000)
    vals = vals[~np.isnan(vals)]
    want = torch.from_numpy(vals).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(f32_to_bf16_array(vals), want)
    np.testing.assert_array_equal(narrow(vals, False), want)


def test_scalar_conversions_accept_python_floats():
    # The reference interpreter may pass Python floats: they are rounded to fp32 first, so a
    # value just above a 16-bit tie becomes the tie itself and rounds to even (down here).
    assert f32_to_f16(1.0 + 2.0**-11 + 2.0**-30) == 0x3C00
    assert f32_to_bf16(1.0 + 2.0**-8 + 2.0**-30) == 0x3F80

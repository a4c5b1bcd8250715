"""Reductions: sequential fp32 in element order, bit for bit, and chunkable."""

import numpy as np
import pytest

from wse_emu.kernels.reduce import rdot, rmax, rsum

F32 = np.float32


def sequential_sum(a, acc=F32(0)):
    total = F32(acc)
    for v in a:
        total = F32(total + v)
    return total


def sequential_dot(a, b, acc=F32(0)):
    total = F32(acc)
    for x, y in zip(a, b):
        total = F32(total + F32(x * y))
    return total


def data(seed, n=3000):
    rng = np.random.default_rng(seed)
    # A wide spread of magnitudes makes the result depend on the order of the additions.
    return (rng.standard_normal(n) * np.exp(rng.uniform(-8, 8, n))).astype(np.float32)


def bits(x):
    return F32(x).view(np.uint32)


def test_rsum_is_the_sequential_fp32_sum_and_close_to_numpy():
    a = data(0)
    got = rsum(a, a.size, F32(0))
    assert bits(got) == bits(sequential_sum(a))
    assert bits(got) != bits(sequential_sum(a[::-1]))  # the data does detect reordering
    np.testing.assert_allclose(got, np.sum(a.astype(np.float64)), rtol=1e-4)


def test_rdot_rounds_each_product_then_each_sum():
    a, b = data(1), data(2)
    got = rdot(a, b, a.size, F32(0))
    assert bits(got) == bits(sequential_dot(a, b))
    np.testing.assert_allclose(got, np.dot(a.astype(np.float64), b), rtol=1e-3)


@pytest.mark.parametrize("split", [0, 1, 17, 2999, 3000])
def test_chunked_reductions_equal_one_call(split):
    a, b = data(3), data(4)
    n = a.size
    assert bits(rsum(a[split:], n - split, rsum(a, split, F32(0)))) == bits(rsum(a, n, F32(0)))
    assert bits(rdot(a[split:], b[split:], n - split, rdot(a, b, split, F32(0)))) == \
        bits(rdot(a, b, n, F32(0)))
    assert rmax(a[split:], n - split, rmax(a, split, F32(-np.inf))) == a.max()


def test_only_k_elements_count():
    a = np.float32([1.0, 2.0, 4.0, 1000.0])
    assert rsum(a, 3, F32(0)) == 7.0
    assert rdot(a, a, 2, F32(0.5)) == 5.5
    assert rmax(a, 3, F32(-np.inf)) == 4.0


def test_empty_reductions_return_the_accumulator():
    empty = np.empty(0, dtype=np.float32)
    assert rsum(empty, 0, F32(0)) == 0.0
    assert rdot(empty, empty, 0, F32(2.5)) == 2.5
    assert rmax(empty, 0, F32(-np.inf)) == -np.inf


def test_rmax_matches_numpy_max_with_nan_inf_and_signed_zero():
    a = data(5)
    assert rmax(a, a.size, F32(-np.inf)) == np.max(a)
    with_nan = a.copy()
    with_nan[1234] = np.nan
    assert np.isnan(rmax(with_nan, a.size, F32(-np.inf)))
    assert np.isnan(rmax(a, a.size, F32(np.nan)))  # a NaN carried in from an earlier chunk
    neg = np.float32([-np.inf, -5.0, -np.inf])
    assert rmax(neg, 3, F32(-np.inf)) == -5.0
    for zeros in (np.float32([0.0, -0.0]), np.float32([-0.0, 0.0])):
        assert np.signbit(rmax(zeros, 2, F32(-np.inf))) == np.signbit(np.max(zeros))


def test_python_float_accumulator_is_treated_as_fp32():
    # The reference interpreter may pass a Python float: the sum must still be pure fp32.
    a = data(6, n=100)
    assert bits(rsum(a, a.size, 0.1)) == bits(sequential_sum(a, F32(0.1)))
    assert bits(rdot(a, a, a.size, 0.1)) == bits(sequential_dot(a, a, F32(0.1)))

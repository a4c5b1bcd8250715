"""Descriptor gather/scatter over the flat SRAM, and the fabric wavelet encoding."""

import numpy as np
import pytest

from wse_emu.kernels.access import f32_to_wavelets, gather, scatter, wavelets_to_f32
from wse_emu.kernels.convert import bf16_to_f32_array, f32_to_bf16_array

F32, F16, BF16 = 0, 1, 2
SIZE = {F32: 4, F16: 2, BF16: 2}
PE_STRIDE = 4096
N_PES = 3

# (n, stride, count, cstride): contiguous, 2D contiguous, strided, padded rows, transposed
# walk (stride > cstride), negative strides, and a broadcast (stride 0).
SHAPES = [
    (37, 1, 1, 37),
    (8, 1, 5, 8),
    (10, 3, 1, 30),
    (6, 1, 4, 9),
    (4, 5, 5, 1),
    (7, -2, 3, -20),
    (5, 0, 3, 2),
]


def make_sram(seed):
    """Random bytes, so that every gathered value is distinct and any misplaced write shows."""
    rng = np.random.default_rng(seed)
    sram = rng.integers(0, 256, N_PES * PE_STRIDE, dtype=np.uint8)
    return sram, sram.view(np.float32), sram.view(np.uint16)


def element_addresses(base, n, stride, count, cstride, dtype):
    i = np.arange(n * count)
    return base + ((i // n) * cstride + (i % n) * stride) * SIZE[dtype]


def base_for(stride, cstride, dtype, pe=1):
    # Negative strides walk down from the base, so start in the middle of the PE's SRAM.
    addr = 2048 if min(stride, cstride) < 0 else 64
    return pe * PE_STRIDE + addr


def decode(sram, addrs, dtype):
    """fp32 values of the elements at byte addresses `addrs`, straight from the bytes."""
    if dtype == F32:
        raw = np.stack([sram[addrs + b] for b in range(4)], axis=1).copy().view(np.float32)
        return raw.reshape(-1)
    u16 = np.stack([sram[addrs], sram[addrs + 1]], axis=1).copy().view(np.uint16).reshape(-1)
    if dtype == F16:
        return u16.view(np.float16).astype(np.float32)
    return bf16_to_f32_array(u16)


def encode(vals, dtype):
    """Bytes that storing fp32 `vals` must produce, element by element."""
    if dtype == F32:
        return vals.astype(np.float32).view(np.uint8).reshape(-1, 4)
    with np.errstate(over="ignore"):
        u16 = vals.astype(np.float16).view(np.uint16) if dtype == F16 else f32_to_bf16_array(vals)
    return u16.view(np.uint8).reshape(-1, 2)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("shape", SHAPES)
def test_gather_reads_every_element_where_the_descriptor_says(shape, dtype):
    n, stride, count, cstride = shape
    sram, f32, u16 = make_sram(seed=n * 10 + dtype)
    base = base_for(stride, cstride, dtype)
    want = decode(sram, element_addresses(base, n, stride, count, cstride, dtype), dtype)
    out = np.full(n * count, 7.0, dtype=np.float32)
    gather(f32, u16, base, n, stride, count, cstride, dtype, 0, n * count, out)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("shape", SHAPES)
def test_gather_in_chunks_equals_one_gather(shape, dtype):
    n, stride, count, cstride = shape
    sram, f32, u16 = make_sram(seed=3)
    base = base_for(stride, cstride, dtype)
    total = n * count
    whole = np.empty(total, dtype=np.float32)
    gather(f32, u16, base, n, stride, count, cstride, dtype, 0, total, whole)
    for chunk in (1, 3, n + 1):
        parts = []
        for first in range(0, total, chunk):
            k = min(chunk, total - first)
            part = np.empty(k, dtype=np.float32)
            gather(f32, u16, base, n, stride, count, cstride, dtype, first, k, part)
            parts.append(part)
        np.testing.assert_array_equal(np.concatenate(parts).view(np.uint32), whole.view(np.uint32))


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[1] != 0])
def test_scatter_writes_rounded_values_there_and_nowhere_else(shape, dtype):
    n, stride, count, cstride = shape
    sram, f32, u16 = make_sram(seed=5)
    before = sram.copy()
    base = base_for(stride, cstride, dtype)
    rng = np.random.default_rng(n)
    vals = (rng.standard_normal(n * count) * 100).astype(np.float32)
    vals[:3] = [np.inf, -0.0, 1e6]  # 1e6 overflows fp16
    addrs = element_addresses(base, n, stride, count, cstride, dtype)
    # Write in two chunks to exercise `first`; the result must not depend on the split.
    split = (n * count) // 2 + 1
    scatter(f32, u16, base, n, stride, count, cstride, dtype, 0, split, vals)
    scatter(f32, u16, base, n, stride, count, cstride, dtype, split, n * count - split,
            vals[split:])
    want = before.copy()
    for b in range(SIZE[dtype]):
        want[addrs + b] = encode(vals, dtype)[:, b]
    np.testing.assert_array_equal(sram, want)


def test_scatter_then_gather_of_fp32_is_exact_for_nan_payloads():
    sram, f32, u16 = make_sram(seed=9)
    vals = np.array([0x7FA00001, 0xFFC00000, 0x00000001, 0x80000000],
                    dtype=np.uint32).view(np.float32)
    scatter(f32, u16, PE_STRIDE + 100 * 4, 2, 3, 2, 1, F32, 0, 4, vals)
    out = np.empty(4, dtype=np.float32)
    gather(f32, u16, PE_STRIDE + 100 * 4, 2, 3, 2, 1, F32, 0, 4, out)
    np.testing.assert_array_equal(out.view(np.uint32), vals.view(np.uint32))


def test_zero_elements_touch_nothing():
    sram, f32, u16 = make_sram(seed=1)
    before = sram.copy()
    out = np.full(2, 5.0, dtype=np.float32)
    gather(f32, u16, 0, 4, 1, 1, 4, F32, 0, 0, out)
    scatter(f32, u16, 0, 4, 1, 1, 4, F32, 0, 0, out)
    np.testing.assert_array_equal(out, [5.0, 5.0])
    np.testing.assert_array_equal(sram, before)


def wavelet_values():
    rng = np.random.default_rng(2)
    vals = (rng.standard_normal(50) * 1000).astype(np.float32)
    vals[:5] = [np.nan, -np.inf, 1e-30, 70000.0, -0.0]
    return vals


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_wavelets_carry_fp32_bits_or_16_bit_patterns_in_the_low_half(dtype):
    vals = wavelet_values()
    k, off = vals.size, 3
    payload = np.full(k + off + 2, 0xDEADBEEF, dtype=np.uint32)
    f32_to_wavelets(vals, k, dtype, payload, off)
    if dtype == F32:
        want = vals.view(np.uint32)
    else:
        want = encode(vals, dtype).reshape(-1).view(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(payload[off:off + k], want)
    assert (payload[:off] == 0xDEADBEEF).all() and (payload[off + k:] == 0xDEADBEEF).all()


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_wavelets_to_f32_decodes_and_ignores_the_high_half_of_16_bit_wavelets(dtype):
    vals = wavelet_values()
    payload = np.zeros(vals.size + 4, dtype=np.uint32)
    f32_to_wavelets(vals, vals.size, dtype, payload, 4)
    if dtype != F32:
        payload[4:] |= np.uint32(0xABCD0000)
    out = np.empty(vals.size, dtype=np.float32)
    wavelets_to_f32(payload, 4, vals.size, dtype, out)
    want = vals if dtype == F32 else decode(encode(vals, dtype).reshape(-1),
                                            np.arange(vals.size) * 2, dtype)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))

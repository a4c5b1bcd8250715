"""Reading and writing descriptor operands in SRAM and on the fabric, always through fp32.

SRAM is one flat byte array shared by all PEs; callers pass two views of it (`sram_f32`,
`sram_u16`) so that every dtype is a plain indexed load. A memory operand is (base, n, stride,
count, cstride, dtype): element i (j = i % n, k = i // n) is at byte
`base + (k * cstride + j * stride) * size(dtype)` (docs/timing-model.md section 2). `first, k`
select a chunk of consecutive elements, so fabric ops that run in chunks touch only their share.
Bounds and alignment are the caller's job: these kernels index without checks.

Fabric payloads are uint32 wavelets: fp32 bits, or the 16-bit pattern in the low half.
"""

import numpy as np
from numba import njit

from wse_emu.isa.spec import DTYPES
from wse_emu.kernels.convert import (bf16_to_f32, f16_to_f32, f32_bits, f32_from_bits, f32_to_bf16,
                             f32_to_f16)

DT_F32 = DTYPES["f32"]  # dtype codes from isa/spec.py's table (Numba freezes them as constants)
DT_F16 = DTYPES["f16"]
DT_BF16 = DTYPES["bf16"]


@njit(cache=True)
def dtype_bytes(dtype):
    return 4 if dtype == DT_F32 else 2


@njit(cache=True)
def load_f32(sram_f32, sram_u16, dtype, index):
    """Element `index` (in units of its dtype's size) of SRAM, as fp32."""
    if dtype == DT_F32:
        return sram_f32[index]
    if dtype == DT_F16:
        return f16_to_f32(sram_u16[index])
    return bf16_to_f32(sram_u16[index])


@njit(cache=True)
def store_f32(sram_f32, sram_u16, dtype, index, value):
    """Write fp32 `value` at element `index` of SRAM, rounded to the dtype."""
    if dtype == DT_F32:
        sram_f32[index] = value
    elif dtype == DT_F16:
        sram_u16[index] = f32_to_f16(value)
    else:
        sram_u16[index] = f32_to_bf16(value)


@njit(cache=True)
def _contiguous(n, stride, count, cstride):
    return stride == 1 and (count == 1 or cstride == n)


@njit(cache=True)
def gather(sram_f32, sram_u16, base, n, stride, count, cstride, dtype, first, k, out):
    """out[0:k] = fp32 of elements first .. first+k-1 of the operand."""
    if k <= 0:
        return
    origin = base // dtype_bytes(dtype)
    if _contiguous(n, stride, count, cstride):
        start = origin + first
        # an element loop, not a slice copy: Numba's slice assignment costs more than a short
        # vector's worth of loads, and most tensor ops name short vectors. It runs over a
        # slice, indexed from 0: with sram[start + i] Numba must allow for a negative index
        # (wrap-around), and LLVM turns the loop into gathers instead of vector loads.
        if dtype == DT_F32:
            src32 = sram_f32[start:start + k]
            for i in range(k):
                out[i] = src32[i]
        elif dtype == DT_F16:
            src16 = sram_u16[start:start + k]
            for i in range(k):
                out[i] = f16_to_f32(src16[i])
        else:
            src16 = sram_u16[start:start + k]
            for i in range(k):
                out[i] = bf16_to_f32(src16[i])
        return
    # Walk (row, column) incrementally: a div/mod per element costs more than the load.
    col = first % n
    row = first // n
    index = origin + row * cstride + col * stride
    for i in range(k):
        out[i] = load_f32(sram_f32, sram_u16, dtype, index)
        col += 1
        index += stride
        if col == n:
            col = 0
            row += 1
            index = origin + row * cstride


@njit(cache=True)
def scatter(sram_f32, sram_u16, base, n, stride, count, cstride, dtype, first, k, vals):
    """Store fp32 vals[0:k] into elements first .. first+k-1 of the operand, rounding RNE."""
    if k <= 0:
        return
    origin = base // dtype_bytes(dtype)
    if _contiguous(n, stride, count, cstride):
        start = origin + first
        # over a slice, indexed from 0, as in gather (no wrap-around: vector stores)
        if dtype == DT_F32:
            dst32 = sram_f32[start:start + k]
            for i in range(k):
                dst32[i] = vals[i]
        elif dtype == DT_F16:
            dst16 = sram_u16[start:start + k]
            for i in range(k):
                dst16[i] = f32_to_f16(vals[i])
        else:
            dst16 = sram_u16[start:start + k]
            for i in range(k):
                dst16[i] = f32_to_bf16(vals[i])
        return
    col = first % n
    row = first // n
    index = origin + row * cstride + col * stride
    for i in range(k):
        store_f32(sram_f32, sram_u16, dtype, index, vals[i])
        col += 1
        index += stride
        if col == n:
            col = 0
            row += 1
            index = origin + row * cstride


@njit(cache=True)
def wavelets_to_f32(payload_u32, off, k, dtype, out):
    """out[0:k] = fp32 values of wavelets payload[off:off+k] carrying `dtype` elements.

    16-bit types take the low half of each wavelet: the converters read only the low 16 bits.
    The loops index a slice from 0, as in gather (vector loads, not gathers)."""
    src = payload_u32[off:off + k]
    if dtype == DT_F32:
        for i in range(k):
            out[i] = f32_from_bits(src[i])
    elif dtype == DT_F16:
        for i in range(k):
            out[i] = f16_to_f32(src[i])
    else:
        for i in range(k):
            out[i] = bf16_to_f32(src[i])


@njit(cache=True)
def f32_to_wavelets(vals, k, dtype, payload_u32, off):
    """payload[off:off+k] = wavelets of fp32 vals[0:k]; 16-bit types rounded, in the low half.
    (Over a slice indexed from 0, as wavelets_to_f32.)"""
    dst = payload_u32[off:off + k]
    if dtype == DT_F32:
        for i in range(k):
            dst[i] = np.uint32(f32_bits(vals[i]))
    elif dtype == DT_F16:
        for i in range(k):
            dst[i] = np.uint32(f32_to_f16(vals[i]))
    else:
        for i in range(k):
            dst[i] = np.uint32(f32_to_bf16(vals[i]))

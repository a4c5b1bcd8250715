"""Tile matrix-vector and matrix-matrix products with fp32 accumulation (the gemv hot path).

Tiles are column-major in SRAM: W[i, j] is at byte `w_base + (j * w_cstride + i) * size`.
Semantics (docs/timing-model.md section 3): for j = 0 .. K-1 in order,
`acc[i] = fp32(acc[i] + fp32(W[i, j] * x[j]))`. The column update itself is kernels.columns
(explicit SIMD: a block of 64 rows keeps its sums in registers across all columns, and the
loop prefetches ahead across the tile's end into the next PE's tile, which the emulator's PEs
usually run next). 16-bit tiles are widened to fp32 inside that loop (mv), or once for all
columns of B (mm).
"""

import numpy as np
from numba import njit

from wse_emu.kernels.access import DT_F16, DT_F32, dtype_bytes, gather
from wse_emu.kernels.columns import axpy_16, axpy_f32
from wse_emu.kernels.convert import bf16_to_f32, f16_to_f32
from wse_emu.kernels.prefetch import WITHOUT

# False only when measuring what kernels.columns buys (WSE_EMU_WITHOUT=simd, kernels.prefetch)
SIMD = "simd" not in WITHOUT


@njit(cache=True)
def _plain_f32(w, w_start, m, k, cstride, x, acc):
    """The column update as a plain loop (same order, same bits as kernels.columns)."""
    for j in range(k):
        xj = x[j]
        at = w_start + j * cstride
        for i in range(m):
            acc[i] = np.float32(acc[i] + np.float32(w[at + i] * xj))


@njit(cache=True)
def _plain_16(w, w_start, m, k, cstride, dtype, x, acc):
    """As _plain_f32 for fp16 or bf16 bits."""
    for j in range(k):
        xj = x[j]
        at = w_start + j * cstride
        for i in range(m):
            v = f16_to_f32(w[at + i]) if dtype == DT_F16 else bf16_to_f32(w[at + i])
            acc[i] = np.float32(acc[i] + np.float32(v * xj))


@njit(cache=True)
def _widen_columns(sram_u16, start, m, ncols, cstride, dtype, buf):
    """buf[c * m + i] = fp32 of the 16-bit element start + c * cstride + i (c < ncols, i < m)."""
    for c in range(ncols):
        src = sram_u16[start + c * cstride:start + c * cstride + m]
        dst = buf[c * m:(c + 1) * m]
        if dtype == DT_F16:
            for i in range(m):
                dst[i] = f16_to_f32(src[i])
        else:
            for i in range(m):
                dst[i] = bf16_to_f32(src[i])


@njit(cache=True)
def mv(sram_f32, sram_u16, w_base, m, k, w_cstride, w_dtype, x, acc):
    """acc[0:m] += W x with W (m x k) column-major at w_base; x fp32[k], acc fp32[m] in/out."""
    if m <= 0 or k <= 0:
        return
    if not SIMD:
        if w_dtype == DT_F32:
            _plain_f32(sram_f32, w_base // 4, m, k, w_cstride, x, acc)
        else:
            _plain_16(sram_u16, w_base // 2, m, k, w_cstride, w_dtype, x, acc)
    elif w_dtype == DT_F32:
        axpy_f32(sram_f32, w_base // 4, m, k, w_cstride, x, acc, 0)
    else:
        axpy_16(sram_u16, w_base // 2, m, k, w_cstride, w_dtype, x, acc, 0)


@njit(cache=True)
def mm(sram_f32, sram_u16, a_base, m, k, a_cstride, a_dtype, b_base, n, b_cstride, b_dtype, acc):
    """acc (m x n, column-major, fp32, in/out) += A B; A (m x k) at a_base, B (k x n) at b_base.

    Column c of acc gets exactly `mv` of A with column c of B: same accumulation order, same bits.
    """
    if m <= 0 or n <= 0 or k <= 0:
        return
    if a_dtype == DT_F32:
        a = sram_f32
        a_start = a_base // 4
        a_stride = a_cstride
    else:
        # Widen A once for all n columns of B instead of once per column.
        a = np.empty(m * k, dtype=np.float32)
        _widen_columns(sram_u16, a_base // 2, m, k, a_cstride, a_dtype, a)
        a_start = 0
        a_stride = m
    x = np.empty(k, dtype=np.float32)
    b_size = dtype_bytes(b_dtype)
    for c in range(n):
        gather(sram_f32, sram_u16, b_base + c * b_cstride * b_size, k, 1, 1, k, b_dtype, 0, k, x)
        axpy_f32(a, a_start, m, k, a_stride, x, acc, c * m)

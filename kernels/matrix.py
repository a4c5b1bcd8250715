"""Tile matrix-vector and matrix-matrix products with fp32 accumulation (the gemv hot path).

Tiles are column-major in SRAM: W[i, j] is at byte `w_base + (j * w_cstride + i) * size`.
Semantics (docs/timing-model.md section 3): for j = 0 .. K-1 in order,
`acc[i] = fp32(acc[i] + fp32(W[i, j] * x[j]))`. The loops run over rows i innermost: lanes are
independent, so LLVM vectorises the column update without fastmath and without changing a
single rounding. Eight columns are folded into one pass over acc (still added in column order):
that cuts the loads and stores of acc by eight and keeps eight weight streams in flight, which
measured fastest on tiles streamed from DRAM (4 and 16 were slower). 16-bit tiles are widened
to fp32 inside the same loop (mv), or once for all columns of B (mm).

Each pass over eight columns first prefetches (kernels.prefetch, a hint that changes no value)
the memory about AHEAD_BYTES further on: a tile is a few KB, too short for the hardware
prefetcher to get going before it ends, and the emulator's tiles lie one after another in SRAM
in the order the PEs usually run them, so a contiguous tile prefetches across its end into the
next PE's. That about halved the time of the 4096 x 4096 gemv's tile products (64 MB of tiles
from DRAM: 3.2 -> 1.7 ms). The hint is the non-temporal one: a tile is read once, and so it
does not push the scheduler's per-PE rows out of the last-level cache (another ~15 % of that
whole run).
"""

import numpy as np
from numba import njit

from kernels.access import DT_F16, DT_F32, dtype_bytes, gather
from kernels.convert import bf16_to_f32, f16_to_f32
from kernels.prefetch import prefetch_once as prefetch

# How far ahead the column kernels prefetch, and one cache line, in bytes: 8-12 KB ahead
# measured fastest for 64 x 64 fp32 tiles streamed from DRAM (2 KB ahead: 1.3x slower, 32 KB: 1.2x).
AHEAD_BYTES = 8192
LINE_BYTES = 64


@njit(cache=True, inline="always")
def _prefetch_block(w, c0, m, cstride, size):
    """Prefetch ahead of the 8-column block at element c0 of w (elements of `size` bytes):
    linearly AHEAD_BYTES past it when the tile is contiguous (cstride == m: on into whatever
    follows it in SRAM), else the columns of the block that many bytes of columns later."""
    n = w.shape[0]
    step = LINE_BYTES // size
    if cstride == m:
        q = c0 + AHEAD_BYTES // size
        end = min(q + 8 * m, n)
        while q < end:
            prefetch(w, q)
            q += step
        return
    if cstride <= 0:
        return
    cols = max(8, AHEAD_BYTES // (size * max(m, 1)))
    for c in range(8):
        q = c0 + (cols + c) * cstride
        end = min(q + m, n)
        while q < end:
            prefetch(w, q)
            q += step


@njit(cache=True)
def _axpy_columns(w, w_start, m, k, w_cstride, x, acc, acc_start):
    """acc[acc_start + i] += w[w_start + j * w_cstride + i] * x[j] for j = 0 .. k-1 in order."""
    y = acc[acc_start:acc_start + m]
    j = 0
    while j + 8 <= k:
        c0 = w_start + j * w_cstride
        _prefetch_block(w, c0, m, w_cstride, 4)
        w0 = w[c0:c0 + m]
        w1 = w[c0 + w_cstride:c0 + w_cstride + m]
        w2 = w[c0 + 2 * w_cstride:c0 + 2 * w_cstride + m]
        w3 = w[c0 + 3 * w_cstride:c0 + 3 * w_cstride + m]
        w4 = w[c0 + 4 * w_cstride:c0 + 4 * w_cstride + m]
        w5 = w[c0 + 5 * w_cstride:c0 + 5 * w_cstride + m]
        w6 = w[c0 + 6 * w_cstride:c0 + 6 * w_cstride + m]
        w7 = w[c0 + 7 * w_cstride:c0 + 7 * w_cstride + m]
        x0, x1, x2, x3 = x[j], x[j + 1], x[j + 2], x[j + 3]
        x4, x5, x6, x7 = x[j + 4], x[j + 5], x[j + 6], x[j + 7]
        for i in range(m):
            s = y[i] + w0[i] * x0
            s = s + w1[i] * x1
            s = s + w2[i] * x2
            s = s + w3[i] * x3
            s = s + w4[i] * x4
            s = s + w5[i] * x5
            s = s + w6[i] * x6
            y[i] = s + w7[i] * x7
        j += 8
    while j < k:
        xj = x[j]
        c0 = w_start + j * w_cstride
        wj = w[c0:c0 + m]
        for i in range(m):
            y[i] = y[i] + wj[i] * xj
        j += 1


# The 16-bit kernels widen in the same pass as the multiply-add: measured 1.5x (fp16) to 2.7x
# (bf16) faster than widening into a buffer first. They are spelled out per dtype because a
# dtype branch around the row loop defeated LLVM's vectoriser (3-6x slower), and passing the
# converter as a function argument would make the kernels uncachable.
@njit(cache=True)
def _axpy_f16(w, w_start, m, k, w_cstride, x, acc, acc_start):
    """As `_axpy_columns` for a uint16 tile of fp16 bits, widened inside the loop."""
    y = acc[acc_start:acc_start + m]
    j = 0
    while j + 8 <= k:
        c0 = w_start + j * w_cstride
        _prefetch_block(w, c0, m, w_cstride, 2)
        w0 = w[c0:c0 + m]
        w1 = w[c0 + w_cstride:c0 + w_cstride + m]
        w2 = w[c0 + 2 * w_cstride:c0 + 2 * w_cstride + m]
        w3 = w[c0 + 3 * w_cstride:c0 + 3 * w_cstride + m]
        w4 = w[c0 + 4 * w_cstride:c0 + 4 * w_cstride + m]
        w5 = w[c0 + 5 * w_cstride:c0 + 5 * w_cstride + m]
        w6 = w[c0 + 6 * w_cstride:c0 + 6 * w_cstride + m]
        w7 = w[c0 + 7 * w_cstride:c0 + 7 * w_cstride + m]
        x0, x1, x2, x3 = x[j], x[j + 1], x[j + 2], x[j + 3]
        x4, x5, x6, x7 = x[j + 4], x[j + 5], x[j + 6], x[j + 7]
        for i in range(m):
            s = y[i] + f16_to_f32(w0[i]) * x0
            s = s + f16_to_f32(w1[i]) * x1
            s = s + f16_to_f32(w2[i]) * x2
            s = s + f16_to_f32(w3[i]) * x3
            s = s + f16_to_f32(w4[i]) * x4
            s = s + f16_to_f32(w5[i]) * x5
            s = s + f16_to_f32(w6[i]) * x6
            y[i] = s + f16_to_f32(w7[i]) * x7
        j += 8
    while j < k:
        xj = x[j]
        c0 = w_start + j * w_cstride
        wj = w[c0:c0 + m]
        for i in range(m):
            y[i] = y[i] + f16_to_f32(wj[i]) * xj
        j += 1


@njit(cache=True)
def _axpy_bf16(w, w_start, m, k, w_cstride, x, acc, acc_start):
    """As `_axpy_columns` for a uint16 tile of bf16 bits, widened inside the loop."""
    y = acc[acc_start:acc_start + m]
    j = 0
    while j + 8 <= k:
        c0 = w_start + j * w_cstride
        _prefetch_block(w, c0, m, w_cstride, 2)
        w0 = w[c0:c0 + m]
        w1 = w[c0 + w_cstride:c0 + w_cstride + m]
        w2 = w[c0 + 2 * w_cstride:c0 + 2 * w_cstride + m]
        w3 = w[c0 + 3 * w_cstride:c0 + 3 * w_cstride + m]
        w4 = w[c0 + 4 * w_cstride:c0 + 4 * w_cstride + m]
        w5 = w[c0 + 5 * w_cstride:c0 + 5 * w_cstride + m]
        w6 = w[c0 + 6 * w_cstride:c0 + 6 * w_cstride + m]
        w7 = w[c0 + 7 * w_cstride:c0 + 7 * w_cstride + m]
        x0, x1, x2, x3 = x[j], x[j + 1], x[j + 2], x[j + 3]
        x4, x5, x6, x7 = x[j + 4], x[j + 5], x[j + 6], x[j + 7]
        for i in range(m):
            s = y[i] + bf16_to_f32(w0[i]) * x0
            s = s + bf16_to_f32(w1[i]) * x1
            s = s + bf16_to_f32(w2[i]) * x2
            s = s + bf16_to_f32(w3[i]) * x3
            s = s + bf16_to_f32(w4[i]) * x4
            s = s + bf16_to_f32(w5[i]) * x5
            s = s + bf16_to_f32(w6[i]) * x6
            y[i] = s + bf16_to_f32(w7[i]) * x7
        j += 8
    while j < k:
        xj = x[j]
        c0 = w_start + j * w_cstride
        wj = w[c0:c0 + m]
        for i in range(m):
            y[i] = y[i] + bf16_to_f32(wj[i]) * xj
        j += 1


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
    if w_dtype == DT_F32:
        _axpy_columns(sram_f32, w_base // 4, m, k, w_cstride, x, acc, 0)
    elif w_dtype == DT_F16:
        _axpy_f16(sram_u16, w_base // 2, m, k, w_cstride, x, acc, 0)
    else:
        _axpy_bf16(sram_u16, w_base // 2, m, k, w_cstride, x, acc, 0)


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
        _axpy_columns(a, a_start, m, k, a_stride, x, acc, c * m)

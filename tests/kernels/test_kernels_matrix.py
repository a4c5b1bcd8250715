"""Tile mv and mm: bit-exact against a sequential fp32 reference, close to numpy, all dtypes."""

import numpy as np
import pytest

from wse_emu.kernels.convert import bf16_to_f32_array, f32_to_bf16_array
from wse_emu.kernels.matrix import mm, mv

F32, F16, BF16 = 0, 1, 2
SIZE = {F32: 4, F16: 2, BF16: 2}
PE_STRIDE = 1 << 16


def store_matrix(sram, base, mat, cstride, dtype):
    """Write mat (rows x cols) column-major at byte `base` with column stride `cstride`
    elements; return the fp32 values actually stored (16-bit types are rounded)."""
    rows, cols = mat.shape
    if dtype == F32:
        stored, raw = mat.astype(np.float32), mat.astype(np.float32).view(np.uint32)
        view = sram.view(np.uint32)
    else:
        raw = mat.astype(np.float16).view(np.uint16) if dtype == F16 else f32_to_bf16_array(mat)
        stored = raw.view(np.float16).astype(np.float32) if dtype == F16 else bf16_to_f32_array(raw)
        view = sram.view(np.uint16)
    start = base // SIZE[dtype]
    for j in range(cols):
        view[start + j * cstride:start + j * cstride + rows] = raw[:, j]
    return stored


def sequential_mv(w, x, acc):
    """acc[i] = fp32(acc[i] + fp32(w[i, j] * x[j])) for j in order (numpy fp32 ops round once)."""
    acc = acc.astype(np.float32).copy()
    for j in range(w.shape[1]):
        acc = acc + w[:, j] * x[j]
    return acc


def setup(seed, m, k, dtype, cstride, pe=1, addr=256):
    rng = np.random.default_rng(seed)
    sram = np.full(3 * PE_STRIDE, 0xFF, dtype=np.uint8)  # NaN padding: a stray read shows
    w = (rng.standard_normal((m, k)) * np.exp(rng.uniform(-4, 4, (m, k)))).astype(np.float32)
    base = pe * PE_STRIDE + addr
    stored = store_matrix(sram, base, w, cstride, dtype)
    return sram, base, stored, rng


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
# m covers each path of kernels.columns: 64-row register blocks, then a masked tail pass of 1,
# 2, 3 or 4 vectors (m % 64 = 1-16, 17-32, 33-48, 49-63 rows), and none when m % 64 == 0
@pytest.mark.parametrize("m,k", [(1, 1), (3, 7), (8, 8), (13, 9), (5, 17), (64, 64), (33, 70),
                                 (100, 5), (147, 3), (128, 17), (63, 4)])
def test_mv_is_bit_exact_with_sequential_fp32(m, k, dtype):
    sram, base, w, rng = setup(m * 100 + k, m, k, dtype, cstride=m + 3)
    x = rng.standard_normal(k).astype(np.float32)
    acc0 = rng.standard_normal(m).astype(np.float32)  # mva: accumulate onto y
    acc = acc0.copy()
    mv(sram.view(np.float32), sram.view(np.uint16), base, m, k, m + 3, dtype, x, acc)
    np.testing.assert_array_equal(acc.view(np.uint32), sequential_mv(w, x, acc0).view(np.uint32))


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_mv_matches_numpy_matvec(dtype):
    m, k = 64, 96
    sram, base, w, rng = setup(7, m, k, dtype, cstride=m)
    w = w / np.abs(w).max()
    w = store_matrix(sram, base, w, m, dtype)
    x = rng.standard_normal(k).astype(np.float32)
    acc = np.zeros(m, dtype=np.float32)
    mv(sram.view(np.float32), sram.view(np.uint16), base, m, k, m, dtype, x, acc)
    want = w.astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_allclose(acc, want, rtol=1e-5, atol=1e-5 * np.abs(w).sum(axis=1).max())


def test_mv_reads_only_its_tile_and_writes_only_acc():
    m, k, cs = 10, 12, 16
    sram, base, w, rng = setup(3, m, k, F32, cstride=cs)
    before = sram.copy()
    x = rng.standard_normal(k).astype(np.float32)
    acc = np.zeros(m + 4, dtype=np.float32)
    acc[m:] = 9.0
    mv(sram.view(np.float32), sram.view(np.uint16), base, m, k, cs, F32, x, acc)
    assert np.isfinite(acc[:m]).all()  # the 0xFF padding between columns is NaN: not read
    np.testing.assert_array_equal(acc[m:], 9.0)
    np.testing.assert_array_equal(sram, before)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_mv_keeps_special_values_exact(dtype):
    """Infinities, signed zeros and subnormals of every storage type widen and accumulate as
    the sequential fp32 reference does (16-bit widening is done on vectors in the kernel)."""
    m, k = 80, 6
    sram, base, _, rng = setup(5, m, k, dtype, cstride=m)
    w = rng.standard_normal((m, k)).astype(np.float32)
    tiny = {F32: 1e-40, F16: 3e-7, BF16: 1e-39}[dtype]  # subnormal in the storage type
    w[::7, 0], w[1::7, 1], w[2::7, 2], w[3::7, 3] = np.inf, -np.inf, -0.0, tiny
    w[4::7, 4] = -tiny
    stored = store_matrix(sram, base, w, m, dtype)
    x = rng.standard_normal(k).astype(np.float32)
    x[5] = 0.0  # inf * 0: NaN where an infinity meets it
    acc0 = np.zeros(m, dtype=np.float32)
    acc = acc0.copy()
    mv(sram.view(np.float32), sram.view(np.uint16), base, m, k, m, dtype, x, acc)
    want = sequential_mv(stored, x, acc0)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(acc[finite].view(np.uint32), want[finite].view(np.uint32))
    np.testing.assert_array_equal(np.isnan(acc), np.isnan(want))
    np.testing.assert_array_equal(acc[np.isinf(want)], want[np.isinf(want)])


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_mv_of_a_tile_that_ends_the_sram(dtype):
    """The column loop prefetches past the tile; at the end of SRAM that must stay a hint."""
    m, k = 64, 64
    size = 4 if dtype == F32 else 2
    sram = np.zeros(m * k * size + 64, dtype=np.uint8)
    base = 64
    rng = np.random.default_rng(9)
    w = store_matrix(sram, base, rng.standard_normal((m, k)).astype(np.float32), m, dtype)
    x = rng.standard_normal(k).astype(np.float32)
    acc = np.zeros(m, dtype=np.float32)
    mv(sram.view(np.float32), sram.view(np.uint16), base, m, k, m, dtype, x, acc)
    want = sequential_mv(w, x, np.zeros(m, np.float32))
    np.testing.assert_array_equal(acc.view(np.uint32), want.view(np.uint32))


def test_mv_refuses_a_tile_outside_the_sram():
    sram = np.zeros(1024, dtype=np.uint8)
    x, acc = np.ones(8, np.float32), np.zeros(8, np.float32)
    with pytest.raises(IndexError):  # 8 x 8 fp32 = 256 bytes from byte 800: past the end
        mv(sram.view(np.float32), sram.view(np.uint16), 800, 8, 8, 8, F32, x, acc)
    with pytest.raises(IndexError):  # acc shorter than the tile's rows
        mv(sram.view(np.float32), sram.view(np.uint16), 0, 8, 8, 8, F32, x, acc[:4])


def test_mv_with_nothing_to_do_leaves_acc_alone():
    sram = np.zeros(64, dtype=np.uint8)
    acc = np.float32([1.0, 2.0])
    mv(sram.view(np.float32), sram.view(np.uint16), 0, 2, 0, 2, F32, np.empty(0, np.float32), acc)
    np.testing.assert_array_equal(acc, [1.0, 2.0])


MM_CASES = [(F32, F32), (F16, F32), (BF16, BF16), (F32, F16), (BF16, F16)]


@pytest.mark.parametrize("a_dtype,b_dtype", MM_CASES)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 9, 3), (16, 8, 4), (7, 20, 6)])
def test_mm_columns_are_sequential_mv_of_each_column_of_b(m, k, n, a_dtype, b_dtype):
    sram, a_base, a, rng = setup(m + 10 * k + 100 * n, m, k, a_dtype, cstride=m + 1)
    b_base, b_cs = 2 * PE_STRIDE + 128, k + 2
    b = store_matrix(sram, b_base, rng.standard_normal((k, n)).astype(np.float32), b_cs, b_dtype)
    acc0 = rng.standard_normal(m * n).astype(np.float32)
    acc = acc0.copy()
    f32v, u16v = sram.view(np.float32), sram.view(np.uint16)
    mm(f32v, u16v, a_base, m, k, m + 1, a_dtype, b_base, n, b_cs, b_dtype, acc)
    for c in range(n):
        want = sequential_mv(a, b[:, c], acc0[c * m:(c + 1) * m])
        np.testing.assert_array_equal(acc[c * m:(c + 1) * m].view(np.uint32), want.view(np.uint32))
        col = acc0[c * m:(c + 1) * m].copy()
        mv(f32v, u16v, a_base, m, k, m + 1, a_dtype, b[:, c].copy(), col)
        np.testing.assert_array_equal(acc[c * m:(c + 1) * m].view(np.uint32), col.view(np.uint32))


@pytest.mark.parametrize("a_dtype,b_dtype", MM_CASES)
def test_mm_matches_numpy_matmul(a_dtype, b_dtype):
    m, k, n = 32, 48, 8
    sram, a_base, a, rng = setup(11, m, k, a_dtype, cstride=m)
    a = store_matrix(sram, a_base, a / np.abs(a).max(), m, a_dtype)
    b_base = 2 * PE_STRIDE
    b = store_matrix(sram, b_base, rng.standard_normal((k, n)).astype(np.float32), k, b_dtype)
    acc = np.zeros(m * n, dtype=np.float32)
    mm(sram.view(np.float32), sram.view(np.uint16), a_base, m, k, m, a_dtype, b_base, n, k,
       b_dtype, acc)
    want = (a.astype(np.float64) @ b.astype(np.float64)).reshape(-1, order="F")
    scale = np.abs(a).sum(axis=1).max() * np.abs(b).max()
    np.testing.assert_allclose(acc, want, rtol=1e-5, atol=1e-6 * scale)


def test_measuring_switch_keeps_the_bits(tmp_path):
    """WSE_EMU_WITHOUT=simd,prefetch (bench/test_keep_bench.py measures what those features buy)
    computes the same bits: this file's bit-exactness tests pass in a process that sets it."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, WSE_EMU_WITHOUT="simd,prefetch", NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=", __file__, "-k", "bit_exact or numpy_matvec"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout

"""The gateway to a PE's SRAM in the Numba core: every executor reads and writes SRAM here.

Three things must stay in step with every write, and this module is the only place that keeps
them, so that a new executor cannot forget one:

- the undo log (core_undo): the original contents of every byte a run writes, logged just
  before it is first written, so that a run that faults can be put back and replayed;
- timing-only mode's unknown-word map (State.unknown): a tensor op, a tile product or a DMA
  into SRAM writes nothing there but marks its destination unknown; a scalar store writes
  its value, known or (fsw of an unknown register) not;
- the helper thread's ring (core_jobs): a PE whose tile product is still outstanding settles
  it before anything of its own touches its SRAM, and a product handed to the helper has its
  destination logged before the helper can write it.

An instruction goes through `sram_gate` first (core_sched.step, once for every instruction):
it settles the PE's product if the instruction touches SRAM, and, if the instruction may write
SRAM and the run logs, makes sure the undo log has room for the PE's whole SRAM beyond what it
has written so far (else X_GROW, before anything changed), so that no executor checks room of
its own. The executors then write with `store_i32`, `store_f32`, `store_elements`, `store_dma`
and `store_product` only, and read with `core_jobs.read_mem` (a read needs no gateway).
"""

import numpy as np
from numba import njit

from wse_emu.emulator.core_jobs import product, publish, settle
from wse_emu.emulator.core_ops import OPERAND_ROLES, R_DST
from wse_emu.emulator.core_state import (
    MP_ASYNC, MP_TIMING, MP_UNDO, P_PENDING, P_SRAM0, P_SRAM_LEN, S_DMA, S_DMALD, S_DMAWAIT,
    S_FLW, S_FSW, S_LW, S_MATRIX, S_SW, S_TENSOR, d_addr, d_count, d_cstride, d_dtype, d_len,
    d_stride)
from wse_emu.emulator.core_undo import note_write, undo_fits
from wse_emu.isa.spec import DTYPES
from wse_emu.kernels.access import scatter
from wse_emu.kernels.prefetch import prefetch

DT_F32 = DTYPES["f32"]


@njit(cache=True, inline="always")
def touches_sram(sem):
    """Whether an instruction of semantic id `sem` may read or write its PE's SRAM."""
    return (sem >= S_TENSOR or sem == S_LW or sem == S_SW or sem == S_FLW or sem == S_FSW
            or (S_DMA <= sem < S_DMAWAIT))


@njit(cache=True, inline="always")
def _logged(sem, timing):
    """Whether an instruction of semantic id `sem` may change SRAM bytes (which the undo log
    keeps): scalar stores always; a tensor op with a destination, a tile product and dmald
    only in functional mode (timing-only, they mark the unknown map instead)."""
    if sem == S_SW or sem == S_FSW:
        return True
    if timing:
        return False
    return sem == S_DMALD or sem >= S_MATRIX or (sem >= S_TENSOR and OPERAND_ROLES[sem, R_DST] >= 0)


@njit(cache=True, inline="always")
def sram_gate(p, sem, const, sched, mem, far):
    """Before PE p executes an instruction of semantic id `sem`: settle its outstanding tile
    product if the instruction touches SRAM; False (and a request to grow the undo log) if
    the instruction may write SRAM and the log has no room for the rest of the PE's SRAM.
    The bound is the PE's whole SRAM, so no executor needs to know its span first."""
    if not touches_sram(sem):
        return True
    pe = sched.pe
    if pe[p, P_PENDING] != 0:
        settle(p, pe, far.jobs, far.jdsd, far.ctl, mem.sram_f32, mem.sram_u16, sched.scratch)
    mp = const.mp
    if mp[MP_UNDO] == 0 or not _logged(sem, mp[MP_TIMING] != 0):
        return True
    return undo_fits(p, 0, pe[p, P_SRAM_LEN], pe, mem.undo, mem.undo_data, sched.counters)


@njit(cache=True, inline="always")
def mem_bytes(dsd, p, r):
    """[lo, hi) bytes of PE p's SRAM that SRAM descriptor r touches (after check_mem)."""
    size = 4 if d_dtype(dsd, p, r) == DT_F32 else 2
    addr = d_addr(dsd, p, r)
    n, count = d_len(dsd, p, r), d_count(dsd, p, r)
    if n == 0 or count == 0:
        return addr, addr
    inner = (n - 1) * d_stride(dsd, p, r)
    outer = (count - 1) * d_cstride(dsd, p, r)
    return (addr + (min(0, inner) + min(0, outer)) * size,
            addr + (max(0, inner) + max(0, outer) + 1) * size)


@njit(cache=True, inline="always")
def mark_unknown(unknown, pe, p, dsd, r, first, k):
    """Timing-only mode: elements first .. first + k - 1 of PE p's SRAM descriptor r (checked)
    now hold values computed from data: mark their words in the `unknown` map (Loaded.unknown;
    only PEs that have SRAM keep one, the others have no scalar access that could look)."""
    base = pe[p, P_SRAM0]
    if base < 0 or k <= 0:
        return
    size = 4 if d_dtype(dsd, p, r) == DT_F32 else 2
    addr = base + d_addr(dsd, p, r)
    n, stride, cstride = d_len(dsd, p, r), d_stride(dsd, p, r), d_cstride(dsd, p, r)
    if stride == 1 and (d_count(dsd, p, r) == 1 or cstride == n):  # contiguous
        lo = addr + first * size
        unknown[lo >> 2:((lo + k * size - 1) >> 2) + 1] = 1
        return
    for i in range(first, first + k):
        unknown[(addr + ((i // n) * cstride + (i % n) * stride) * size) >> 2] = 1


@njit(cache=True, inline="always")
def _log(p, lo, hi, const, sched, mem):
    note_write(p, lo, hi, sched.pe, mem.sram_u16, mem.undo, mem.undo_data, sched.counters,
               const.mp)


@njit(cache=True, inline="always")
def store_i32(p, addr, w, value, const, sched, mem):
    """sw: PE p's checked byte address `addr` (word w of the int32 view) = value, known."""
    _log(p, addr, addr + 4, const, sched, mem)
    mem.sram_i32[w] = value
    if const.mp[MP_TIMING]:
        mem.unknown[w] = 0


@njit(cache=True, inline="always")
def store_f32(p, addr, w, value, unknown, const, sched, mem):
    """fsw: as store_i32, of an fp32 value that is unknown (timing-only) if `unknown`."""
    _log(p, addr, addr + 4, const, sched, mem)
    mem.sram_f32[w] = value
    if const.mp[MP_TIMING]:
        mem.unknown[w] = unknown


@njit(cache=True, inline="always")
def store_elements(p, r, first, k, vals, const, sched, mem):
    """Elements first .. first + k - 1 of PE p's SRAM descriptor r (checked) = vals[0:k];
    timing-only, they become unknown instead. The log takes the descriptor's whole span at
    its first chunk (later chunks of the op find it logged)."""
    pe, dsd = sched.pe, sched.dsd
    if const.mp[MP_TIMING]:
        mark_unknown(mem.unknown, pe, p, dsd, r, first, k)
        return
    lo, hi = mem_bytes(dsd, p, r)
    _log(p, lo, hi, const, sched, mem)
    scatter(mem.sram_f32, mem.sram_u16, pe[p, P_SRAM0] + d_addr(dsd, p, r), d_len(dsd, p, r),
            d_stride(dsd, p, r), d_count(dsd, p, r), d_cstride(dsd, p, r), d_dtype(dsd, p, r),
            first, k, vals)


@njit(cache=True, inline="always")
def store_dma(p, r, n, nbytes, hbm, host, const, sched, mem):
    """dmald: PE p's SRAM descriptor r (checked, contiguous, n elements, nbytes) = the raw
    bytes of `hbm` from `host`; timing-only, they become unknown instead."""
    pe, dsd = sched.pe, sched.dsd
    if const.mp[MP_TIMING]:
        mark_unknown(mem.unknown, pe, p, dsd, r, 0, n)
        return
    lo = d_addr(dsd, p, r)
    _log(p, lo, lo + nbytes, const, sched, mem)
    sram_u16 = mem.sram_u16
    w = (pe[p, P_SRAM0] + lo) // 2
    for i in range(nbytes // 2):
        sram_u16[w + i] = np.uint16(hbm[host + 2 * i]) | \
            (np.uint16(hbm[host + 2 * i + 1]) << np.uint16(8))


@njit(cache=True, inline="always")
def store_product(p, y, w, x, sem, m_rows, k_cols, n_cols, total, const, sched, mem, far):
    """y = (y +) W x or W X of PE p's checked SRAM descriptors (core_jobs.product); with a
    helper thread (MP_ASYNC) y is logged and the product handed to the helper's ring, which
    writes y later (the PE settles it before it next touches SRAM: sram_gate); timing-only,
    y becomes unknown."""
    pe, dsd = sched.pe, sched.dsd
    mp = const.mp
    if mp[MP_TIMING]:
        mark_unknown(mem.unknown, pe, p, dsd, y, 0, total)
        return
    sram_f32, sram_u16, scratch = mem.sram_f32, mem.sram_u16, sched.scratch
    base = pe[p, P_SRAM0]
    lo, hi = mem_bytes(dsd, p, y)
    if mp[MP_ASYNC] != 0:
        _log(p, lo, hi, const, sched, mem)  # y's old contents, before the helper can write y
        publish(p, dsd, y, w, x, sem, base, m_rows, k_cols, n_cols, total, pe, far.jobs,
                far.jdsd, far.ctl, sram_f32, sram_u16, scratch)
        return
    # y's old contents go to the log just before y is written (the product accumulates in
    # scratch). Loading them is started now, so that they arrive while the product runs
    # instead of stalling the log's copy.
    w16 = (base + lo) >> 1
    for i in range(w16, min((base + hi + 1) >> 1, w16 + 32 * 16), 32):  # up to 16 lines
        prefetch(sram_u16, i)
    product(dsd, p, y, w, x, sem, base, m_rows, k_cols, n_cols, total, sram_f32, sram_u16,
            scratch)
    store_elements(p, y, 0, total, scratch[2], const, sched, mem)

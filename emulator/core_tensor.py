"""Tensor instructions of the Numba core: elementwise ops and reductions (run in chunks when
they have fabric inputs, docs/timing-model.md section 6) and tile matrix products.

Operands are gathered into fp32 scratch rows first and results written back after the kernel
(through core_sram's gateway), so a destination may alias a source. The numbers come from
kernels/, as in the reference.
"""

import numpy as np
from numba import njit

from wse_emu.emulator.core_exec import (_fault, check_mem, check_operands, chunk_times, elements,
                                         finish_chunk, roles, room_for_trace, simd_variant)
from wse_emu.emulator.core_fabric import need, queue_arrival, queue_consume, queue_read, send, send_fits
from wse_emu.emulator.core_jobs import borrowed, read_mem
from wse_emu.emulator.core_sram import store_elements, store_product
from wse_emu.emulator.core_state import (
    CL_KIND, C_A, C_B, C_C, C_CLASS, C_SEM, C_SUB, MP_BY_COLUMN, MP_COLORS, MP_ISSUE, MP_QDEPTH,
    MP_TIMING, MP_TRACE_CAP, NEED_SCRATCH, P_DONE, P_FTAINT, P_SRAM0, P_SRAM_LEN, P_STATUS,
    P_WAIT, Q_QUEUED, S_BINARY, S_BINSCALAR, S_FILL, S_FMA, S_MV, S_MVA, S_RDOT, S_RMAX, S_RSUM,
    S_UNARY, T_START, X_GROW, X_OK, X_STOP, d_color, d_count, d_dtype, d_kind, d_len, d_stride)
from wse_emu.emulator.result import F_COUNT, F_MATRIX_FABRIC, F_NO_ROUTE, F_SHAPE, ST_RUN, ST_WAIT_RECV
from wse_emu.isa.spec import DSD_FABIN, DSD_FABOUT, DSD_MEM
from wse_emu.kernels import elementwise as ew
from wse_emu.kernels.cost import chunk_cycles, matrix_cycles
from wse_emu.kernels import reduce


@njit(cache=True)
def _block(pe, p, color):
    pe[p, P_STATUS] = ST_WAIT_RECV
    pe[p, P_WAIT] = color
    return X_STOP


@njit(cache=True, inline="always")
def tensor_op(p, at, const, sched, mem, fab, nwake):
    """One chunk of an elementwise op or reduction; returns (X_* code, PEs to wake).

    Timing-only mode (MP_TIMING): the same checks, queues and times, but no operand is read,
    nothing computed or written and no payload sent; what the destination would hold is marked
    unknown, and so is a reduction's f register."""
    code, classes, mp = const.code, const.classes, const.mp
    pe, freg, dsd, scratch, trace, counters = (sched.pe, sched.freg, sched.dsd, sched.scratch,
                                               sched.trace, sched.counters)
    sram_f32, sram_u16 = mem.sram_f32, mem.sram_u16
    tree_of, queue, dl, msg, payload = fab.tree_of, fab.queue, fab.dl, fab.msg, fab.payload
    sem, sub, cls = code[at, C_SEM], code[at, C_SUB], code[at, C_CLASS]
    a, b, c = code[at, C_A], code[at, C_B], code[at, C_C]
    colors = mp[MP_COLORS]
    base, timing = pe[p, P_SRAM0], mp[MP_TIMING] != 0
    dst, s0, s1 = roles(sem, a, b, c)
    done = pe[p, P_DONE]
    out_fab = dst >= 0 and d_kind(dsd, p, dst) == DSD_FABOUT
    if done == 0:
        f = check_operands(sem, dst, s0, s1, dsd, p, pe[p, P_SRAM_LEN])
        if f:
            return _fault(pe, p, f), nwake
        if out_fab and tree_of[p * colors + d_color(dsd, p, dst), T_START] < 0:
            return _fault(pe, p, F_NO_ROUTE), nwake
    n = elements(dsd, p, dst if dst >= 0 else s0)
    k = n - done
    in0 = s0 >= 0 and d_kind(dsd, p, s0) == DSD_FABIN
    in1 = s1 >= 0 and d_kind(dsd, p, s1) == DSD_FABIN
    slot0 = p * colors + d_color(dsd, p, s0) if in0 else -1
    slot1 = p * colors + d_color(dsd, p, s1) if in1 else -1
    if in0:
        if queue[slot0, Q_QUEUED] == 0 and k > 0:
            return _block(pe, p, d_color(dsd, p, s0)), nwake
        k = min(k, queue[slot0, Q_QUEUED])
    if in1:
        if queue[slot1, Q_QUEUED] == 0 and k > 0:
            return _block(pe, p, d_color(dsd, p, s1)), nwake
        k = min(k, queue[slot1, Q_QUEUED])

    # the SIMD width from the dtypes of the descriptor operands, destination first
    first, second = (dst, s0) if dst >= 0 else (s0, s1)
    third = s1 if dst >= 0 else -1
    nd = 1 + (second >= 0) + (third >= 0)
    width = classes[cls, simd_variant(classes[cls, CL_KIND], d_dtype(dsd, p, first),
                                      d_dtype(dsd, p, max(second, 0)),
                                      d_dtype(dsd, p, max(third, 0)), nd)]

    # room for this chunk, before anything changes
    if k > scratch.shape[1] and not timing:
        return need(counters, NEED_SCRATCH, k), nwake
    if out_fab and k > 0 and not send_fits(p * colors + d_color(dsd, p, dst),
                                           0 if timing else k, tree_of, dl, msg, payload,
                                           counters):
        return X_GROW, nwake
    if mp[MP_TRACE_CAP] and not room_for_trace(mp, trace, counters):
        return X_GROW, nwake

    a_head = -1
    a_tail = -1
    if k > 0:
        if in0:
            a_head = max(a_head, queue_arrival(queue, dl, slot0, 0))
            a_tail = max(a_tail, queue_arrival(queue, dl, slot0, k - 1))
        if in1:
            a_head = max(a_head, queue_arrival(queue, dl, slot1, 0))
            a_tail = max(a_tail, queue_arrival(queue, dl, slot1, k - 1))
    start, end = chunk_times(p, chunk_cycles(k, width, in0 or in1 or out_fab), a_head, a_tail,
                             pe, mp[MP_ISSUE])

    v0, v1, out = scratch[0], scratch[1], scratch[2]
    if timing:  # same times, no data: only the queues and (unknown) reductions change
        if sem == S_RSUM or sem == S_RMAX or sem == S_RDOT:
            freg[p, a] = np.float32(0)
            pe[p, P_FTAINT] |= np.int64(1) << a
    elif in0:
        queue_read(queue, dl, msg, payload, slot0, k, d_dtype(dsd, p, s0), v0)
    elif s0 >= 0:
        read_mem(dsd, p, s0, done, k, v0, sram_f32, sram_u16, base)
    if timing:
        pass
    elif in1:
        queue_read(queue, dl, msg, payload, slot1, k, d_dtype(dsd, p, s1), v1)
    elif s1 >= 0:
        read_mem(dsd, p, s1, done, k, v1, sram_f32, sram_u16, base)
    if timing:
        pass
    elif sem == S_UNARY:
        ew.unary(sub, v0, out, k)
    elif sem == S_BINARY:
        ew.binary(sub, v0, v1, out, k)
    elif sem == S_BINSCALAR:
        ew.binary_scalar(sub, v0, freg[p, c], out, k)
    elif sem == S_FILL:
        out[:k] = freg[p, b]
    elif sem == S_FMA:
        cur = scratch[3]
        read_mem(dsd, p, dst, done, k, cur, sram_f32, sram_u16, base)
        ew.fma_scalar(cur, v0, freg[p, c], out, k)
    elif sem == S_RSUM:
        freg[p, a] = reduce.rsum(v0, k, freg[p, a] if done else np.float32(0))
    elif sem == S_RMAX:
        freg[p, a] = reduce.rmax(v0, k, freg[p, a] if done else np.float32(-np.inf))
    elif sem == S_RDOT:
        freg[p, a] = reduce.rdot(v0, v1, k, freg[p, a] if done else np.float32(0))

    qdepth = mp[MP_QDEPTH]
    if in0:
        nwake = queue_consume(queue, dl, msg, counters, slot0, k, end, pe, qdepth, sched.wake,
                              nwake)
    if in1:
        nwake = queue_consume(queue, dl, msg, counters, slot1, k, end, pe, qdepth, sched.wake,
                              nwake)
    if out_fab:
        if k > 0:
            nwake = send(p, d_color(dsd, p, dst), d_dtype(dsd, p, dst), out, k, start, end, mp,
                         sched, fab, nwake)
    elif dst >= 0:  # (after the operands are read: by then the loop's prefetch has landed)
        store_elements(p, dst, done, k, out, const, sched, mem)
    finish_chunk(p, cls, k, n, start, end, pe, mp, trace, counters)
    return (X_OK if pe[p, P_STATUS] == ST_RUN else X_STOP), nwake


@njit(cache=True)
def matrix_op(p, at, const, sched, mem, far):
    """mv / mva / mm / mma: one chunk over SRAM tiles, fp32 accumulation; returns an X_* code.
    With a helper thread (MP_ASYNC) the product is checked, timed and logged here and computed
    on the helper's ring (core_jobs)."""
    # borrowed views (the loop holds the arrays): without them every array this function
    # hands on is reference-counted, a call each way (as in core_sched.run_slice)
    const, sched, mem, far = borrowed(const), borrowed(sched), borrowed(mem), borrowed(far)
    code, classes, mp = const.code, const.classes, const.mp
    pe, dsd, scratch, trace, counters = (sched.pe, sched.dsd, sched.scratch, sched.trace,
                                         sched.counters)
    sem, cls = code[at, C_SEM], code[at, C_CLASS]
    y, w, x = code[at, C_A], code[at, C_B], code[at, C_C]
    for r in (y, w, x):
        if d_kind(dsd, p, r) != DSD_MEM:
            return _fault(pe, p, F_MATRIX_FABRIC)
    for r in (y, w, x):
        if elements(dsd, p, r) < 0:
            return _fault(pe, p, F_COUNT)
    m_rows, k_cols = d_len(dsd, p, w), d_count(dsd, p, w)
    if sem == S_MV or sem == S_MVA:
        n_cols = 1
        if d_stride(dsd, p, w) != 1 or elements(dsd, p, x) != k_cols or \
                elements(dsd, p, y) != m_rows:
            return _fault(pe, p, F_SHAPE)
    else:
        n_cols = d_count(dsd, p, x)
        if d_stride(dsd, p, w) != 1 or d_stride(dsd, p, x) != 1 or d_len(dsd, p, x) != k_cols \
                or d_len(dsd, p, y) != m_rows or d_count(dsd, p, y) != n_cols:
            return _fault(pe, p, F_SHAPE)
    for r in (y, w, x):
        f = check_mem(dsd, p, r, pe[p, P_SRAM_LEN])
        if f:
            return _fault(pe, p, f)
    width = classes[cls, simd_variant(classes[cls, CL_KIND], d_dtype(dsd, p, y),
                                      d_dtype(dsd, p, w), d_dtype(dsd, p, x), 3)]
    total = m_rows * n_cols
    # one op a column of the tile on a PE (isa.costs): what follows the first op's overhead
    dur = matrix_cycles(m_rows, k_cols, n_cols, width, mp[MP_ISSUE], mp[MP_BY_COLUMN] != 0) \
        - mp[MP_ISSUE]
    if mp[MP_TIMING] == 0 and (total > scratch.shape[1] or k_cols > scratch.shape[1]):
        return need(counters, NEED_SCRATCH, max(total, k_cols))
    if mp[MP_TRACE_CAP] and not room_for_trace(mp, trace, counters):
        return X_GROW
    start, end = chunk_times(p, dur, -1, -1, pe, mp[MP_ISSUE])
    # (timing-only: y becomes unknown; with a helper thread, y is written on its ring)
    store_product(p, y, w, x, sem, m_rows, k_cols, n_cols, total, const, sched, mem, far)
    finish_chunk(p, cls, total, total, start, end, pe, mp, trace, counters)
    return X_OK

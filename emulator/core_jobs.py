"""Tile products on a helper thread, while the loop goes on with other PEs.

A functional gemv spends about a third of its host time in the tile products (64 MB of tiles
from DRAM for the 4096 x 4096 one), and a product changes nothing the scheduler needs: its
checks, cycles, trace record and undo copy are all known when it is issued. So when the driver
runs a helper (core.py), matrix_op checks and times the product as always, then *publishes* it
as a job in a ring (`jobs`: the operands' descriptors are copied, so later descriptor ops do
not matter) instead of computing it, marks the PE (pe[p, P_PENDING] = job number + 1) and the
PE goes on. The helper thread (`worker`, compiled nogil) claims published jobs in order and
runs them. Before the PE executes anything that reads or writes its SRAM (scalar loads and
stores, DMA, tensor and matrix ops: core_sram.sram_gate), `settle` makes sure its job is done: it
claims the job itself if the helper has not started it; if the helper is running it, the loop
runs the newest jobs nobody has started until it is done (spinning instead would idle the loop
for millions of turns in the gemv, where the helper is bound by DRAM; taking the oldest ones,
as the helper does, would make the two threads take every other tile). The helper also
publishes its progress (CT_DONE: every job numbered below it is done), so that settling a
product it finished long ago touches no line the helper writes. Only a PE's own
instructions touch its SRAM, and a PE has at most one job outstanding, so every value read is
the one the serial order gives: same bits, same cycles, whichever thread ran a product. The
driver calls `drain` when the loop returns, so that outside the loop no job is outstanding
(outputs, the undo log's replay and the next run see finished SRAM).

Job states change by compare-and-swap (READY -> CLAIMED by either thread, CLAIMED -> DONE by
the one that claimed it); a job's fields are written before it becomes READY (and before the
head moves past it) and its SRAM before it becomes DONE, and those states are stored with
release order and read with acquire order (LLVM's atomics, via llvmlite), so a thread that
sees a state sees the writes made before it. That is all the protocol needs: no thread stores
one variable and then relies on the order of its load of another, so sequential consistency
(a full fence on every store) would only add cost. A slot of the ring is reused only when its
job is DONE (the loop settles an older one first). Without a helper (one CPU, strict order,
timing-only or traced runs) MP_ASYNC is 0 and matrix_op computes at once, as before.
"""

from numba import njit, types
from numba.extending import intrinsic

from wse_emu.emulator.core_state import (
    CT_DONE, CT_HEAD, CT_HELPED, CT_OUT, CT_SEEN, CT_STOLEN, CT_STOP, J_BASE, J_CLAIMED, J_DONE,
    J_FREE, J_KCOLS, J_MROWS, J_NCOLS, J_P, J_READY, J_SEM, J_SEQ, J_STATE, J_TOTAL, P_PENDING,
    S_MMA, S_MV, S_MVA, d_addr, d_count, d_cstride, d_dtype, d_len, d_stride)
from wse_emu.kernels import matrix
from wse_emu.kernels.access import DT_F32, gather, scatter
from wse_emu.kernels.prefetch import prefetch_span, prefetch_write

PREFETCH_WORDS = 8 * 32  # of a job's x and y, at most (8 lines, 512 bytes)


def _element_ptr(context, builder, sig, args):
    ary = context.make_array(sig.args[0])(context, builder, args[0])
    index = context.cast(builder, args[1], sig.args[1], types.intp)
    return builder.gep(ary.data, [index])


def _int64_array(arr, index):
    return (isinstance(arr, types.Array) and arr.dtype == types.int64
            and isinstance(index, types.Integer))


@intrinsic
def atomic_load(typingctx, arr, index):
    """arr.ravel()[index] (C-contiguous int64 array), an atomic load with acquire order: what
    the thread that stored the value wrote before its release store is visible after it."""
    if not _int64_array(arr, index):
        return None

    def codegen(context, builder, sig, args):
        return builder.load_atomic(_element_ptr(context, builder, sig, args), "acquire", 8)
    return types.int64(arr, index), codegen


@intrinsic
def atomic_store(typingctx, arr, index, value):
    """arr.ravel()[index] = value, an atomic store with release order (everything this thread
    wrote before it is visible to a thread whose acquire load sees the value). Sequential
    consistency would cost a full fence (x86's xchg), which waits for the line to come back
    from the other core where the helper polls it; a release store is a plain store there."""
    if not _int64_array(arr, index) or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(v, _element_ptr(context, builder, sig, args), "release", 8)
        return context.get_dummy_value()
    return types.void(arr, index, value), codegen


@intrinsic
def atomic_cas(typingctx, arr, index, expected, new):
    """If arr.ravel()[index] == expected, set it to new; whether it did (one atomic step)."""
    if not _int64_array(arr, index) or not isinstance(expected, types.Integer) \
            or not isinstance(new, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        e = context.cast(builder, args[2], sig.args[2], types.int64)
        n = context.cast(builder, args[3], sig.args[3], types.int64)
        pair = builder.cmpxchg(_element_ptr(context, builder, sig, args), e, n, "seq_cst",
                               "seq_cst")
        return builder.extract_value(pair, 1)
    return types.boolean(arr, index, expected, new), codegen


def _view(context, builder, ty, value):
    src = context.make_array(ty)(context, builder, value)
    view = context.make_array(ty)(context, builder)
    context.populate_array(view, data=src.data, shape=src.shape, strides=src.strides,
                           itemsize=src.itemsize, meminfo=None, parent=None)
    return view._getvalue()


@intrinsic
def borrowed(typingctx, arr):
    """A view of `arr` with no owner to reference-count (valid while the caller holds arr);
    of a tuple of arrays (a part of the state, core_state.PARTS), the tuple of such views.

    Numba reference-counts every array that enters a function it calls (an atomic increment
    and decrement of the array's owner each): a loop that works on borrowed views pays none
    of that (core_sched.run_slice, worker)."""
    if isinstance(arr, types.Array):
        def codegen(context, builder, sig, args):
            return _view(context, builder, sig.args[0], args[0])
        return arr(arr), codegen
    if isinstance(arr, types.BaseTuple) and all(isinstance(t, types.Array) for t in arr.types):
        def codegen_tuple(context, builder, sig, args):
            out = args[0]
            for i, t in enumerate(sig.args[0].types):
                out = builder.insert_value(
                    out, _view(context, builder, t, builder.extract_value(args[0], i)), i)
            return out
        return arr(arr), codegen_tuple
    return None


@njit(cache=True, inline="always")
def read_mem(dsd, p, r, first, k, out, sram_f32, sram_u16, base):
    """out[0:k] = elements first .. first + k - 1 of PE p's SRAM descriptor r, as fp32 (a
    read: no gateway; the helper thread and the executors read with it)."""
    gather(sram_f32, sram_u16, base + d_addr(dsd, p, r), d_len(dsd, p, r),
           d_stride(dsd, p, r), d_count(dsd, p, r), d_cstride(dsd, p, r), d_dtype(dsd, p, r),
           first, k, out)


@njit(cache=True, inline="always")
def _write_mem(dsd, p, r, first, k, vals, sram_f32, sram_u16, base):
    """The product's write to y, on whichever thread ran it: the gateway (core_sram) logged
    y's old contents when the product was published."""
    scatter(sram_f32, sram_u16, base + d_addr(dsd, p, r), d_len(dsd, p, r),
            d_stride(dsd, p, r), d_count(dsd, p, r), d_cstride(dsd, p, r), d_dtype(dsd, p, r),
            first, k, vals)


@njit(cache=True, inline="always")
def product(dsd, row, y, w, x, sem, base, m_rows, k_cols, n_cols, total, sram_f32, sram_u16,
            scratch):
    """(y +) W x or W X of descriptors dsd[row, y/w/x], fp32 accumulation, into scratch[2]
    (the caller writes it to y)."""
    acc = scratch[2]
    if sem == S_MVA or sem == S_MMA:
        read_mem(dsd, row, y, 0, total, acc, sram_f32, sram_u16, base)
    else:
        acc[:total] = 0
    if sem == S_MV or sem == S_MVA:
        xv = scratch[0]
        read_mem(dsd, row, x, 0, k_cols, xv, sram_f32, sram_u16, base)
        matrix.mv(sram_f32, sram_u16, base + d_addr(dsd, row, w), m_rows, k_cols,
                  d_cstride(dsd, row, w), d_dtype(dsd, row, w), xv, acc)
    else:
        matrix.mm(sram_f32, sram_u16, base + d_addr(dsd, row, w), m_rows, k_cols,
                  d_cstride(dsd, row, w), d_dtype(dsd, row, w), base + d_addr(dsd, row, x),
                  n_cols, d_cstride(dsd, row, x), d_dtype(dsd, row, x), acc)


@njit(cache=True, inline="always")
def _run_job(slot, jobs, jdsd, sram_f32, sram_u16, scratch):
    product(jdsd, slot, 0, 1, 2, jobs[slot, J_SEM], jobs[slot, J_BASE], jobs[slot, J_MROWS],
            jobs[slot, J_KCOLS], jobs[slot, J_NCOLS], jobs[slot, J_TOTAL], sram_f32, sram_u16,
            scratch)
    _write_mem(jdsd, slot, 0, 0, jobs[slot, J_TOTAL], scratch[2], sram_f32, sram_u16,
               jobs[slot, J_BASE])


@njit(cache=True)
def _run_newest(q, low, jobs, jdsd, ctl, sram_f32, sram_u16, scratch):
    """Run the newest job of sequence low .. q - 1 that nobody has started, on the loop's
    thread; the sequence number to look below next time (low when there is none left)."""
    ring = jobs.shape[0]
    while q > low:
        q -= 1
        slot = q % ring
        # a job of sequence q in its slot (not an older one the ring has passed)
        if jobs[slot, J_SEQ] == q and atomic_cas(jobs, slot * jobs.shape[1] + J_STATE,
                                                 J_READY, J_CLAIMED):
            _run_job(slot, jobs, jdsd, sram_f32, sram_u16, scratch)
            atomic_store(jobs, slot * jobs.shape[1] + J_STATE, J_DONE)
            ctl[CT_STOLEN] += 1
            break
    return q


@njit(cache=True, inline="always")
def _finish_slot(slot, jobs, jdsd, ctl, sram_f32, sram_u16, scratch):
    """Make the job in `slot` done: run it here if nobody has claimed it; if the helper is
    running it, run the newest jobs nobody has started meanwhile instead of spinning (their
    PEs settle them later than the helper, which takes the oldest, would get to them).
    That part is a function of its own: inlined into the loop's step (through settle), its
    copy of the product would bloat the hot loop of every program, those with no product too,
    while out of line it costs a call only when a product is pending."""
    flat = slot * jobs.shape[1] + J_STATE
    # done already (the usual case when a PE comes back to its product): a load, which leaves
    # the helper's copy of the line alone, where the compare-and-swap would take it over
    if atomic_load(jobs, flat) == J_DONE:
        return
    if atomic_cas(jobs, flat, J_READY, J_CLAIMED):
        _run_job(slot, jobs, jdsd, sram_f32, sram_u16, scratch)
        atomic_store(jobs, flat, J_DONE)
        ctl[CT_STOLEN] += 1
        return
    # The newest jobs first: the helper takes them oldest first, so each thread streams
    # its tiles in order from its own end instead of both taking every other tile (which
    # made each one's look-ahead prefetch load the other's next tile).
    q = ctl[CT_HEAD]  # only the loop's thread publishes: no job appears meanwhile
    low = jobs[slot, J_SEQ] + 1
    while atomic_load(jobs, flat) == J_CLAIMED:
        q = _run_newest(q, low, jobs, jdsd, ctl, sram_f32, sram_u16, scratch)


@njit(cache=True, inline="always")
def settle(p, pe, jobs, jdsd, ctl, sram_f32, sram_u16, scratch):
    """PE p's outstanding product is done when this returns (pe[p, P_PENDING] was set).

    Usually the helper finished it long ago: its progress word says so (CT_DONE: every job
    numbered below is done), and the loop keeps the value it last read (CT_SEEN), so most
    PEs settle without touching a line the helper writes; only the job's own state line
    would otherwise come over from the helper's core, one a PE (~165 ns here when not
    prefetched in time)."""
    seq = pe[p, P_PENDING] - 1
    pe[p, P_PENDING] = 0
    if seq < ctl[CT_SEEN]:
        return
    seen = atomic_load(ctl, CT_DONE)
    ctl[CT_SEEN] = seen
    if seq < seen:
        return
    slot = seq % jobs.shape[0]
    if jobs[slot, J_SEQ] == seq:  # else the slot was reused, which it is only once done
        _finish_slot(slot, jobs, jdsd, ctl, sram_f32, sram_u16, scratch)


@njit(cache=True, inline="always")
def publish(p, dsd, y, w, x, sem, base, m_rows, k_cols, n_cols, total, pe, jobs, jdsd, ctl,
            sram_f32, sram_u16, scratch):
    """Hand PE p's checked, timed and logged product to the helper; the PE goes on."""
    seq = ctl[CT_HEAD]
    slot = seq % jobs.shape[0]
    if atomic_load(jobs, slot * jobs.shape[1] + J_STATE) != J_FREE:
        _finish_slot(slot, jobs, jdsd, ctl, sram_f32, sram_u16, scratch)
    jobs[slot, J_SEQ] = seq
    jobs[slot, J_P] = p
    jobs[slot, J_SEM] = sem
    jobs[slot, J_BASE] = base
    jobs[slot, J_MROWS] = m_rows
    jobs[slot, J_KCOLS] = k_cols
    jobs[slot, J_NCOLS] = n_cols
    jobs[slot, J_TOTAL] = total
    jdsd[slot, 0, :] = dsd[p, y, :]
    jdsd[slot, 1, :] = dsd[p, w, :]
    jdsd[slot, 2, :] = dsd[p, x, :]
    atomic_store(jobs, slot * jobs.shape[1] + J_STATE, J_READY)
    atomic_store(ctl, CT_HEAD, seq + 1)
    pe[p, P_PENDING] = seq + 1
    # the next slot's row, for writing: its last job's state, which the next publish reads
    # first, was written on the helper's core, and that job's fields were read there (the
    # next publish would wait ~165 ns for each line to come over, on every product)
    prefetch_span(jobs, ((seq + 1) % jobs.shape[0]) * jobs.shape[1], jobs.shape[1], True)


@njit(cache=True, nogil=True)
def drain(pe, jobs, jdsd, ctl, sram_f32, sram_u16, scratch):
    """Finish every outstanding job (the loop has returned: nothing is published meanwhile).
    Usually the helper's progress word says every one is done, and the ring is left as it is:
    its slots are reused as done ones, and a PE still marked settles at once (settle)."""
    if atomic_load(ctl, CT_DONE) >= ctl[CT_HEAD]:
        return
    for slot in range(jobs.shape[0]):
        if jobs[slot, J_STATE] != J_FREE:
            _finish_slot(slot, jobs, jdsd, ctl, sram_f32, sram_u16, scratch)
            pe[jobs[slot, J_P], P_PENDING] = 0
            atomic_store(jobs, slot * jobs.shape[1] + J_STATE, J_FREE)


@njit(cache=True, nogil=True)
def await_out(ctl):
    """Return once the helper has stopped touching the run's arrays (ctl[CT_OUT], which it
    sets as its worker returns): a spin without the GIL, so that a helper thread which has
    not yet entered the worker can take the GIL, start it and see the stop at once."""
    while atomic_load(ctl, CT_OUT) == 0:
        pass


@njit(cache=True, inline="always")
def _prefetch_ahead(cursor, head, jobs, jdsd, sram_u16):
    """Start loading what the helper's next jobs read, while it runs the current one: the
    ring row of job cursor + 1, and the x and y operands of job cursor (whose row was loaded
    so one job ago). The loop's thread wrote all of these, so they sit in the other core's
    cache (one line moved between the two vCPUs here takes ~165 ns, and a job reads about a
    dozen); a hint only, whatever those jobs turn out to be."""
    ring = jobs.shape[0]
    cols = jobs.shape[1]
    if cursor + 1 < head:
        row = ((cursor + 1) % ring) * cols
        prefetch_write(jobs, row + J_STATE)  # (to be claimed: a compare-and-swap)
        prefetch_span(jobs, row + 8, cols - 8, False)  # (8 int64 a 64-byte line)
    if cursor < head:
        slot = cursor % ring
        base = jobs[slot, J_BASE]
        for r in (0, 2):  # y (to be written), x: their first PREFETCH_WORDS, or first element
            words = (jobs[slot, J_TOTAL] if r == 0 else jobs[slot, J_KCOLS]) * \
                (2 if d_dtype(jdsd, slot, r) == DT_F32 else 1)
            if d_stride(jdsd, slot, r) != 1:
                words = 1
            prefetch_span(sram_u16, (base + d_addr(jdsd, slot, r)) >> 1,
                          min(words, PREFETCH_WORDS), r == 0)


@njit(cache=True, nogil=True)
def worker(jobs, jdsd, ctl, sram_f32, sram_u16, scratch):
    """The helper thread: run published jobs in order until ctl[CT_STOP] is set. Jobs larger
    than its scratch (the loop's has grown since) are left to the loop."""
    # borrowed views (the driver holds the arrays): the NRT's atomic reference counts of
    # every array a product passes on took ~13 % of this thread's time in the 4096 gemv
    jobs, jdsd, ctl = borrowed(jobs), borrowed(jdsd), borrowed(ctl)
    sram_f32, sram_u16, scratch = borrowed(sram_f32), borrowed(sram_u16), borrowed(scratch)
    ring = jobs.shape[0]
    cursor = 0
    head = 0
    in_order = True  # every job below cursor is done (or the loop's: done when it looks)
    while True:
        if cursor >= head:  # (the head's line moves between the threads: read it only here)
            head = atomic_load(ctl, CT_HEAD)
            if cursor >= head:
                if atomic_load(ctl, CT_STOP) != 0:
                    atomic_store(ctl, CT_OUT, 1)  # (after its last write to the run's arrays)
                    return
                continue
        cursor = max(cursor, head - ring)  # (jobs a whole ring back: the loop finished them)
        slot = cursor % ring
        cursor += 1
        flat = slot * jobs.shape[1] + J_STATE
        if atomic_cas(jobs, flat, J_READY, J_CLAIMED):
            if max(jobs[slot, J_TOTAL], jobs[slot, J_KCOLS]) > scratch.shape[1]:
                atomic_store(jobs, flat, J_READY)
                in_order = False  # left to the loop: the progress word stops here
                continue
            _prefetch_ahead(cursor, head, jobs, jdsd, sram_u16)
            _run_job(slot, jobs, jdsd, sram_f32, sram_u16, scratch)
            atomic_store(jobs, flat, J_DONE)
            ctl[CT_HELPED] += 1
        # else the loop claimed it, and it runs what it claims to the end before it settles
        # anything: by the time it reads the progress word, that job is done too
        if in_order:
            atomic_store(ctl, CT_DONE, cursor)

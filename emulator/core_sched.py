"""The scheduler of the Numba core (docs/timing-model.md section 7).

The runnable PE with the smallest (clock, PE index) executes next. Only fabric operations (a
tensor op with a fabric input or a fabric output) and DMA requests (dmald, dmast: they reserve
the shared HBM channels) touch state another PE can see, so in the
default mode a PE that comes first executes its fabric operation and then runs ahead through
its local instructions up to its next fabric operation: one heap update per fabric operation
instead of one per instruction, with the same results as the strict order. A fault found while
running ahead is only reported when its key comes first, so the first fault in (clock, PE)
order is the one reported. In strict mode (MP_STRICT) a PE runs only while it is still first,
which is the reference interpreter's order instruction by instruction: the driver uses it
for traces and to replay runs that end in a fault, where PEs that ran ahead would differ.

A process started with WSE_EMU_COUNT=loop compiles a counting build of the loop
(core_state.COUNT_LOOP): the cycle counter read around every step and heap update, the ticks
added per part of the loop (core.loop_profile; docs/contributing.md). The default build
compiles none of it.

`run_slice` returns to the driver when the host's cycle counter passes a deadline or after a
budget of steps (R_CONTINUE: so that Python sees a Ctrl-C and reports progress), or when a pool
must grow (R_GROW); all state stays in the arrays, so it simply re-enters.
Heap keys pack (clock, PE) into one int64, which bounds the clock (R_CLOCK_LIMIT: 2**43 cycles
with 900k PEs, far beyond what a run can reach in hours of host time).

Speed: Numba reference-counts every array that enters a function or an inlined body (an atomic
increment and decrement per array), which with two dozen state arrays cost more than the
instructions themselves. `run_slice` therefore works on *borrowed* views of its arguments
(the state's parts, core_state.PARTS, each a namedtuple of arrays), array structs without a
reference-counted owner, for which those operations compile away; the driver holds the real
arrays for the whole call. Executors are inlined into the loop so that the parts they take
are not copied on every call.

On a large mesh the per-PE rows a visit touches are in DRAM, and so are the SRAM operands of
its first tensor op: the loop prefetches (kernels.prefetch: hints, nothing read or changed)
the rows of the PE that most likely runs next while the current one executes, and the SRAM
operands of the current PE's first instruction before running it (_prefetch_next,
_prefetch_operands); the heap prefetches the level below as it sifts down. Without the
hints a visit waits for each of those lines in turn; with them the waits overlap the work of
the PE before.
"""

import platform

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from wse_emu.emulator.core_exec import (exec_desc, exec_dma, exec_dmawait, exec_float, exec_int, is_dma,
                                is_fabric)
from wse_emu.emulator.core_fabric import heap_pop_top, heap_push, heap_replace_top, still_first
from wse_emu.emulator.core_jobs import borrowed
from wse_emu.emulator.core_sram import sram_gate
from wse_emu.emulator.core_state import (
    C_A, C_B, C_C, C_CLASS, C_COST, C_IH, C_IL, C_IMM, C_SEM, COUNT_LOOP, CT_SEEN, K_CLASS0,
    K_FAULT_PE, K_LOOP0, K_LOOP_ALL, LOOP_FIRST, LOOP_HEAP, LOOP_SCALAR, LOOP_TENSOR,
    K_FAULT_REASON, K_HALTED, K_HEAP_N, K_INSTR_TOTAL, K_OUTCOME,
    MAX_KEY_BITS, MP_COLORS, MP_MAX_CYCLES, MP_PE_BITS, MP_STRICT, P_BUSY, P_CLOCK,
    P_CODE0, P_CODELEN, P_FABRIC, P_FAULT, P_INSTR, P_PC, P_PENDING, P_SRAM0,
    P_STATUS, S_DESC, S_DMAWAIT, S_FLOAT, S_MATRIX, S_TENSOR, X_FAULT, X_GROW, X_OK,
    X_STOP, d_addr, d_color, d_kind)
from wse_emu.emulator.core_tensor import matrix_op, tensor_op
from wse_emu.emulator.result import (F_PC_END, RUN_DEADLOCK, RUN_FAULT, RUN_HALTED, RUN_MAX_CYCLES,
                             ST_FAULT, ST_HALT, ST_RUN)
from wse_emu.isa.spec import DSD_FABIN, DSD_FABOUT, DSD_MEM
from wse_emu.kernels.prefetch import prefetch

R_DONE, R_CONTINUE, R_GROW, R_CLOCK_LIMIT = range(4)
PREFETCH_LINES = 4  # of each SRAM operand of the next tensor op (see _prefetch_operands)
# steps between two reads of the cycle counter (a power of two): a read costs about as much
# as a cheap step
DEADLINE_STEPS = 64
NO_DEADLINE = np.iinfo(np.int64).max
# x86's time-stamp counter runs at a constant rate and user code may read it; elsewhere LLVM's
# cycle counter may be a register user code cannot read, so there the counter reads 0 (the
# driver then bounds a slice by its budget of steps only)
HAS_COUNTER = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


@intrinsic
def _read_counter(typingctx):
    def codegen(context, builder, sig, args):
        if not HAS_COUNTER:
            return context.get_constant(types.int64, 0)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@njit(cache=True)
def counter_read_ticks(n):
    """The cycle counter's ticks a read, over n reads in a row (the counting build's own cost)."""
    t0 = _read_counter()
    last = t0
    for _ in range(n):
        last = _read_counter()
    return (last - t0) / max(n, 1)


@njit(cache=True)
def cycle_counter():
    """The host's cycle counter (x86: the time-stamp counter, ticks at a constant rate), 0
    where it cannot be read: what run_slice's deadline is measured in."""
    return _read_counter()


@njit(cache=True, inline="always")
def step(p, const, sched, mem, fab, far, nwake):
    """Execute PE p's next instruction (or chunk); returns (X_* code, PEs to wake)."""
    code, pe = const.code, sched.pe
    pc = pe[p, P_PC]
    if pc >= pe[p, P_CODELEN]:
        pe[p, P_FAULT] = F_PC_END
        return X_FAULT, nwake
    at = pe[p, P_CODE0] + pc
    sem = code[at, C_SEM]
    # its tile product first, and room in the undo log for what it may write (core_sram)
    if not sram_gate(p, sem, const, sched, mem, far):
        return X_GROW, nwake
    if sem >= S_TENSOR:
        if sem >= S_MATRIX:
            return matrix_op(p, at, const, sched, mem, far), nwake
        return tensor_op(p, at, const, sched, mem, fab, nwake)
    a, b, c, imm = code[at, C_A], code[at, C_B], code[at, C_C], code[at, C_IMM]
    if is_dma(sem):
        return exec_dma(p, sem, a, b, code[at, C_IL], code[at, C_CLASS], const, sched, mem,
                        far), nwake
    nxt = pc + 1
    if sem == S_DMAWAIT:
        f = exec_dmawait(p, code[at, C_IL], code[at, C_COST], pe)
        if f:
            nxt = -f
    elif sem >= S_DESC:
        exec_desc(p, sem, a, b, c, imm, code[at, C_IL], code[at, C_IH], sched)
    elif sem >= S_FLOAT:
        nxt = exec_float(p, sem, a, b, c, imm, pc, const, sched, mem)
    else:
        nxt = exec_int(p, sem, a, b, c, imm, pc, const, sched, mem)
    if nxt < 0:
        pe[p, P_FAULT] = -nxt
        return X_FAULT, nwake
    cost = code[at, C_COST]
    pe[p, P_CLOCK] += cost
    pe[p, P_BUSY] += cost
    pe[p, P_PC] = nxt
    pe[p, P_INSTR] += 1
    counters = sched.counters
    counters[K_CLASS0 + code[at, C_CLASS]] += 1
    counters[K_INSTR_TOTAL] += 1
    return (X_OK if pe[p, P_STATUS] == ST_RUN else X_STOP), nwake


@njit(cache=True, inline="always")
def _next_sem(p, code, pe):
    """The semantic id of PE p's next instruction (-1 past its code; the counting build)."""
    pc = pe[p, P_PC]
    return code[pe[p, P_CODE0] + pc, C_SEM] if pc < pe[p, P_CODELEN] else -1


@njit(cache=True, inline="always")
def _next_is_fabric(p, code, pe):
    pc = pe[p, P_PC]
    if pc >= pe[p, P_CODELEN]:
        return False
    at = pe[p, P_CODE0] + pc
    return is_dma(code[at, C_SEM]) or is_fabric(code[at, C_SEM], code[at, C_A], code[at, C_B],
                                                code[at, C_C], pe[p, P_FABRIC])


@njit(cache=True, inline="always")
def _prefetch_next(heap, heap_n, mask, pe, dsd, fab, colors):
    """Start loading the pe row and the descriptors of the PE that most likely runs after the
    root: the smallest of the root's children (the root's own next key could come first, but
    rarely does). On a large mesh those rows are in DRAM, and a visit would miss on them one
    after another; prefetched while the root's PE executes, they arrive in time. Prefetching
    all its queue, route and register rows as well measured no faster (more traffic, as much
    saved); what does pay is the one route a sending PE most likely uses and that route's
    first receiver (State.send_hint): in the 4096-PE gemv's chain of partial sums those two
    loads were 14 % of the loop's time (2-4 % less time a run). A hint only
    (kernels.prefetch): nothing is read or changed, whatever PE runs next."""
    if heap_n < 2:
        return
    best = heap[1]
    for child in range(2, min(5, heap_n)):
        if heap[child] < best:
            best = heap[child]
    q = best & mask
    row = pe.shape[1]
    for i in range(0, row, 8):  # 8 int64 a 64-byte line, and the row's last line
        prefetch(pe, q * row + i)
    prefetch(pe, q * row + row - 1)
    row = dsd.shape[1] * dsd.shape[2]
    for i in range(0, row, 16):  # 16 int32 a line
        prefetch(dsd, q * row + i)
    prefetch(dsd, q * row + row - 1)
    # and, if it sends, its first route's row and the queue and status of that route's first
    # receiver, which a send reads one after another (State.send_hint)
    send_hint, tree_of, queue = fab.send_hint, fab.tree_of, fab.queue
    slot = send_hint[q, 0]
    if slot >= 0:
        prefetch(tree_of, slot * tree_of.shape[1])
        to = send_hint[q, 1]
        if to >= 0:
            prefetch(queue, to * queue.shape[1])
            prefetch(pe, (to // colors) * pe.shape[1] + P_STATUS)


@njit(cache=True, inline="always")
def _prefetch_operands(p, code, pe, dsd, sram_u16, fab, far, colors):
    """Start loading what PE p's next instruction reads, if it is a tensor op: up to
    PREFETCH_LINES lines of each SRAM operand (from its first element), the route row
    (tree_of) of a fabric output, the input-queue row of a fabric input, and the ring row of
    its outstanding tile product (which the helper thread's core holds). Its pe and
    descriptor rows are in cache by now (see _prefetch_next); those others often are not (on
    the 4096-PE gemv a program's tables outgrow a core's share of the last-level cache),
    and the op would only find them one after another, after its checks and the undo log's
    copy. A hint only: registers that are not descriptors here, or addresses outside the
    SRAM, are skipped or harmless."""
    tree_of, queue, jobs, ctl = fab.tree_of, fab.queue, far.jobs, far.ctl
    pc = pe[p, P_PC]
    base = pe[p, P_SRAM0]
    if pc >= pe[p, P_CODELEN]:
        return
    at = pe[p, P_CODE0] + pc
    if code[at, C_SEM] < S_TENSOR:
        return
    # its product's state, which settle reads unless the helper's progress, as the loop last
    # read it, covers that product (core_jobs)
    if pe[p, P_PENDING] != 0 and pe[p, P_PENDING] - 1 >= ctl[CT_SEEN]:
        prefetch(jobs, ((pe[p, P_PENDING] - 1) % jobs.shape[0]) * jobs.shape[1])
    limit = sram_u16.shape[0]
    for r in (code[at, C_A], code[at, C_B], code[at, C_C]):
        if r < 0 or r >= dsd.shape[1]:
            continue
        kind = d_kind(dsd, p, r)
        if kind == DSD_MEM and base >= 0:
            w = (base + d_addr(dsd, p, r)) >> 1
            if w < 0:
                continue
            end = min(w + PREFETCH_LINES * 32, limit)  # 32 uint16 words a 64-byte line
            while w < end:
                prefetch(sram_u16, w)
                w += 32
        elif kind == DSD_FABOUT or kind == DSD_FABIN:
            slot = p * colors + d_color(dsd, p, r)
            if 0 <= slot < queue.shape[0]:
                if kind == DSD_FABOUT:
                    prefetch(tree_of, slot * tree_of.shape[1])
                else:
                    prefetch(queue, slot * queue.shape[1])


@njit(cache=True)
def _finish(pe, counters):
    """The outcome when no PE is runnable: halted if all have, else deadlock."""
    if counters[K_HALTED] == pe.shape[0]:  # (no pass over every PE's row)
        counters[K_OUTCOME] = RUN_HALTED
        return R_DONE
    for p in range(pe.shape[0]):
        if pe[p, P_STATUS] != ST_HALT:
            counters[K_OUTCOME] = RUN_DEADLOCK
            return R_DONE
    counters[K_OUTCOME] = RUN_HALTED
    return R_DONE


@njit(cache=True, nogil=True)
def run_slice(const, sched, mem, fab, far, budget, deadline):
    """Run until the end (R_DONE, outcome in counters), `budget` steps or the cycle counter's
    `deadline` (read every DEADLINE_STEPS steps; R_CONTINUE), or a request to grow (R_GROW).
    Where the run stops a slice changes nothing it computes. The state comes in its parts
    (core_state.PARTS: Const, Sched, Mem, Fabric, Far; State.parts builds them)."""
    # borrowed here, in the function that runs the loop, so LLVM sees they have no owner
    const, sched, mem, fab, far = (borrowed(const), borrowed(sched), borrowed(mem),
                                   borrowed(fab), borrowed(far))
    code, mp, pe, dsd, heap, counters = (const.code, const.mp, sched.pe, sched.dsd, sched.heap,
                                         sched.counters)
    max_cycles = mp[MP_MAX_CYCLES]
    strict = mp[MP_STRICT] != 0
    bits = mp[MP_PE_BITS]
    mask = (np.int64(1) << bits) - 1
    clock_limit = (np.int64(1) << (MAX_KEY_BITS - bits)) - 1
    colors = mp[MP_COLORS]
    heap_n = counters[K_HEAP_N]
    while True:
        if heap_n == 0:
            counters[K_HEAP_N] = 0
            return _finish(pe, counters)
        p = heap[0] & mask
        _prefetch_next(heap, heap_n, mask, pe, dsd, fab, colors)
        _prefetch_operands(p, code, pe, dsd, mem.sram_u16, fab, far, colors)
        if heap[0] >> bits > max_cycles:
            counters[K_HEAP_N] = heap_n
            counters[K_OUTCOME] = RUN_MAX_CYCLES
            return R_DONE
        if pe[p, P_FAULT] != 0:
            pe[p, P_STATUS] = ST_FAULT
            counters[K_HEAP_N] = heap_n
            counters[K_OUTCOME] = RUN_FAULT
            counters[K_FAULT_PE] = p
            counters[K_FAULT_REASON] = pe[p, P_FAULT]
            return R_DONE
        if budget <= 0:
            counters[K_HEAP_N] = heap_n
            return R_CONTINUE
        nwake = 0
        first = True
        t_visit = _read_counter() if COUNT_LOOP else 0
        while True:
            if not first:
                if pe[p, P_CLOCK] > max_cycles:
                    break
                if strict:
                    if nwake > 0 or not still_first(heap, heap_n, pe[p, P_CLOCK] << bits | p):
                        break
                elif _next_is_fabric(p, code, pe):
                    break
            if COUNT_LOOP:
                part = LOOP_FIRST if first else (
                    LOOP_TENSOR if _next_sem(p, code, pe) >= S_TENSOR else LOOP_SCALAR)
                t0 = _read_counter()
            x, nwake = step(p, const, sched, mem, fab, far, nwake)
            if COUNT_LOOP:
                counters[K_LOOP0 + 2 * part] += _read_counter() - t0
                counters[K_LOOP0 + 2 * part + 1] += 1
            first = False
            if x == X_OK or x == X_STOP:
                budget -= 1
                if budget & (DEADLINE_STEPS - 1) == 0 and _read_counter() >= deadline:
                    budget = 0
            if x != X_OK or budget <= 0:
                break
        if pe[p, P_CLOCK] > clock_limit:  # (woken PEs' clocks are never later than this one)
            counters[K_HEAP_N] = heap_n
            return R_CLOCK_LIMIT
        t_heap = _read_counter() if COUNT_LOOP else 0
        if pe[p, P_STATUS] == ST_RUN:
            heap_replace_top(heap, heap_n, pe[p, P_CLOCK] << bits | p)
        else:
            heap_n = heap_pop_top(heap, heap_n)
        for i in range(nwake):
            q = sched.wake[i]
            heap_n = heap_push(heap, heap_n, pe[q, P_CLOCK] << bits | q)
        if COUNT_LOOP:
            t_end = _read_counter()
            counters[K_LOOP0 + 2 * LOOP_HEAP] += t_end - t_heap
            counters[K_LOOP0 + 2 * LOOP_HEAP + 1] += 1
            counters[K_LOOP_ALL] += t_end - t_visit
        if x == X_GROW:
            counters[K_HEAP_N] = heap_n
            return R_GROW

"""The Numba core: runs a Loaded program exactly as docs/timing-model.md (and the reference
interpreter, emulator/reference.py) defines, fast.

    result = run(loaded, max_cycles=None, trace=False, trace_cap=1_000_000, progress=None)

The jitted loop (core_sched.run_slice) works on the arrays of a core_state.State, in the named
parts State.parts builds, and returns here about every SLICE_SECONDS of host time, and whenever
a pool must grow; the driver grows it and re-enters. Returning is what lets Python act on a
signal: Python only runs its SIGINT handler between bytecodes, so a Ctrl-C during a run raises
KeyboardInterrupt here within a slice, out of `run` (a helper thread is stopped first, see
_drive). It is also where `progress(cycles, instructions)` is called, about every
PROGRESS_SECONDS. Slices change nothing a run computes: all state stays in the arrays.

PEs run ahead through local instructions by default (core_sched explains why that is exact). A
run that ends in a fault is the exception: PEs other than the faulting one may have run past
the fault's cycle. So the loop logs the original contents of every SRAM byte a PE writes (once:
what each write adds to the span the PE has written so far, so the cost is the bytes written,
not the SRAM size), and the driver replays a faulting run in strict order from the restored
SRAM: its state then equals the reference's. Traced runs use strict order throughout, so the
trace lists chunks in the reference's order.

On a host with a second CPU, a functional run with tile products (mv, mm) computes them on a
helper thread while the loop goes on with other PEs (core_jobs explains how that keeps every
bit and cycle): in the 4096 x 4096 gemv they are a third of the host time.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

from wse_emu.emulator import jit_inline
from wse_emu.emulator.core_jobs import await_out, drain, worker
from wse_emu.emulator.core_sched import (NO_DEADLINE, R_CLOCK_LIMIT, R_CONTINUE, R_DONE, R_GROW,
                                         counter_read_ticks, cycle_counter, run_slice)
from wse_emu.emulator.core_state import (
    CT_OUT, CT_STOP, H_BUSY, HBM_TICKS, K_FAULT_PE, K_FAULT_REASON, K_HBM_READ, K_HBM_WRITE,
    K_HEAP_N, K_HOPS, K_INSTR_TOTAL, K_MESSAGES, K_OUTCOME, K_QUEUED, K_TRACE_N, K_WAVELETS,
    COUNT_LOOP, K_LOOP0, K_LOOP_ALL, LOOP_PARTS, J_FREE, J_STATE, MP_ASYNC, MP_PE_BITS, N_CT,
    N_JOB_COLS, P_CLOCK, State, job_descriptors, max_clock, result_columns, C_A, C_B, P_CODE0,
    P_PC, descriptor)
from wse_emu.emulator.core_undo import restore_sram
from wse_emu.emulator.host_clock import HostClock
from wse_emu.emulator.load import Loaded, PageSnapshot, hbm_chip_detail
from wse_emu.emulator.result import F_HBM_CHIP, RUN_FAULT, RUN_MAX_CYCLES, RunResult
from wse_emu.isa.spec import BY_MNEMONIC, DTYPE_BYTES

OP_DMAST = BY_MNEMONIC["dmast"].opcode

PROGRESS_SECONDS = 0.5
# host time of a slice of the loop: Python sees a Ctrl-C within about that
SLICE_SECONDS = 0.1
# Slices end at a deadline on the host's cycle counter (core_sched.cycle_counter), whose rate
# is measured against perf_counter over the process's life (_ticks_per_second). Until that is
# known (the first 10 ms), or where the counter cannot be read, a slice is a budget of steps,
# from FIRST_BUDGET, adapted after each slice to take SLICE_SECONDS.
FIRST_BUDGET = 1 << 14
MIN_BUDGET = 1 << 10
FULL_BUDGET = 1 << 62
# Tile products the helper thread may have outstanding (core_jobs): every one of the 4096 gemv's,
# so that the loop never waits for a free slot (it would then wait on the helper's slowest job)
RING_SLOTS = 4096
# The least SRAM (all PEs) for which the helper is chosen by default: a pass over 4 MB of tiles
# takes ~0.2 ms, about what starting the thread costs; and a process's first helper loads
# ~70 ms of cached machine code, which a small run such as a warm `wse-emu run` would wait for.
HELPER_MIN_SRAM = 1 << 22


def _drop_stale_cache() -> None:
    """Numba revalidates a cached function against its own source only, yet the core's cached
    machine code holds the kernels and sibling modules it calls and inlines: drop the caches
    compiled from sources that changed since (emulator/jit_cache.py; dev.py runs the same)."""
    from wse_emu.emulator import jit_cache

    jit_cache.drop_stale(jit_cache.numba_cache_dirs())


_drop_stale_cache()
jit_inline.install()  # before anything is compiled: Numba's inlining 42-54 s -> 6-7 s


def run(loaded: Loaded, max_cycles: int | None = None, trace: bool = False,
        trace_cap: int = 1_000_000, progress=None, helper: bool | None = None) -> RunResult:
    """Run `loaded` to its end (mutates loaded.sram; read outputs with load.read_output).

    `helper`: compute tile products on a second thread (core_jobs) while the loop goes on;
    None chooses it for functional runs with matrix ops and HELPER_MIN_SRAM of SRAM or more,
    on a host with two CPUs or more. It changes no result, only host time; traced runs,
    timing-only runs and fault replays never use it.

    host_seconds is the run's host time less Numba's compiling (compile_seconds, on the first
    run of a kind: emulator/host_clock.py)."""
    with HostClock() as clock:
        result = _run(loaded, max_cycles, trace, trace_cap, progress, helper)
    result.host_seconds, result.compile_seconds = clock.host_seconds, clock.compile_seconds
    return result


def _run(loaded, max_cycles, trace, trace_cap, progress, helper) -> RunResult:
    has = loaded.sram_base >= 0
    if (loaded.sram_base[has] + loaded.sram_len[has] > loaded.sram.size).any():
        raise ValueError("this Loaded's SRAM is smaller than its PEs need")
    if not loaded.timing_only and not has.all():
        raise ValueError("a functional run needs SRAM on every PE")
    if loaded.pe_stride >= 1 << 31:  # the core's address checks assume less (core_exec.FAR)
        raise ValueError(f"{loaded.pe_stride} bytes of SRAM per PE: the core supports < 2 GiB")
    # timing-only: put back with the SRAM for a replay
    unknown = PageSnapshot(loaded.unknown) if loaded.unknown.size else None
    # dmast writes HBM, which the undo log does not cover: keep a copy for a replay
    hbm = loaded.hbm.copy() if loaded.hbm.size and (loaded.code_op == OP_DMAST).any() else None
    state = State(loaded, max_cycles, trace, trace, trace_cap)
    if helper is None:
        helper = _helper_pays(state)
    helper = bool(helper) and not trace and not loaded.timing_only
    _drive(state, progress, helper)
    if int(state.counters[K_OUTCOME]) == RUN_FAULT and not trace:
        restore_sram(state.sram_u16, state.undo, state.undo_data, state.counters)
        if unknown is not None:
            unknown.restore(loaded.unknown)
        if hbm is not None:
            loaded.hbm[:] = hbm
        state = State(loaded, max_cycles, True, trace, trace_cap)
        _drive(state, progress)
    result = _result(state, max_cycles)
    result.host_threads = 2 if helper else 1
    return result


def _helper_pays(state: State) -> bool:
    """Whether a helper thread for tile products would pay: a functional run with matrix
    ops on at least HELPER_MIN_SRAM of SRAM, and a second CPU for this process."""
    loaded = state.loaded
    if loaded.timing_only or int(loaded.sram_len.sum()) < HELPER_MIN_SRAM \
            or not state.fixed.has_products:
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        cpus = os.cpu_count() or 1
    return cpus >= 2


def _drive(state: State, progress, helper: bool = False) -> None:
    """Run the loop to the end; with `helper`, products run on a second thread meanwhile."""
    if not helper:
        return _loop(state, progress)
    fixed = state.fixed
    # the ring of an earlier run of this program, if any: a run that ended normally left its
    # slots free or done (drain), which a new run reuses alike; one that an exception cut
    # short may have left jobs ready or claimed, so then every slot is freed
    state.jobs = fixed.buffer("jobs", (RING_SLOTS, N_JOB_COLS), np.int64)
    if len(state.jobs) != RING_SLOTS:
        state.jobs = fixed.buffers["jobs"] = np.zeros((RING_SLOTS, N_JOB_COLS), np.int64)
    elif not fixed.ring_settled:
        state.jobs[:, J_STATE] = J_FREE
    fixed.ring_settled = False
    state.jdsd = job_descriptors(state.jobs)
    state.ctl = np.zeros(N_CT, dtype=np.int64)
    # its own scratch; jobs larger than that (the loop's grew) are left to the loop
    scratch = fixed.buffer("helper_scratch", state.scratch.shape, np.float32)
    args = (state.jobs, state.jdsd, state.ctl, state.sram_f32, state.sram_u16, scratch)
    done = _HELPER.submit(args)
    if done is None:  # no thread to be had: the loop runs every product itself
        return _loop(state, progress)
    state.mp[MP_ASYNC] = 1
    try:
        _loop(state, progress)
        fixed.ring_settled = True
    finally:
        state.ctl[CT_STOP] = 1
        done.wait()
        state.mp[MP_ASYNC] = 0


class _Helper:
    """The process's helper thread, started on first use and kept: starting and joining a
    thread for every run cost ~0.5 ms, a twentieth of a 4096 x 4096 gemv. It runs
    core_jobs.worker on the arrays it is given until the run sets CT_STOP; the run then waits
    only for the worker's CT_OUT (core_jobs.await_out), not for the thread to get back to
    Python (a GIL hand-over and an event: 45-90 us a run). A second run wanting it while it
    is busy (runs in several Python threads) gets a thread of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # held by the run the thread serves
        self._wake = threading.Condition()
        self._args = None
        self._thread: threading.Thread | None = None

    def submit(self, args: tuple) -> _Release | None:
        """Start worker(*args) on a helper thread; what to wait on (_Release.wait returns once
        the worker has set args' ctl[CT_OUT]), or None if no thread can be started."""
        if not self._lock.acquire(blocking=False):
            return self._own_thread(args)
        try:
            if self._thread is None or not self._thread.is_alive():  # (also after a fork)
                self._thread = threading.Thread(target=self._serve, name="wse-emu-products",
                                                daemon=True)
                self._thread.start()
        except RuntimeError:
            self._lock.release()
            return None
        with self._wake:
            self._args = args
            self._wake.notify()
        return _Release(args[2], self._lock)

    def _serve(self) -> None:
        while True:
            with self._wake:
                while self._args is None:
                    self._wake.wait()
                args, self._args = self._args, None
            try:
                _work(args)
            except BaseException:
                # reported as an uncaught thread exception is, but the thread keeps serving:
                # had it died, a run submitted before it was gone would wait on it for ever
                threading.excepthook(threading.ExceptHookArgs(
                    (*sys.exc_info(), threading.current_thread())))

    @staticmethod
    def _own_thread(args: tuple) -> _Release | None:
        try:
            threading.Thread(target=_work, args=(args,), name="wse-emu-products",
                             daemon=True).start()
        except RuntimeError:
            return None
        return _Release(args[2], None)


def _work(args: tuple) -> None:
    """worker(*args); CT_OUT is set whatever happens, so that the run waiting on it goes on."""
    try:
        worker(*args)
    finally:
        args[2][CT_OUT] = 1


class _Release:
    """What _Helper.submit returns: wait() returns once the worker has stopped touching the
    run's arrays, and frees the process's helper (its lock) for the next run."""

    def __init__(self, ctl: np.ndarray, lock: threading.Lock | None) -> None:
        self._ctl, self._lock = ctl, lock

    def wait(self) -> None:
        await_out(self._ctl)
        if self._lock is not None:
            self._lock.release()


_HELPER = _Helper()


_COUNTER_ORIGIN: tuple[int, float] | None = None  # (cycle counter, perf_counter) at first use


def _ticks_per_second() -> float | None:
    """The cycle counter's ticks a second, measured since the process first asked; None until
    10 ms have passed, or if the counter cannot be read."""
    global _COUNTER_ORIGIN
    now = (int(cycle_counter()), time.perf_counter())
    if _COUNTER_ORIGIN is None:
        _COUNTER_ORIGIN = now
    ticks, seconds = now[0] - _COUNTER_ORIGIN[0], now[1] - _COUNTER_ORIGIN[1]
    return ticks / seconds if ticks > 0 and seconds >= 0.01 else None


_ticks_per_second()  # start measuring (by the first run, usually 10 ms have passed)


def _loop(state: State, progress) -> None:
    budget = FIRST_BUDGET
    last = time.perf_counter()
    while True:
        t = time.perf_counter()
        rate = _ticks_per_second()
        if rate is None:
            steps, deadline = budget, NO_DEADLINE
        else:
            steps, deadline = FULL_BUDGET, int(cycle_counter()) + int(SLICE_SECONDS * rate)
        code = run_slice(*state.parts(), steps, deadline)
        if state.mp[MP_ASYNC]:  # no product outstanding outside the loop
            drain(state.pe, state.jobs, state.jdsd, state.ctl, state.sram_f32, state.sram_u16,
                  state.scratch)
        if code == R_DONE:
            # with no wavelet queued, the next run of this program need not reset the queues
            state.fixed.queues_empty = int(state.counters[K_QUEUED]) == 0
            return
        if code == R_GROW:
            state.grow()
        elif code == R_CLOCK_LIMIT:
            raise RuntimeError(f"the run passed cycle {max_clock(state.loaded.n_pes)}, the "
                               f"latest the core can schedule: rerun with --max-cycles")
        elif code == R_CONTINUE and rate is None:
            # aim the next slice at SLICE_SECONDS, whatever a step costs
            spent = max(time.perf_counter() - t, 1e-6)
            budget = int(min(max(budget * SLICE_SECONDS / spent, MIN_BUDGET), 1 << 28))
        now = time.perf_counter()
        if progress is not None and now - last >= PROGRESS_SECONDS:
            last = now
            heap_n = int(state.counters[K_HEAP_N])
            clock = (int(state.heap[0]) >> int(state.mp[MP_PE_BITS]) if heap_n
                     else int(state.pe[:, P_CLOCK].max()))
            progress(clock, int(state.counters[K_INSTR_TOTAL]))


def _result(state: State, max_cycles: int | None) -> RunResult:
    k = state.counters
    outcome = int(k[K_OUTCOME])
    # DMAs still outstanding at the end finish after the last instruction
    i32, i64, wavelets, cycles = result_columns(state.pe, state.link)
    links = state.loaded.n_links  # then the system's pipes (core_state, L_FREE)
    n = state.pe.shape[0]
    if outcome == RUN_MAX_CYCLES:
        cycles = int(max_cycles)
    n_trace = int(k[K_TRACE_N])
    return RunResult(
        outcome=outcome, cycles=int(cycles), pc=i32[0, :n], status=i32[1, :n], clock=i64[0, :n],
        wait_color=i32[2, :n], instructions=i64[1, :n], busy=i64[2, :n], recv_stall=i64[3, :n],
        bp_stall=i64[4, :n], class_counts=state.class_counts(), link_wavelets=wavelets[:links],
        messages=int(k[K_MESSAGES]), wavelets=int(k[K_WAVELETS]), wavelet_hops=int(k[K_HOPS]),
        fault_pe=int(k[K_FAULT_PE]), fault_reason=int(k[K_FAULT_REASON]),
        trace=[tuple(row) for row in state.trace[:n_trace].tolist()],
        hbm_read_bytes=int(k[K_HBM_READ]), hbm_write_bytes=int(k[K_HBM_WRITE]),
        dma_stall=i64[5, :n], hbm_channel_busy=-(-state.hbm_ch[:, H_BUSY] // HBM_TICKS),
        pipe_wavelets=wavelets[links:].copy(), fault_detail=_fault_detail(state, outcome),
        loop_profile=loop_profile(k, _ticks_per_second()) if COUNT_LOOP else {})


def loop_profile(counters, ticks_per_second: float | None) -> dict:
    """The counting build's figures of a run (bench/README, "Where the Llama-3-70B wse3x4
    step's host time goes"): for each part of the loop (core_state.LOOP_PARTS) how many times
    it ran and its host seconds, and the visits' whole time. Each part's seconds hold about
    one counter read a time; `read_seconds` is a read's cost in a row of reads, an upper bound
    of what it adds in the loop, where reads overlap other work (the 70B step: ~5.4 ns a read
    by the difference of whole runs, 9.5 ns in a row). Compare parts within a run, not its
    host time with another's."""
    rate = ticks_per_second or 0.0
    if not rate:  # the counter cannot be read here (core_sched.HAS_COUNTER), or not yet timed
        return {"counter": "unavailable"}
    out = {name: {"count": int(counters[K_LOOP0 + 2 * i + 1]),
                  "seconds": round(int(counters[K_LOOP0 + 2 * i]) / rate, 6)}
           for i, name in enumerate(LOOP_PARTS)}
    steps = sum(out[name]["count"] for name in LOOP_PARTS[:3])
    out["counter_reads"] = 2 * steps + 3 * out["heap"]["count"]
    out["read_seconds"] = float(counter_read_ticks(10_000)) / rate
    out["visits_seconds"] = round(int(counters[K_LOOP_ALL]) / rate, 6)
    return out


def _fault_detail(state: State, outcome: int) -> str:
    """The address and owner of a DMA into another GPU's HBM (load.hbm_chip_detail)."""
    k = state.counters
    if outcome != RUN_FAULT or int(k[K_FAULT_REASON]) != F_HBM_CHIP:
        return ""
    p = int(k[K_FAULT_PE])
    at = int(state.pe[p, P_CODE0] + state.pe[p, P_PC])
    _kind, _addr, n, _stride, count, _cstride, dtype, _color = descriptor(
        state.dsd, p, int(state.code[at, C_A]))
    nbytes = n * count * DTYPE_BYTES[dtype]
    return hbm_chip_detail(state.loaded, p, int(state.ireg[p, int(state.code[at, C_B])]), nbytes)

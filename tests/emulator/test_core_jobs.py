"""Tile products on the helper thread's ring (emulator/core_jobs.py): the same bits and cycles
as computing them at once, whichever thread runs a product and however full the ring is."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from numba import njit

from wse_emu.emulator import core
from wse_emu.emulator.core_jobs import _run_job, atomic_load, atomic_store, drain, worker
from wse_emu.emulator.core_sched import NO_DEADLINE, R_DONE, R_GROW, run_slice
from wse_emu.emulator.core_state import (CT_DONE, CT_HEAD, CT_HELPED, CT_OUT, CT_SEEN, CT_STOLEN, CT_STOP,
                                 J_CLAIMED, J_DONE, J_FREE, J_P, J_READY, J_SEQ, J_STATE,
                                 J_TOTAL, MP_ASYNC, N_PE_COLS, P_PENDING, State, new_ring, static)
from wse_emu.emulator.load import load, read_output, write_input
from wse_emu.isa.machine import load_machine
from wse_emu.emulator.reference import run as reference_run
from wse_emu.emulator.result import RUN_HALTED
from wse_emu.isa.builder import ProgramBuilder
from programs.conftest import build, same_run


class Run:  # what same_run compares
    def __init__(self, loaded, result):
        self.loaded, self.result = loaded, result


def readers_program():
    """One PE: a product into y, then at once an instruction of each kind that reads y (flw,
    lw, vmov, rsum, mva, mm), each after a fresh product, the values kept in `out`."""
    pb = ProgramBuilder("readers")
    pb.output("out", "f32", [16])
    pb.output("y", "f32", [4])
    rb = pb.region("pe", 0, 0, 1, 1)
    w = rb.alloc("w", 4 * 16)
    x = rb.alloc("x", 4 * 4)
    y = rb.alloc("y", 4 * 4)
    out = rb.alloc("out", 4 * 16)
    rb.piece("out", out, "f32", (16, 1))
    rb.piece("y", y, "f32", (4, 1))
    rb.init(w, "f32", [0.5 * i - 3 for i in range(16)])
    rb.init(x, "f32", [1.0, -2.0, 0.25, 4.0])
    rb.dmem(0, "f32", w, 4)
    rb.d2d(0, 4, 4)               # W: 4 x 4, column-major
    rb.dmem(1, "f32", x, 4)
    rb.dmem(2, "f32", y, 4)
    rb.dmem(3, "f32", out + 16, 4)
    rb.dmem(4, "f32", out + 32, 4)
    rb.dmem(5, "f32", y, 4)       # y as a 4 x 1 matrix for mm
    rb.d2d(5, 1, 4)
    rb.dmem(6, "f32", x, 4)       # x as a 4 x 1 matrix
    rb.d2d(6, 1, 4)
    rb.li("r1", y)
    rb.li("r2", out)
    rb.mv(2, 0, 1)
    rb.flw("f1", "r1", 4)         # y[1] as soon as the product is issued
    rb.fsw("f1", "r2", 0)
    rb.fli("f2", 0.5)
    rb.vmuls(1, 1, "f2")          # x changes: every next product differs
    rb.mv(2, 0, 1)
    rb.lw("r3", "r1", 8)          # the bits of y[2]
    rb.sw("r3", "r2", 4)
    rb.vmuls(1, 1, "f2")
    rb.mv(2, 0, 1)
    rb.vmov(3, 2)                 # y -> out[4:8]
    rb.vmuls(1, 1, "f2")
    rb.mv(2, 0, 1)
    rb.rsum("f3", 2)
    rb.fsw("f3", "r2", 8)
    rb.mv(2, 0, 1)
    rb.mva(2, 0, 1)               # y += W x on the pending y
    rb.vmov(4, 2)                 # -> out[8:12]
    rb.mv(2, 0, 1)
    rb.mm(5, 0, 6)                # y = W x again, as mm, after a pending mv into y
    rb.mva(2, 0, 1)
    rb.halt()
    return pb.build()


def ring_state(program, slots):
    """A State whose products go to a ring of `slots` that no helper serves: each runs only
    when its PE settles it (or the slot is needed, or at the end), the latest it may."""
    ld = load(program, load_machine("tiny"))
    state = State(ld, None, False, False, 0)
    state.jobs, state.jdsd, state.ctl = new_ring(slots)
    state.mp[MP_ASYNC] = 1
    return ld, state


@pytest.mark.parametrize("slots", [1, 3])
def test_a_pe_reads_its_product_only_once_it_is_done(slots):
    program = readers_program()
    ld, state = ring_state(program, slots)
    core._loop(state, None)
    got = Run(ld, core._result(state, None))
    want_ld = load(program, load_machine("tiny"))
    want = Run(want_ld, reference_run(want_ld))
    same_run(got, want)
    assert got.result.outcome == RUN_HALTED
    assert state.ctl[CT_HEAD] == 9 and state.ctl[CT_STOLEN] == 9  # every product on the ring
    assert state.ctl[CT_HELPED] == 0
    # nothing outstanding once the loop has returned
    assert nothing_outstanding(state)
    # what each reader saw, from NumPy: x halves before each of the first four products
    w = (0.5 * np.arange(16, dtype=np.float32) - 3).reshape(4, 4).T  # column-major tile
    x = np.array([1.0, -2.0, 0.25, 4.0], np.float32)
    out = read_output(ld, "out")
    assert out[0] == (w @ x)[1]
    assert out[1:2].view(np.int32) == (w @ (x / 2))[2:3].view(np.int32)
    np.testing.assert_allclose(out[4:8], w @ (x / 4), rtol=1e-6)
    assert out[2] == pytest.approx((w @ (x / 8)).sum(), rel=1e-6)
    np.testing.assert_allclose(out[8:12], 2 * (w @ (x / 8)), rtol=1e-6)
    np.testing.assert_allclose(read_output(ld, "y"), 2 * (w @ (x / 8)), rtol=1e-6)


def nothing_outstanding(state) -> bool:
    """No product is ready or being run: every slot is free or done (drain frees them all
    unless the helper's progress word already says every job is done; a PE still marked
    pending then settles at once, and a slot is reused only once its job is done)."""
    return bool(np.isin(state.jobs[:, J_STATE], (J_FREE, J_DONE)).all())


def gemv_loaded(m=256, k=256, p=4, q=4, seed=1234):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k), dtype=np.float32)
    x = rng.standard_normal(k, dtype=np.float32)
    ld = load(build("gemv", {"W": w}, M=m, K=k, P=p, Q=q), load_machine("wse3"))
    write_input(ld, "x", x)
    return ld, w, x


@pytest.mark.parametrize("slots", [1, 2, 1024])
def test_gemv_with_the_helper_equals_the_serial_run_and_numpy(monkeypatch, slots):
    monkeypatch.setattr(core, "RING_SLOTS", slots)
    ld, w, x = gemv_loaded()
    serial_ld, _, _ = gemv_loaded()
    helped = Run(ld, core.run(ld, helper=True))
    serial = Run(serial_ld, core.run(serial_ld, helper=False))
    same_run(helped, serial)
    assert (helped.result.host_threads, serial.result.host_threads) == (2, 1)
    np.testing.assert_allclose(read_output(ld, "y"), w @ x, rtol=1e-4, atol=1e-4)


def test_a_run_finding_the_process_helper_busy_gets_a_thread_of_its_own(monkeypatch):
    """Runs in several Python threads: while the process's helper serves one run (its lock
    held), another starts a helper of its own, with the same results."""
    own = []
    real = core._Helper._own_thread
    monkeypatch.setattr(core._Helper, "_own_thread",
                        staticmethod(lambda args: own.append(1) or real(args)))
    ld, w, x = gemv_loaded()
    serial_ld, _, _ = gemv_loaded()
    serial = Run(serial_ld, core.run(serial_ld, helper=False))
    assert core._HELPER._lock.acquire(blocking=False)
    try:
        helped = Run(ld, core.run(ld, helper=True))
    finally:
        core._HELPER._lock.release()
    same_run(helped, serial)
    assert own == [1] and helped.result.host_threads == 2
    # the kept thread serves the next run again
    again_ld, _, _ = gemv_loaded()
    same_run(Run(again_ld, core.run(again_ld, helper=True)), serial)
    assert own == [1] and core._HELPER._thread.is_alive()


def test_the_helper_runs_products_and_leaves_none_outstanding():
    ld, w, x = gemv_loaded(512, 512, 8, 8)
    state = State(ld, None, False, False, 0)
    core._drive(state, None, True)
    ctl = state.ctl
    assert ctl[CT_HEAD] == 64 and ctl[CT_HELPED] + ctl[CT_STOLEN] == 64
    assert state.mp[MP_ASYNC] == 0 and nothing_outstanding(state)
    np.testing.assert_allclose(read_output(ld, "y"), w @ x, rtol=1e-4, atol=1e-4)


def test_products_the_helper_leaves_to_the_loop_are_run_by_the_loop():
    """With a scratch too small for any product, the helper leaves every job to the loop
    (its progress word then stops at the first one it left, test below): the loop runs all
    64 itself, and the run equals the serial one."""
    ld, w, x = gemv_loaded(512, 512, 8, 8)
    state = State(ld, None, False, False, 0)
    state.fixed.buffers["helper_scratch"] = np.zeros((4, 1), np.float32)  # 1 element
    core._drive(state, None, True)
    ctl = state.ctl
    assert ctl[CT_HEAD] == 64 and ctl[CT_STOLEN] == 64 and ctl[CT_HELPED] == 0
    assert 0 <= ctl[CT_SEEN] <= ctl[CT_DONE] <= 64
    serial_ld, _, _ = gemv_loaded(512, 512, 8, 8)
    same_run(Run(ld, core._result(state, None)), Run(serial_ld, core.run(serial_ld, helper=False)))
    np.testing.assert_allclose(read_output(ld, "y"), w @ x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("states,want", [
    ([J_DONE, J_CLAIMED, J_DONE, J_DONE], 4),  # all the loop's: the word passes them all
    ([J_DONE, J_CLAIMED, J_READY, J_DONE], 2),  # job 2 left to the loop: the word stops there
    ([J_READY, J_DONE, J_DONE, J_DONE], 0),
])
def test_the_progress_word_stops_at_the_first_job_the_helper_leaves(states, want):
    """worker, run here to its end on a prepared ring (4 jobs published, stop set): jobs the
    loop took (claimed or done) move the word on; a job too large for the helper's scratch
    (READY, 10 elements against 1) is left to the loop and holds the word back, also past
    later jobs the loop took."""
    jobs, jdsd, ctl = new_ring(8)
    for seq, st in enumerate(states):
        jobs[seq, J_SEQ] = seq
        jobs[seq, J_STATE] = st
        jobs[seq, J_TOTAL] = 10
    ctl[CT_HEAD] = len(states)
    ctl[CT_STOP] = 1
    sram = np.zeros(64, np.uint16)
    worker(jobs, jdsd, ctl, sram.view(np.float32), sram, np.zeros((4, 1), np.float32))
    assert ctl[CT_DONE] == want
    assert ctl[CT_HELPED] == 0
    assert list(jobs[:4, J_STATE]) == states  # nothing run, the left jobs put back as READY


@pytest.mark.parametrize("progress", [2, 4])
def test_drain_frees_the_ring_unless_the_progress_word_covers_every_job(progress):
    """drain after the loop has returned: with the helper's progress word at the ring's head
    every job is done and the ring is left as it is (PEs still marked settle at once); short
    of it, each job is finished, its slot freed and its PE's mark cleared."""
    jobs, jdsd, ctl = new_ring(8)
    pe = np.zeros((4, N_PE_COLS), np.int64)
    for seq in range(4):
        jobs[seq, J_SEQ] = seq
        jobs[seq, J_P] = seq
        jobs[seq, J_STATE] = J_DONE
        pe[seq, P_PENDING] = seq + 1
    ctl[CT_HEAD] = 4
    ctl[CT_DONE] = progress
    sram = np.zeros(64, np.uint16)
    drain(pe, jobs, jdsd, ctl, sram.view(np.float32), sram, np.zeros((4, 1), np.float32))
    if progress == 4:
        assert (jobs[:4, J_STATE] == J_DONE).all() and (pe[:, P_PENDING] == [1, 2, 3, 4]).all()
    else:
        assert (jobs[:, J_STATE] == J_FREE).all() and (pe[:, P_PENDING] == 0).all()


def test_the_progress_word_after_a_run_with_the_helper():
    """After a run, the helper's progress word is at most the number of jobs published and the
    loop's copy at most the word (a value the helper wrote). It need not reach the end: a
    helper that reads the head and then the stop word, set in between, returns before the
    last jobs, which the loop has finished. (A prepared ring pins the exact values above.)"""
    ld, w, x = gemv_loaded(512, 512, 8, 8)
    state = State(ld, None, False, False, 0)
    core._drive(state, None, True)
    ctl = state.ctl
    assert ctl[CT_HEAD] == 64 and 0 <= ctl[CT_SEEN] <= ctl[CT_DONE] <= 64
    assert ctl[CT_HELPED] + ctl[CT_STOLEN] == 64
    np.testing.assert_allclose(read_output(ld, "y"), w @ x, rtol=1e-4, atol=1e-4)


@njit(nogil=True)
def _slow_helper(jobs, jdsd, ctl, sram_f32, sram_u16, scratch, jobs_total, give_up):
    """A helper that has claimed the first product and runs it only once every other product
    of the run is done (or give_up[0] is set): 0 if it did so, 1 if it gave up."""
    cols = jobs.shape[1]
    while atomic_load(give_up, 0) == 0:
        if atomic_load(ctl, CT_HEAD) < jobs_total:
            continue
        rest = 0
        for slot in range(1, jobs_total):
            if atomic_load(jobs, slot * cols + J_STATE) != J_DONE:
                rest += 1
        if rest == 0:
            break
    _run_job(0, jobs, jdsd, sram_f32, sram_u16, scratch)
    atomic_store(jobs, J_STATE, J_DONE)
    return atomic_load(give_up, 0)


def test_the_loop_runs_later_products_while_the_helper_runs_one():
    """While a PE waits for a product the helper is running, the loop runs the products
    published after it. Here the helper holds the first product until the 15 others of a
    4 x 4 gemv are done: the loop must run them all meanwhile (a loop that only waited would
    wait until the helper gave up)."""
    ld, w, x = gemv_loaded()
    state = State(ld, None, False, False, 0)
    state.jobs, state.jdsd, state.ctl = new_ring(32)
    state.mp[MP_ASYNC] = 1
    while state.ctl[CT_HEAD] == 0:  # a step at a time, up to the first product
        code = run_slice(*state.args(), 1, NO_DEADLINE)
        assert code != R_DONE
        if code == R_GROW:
            state.grow()
    assert state.jobs[0, J_STATE] == J_READY
    state.jobs[0, J_STATE] = J_CLAIMED  # the helper has it
    give_up = np.zeros(1, np.int64)
    timer = threading.Timer(60.0, lambda: give_up.__setitem__(0, 1))
    outcome = []
    helper = threading.Thread(target=lambda: outcome.append(_slow_helper(
        state.jobs, state.jdsd, state.ctl, state.sram_f32, state.sram_u16,
        np.zeros_like(state.scratch), 16, give_up)))
    timer.start()
    helper.start()
    try:
        core._loop(state, None)
    finally:
        give_up[0] = 1
        helper.join()
        timer.cancel()
    assert outcome == [0], "the loop waited for the held product instead of running others"
    assert state.ctl[CT_HEAD] == 16 and state.ctl[CT_STOLEN] == 15
    serial_ld, _, _ = gemv_loaded()
    same_run(Run(ld, core._result(state, None)), Run(serial_ld, core.run(serial_ld, helper=False)))
    np.testing.assert_allclose(read_output(ld, "y"), w @ x, rtol=1e-4, atol=1e-4)


def test_the_helper_is_chosen_only_where_it_can_pay(monkeypatch):
    ld, _, _ = gemv_loaded()  # 256 KB of tiles
    state = State(ld, None, False, False, 0)
    monkeypatch.setattr(core.os, "sched_getaffinity", lambda pid: {0, 1})
    assert not core._helper_pays(state)
    monkeypatch.setattr(core, "HELPER_MIN_SRAM", ld.sram_len.sum())
    assert core._helper_pays(state)
    monkeypatch.setattr(core.os, "sched_getaffinity", lambda pid: {0})
    assert not core._helper_pays(state)
    monkeypatch.setattr(core.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(core, "HELPER_MIN_SRAM", 0)
    no_matrix = ProgramBuilder("plain")
    rb = no_matrix.region("pe", 0, 0, 1, 1)
    rb.li("r1", 1)
    rb.halt()
    plain = load(no_matrix.build(), load_machine("tiny"))
    assert not core._helper_pays(State(plain, None, False, False, 0))


def test_a_run_after_one_an_exception_cut_short_starts_from_a_free_ring(monkeypatch):
    """A run that ends normally leaves its ring's slots free or done, which the next run
    reuses as they are; after an exception (a progress callback raising, say) jobs may be
    left ready, so the next run frees every slot before the helper starts."""
    ld, w, x = gemv_loaded()
    core.run(ld, helper=True)
    fixed = static(ld)
    assert fixed.ring_settled
    seen = []
    real_submit = core._HELPER.submit
    monkeypatch.setattr(core._HELPER, "submit",
                        lambda args: seen.append(args[0][:, J_STATE].copy()) or real_submit(args))

    def interrupted(state, progress):
        state.jobs[5, J_STATE] = J_READY  # a job published and not yet run
        raise KeyboardInterrupt
    monkeypatch.setattr(core, "_loop", interrupted)
    with pytest.raises(KeyboardInterrupt):
        core.run(ld, helper=True)
    assert not fixed.ring_settled
    monkeypatch.undo()
    monkeypatch.setattr(core._HELPER, "submit",
                        lambda args: seen.append(args[0][:, J_STATE].copy()) or real_submit(args))
    serial_ld, _, _ = gemv_loaded()
    same_run(Run(ld, core.run(ld, helper=True)), Run(serial_ld, core.run(serial_ld, helper=False)))
    assert (seen[-1] == J_FREE).all() and fixed.ring_settled


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_run_whose_helper_fails_finishes_on_the_loop_and_the_next_gets_a_new_thread(
        monkeypatch):
    """The run waits for the worker's CT_OUT, not for its thread: a worker that raises still
    sets it (core._work), the loop runs every product itself, and the next run starts a new
    helper thread."""
    def broken(*args):
        raise RuntimeError("helper failed")
    monkeypatch.setattr(core, "worker", broken)
    ld, w, x = gemv_loaded()
    serial_ld, _, _ = gemv_loaded()
    state = State(ld, None, False, False, 0)
    core._drive(state, None, True)
    assert state.ctl[CT_OUT] == 1 and state.ctl[CT_HELPED] == 0 and state.ctl[CT_STOLEN] == 16
    np.testing.assert_allclose(read_output(ld, "y"), w @ x, rtol=1e-4, atol=1e-4)
    monkeypatch.undo()
    for _ in range(100):  # the failed thread ends once it has the GIL again
        if not core._HELPER._thread.is_alive():
            break
        threading.Event().wait(0.01)
    again = Run(ld, core.run(ld, helper=True))
    same_run(again, Run(serial_ld, core.run(serial_ld, helper=False)))
    assert core._HELPER._thread.is_alive()

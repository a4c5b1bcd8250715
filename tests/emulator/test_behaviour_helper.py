"""Tile products on the core's helper thread: the same bits and cycles as without it (and as
the reference and NumPy), whichever thread runs a product, however many products a run has,
whether the run is cut short, and whether a second thread can be had at all. Everything goes
through core.run and what it returns (RunResult.host_threads says whether the helper ran)."""

from __future__ import annotations

import signal
import threading

import numpy as np
import pytest

from wse_emu.emulator import core
from wse_emu.emulator.load import load, read_output, write_input
from wse_emu.emulator.reference import run as reference_run
from wse_emu.emulator.result import RUN_HALTED
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.machine import load_machine
from programs.conftest import same_run
from tests.emulator.core_programs import (Run, gemv_program, many_products,
                                          many_products_expected, repeated_columns,
                                          repeated_columns_w, repeated_columns_x)


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


def _core(program, machine="tiny", helper=False, inputs=None, **kw):
    ld = load(program, load_machine(machine))
    for name, value in (inputs or {}).items():
        write_input(ld, name, value)
    return Run(ld, core.run(ld, helper=helper, **kw))


def _reference(program, machine="tiny", inputs=None):
    ld = load(program, load_machine(machine))
    for name, value in (inputs or {}).items():
        write_input(ld, name, value)
    return Run(ld, reference_run(ld))


def test_a_pe_reads_its_product_only_once_it_is_done():
    """Each reader comes right after the product it reads, so with the helper it finds the
    product running on the other thread or not yet taken, as the threads happen to go: every
    run must still read what NumPy and the reference compute."""
    program = readers_program()
    want = _reference(program)
    assert want.result.outcome == RUN_HALTED
    w = (0.5 * np.arange(16, dtype=np.float32) - 3).reshape(4, 4).T  # column-major tile
    x = np.array([1.0, -2.0, 0.25, 4.0], np.float32)
    for helper in (False, True, True, True, True):
        got = _core(program, helper=helper)
        same_run(got, want)
        assert got.result.host_threads == (2 if helper else 1)
        out = read_output(got.loaded, "out")
        assert out[0] == (w @ x)[1]
        assert out[1:2].view(np.int32) == (w @ (x / 2))[2:3].view(np.int32)
        np.testing.assert_allclose(out[4:8], w @ (x / 4), rtol=1e-6)
        assert out[2] == pytest.approx((w @ (x / 8)).sum(), rel=1e-6)
        np.testing.assert_allclose(out[8:12], 2 * (w @ (x / 8)), rtol=1e-6)
        np.testing.assert_allclose(read_output(got.loaded, "y"), 2 * (w @ (x / 8)), rtol=1e-6)


def test_gemv_with_the_helper_equals_the_serial_run_and_numpy():
    program, w, x = gemv_program(256, 256, 4, 4)
    helped = _core(program, "wse3", True, {"x": x})
    serial = _core(program, "wse3", False, {"x": x})
    same_run(helped, serial)
    assert (helped.result.host_threads, serial.result.host_threads) == (2, 1)
    np.testing.assert_allclose(read_output(helped.loaded, "y"), w @ x, rtol=1e-4, atol=1e-4)


def test_more_products_than_the_helper_can_hold_equal_numpy_and_the_reference():
    """4 PEs with 1100 small products each, read at once, and every 100th a product of 40000
    elements: more products in flight over the run than any fixed ring of slots, and some
    larger than the scratch the helper starts with. Exact integer sums: NumPy gives the bits."""
    program = many_products()
    y, acc = many_products_expected()
    helped = _core(program, helper=True)
    serial = _core(program, helper=False)
    same_run(helped, serial)
    same_run(helped, _reference(program))
    assert helped.result.host_threads == 2
    np.testing.assert_array_equal(read_output(helped.loaded, "y"), y)
    np.testing.assert_array_equal(read_output(helped.loaded, "acc"), acc)


@pytest.mark.parametrize("helper", [False, True])
def test_products_longer_than_the_scratch_equal_numpy_and_the_reference(helper):
    """120 000-element products and sums from 1000 words of SRAM (a stride-0 outer
    dimension): the scratch grows during the run, the helper's does not."""
    program = repeated_columns(1000, 120, 3)
    got = _core(program, helper=helper)
    same_run(got, _reference(program))
    w, x = repeated_columns_w(1000), repeated_columns_x(120)
    np.testing.assert_array_equal(read_output(got.loaded, "y"), w * (x.sum() / 4))
    np.testing.assert_array_equal(read_output(got.loaded, "s"), [120 * w.sum()] * 3)


@pytest.fixture
def progress_every_slice(monkeypatch):
    """The run returns to Python after a few dozen steps and reports progress each time."""
    monkeypatch.setattr(core, "PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr(core, "SLICE_SECONDS", 0.0)
    monkeypatch.setattr(core, "FIRST_BUDGET", 16)
    monkeypatch.setattr(core, "MIN_BUDGET", 16)


def test_a_run_started_while_another_has_the_helper_gets_the_same_results(progress_every_slice,
                                                                           monkeypatch):
    """A run started from inside another run's progress report (as from another Python
    thread): the first run holds the process's helper, the second gets a thread of its own,
    or, when no thread can be started, runs its products itself. Both equal the serial run."""
    program, w, x = gemv_program(128, 128, 4, 4)
    serial = _core(program, "wse3", False, {"x": x})
    inner = []

    def start_another(cycles, instructions):
        if len(inner) == 0:
            inner.append(_core(program, "wse3", True, {"x": x}))
        elif len(inner) == 1:
            def refuse(self):
                raise RuntimeError("can't start new thread")
            with monkeypatch.context() as m:
                m.setattr(threading.Thread, "start", refuse)
                inner.append(_core(program, "wse3", True, {"x": x}))

    outer = _core(program, "wse3", True, {"x": x}, progress=start_another)
    assert len(inner) == 2
    for run in [outer, *inner]:
        same_run(run, serial)
        np.testing.assert_allclose(read_output(run.loaded, "y"), w @ x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stop_at", [1, 3, 8])
def test_a_run_interrupted_with_products_outstanding_leaves_the_next_exact(
        progress_every_slice, stop_at):
    """A KeyboardInterrupt from the progress report cuts a helped run short with products
    published; running the same Loaded again gives the serial run's bits and cycles."""
    program, w, x = gemv_program(256, 256, 8, 8)
    serial = _core(program, "wse3", False, {"x": x})
    ld = load(program, load_machine("wse3"))
    write_input(ld, "x", x)
    calls = []

    def interrupt(cycles, instructions):
        calls.append(cycles)
        if len(calls) == stop_at:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        core.run(ld, helper=True, progress=interrupt)
    again = Run(ld, core.run(ld, helper=True))
    same_run(again, serial)
    assert again.result.host_threads == 2
    np.testing.assert_allclose(read_output(ld, "y"), w @ x, rtol=1e-4, atol=1e-4)


@pytest.fixture
def alarm_interrupts():
    """SIGALRM raises KeyboardInterrupt, as Ctrl-C does: wherever the main thread is when the
    run's Numba code returns to Python (between slices, before or after the loop settles the
    products in flight)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, interrupt)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, before)


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
def test_a_run_interrupted_anywhere_leaves_the_next_exact(alarm_interrupts, monkeypatch):
    """Interrupts at several host times into a helped run (which points of the run they hit
    depends on the host): every run of the same Loaded after one equals the serial run."""
    monkeypatch.setattr(core, "SLICE_SECONDS", 0.0005)  # many returns to Python a run
    program = many_products()
    serial = _core(program, helper=False)
    start = load(program, load_machine("tiny")).sram
    ld = load(program, load_machine("tiny"))
    for delay in (0.002, 0.005, 0.01, 0.02, 0.04):
        signal.setitimer(signal.ITIMER_REAL, delay)
        try:
            core.run(ld, helper=True)
        except KeyboardInterrupt:
            pass
        signal.setitimer(signal.ITIMER_REAL, 0)
        ld.sram[:] = start  # an interrupted run has added to y and acc
        same_run(Run(ld, core.run(ld, helper=True)), serial)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_run_whose_helper_fails_finishes_on_its_own_and_the_next_run_is_helped(monkeypatch):
    """Fault injection at the one place a helper thread runs code (core.worker): the run
    still ends, with every product computed, and the next run gets a working helper."""
    def broken(*args):
        raise RuntimeError("helper failed")

    program, w, x = gemv_program(256, 256, 4, 4)
    serial = _core(program, "wse3", False, {"x": x})
    monkeypatch.setattr(core, "worker", broken)
    failed = _core(program, "wse3", True, {"x": x})
    same_run(failed, serial)
    monkeypatch.undo()
    again = _core(program, "wse3", True, {"x": x})
    same_run(again, serial)
    assert again.result.host_threads == 2


def big_sram_program(pes: int, matrix: bool = True):
    """`pes` PEs of wse3, each with 44 000 bytes of SRAM declared and one 4 x 4 product (or
    a vector op instead)."""
    pb = ProgramBuilder("big-sram")
    rb = pb.region("pes", 0, 0, pes, 1)
    pad = rb.alloc("pad", 44_000 - 4 * 24)
    w = rb.alloc("w", 4 * 16)
    x = rb.alloc("x", 4 * 4)
    y = rb.alloc("y", 4 * 4)
    rb.init(w, "f32", [0.25 * i for i in range(16)])
    rb.init(x, "f32", [1.0, 2.0, 3.0, 4.0])
    rb.dmem(0, "f32", w, 4)
    rb.d2d(0, 4, 4)
    rb.dmem(1, "f32", x, 4)
    rb.dmem(2, "f32", y, 4)
    rb.dmem(3, "f32", pad, 4)
    if matrix:
        rb.mv(2, 0, 1)
    else:
        rb.vadd(2, 1, 1)
    rb.vmov(3, 2)
    rb.halt()
    return pb.build()


def test_the_helper_is_chosen_only_where_it_can_pay(monkeypatch):
    """Left to choose (helper=None), a run uses the helper for a functional run with matrix
    ops on core.HELPER_MIN_SRAM bytes of SRAM or more, on a host with two CPUs or more; never
    for a traced or timing-only run. The choice changes no result."""
    wse3 = load_machine("wse3")
    pes = -(-core.HELPER_MIN_SRAM // 44_000) + 1
    big, small = big_sram_program(pes), big_sram_program(4)
    monkeypatch.setattr(core.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)

    def threads(program, **kw):
        ld = load(program, wse3, with_data=not kw.pop("timing_only", False))
        return core.run(ld, **kw).host_threads

    assert threads(big) == 2
    assert threads(small) == 1
    assert threads(big_sram_program(pes, matrix=False)) == 1
    assert threads(big, trace=True) == 1
    assert threads(big, timing_only=True) == 1
    chosen = _core(big, "wse3", None)
    same_run(chosen, _core(big, "wse3", False))
    monkeypatch.setattr(core.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert threads(big) == 1

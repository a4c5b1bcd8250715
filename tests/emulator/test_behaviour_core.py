"""The Numba core's machinery seen from outside: every tensor op class and dtype mix at the
machine's widths, runs that outgrow the core's first-run pools, a run after one cut short, a
Loaded run again, progress reports, traces and memory. Each run is compared with the reference
interpreter (and NumPy where it gives the bits) through core.run, reference.run and RunResult."""

from __future__ import annotations

import gc
import itertools
import weakref

import numpy as np
import pytest

from wse_emu.emulator import core
from wse_emu.emulator.api import execute
from wse_emu.emulator.load import load, read_output, write_input
from wse_emu.emulator.reference import run as reference_run
from wse_emu.emulator.result import F_SCALAR_MEM, RUN_FAULT, RUN_HALTED, RUN_MAX_CYCLES
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.machine import load_machine
from wse_emu.isa.spec import COST_CLASSES, DTYPES
from programs.conftest import build, same_run
from tests.emulator.core_programs import Run, big_messages, bursts, repeated_columns


def both(program, machine="tiny"):
    """(core, reference) runs of `program` on fresh Loadeds."""
    got = load(program, load_machine(machine))
    want = load(program, load_machine(machine))
    return Run(got, core.run(got)), Run(want, reference_run(want))


# ---------------------------------------------------------------------------------------------
# widths: every tensor op class over every dtype mix of its descriptors

N = 96  # elements: a multiple of every SIMD width, and a different cycle count for each
OPS = {  # mnemonic: descriptors it names (the rest of its operands are f registers)
    "vmov": 2, "vfill": 1, "vadd": 3, "vmul": 3, "vmax": 3, "vadds": 2, "vmuls": 2,
    "vfma": 2, "rsum": 1, "rmax": 1, "rdot": 2, "mv": 3, "vexp": 2,
}
CASES = [(op, dts) for op, nd in OPS.items()
         for dts in itertools.product(DTYPES, repeat=nd)]


def widths_program(cases):
    """One PE per (op, dtypes) case on wse2, each running its op once."""
    pb = ProgramBuilder("widths")
    for i, (op, dts) in enumerate(cases):
        rb = pb.region(f"c{i}", i % 16, i // 16, 1, 1)
        rb.fli("f1", 0.75)
        for d, dt in enumerate(dts):
            n = {"mv": (8, 96, 12)[d]}.get(op, N)  # y (8), W (8 x 12), x (12)
            buf = rb.alloc(f"b{d}", 4 * n)
            rb.init(buf, dt, [0.125 * ((j * 7 + d) % 9 - 4) for j in range(n)])
            rb.dmem(d, dt, buf, 8 if op == "mv" and d == 1 else n)
            if op == "mv" and d == 1:
                rb.d2d(1, 12, 8)
        args = {"vfill": (0, "f1"), "vadds": (0, 1, "f1"), "vmuls": (0, 1, "f1"),
                "vfma": (0, 1, "f1"), "rsum": ("f2", 0), "rmax": ("f2", 0),
                "rdot": ("f2", 0, 1)}.get(op, tuple(range(len(dts))))
        rb.emit(op, *args)
        rb.halt()
    return pb.build()


@pytest.mark.parametrize("part", range(3))
def test_every_tensor_class_and_dtype_mix_takes_the_cycles_of_its_simd_width(part):
    """The core picks each op's SIMD width from its class and its descriptors' dtypes as the
    reference does from isa.spec.simd_key (wse2: a different width for every key but one)."""
    cases = CASES[part::3]
    got, want = both(widths_program(cases), "wse2")
    same_run(got, want)
    assert got.result.outcome == RUN_HALTED
    names = list(COST_CLASSES)
    for c in ("move", "add", "mul", "max", "fmac", "special"):
        assert got.result.class_counts[names.index(c)] > 0, c


# ---------------------------------------------------------------------------------------------
# pools, scratch and the undo log grow during a run, and change nothing


@pytest.mark.parametrize("program", [
    pytest.param(bursts, id="390-messages-768-deliveries-in-flight"),
    pytest.param(lambda: big_messages(6, 2), id="60000-payload-wavelets-held"),
    pytest.param(lambda: big_messages(2, 4), id="80000-payload-wavelets-through-a-pool-reused"),
])
def test_runs_with_many_messages_in_flight_equal_the_reference(program):
    got, want = both(program())
    same_run(got, want)
    assert got.result.outcome == RUN_HALTED


def test_the_messages_of_a_burst_arrive_intact():
    """bursts: every PE adds up k messages from itself and k from (0,0), each the source
    vector plus 0.25 i after the i-th send."""
    k, n = 6, 2
    got, _ = both(bursts(k, n))
    sent = np.array([0.5 + j for j in range(n)], np.float32)
    want = np.zeros(n, np.float32)
    for i in range(1, k + 1):
        want = want + (sent + 0.25 * i)
        want = want + (sent + 0.25 * i)
    at = bursts(k, n).regions[0].allocs[1].addr  # acc
    for p in range(64):
        np.testing.assert_array_equal(
            got.loaded.sram_view()[p, at:at + 4 * n].view(np.float32), want)


def test_an_op_longer_than_the_scratch_rows_equals_the_reference():
    """120 000-element operands (a stride-0 outer dimension) from 1000 words of SRAM."""
    got, want = both(repeated_columns(1000, 120, 2))
    same_run(got, want)


def faulting_after_writes():
    """One PE writes 40 KB of SRAM three times over, then reads past its SRAM: the core
    replays the run from the SRAM it started with, so its log of old contents must hold them
    all."""
    pb = ProgramBuilder("writes")
    rb = pb.region("pe", 0, 0, 1, 1)
    buf = rb.alloc("buf", 4 * 10000)
    rb.dmem(0, "f32", buf, 10000)
    rb.fli("f1", 0.5)
    for _ in range(3):
        rb.vfill(0, "f1")
        rb.fadd("f1", "f1", "f1")
    rb.li("r1", 1 << 20)
    rb.lw("r2", "r1", 0)
    rb.halt()
    return pb.build()


def test_a_run_that_faults_after_writing_much_sram_ends_as_the_reference():
    got, want = both(faulting_after_writes())
    same_run(got, want)
    assert (got.result.outcome, got.result.fault_reason) == (RUN_FAULT, F_SCALAR_MEM)


# ---------------------------------------------------------------------------------------------
# a Loaded run again: after a full run, after one cut short, from the SRAM the last one left


def exchange(messages=12, n=16):
    """Three PEs in a row: the first two send `messages` vectors east and the next PE adds
    up what it receives (the middle one only after its own sends: backpressure)."""
    pb = ProgramBuilder("exchange")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="E")
    pb.route(1, 0, 1, 1, 0, rx="W", tx="RAMP")
    pb.route(1, 0, 1, 1, 1, rx="RAMP", tx="E")
    pb.route(2, 0, 1, 1, 1, rx="W", tx="RAMP")
    rb = pb.region("row", 0, 0, 3, 1)
    buf = rb.alloc("buf", 4 * n)
    acc = rb.alloc("acc", 4 * n)
    rb.init(buf, "f32", [0.25 * i for i in range(n)])
    rb.dmem(0, "f32", buf, n)
    rb.dmem(3, "f32", acc, n)
    rb.fli("f1", 1.5)
    rb.li("r1", messages)
    rb.li("r3", 2)
    rb.beq("X", "r3", "recv")
    rb.dfout(1, "f32", 0, n)
    rb.beq("X", "r0", "send")
    rb.dfout(1, "f32", 1, n)
    rb.label("send")
    rb.vadds(0, 0, "f1")
    rb.vmov(1, 0)
    rb.addi("r2", "r2", 1)
    rb.blt("r2", "r1", "send")
    rb.beq("X", "r0", "done")
    rb.label("recv")
    rb.dfin(2, "f32", 1, n)
    rb.bne("X", "r3", "mid")
    rb.jmp("rloop")
    rb.label("mid")
    rb.dfin(2, "f32", 0, n)
    rb.label("rloop")
    rb.li("r2", 0)
    rb.label("rnext")
    rb.vadd(3, 2, 3)
    rb.addi("r2", "r2", 1)
    rb.blt("r2", "r1", "rnext")
    rb.label("done")
    rb.halt()
    return pb.build()


def _routed_programs(rng):
    """(name, machine, program, inputs) whose wavelets take every kind of route: multicast
    down columns and streams along rows (gemv), chains and trees (allreduce), a row (softmax),
    backpressure (exchange)."""
    w = rng.standard_normal((64, 64), dtype=np.float32)
    return [
        ("gemv", "tiny", build("gemv", {"W": w}, M=64, K=64, P=4, Q=4),
         {"x": rng.standard_normal(64, dtype=np.float32)}),
        ("allreduce", "test64", build("allreduce", N=16, NX=4, NY=4, MODE=1),
         {"v": rng.standard_normal((16, 16), dtype=np.float32)}),
        ("softmax", "tiny", build("softmax", N=120, Q=3),
         {"x": rng.standard_normal(120, dtype=np.float32)}),
        ("exchange", "test64", exchange(), {}),
    ]


@pytest.mark.parametrize("case", range(4))
def test_a_run_after_one_cut_short_at_any_cycle_equals_a_fresh_run(case):
    """The same Loaded is run to a limit of c cycles (leaving wavelets queued, PEs blocked,
    registers set) and then to its end, for every c of the run (the cuts that leave wavelets
    queued are a few cycles of gemv's and softmax's): each full run equals a run of a fresh
    Loaded holding the same SRAM, and the cut run equals the reference's cut."""
    name, machine, program, inputs = _routed_programs(np.random.default_rng(5))[case]
    m = load_machine(machine)

    def fresh(sram=None):
        ld = load(program, m)
        for key, value in inputs.items():
            write_input(ld, key, value)
        if sram is not None:
            ld.sram[:] = sram
        return ld

    ld = fresh()
    full = core.run(fresh()).cycles
    for i, cycles in enumerate(range(1, full)):
        start = ld.sram.copy()
        cut = core.run(ld, max_cycles=int(cycles))
        # (a limit past the last instruction's start lets the run halt)
        assert cut.outcome == RUN_MAX_CYCLES or (cut.outcome, cut.cycles) == (RUN_HALTED, full)
        if i % 60 == 0:  # some cuts against the reference's: the cut itself is exact
            ref = fresh(start)
            same_run(Run(ld, cut), Run(ref, reference_run(ref, max_cycles=int(cycles))))
        sram = ld.sram.copy()
        same_run(Run(ld, core.run(ld)), Run(want := fresh(sram), core.run(want)))


def registers_program():
    """One PE whose registers depend on an input flag. With the flag set the code writes r5,
    f3 and descriptor d1 before it reads them; without, it only reads them, and sees what a
    run starts with: 0, 0.0 and an empty descriptor. out = (r5, f3, the sum over d1, GX)."""
    pb = ProgramBuilder("registers")
    pb.input("flag", "i32", [1])
    pb.output("out", "f32", [4])
    rb = pb.region("one", 1, 0, 1, 1)
    flag = rb.alloc("flag", 4)
    buf = rb.alloc("buf", 16)
    out = rb.alloc("out", 16)
    rb.piece("flag", flag, "i32", tile=(1, 1))
    rb.piece("out", out, "f32", tile=(4, 1))
    rb.li("r9", flag)
    rb.lw("r1", "r9", 0)
    rb.li("r8", out)
    rb.dmem(2, "f32", out, 4)
    rb.beq("r1", "r0", "read")
    rb.li("r5", 7)
    rb.fli("f3", 2.5)
    rb.dmem(1, "f32", buf, 4)
    rb.vfill(1, "f3")
    rb.label("read")
    rb.itof("f4", "r5")
    rb.vfill(2, "f4")
    rb.fsw("f3", "r8", 4)
    rb.rsum("f6", 1)
    rb.fsw("f6", "r8", 8)
    rb.mov("r10", "GX")
    rb.itof("f7", "r10")
    rb.fsw("f7", "r8", 12)
    rb.halt()
    return pb.build()


def test_a_run_starts_from_the_registers_a_run_starts_with_whatever_ran_before():
    """A run after one that set registers reads 0, 0.0 and an empty descriptor, as the
    reference does from the same SRAM, and the read-only specials keep their values."""
    program = registers_program()
    ld = load(program, load_machine("tiny"))
    write_input(ld, "flag", np.array([1], np.int32))
    core.run(ld)
    np.testing.assert_array_equal(read_output(ld, "out"), [7.0, 2.5, 10.0, 1.0])
    write_input(ld, "flag", np.array([0], np.int32))
    want_ld = load(program, load_machine("tiny"))
    want_ld.sram[:] = ld.sram  # the first run's buf and out are left in SRAM
    got = Run(ld, core.run(ld))
    np.testing.assert_array_equal(read_output(ld, "out"), [0.0, 0.0, 0.0, 1.0])
    same_run(got, Run(want_ld, reference_run(want_ld)))


def highest_descriptor_program(top: int):
    """Two PEs: a vector op and an mv on descriptors d0, d(top - 1) and d(top // 2), then a
    descriptor that names a register only as a fabric operand on the last one."""
    pb = ProgramBuilder(f"dregs-{top}")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="E")
    pb.route(1, 0, 1, 1, 0, rx="W", tx="RAMP")
    rb = pb.region("row", 0, 0, 2, 1)
    w = rb.alloc("w", 4 * 16)
    x = rb.alloc("x", 4 * 4)
    y = rb.alloc("y", 4 * 4)
    rb.init(w, "f32", [0.5 * i - 3 for i in range(16)])
    rb.init(x, "f32", [1.0, -2.0, 0.25, 4.0])
    hi, mid = top - 1, top // 2
    rb.dmem(hi, "f32", w, 4)
    rb.d2d(hi, 4, 4)
    rb.dmem(0, "f32", x, 4)
    rb.dmem(mid, "f32", y, 4)
    rb.mv(mid, hi, 0)
    rb.vadd(0, 0, mid)
    rb.beq("X", "r0", "send")
    rb.dfin(hi, "f32", 0, 4)
    rb.vmov(0, hi)
    rb.halt()
    rb.label("send")
    rb.dfout(hi, "f32", 0, 4)
    rb.vmov(hi, 0)
    rb.halt()
    return pb.build()


@pytest.mark.parametrize("top", [3, 9, 16])
def test_programs_naming_few_or_all_descriptor_registers_run_as_the_reference(top):
    got, want = both(highest_descriptor_program(top))
    same_run(got, want)
    assert got.result.outcome == RUN_HALTED


# ---------------------------------------------------------------------------------------------
# progress, traces, memory


def test_progress_is_reported_and_does_not_change_the_run(monkeypatch):
    program = exchange(messages=30)
    plain = execute(program, "test64")
    calls = []
    monkeypatch.setattr(core, "PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr(core, "SLICE_SECONDS", 0.0)  # a return every few dozen steps
    monkeypatch.setattr(core, "FIRST_BUDGET", 16)
    monkeypatch.setattr(core, "MIN_BUDGET", 16)
    reported = execute(program, "test64", progress=lambda c, i: calls.append((c, i)))
    same_run(plain, reported)
    assert len(calls) > 5
    assert all(b[1] >= a[1] for a, b in zip(calls, calls[1:]))
    assert calls[-1][1] <= int(plain.result.instructions.sum())


def test_trace_lists_every_chunk_in_the_reference_order():
    program = exchange(messages=5)
    a = execute(program, "test64", engine="core", trace=True)
    b = execute(program, "test64", engine="reference", trace=True)
    same_run(a, b)
    assert a.result.trace == b.result.trace
    names = list(COST_CLASSES)
    tensor_ops = int(a.result.class_counts[[names.index(c) for c in ("move", "add")]].sum())
    assert len(a.result.trace) >= tensor_ops
    assert all(isinstance(v, int) for v in a.result.trace[0])


@pytest.mark.parametrize("cap", [1, 9, 29])
def test_a_trace_cap_keeps_the_first_chunks(cap):
    program = exchange(messages=5)
    full = execute(program, "test64", trace=True).result
    ld = load(program, load_machine("test64"))
    capped = core.run(ld, trace=True, trace_cap=cap)
    assert len(full.trace) > cap and capped.trace == full.trace[:cap]
    assert capped.cycles == full.cycles


def test_a_run_keeps_no_loaded_alive():
    """What the core keeps of a Loaded between runs goes with it: dropping the last
    reference frees it."""
    ld = load(exchange(messages=1), load_machine("tiny"))
    core.run(ld)
    gone = weakref.ref(ld)
    del ld
    gc.collect()
    assert gone() is None


def test_the_reference_refuses_a_timing_only_loaded():
    ld = load(exchange(messages=1), load_machine("tiny"), with_data=False)
    with pytest.raises(ValueError, match="functional programs only"):
        reference_run(ld)


# ---------------------------------------------------------------------------------------------
# the scheduler's heap: a pure function of its keys, checked against heapq


@pytest.mark.parametrize("n, bits, steps", [(200, 8, 5000), (40000, 17, 3000)])
def test_the_scheduler_heap_orders_like_heapq(n, bits, steps):
    """Push, replace-top and pop of packed (clock, PE) keys against Python's heapq, on a
    small heap and on one as large as a 200 x 200 mesh's (where sifting takes other paths)."""
    import heapq
    import random

    from wse_emu.emulator.core_fabric import heap_pop_top, heap_push, heap_replace_top, still_first
    r = random.Random(5)
    heap = np.zeros(n, np.int64)
    size, ref = 0, []
    for p in range(n // 2):  # half full to start with
        c = r.randint(0, 1 << 12)
        size = heap_push(heap, size, c << bits | p)
        heapq.heappush(ref, (c, p))
    out = set(range(n // 2, n))
    for _ in range(steps):
        op = r.random()
        if op < 0.4 and out:
            p = out.pop()
            c = r.randint(0, 1 << 12)
            size = heap_push(heap, size, c << bits | p)
            heapq.heappush(ref, (c, p))
        elif size:
            c, p = ref[0]
            assert int(heap[0]) == c << bits | p
            if op < 0.7:
                new = c + r.randint(0, 15)
                if n <= 1000:
                    rest_first = len(ref) == 1 or (new, p) < min(ref[1:])
                    assert still_first(heap, size, new << bits | p) == rest_first
                heap_replace_top(heap, size, new << bits | p)
                heapq.heapreplace(ref, (new, p))
            else:
                size = heap_pop_top(heap, size)
                heapq.heappop(ref)
                out.add(p)
    assert size == len(ref)
    assert sorted(heap[:size].tolist()) == sorted(c << bits | p for c, p in ref)

"""The Numba core's machinery: the SIMD-width rule against isa.spec, growing pools, progress
reports, traces and the per-Loaded table cache. Every run is compared with the reference."""

from __future__ import annotations

import gc
import itertools

import numpy as np
import pytest

from wse_emu.emulator import core
from wse_emu.emulator.api import execute
from wse_emu.emulator.core_exec import simd_variant
from wse_emu.emulator.core_state import (CL_KIND, K_MESSAGES, K_QUEUED, Q_QUEUED, _STATIC, State,
                                 class_kinds,
                                 simd_key_table, static)
from wse_emu.emulator.load import load, read_output, write_input
from wse_emu.isa.machine import load_machine
from wse_emu.emulator.reference import run as reference_run
from wse_emu.emulator.result import RUN_HALTED, RUN_MAX_CYCLES
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.spec import COST_CLASSES, DTYPES, FIXED_CLASSES, SIMD_KEYS, simd_key
from programs.conftest import build, same_run


def test_simd_variant_follows_isa_spec_simd_key_for_every_class_and_dtype_mix():
    keys = simd_key_table()
    kinds = class_kinds()
    for ci, name in enumerate(COST_CLASSES):
        if name in FIXED_CLASSES:
            continue
        for nd in (1, 2, 3):
            for dts in itertools.product(DTYPES.values(), repeat=nd):
                padded = list(dts) + [0] * (3 - nd)
                variant = simd_variant(kinds[ci], padded[0], padded[1], padded[2], nd)
                assert SIMD_KEYS[keys[ci, variant]] == simd_key(name, dts), (name, dts)


class Run:  # what same_run compares
    def __init__(self, loaded, result):
        self.loaded, self.result = loaded, result


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
    big = rb.alloc("big", 4 * 3000)
    rb.init(buf, "f32", [0.25 * i for i in range(n)])
    rb.dmem(0, "f32", buf, n)
    rb.dmem(3, "f32", acc, n)
    rb.dmem(4, "f32", big, 3000)  # more elements than the scratch rows hold at first
    rb.fli("f1", 1.5)
    rb.vfill(4, "f1")
    rb.rsum("f2", 4)
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


def _run_with(state_edit, program, machine="test64"):
    """Run on the core with State arrays edited first (e.g. tiny pools), and on the reference."""
    ld = load(program, load_machine(machine))
    state = State(ld, None, False, False, 0)
    state_edit(state)
    core._drive(state, None)
    got = core._result(state, None)
    ref_ld = load(program, load_machine(machine))
    want = reference_run(ref_ld)

    same_run(Run(ld, got), Run(ref_ld, want))
    return got


def _tiny_pools(state):
    state.dl = np.zeros((1, state.dl.shape[1]), np.int64)
    state.msg = np.zeros((1, state.msg.shape[1]), np.int64)
    state.payload = np.zeros(20, np.uint32)
    state.scratch = np.zeros((4, 8), np.float32)


def test_pools_grow_and_compact_without_changing_anything():
    r = _run_with(_tiny_pools, exchange())
    assert r.outcome == RUN_HALTED and r.messages == 24 and r.bp_stall.sum() > 0


def test_the_payload_pool_is_compacted_in_place_when_holes_suffice():
    seen = []

    def small_pool(state):
        state.payload = np.zeros(64, np.uint32)  # four messages' worth: far fewer than sent
        seen.append(state)

    r = _run_with(small_pool, exchange(messages=40))
    assert r.messages == 80
    assert seen[0].payload.shape[0] < 80 * 16  # reused, not grown to hold every message


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


def test_trace_cap_keeps_the_first_chunks_and_the_buffer_grows_to_it():
    program = exchange(messages=5)
    full = execute(program, "test64", trace=True).result.trace

    def small_trace(state):
        state.trace = np.zeros((2, 4), np.int64)

    ld = load(program, load_machine("test64"))
    state = State(ld, None, True, True, 9)
    small_trace(state)
    core._drive(state, None)
    assert core._result(state, None).trace == full[:9]


def test_the_table_cache_lets_go_of_a_dropped_loaded():
    ld = load(exchange(messages=1), load_machine("tiny"))
    core.run(ld)
    key = id(ld)
    assert key in _STATIC
    del ld
    gc.collect()
    assert key not in _STATIC


def test_the_reference_refuses_a_timing_only_loaded():
    from wse_emu.emulator import reference
    ld = load(exchange(messages=1), load_machine("tiny"), with_data=False)
    with pytest.raises(ValueError, match="functional programs only"):
        reference.run(ld)


def test_class_table_holds_the_machine_widths():
    ld = load(exchange(messages=1), load_machine("wse2"))
    table = State(ld, None, False, False, 0).classes
    fmac = list(COST_CLASSES).index("fmac")
    widths = dict(load_machine("wse2").simd)
    keys = simd_key_table()
    for variant in range(CL_KIND):
        assert table[fmac, variant] == widths[SIMD_KEYS[keys[fmac, variant]]]


def test_the_scheduler_heap_orders_like_heapq():
    """Push, replace-top and pop of packed (clock, PE) keys against Python's heapq."""
    import heapq
    import random

    from wse_emu.emulator.core_fabric import heap_pop_top, heap_push, heap_replace_top, still_first
    r = random.Random(5)
    n, bits = 200, 8
    heap = np.zeros(n, np.int64)
    size, ref, out = 0, [], set(range(n))
    for _ in range(5000):
        op = r.random()
        if op < 0.4 and out:
            p = r.choice(sorted(out))
            out.discard(p)
            c = r.randint(0, 40)
            size = heap_push(heap, size, c << bits | p)
            heapq.heappush(ref, (c, p))
        elif size:
            c, p = ref[0]
            assert int(heap[0]) == c << bits | p
            if op < 0.7:
                new = c + r.randint(0, 15)
                rest_first = len(ref) == 1 or (new, p) < min(ref[1:])
                assert still_first(heap, size, new << bits | p) == rest_first
                heap_replace_top(heap, size, new << bits | p)
                heapq.heapreplace(ref, (new, p))
            else:
                size = heap_pop_top(heap, size)
                heapq.heappop(ref)
                out.add(p)
    assert size == len(ref)


def test_a_heap_above_the_prefetch_size_orders_like_heapq():
    """A heap larger than HEAP_PREFETCH_MIN (where sifting down prefetches the level below)
    pops the same keys as heapq, through replace-top and pop."""
    import heapq

    from wse_emu.emulator.core_fabric import HEAP_PREFETCH_MIN, heap_pop_top, heap_push, heap_replace_top
    rng = np.random.default_rng(7)
    n, bits = HEAP_PREFETCH_MIN + 1000, 17
    clocks = rng.integers(0, 1 << 20, n)
    heap = np.zeros(n, np.int64)
    size, ref = 0, []
    for p in range(n):
        size = heap_push(heap, size, int(clocks[p]) << bits | p)
        heapq.heappush(ref, int(clocks[p]) << bits | p)
    for step in range(3000):
        assert int(heap[0]) == ref[0]
        if step % 3:
            new = ref[0] + (int(rng.integers(1, 1 << 10)) << bits)
            heap_replace_top(heap, size, new)
            heapq.heapreplace(ref, new)
        else:
            size = heap_pop_top(heap, size)
            heapq.heappop(ref)
    assert size == len(ref)
    assert sorted(heap[:size].tolist()) == sorted(ref)


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
def test_the_descriptor_table_holds_the_registers_the_code_names_and_runs_as_the_reference(top):
    program = highest_descriptor_program(top)
    ld = load(program, load_machine("tiny"))
    state = State(ld, None, False, False, 1000)
    assert state.dsd.shape[1] == top  # d(top - 1) is the highest register named
    got = Run(ld, core.run(ld))
    want_ld = load(program, load_machine("tiny"))
    same_run(got, Run(want_ld, reference_run(want_ld)))
    assert got.result.outcome == RUN_HALTED


def _queue_programs(rng):
    """(name, Loaded) of programs whose wavelets take every kind of route: multicast down
    columns and streams along rows (gemv), chains and trees (allreduce), a row (softmax)."""
    w = rng.standard_normal((64, 64), dtype=np.float32)
    gemv = load(build("gemv", {"W": w}, M=64, K=64, P=4, Q=4), load_machine("tiny"))
    write_input(gemv, "x", rng.standard_normal(64, dtype=np.float32))
    tree = load(build("allreduce", N=16, NX=4, NY=4, MODE=1), load_machine("test64"))
    write_input(tree, "v", rng.standard_normal((16, 16), dtype=np.float32))
    soft = load(build("softmax", N=120, Q=3), load_machine("tiny"))
    write_input(soft, "x", rng.standard_normal(120, dtype=np.float32))
    return [("gemv", gemv), ("allreduce", tree), ("softmax", soft)]


def test_a_run_writes_only_the_input_queues_routes_deliver_to():
    """State resets only Static.queue_slots between runs: every other queue row must stay
    zero through a run."""
    for name, ld in _queue_programs(np.random.default_rng(5)):
        state = State(ld, None, False, False, 0)
        core._drive(state, None)
        assert state.counters[K_MESSAGES] > 0, name
        others = np.ones(len(state.queue), bool)
        others[state.fixed.queue_slots] = False
        assert others.any() and not state.queue[others].any(), name
        assert state.queue[state.fixed.queue_slots].any(), name  # the slots were used


def test_a_run_cut_short_with_wavelets_queued_leaves_nothing_for_the_next():
    """A run stopped by --max-cycles leaves wavelets in input queues; the next run of the
    same Loaded starts from empty queues and equals the reference's run of a fresh one."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((64, 64), dtype=np.float32)
    x = rng.standard_normal(64, dtype=np.float32)

    def fresh():
        ld = load(build("gemv", {"W": w}, M=64, K=64, P=4, Q=4), load_machine("tiny"))
        write_input(ld, "x", x)
        return ld
    ld = fresh()
    full = core.run(fresh()).cycles
    for cycles in range(1, full):  # the first cut with wavelets queued
        cut = core.run(ld, max_cycles=cycles)
        assert cut.outcome == RUN_MAX_CYCLES
        if static(ld).buffers["queue"][:, Q_QUEUED].any():  # the buffer the next run reuses
            break
    else:
        pytest.fail("no cut left wavelets queued")
    assert not State(ld, None, False, False, 0).queue.any()
    want_ld = fresh()
    same_run(Run(ld, core.run(ld)), Run(want_ld, reference_run(want_ld)))


def test_send_hints_name_each_pes_first_route_and_its_first_receiver():
    """The scheduler prefetches, for the PE it will most likely run next, the row of its first
    route (by color) and the queue and status of that route's first receiving PE. In a 3 x 3
    gemv, row 0 multicasts x down its column on color 0 (first receiver: the PE below), the
    other rows send their partial sums east on colors 1 and 2, and the last column of rows
    1 and 2 sends nothing."""
    ld = load(build("gemv", {"W": np.ones((6, 6), np.float32)}, M=6, K=6, P=3, Q=3, XROW=0, YCOL=2, FORM=1),
              load_machine("wse3"))
    hint = static(ld).send_hint
    colors = ld.colors
    index = {(int(x), int(y)): p for p, (x, y) in enumerate(zip(ld.pe_x, ld.pe_y))}
    want = {}
    for y in range(3):
        for x in range(3):
            if y == 0:
                want[index[x, y]] = (index[x, y], 0, index[x, 1])
            elif x < 2:
                want[index[x, y]] = (index[x, y], 1 + x % 2, index[x + 1, y])
            else:
                want[index[x, y]] = None
    assert len(want) == 9
    for p, w in want.items():
        if w is None:
            assert tuple(hint[p]) == (-1, -1), p
        else:
            src, color, to = w
            assert tuple(hint[p]) == (src * colors + color, to * colors + color), p


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
    """State resets only the integer registers the code can write and the f registers when
    the code names any: a run after one that set them reads 0, 0.0 and an empty descriptor,
    as the reference does from the same SRAM, and the read-only specials keep their values."""
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


def test_the_queued_wavelet_count_follows_the_queues_and_decides_the_next_reset():
    """The loop keeps the wavelets in all input queues (K_QUEUED); a run that ends with none
    lets the next skip resetting them, one cut short with some queued makes it reset them."""
    w = np.random.default_rng(7).standard_normal((64, 64), dtype=np.float32)
    ld = load(build("gemv", {"W": w}, M=64, K=64, P=4, Q=4), load_machine("tiny"))
    write_input(ld, "x", np.ones(64, np.float32))
    full = core.run(ld).cycles
    seen = set()
    for cycles in list(range(1, full)) + [None]:
        state = State(ld, cycles, False, False, 0)
        assert not state.queue[:, Q_QUEUED].any()  # reset, or left empty by the run before
        core._drive(state, None)
        core._result(state, cycles)
        queued = int(state.queue[:, Q_QUEUED].sum())
        assert state.counters[K_QUEUED] == queued
        assert static(ld).queues_empty == (queued == 0)
        seen.add(queued > 0)
    assert seen == {True, False}

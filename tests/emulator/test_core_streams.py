"""Fabric operands in chunks on the Numba core (docs/timing-model.md section 6): ops with two
fabric inputs fed by messages of different sizes, reductions accumulating across chunks,
chunked forwarding, sending to oneself, and backpressure from several multicast leaves. Values
are checked against NumPy and everything against the reference interpreter."""

from __future__ import annotations

import numpy as np

from wse_emu.emulator.api import execute
from wse_emu.emulator.result import RUN_HALTED
from wse_emu.isa.builder import ProgramBuilder
from programs.conftest import same_run


def both(program, machine="tiny"):
    a = execute(program, machine, engine="core")
    b = execute(program, machine, engine="reference")
    assert a.result.outcome == RUN_HALTED, a.result.outcome_name
    same_run(a, b)
    return a


def read(ex, pe, region, name, n, dtype=np.float32):
    allocs = {a.name: a.addr for a in ex.loaded.program.regions[region].allocs}
    raw = ex.loaded.sram_view()[pe, allocs[name]:allocs[name] + 4 * n]
    return raw.view(dtype)[:n]


def sender(pb, x, y, color, values, pieces, name):
    """A PE that sends `values` as len(pieces) messages of the given sizes."""
    rb = pb.region(name, x, y, 1, 1)
    buf = rb.alloc("buf", 4 * len(values))
    rb.init(buf, "f32", values)
    at = 0
    for size in pieces:
        rb.dmem(0, "f32", buf + 4 * at, size)
        rb.dfout(1, "f32", color, size)
        rb.vmov(1, 0)
        at += size
    rb.halt()


def test_two_fabric_inputs_run_in_chunks_of_what_both_have():
    n = 15
    a = [float(i) for i in range(n)]
    b = [100.0 * (i + 1) for i in range(n)]
    pb = ProgramBuilder("two-in")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="E")
    pb.route(1, 0, 1, 1, 0, rx="W", tx="RAMP")
    pb.route(2, 0, 1, 1, 1, rx="RAMP", tx="W")
    pb.route(1, 0, 1, 1, 1, rx="E", tx="RAMP")
    sender(pb, 0, 0, 0, a, [5, 5, 5], "west")
    sender(pb, 2, 0, 1, b, [2, 13], "east")
    rb = pb.region("mid", 1, 0, 1, 1)
    out = rb.alloc("out", 4 * n)
    rb.dmem(0, "f32", out, n)
    rb.dfin(1, "f32", 0, n)
    rb.dfin(2, "f32", 1, n)
    rb.vadd(0, 1, 2)
    rb.halt()
    ex = both(pb.build())
    np.testing.assert_array_equal(read(ex, 2, 2, "out", n), np.add(a, b, dtype=np.float32))
    chunks = [t for t in execute(pb.build(), "tiny", trace=True).result.trace if t[0] == 2]
    assert len(chunks) >= 3  # limited by the 5-wavelet messages, then by what had arrived


def test_reductions_of_a_stream_accumulate_across_chunks_in_order():
    vals = [1e8, 1.0, -1e8, 0.5, 3.0, -2.0, 7.0, 1e-3, 4.0, 2.5]
    pb = ProgramBuilder("reduce")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="E")
    pb.route(1, 0, 1, 1, 0, rx="W", tx="RAMP")
    sender(pb, 0, 0, 0, vals + vals, [3, 4, 3, 10], "tx")
    rb = pb.region("rx", 1, 0, 1, 1)
    out = rb.alloc("out", 8)
    rb.dfin(1, "f32", 0, len(vals))
    rb.rsum("f1", 1)
    rb.rmax("f2", 1)
    rb.li("r1", out)
    rb.fsw("f1", "r1", 0)
    rb.fsw("f2", "r1", 4)
    rb.halt()
    ex = both(pb.build())
    acc = np.float32(0)
    for v in np.array(vals, np.float32):
        acc = np.float32(acc + v)
    np.testing.assert_array_equal(read(ex, 1, 1, "out", 2), [acc, max(vals)])


def test_a_chunked_op_forwards_one_message_per_chunk():
    n = 12
    pb = ProgramBuilder("forward")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="E")
    pb.route(1, 0, 1, 1, 0, rx="W", tx="RAMP")
    pb.route(1, 0, 1, 1, 1, rx="RAMP", tx="E")
    pb.route(2, 0, 1, 1, 1, rx="W", tx="RAMP")
    sender(pb, 0, 0, 0, [float(i) for i in range(n)], [4, 4, 4], "src")
    mid = pb.region("mid", 1, 0, 1, 1)
    mid.dfin(1, "f32", 0, n)
    mid.dfout(2, "f32", 1, n)
    mid.fli("f1", 0.5)
    mid.vmuls(2, 1, "f1")
    mid.halt()
    dst = pb.region("dst", 2, 0, 1, 1)
    out = dst.alloc("out", 4 * n)
    dst.dmem(0, "f32", out, n)
    dst.dfin(1, "f32", 1, n)
    dst.vmov(0, 1)
    dst.halt()
    ex = both(pb.build())
    assert ex.result.messages == 3 + 3
    np.testing.assert_array_equal(read(ex, 2, 2, "out", n), 0.5 * np.arange(n, dtype=np.float32))


def test_a_pe_can_send_to_itself():
    pb = ProgramBuilder("self")
    pb.route(0, 0, 1, 1, 3, rx="RAMP", tx="RAMP")
    rb = pb.region("me", 0, 0, 1, 1)
    src = rb.alloc("src", 16)
    out = rb.alloc("out", 16)
    rb.init(src, "bf16", [1.5, -2.0, 3.25, 8.0])
    rb.dmem(0, "bf16", src, 4)
    rb.dmem(1, "f32", out, 4)
    rb.dfout(2, "bf16", 3, 4)
    rb.dfin(3, "bf16", 3, 4)
    rb.vmov(2, 0)
    rb.vmov(1, 3)
    rb.halt()
    ex = both(pb.build())
    np.testing.assert_array_equal(read(ex, 0, 0, "out", 4), [1.5, -2.0, 3.25, 8.0])


def test_fp16_wavelets_are_read_with_the_receivers_dtype():
    pb = ProgramBuilder("dtypes")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="E")
    pb.route(1, 0, 1, 1, 0, rx="W", tx="RAMP")
    tx = pb.region("tx", 0, 0, 1, 1)
    src = tx.alloc("src", 16)
    tx.init(src, "f32", [1.0, 0.1, -65504.0, 70000.0])
    tx.dmem(0, "f32", src, 4)
    tx.dfout(1, "f16", 0, 4)  # rounded to fp16 on the way out
    tx.vmov(1, 0)
    tx.halt()
    rx = pb.region("rx", 1, 0, 1, 1)
    out = rx.alloc("out", 16)
    rx.dmem(0, "f32", out, 4)
    rx.dfin(1, "f16", 0, 4)
    rx.vmov(0, 1)
    rx.halt()
    ex = both(pb.build())
    with np.errstate(over="ignore"):  # 70000 rounds to fp16 inf, as it should
        want = np.array([1.0, 0.1, -65504.0, 70000.0], np.float32).astype(np.float16)
    np.testing.assert_array_equal(read(ex, 1, 1, "out", 4), want.astype(np.float32))


def test_backpressure_from_several_multicast_leaves_releases_after_the_last():
    n = 8  # longer than test64's queue of 4: every leaf overflows
    pb = ProgramBuilder("mc-bp")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="E")
    pb.route(1, 0, 2, 1, 0, rx="W", tx="E|RAMP")
    pb.route(3, 0, 1, 1, 0, rx="W", tx="RAMP")
    sender(pb, 0, 0, 0, [float(i) for i in range(n)], [n], "tx")
    rb = pb.region("leaves", 1, 0, 3, 1)
    out = rb.alloc("out", 4 * n)
    rb.dmem(0, "f32", out, n)
    rb.dfin(1, "f32", 0, n)
    rb.mov("r1", "X")
    rb.muli("r1", "r1", 40)  # the leaves consume at different times
    rb.label("spin")
    rb.addi("r2", "r2", 1)
    rb.blt("r2", "r1", "spin")
    rb.vmov(0, 1)
    rb.halt()
    ex = both(pb.build(), "test64")
    r = ex.result
    assert r.bp_stall[0] > 0
    last_leaf_done = int(r.clock[1:].max()) - 1
    assert r.clock[0] - 1 == last_leaf_done - 4  # released by the slowest leaf, minus the queue
    for pe in range(1, 4):
        np.testing.assert_array_equal(read(ex, pe, 1, "out", n), np.arange(n, dtype=np.float32))


def test_pes_woken_by_one_multicast_run_in_clock_and_index_order():
    """Twenty PEs block on one color at different cycles; one multicast wakes them all. The
    order they then run in is the scheduler's heap order, which the trace shows chunk by
    chunk: it must be the reference's exactly, and so must every result."""
    k = 20
    pb = ProgramBuilder("wake")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="S")
    pb.route(0, 1, 1, k - 1, 0, rx="N", tx="S|RAMP")
    pb.route(0, k, 1, 1, 0, rx="N", tx="RAMP")
    tx = pb.region("tx", 0, 0, 1, 1)
    buf = tx.alloc("buf", 16)
    tx.dmem(0, "f32", buf, 4)
    tx.li("r1", 300)
    tx.label("spin")
    tx.addi("r2", "r2", 1)
    tx.blt("r2", "r1", "spin")
    tx.dfout(1, "f32", 0, 4)
    tx.vmov(1, 0)
    tx.halt()
    rb = pb.region("col", 0, 1, 1, k)
    out = rb.alloc("out", 16)
    rb.dmem(0, "f32", out, 4)
    rb.dfin(1, "f32", 0, 4)
    rb.mov("r1", "Y")
    rb.muli("r1", "r1", 7)
    rb.andi("r1", "r1", 31)  # scrambled delays: blocking cycles out of index order
    rb.label("spin")
    rb.addi("r2", "r2", 1)
    rb.blt("r2", "r1", "spin")
    rb.vmov(0, 1)
    for _ in range(3):
        rb.vadd(0, 0, 0)
    rb.halt()
    program = pb.build()
    a = execute(program, "test64", engine="core", trace=True)
    b = execute(program, "test64", engine="reference", trace=True)
    same_run(a, b)
    assert a.result.trace == b.result.trace
    both(program, "test64")  # and running ahead
    woken = [t[0] for t in a.result.trace if t[1] == 7]  # the receives, as they ran
    assert woken != sorted(woken)  # not simply index order: their clocks differ

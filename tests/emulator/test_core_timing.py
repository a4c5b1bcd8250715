"""Timing properties of the fabric on the Numba core (docs/timing-model.md sections 5 to 7):
hop latency, link contention, multicast, backpressure, streaming, determinism. Each case is
also checked against the reference interpreter, bit for bit and cycle for cycle."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.emulator.load import N_PORTS
from wse_emu.isa.machine import load_machine
from wse_emu.emulator.result import RUN_HALTED
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.program import DIR_E, DIR_RAMP, DIR_S
from programs.conftest import same_run

L = 16  # wavelets per message


def both(program, machine="tiny"):
    a = execute(program, machine, engine="core")
    b = execute(program, machine, engine="reference")
    assert a.result.outcome == RUN_HALTED, a.result.outcome_name
    same_run(a, b)
    return a


def east(pb, color, x0, x1, y):
    """Route `color` from PE (x0, y) east to PE (x1, y)."""
    pb.route(x0, y, 1, 1, color, rx="RAMP", tx="E")
    if x1 - x0 > 1:
        pb.route(x0 + 1, y, x1 - x0 - 1, 1, color, rx="W", tx="E")
    pb.route(x1, y, 1, 1, color, rx="W", tx="RAMP")


def sender(pb, x, y, color, n=L, name=None):
    rb = pb.region(name or f"tx{x}_{y}", x, y, 1, 1)
    buf = rb.alloc("buf", 4 * n)
    rb.init(buf, "f32", [float(i + 10 * x) for i in range(n)])
    rb.dmem(0, "f32", buf, n)
    rb.dfout(1, "f32", color, n)
    rb.vmov(1, 0)
    rb.halt()
    return rb


def receiver(pb, x, y, color, n=L, name=None):
    rb = pb.region(name or f"rx{x}_{y}", x, y, 1, 1)
    buf = rb.alloc("buf", 4 * n)
    rb.dmem(0, "f32", buf, n)
    rb.dfin(1, "f32", color, n)
    rb.vmov(0, 1)
    rb.halt()
    return rb


def unicast(distance, machine):
    pb = ProgramBuilder("hop")
    east(pb, 0, 0, distance, 0)
    sender(pb, 0, 0, 0)
    receiver(pb, distance, 0, 0)
    return both(pb.build(), machine)


@pytest.mark.parametrize("hop", [1, 3])
def test_a_longer_route_costs_the_hop_latency_per_hop(hop):
    machine = dataclasses.replace(load_machine("tiny"), hop_latency=hop)
    ramp, issue = machine.ramp_latency, machine.issue_overhead
    for d in (1, 2, 5):
        r = unicast(d, machine).result
        # sender: dmem, dfout, then its chunk starts at 2 + issue and sends for L cycles;
        # the head then takes a ramp, d hops and a ramp; the receiver ends at tail + 1
        start = 2 + issue
        head = start + 1 + 2 * ramp + d * hop
        tail = head + L - 1
        assert r.clock[1] == max(head + L, tail + 1) + 1  # + its halt
        assert r.recv_stall[1] == head - (2 + issue)
        assert r.wavelet_hops == L * (d + 1)  # d router links and the RAMP down


def _pair(shared: bool):
    """Flow A: (0,0) -> (3,0). Flow B: (1,y) -> (4,y), on A's links when y == 0."""
    pb = ProgramBuilder("contention")
    y = 0 if shared else 1
    east(pb, 0, 0, 3, 0)
    east(pb, 1, 1, 4, y)
    sender(pb, 0, 0, 0)
    receiver(pb, 3, 0, 0)
    sender(pb, 1, y, 1)
    receiver(pb, 4, y, 1)
    return pb.build()


def _alone():
    pb = ProgramBuilder("alone")
    east(pb, 1, 1, 4, 0)
    sender(pb, 1, 0, 1)
    receiver(pb, 4, 0, 1)
    return pb.build()


def test_two_flows_on_one_link_are_slower_than_one_and_disjoint_flows_do_not_interact():
    alone = both(_alone()).result.clock[1]  # flow B's receiver, by itself
    shared = both(_pair(True))
    disjoint = both(_pair(False))
    b_shared, b_disjoint = shared.result.clock[3], disjoint.result.clock[3]
    assert b_disjoint == alone
    assert b_shared >= alone + L - 2  # B waited for A's L wavelets on the shared links
    link = (0 * shared.loaded.grid_w + 1) * N_PORTS + DIR_E  # router (1,0), east
    assert shared.result.link_wavelets[link] == 2 * L
    assert disjoint.result.link_wavelets[link] == L


def test_multicast_reaches_k_destinations_with_one_injection():
    k = 5
    pb = ProgramBuilder("multicast")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="S")
    pb.route(0, 1, 1, k - 1, 0, rx="N", tx="S|RAMP")
    pb.route(0, k, 1, 1, 0, rx="N", tx="RAMP")
    sender(pb, 0, 0, 0)
    rb = pb.region("col", 0, 1, 1, k)
    buf = rb.alloc("buf", 4 * L)
    rb.dmem(0, "f32", buf, L)
    rb.dfin(1, "f32", 0, L)
    rb.vmov(0, 1)
    rb.halt()
    ex = both(pb.build())
    r = ex.result
    assert (r.messages, r.wavelets) == (1, L)
    single = unicast(1, load_machine("tiny")).result
    assert r.clock[0] == single.clock[0]  # the sender pays one injection
    np.testing.assert_array_equal(np.diff(r.clock[1:]), np.ones(k - 1))  # one hop per row
    carried = r.link_wavelets.reshape(-1, N_PORTS)
    w = ex.loaded.grid_w
    for row in range(k):
        assert carried[row * w, DIR_S] == L  # the column link, once
        assert carried[(row + 1) * w, DIR_RAMP] == L  # and every delivery
    assert r.wavelet_hops == L * (2 * k)
    view = ex.loaded.sram_view()
    want = np.arange(L, dtype=np.float32)
    for p in range(1, k + 1):
        addr = ex.loaded.program.regions[1].allocs[0].addr
        np.testing.assert_array_equal(view[p, addr:addr + 4 * L].view(np.float32), want)


def _backpressure(n, messages, busy_loop):
    """(0,0) sends `messages` messages of n wavelets east; (1,0) first spins `busy_loop`
    iterations, then receives them all."""
    pb = ProgramBuilder("bp")
    east(pb, 0, 0, 1, 0)
    tx = pb.region("tx", 0, 0, 1, 1)
    buf = tx.alloc("buf", 4 * n)
    tx.dmem(0, "f32", buf, n)
    tx.dfout(1, "f32", 0, n)
    for _ in range(messages):
        tx.vmov(1, 0)
    tx.halt()
    rx = pb.region("rx", 1, 0, 1, 1)
    buf = rx.alloc("buf", 4 * n)
    rx.dmem(0, "f32", buf, n)
    rx.dfin(1, "f32", 0, n)
    rx.li("r1", busy_loop)
    rx.label("spin")
    rx.addi("r2", "r2", 1)
    rx.blt("r2", "r1", "spin")
    for _ in range(messages):
        rx.vmov(0, 1)
    rx.halt()
    return both(pb.build(), "test64").result


def test_backpressure_stalls_a_sender_until_its_receiver_consumes():
    depth = load_machine("test64").queue_depth
    assert depth == 4
    fits = _backpressure(depth, 1, 300)
    assert fits.bp_stall[0] == 0  # a message that fits the queue never blocks its sender
    slow = _backpressure(depth, 2, 300)
    fast = _backpressure(depth, 2, 1)
    assert fast.bp_stall[0] < slow.bp_stall[0]
    # the second message overflowed the queue: the sender resumed only once the receiver had
    # consumed it (minus the queue depth), long after its own send ended
    receiver_done = slow.clock[1] - 1  # before its halt
    assert slow.clock[0] - 1 >= receiver_done - depth
    assert slow.clock[0] > 300
    long_msg = _backpressure(3 * depth, 1, 300)
    assert long_msg.bp_stall[0] > 250  # one message longer than the queue is enough


def test_a_streaming_chain_costs_n_plus_p_hops_not_n_times_p():
    def chain(p, n):
        pb = ProgramBuilder("chain")
        for x in range(p - 1):
            east(pb, x % 2, x, x + 1, 0)
        rb = pb.region("row", 0, 0, p, 1)
        buf = rb.alloc("buf", 4 * n)
        rb.init(buf, "f32", [1.0] * n)
        rb.dmem(0, "f32", buf, n)
        rb.li("r1", p - 1)
        rb.andi("r2", "X", 1)
        rb.beq("X", "r0", "first")
        rb.beq("X", "r1", "last")
        rb.bne("r2", "r0", "odd")
        rb.dfin(1, "f32", 1, n)
        rb.dfout(2, "f32", 0, n)
        rb.jmp("add")
        rb.label("odd")
        rb.dfin(1, "f32", 0, n)
        rb.dfout(2, "f32", 1, n)
        rb.label("add")
        rb.vadd(2, 1, 0)  # streaming: forward (stream + mine) while it arrives
        rb.halt()
        rb.label("first")
        rb.dfout(2, "f32", 0, n)
        rb.vmov(2, 0)
        rb.halt()
        rb.label("last")
        rb.dfin(1, "f32", (p - 2) % 2, n)
        rb.vadd(0, 1, 0)
        rb.halt()
        ex = both(pb.build())
        addr = ex.loaded.program.regions[0].allocs[0].addr
        out = ex.loaded.sram_view()[p - 1, addr:addr + 4 * n].view(np.float32)
        np.testing.assert_array_equal(out, np.full(n, float(p), np.float32))
        return ex.result.cycles

    n = 512
    short, long_ = chain(3, n), chain(7, n)
    per_pe = (long_ - short) / 4
    assert 1 <= per_pe < 16  # a few cycles of hops and ramps per PE ...
    assert long_ < n + 7 * 16 < n * 7  # ... so N + P*c, far below N*P


def test_two_runs_are_identical():
    pb = ProgramBuilder("twice")
    for x in range(3):
        east(pb, x % 2, x, x + 1, 0)
    rb = pb.region("row", 0, 0, 4, 1)
    buf = rb.alloc("buf", 4 * L)
    rb.init(buf, "f32", [0.5 * i for i in range(L)])
    rb.dmem(0, "f32", buf, L)
    rb.li("r1", 3)
    rb.andi("r2", "X", 1)
    rb.beq("X", "r1", "recv")
    rb.dfout(1, "f32", 0, L)
    rb.beq("r2", "r0", "even")
    rb.dfout(1, "f32", 1, L)
    rb.label("even")
    rb.li("r3", 6)
    rb.label("loop")
    rb.vmov(1, 0)
    rb.addi("r4", "r4", 1)
    rb.blt("r4", "r3", "loop")
    rb.beq("X", "r0", "done")
    rb.label("recv")  # PE x receives on color (x - 1) % 2
    rb.dfin(2, "f32", 0, L)
    rb.bne("r2", "r0", "odd")
    rb.dfin(2, "f32", 1, L)
    rb.label("odd")
    rb.li("r3", 6)
    rb.li("r4", 0)
    rb.label("rloop")
    rb.vadd(0, 2, 0)
    rb.addi("r4", "r4", 1)
    rb.blt("r4", "r3", "rloop")
    rb.label("done")
    rb.halt()
    program = pb.build()
    first = execute(program, "test64")
    second = execute(program, "test64")
    assert first.result.outcome == RUN_HALTED and first.result.bp_stall.sum() > 0
    same_run(first, second)

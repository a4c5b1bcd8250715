"""How runs end on the Numba core: every fault reason, deadlock, max-cycles, and the state the
core reports then, which must equal the reference interpreter's (the core runs PEs ahead, so
faulting runs are replayed in strict order: these tests would catch a replay that is not)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.emulator.result import (
    F_ALIGN, F_COUNT, F_DEST_NOT_MEM, F_FABIN_DEST, F_FABOUT_SRC, F_MATRIX_FABRIC, F_NO_ROUTE,
    F_OOB, F_PC_END, F_SAME_COLOR, F_SCALAR_MEM, F_SHAPE, F_TARGET, RUN_DEADLOCK, RUN_FAULT,
    RUN_HALTED, RUN_MAX_CYCLES, ST_FAULT, ST_HALT, ST_WAIT_RECV)
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.encoding import encode
from wse_emu.isa.program import Program, Rect, Region
from programs.conftest import same_run


def both(program, machine="tiny", **kw):
    a = execute(program, machine, engine="core", **kw)
    b = execute(program, machine, engine="reference", **kw)
    same_run(a, b)
    assert (a.result.fault_pe, a.result.fault_reason) == (b.result.fault_pe,
                                                          b.result.fault_reason)
    return a.result


def one_pe(body):
    """A 1 x 2 program: PE (0,0) runs `body(rb, buf)`, PE (1,0) only receives on color 0."""
    pb = ProgramBuilder("f")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="E")
    pb.route(1, 0, 1, 1, 0, rx="W", tx="RAMP")
    rb = pb.region("a", 0, 0, 1, 1)
    buf = rb.alloc("buf", 64)
    rb.dmem(0, "f32", buf, 8)
    rb.dmem(1, "f32", buf + 32, 8)
    body(rb, buf)
    rb.halt()
    rx = pb.region("b", 1, 0, 1, 1)
    rx.halt()
    return pb.build()


FAULTS = {
    F_OOB: lambda rb, buf: (rb.dstride(0, 1000), rb.vmov(1, 0)),
    F_ALIGN: lambda rb, buf: (rb.li("r1", 2), rb.daddr(0, "r1", buf), rb.vmov(1, 0)),
    F_COUNT: lambda rb, buf: (rb.li("r1", 7), rb.dlen(1, "r1"), rb.vadd(1, 0, 1)),
    F_MATRIX_FABRIC: lambda rb, buf: (rb.dfin(2, "f32", 3, 8), rb.mv(1, 0, 2)),
    F_DEST_NOT_MEM: lambda rb, buf: (rb.dfout(2, "f32", 0, 8), rb.vfill(2, "f1")),
    F_FABIN_DEST: lambda rb, buf: (rb.dfin(2, "f32", 1, 8), rb.vmov(2, 0)),
    F_FABOUT_SRC: lambda rb, buf: (rb.dfout(2, "f32", 0, 8), rb.vmov(0, 2)),
    F_SCALAR_MEM: lambda rb, buf: (rb.li("r1", 2), rb.lw("r2", "r1", 0)),
    F_SAME_COLOR: lambda rb, buf: (rb.dfin(2, "f32", 1, 8), rb.vadd(0, 2, 2)),
    F_SHAPE: lambda rb, buf: (rb.d2d(0, 2, 4), rb.li("r1", 4), rb.dlen(0, "r1"),
                              rb.mv(1, 0, 1)),
    F_NO_ROUTE: lambda rb, buf: (rb.dfout(2, "f32", 5, 8), rb.vmov(2, 0)),
}


@pytest.mark.parametrize("reason", sorted(FAULTS))
def test_each_fault_stops_the_run_at_the_faulting_instruction(reason):
    r = both(one_pe(FAULTS[reason]))
    assert r.outcome == RUN_FAULT
    assert (r.fault_pe, r.fault_reason) == (0, reason)
    assert r.status[0] == ST_FAULT
    emitted = len(FAULTS[reason](_Count(), 0))
    assert r.pc[0] == 2 + emitted - 1  # two dmem, then the entry; its last instruction faults


class _Count:
    """Stands in for a RegionBuilder: each instruction method call returns something."""

    def __getattr__(self, name):
        return lambda *args: name


def test_pc_past_the_end_and_branch_outside_the_code():
    pb = ProgramBuilder("end")
    rb = pb.region("a", 0, 0, 1, 1)
    rb.nop()
    r = both(pb.build())
    assert (r.outcome, r.fault_reason, int(r.pc[0])) == (RUN_FAULT, F_PC_END, 1)
    # a branch target past the code cannot be built, so encode the region by hand
    words = (encode("li", {"d": 1, "v": 3}), encode("jmp", {"t": 9}))
    prog = Program("target", (Region("a", Rect(0, 0, 1, 1), words),))
    r = both(prog)
    assert (r.outcome, r.fault_reason, int(r.pc[0]), int(r.clock[0])) == (RUN_FAULT, F_TARGET,
                                                                          1, 1)


def test_first_fault_in_clock_order_wins_although_found_later():
    """PE 0 faults at a late cycle, PE 1 at an early one; PE 0 comes first in index order and
    runs ahead, so the core meets its fault first: the reported fault must still be PE 1's,
    and every PE's state the reference's at that moment."""
    pb = ProgramBuilder("two")
    rb = pb.region("row", 0, 0, 2, 1)
    buf = rb.alloc("buf", 64)
    rb.li("r1", 0)
    rb.li("r2", 200)
    rb.beq("X", "r0", "loop")
    rb.li("r2", 20)
    rb.label("loop")
    rb.sw("r1", "r0", buf)  # writes SRAM while running ahead: the replay must restore it
    rb.addi("r1", "r1", 1)
    rb.blt("r1", "r2", "loop")
    rb.lw("r3", "r0", 3)  # misaligned: fault
    rb.halt()
    r = both(pb.build())
    assert (r.outcome, r.fault_pe, r.fault_reason) == (RUN_FAULT, 1, F_SCALAR_MEM)
    assert r.clock[0] <= r.clock[1] + 1  # PE 0 stopped where the strict order stops it
    assert 40 < r.instructions[0] < 100


def test_deadlock_reports_what_each_pe_waits_for():
    pb = ProgramBuilder("dead")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="E")
    pb.route(1, 0, 1, 1, 0, rx="W", tx="RAMP")
    pb.route(1, 0, 1, 1, 1, rx="RAMP", tx="W")
    pb.route(0, 0, 1, 1, 1, rx="E", tx="RAMP")
    rb = pb.region("row", 0, 0, 2, 1)
    buf = rb.alloc("buf", 32)
    rb.dmem(0, "f32", buf, 8)
    rb.bne("X", "r0", "east")
    rb.dfin(1, "f32", 1, 8)  # west PE receives on 1 before it sends on 0
    rb.dfout(2, "f32", 0, 8)
    rb.jmp("go")
    rb.label("east")
    rb.dfin(1, "f32", 0, 8)  # east PE receives on 0 before it sends on 1
    rb.dfout(2, "f32", 1, 8)
    rb.label("go")
    rb.vmov(0, 1)
    rb.vmov(2, 0)
    rb.halt()
    r = both(pb.build())
    assert r.outcome == RUN_DEADLOCK
    assert list(r.status) == [ST_WAIT_RECV, ST_WAIT_RECV]
    assert list(r.wait_color) == [1, 0]
    assert r.messages == 0


def east_row(name):
    """A 2 x 1 program whose color 0 runs from PE (0,0) east to PE (1,0); d0 is an 8-element
    fp32 buffer on both."""
    pb = ProgramBuilder(name)
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="E")
    pb.route(1, 0, 1, 1, 0, rx="W", tx="RAMP")
    rb = pb.region("row", 0, 0, 2, 1)
    rb.dmem(0, "f32", rb.alloc("buf", 32), 8)
    return pb, rb


def test_deadlock_of_the_last_pe_after_all_others_halted():
    """The core counts halted PEs to call a run halted without a pass over all of them: one
    PE still waiting (its sender halted without sending) is a deadlock, not a halt."""
    pb, rb = east_row("last")
    rb.beq("X", "r0", "done")
    rb.dfin(1, "f32", 0, 8)
    rb.vmov(0, 1)
    rb.label("done")
    rb.halt()
    r = both(pb.build())
    assert r.outcome == RUN_DEADLOCK
    assert list(r.status) == [ST_HALT, ST_WAIT_RECV]


def test_max_cycles_stops_a_runaway_program_at_the_limit():
    pb, rb = east_row("spin")
    rb.bne("X", "r0", "east")
    rb.dfout(1, "f32", 0, 8)
    rb.label("send")
    rb.vmov(1, 0)
    rb.jmp("send")
    rb.label("east")
    rb.dfin(1, "f32", 0, 8)
    rb.label("recv")
    rb.vadd(0, 1, 0)
    rb.jmp("recv")
    r = both(pb.build(), max_cycles=500)
    assert (r.outcome, r.cycles) == (RUN_MAX_CYCLES, 500)
    assert r.messages > 10
    assert both(pb.build(), max_cycles=5000).messages > 5 * r.messages


# -- random programs that may fault, deadlock or run long ---------------------------------------


def chaos_program(seed: int):
    """Random descriptor arithmetic (lengths and addresses from registers), scalar memory
    at random addresses, and a ring exchange: faults come at random PEs and cycles."""
    r = random.Random(seed)
    w = r.randint(2, 4)
    pb = ProgramBuilder(f"chaos-{seed}")
    for x in range(w):
        pb.route(x, 0, 1, 1, x % 3, rx="RAMP", tx="E" if x < w - 1 else "RAMP")
        if x > 0:
            pb.route(x, 0, 1, 1, (x - 1) % 3, rx="W", tx="RAMP")
    rb = pb.region("row", 0, 0, w, 1)
    buf = rb.alloc("buf", 256)
    rb.init(buf, "f32", [r.uniform(-2, 2) for _ in range(64)])
    for d in range(3):
        rb.dmem(d, "f32", buf + 64 * d, 8)
    rb.mov("r11", "X")  # western PEs start later: faults come first in eastern PEs, which the
    rb.muli("r11", "r11", -r.randint(0, 4))  # core, running PEs in index order, meets last
    rb.addi("r11", "r11", 12)
    rb.label("delay")
    rb.addi("r10", "r10", 1)
    rb.blt("r10", "r11", "delay")
    rb.mov("r1", "X")
    rb.muli("r1", "r1", 4 * r.randint(1, 3))
    rb.li("r5", 0)
    rb.label("top")
    for _ in range(r.randint(4, 14)):
        k = r.random()
        if k < 0.25:  # lengths: mostly all alike, sometimes one (a count mismatch) or too long
            rb.li("r2", r.choice([8, 8, 8, 8, 8, 4, 12, 70]))
            for d in range(3) if r.random() < 0.8 else [r.randint(0, 2)]:
                rb.dlen(d, "r2")
        elif k < 0.4:
            rb.daddr(r.randint(0, 2), "r1", buf + 4 * r.randint(0, 40) + r.choice([0] * 9 + [2]))
        elif k < 0.5:
            rb.addi("r3", "r1", r.choice([0, 4, 8, 12, 16, 20, 250]))
            op = r.choice(["lw", "sw", "flw", "fsw"])
            rb.emit(op, "f1" if op[0] == "f" else "r4", "r3", buf)
        elif k < 0.75:
            rb.emit(r.choice(["vadd", "vmul", "vmax"]), r.randint(0, 2), r.randint(0, 2),
                    r.randint(0, 2))
        else:
            rb.rsum("f2", r.randint(0, 2))
            rb.fadd("f3", "f3", "f2")
        rb.addi("r1", "r1", 4 * r.randint(-1, 1))
    rb.addi("r5", "r5", 1)
    rb.li("r6", r.randint(1, 3))
    rb.blt("r5", "r6", "top")
    for x in range(w):  # PE x sends d0 east on color x % 3 and adds what comes from the west
        rb.li("r8", x)
        rb.bne("X", "r8", f"skip{x}")
        if x < w - 1:
            rb.dfout(5, "f32", x % 3, 8)
            rb.vmov(5, 0)
        if x > 0:
            rb.dfin(6, "f32", (x - 1) % 3, 8)
            rb.vadd(1, 6, 1)
        rb.jmp("done")
        rb.label(f"skip{x}")
    rb.label("done")
    rb.halt()
    return pb.build()


@pytest.mark.parametrize("seed", range(40))
def test_random_faulting_programs_agree_with_the_reference(seed):
    r = both(chaos_program(seed))
    assert r.outcome in (RUN_HALTED, RUN_FAULT, RUN_DEADLOCK)


def test_chaos_programs_do_fault_and_halt():
    """The generator is worth running: it produces both faults and clean halts."""
    outcomes = {execute(chaos_program(s), "tiny").result.outcome for s in range(40)}
    assert {RUN_FAULT, RUN_HALTED} <= outcomes


def test_halted_pe_status_and_cycles():
    pb = ProgramBuilder("h")
    rb = pb.region("a", 0, 0, 3, 1)
    rb.li("r1", 0)
    rb.label("l")
    rb.addi("r1", "r1", 1)
    rb.blt("r1", "X", "l")
    rb.halt()
    r = both(pb.build())
    assert r.outcome == RUN_HALTED and list(r.status) == [ST_HALT] * 3
    np.testing.assert_array_equal(r.clock, [4, 4, 6])
    assert r.cycles == 6


@pytest.mark.parametrize("setup,reason", [
    (lambda rb: (rb.li("r1", 1), rb.shli("r1", "r1", 62), rb.dlen(0, "r1")), F_OOB),
    (lambda rb: (rb.li("r1", 1), rb.shli("r1", "r1", 35), rb.dlen(0, "r1"),
                 rb.dstride(0, (1 << 31) - 1)), F_OOB),
    (lambda rb: (rb.li("r1", 1 << 21), rb.dlen(0, "r1"), rb.dstride(0, -(1 << 31))), F_OOB),
    (lambda rb: (rb.li("r1", -1), rb.shli("r1", "r1", 62), rb.daddr(0, "r1", 0)), F_OOB),
    (lambda rb: (rb.li("r1", 1), rb.shli("r1", "r1", 62), rb.daddr(0, "r1", 0)), F_OOB),
    (lambda rb: (rb.li("r1", 1), rb.shli("r1", "r1", 62), rb.daddr(0, "r1", 2)), F_ALIGN),
    (lambda rb: (rb.li("r1", -1), rb.dlen(0, "r1")), F_COUNT),
    (lambda rb: (rb.d2d(0, 65535, -32768),), F_OOB),
    (lambda rb: (rb.d2d(0, 65535, 0), rb.dstride(0, 0)), None),  # 8 * 65535 aliases: fine
])
def test_extreme_descriptor_values_fault_without_overflow(setup, reason):
    def body(rb, buf):
        setup(rb)
        rb.rsum("f1", 0)
    r = both(one_pe(body))
    if reason is None:
        assert r.outcome == RUN_HALTED
    else:
        assert (r.outcome, r.fault_reason) == (RUN_FAULT, reason)

"""The decode mapping's line allreduces (isa/compiler/lines.py), chain and two-phase forms, on
one line of PEs: every PE ends with the sum (or the root alone, as a reduce), and the emulated
cycles follow lines.cycles over a range of lengths, block sizes and group sizes."""

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.compiler.emit import Labels
from wse_emu.isa.compiler.lines import LineKind, Shared, allreduce, best_group, call_cycles, \
    cycles, pays, role, routes, setup_flags, setup_roles
from wse_emu.isa.machine import load_machine


@pytest.fixture(scope="module")
def wse3():
    return load_machine("wse3")


def _allreduce_cycles(machine, L, n, group, axis):
    """Emulated cycles of the allreduce alone, and the outputs."""
    ex = execute(_program(L, n, group, axis)[0], machine)
    setup = execute(_program(L, n, group, axis, reduce=False)[0], machine).result.cycles
    return ex.result.cycles - setup, ex.outputs["out"]


def _values(L: int, n: int) -> np.ndarray:
    return np.array([[q + 1 + 1000 * k for k in range(n)] for q in range(L)], np.float32)


def _program(L: int, n: int, group: int, axis: str, broadcast: bool = True, op: str = "add",
             reduce: bool = True):
    """A region of L PEs along `axis`, PE q holding row q of _values, one allreduce (none
    with reduce=False: the setup alone, whose cycles the allreduce's are counted from)."""
    pb = ProgramBuilder("line")
    w, h = (L, 1) if axis == "row" else (1, L)
    line = LineKind(axis, L, (0, 1, 2, 3, 4), "r13" if axis == "row" else "r14", (), group,
                    "r7" if group else "")

    def add(x, y, ww, hh, c, rx, tx):
        if ww > 0 and hh > 0:
            pb.route(x, y, ww, hh, c, rx, tx)
    routes(add, line, 1, 1, w, h, broadcast)
    pb.output("out", "f32", (L, n))
    rb = pb.region("r", 1, 1, w, h)
    buf = rb.alloc("buf", 4 * n)

    def rect(q):
        return (q, 0, 1, 1) if axis == "row" else (0, q, 1, 1)
    for q, row in enumerate(_values(L, n)):
        rb.init(buf, "f32", row.tolist(), rect=rect(q))
    rb.li("r1", 1)
    rb.sub("r13", "GX", "r1")
    rb.sub("r14", "GY", "r1")
    setup_roles(rb, line, rect)
    if reduce:
        allreduce(rb, Labels(), line, buf, n, op=op, broadcast=broadcast)
    rb.piece("out", buf, "f32", (1, n), (0, 0, 1) if axis == "row" else (0, 1, 0), 0)
    rb.halt()
    return pb.build(), line


@pytest.mark.parametrize("L,n,group,axis", [
    (5, 3, 1, "row"), (9, 4, 1, "column"), (7, 5, 2, "row"), (16, 32, 3, "column"),
    (33, 2, 4, "row"), (64, 48, 4, "column"), (100, 8, 5, "row"), (128, 1, 8, "column"),
    (128, 32, 8, "row"), (129, 16, 7, "column")])
def test_two_phase_allreduce_sums_and_follows_its_formula(L, n, group, axis, wse3):
    got, out = _allreduce_cycles(wse3, L, n, group, axis)
    want = _values(L, n).sum(axis=0)
    np.testing.assert_array_equal(out, np.broadcast_to(want, (L, n)))
    predicted = cycles(wse3, L, n, group=group)
    if L >= 16:  # (on shorter lines the dispatch's few cycles are most of it: the chain wins)
        assert abs(predicted - got) <= 0.15 * got, (predicted, got)
    else:
        assert abs(predicted - got) <= 30, (predicted, got)


@pytest.mark.parametrize("L,n", [(16, 1), (64, 8), (128, 48)])
def test_chain_form_follows_its_formula(L, n, wse3):
    got, out = _allreduce_cycles(wse3, L, n, 0, "row")
    np.testing.assert_array_equal(out[0], _values(L, n).sum(axis=0))
    assert abs(cycles(wse3, L, n) - got) <= 0.1 * got, (cycles(wse3, L, n), got)


def test_two_phase_reduce_and_max(wse3):
    """broadcast=False leaves the result on the root only; op="max" takes the maximum."""
    L, n = 20, 4
    program, line = _program(L, n, 3, "row", broadcast=False)
    out = execute(program, wse3).outputs["out"]
    np.testing.assert_array_equal(out[line.root], _values(L, n).sum(axis=0))
    program, _ = _program(L, n, 3, "column", op="max")
    out = execute(program, wse3).outputs["out"]
    np.testing.assert_array_equal(out, np.broadcast_to(_values(L, n).max(axis=0), (L, n)))


def test_two_phase_wins_on_long_lines_with_small_blocks(wse3):
    """The point of the form: a 128-PE line's scalar allreduce in about half the chain's
    cycles, emulated; with long blocks the chain stays (best_group says 0 or its cost wins)."""
    chain = _allreduce_cycles(wse3, 128, 1, 0, "row")[0]
    G = best_group(wse3, 128, 1)
    assert G > 1
    two = _allreduce_cycles(wse3, 128, 1, G, "row")[0]
    assert two < 0.6 * chain
    G = best_group(wse3, 128, 224)
    assert G == 0 or cycles(wse3, 128, 224, group=G) < cycles(wse3, 128, 224)


def test_roles_cover_a_line_once():
    """Every side's groups: one root each, the chain ends where the groups end."""
    for L, G in ((2, 1), (9, 2), (64, 8), (65, 3)):
        line = LineKind("row", L, (0, 1, 2, 3, 4), "r13", (), G, "r7")
        roles = [role(line, q) for q in range(L)]
        assert roles.count(0) == 1 and roles[line.root] == 0
        side_lengths = (line.root, L - 1 - line.root)
        groots = sum(1 for r in roles if r >= 16)
        assert groots == sum(-(-s // G) for s in side_lengths)


def _calls_program(L: int, sizes: tuple, group: int, shared: bool, broadcast: bool = True,
                   flags: bool = False):
    """A row of L PEs making one allreduce of each block size in `sizes` (PE q's block k holds
    row q of _values(L, n) + 100 k), inline or through one shared routine (lines.Shared); the
    chain form dispatching on flags (setup_flags) with flags=True."""
    pb = ProgramBuilder("calls")
    line = LineKind("row", L, (0, 1, 2, 3, 4), "r13", ("r3", "r4", "r5", "r6") if flags else (),
                    group, "r7" if group else "")

    def add(x, y, ww, hh, c, rx, tx):
        if ww > 0 and hh > 0:
            pb.route(x, y, ww, hh, c, rx, tx)
    routes(add, line, 1, 1, L, 1, broadcast)
    rb = pb.region("r", 1, 1, L, 1)
    bufs = []
    for k, n in enumerate(sizes):
        pb.output(f"out{k}", "f32", (L, n))
        bufs.append(rb.alloc(f"buf{k}", 4 * n))
        for q, row in enumerate(_values(L, n) + 100 * k):
            rb.init(bufs[-1], "f32", row.tolist(), rect=(q, 0, 1, 1))
    rb.li("r1", 1)
    rb.sub("r13", "GX", "r1")
    setup_roles(rb, line)
    setup_flags(rb, line)
    labels = Labels()
    share = Shared({(line, "add", broadcast): len(sizes)} if shared else {})
    for buf, n in zip(bufs, sizes):
        share.allreduce(rb, labels, line, buf, n, broadcast=broadcast)
    for k, n in enumerate(sizes):
        rb.piece(f"out{k}", bufs[k], "f32", (1, n), (0, 0, 1), 0)
    rb.halt()
    share.routines(rb, labels)
    return pb.build(), line


@pytest.mark.parametrize("L,group,flags", [(24, 0, False), (31, 0, True), (40, 4, False),
                                            (9, 2, False)])
def test_shared_routine_gives_the_inline_sums_in_less_code(L, group, flags, wse3):
    """Four allreduces of one kind through one shared routine: the same values as inline,
    fewer instructions, and the emulated cycles grow by about what call_cycles adds."""
    sizes = (1, 7, 3, 16)
    inline, line = _calls_program(L, sizes, group, False, flags=flags)
    shared, _ = _calls_program(L, sizes, group, True, flags=flags)
    assert pays(line, "add", True, len(sizes))
    a, b = execute(inline, wse3), execute(shared, wse3)
    for k, n in enumerate(sizes):
        want = (_values(L, n) + 100 * k).sum(axis=0)
        np.testing.assert_array_equal(a.outputs[f"out{k}"], np.broadcast_to(want, (L, n)))
        np.testing.assert_array_equal(b.outputs[f"out{k}"], a.outputs[f"out{k}"])
    assert len(shared.regions[0].code) < len(inline.regions[0].code)
    added = sum(call_cycles(wse3, line, True, i, len(sizes)) for i in range(len(sizes)))
    got = b.result.cycles - a.result.cycles
    assert abs(got - added) <= 0.2 * added, (got, added)

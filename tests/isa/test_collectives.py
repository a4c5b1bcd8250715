"""Line collectives: numerics against NumPy, cycles against the cost formulas, core = reference."""

import dataclasses

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.isa.machine import load_machine
from wse_emu.isa import collectives as C
from wse_emu.isa.builder import ProgramBuilder

# The formulas follow every rule of docs/timing-model.md that a collective meets except the
# first-come-first-served order in which two messages sent at nearly the same time reserve a
# shared ramp, which can shift a two-phase line by a few cycles (at most 11 seen).
TOLERANCE = 0.05  # relative, plus ...
SLACK = 12  # cycles


def run(kind, form, length, n, lines=1, axis="row", engine="core", machine="wse2",
        inplace=False, root=None, group=None, per_role=True, timing_only=False, pad=0):
    """One collective on `lines` lines of `length` PEs; returns (Execution, v, collective).
    pad: bytes allocated before the blocks (beyond 65535: above what dmem addresses)."""
    m = load_machine(machine)
    if pad:
        m = dataclasses.replace(m, sram_bytes=pad + 64 * 1024)
    rect = (0, 0, length, lines) if axis == "row" else (0, 0, lines, length)
    need = C.colors_needed(kind, form, length, root)
    coll = C.LineCollective(kind, rect, axis, n, list(range(3, 3 + need)), form, root, group,
                            C.Costs.of(m))
    pb = ProgramBuilder("coll")
    pb.input("v", "f32", (length * lines, n))
    pb.output("s", "f32", (length * lines, n))
    coll.add_routes(pb)
    pieces = C.split(coll.rect, coll) if per_role else [(coll.rect, None)]
    for i, (r, _roles) in enumerate(pieces):
        rb = pb.region(f"r{i}", r.x, r.y, r.w, r.h)
        if pad:  # at fixed addresses: the collective sees integers, as a compiler gives it
            a = rb.alloc("a", n * 4, at=pad) and pad
            b = a if inplace else rb.alloc("b", n * 4, at=pad + 4 * n) and pad + 4 * n
        else:
            a = rb.alloc("a", n * 4)
            b = a if inplace else rb.alloc("b", n * 4)
        # row of v = line * length + position
        row = (r.y * length + r.x, length, 1) if axis == "row" else (r.x * length + r.y, 1, length)
        rb.piece("v", a, "f32", (1, n), row=row, col=0)
        rb.piece("s", b, "f32", (1, n), row=row, col=0)
        coll.emit(rb, a, b)
        rb.halt()
    v = np.random.default_rng(length * 1000 + n).standard_normal((length * lines, n),
                                                                  dtype=np.float32)
    ex = execute(pb.build(), m, {"v": v}, engine=engine, timing_only=timing_only)
    assert ex.result.outcome_name == "halted"
    return ex, v.reshape(lines, length, n), coll


def check_numbers(kind, ex, v, coll):
    s = ex.outputs["s"].reshape(v.shape)
    total = v.sum(axis=1, dtype=np.float64)
    if kind == "broadcast":
        np.testing.assert_array_equal(s, np.broadcast_to(v[:, coll.root:coll.root + 1], s.shape))
    elif kind == "allreduce":
        np.testing.assert_allclose(s, np.broadcast_to(total[:, None], s.shape), rtol=1e-5,
                                   atol=1e-4)
        assert (s == s[:, :1]).all()  # one broadcast value on every PE of a line
    else:
        np.testing.assert_allclose(s[:, coll.root], total, rtol=1e-5, atol=1e-4)


def near(emulated, formula):
    return abs(emulated - formula) <= TOLERANCE * formula + SLACK


@pytest.mark.parametrize("form", ["chain", "two_phase", "tree"])
@pytest.mark.parametrize("kind", ["reduce", "allreduce"])
@pytest.mark.parametrize("length", [2, 3, 7, 16, 33, 64, 100])
@pytest.mark.parametrize("n", [1, 16, 512])
def test_cycles_follow_formula_and_sums_match(kind, form, length, n):
    ex, v, coll = run(kind, form, length, n)
    check_numbers(kind, ex, v, coll)
    assert near(ex.result.cycles, coll.cost()), (ex.result.cycles, coll.cost())


@pytest.mark.parametrize("length", [2, 5, 64])
@pytest.mark.parametrize("n", [1, 64, 512])
def test_broadcast(length, n):
    ex, v, coll = run("broadcast", "chain", length, n)
    check_numbers("broadcast", ex, v, coll)
    assert near(ex.result.cycles, coll.cost())


@pytest.mark.parametrize("kind,form", [("reduce", "two_phase"), ("allreduce", "chain"),
                                       ("allreduce", "two_phase"), ("allreduce", "tree"),
                                       ("broadcast", "chain")])
def test_columns_and_several_lines(kind, form):
    """Every line of the rectangle at once, along columns: the same cycles as one line."""
    one, _, coll1 = run(kind, form, 12, 32, lines=1, axis="column")
    ex, v, coll = run(kind, form, 12, 32, lines=3, axis="column")
    check_numbers(kind, ex, v, coll)
    assert ex.result.cycles == one.result.cycles
    assert near(ex.result.cycles, coll.cost())


@pytest.mark.parametrize("n", [1, 32, 512])
def test_long_line(n):
    """A 512-PE row (the gemv bar's line), every form, root in the middle."""
    got = {}
    for form in C.FORMS:
        ex, v, coll = run("reduce", form, 512, n, root=255)
        check_numbers("reduce", ex, v, coll)
        assert near(ex.result.cycles, coll.cost()), (form, ex.result.cycles, coll.cost())
        got[form] = ex.result.cycles
    if n == 32:  # the chain pays a relay at every PE; two-phase one per group
        assert got["two_phase"] * 3 < got["chain"]
    if n == 1:  # a scalar: the tree's log depth wins
        assert got["tree"] < got["two_phase"] < got["chain"]


@pytest.mark.parametrize("kind,form", [(k, f) for k in ("reduce", "allreduce") for f in C.FORMS]
                         + [("broadcast", "chain")])
@pytest.mark.parametrize("length,n", [(2, 1), (9, 24), (16, 1), (23, 64)])
def test_core_equals_reference(kind, form, length, n):
    """Bits and cycles equal, and both follow the formula."""
    from programs.conftest import same_run
    a, v, coll = run(kind, form, length, n, lines=2, engine="core")
    b, _, _ = run(kind, form, length, n, lines=2, engine="reference")
    same_run(a, b)
    check_numbers(kind, b, v, coll)
    assert near(b.result.cycles, coll.cost())


def test_in_place_and_root_anywhere():
    for root in (0, 4, 10):
        ex, v, coll = run("allreduce", "two_phase", 11, 8, root=root, inplace=True)
        check_numbers("allreduce", ex, v, coll)
        assert near(ex.result.cycles, coll.cost())


def test_one_region_with_dispatch():
    """A region spanning every role gets a branch on the position: same numbers, a few more
    cycles than one region per role."""
    split_run, v, coll = run("allreduce", "two_phase", 20, 16)
    whole, _, _ = run("allreduce", "two_phase", 20, 16, per_role=False)
    check_numbers("allreduce", whole, v, coll)
    assert split_run.result.cycles < whole.result.cycles <= split_run.result.cycles + 20


def test_fastest_picks_the_cheapest_form():
    costs = C.Costs.of(load_machine("wse2"))
    for length, n in [(4, 512), (64, 16), (512, 32), (512, 1)]:
        form, _ = C.fastest("allreduce", length, n, costs)
        best = min(C.cost("allreduce", f, length, n, costs) for f in C.FORMS)
        assert C.cost("allreduce", form, length, n, costs) == best
        form, root = C.best_layout("allreduce", length, n, costs)
        assert C.cost("allreduce", form, length, n, costs, root) <= best
    assert C.fastest("reduce", 512, 32, costs)[0] == "two_phase"
    assert C.fastest("reduce", 512, 32, costs, max_colors=2)[0] == "chain"


def test_bad_requests_say_what():
    with pytest.raises(C.CollectiveError, match="needs 5 colors"):
        C.allreduce((0, 0, 8, 1), "row", 4, colors=(1, 2), form="two_phase")
    with pytest.raises(C.CollectiveError, match="axis"):
        C.reduce((0, 0, 8, 1), "diagonal", 4, colors=(1, 2))
    with pytest.raises(C.CollectiveError, match="root 9"):
        C.reduce((0, 0, 8, 1), "row", 4, colors=(1, 2), form="chain", root=9)


def test_segments_of_a_row_share_colors():
    """Segments of one row are collectives on narrower rectangles; on disjoint PEs they may
    use the same colors, and each sums only its own segment."""
    m = load_machine("wse2")
    segs = [C.allreduce((0, 0, 5, 2), "row", 8, range(1, 6), form="two_phase"),
            C.allreduce((5, 0, 7, 2), "row", 8, range(1, 6), form="chain")]
    pb = ProgramBuilder("segments")
    pb.input("v", "f32", (24, 8))
    pb.output("s", "f32", (24, 8))
    for seg in segs:
        seg.add_routes(pb)
        for i, (r, _) in enumerate(C.split(seg.rect, seg)):
            rb = pb.region(f"s{seg.rect.x}_{i}", r.x, r.y, r.w, r.h)
            a = rb.alloc("a", 32)
            rb.piece("v", a, "f32", (1, 8), row=(r.y * 12 + r.x, 12, 1), col=0)
            rb.piece("s", a, "f32", (1, 8), row=(r.y * 12 + r.x, 12, 1), col=0)
            seg.emit(rb, a, a)
            rb.halt()
    v = np.random.default_rng(3).standard_normal((24, 8), dtype=np.float32)
    ex = execute(pb.build(), m, {"v": v})
    s, v = ex.outputs["s"].reshape(2, 12, 8), v.reshape(2, 12, 8)
    for lo, hi in ((0, 5), (5, 12)):
        want = v[:, lo:hi].sum(axis=1, keepdims=True)
        np.testing.assert_allclose(s[:, lo:hi], np.broadcast_to(want, (2, hi - lo, 8)),
                                   rtol=1e-5, atol=1e-5)
    assert ex.result.cycles == max(seg.cost() for seg in segs)


@pytest.mark.parametrize("per_role", [True, False])
def test_blocks_above_what_dmem_addresses(per_role):
    """A GPU core's SRAM is larger than dmem's 16-bit addresses: blocks beyond them are
    reached with daddr (one region a role, and one region dispatching on the roles)."""
    for inplace in (False, True):
        ex, v, coll = run("allreduce", "chain", 7, 16, per_role=per_role, inplace=inplace,
                          pad=70000)
        check_numbers("allreduce", ex, v, coll)

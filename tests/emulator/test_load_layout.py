"""The loader's layout: every PE's SRAM is its own region's footprint (and the limit of its
address checks), the vectorised footprints equal Program.region_sram_bytes, a multicast tree
loads its links once, and every route tree error is one clear line."""

from __future__ import annotations

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.emulator.load import (LoadError, entry_pipe, link_pipes, load, region_footprints,
                                   write_input)
from wse_emu.isa.machine import load_machine
from wse_emu.emulator.result import F_OOB, F_SCALAR_MEM, RUN_FAULT, RUN_HALTED
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.program import DIR_RAMP
from programs.conftest import build

rng = np.random.default_rng(3)


def _two_regions(small_reads: int | None = None, vector: bool = False):
    """Region 'big' (2 x 1 PEs, 4 KB buffer) and region 'small' (1 x 2 PEs, 64 bytes) with an
    input piece each; the small PEs optionally read address `small_reads`, which only the big
    region declares."""
    pb = ProgramBuilder("layout")
    pb.input("a", "i32", (2, 4))
    pb.input("b", "i32", (2, 4))
    big = pb.region("big", 0, 0, 2, 1)
    buf = big.alloc("buf", 4096)
    big.piece("a", buf, "i32", (1, 4), row=(0, 0, 1))
    big.halt()
    small = pb.region("small", 0, 1, 1, 2)
    cell = small.alloc("cell", 64)
    small.piece("b", cell, "i32", (1, 4), row=(0, 1, 0))
    if small_reads is not None:
        if vector:
            small.dmem(0, "f32", small_reads, 4)
            small.vmov(0, 0)
        else:
            small.li("r1", small_reads)
            small.lw("r2", "r1", 0)
    small.halt()
    return pb.build()


def test_every_pe_gets_its_own_regions_footprint():
    """A PE's SRAM is its region's footprint, not the largest region's: the host holds the
    sum of the footprints, and inputs land where each region's code reads them."""
    program = _two_regions()
    ld = load(program, load_machine("tiny"))
    foot = [program.region_sram_bytes(r) for r in program.regions]
    assert foot[0] > 4096 > 64 + 8 * len(program.regions[1].code) >= foot[1]
    assert [ld.sram_view()[p].size for p in range(4)] == [foot[0], foot[0], foot[1], foot[1]]
    assert ld.sram.nbytes < 2 * foot[0] + 2 * foot[1] + 4 * 8  # not 4 x the largest
    a = np.arange(8, dtype=np.int32).reshape(2, 4)
    b = 100 + a
    write_input(ld, "a", a)
    write_input(ld, "b", b)
    for p, (sym, row) in enumerate([(a, 0), (a, 1), (b, 0), (b, 1)]):
        addr = program.regions[p // 2].allocs[0].addr
        assert ld.sram_view()[p, addr:addr + 16].view(np.int32).tolist() == sym[row].tolist()
        np.testing.assert_array_equal(ld.region_sram(p // 2)[p % 2, :foot[p // 2]],
                                      ld.sram_view()[p])


@pytest.mark.parametrize("vector, reason", [(False, F_SCALAR_MEM), (True, F_OOB)])
@pytest.mark.parametrize("engine", ["core", "reference"])
def test_an_address_only_another_region_declares_is_a_fault(vector, reason, engine):
    """The small region reads the big region's buffer address: outside its own footprint."""
    inside = _two_regions(small_reads=32, vector=vector)
    outside = _two_regions(small_reads=2048, vector=vector)
    inputs = {"a": np.zeros((2, 4), np.int32), "b": np.zeros((2, 4), np.int32)}
    assert execute(inside, "tiny", inputs, engine=engine).result.outcome == RUN_HALTED
    r = execute(outside, "tiny", inputs, engine=engine).result
    assert (r.outcome, r.fault_pe, r.fault_reason) == (RUN_FAULT, 2, reason)
    if engine == "core":  # the same checks without SRAM contents
        t = execute(outside, "tiny", inputs, timing_only=True).result
        assert (t.outcome, t.fault_pe, t.fault_reason, t.cycles) == (RUN_FAULT, 2, reason,
                                                                     r.cycles)


def test_vectorised_footprints_equal_the_programs(tmp_path):
    from wse_emu.isa.compiler import compile_model
    from tests.compiler.np_models import make_llama

    programs = [build("gemv", {"W": rng.standard_normal((64, 64), dtype=np.float32)}, M=64,
                      K=64, P=2, Q=4, DT="bf16"),
                build("allreduce", N=32, NX=4, NY=4, MODE=1), _two_regions(32)]
    model = make_llama(tmp_path, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128,
                       vocab=256)
    programs.append(compile_model(model, load_machine("test64"), max_context=16)[0])
    for program in programs:
        assert region_footprints(program).tolist() == \
            [program.region_sram_bytes(r) for r in program.regions]


# ---------------------------------------------------------------------------------------------
# route trees


def _routes(*rules, regions=((0, 0, 3, 1),)):
    pb = ProgramBuilder("routes")
    for i, (x, y, w, h) in enumerate(regions):
        pb.region(f"r{i}", x, y, w, h).halt()
    for rule in rules:
        pb.route(*rule)
    return pb.build()


def multicast_program():
    """(0,0) sends 8 wavelets east on color 0; (1,0) delivers and forwards east and south;
    (2,0) and (1,1) deliver. Each receiver stores what it got."""
    pb = ProgramBuilder("tree")
    for rule in ((0, 0, 1, 1, 0, "RAMP", "E"), (1, 0, 1, 1, 0, "W", "E|S|RAMP"),
                 (2, 0, 1, 1, 0, "W", "RAMP"), (1, 1, 1, 1, 0, "N", "RAMP")):
        pb.route(*rule)
    tx = pb.region("tx", 0, 0, 1, 1)
    src = tx.alloc("src", 32)
    tx.init(src, "f32", [1.5 * i - 2 for i in range(8)])
    tx.dmem(0, "f32", src, 8)
    tx.dfout(1, "f32", 0, 8)
    tx.vmov(1, 0)
    tx.halt()
    for name, x, y in (("a", 1, 0), ("b", 2, 0), ("c", 1, 1)):
        rx = pb.region(name, x, y, 1, 1)
        got = rx.alloc("got", 32)
        rx.dmem(0, "f32", got, 8)
        rx.dfin(1, "f32", 0, 8)
        rx.vmov(0, 1)
        rx.halt()
    return pb.build()


@pytest.mark.parametrize("engine", ["core", "reference"])
def test_a_multicast_tree_loads_every_link_once_and_delivers_to_every_leaf(engine):
    """One injection: the wavelets cross each link of the tree once (link ids cell * 5 + port,
    ports N E S W RAMP), no other link, and every leaf gets the same values."""
    ex = execute(multicast_program(), "tiny", engine=engine)
    r = ex.result
    assert r.outcome == RUN_HALTED and r.messages == 1 and r.wavelets == 8
    w = ex.loaded.grid_w
    link = lambda x, y, port: (y * w + x) * 5 + port  # noqa: E731
    tree = [link(0, 0, 1), link(1, 0, 1), link(1, 0, 2), link(1, 0, DIR_RAMP),
            link(2, 0, DIR_RAMP), link(1, 1, DIR_RAMP)]
    assert np.flatnonzero(r.link_wavelets).tolist() == sorted(tree)
    assert r.link_wavelets[tree].tolist() == [8] * 6 and r.wavelet_hops == 8 * 6
    sent = np.float32([1.5 * i - 2 for i in range(8)])
    got = ex.loaded.program.regions[1].allocs[0].addr
    for x, y in ((1, 0), (2, 0), (1, 1)):
        p = next(i for i, (px, py) in enumerate(zip(ex.loaded.pe_x, ex.loaded.pe_y))
                 if (px, py) == (x, y))
        np.testing.assert_array_equal(ex.loaded.sram_view()[p, got:got + 32].view(np.float32),
                                      sent)


def test_a_leaf_one_hop_further_gets_the_wavelets_one_hop_later():
    """(2,0) and (1,1) are both a hop past (1,0): they finish together; (1,0) a hop earlier.
    The same on both engines."""
    runs = [execute(multicast_program(), "tiny", engine=e) for e in ("core", "reference")]
    assert runs[0].result.clock.tolist() == runs[1].result.clock.tolist()
    ld = runs[0].loaded
    clock = {(int(x), int(y)): int(c) for x, y, c in zip(ld.pe_x, ld.pe_y, runs[0].result.clock)}
    hop = load_machine("tiny").hop_latency
    assert clock[2, 0] == clock[1, 1] == clock[1, 0] + hop


@pytest.mark.parametrize("rules, regions, message", [
    ([(0, 0, 1, 1, 0, "RAMP", 0)], ((0, 0, 3, 1),),
     "color 0 from PE (0,0) is dropped at (0,0): its route forwards nowhere"),
    ([(0, 0, 1, 1, 0, "RAMP", "E"), (1, 0, 1, 1, 0, "W", "RAMP")], ((0, 0, 1, 1),),
     "color 0 from PE (0,0) delivers to (1,0), which runs no code"),
    ([(0, 0, 1, 1, 0, "RAMP", "N")], ((0, 0, 3, 1),),
     "route for color 0 at (0,0) sends N off the fabric (machine 'tiny' is"),
    ([(0, 0, 1, 1, 1, "RAMP", "E"), (1, 0, 1, 1, 1, "N", "RAMP")], ((0, 0, 3, 1),),
     "color 1 from PE (0,0) is dropped at (1,0): its route for color 1 does not accept "
     "wavelets from W"),
    ([(0, 0, 1, 1, 0, "RAMP|E", "E"), (1, 0, 1, 1, 0, "W", "W")], ((0, 0, 3, 1),),
     "color 0 from PE (0,0) loops: (0,0) is reached twice"),
    ([(0, 0, 1, 1, 0, "RAMP", "E"), (1, 0, 1, 1, 0, "W", "E"), (2, 0, 1, 1, 0, "W", 0)],
     ((0, 0, 3, 1),), "color 0 from PE (0,0) is dropped at (2,0): its route forwards nowhere"),
])
def test_malformed_route_trees_are_one_line_errors(rules, regions, message):
    with pytest.raises(LoadError) as e:
        load(_routes(*rules, regions=regions), load_machine("tiny"))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("y0, y1", [(6, 9), (9, 6), (0, 7), (8, 15)])
def test_the_walk_marks_system_links_as_link_pipes_defines_them(tmp_path, y0, y1):
    """The loader marks the links into a pipe between chips (the walk's load_routes.crossing_pipe,
    rewritten through a switch) as the vectorised load.link_pipes defines them, point to point
    and through a switch; on one chip there are none."""
    from tests.emulator.test_system_links import chip_toml, columns

    program = columns(NX=3, Y0=y0, Y1=y1, N=4)
    two = load_machine(chip_toml(tmp_path, "two") + "x2")
    p2p = load_machine(chip_toml(tmp_path, "p2p", switch=False) + "x2")
    tall = load_machine(chip_toml(tmp_path, "tall", height=16))
    crossed = 3 * ((y0 < 8) != (y1 < 8))
    for machine, crossings in ((two, crossed), (p2p, crossed), (tall, 0)):
        ld = load(program, machine)
        senders = np.flatnonzero(ld.tree_start >= 0)
        rows = np.repeat(ld.pe_y[senders // ld.colors], ld.tree_count[senders])
        pipes = link_pipes(machine, ld.grid_w, ld.tree_link, rows, ld.tree_parent)
        np.testing.assert_array_equal(ld.tree_pipe, pipes)
        assert int((pipes >= 0).sum()) == crossings
        assert [entry_pipe(int(d)) for d in ld.tree_dest] == pipes.tolist()
        # RAMP entries deliver, the others do not; every delivery's queue is marked
        delivers = ld.tree_dest >= 0
        assert (delivers == (ld.tree_link % 5 == DIR_RAMP)).all()
        slots = ld.tree_dest[delivers].astype(np.int64) * ld.colors
        assert set(ld.queue_slots.tolist()) == set(slots.tolist())  # (all on color 0)
        senders = ld.tree_start >= 0
        assert ld.tree_of[senders, 2].sum() == delivers.sum()

"""The loader's layout: every PE's SRAM is its own region's footprint (and the limit of its
address checks), the vectorised footprints equal Program.region_sram_bytes, and every route
tree error is one clear line."""

from __future__ import annotations

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.emulator.load import LoadError, load, region_footprints, write_input
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
    program = _two_regions()
    ld = load(program, load_machine("tiny"))
    foot = [program.region_sram_bytes(r) for r in program.regions]
    assert foot[0] > 4096 > 64 + 8 * len(program.regions[1].code) >= foot[1]
    np.testing.assert_array_equal(ld.sram_len, [foot[0], foot[0], foot[1], foot[1]])
    stride = [(f + 7) // 8 * 8 for f in foot]
    np.testing.assert_array_equal(ld.sram_base, [0, stride[0], 2 * stride[0],
                                                 2 * stride[0] + stride[1]])
    assert ld.sram.size == 2 * stride[0] + 2 * stride[1]  # not 4 x the largest
    assert ld.pe_stride == stride[0]
    a = np.arange(8, dtype=np.int32).reshape(2, 4)
    b = 100 + a
    write_input(ld, "a", a)
    write_input(ld, "b", b)
    for p, (sym, row) in enumerate([(a, 0), (a, 1), (b, 0), (b, 1)]):
        addr = program.regions[p // 2].allocs[0].addr
        assert ld.sram_view()[p, addr:addr + 16].view(np.int32).tolist() == sym[row].tolist()
        assert ld.sram_view()[p].size == ld.sram_len[p]
        np.testing.assert_array_equal(ld.region_sram(p // 2)[p % 2, :ld.sram_len[p]],
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
    from tests.graph.hf_models import make_llama

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


def test_a_multicast_tree_is_walked_breadth_first():
    # (0,0) sends east; (1,0) delivers and forwards east and south; (2,0) and (1,1) deliver
    program = _routes((0, 0, 1, 1, 0, "RAMP", "E"), (1, 0, 1, 1, 0, "W", "E|S|RAMP"),
                      (2, 0, 1, 1, 0, "W", "RAMP"), (1, 1, 1, 1, 0, "N", "RAMP"),
                      regions=((0, 0, 3, 1), (1, 1, 1, 1)))
    ld = load(program, load_machine("tiny"))
    pe = {(int(x), int(y)): i for i, (x, y) in enumerate(zip(ld.pe_x, ld.pe_y))}
    slot = pe[0, 0] * ld.colors
    first, count = ld.tree_start[slot], ld.tree_count[slot]
    w = ld.grid_w
    link = lambda x, y, port: (y * w + x) * 5 + port  # noqa: E731
    assert ld.tree_link[first:first + count].tolist() == [
        link(0, 0, 1), link(1, 0, 1), link(1, 0, 2), link(1, 0, DIR_RAMP), link(2, 0, DIR_RAMP),
        link(1, 1, DIR_RAMP)]
    assert ld.tree_parent[first:first + count].tolist() == [-1, 0, 0, 0, 1, 2]
    assert ld.tree_dest[first:first + count].tolist() == [-1, -1, -1, pe[1, 0], pe[2, 0],
                                                          pe[1, 1]]
    # only PEs whose route accepts RAMP send: (1,0) does not, on color 0
    assert ld.tree_start[pe[1, 0] * ld.colors] == -1


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

"""DMA between HBM and SRAM (dmald / dmast / dmawait) and the HBM channel model
(docs/timing-model.md, "HBM and DMA"): bits against NumPy, the Numba core against the reference
interpreter, the timing rules, and the faults."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.emulator.load import LoadError, load
from wse_emu.isa.machine import load_machine
from wse_emu.emulator import report
from wse_emu.emulator.result import (F_ALIGN, F_DMA_DESC, F_DMA_TAG, F_HBM_RANGE, FAULT_REASONS,
                             RUN_FAULT, RUN_HALTED)
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.spec import COST_CLASSES
from programs.conftest import same_run

BASE = load_machine("test64")


def hbm_machine(channels=4, interleave=256, latency=100, bytes_per_cycle=64.0, **kw):
    """test64 with an HBM of the given shape (bandwidth chosen for bytes_per_cycle)."""
    return dataclasses.replace(BASE, hbm_bytes=1 << 24, hbm_efficiency=1.0,
                               hbm_bandwidth=bytes_per_cycle * BASE.clock_hz,
                               hbm_latency=latency, hbm_channels=channels,
                               hbm_interleave=interleave, **kw)


M = hbm_machine()


def both(program, machine=M, **kw):
    """Run on the core and the reference; they must agree on everything, HBM included."""
    a = execute(program, machine, engine="core", **kw)
    b = execute(program, machine, engine="reference", **kw)
    same_run(a, b)
    ra, rb = a.result, b.result
    assert (ra.hbm_read_bytes, ra.hbm_write_bytes) == (rb.hbm_read_bytes, rb.hbm_write_bytes)
    np.testing.assert_array_equal(ra.dma_stall, rb.dma_stall)
    np.testing.assert_array_equal(ra.hbm_channel_busy, rb.hbm_channel_busy)
    assert a.loaded.hbm.tobytes() == b.loaded.hbm.tobytes()
    assert ra.trace == rb.trace
    return a


def round_trip(n=256, scale=3.0):
    """One PE: x (HBM input) -> SRAM, y = x * scale + 1, SRAM -> HBM output y."""
    pb = ProgramBuilder("rt")
    x_at = pb.hbm_alloc("x", 4 * n)
    y_at = pb.hbm_alloc("y", 4 * n)
    pb.input("x", "f32", (n,))
    pb.output("y", "f32", (n,))
    pb.hbm_piece("x", x_at, "f32")
    pb.hbm_piece("y", y_at, "f32")
    rb = pb.region("pe", 0, 0, 1, 1)
    buf = rb.alloc("buf", 4 * n)
    rb.dmem(0, "f32", buf, n)
    rb.li("r1", x_at)
    rb.li("r2", y_at)
    rb.dmald(0, "r1", 3)
    rb.dmawait(3)
    rb.fli("f0", scale)
    rb.vmuls(0, 0, "f0")
    rb.fli("f1", 1.0)
    rb.vadds(0, 0, "f1")
    rb.dmast(0, "r2", 5)
    rb.dmawait(5)
    rb.halt()
    return pb.build()


def test_load_compute_store_round_trip_equals_numpy_on_both_engines():
    x = np.random.default_rng(7).standard_normal(256).astype(np.float32)
    ex = both(round_trip(), inputs={"x": x})
    assert ex.result.outcome == RUN_HALTED
    expected = (x * np.float32(3.0)).astype(np.float32) + np.float32(1.0)
    np.testing.assert_array_equal(ex.outputs["y"], expected)
    assert ex.result.hbm_read_bytes == ex.result.hbm_write_bytes == 1024
    assert ex.result.class_counts[list(COST_CLASSES).index("dma")] == 2


def transfer(nbytes, machine=M, addr=0, tag=0, wait=True):
    pb = ProgramBuilder("t")
    pb.hbm_alloc("h", max(nbytes + addr, 4))
    rb = pb.region("pe", 0, 0, 1, 1)
    buf = rb.alloc("buf", max(nbytes, 4))
    rb.dmem(0, "f32", buf, nbytes // 4)
    rb.li("r1", addr)
    rb.dmald(0, "r1", tag)
    if wait:
        rb.dmawait(tag)
    rb.halt()
    return both(pb.build(), machine)


def test_a_transfer_costs_bytes_over_bandwidth_plus_latency():
    m = M
    r = transfer(32768).result
    # striped over 4 channels of 16 bytes/cycle: 8192 bytes each = 512 cycles, then latency
    t0 = 2 * m.scalar_cycles + m.issue_overhead  # dmem, li, then the request leaves
    done = t0 + 512 + m.hbm_latency
    assert r.dma_stall[0] == done - (t0 + m.scalar_cycles)
    assert r.cycles == done + m.scalar_cycles
    np.testing.assert_array_equal(r.hbm_channel_busy, [512] * 4)
    assert r.busy[0] == m.issue_overhead + 4 * m.scalar_cycles  # waiting is not busy


def test_halting_with_a_dma_outstanding_ends_the_run_at_its_completion():
    r = transfer(32768, wait=False).result
    assert r.outcome == RUN_HALTED
    assert r.clock[0] == M.issue_overhead + 3 * M.scalar_cycles
    assert r.cycles == M.issue_overhead + 2 * M.scalar_cycles + 512 + M.hbm_latency


def test_more_channels_do_not_help_a_small_transfer_but_spread_a_large_one():
    small1 = transfer(256, hbm_machine(channels=1, bytes_per_cycle=16.0)).result.cycles
    small8 = transfer(256, hbm_machine(channels=8, bytes_per_cycle=128.0)).result.cycles
    assert small1 == small8  # one interleave block lives on one channel
    big1 = transfer(32768, hbm_machine(channels=1, bytes_per_cycle=16.0)).result.cycles
    big8 = transfer(32768, hbm_machine(channels=8, bytes_per_cycle=128.0)).result.cycles
    lat = M.hbm_latency
    assert big1 - lat > 7 * (big8 - lat) // 2  # about 8x less transfer time
    assert big8 < big1


def test_unaligned_range_splits_over_channels_exactly():
    # bytes 192 .. 192 + 1024 over 256-byte blocks: 64 on ch0, 256 on ch1, ch2, ch3, 192 on ch0
    r = transfer(1024, addr=192).result
    per = [math.ceil(n / 16) for n in (64 + 192, 256, 256, 256)]
    np.testing.assert_array_equal(r.hbm_channel_busy, per)


def test_many_small_transfers_do_not_round_up_each():
    # 3 bytes/cycle a channel: 4 bytes take 4/3 cycle; 64 of them in a row take 86, not 128
    m = hbm_machine(channels=1, bytes_per_cycle=3.0, latency=10)
    pb = ProgramBuilder("s")
    pb.hbm_alloc("h", 256)
    rb = pb.region("pe", 0, 0, 1, 1)
    buf = rb.alloc("buf", 4)
    rb.dmem(0, "f32", buf, 1)
    for i in range(64):
        rb.li("r1", 4 * i)
        rb.dmast(0, "r1", 1)
    rb.dmawait(1)
    rb.halt()
    r = both(pb.build(), m).result
    assert r.hbm_channel_busy[0] == math.ceil(64 * 4 / 3)
    assert r.hbm_write_bytes == 256


def streams(pes, nbytes=16384, compute_pe=False, machine=M):
    """`pes` PEs in a row each load nbytes from their own HBM buffer; optionally one more PE
    computes only."""
    pb = ProgramBuilder("st")
    pb.hbm_alloc("h", pes * nbytes)
    rb = pb.region("ld", 0, 0, pes, 1)
    buf = rb.alloc("buf", nbytes)
    rb.dmem(0, "f32", buf, nbytes // 4)
    rb.li("r2", nbytes)
    rb.mul("r1", "X", "r2")
    rb.dmald(0, "r1", 0)
    rb.dmawait(0)
    rb.halt()
    if compute_pe:
        cb = pb.region("cp", pes, 0, 1, 1)
        cbuf = cb.alloc("buf", 4096)
        cb.dmem(0, "f32", cbuf, 1024)
        cb.fli("f0", 2.0)
        for _ in range(4):
            cb.vmuls(0, 0, "f0")
        cb.halt()
    return both(pb.build(), machine).result


def test_two_pes_streaming_share_the_bandwidth_and_compute_elsewhere_is_unaffected():
    one = streams(1)
    two = streams(2, compute_pe=True)
    lat = M.hbm_latency
    t1, t2 = one.clock[0] - lat, two.clock[:2].max() - lat
    assert 1.8 * t1 < t2 < 2.2 * t1
    alone = streams(1, compute_pe=True)
    assert two.clock[2] == alone.clock[1]  # the compute PE never waits for HBM
    assert two.dma_stall[2] == 0


def test_double_buffering_overlaps_load_and_compute():
    """Load tile k + 1 while computing on tile k: about max(load, compute) a tile, not the
    sum (the machine is chosen so that both take about 512 cycles a tile)."""
    n, tiles = 2048, 6
    m = hbm_machine(channels=1, bytes_per_cycle=16.0, latency=50)
    load = 4 * n / 16
    compute = m.issue_overhead + math.ceil(n / m.simd_width("mul_f32"))

    def program(double):
        pb = ProgramBuilder("db")
        pb.hbm_alloc("h", tiles * 4 * n)
        rb = pb.region("pe", 0, 0, 1, 1)
        bufs = [rb.alloc("b0", 4 * n), rb.alloc("b1", 4 * n)]
        rb.dmem(0, "f32", bufs[0], n)
        rb.dmem(1, "f32", bufs[1], n)
        rb.fli("f0", 1.5)
        rb.li("r1", 0)
        rb.dmald(0, "r1", 0)
        for k in range(tiles):
            cur = k % 2 if double else 0
            if double and k + 1 < tiles:
                rb.li("r1", (k + 1) * 4 * n)
                rb.dmald(1 - cur, "r1", 1 - cur)
            rb.dmawait(cur)
            rb.vmuls(cur, cur, "f0")
            if not double and k + 1 < tiles:
                rb.li("r1", (k + 1) * 4 * n)
                rb.dmald(0, "r1", 0)
        rb.halt()
        return pb.build()

    single = both(program(False), m).result
    double = both(program(True), m).result
    serial = tiles * (load + m.hbm_latency + compute)
    overlapped = tiles * max(load, compute) + min(load, compute) + m.hbm_latency
    assert abs(single.cycles - serial) < 0.05 * serial
    assert abs(double.cycles - overlapped) < 0.05 * overlapped
    assert double.cycles < 0.6 * single.cycles
    assert double.dma_stall[0] < single.dma_stall[0] / 4


def test_dmawait_on_an_idle_tag_costs_scalar_cycles_only():
    pb = ProgramBuilder("w")
    rb = pb.region("pe", 0, 0, 1, 1)
    rb.dmawait(7)
    rb.halt()
    r = both(pb.build()).result
    assert r.cycles == 2 * M.scalar_cycles
    assert r.dma_stall[0] == 0


def faulting(setup, hbm=64):
    pb = ProgramBuilder("f")
    pb.hbm_alloc("h", hbm)
    rb = pb.region("pe", 0, 0, 1, 1)
    buf = rb.alloc("buf", 64)
    setup(rb, buf)
    rb.halt()
    ex = both(pb.build())
    assert ex.result.outcome == RUN_FAULT
    return ex.result.fault_reason


@pytest.mark.parametrize("setup, reason", [
    (lambda rb, b: (rb.dmem(0, "f32", b, 4), rb.li("r1", 60), rb.dmald(0, "r1", 0)), F_HBM_RANGE),
    (lambda rb, b: (rb.dmem(0, "f32", b, 4), rb.li("r1", -4), rb.dmast(0, "r1", 0)), F_HBM_RANGE),
    (lambda rb, b: (rb.dmem(0, "f32", b, 4), rb.li("r1", 2), rb.dmald(0, "r1", 0)), F_HBM_RANGE),
    (lambda rb, b: (rb.dmem(0, "f32", b, 4), rb.dstride(0, 2), rb.dmald(0, "r1", 0)), F_DMA_DESC),
    (lambda rb, b: (rb.dmem(0, "f32", b, 2), rb.d2d(0, 2, 3), rb.dmald(0, "r1", 0)), F_DMA_DESC),
    (lambda rb, b: (rb.dfin(0, "f32", 1, 4), rb.dmald(0, "r1", 0)), F_DMA_DESC),
    (lambda rb, b: (rb.dmem(0, "f32", b + 2, 4), rb.dmald(0, "r1", 0)), F_ALIGN),
    (lambda rb, b: (rb.dmem(0, "f32", b, 4), rb.dmald(0, "r1", 8)), F_DMA_TAG),
    (lambda rb, b: rb.dmawait(9), F_DMA_TAG),
])
def test_faults_have_clear_reasons(setup, reason):
    assert faulting(setup) == reason
    assert FAULT_REASONS[reason]


def test_rows_back_to_back_are_contiguous():
    def setup(rb, b):
        rb.dmem(0, "f32", b, 2)
        rb.d2d(0, 3, 2)  # 3 rows of 2, 2 apart: 6 elements in a row
        rb.li("r1", 8)
        rb.dmald(0, "r1", 0)
    pb = ProgramBuilder("c")
    pb.hbm_alloc("h", 64)
    rb = pb.region("pe", 0, 0, 1, 1)
    setup(rb, rb.alloc("buf", 64))
    rb.halt()
    assert both(pb.build()).result.hbm_read_bytes == 24


def test_a_fault_after_a_store_replays_with_the_hbm_put_back():
    """A PE stores to HBM, another faults later: the core replays the run in strict order and
    must start from the original HBM (the reference's state is compared by `both`)."""
    pb = ProgramBuilder("r")
    pb.hbm_alloc("h", 64)
    rb = pb.region("pe", 0, 0, 2, 1)
    buf = rb.alloc("buf", 16)
    rb.dmem(0, "f32", buf, 4)
    rb.li("r1", 0)
    rb.dmald(0, "r1", 0)
    rb.dmawait(0)
    rb.fli("f0", 2.0)
    rb.vmuls(0, 0, "f0")
    rb.dmast(0, "r1", 0)
    rb.dmawait(0)
    rb.li("r1", 4096)
    rb.dmald(0, "r1", 0)  # both PEs fault here
    rb.halt()
    ex = both(pb.build())
    assert ex.result.outcome == RUN_FAULT and ex.result.fault_reason == F_HBM_RANGE


def test_loader_refuses_dma_on_a_machine_without_hbm():
    pb = ProgramBuilder("n")
    rb = pb.region("pe", 0, 0, 1, 1)
    rb.nop()
    rb.dmawait(0)
    rb.halt()
    with pytest.raises(LoadError, match=r"^program uses DMA \(dmawait at region 'pe' pc 1\) but "
                                        r"machine test64 has no HBM$"):
        load(pb.build(), BASE)


def test_timing_only_gives_the_same_cycles_and_moves_no_data():
    x = np.arange(256, dtype=np.float32)
    full = execute(round_trip(), M, inputs={"x": x})
    timed = execute(round_trip(), M, inputs={"x": x}, timing_only=True)
    assert timed.result.cycles == full.result.cycles
    assert timed.result.hbm_read_bytes == full.result.hbm_read_bytes
    np.testing.assert_array_equal(timed.result.dma_stall, full.result.dma_stall)
    assert timed.loaded.hbm.size == 0


def test_report_shows_hbm_traffic():
    ex = execute(round_trip(), M, inputs={"x": np.zeros(256, np.float32)})
    doc = report.summary(ex.loaded, ex.result)
    line = [x for x in report.text(doc).splitlines() if x.startswith("HBM: ")]
    assert line and "0.001 MB read, 0.001 MB written" in line[0] and "% of peak" in line[0]
    assert doc["hbm"]["read_bytes"] == 1024 and doc["hbm"]["write_bytes"] == 1024
    assert doc["hbm"]["dma_stall_cycles"] == int(ex.result.dma_stall.sum())
    assert len(doc["hbm"]["channel_busy_cycles"]) == M.hbm_channels


ASM = """
.hbm x, 64
.region pe, 0, 0, 1, 1
    .alloc buf, 64
    dmem d2, f16, buf, 32
    li r3, x + 0
    dmald d2, r3, 7
    dmawait 7
    dmast d2, r3, 1
    dmawait 1
    halt
.endregion
"""


def test_assembler_and_disassembler_round_trip_dma(tmp_path):
    from wse_emu.isa.asm import assemble, assemble_file
    from wse_emu.isa.disasm import disassemble
    program = assemble(ASM, "dma.wsa")
    text = open(disassemble(program, str(tmp_path), "dma")).read()
    assert "dmald d2, r3, 7" in text and "dmast d2, r3, 1" in text and "dmawait 7" in text
    assert assemble_file(str(tmp_path / "dma.wsa")) == program
    r = both(program).result
    assert r.outcome == RUN_HALTED and r.hbm_read_bytes == r.hbm_write_bytes == 64

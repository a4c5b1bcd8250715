"""The Numba core against the pure-Python reference: equal bits and equal cycles.

Random well-formed programs (hypothesis picks the seed; a small generator builds the program)
mix every instruction class: integer and float scalars, descriptor setup, elementwise ops over
fp32 / fp16 / bf16 buffers, reductions, mv / mm, scalar loads and stores, counted loops and a
fabric exchange between neighbours. Every register is stored to SRAM at the end, so comparing
SRAM bytes compares the whole architectural state. A second test runs one program per
mnemonic, so every row of the ISA table is compared at least once.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wse_emu.emulator.api import execute
from wse_emu.isa.machine import load_machine
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.spec import INSTRUCTIONS
from programs.conftest import same_run

L = 12  # elements of every vector buffer
HBM_BYTES = 1024  # one HBM buffer every PE reads and writes anywhere (order matters: it is global)
# "tiny" with a small, narrow HBM, so that DMA requests of different PEs contend
TINY_HBM = dataclasses.replace(load_machine("tiny"), hbm_bytes=1 << 20, hbm_efficiency=0.9,
                               hbm_bandwidth=load_machine("tiny").clock_hz * 10.0,
                               hbm_latency=17, hbm_channels=3, hbm_interleave=32)
MV_COLS = 3
INT_OPS = ["add", "sub", "mul", "div", "rem", "and", "or", "xor", "slt"]
INT_IMM_OPS = ["addi", "muli", "andi", "shli", "shri"]
FLOAT_BIN = ["fadd", "fsub", "fmul", "fmax", "fmin", "fdiv"]
FLOAT_UN = ["fmov", "fexp", "frsqrt", "fsqrt"]
VEC_BIN = ["vadd", "vsub", "vmul", "vmax", "vmin"]
VEC_UN = ["vmov", "vexp", "vgelu", "vgelue", "vsilu", "vrsqrt"]
VEC_SCALAR = ["vadds", "vmuls", "vfma"]


class Gen:
    """Builds one random program into a RegionBuilder, from a seeded random.Random."""

    def __init__(self, r: random.Random, rb, bufs, dtypes, scratch, hbm_per_row=0):
        self.r, self.rb = r, rb
        self.bufs, self.dtypes = bufs, dtypes
        self.scratch = scratch
        self.hbm_per_row = hbm_per_row  # > 0: each row's PEs use their own HBM bytes only

    def ireg(self) -> str:
        return f"r{self.r.randint(1, 8)}"

    def freg(self) -> str:
        return f"f{self.r.randint(0, 7)}"

    def dreg(self) -> int:
        return self.r.randrange(len(self.bufs))

    def one(self, kind: str) -> None:
        r, rb = self.r, self.rb
        if kind == "int":
            rb.emit(r.choice(INT_OPS), self.ireg(), self.ireg(), r.choice([self.ireg(), "X", "Y"]))
        elif kind == "intimm":
            rb.emit(r.choice(INT_IMM_OPS), self.ireg(), self.ireg(), r.randint(-70, 70))
        elif kind == "li":
            rb.li(self.ireg(), r.randint(-(1 << 31), (1 << 31) - 1))
        elif kind == "mov":
            rb.mov(self.ireg(), r.choice(["X", "Y", "W", "H", "GX", "GY", self.ireg()]))
        elif kind == "fli":
            rb.fli(self.freg(), r.choice([0.0, -0.0, 1.5, -3.25, 1e-3, 70.0, float("inf")]))
        elif kind == "float":
            rb.emit(r.choice(FLOAT_BIN), self.freg(), self.freg(), self.freg())
        elif kind == "funary":
            rb.emit(r.choice(FLOAT_UN), self.freg(), self.freg())
        elif kind == "conv":
            if r.random() < 0.5:
                rb.itof(self.freg(), self.ireg())
            else:
                rb.ftoi(self.ireg(), self.freg())
        elif kind == "scalar_mem":
            off = 4 * r.randrange(8)
            op = r.choice(["lw", "sw", "flw", "fsw"])
            reg = self.freg() if op in ("flw", "fsw") else self.ireg()
            rb.li("r9", self.scratch)
            rb.emit(op, reg, "r9", off)
        elif kind == "vbin":
            rb.emit(r.choice(VEC_BIN), self.dreg(), self.dreg(), self.dreg())
        elif kind == "vun":
            rb.emit(r.choice(VEC_UN), self.dreg(), self.dreg())
        elif kind == "vscalar":
            rb.emit(r.choice(VEC_SCALAR), self.dreg(), self.dreg(), self.freg())
        elif kind == "vfill":
            rb.vfill(self.dreg(), self.freg())
        elif kind == "reduce":
            op = r.choice(["rsum", "rmax", "rdot"])
            if op == "rdot":
                rb.rdot(self.freg(), self.dreg(), self.dreg())
            else:
                rb.emit(op, self.freg(), self.dreg())
        elif kind == "matrix":
            rb.emit(r.choice(["mv", "mva"]), 12, 10, 11)
            if r.random() < 0.5:
                rb.emit(r.choice(["mm", "mma"]), 13, 10, 14)
        elif kind == "dma":
            op = r.choice(["dmald", "dmast", "dmawait"])
            tag = r.randrange(3)
            if op == "dmawait":
                rb.dmawait(tag)
            else:
                rb.li("r14", 4 * r.randrange((HBM_BYTES - 4 * L) // 4))
                if self.hbm_per_row:
                    rb.emit("muli", "r15", "GY", self.hbm_per_row)
                    rb.emit("add", "r14", "r14", "r15")
                rb.emit(op, self.dreg(), "r14", tag)
        elif kind == "strided":
            d, e = self.dreg(), self.dreg()
            rb.dmem(15, self.dtypes[d], self.bufs[d], L // 2)
            rb.dstride(15, 2)
            rb.dmem(7, self.dtypes[e], self.bufs[e], L // 2)
            rb.vadd(7, 15, 7)
        else:
            raise AssertionError(kind)


KINDS = ["int", "intimm", "li", "mov", "fli", "float", "funary", "conv", "scalar_mem", "vbin",
         "vun", "vscalar", "vfill", "reduce", "matrix", "strided", "dma"]


def build_program(seed: int, kinds=KINDS, n_ops: int = 30, vertical: bool = False,
                  hbm_per_row: int = 0):
    """A random program on 2-3 x 1-2 PEs that exchange with their east neighbour; vertical:
    on 1-2 x 2-3 PEs exchanging with their south neighbour (across the chips of a system whose
    chips are one row high); hbm_per_row: each row's DMAs stay in its own HBM_BYTES of
    hbm_per_row bytes a row (a system's per-GPU HBM)."""
    r = random.Random(seed)
    w, h = r.randint(2, 3), r.randint(1, 2)
    if vertical:
        w, h = h, w
    pb = ProgramBuilder(f"random-{seed}")
    pb.hbm_alloc("hbm", hbm_per_row * h if hbm_per_row else HBM_BYTES)
    if vertical:
        for y in range(h - 1):
            pb.route(0, y, w, 1, y % 2, rx="RAMP", tx="S")
            pb.route(0, y + 1, w, 1, y % 2, rx="N", tx="RAMP")
    else:
        for x in range(w - 1):
            pb.route(x, 0, 1, h, x % 2, rx="RAMP", tx="E")
            pb.route(x + 1, 0, 1, h, x % 2, rx="W", tx="RAMP")
    rb = pb.region("all", 0, 0, w, h)
    dtypes = [r.choice(["f32", "f16", "bf16"]) for _ in range(4)]
    bufs = [rb.alloc(f"b{i}", L * 4) for i in range(4)]
    mat = rb.alloc("mat", L * MV_COLS * 4)
    matx = rb.alloc("matx", MV_COLS * 4)
    maty = rb.alloc("maty", L * 4)
    mmb = rb.alloc("mmb", MV_COLS * 2 * 4)
    mmc = rb.alloc("mmc", L * 2 * 4)
    scratch = rb.alloc("scratch", 64)
    dump = rb.alloc("dump", 8 * 8 + 8 * 4)
    for i, (b, dt) in enumerate(zip(bufs, dtypes)):
        rb.init(b, dt, [round(r.uniform(-4, 4), 3) for _ in range(L)])
    rb.init(mat, "f32", [r.uniform(-1, 1) for _ in range(L * MV_COLS)])
    rb.init(matx, "f32", [r.uniform(-1, 1) for _ in range(MV_COLS)])
    rb.init(mmb, "f32", [r.uniform(-1, 1) for _ in range(MV_COLS * 2)])
    for i, (b, dt) in enumerate(zip(bufs, dtypes)):
        rb.dmem(i, dt, b, L)
    rb.dmem(10, "f32", mat, L)
    rb.d2d(10, MV_COLS, L)
    rb.dmem(11, "f32", matx, MV_COLS)
    rb.dmem(12, "f32", maty, L)
    rb.dmem(13, "f32", mmc, L)
    rb.d2d(13, 2, L)
    rb.dmem(14, "f32", mmb, MV_COLS)
    rb.d2d(14, 2, MV_COLS)
    rb.itof("f0", "X")  # make PEs differ
    rb.vadds(0, 0, "f0")
    gen = Gen(r, rb, bufs, dtypes, scratch, hbm_per_row)
    # a counted loop around part of the body
    rb.li("r10", r.randint(1, 3))
    rb.li("r11", 0)
    rb.label("loop")
    for _ in range(n_ops):
        gen.one(r.choice(kinds))
    rb.addi("r11", "r11", 1)
    rb.blt("r11", "r10", "loop")
    # neighbour exchange: send d0 east (south), receive from the west (north) into d1
    # (alternating colors)
    pos = "Y" if vertical else "X"
    rb.andi("r12", pos, 1)
    rb.li("r13", (h if vertical else w) - 1)
    rb.beq(pos, "r13", "no_send")
    rb.bne("r12", "r0", "send_odd")
    rb.dfout(8, dtypes[0], 0, L)
    rb.jmp("send")
    rb.label("send_odd")
    rb.dfout(8, dtypes[0], 1, L)
    rb.label("send")
    rb.vmov(8, 0)
    rb.label("no_send")
    rb.beq(pos, "r0", "no_recv")
    rb.bne("r12", "r0", "recv_odd")
    rb.dfin(9, dtypes[0], 1, L)
    rb.jmp("recv")
    rb.label("recv_odd")
    rb.dfin(9, dtypes[0], 0, L)
    rb.label("recv")
    rb.vadd(1, 9, 1)
    rb.label("no_recv")
    # dump the registers so SRAM holds the whole state
    rb.li("r9", dump)
    for i in range(1, 9):
        rb.sw(f"r{i}", "r9", 8 * (i - 1))
        rb.shri(f"r{i}", f"r{i}", 32)
        rb.sw(f"r{i}", "r9", 8 * (i - 1) + 4)
    for i in range(8):
        rb.fsw(f"f{i}", "r9", 64 + 4 * i)
    rb.halt()
    return pb.build()


def both(program, machine=TINY_HBM):
    a = execute(program, machine, engine="core")
    b = execute(program, machine, engine="reference")
    assert a.loaded.hbm.tobytes() == b.loaded.hbm.tobytes()
    assert (a.result.hbm_read_bytes, a.result.hbm_write_bytes) == \
        (b.result.hbm_read_bytes, b.result.hbm_write_bytes)
    np.testing.assert_array_equal(a.result.dma_stall, b.result.dma_stall)
    np.testing.assert_array_equal(a.result.hbm_channel_busy, b.result.hbm_channel_busy)
    return a, b


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_random_programs_agree(seed):
    a, b = both(build_program(seed))
    assert a.result.outcome_name == "halted"
    same_run(a, b)


def mnemonic_kind(mnemonic: str) -> str | None:
    table = {"int": INT_OPS, "intimm": INT_IMM_OPS, "float": FLOAT_BIN, "funary": FLOAT_UN,
             "vbin": VEC_BIN, "vun": VEC_UN, "vscalar": VEC_SCALAR}
    for kind, names in table.items():
        if mnemonic in names:
            return kind
    return {"li": "li", "mov": "mov", "fli": "fli", "itof": "conv", "ftoi": "conv",
            "lw": "scalar_mem", "sw": "scalar_mem", "flw": "scalar_mem", "fsw": "scalar_mem",
            "vfill": "vfill", "rsum": "reduce", "rmax": "reduce", "rdot": "reduce",
            "mv": "matrix", "mva": "matrix", "mm": "matrix", "mma": "matrix",
            "dstride": "strided", "dmald": "dma", "dmast": "dma", "dmawait": "dma"}.get(mnemonic)


def test_generator_covers_the_table():
    """Every instruction of the ISA table is produced by the generator (or its fixed frame)."""
    frame = {"nop", "halt", "jmp", "beq", "bne", "blt", "bge", "dmem", "dfin", "dfout", "d2d",
             "daddr", "dlen", "vadds", "addi", "andi", "shri", "sw", "fsw", "itof", "vmov"}
    missing = [i.mnemonic for i in INSTRUCTIONS
               if mnemonic_kind(i.mnemonic) is None and i.mnemonic not in frame]
    assert missing == []


@pytest.mark.parametrize("kind", KINDS)
def test_each_instruction_class_agrees(kind):
    for seed in range(3):
        a, b = both(build_program(1000 + seed, kinds=[kind], n_ops=12))
        same_run(a, b)


def test_fabric_descriptor_ops_and_branches_agree():
    """daddr / dlen / nop / bge / jmp, which the generator's frame does not randomise."""
    pb = ProgramBuilder("frame")
    rb = pb.region("one", 0, 0, 1, 1)
    buf = rb.alloc("buf", 64)
    rb.init(buf, "f32", list(np.arange(16, dtype=np.float32)))
    rb.li("r1", 8)
    rb.li("r2", 4)
    rb.dmem(0, "f32", 0, 1)
    rb.daddr(0, "r0", buf)
    rb.dlen(0, "r1")
    rb.label("again")
    rb.nop()
    rb.vadds(0, 0, "f1")
    rb.addi("r2", "r2", -1)
    rb.bge("r2", "r0", "again")
    rb.jmp("end")
    rb.vfill(0, "f1")
    rb.label("end")
    rb.halt()
    a, b = both(pb.build())
    same_run(a, b)

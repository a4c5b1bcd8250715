"""disassemble -> assemble gives back byte-identical program.bin files."""

from pathlib import Path

import numpy as np
import pytest

from wse_emu.isa import binfmt
from wse_emu.isa.asm import assemble_file
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.disasm import disassemble
from wse_emu.isa.encoding import FBits
from wse_emu.isa.spec import INSTRUCTIONS

GEMV = Path(__file__).parent / "data" / "gemv.wsa"


def _round_trip(program, tmp_path, stem="prog"):
    path = disassemble(program, str(tmp_path / "out"), stem)
    again = assemble_file(path)
    assert binfmt.dumps(again) == binfmt.dumps(program)
    assert again == program and again.meta == program.meta
    return Path(path).read_text()


def test_gemv(tmp_path):
    np.save(tmp_path / "W.npy", np.random.default_rng(2).standard_normal((512, 512),
                                                                       dtype=np.float32))
    program = assemble_file(str(GEMV), data_files={"W": str(tmp_path / "W.npy")})
    text = _round_trip(program, tmp_path, "gemv")
    assert 'file="gemv.W.npy"' in text and "recv_x:" in text and "bne Y, r0, recv_x" in text
    assert (tmp_path / "out" / "gemv.W.npy").is_file()


def _awkward_program():
    rng = np.random.default_rng(3)
    pb = ProgramBuilder("awkward name")
    pb.param("M", 4)
    pb.param("DT", "bf16")
    pb.meta("model", {"layers": [1, 2], "nested": {"ok": True, "eps": 1e-5}})
    pb.meta("odd key", "x")
    pb.tensor("h.0.w", rng.standard_normal((4, 6)).astype(np.float16))
    pb.tensor("b16", np.array([[0x7FC1, 0x3F80], [0xFF80, 0x0001]], np.uint16), dtype="bf16")
    pb.tensor("ids", np.arange(8, dtype=np.int32))
    pb.tensor("ext", shape=(64, 64), file="weights/model.safetensors", key="layers.0.w",
              dtype="bf16")
    pb.tensor("ext2", shape=(8,), file="/abs/x.safetensors", dtype="f32")
    pb.input("x", "f16", [2, 6])
    pb.output("out", "f32", [4])
    pb.route(0, 0, 3, 2, 5, rx="W|RAMP", tx="E|S")
    pb.route(1, 1, 1, 1, 0, rx=0, tx=0)

    a = pb.region("first region", 0, 0, 2, 2)
    w = a.alloc("M", 44, align=4)          # same name as a parameter
    b = a.alloc("buf.1", 20, align=4)      # not an identifier; address not 8-aligned
    c = a.alloc("c", 16, at=4096)
    a.alloc("empty", 0)
    a.load("h.0.w", w, "f16", (2, 6), row=(0, 1, 0), col=0, order="C")
    a.load("ext", c, "bf16", (2, 2), row=(5, 0, 1), col=(3, 1, 0), rect=(1, 0, 1, 2))
    a.init(b, "bf16", [1.0, FBits(0x7FC1), FBits(0xFF80), -0.0])
    a.init(b + 8, "f16", [0.1, FBits(0x7E01), 65504.0, 2 ** -24], rect=(0, 1, 2, 1))
    a.init(c, "f32", [FBits(0x7FC00001), -0.0, float("inf"), 1.401298464324817e-45])
    a.piece("x", b, "f16", (1, 6), row=(0, 1, 0), col=0, rect=(0, 0, 1, 2))
    a.label("M")
    a.fli("f0", float("nan"))
    a.label("X")
    a.label("X2")
    a.fli("f1", FBits(0xFFC12345))
    a.label("a.b")
    a.fli("f2", -0.0)
    a.fli("f3", float("-inf"))
    a.fli("f4", 1 / 3)
    a.fli("f5", FBits(0x00000001))
    a.beq("r1", "r2", "M")
    a.bne("X", "GY", "X")
    a.blt("r3", "r4", "a.b")
    a.bge("r5", "r6", 3)
    a.jmp("end")
    a.label("end")
    a.halt()
    a.label("after")

    z = pb.region("z", 4, 0, 1, 4)
    y = z.alloc("y", 16)
    z.piece("out", y, "f32", (1, 1), row=(0, 1, 0), col=0)
    z.piece("x", y, "f16", (1, 6), row=(1, 0, 0), col=0, rect=(0, 3, 1, 1))
    z.dmem("d0", "f32", y, 4)
    z.vmov("d1", "d0")
    z.halt()
    return pb.build()


def test_awkward_program(tmp_path):
    text = _round_trip(_awkward_program(), tmp_path)
    for expected in ('.alloc "M", 44\n', '.alloc "buf.1", 20, at=', '.label "a.b"',
                     "fli f0, nan", "fli f1, fbits(0xffc12345)", "fli f2, -0.0",
                     "fli f3, -inf", 'beq r1, r2, "M"', 'bne X, GY, "X"', "bge r5, r6, 3",
                     '.region "first region"', 'safetensors="weights/model.safetensors"',
                     'file="prog.b16.npy", dtype=bf16', ".param DT = bf16", "after:"):
        assert expected in text, expected


def _random_program(seed: int):
    rng = np.random.default_rng(seed)
    ranges = {"ireg": (0, 22), "iregw": (0, 16), "freg": (0, 16), "dreg": (0, 16),
              "dtype": (0, 3), "color": (0, 24), "imm": (-(1 << 31), 1 << 31),
              "u16": (0, 1 << 16), "s16": (-(1 << 15), 1 << 15)}
    pb = ProgramBuilder(f"random{seed}")
    for r in range(int(rng.integers(1, 4))):
        rb = pb.region(f"r{r}", 3 * r, 0, int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        n = int(rng.integers(1, 40))
        for i in range(n):
            ins = INSTRUCTIONS[int(rng.integers(len(INSTRUCTIONS)))]
            values = {}
            for name, kind, _ in ins.operands:
                if kind == "target":
                    values[name] = int(rng.integers(0, n))
                elif kind == "fimm":
                    values[name] = FBits(int(rng.integers(0, 1 << 32)))
                else:
                    values[name] = int(rng.integers(*ranges[kind]))
            rb.emit(ins.mnemonic, *values.values())
            if rng.random() < 0.2:
                rb.label(f"L{i}")
        rb.alloc("a", int(rng.integers(0, 100)), align=int(2 ** rng.integers(0, 7)))
    return pb.build()


@pytest.mark.parametrize("seed", range(6))
def test_random_programs(tmp_path, seed):
    _round_trip(_random_program(seed), tmp_path)


def test_encoded_words_survive_unchanged(tmp_path):
    p = _random_program(11)
    path = disassemble(p, str(tmp_path), "w")
    again = assemble_file(path)
    assert [r.code for r in again.regions] == [r.code for r in p.regions]


def test_partial_edge_tiles_round_trip(tmp_path):
    # an LM-head-like split: 10 rows in tiles of 4 leaves a 2-row last tile
    pb = ProgramBuilder("edge")
    pb.tensor("W", np.arange(30, dtype=np.float32).reshape(10, 3))
    pb.output("y", "f32", [10])
    rb = pb.region("r", 0, 0, 3, 1)
    rb.load("W", rb.alloc("w", 48), "f32", (4, 3), row=(0, 0, 1), order="F")
    rb.piece("y", rb.alloc("y", 16), "f32", (4, 1), row=(0, 0, 1))
    rb.halt()
    program = pb.build()
    again = binfmt.loads(binfmt.dumps(program))
    assert again == program
    text = _round_trip(program, tmp_path, "edge")
    assert ".piece y," in text


def test_i32_pieces_loads_and_inits_round_trip(tmp_path):
    # what the compiler emits for input_ids / position_ids
    pb = ProgramBuilder("ids")
    pb.tensor("pos", np.arange(4, dtype=np.int32))
    pb.input("ids", "i32", [4])
    rb = pb.region("r", 0, 0, 1, 1)
    buf = rb.alloc("buf", 48)
    rb.piece("ids", buf, "i32", (4, 1))
    rb.load("pos", buf + 16, "i32", (4, 1))
    rb.init(buf + 32, "i32", [-1, 7])
    rb.halt()
    _round_trip(pb.build(), tmp_path, "ids")

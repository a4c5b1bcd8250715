"""ProgramBuilder: same Programs as the assembler, validation at build(), conversions."""

import inspect
from pathlib import Path

import numpy as np
import pytest

from wse_emu.isa import binfmt
from wse_emu.isa.asm import assemble_file
from wse_emu.isa.builder import Addr, ProgramBuilder, RegionBuilder, port_mask, tensor_from_array
from wse_emu.isa.encoding import decode, float_bits
from wse_emu.isa.errors import BuildError
from wse_emu.isa.program import DIR_BITS

GEMV = Path(__file__).parent / "data" / "gemv.wsa"


def _gemv_by_hand(w: np.ndarray) -> "Program":
    M = K = 512
    P = Q = 8
    MT, KT = M // P, K // Q
    pb = ProgramBuilder("gemv")
    for name, value in (("M", M), ("K", K), ("P", P), ("Q", Q), ("DT", "f32")):
        pb.param(name, value)
    pb.tensor("W", w)
    pb.input("x", "f32", [K])
    pb.output("y", "f32", [M])
    pb.route(0, 0, Q, 1, 0, rx="RAMP", tx="S")
    pb.route(0, 1, Q, P - 2, 0, rx=["N"], tx="S|RAMP")
    pb.route(0, P - 1, Q, 1, 0, rx=DIR_BITS["N"], tx="RAMP")
    for c in range(Q):
        pb.route(c, 0, 1, P, 1 + c % 2, rx="RAMP", tx="E")
    rb = pb.region("grid", 0, 0, Q, P)
    wbuf = rb.alloc("wbuf", MT * KT * 4)
    xbuf = rb.alloc("xbuf", KT * 4)
    ybuf = rb.alloc("ybuf", MT * 4)
    rb.load("W", wbuf, "f32", (MT, KT), row=(0, 1, 0), col=(0, 0, 1), order="F")
    rb.piece("x", xbuf, "f32", (KT, 1), row=(0, 0, 1), col=0, rect=(0, 0, Q, 1))
    rb.piece("y", ybuf, "f32", (MT, 1), row=(0, 1, 0), col=0, rect=(Q - 1, 0, 1, P))
    rb.dmem("d0", "f32", wbuf, MT)
    rb.d2d(0, KT, MT)
    rb.dmem("d1", "f32", xbuf, KT)
    rb.dmem(2, 0, ybuf, MT)
    rb.bne("Y", "r0", "recv_x")
    rb.dfout("d3", "f32", 0, KT)
    rb.vmov("d3", "d1")
    rb.jmp("compute")
    rb.label("recv_x")
    rb.dfin("d3", "f32", 0, KT)
    rb.vmov("d1", "d3")
    rb.label("compute")
    rb.mv("d2", "d0", "d1")
    rb.halt()
    return pb.build()


def test_builder_and_assembler_give_the_same_program(tmp_path):
    w = np.random.default_rng(1).standard_normal((512, 512)).astype(np.float32)
    np.save(tmp_path / "W.npy", w)
    by_hand = _gemv_by_hand(w)
    assembled = assemble_file(str(GEMV), data_files={"W": str(tmp_path / "W.npy")})
    assert by_hand == assembled
    assert binfmt.dumps(by_hand) == binfmt.dumps(assembled)


def test_instruction_methods_come_from_the_table():
    assert "vadd d, a, b:" in RegionBuilder.vadd.__doc__
    assert list(inspect.signature(RegionBuilder.dmem).parameters)[1:5] == ["d", "t", "addr", "len"]
    assert hasattr(RegionBuilder, "and_") and hasattr(RegionBuilder, "or_")
    pb = ProgramBuilder("p")
    rb = pb.region("r", 0, 0, 1, 1)
    rb.and_("r1", "r2", 3)
    rb.or_(4, "X", "GY")
    rb.emit("fli", "f2", 0.5)
    rb.halt()
    code = [decode(w) for w in pb.build().regions[0].code]
    assert [(i.mnemonic, v) for i, v in code[:2]] == [("and", {"d": 1, "a": 2, "b": 3}),
                                                      ("or", {"d": 4, "a": 16, "b": 21})]
    assert code[2][1]["v"] == 0.5


def test_addr_arithmetic_resolves_at_build():
    pb = ProgramBuilder("p")
    rb = pb.region("r", 0, 0, 1, 1)
    buf = rb.alloc("buf", 64, align=32)
    assert isinstance(buf + 4, Addr) and "buf" in repr(2 * buf - 1)
    with pytest.raises(BuildError, match="known only at build"):
        buf.resolve()
    rb.li("r1", buf + 4)
    rb.li("r2", (buf + 8) // 2 - buf)
    rb.init(buf + 8, "f32", [1.0])
    rb.halt()
    p = pb.build()
    assert p.regions[0].allocs[0].addr == 32  # 3 instructions = 24 bytes, aligned up to 32
    assert decode(p.regions[0].code[0])[1]["v"] == 36
    assert decode(p.regions[0].code[1])[1]["v"] == (40 // 2) - 32
    assert p.data[0].tilemap.addr == 40


def _one_region(**kwargs):
    pb = ProgramBuilder("p")
    return pb, pb.region("r", 0, 0, 2, 1, **kwargs)


def test_errors_carry_the_callers_location():
    pb, rb = _one_region()
    rb.jmp("missing", loc=("f.wsa", 3, 5))
    rb.halt()
    with pytest.raises(BuildError) as info:
        pb.build()
    assert str(info.value) == "f.wsa:3:5: region 'r': unknown label 'missing'"
    assert info.value.loc == ("f.wsa", 3, 5)
    with pytest.raises(BuildError, match="^g:1:2: vadd: operand 'a' must be a descriptor"):
        rb.vadd("d0", "r1", "d2", loc=("g", 1, 2))


@pytest.mark.parametrize("make, message", [
    (lambda pb, rb: (rb.halt(), pb.region("s", 1, 0, 1, 1).halt()),
     "region 's' overlaps region 'r'"),
    (lambda pb, rb: (pb.input("x", "f32", [4]), rb.halt()), "input 'x' has no pieces"),
    (lambda pb, rb: (pb.output("y", "f32", [4]), rb.piece("y", rb.alloc("b", 16), "f32", (4, 1),
                                                          row=(0, 0, 1)), rb.halt()),
     "do not fit output 'y'"),
    (lambda pb, rb: (pb.tensor("T", np.zeros((3, 3), np.float32)),
                     rb.load("T", rb.alloc("b", 64), "f32", (2, 2), row=2), rb.halt()),
     "tiles of 2 x 2 with tile indices rows 2..2, cols 0..0 do not fit tensor 'T' \\(3 x 3\\): "
     "its tile grid is 2 x 2"),
    (lambda pb, rb: (rb.li("r1", 1), rb.jmp(9)), "jmp target 9 is outside the code"),
    (lambda pb, rb: (rb.init(4, "f32", [1.0]), rb.halt()), "address 4 overlaps the code"),
    (lambda pb, rb: (rb.init(10, "f32", [1.0]), rb.halt()), "address 10 is not a multiple of 4"),
    (lambda pb, rb: None, "region 'r': no instructions"),
    (lambda pb, rb: (rb.alloc("a", 8, at=0), rb.halt()), "alloc 'a' at 0 overlaps the code"),
    (lambda pb, rb: (pb.tensor("T", np.zeros(2)), pb.tensor("T", np.zeros(2)), rb.halt()),
     "tensor 'T': name is empty or duplicate"),
])
def test_build_validates(make, message):
    pb, rb = _one_region()
    make(pb, rb)
    with pytest.raises(BuildError, match=message):
        pb.build()


@pytest.mark.parametrize("call, message", [
    (lambda pb, rb: rb.label("a") or rb.label("a"), "duplicate label 'a'"),
    (lambda pb, rb: rb.alloc("a", 8, align=3), "alignment 3 is not a power of two"),
    (lambda pb, rb: rb.load("T", 64, "f64", (1, 1)), "dtype must be one of f32, f16, bf16"),
    (lambda pb, rb: rb.load("T", 64, "f32", (0, 1)), "tile rows must be an integer >= 1"),
    (lambda pb, rb: rb.init(64, "f16", [1e6]), "value 0 .* is out of range for f16"),
    (lambda pb, rb: rb.init(64, "f32", []), "at least one value"),
    (lambda pb, rb: rb.emit("vadd", 0, 1), "vadd takes 3 operands"),
    (lambda pb, rb: rb.li("f1", 3), "must be a writable integer register"),
    (lambda pb, rb: pb.param("M", 1.5), "must be an integer or a dtype name"),
    (lambda pb, rb: pb.param("r1", 1), "parameter name 'r1'"),
    (lambda pb, rb: pb.meta("k", {1, 2}), "not a JSON value"),
    (lambda pb, rb: pb.tensor("E", file="m.safetensors"), "needs shape and dtype"),
    (lambda pb, rb: pb.tensor("E"), "has no data"),
    (lambda pb, rb: pb.input("x", "f64", [4]), "dtype must be one of"),
    (lambda pb, rb: pb.route(0, 0, 1, 1, 0, rx="Q", tx="E"), "unknown port 'Q'"),
])
def test_calls_are_checked_immediately(call, message):
    pb, rb = _one_region()
    with pytest.raises(BuildError, match=message):
        call(pb, rb)


def test_port_masks():
    assert port_mask("E|RAMP", "tx") == DIR_BITS["E"] | DIR_BITS["RAMP"]
    assert port_mask(["N", "S"], "tx") == DIR_BITS["N"] | DIR_BITS["S"]
    assert port_mask(5, "rx") == 5
    with pytest.raises(BuildError, match="outside 0..31"):
        port_mask(32, "rx")


def test_tensor_conversions():
    x = np.array([[1.0, -2.5, 1 / 3]], dtype=np.float64)
    assert tensor_from_array("a", x).data == x.astype("<f4").tobytes()
    assert tensor_from_array("a", x, "f16").data == x.astype("<f4").astype("<f2").tobytes()
    bf16 = tensor_from_array("a", x, "bf16")
    assert bf16.dtype == "bf16" and bf16.shape == (1, 3)
    expected = b"".join(float_bits(float(v), "bf16").to_bytes(2, "little")
                        for v in x.astype(np.float32).ravel())
    assert bf16.data == expected
    assert tensor_from_array("i", np.arange(3)).data == np.arange(3, dtype="<i4").tobytes()
    with pytest.raises(BuildError, match="do not fit int32"):
        tensor_from_array("i", np.array([1 << 40]))
    with pytest.raises(BuildError, match="uint16 arrays need dtype='bf16'"):
        tensor_from_array("u", np.zeros(2, np.uint16))
    raw = tensor_from_array("u", np.array([0x3F80], np.uint16), "bf16")
    assert raw.data == b"\x80\x3f"


def test_external_tensor_reference():
    pb, rb = _one_region()
    pb.tensor("E", shape=(8, 4), file="m.safetensors", dtype="f16")
    rb.load("E", rb.alloc("b", 64), "f16", (4, 4), row=(0, 0, 1))
    rb.halt()
    t = pb.build().tensors[0]
    assert (t.file, t.key, t.dtype, t.shape, t.data) == ("m.safetensors", "E", "<f2", (8, 4), None)


def test_i32_pieces_loads_and_inits_by_name():
    pb, rb = _one_region()
    pb.tensor("pos", np.arange(4, dtype=np.int32))
    pb.input("ids", "i32", [4])
    buf = rb.alloc("buf", 64)
    rb.piece("ids", buf, "i32", (4, 1))
    rb.load("pos", buf + 16, "i32", (4, 1))
    rb.init(buf + 32, "i32", [-1, 7, np.int32(-(1 << 31)), (1 << 31) - 1])
    rb.halt()
    p = pb.build()
    assert p.symbols[0].pieces[0].dtype == p.data[0].tilemap.dtype == 3  # spec STORAGE i32
    inline = p.data[1]
    assert inline.tilemap.dtype == 3 and inline.tilemap.tile == (4, 1)
    assert np.frombuffer(inline.inline, "<i4").tolist() == [-1, 7, -(1 << 31), (1 << 31) - 1]


@pytest.mark.parametrize("values, message", [
    ([1, 2.5], "value 1 must be an integer for i32, got 2.5"),
    ([3.0], "value 0 must be an integer for i32"),
    ([True], "value 0 must be an integer for i32"),
    ([1 << 31], "value 0 .* is out of range for i32"),
])
def test_i32_init_refuses_non_integers(values, message):
    _pb, rb = _one_region()
    with pytest.raises(BuildError, match=message):
        rb.init(64, "i32", values, loc=("f", 1, 1))


def test_instructions_still_refuse_i32():
    _pb, rb = _one_region()
    with pytest.raises(BuildError, match="operand 't' must be one of f32, f16, bf16, got 'i32'"):
        rb.dmem("d0", "i32", 64, 4)


def test_edge_tiles_may_run_past_the_tensor():
    pb, rb = _one_region()
    pb.tensor("T", np.zeros((5, 3), np.float32))
    pb.output("y", "f32", [5])
    rb.load("T", rb.alloc("w", 64), "f32", (3, 3), row=(0, 0, 1))   # rows 0..2, 3..5 of 5
    rb.piece("y", rb.alloc("y", 16), "f32", (3, 1), row=(0, 0, 1))
    rb.halt()
    assert pb.build().data[0].tilemap.tile == (3, 3)


def test_edge_tile_coverage_is_still_checked():
    pb, rb = _one_region()
    pb.output("y", "f32", [5])
    rb.piece("y", rb.alloc("y", 16), "f32", (3, 1), row=(1, 0, 0), rect=(0, 0, 1, 1))
    rb.halt()
    with pytest.raises(BuildError, match=r"output 'y': element \(0, 0\) of its 5 x 1 view"):
        pb.build()

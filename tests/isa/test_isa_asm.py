"""The assembly language: directives, expressions, blocks, operands and data binding."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wse_emu.isa.asm import assemble, assemble_file
from wse_emu.isa.encoding import decode, float_bits
from wse_emu.isa.program import DIR_BITS, Rect

GEMV = Path(__file__).parent / "data" / "gemv.wsa"


def _code(program, region=0):
    return [decode(w) for w in program.regions[region].code]


def _region(body: str, rect="0, 0, 1, 1") -> str:
    return f".region r, {rect}\n{body}\n    halt\n.endregion\n"


@pytest.fixture
def gemv_data(tmp_path):
    w = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    np.save(tmp_path / "W.npy", w)
    return w, str(tmp_path / "W.npy")


def test_gemv_example(gemv_data):
    w, path = gemv_data
    p = assemble_file(str(GEMV), data_files={"W": path})
    assert p.name == "gemv"
    assert p.params == (("M", 512), ("K", 512), ("P", 8), ("Q", 8), ("DT", "f32"))
    region = p.regions[0]
    assert region.rect == Rect(0, 0, 8, 8) and len(region.code) == 12
    # allocs follow the 12-instruction (96-byte) code, 8-aligned, in order
    assert [(a.name, a.addr, a.nbytes) for a in region.allocs] == \
        [("wbuf", 96, 64 * 64 * 4), ("xbuf", 96 + 16384, 256), ("ybuf", 96 + 16384 + 256, 256)]
    assert region.labels == (("recv_x", 8), ("compute", 10))
    assert [ins.mnemonic for ins, _ in _code(p)][4:8] == ["bne", "dfout", "vmov", "jmp"]
    assert _code(p)[4][1] == {"a": 17, "b": 0, "t": 8}
    assert _code(p)[0][1] == {"d": 0, "t": 0, "addr": 96, "len": 64}
    assert len(p.routes) == 3 + 8
    assert [r.color for r in p.routes[3:]] == [1, 2] * 4
    assert p.routes[1].rx == DIR_BITS["N"] and p.routes[1].tx == DIR_BITS["S"] | DIR_BITS["RAMP"]
    (load,) = p.data
    assert load.tensor == "W" and load.tilemap.order == "F"
    assert (load.tilemap.row_dy, load.tilemap.row_dx, load.tilemap.col_dy,
            load.tilemap.col_dx) == (1, 0, 0, 1)
    assert p.tensors[0].data == w.tobytes() and p.tensors[0].dtype == "<f4"
    x, y = p.symbols
    assert x.pieces[0].rect == Rect(0, 0, 8, 1) and x.pieces[0].row_dx == 1
    assert y.pieces[0].rect == Rect(7, 0, 1, 8) and y.pieces[0].row_dy == 1


def test_defines_override_params(tmp_path):
    np.save(tmp_path / "W.npy", np.ones((256, 128), dtype=np.float32))
    p = assemble_file(str(GEMV), defines={"M": "256", "K": "M / 2", "P": "4", "Q": "2 * 2",
                                          "DT": "f16"},
                      data_files={"W": str(tmp_path / "W.npy")})
    assert p.params == (("M", 256), ("K", 128), ("P", 4), ("Q", 4), ("DT", "f16"))
    assert p.regions[0].rect == Rect(0, 0, 4, 4)
    assert p.data[0].tilemap.tile == (64, 32) and p.data[0].tilemap.dtype == 1
    assert _code(p)[0][1]["t"] == 1  # dmem d0, DT, ...
    assert len(p.routes) == 3 + 4


@pytest.mark.parametrize("expr", [
    "7 / 2", "-7 / 2", "-7 % 3", "7 % -3", "1 << 10 | 3", "0xF0 >> 4 ^ 5", "~5 & 0xFF",
    "2 + 3 * 4 - 1", "(2 + 3) * 4", "min(3, -2, 9)", "max(1, 2) + abs(-4)", "0b101 + 0o17",
    "3 < 4", "3 >= 4", "1 == 1 and 0", "0 or 2 > 1", "not 0", "! 3", "5 != 5 || 1 && 1",
    "-(3 - 10)", "+4",
])
def test_integer_expressions(expr):
    python = expr.replace("/", "//").replace("&&", " and ").replace("||", " or ")
    python = python.replace("! ", " not ")
    expected = int(eval(python))  # the test's oracle; the assembler never evals
    p = assemble(_region(f"    li r1, {expr}"))
    assert _code(p)[0][1]["v"] == expected


_ops = st.sampled_from(["+", "-", "*", "/", "%", "&", "|", "^", "<<", ">>"])


@st.composite
def _int_expr(draw, depth=0):
    if depth > 3 or draw(st.booleans()):
        return str(draw(st.integers(-50, 50)))
    op = draw(_ops)
    right = draw(_int_expr(depth + 1))
    if op in ("<<", ">>"):
        right = str(draw(st.integers(0, 8)))
    return f"({draw(_int_expr(depth + 1))} {op} {right})"


@settings(max_examples=150, deadline=None)
@given(_int_expr())
def test_random_expressions_agree_with_python(expr):
    try:
        expected = eval(expr.replace("/", "//"))
    except ZeroDivisionError:
        with pytest.raises(Exception, match="division by zero"):
            assemble(_region(f"    li r1, {expr}"))
        return
    if not -(1 << 31) <= expected < 1 << 31:
        return
    assert _code(assemble(_region(f"    li r1, {expr}")))[0][1]["v"] == expected


def test_float_operands():
    src = _region("""
    fli f0, 1/64
    fli f1, -inf
    fli f2, 1e-5
    fli f3, -0.0
    fli f4, nan
    fli f5, fbits(0x7fc00001)
    fli f6, EPS * 2
    fli f7, 3""")
    p = assemble(".set EPS = 0.25\n" + src)
    bits = [w >> 32 for w in p.regions[0].code[:8]]
    assert bits == [float_bits(1 / 64), 0xFF800000, float_bits(1e-5), 0x80000000, 0x7FC00000,
                    0x7FC00001, float_bits(0.5), float_bits(3.0)]


def test_rep_if_and_set():
    src = """
.param N = 3
.region r, 0, 0, 1, 1
.rep i = 0, N
  .rep j = i, N
    .if i == j
        li r1, 100 + i
    .elif j == N - 1
        li r2, 10 * i + j
    .else
        li r3, -1
    .endif
  .endrep
.endrep
.set S = 0
.rep k = 1, 4
.set S = S + k
.endrep
    li r4, S
    halt
.endregion
"""
    got = [(ins.mnemonic, v["d"], v["v"]) for ins, v in _code(assemble(src))[:-1]]
    assert got == [("li", 1, 100), ("li", 3, -1), ("li", 2, 2), ("li", 1, 101), ("li", 2, 12),
                   ("li", 1, 102), ("li", 4, 6)]


def test_labels_targets_and_comments():
    src = """; a comment
# another comment
.region r, 0, 0, 1, 1
start: li r1, 3        ; label and instruction on one line
    jmp end            # forward reference
    .label "odd.name"
    beq r1, r2, "odd.name"
    bne r1, r2, 1 + 1  ; a target may be an absolute index
end:
    halt
.endregion
.meta note = "semicolons ; and # hashes in strings stay"
"""
    p = assemble(src)
    r = p.regions[0]
    assert r.labels == (("start", 0), ("odd.name", 2), ("end", 4))
    targets = [v["t"] for ins, v in _code(p) if "t" in v]
    assert targets == [4, 2, 2]
    assert p.meta == {"note": "semicolons ; and # hashes in strings stay"}


def test_meta_program_name_and_params():
    src = """.program "my prog"
.param A = 4
.param T = bf16
.meta info = {"layers": [1, 2], "ok": true}
.meta "odd key" = 1.5
""" + _region("    nop")
    p = assemble(src, filename="x/y/z.wsa")
    assert p.name == "my prog" and p.params == (("A", 4), ("T", "bf16"))
    assert p.meta == {"info": {"layers": [1, 2], "ok": True}, "odd key": 1.5}
    assert assemble(_region("    nop"), filename="dir/prog.wsa").name == "prog"


def test_init_values_and_rect():
    src = _region("""    .alloc buf, 64
    .init buf, f32, 1.5, -2, 1/3, fbits(0x7fc00001)
    .init buf + 16, f16, 0.1, 65504, -0.0, rect=(1, 0, 1, 2)
    .init buf + 32, bf16, 1, 3.14159""", rect="2, 3, 2, 2")
    p = assemble(src)
    f32, f16, bf16 = p.data
    assert f32.inline == np.array([1.5, -2, 1 / 3], dtype="<f4").tobytes() + \
        (0x7FC00001).to_bytes(4, "little")
    assert f16.inline == np.array([0.1, 65504, -0.0], dtype="<f2").tobytes()
    assert f16.tilemap.rect == Rect(3, 3, 1, 2) and f16.tilemap.tile == (3, 1)
    assert bf16.inline == bytes.fromhex("803f") + bytes.fromhex("4940")
    base = p.regions[0].allocs[0].addr
    assert [d.tilemap.addr for d in p.data] == [base, base + 16, base + 32]


def test_load_rows_and_cols_are_region_relative(tmp_path):
    np.save(tmp_path / "A.npy", np.zeros((8, 6), dtype=np.float32))
    src = """.tensor A, [8, 6], file="A.npy"
.region r, 2, 1, 4, 4
    .alloc buf, 16
    .load A, buf, f32, tile=(2, 2), row=ry, col=rx - 1, rect=(1, 0, 3, 4), order=C
    halt
.endregion
"""
    (tmp_path / "p.wsa").write_text(src)
    tm = assemble_file(str(tmp_path / "p.wsa")).data[0].tilemap
    assert tm.rect == Rect(3, 1, 3, 4) and tm.order == "C"
    for x, y in tm.rect.cells():
        rx, ry = x - 2, y - 1
        assert tm.tile_index(x, y) == (ry, rx - 1)


def test_tensor_sources_and_dtypes(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(6, dtype=np.float64).reshape(2, 3))
    np.save(tmp_path / "b.npy", np.arange(4, dtype=np.int32))
    np.save(tmp_path / "c.npy", np.array([0x3F80, 0x4000], dtype=np.uint16))
    src = """.tensor A, [2, 3], file="a.npy"
.tensor A16, [2, 3], file="a.npy", dtype=f16
.tensor B, [4], file="b.npy"
.tensor C, [2], file="c.npy", dtype=bf16
.tensor D, [3]
.tensor E, [4096, 4096], safetensors="model.safetensors", key="layers.0.w", dtype=bf16
""" + _region("    nop")
    (tmp_path / "t.wsa").write_text(src)
    d = np.array([1, 2, 3], dtype=np.float16)
    p = assemble(src, str(tmp_path / "t.wsa"), data={"D": d}, base_dir=str(tmp_path))
    a, a16, b, c, dd, e = p.tensors
    assert a.dtype == "<f4" and a.data == np.arange(6, dtype="<f4").tobytes()
    assert a16.dtype == "<f2" and a16.data == np.arange(6, dtype="<f2").tobytes()
    assert b.dtype == "<i4" and b.data == np.arange(4, dtype="<i4").tobytes()
    assert c.dtype == "bf16" and c.data == bytes.fromhex("803f0040")
    assert dd.dtype == "<f2" and dd.data == d.tobytes()
    assert (e.file, e.key, e.dtype, e.shape, e.data) == \
        ("model.safetensors", "layers.0.w", "bf16", (4096, 4096), None)
    np.save(tmp_path / "d.npy", d)
    p2 = assemble_file(str(tmp_path / "t.wsa"), data_files={"D": str(tmp_path / "d.npy")})
    assert p2 == p


def test_alloc_alignment_and_explicit_address():
    src = _region("""    .alloc a, 3
    .alloc b, 8, 64
    .alloc c, 4, at=1000
    .alloc d, 4
    li r1, d - c""")
    p = assemble(src)
    assert [(a.name, a.addr) for a in p.regions[0].allocs] == \
        [("a", 16), ("b", 64), ("c", 1000), ("d", 1008)]
    assert _code(p)[0][1]["v"] == 8


def test_and_or_spellings_and_reserved_mnemonics():
    p = assemble(".param A = 1\n.assert A == 1 and A > 0 && not (A < 0) || 0\n"
                 + _region("    and r1, r2, r3\n    or r4, X, GY"))
    (ins_and, v_and), (ins_or, v_or) = _code(p)[:2]
    assert (ins_and.mnemonic, v_and) == ("and", {"d": 1, "a": 2, "b": 3})
    assert (ins_or.mnemonic, v_or) == ("or", {"d": 4, "a": 16, "b": 21})


def test_data_file_json_of_meta_round_trips():
    value = {"a": [1, 2.5, None], "b": "x"}
    p = assemble(f".meta cfg = {json.dumps(value)}\n" + _region("    nop"))
    assert p.meta["cfg"] == value


def test_names_with_interpolated_values():
    src = """.rep k = 0, 2
.set OFF_{k} = 10 * (k + 1)
.endrep
.region r, 0, 0, 1, 1
.rep i = 0, 3
    li r{i + 1}, OFF_{i % 2}
    bne r{i + 1}, r0, skip_{i}
    nop
skip_{i}:
.endrep
    halt
.endregion
"""
    p = assemble(src)
    assert p.regions[0].labels == (("skip_0", 3), ("skip_1", 6), ("skip_2", 9))
    code = _code(p)
    assert [(v["d"], v["v"]) for ins, v in code if ins.mnemonic == "li"] == \
        [(1, 10), (2, 20), (3, 10)]
    assert [v["t"] for ins, v in code if ins.mnemonic == "bne"] == [3, 6, 9]

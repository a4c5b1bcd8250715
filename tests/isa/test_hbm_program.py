"""HBM contents of a Program: buffers, tensor inits and symbol pieces, end to end through the
builder, the assembler, program.bin, the disassembler, `info` and the loader."""

import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from wse_emu.emulator import load as load_mod
from wse_emu.emulator.load import LoadError, load, read_output, write_input, write_inputs
from wse_emu.isa.machine import load_machine
from wse_emu.isa import binfmt
from wse_emu.isa.asm import assemble, assemble_file
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.disasm import disassemble
from wse_emu.isa.errors import AsmError, BuildError, FormatError
from wse_emu.isa.info import describe
from wse_emu.isa.program import HbmAlloc, HbmInit, HbmPiece
from wse_emu.isa.spec import STORAGE_DTYPES

H100 = load_machine("h100")


def _halt(pb, name="r"):
    rb = pb.region(name, 0, 0, 1, 1)
    rb.halt()
    return rb


# ---------------------------------------------------------------------------------------------
# builder


def test_hbm_alloc_places_buffers_from_zero_aligned():
    pb = ProgramBuilder("p")
    assert pb.hbm_alloc("a", 100) == 0
    assert pb.hbm_alloc("b", 10) == 128  # next multiple of 64
    assert pb.hbm_alloc("c", 4, align=4) == 140
    assert pb.hbm_alloc("d", 8, at=4096) == 4096
    assert pb.hbm_alloc("e", 0, align=1) == 4104  # after the highest end so far
    assert pb.hbm_alloc("f", 1, align=1024) == 5120
    _halt(pb)
    p = pb.build()
    assert p.hbm_allocs == (("a", 0, 100), ("b", 128, 10), ("c", 140, 4), ("d", 4096, 8),
                            ("e", 4104, 0), ("f", 5120, 1))
    assert p.hbm_allocs[1].addr == 128 and p.hbm_allocs[1].name == "b"
    assert p.hbm_bytes == 5121
    assert ProgramBuilder("q").hbm_alloc("big", 20 * 10**9) == 0  # beyond 2**31 is fine


@pytest.mark.parametrize("call, match", [
    (lambda pb: pb.hbm_alloc("a", 4, align=3), "alignment 3 is not a power of two"),
    (lambda pb: pb.hbm_alloc("a", -1), "size must be an integer >= 0"),
    (lambda pb: pb.hbm_alloc("", 4), "name must be a non-empty string"),
    (lambda pb: (pb.hbm_alloc("a", 4), pb.hbm_alloc("a", 4)), "'a' is defined twice"),
    (lambda pb: pb.hbm_init("T", 0, "f64"), "dtype must be one of f32, f16, bf16, i32"),
    (lambda pb: pb.hbm_init("T", 0, "f32", order="X"), "order must be 'F' or 'C'"),
    (lambda pb: pb.hbm_init("T", 0, "f32", rows=(3, 3)), r"rows \(3, 3\) is empty"),
    (lambda pb: pb.hbm_init("T", 0, "f32", rows=5), "rows must be \\(start, end\\)"),
    (lambda pb: pb.hbm_init("T", 0, "f32", transpose="yes"), "transpose must be True or False"),
    (lambda pb: pb.hbm_init("T", -8, "f32"), "address must be an integer >= 0"),
    (lambda pb: pb.hbm_piece("x", 0, "f8"), "dtype must be one of"),
])
def test_builder_refuses_bad_arguments_at_the_call(call, match):
    with pytest.raises(BuildError, match=match) as info:
        call(ProgramBuilder("p"))
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# builder == assembler, program.bin and disassembly round trips

SOURCE = """\
.param K = 6
.tensor W, [8, K]
.tensor V, [4]
.input x, f32, [K]
.output y, bf16, [2, 4]
.hbm wbuf, 8 * K * 2
.hbm vbuf, 16, align=16
.hbm xbuf, K * 4
.hbm "y.out", 16, at=4096
.hbm late, 4
.assert vbuf == 96 && xbuf == 128, "vbuf follows wbuf on a 16-byte boundary"
.hbminit W, wbuf, f16, tile_rows=4
.hbminit V, vbuf, f32, order=C, rows=1:4
.hbmpiece x, xbuf, f32
.hbmpiece "y", 4096, bf16
.region r, 0, 0, 1, 1
    li r1, wbuf + 8
    li r2, late
    halt
.endregion
"""


def _source_program(W, V):
    return assemble(SOURCE, "t.wsa", data={"W": W, "V": V})


def _builder_program(W, V):
    pb = ProgramBuilder("t")
    pb.param("K", 6)
    pb.tensor("W", W)
    pb.tensor("V", V)
    pb.input("x", "f32", [6])
    pb.output("y", "bf16", [2, 4])
    wbuf = pb.hbm_alloc("wbuf", 96)
    vbuf = pb.hbm_alloc("vbuf", 16, align=16)
    xbuf = pb.hbm_alloc("xbuf", 24)
    pb.hbm_alloc("y.out", 16, at=4096)
    late = pb.hbm_alloc("late", 4)
    pb.hbm_init("W", wbuf, "f16", tile_rows=4)
    pb.hbm_init("V", vbuf, "f32", order="C", rows=(1, 4))
    pb.hbm_piece("x", xbuf, "f32")
    pb.hbm_piece("y", 4096, "bf16")
    rb = pb.region("r", 0, 0, 1, 1)
    rb.li("r1", wbuf + 8)
    rb.li("r2", late)
    rb.halt()
    return pb.build()


@pytest.fixture
def wv():
    rng = np.random.default_rng(7)
    return (rng.standard_normal((8, 6)).astype(np.float32),
            rng.standard_normal(4).astype(np.float32))


def test_builder_and_assembler_give_equal_programs(wv):
    asm, built = _source_program(*wv), _builder_program(*wv)
    assert asm == built
    assert binfmt.dumps(asm) == binfmt.dumps(built)
    assert asm.hbm_allocs == (("wbuf", 0, 96), ("vbuf", 96, 16), ("xbuf", 128, 24),
                              ("y.out", 4096, 16), ("late", 4160, 4))
    assert asm.hbm_inits == (HbmInit("W", 0, STORAGE_DTYPES["f16"], 4, "F", False, None),
                             HbmInit("V", 96, STORAGE_DTYPES["f32"], 0, "C", False, (1, 4)))
    assert asm.hbm_pieces == (HbmPiece("x", 128, STORAGE_DTYPES["f32"]),
                              HbmPiece("y", 4096, STORAGE_DTYPES["bf16"]))
    assert asm.hbm_bytes == 4164
    assert binfmt.requirements(asm)["hbm_bytes"] == 4164


def test_program_bin_round_trip_keeps_hbm(wv):
    program = _builder_program(*wv)
    blob = binfmt.dumps(program)
    again = binfmt.loads(blob)
    assert again == program and binfmt.dumps(again) == blob
    assert isinstance(again.hbm_allocs[0], HbmAlloc) and again.hbm_inits[1].rows == (1, 4)
    hbm = json.loads(_section(blob, "HBM"))
    assert hbm["allocs"][0] == ["wbuf", 0, 96]
    assert hbm["inits"][1] == {"tensor": "V", "addr": 96, "dtype": STORAGE_DTYPES["f32"],
                               "tile_rows": 0, "order": "C", "transpose": False, "rows": [1, 4]}
    assert hbm["pieces"] == [["x", 128, 0], ["y", 4096, STORAGE_DTYPES["bf16"]]]


def test_addresses_beyond_two_gigabytes_round_trip():
    pb = ProgramBuilder("big")
    pb.input("x", "f32", [4])
    pb.hbm_alloc("weights", 16 * 10**9)
    xbuf = pb.hbm_alloc("x", 16)
    pb.hbm_piece("x", xbuf, "f32")
    _halt(pb)
    program = pb.build()
    assert xbuf == 16 * 10**9 and program.hbm_bytes == 16 * 10**9 + 16
    assert binfmt.loads(binfmt.dumps(program)) == program


def _round_trip(program, tmp_path):
    path = disassemble(program, str(tmp_path / "out"), "prog")
    again = assemble_file(path)
    assert binfmt.dumps(again) == binfmt.dumps(program)
    assert again == program
    return Path(path).read_text()


def test_disassembly_reassembles_byte_identical(wv, tmp_path):
    text = _round_trip(_builder_program(*wv), tmp_path)
    # placements are written as the smallest change from the default that reproduces them
    assert ".hbm wbuf, 96\n.hbm vbuf, 16, align=32\n.hbm xbuf, 24\n" in text
    assert '.hbm "y.out", 16, align=4096\n.hbm late, 4\n' in text
    assert ".hbminit V, 96, f32, order=C, rows=1:4" in text
    assert ".hbmpiece x, 128, f32" in text


def test_disassembly_of_awkward_hbm_names_and_placements(tmp_path):
    rng = np.random.default_rng(1)
    pb = ProgramBuilder("awkward")
    pb.param("N", 3)
    pb.tensor("m.0", rng.standard_normal((4, 6, 2)).astype(np.float16))
    pb.tensor("ids", np.arange(12, dtype=np.int32).reshape(3, 4))
    pb.tensor("ext", shape=(64, 32), file="w.safetensors", key="k", dtype="bf16")
    pb.input("in put", "i32", [5])
    pb.hbm_alloc("N", 3, align=1)          # the name of a parameter
    pb.hbm_alloc("r1", 5, align=1)         # a register name
    pb.hbm_alloc("a.b", 100, align=4)      # not an identifier, unaligned start
    pb.hbm_alloc("buf", 24, at=50000)      # a gap no alignment reproduces
    pb.hbm_alloc("low", 24, at=200)        # below the highest end so far
    pb.hbm_alloc("ext", 64 * 32 * 4)       # same name as a tensor
    pb.hbm_alloc("odd", 7, align=2 ** 20)
    pb.hbm_alloc("lbl", 0)
    pb.hbm_init("m.0", 8, "bf16", tile_rows=2, order="C", transpose=True)
    pb.hbm_init("ids", 50000, "i32", rows=(1, 2))
    pb.hbm_init("ext", 50048, "f32", transpose=True, rows=(8, 24), tile_rows=8)
    pb.hbm_piece("in put", 200, "i32")
    rb = pb.region("r", 0, 0, 1, 1)
    rb.alloc("buf", 8)                     # a region alloc with an HBM buffer's name
    rb.label("lbl")                        # a label with an HBM buffer's name
    rb.li("r2", 5)
    rb.bne("r2", "r0", "lbl")
    rb.halt()
    program = pb.build()
    text = _round_trip(program, tmp_path)
    assert '.hbm "N", 3' in text and '.hbm "r1", 5, align=1' in text
    assert ".hbm buf, 24, at=50000" in text and ".hbm low, 24, at=200" in text
    assert ".hbminit ext, 50048, f32, tile_rows=8, transpose, rows=8:24" in text
    assert '.alloc "buf", 8' in text and 'bne r2, r0, "lbl"' in text


# ---------------------------------------------------------------------------------------------
# check_program refusals


def _checked(build, match):
    """build() refuses the problem in one line pointing at the offending call's loc."""
    pb = ProgramBuilder("p")
    pb.tensor("T", np.arange(24, dtype=np.float32).reshape(6, 4))
    pb.input("x", "f32", [4])
    pb.output("y", "f32", [4])
    build(pb)
    rb = pb.region("r", 0, 0, 1, 1)
    rb.piece("y", 8, "f32", (4, 1))  # in SRAM always; x in SRAM unless given an HBM piece
    if not any(p.symbol == "x" for p, _ in pb._hbm_pieces):
        rb.piece("x", 24, "f32", (4, 1))
    rb.halt()
    with pytest.raises(BuildError, match=match) as info:
        pb.build()
    assert "\n" not in str(info.value) and info.value.loc == ("here", 1, 1)


def _loc(fn, *args, **kwargs):
    return fn(*args, **kwargs, loc=("here", 1, 1))


def _two(pb):
    pb.hbm_alloc("a", 96)
    pb.hbm_alloc("b", 96)  # at 128


@pytest.mark.parametrize("build, match", [
    (lambda pb: (pb.hbm_alloc("a", 100), _loc(pb.hbm_alloc, "b", 8, at=96)),
     r"HBM buffer 'b' overlaps HBM buffer 'a' \(bytes 96..99 are in both\)"),
    (lambda pb: (_two(pb), _loc(pb.hbm_init, "T", 0, "f32", rows=(2, 7))),
     r"HBM init 0 \(tensor 'T'\): rows 2:7 are not inside the 6 x 4 tensor"),
    (lambda pb: (_two(pb), _loc(pb.hbm_init, "T", 0, "f32", transpose=True, rows=(0, 5))),
     "rows 0:5 are not inside the 4 x 6 transposed tensor"),
    (lambda pb: (_two(pb), _loc(pb.hbm_init, "T", 0, "f32", tile_rows=4)),
     "tile_rows 4 does not divide the 6 rows it stores"),
    (lambda pb: (_two(pb), _loc(pb.hbm_init, "T", 2, "f32")),
     r"HBM address 2 is not a multiple of 4 \(f32\)"),
    (lambda pb: (_two(pb), _loc(pb.hbm_init, "T", 64, "f32")),
     "bytes 64..159 are not inside one HBM buffer"),
    (lambda pb: (_two(pb), _loc(pb.hbm_init, "T", 192, "f16")),
     r"bytes 192..239 run past the end of the program's HBM \(224 bytes in its buffers\)"),
    (lambda pb: (_two(pb), _loc(pb.hbm_init, "Q", 0, "f32")), "unknown tensor 'Q'"),
    (lambda pb: (_two(pb), pb.hbm_init("T", 0, "f16", rows=(0, 4)),
                 _loc(pb.hbm_init, "T", 16, "f16", rows=(0, 2))),
     r"HBM init 1 \(tensor 'T'\): bytes 16..31 overlap HBM init 0"),
    (lambda pb: (_two(pb), pb.hbm_init("T", 0, "f32"), _loc(pb.hbm_piece, "x", 80, "f32")),
     r"HBM piece 0 \(symbol 'x'\): bytes 80..95 overlap HBM init 0"),
    (lambda pb: (_two(pb), pb.hbm_piece("x", 128, "f32"), _loc(pb.hbm_init, "T", 128, "f32")),
     r"HBM init 0 \(tensor 'T'\): bytes 128..223 overlap HBM piece 0"),
    (lambda pb: (_two(pb), _loc(pb.hbm_piece, "z", 0, "f32")), "unknown symbol 'z'"),
    (lambda pb: (_two(pb), pb.hbm_piece("x", 0, "f32"), _loc(pb.hbm_piece, "x", 16, "f32")),
     "the symbol has another HBM piece"),
    (lambda pb: (_two(pb), _loc(pb.hbm_piece, "y", 0, "f32")),
     "the symbol also has SRAM pieces"),
    (lambda pb: (_two(pb), _loc(pb.hbm_piece, "x", 94, "f16")),
     "bytes 94..101 are not inside one HBM buffer"),
])
def test_check_program_refusals(build, match):
    _checked(build, match)


def test_hbm_pieces_may_share_bytes_and_outputs_need_no_sram_piece():
    pb = ProgramBuilder("p")
    pb.input("x", "f32", [4])
    pb.output("y", "f32", [4])
    buf = pb.hbm_alloc("io", 16)
    pb.hbm_piece("x", buf, "f32")
    pb.hbm_piece("y", buf, "f32")  # written in place of the input
    _halt(pb)
    assert binfmt.loads(binfmt.dumps(pb.build())).hbm_pieces[1].symbol == "y"
    pb = ProgramBuilder("p")
    pb.output("y", "f32", [4])
    _halt(pb)
    with pytest.raises(BuildError, match="has no pieces .* .hbmpiece"):
        pb.build()


def _section(blob, name):
    pos = binfmt.HEADER.size
    for _ in range(binfmt.HEADER.unpack_from(blob)[3]):
        kind, _, length, _, _ = binfmt.SECTION.unpack_from(blob, pos)
        start = pos + binfmt.SECTION.size
        if binfmt.SECTIONS[kind] == name:
            return blob[start:start + length]
        pos = start + length + (-length % 8)
    raise KeyError(name)


def _with_hbm(blob, doc):
    """blob with its HBM section replaced by the JSON doc (CRC recomputed)."""
    out = bytearray(blob[:binfmt.HEADER.size])
    pos = binfmt.HEADER.size
    for _ in range(binfmt.HEADER.unpack_from(blob)[3]):
        kind, _, length, _, _ = binfmt.SECTION.unpack_from(blob, pos)
        start = pos + binfmt.SECTION.size
        payload = blob[start:start + length]
        if binfmt.SECTIONS[kind] == "HBM":
            payload = json.dumps(doc).encode()
        out += binfmt.SECTION.pack(kind, 0, len(payload), zlib.crc32(payload), 0)
        out += payload + b"\0" * (-len(payload) % 8)
        pos = start + length + (-length % 8)
    return bytes(out)


def test_loads_refuses_a_damaged_hbm_section(wv):
    blob = binfmt.dumps(_builder_program(*wv))
    doc = json.loads(_section(blob, "HBM"))

    def refused(edit, match):
        d = json.loads(json.dumps(doc))
        edit(d)
        with pytest.raises(FormatError, match=match) as info:
            binfmt.loads(_with_hbm(blob, d), where="p.bin")
        assert str(info.value).startswith("p.bin: ") and "\n" not in str(info.value)

    refused(lambda d: d["allocs"][1].__setitem__(1, 90), "HBM buffer 'vbuf' overlaps HBM "
            "buffer 'wbuf'")
    refused(lambda d: d["inits"][0].__setitem__("addr", 1), "address 1 is not a multiple of 2")
    refused(lambda d: d["inits"][0].__setitem__("order", "X"), r"inits\[0\].order: expected")
    refused(lambda d: d["inits"][0].__setitem__("transpose", 1), "expected true or false")
    refused(lambda d: d["inits"][1].__setitem__("rows", [1]), r"inits\[1\].rows: expected a "
            "list of 2")
    refused(lambda d: d["pieces"].append(["nope", 0, 0]), "unknown symbol 'nope'")
    refused(lambda d: d["pieces"].pop(0), "input 'x' has no pieces")
    refused(lambda d: d["allocs"][0].__setitem__(2, 2 ** 48), r"allocs\[0\]\[2\]: expected an "
            "integer")
    refused(lambda d: d.pop("pieces"), "section HBM: HBM: expected an object with keys")
    # the stored requirements record the footprint
    meta = json.loads(_section(blob, "META"))
    assert meta["requirements"]["hbm_bytes"] == 4164


def _leaves(obj, path=()):
    yield path
    children = obj.items() if isinstance(obj, dict) else enumerate(obj) \
        if isinstance(obj, list) else ()
    for key, value in children:
        yield from _leaves(value, path + (key,))


def test_hbm_schema_damage_never_escapes_as_another_exception(wv):
    blob = binfmt.dumps(_builder_program(*wv))
    payload = _section(blob, "HBM")
    for path in list(_leaves(json.loads(payload)))[1:]:
        for bad in (None, -1, 2 ** 50, 1.5, "", "x", True, [], {}, [0, 1]):
            doc = json.loads(payload)
            target = doc
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = bad
            try:
                binfmt.loads(_with_hbm(blob, doc))
            except FormatError as e:
                assert "\n" not in str(e)


# ---------------------------------------------------------------------------------------------
# assembler errors


def _asm_error(src, **kwargs):
    with pytest.raises(AsmError) as info:
        assemble(src, "t.wsa", **kwargs)
    text = str(info.value)
    assert "\n" not in text
    return text


R = ".region r, 0, 0, 1, 1\n    halt\n.endregion\n"


@pytest.mark.parametrize("src, expected", [
    (".region r, 0, 0, 1, 1\n    .hbm a, 4\n    halt\n.endregion\n",
     "t.wsa:2:5: .hbm is not allowed inside a .region"),
    (".hbm a, 4, align=3\n" + R, "t.wsa:1:6: HBM buffer 'a': alignment 3 is not a power of two"),
    (".hbm a, 4, at=-1\n", "t.wsa:1:15: HBM buffer address must be at least 0"),
    (".hbm a, 4, size=3\n", "t.wsa:1:12: .hbm has no argument size= (allowed: align=, at=)"),
    (".param a = 1\n.hbm a, 4\n", "t.wsa:2:6: duplicate name 'a': already a parameter"),
    (".hbm a, 4\n.set a = 2\n", "t.wsa:2:6: duplicate name 'a': already an HBM buffer"),
    (".hbm a, 4\n.region r, 0, 0, 1, 1\n    .alloc a, 4\n    halt\n.endregion\n",
     "t.wsa:3:12: duplicate name 'a': already an HBM buffer"),
    (".hbm r1, 4\n", "t.wsa:1:6: 'r1' is reserved"),
    (".hbm a, 4\n.hbm \"a\", 4\n", "t.wsa:2:6: HBM buffer 'a' is defined twice"),
    (".tensor T, [4]\n.hbm a, 16\n.hbminit T, a, f32, rows=2\n" + R,
     "t.wsa:3:26: rows= must be START:END"),
    (".tensor T, [4]\n.hbm a, 16\n.hbminit T, a, f32, rows=:2\n" + R,
     "t.wsa:3:26: expected a value before ':'"),
    (".tensor T, [4]\n.hbm a, 16\n.hbminit T, a, f32, transpose, transpose\n" + R,
     "t.wsa:3:32: transpose given twice"),
    (".tensor T, [4]\n.hbm a, 16\n.hbminit T, a, f32, order=X\n" + R,
     "t.wsa:3:27: order must be F (column-major) or C (row-major)"),
    (".tensor T, [4]\n.hbm a, 16\n.hbminit T, a, f32, tile_rows=3\n" + R,
     "t.wsa:3:1: HBM init 0 (tensor 'T'): tile_rows 3 does not divide the 4 rows"),
    (".tensor T, [4]\n.hbm a, 16\n.hbminit T, b, f32\n" + R, "t.wsa:3:13: undefined name 'b'"),
    (".tensor T, [4]\n.hbm a, 8\n.hbminit T, a, f32\n" + R,
     "t.wsa:3:1: HBM init 0 (tensor 'T'): bytes 0..15 run past the end"),
    (".input x, f32, [4]\n.hbm a, 8\n.hbmpiece x, a, f64\n" + R,
     "t.wsa:3:17: dtype must be one of f32, f16, bf16, i32, got f64"),
    (".input x, f32, [4]\n.hbm a, 16\n.hbmpiece x, a, f32, 5\n" + R,
     "t.wsa:3:22: .hbmpiece takes symbol, addr, dtype, got 4 argument(s)"),
    (".hbm a, 16\n.hbmpiece x, a, f32\n" + R,
     "t.wsa:2:1: HBM piece 0 (symbol 'x'): unknown symbol 'x'"),
])
def test_assembler_errors(src, expected):
    data = {"T": np.zeros(4, np.float32)} if ".tensor T" in src else None
    assert _asm_error(src, data=data).startswith(expected)


def test_hbm_names_are_integers_everywhere_in_expressions():
    program = assemble(".hbm a, 100\n.hbm b, 8\n.if b == 128\n.hbm c, 4, align=b\n.endif\n"
                       ".rep i = 0, 2\n.hbm buf_{i}, 8\n.endrep\n"
                       ".region r, 0, 0, 1, 1\n    li r1, c + buf_1\n    halt\n.endregion\n")
    assert program.hbm_allocs == (("a", 0, 100), ("b", 128, 8), ("c", 256, 4),
                                  ("buf_0", 320, 8), ("buf_1", 384, 8))


# ---------------------------------------------------------------------------------------------
# loader: HBM contents


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """PyTorch's rounding to bf16, as an independent reference (the test skips without it)."""
    torch = pytest.importorskip("torch")
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16) \
        .view(torch.int16).numpy().view(np.uint16)


def _expected_bytes(s: np.ndarray, tile_rows: int, order: str, dtype: str) -> np.ndarray:
    """Reference layout, tile by tile: each tile of tile_rows rows, column-major for F."""
    tr = tile_rows or s.shape[0]
    parts = []
    for t in range(s.shape[0] // tr):
        tile = s[t * tr:(t + 1) * tr]
        parts.append((tile.T if order == "F" else tile).reshape(-1))
    flat = np.concatenate(parts)
    if dtype == "bf16":
        return _bf16_bits(flat.astype(np.float32)).view(np.uint8)
    return flat.astype({"f32": np.float32, "f16": np.float16, "i32": np.int32}[dtype]) \
        .view(np.uint8)


def _init_program(tensor, tensor_dtype=None, **init):
    pb = ProgramBuilder("h")
    pb.tensor("T", tensor, dtype=tensor_dtype)
    pb.hbm_alloc("pad", 24)
    addr = pb.hbm_alloc("w", 1 << 16)
    pb.hbm_init("T", addr, **init)
    _halt(pb)
    return pb.build(), addr


LAYOUTS = [dict(tile_rows=tr, order=o, transpose=t, rows=rows)
           for tr, rows in ((0, None), (4, None), (2, (2, 8)), (3, (3, 6)), (1, (5, 6)))
           for o in ("F", "C") for t in (False, True)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "-".join(map(str, d.values())))
def test_loader_fills_hbm_as_numpy_lays_it_out(layout):
    rng = np.random.default_rng(11)
    t = rng.standard_normal((8, 12) if layout["transpose"] else (12, 8)).astype(np.float32)
    s = t.T if layout["transpose"] else t  # S is 12 x 8 either way
    if layout["rows"]:
        s = s[layout["rows"][0]:layout["rows"][1]]
    for dtype in ("f32", "f16", "bf16"):
        program, addr = _init_program(t, dtype=dtype, **layout)
        hbm = load(program, H100).hbm
        want = _expected_bytes(s, layout["tile_rows"], layout["order"], dtype)
        assert hbm.size == program.hbm_bytes
        assert np.array_equal(hbm[addr:addr + want.size], want), dtype
        assert not hbm[:addr].any() and not hbm[addr + want.size:].any()


@pytest.mark.parametrize("shape", [(24,), (2, 3, 4)])
def test_loader_uses_the_2d_view_of_other_ranks(shape):
    t = np.arange(np.prod(shape), dtype=np.int32).reshape(shape) - 7
    program, addr = _init_program(t, dtype="i32", tile_rows=2, order="F")
    hbm = load(program, H100).hbm
    s = t.reshape(-1, 1) if len(shape) == 1 else t.reshape(-1, shape[-1])
    want = _expected_bytes(s, 2, "F", "i32")
    assert np.array_equal(hbm[addr:addr + want.size], want)


def test_loader_converts_bf16_and_f16_sources():
    bits = _bf16_bits(np.linspace(-3, 3, 24, dtype=np.float32)).reshape(4, 6)
    program, addr = _init_program(bits, "bf16", dtype="bf16", order="C")  # raw bits kept
    hbm = load(program, H100).hbm
    assert np.array_equal(hbm[addr:addr + 48].view(np.uint16), bits.reshape(-1))
    wide = bits.astype(np.uint32) << 16
    program, addr = _init_program(bits, "bf16", dtype="f32", order="F", tile_rows=2)
    hbm = load(program, H100).hbm
    f32 = wide.view(np.float32)
    assert np.array_equal(hbm[addr:addr + 96], _expected_bytes(f32, 2, "F", "f32"))
    half = np.linspace(-1, 1, 12, dtype=np.float16).reshape(3, 4)
    program, addr = _init_program(half, dtype="f32", transpose=True)
    hbm = load(program, H100).hbm
    assert np.array_equal(hbm[addr:addr + 48], _expected_bytes(half.T.astype(np.float32), 0,
                                                                "F", "f32"))


@pytest.mark.parametrize("chunk", [1, 5, 24, 97])
@pytest.mark.parametrize("layout", [dict(tile_rows=0, order="F"), dict(tile_rows=3, order="F"),
                                    dict(tile_rows=0, order="C"),
                                    dict(tile_rows=6, order="F", transpose=True, rows=(2, 14))])
def test_chunked_filling_matches(monkeypatch, chunk, layout):
    """Large tensors are converted in chunks; any chunk size gives the same bytes."""
    monkeypatch.setattr(load_mod, "HBM_CHUNK", chunk)
    shape = (10, 18) if layout.get("transpose") else (18, 10)
    t = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    s = t.T if layout.get("transpose") else t
    if layout.get("rows"):
        s = s[layout["rows"][0]:layout["rows"][1]]
    program, addr = _init_program(t, dtype="f16", **layout)
    want = _expected_bytes(s, layout["tile_rows"], layout["order"], "f16")
    assert np.array_equal(load(program, H100).hbm[addr:addr + want.size], want)


def test_external_safetensors_tensor_is_loaded_into_hbm(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    w = torch.randn(16, 8).to(torch.bfloat16)
    save_file({"layers.0.w": w}, str(tmp_path / "m.safetensors"))
    pb = ProgramBuilder("ext")
    pb.tensor("w", shape=(16, 8), file="m.safetensors", key="layers.0.w", dtype="bf16")
    addr = pb.hbm_alloc("w", 16 * 8 * 2)
    pb.hbm_init("w", addr, "bf16", tile_rows=4, transpose=True, rows=(0, 8))
    _halt(pb)
    hbm = load(pb.build(), H100, base_dir=str(tmp_path)).hbm
    bits = w.view(torch.int16).numpy().view(np.uint16)
    s = bits.T[0:8]
    want = np.concatenate([s[k:k + 4].T.reshape(-1) for k in range(0, 8, 4)])
    assert np.array_equal(hbm[addr:addr + 256].view(np.uint16), want)


def test_timing_only_load_has_no_hbm_contents():
    program, _ = _init_program(np.ones((4, 4), np.float32), dtype="f32")
    loaded = load(program, H100, with_data=False)
    assert loaded.hbm.size == 0 and loaded.hbm.dtype == np.uint8
    assert load(program, H100).hbm.size == program.hbm_bytes


def test_a_program_without_hbm_loads_anywhere():
    pb = ProgramBuilder("none")
    _halt(pb)
    loaded = load(pb.build(), load_machine("tiny"))
    assert loaded.hbm.size == 0


def test_capacity_refusal():
    pb = ProgramBuilder("big")
    pb.hbm_alloc("weights", 16_060_000_000)
    _halt(pb)
    program = pb.build()
    with pytest.raises(LoadError) as info:
        load(program, load_machine("wse3"))
    assert str(info.value) == "program needs 16.06 GB of HBM; machine wse3 has no HBM"
    pb = ProgramBuilder("huge")
    pb.hbm_alloc("weights", 81 * 10**9)
    _halt(pb)
    for with_data in (True, False):
        with pytest.raises(LoadError) as info:
            load(pb.build(), H100, with_data=with_data)
        assert str(info.value) == "program needs 81.00 GB of HBM; machine h100 has 80.00 GB"
    pb = ProgramBuilder("small")
    pb.hbm_alloc("b", 100)
    _halt(pb)
    with pytest.raises(LoadError, match="program needs 100 bytes of HBM; machine tiny has no"):
        load(pb.build(), load_machine("tiny"))


# ---------------------------------------------------------------------------------------------
# HBM symbols


def _symbol_program():
    pb = ProgramBuilder("io")
    pb.input("x", "f32", [2, 3])
    pb.input("ids", "i32", [4])
    pb.input("position_ids", "i32", [4])
    pb.output("y", "bf16", [2, 3])
    pb.output("z", "f32", [2, 3])
    pb.hbm_piece("x", pb.hbm_alloc("x", 12), "bf16")
    pb.hbm_piece("ids", pb.hbm_alloc("ids", 16), "i32")
    pb.hbm_piece("position_ids", pb.hbm_alloc("pos", 16), "i32")
    pb.hbm_piece("y", pb.hbm_alloc("y", 12), "bf16")
    pb.hbm_piece("z", pb.hbm_alloc("z", 24), "f16")
    _halt(pb)
    return pb.build()


def test_hbm_symbol_write_read_round_trip():
    program = _symbol_program()
    loaded = load(program, H100)
    x = np.array([[1.0, -2.5, 3.140625], [1e-3, 7.0, -0.0]], np.float32)
    write_inputs(loaded, {"x": x, "ids": np.array([5, -1, 2 ** 31 - 1, 0])})
    xa = program.hbm_allocs[0].addr
    assert np.array_equal(loaded.hbm[xa:xa + 12].view(np.uint16), _bf16_bits(x).reshape(-1))
    ia, pa = program.hbm_allocs[1].addr, program.hbm_allocs[2].addr
    assert loaded.hbm[ia:ia + 16].view(np.int32).tolist() == [5, -1, 2 ** 31 - 1, 0]
    assert loaded.hbm[pa:pa + 16].view(np.int32).tolist() == [0, 1, 2, 3]  # default positions
    # the program "computes" y = x and z = 2x: copy the bytes as a DMA would
    ya, za = program.hbm_allocs[3].addr, program.hbm_allocs[4].addr
    loaded.hbm[ya:ya + 12] = loaded.hbm[xa:xa + 12]
    loaded.hbm[za:za + 12] = (2 * x).astype(np.float16).view(np.uint8).reshape(-1)
    y, z = read_output(loaded, "y"), read_output(loaded, "z")
    assert y.shape == (2, 3) and y.dtype == np.float32
    assert np.array_equal(y, _bf16_bits(x).astype(np.uint32).__lshift__(16).view(np.float32))
    assert np.array_equal(z, (2 * x).astype(np.float16).astype(np.float32))
    with pytest.raises(LoadError, match=r"input 'x' must have shape \(2, 3\)"):
        write_input(loaded, "x", np.zeros(6))


def test_hbm_symbols_in_timing_only_mode():
    loaded = load(_symbol_program(), H100, with_data=False)
    write_input(loaded, "x", np.ones((2, 3), np.float32))  # nothing to write, no error
    with pytest.raises(LoadError, match="a timing-only run computes no values"):
        read_output(loaded, "y")


# ---------------------------------------------------------------------------------------------
# info


def test_describe_shows_the_hbm_footprint_and_buffers(wv):
    text = describe(_builder_program(*wv))
    lines = text.splitlines()
    assert "HBM: 4,164 bytes in 5 buffer(s), 2 tensor init(s), 2 symbol(s)" in lines
    rows = {line.split()[0]: line for line in lines[lines.index(
        "HBM: 4,164 bytes in 5 buffer(s), 2 tensor init(s), 2 symbol(s)") + 2:]}
    assert rows["wbuf"].split()[:3] == ["wbuf", "0", "96"]
    assert "W (f16, 4-row tiles, column-major)" in rows["wbuf"]
    assert "V (f32, rows 1:4, row-major)" in rows["vbuf"]
    assert "input x (f32)" in rows["xbuf"] and "output y (bf16)" in rows["y.out"]
    assert rows["late"].split() == ["late", "4,160", "4", "-"]
    x = next(line for line in lines if line.split()[:2] == ["x", "input"])
    assert x.split()[-2:] == ["HBM", "-"]
    big = ProgramBuilder("big")
    big.hbm_alloc("w", 16_060_000_000)
    _halt(big)
    assert "HBM: 16,060,000,000 bytes (16.06 GB) in 1 buffer(s)" in describe(big.build())
    none = ProgramBuilder("none")
    _halt(none)
    assert "HBM" not in describe(none.build())

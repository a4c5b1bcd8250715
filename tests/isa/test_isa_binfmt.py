"""program.bin: deterministic bytes, round trips, and one-line refusals of every kind of damage."""

import json
import os
import struct
import zlib

import numpy as np
import pytest

from wse_emu.isa import binfmt
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.encoding import encode
from wse_emu.isa.errors import FormatError


def _small_program(meta=None):
    pb = ProgramBuilder("small")
    pb.param("N", 4)
    for key, value in (meta or {}).items():
        pb.meta(key, value)
    pb.tensor("T", np.arange(8, dtype=np.float32).reshape(2, 4))
    pb.output("y", "f32", [4])
    pb.route(0, 0, 2, 1, 3, rx="W|RAMP", tx="E")
    rb = pb.region("r", 0, 0, 2, 1)
    buf = rb.alloc("buf", 32)
    rb.load("T", buf, "f32", (1, 4), row=(0, 0, 1), col=0)
    rb.init(buf + 16, "f16", [1.0, 2.0])
    rb.piece("y", buf, "f32", (2, 1), row=(0, 0, 1))
    rb.label("top")
    rb.dmem("d0", "f32", buf, 4)
    rb.bne("X", "r0", "top")
    rb.halt()
    return pb.build()


@pytest.fixture(scope="module")
def blob():
    return binfmt.dumps(_small_program())


def _sections(blob):
    """[(kind, payload)] of a valid file."""
    out, pos = [], binfmt.HEADER.size
    for _ in range(binfmt.HEADER.unpack_from(blob)[3]):
        kind, _, length, _, _ = binfmt.SECTION.unpack_from(blob, pos)
        start = pos + binfmt.SECTION.size
        out.append((kind, blob[start:start + length]))
        pos = start + length + (-length % 8)
    return out


def _container(sections, version=binfmt.VERSION):
    out = bytearray(binfmt.HEADER.pack(binfmt.MAGIC, version, 0, len(sections)))
    for kind, payload in sections:
        out += binfmt.SECTION.pack(kind, 0, len(payload), zlib.crc32(payload), 0)
        out += payload + b"\0" * (-len(payload) % 8)
    return bytes(out)


def _replace(blob, name, transform):
    kind = binfmt.KINDS[name]
    return _container([(k, transform(p) if k == kind else p) for k, p in _sections(blob)])


def _json_edit(blob, name, edit):
    def transform(payload):
        doc = json.loads(payload)
        edit(doc)
        return json.dumps(doc).encode()
    return _replace(blob, name, transform)


def _refused(data, match):
    with pytest.raises(FormatError, match=match) as info:
        binfmt.loads(data, where="p.bin")
    assert str(info.value).startswith("p.bin: ") and "\n" not in str(info.value)


def test_round_trip_and_determinism(blob):
    program = _small_program(meta={"source": "test", "cfg": {"a": [1, 2]}})
    data = binfmt.dumps(program)
    assert data == binfmt.dumps(program)
    again = binfmt.loads(data)
    assert again == program and again.meta == program.meta
    assert binfmt.dumps(again) == data
    assert binfmt.loads(blob) == _small_program()


def test_layout(blob):
    magic, version, flags, count = binfmt.HEADER.unpack_from(blob)
    assert (magic, version, flags, count) == (b"WSEPROG\0", 2, 0, 9)
    assert len(blob) % 8 == 0
    kinds = [k for k, _ in _sections(blob)]
    assert [binfmt.SECTIONS[k] for k in kinds] == ["META", "REGIONS", "CODE", "ROUTES",
                                                   "TENSORS", "BLOB", "DATA", "SYMBOLS", "HBM"]
    meta = json.loads(dict(_sections(blob))[1])
    assert meta["requirements"] == {"width": 2, "height": 1, "colors": 4,
                                    "sram_bytes": 24 + 32, "region_sram_bytes": {"r": 56},
                                    "hbm_bytes": 0}
    assert json.loads(dict(_sections(blob))[binfmt.KINDS["HBM"]]) == \
        {"allocs": [], "inits": [], "pieces": []}
    code = dict(_sections(blob))[binfmt.KINDS["CODE"]]
    assert struct.unpack("<3Q", code) == _small_program().regions[0].code


@pytest.mark.parametrize("cut", [0, 7, 15])
def test_truncated_header(blob, cut):
    _refused(blob[:cut], f"truncated header: the file is {cut} bytes")


@pytest.mark.parametrize("cut", [16, 30, 39, 41, 100, -9, -1])
def test_truncated_sections(blob, cut):
    _refused(blob[:cut], r"truncated section header|runs past the end of the file|padding")


def test_header_errors(blob):
    _refused(b"NOTAPROG" + blob[8:], "not a wse-emu program.bin")
    _refused(blob[:8] + struct.pack("<H", 1) + blob[10:],
             "unsupported program.bin version 1 \\(this wse-emu reads version 2\\)")
    _refused(blob[:10] + struct.pack("<H", 1) + blob[12:], "unknown header flags")
    _refused(blob + b"\0" * 8, "8 unexpected bytes after the last section")


def test_container_errors(blob):
    sections = _sections(blob)
    _refused(_container(sections[:-1]), "missing section HBM")
    _refused(_container(sections + sections[-1:]), "duplicate HBM section")
    _refused(_container(sections + [(99, b"")]), "unknown section kind 99")
    reserved = bytearray(blob)
    reserved[binfmt.HEADER.size + 4] = 1
    _refused(bytes(reserved), "section META at byte offset 16: reserved header fields")


def test_crc_mismatch_names_the_section(blob):
    pos = binfmt.HEADER.size
    for kind, payload in _sections(blob):
        if payload:
            damaged = bytearray(blob)
            damaged[pos + binfmt.SECTION.size] ^= 0x40
            _refused(bytes(damaged), f"section {binfmt.SECTIONS[kind]} at byte offset {pos}: "
                     "CRC32 mismatch")
        pos += binfmt.SECTION.size + len(payload) + (-len(payload) % 8)


def test_every_byte_flip_is_refused(blob):
    payload_bytes = set()
    pos = binfmt.HEADER.size
    for _kind, payload in _sections(blob):
        start = pos + binfmt.SECTION.size
        payload_bytes.update(range(start, start + len(payload)))
        pos = start + len(payload) + (-len(payload) % 8)
    for i in range(len(blob)):
        damaged = bytearray(blob)
        damaged[i] ^= 0xFF
        with pytest.raises(FormatError) as info:
            binfmt.loads(bytes(damaged))
        message = str(info.value)
        assert "\n" not in message and len(message) < 300, (i, message)
        if i in payload_bytes:
            assert "CRC32 mismatch" in message, (i, message)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.__setitem__("name", 3), "section META: name: expected a non-empty string"),
    (lambda d: d["requirements"].__setitem__("width", 99), "requirements do not match"),
    (lambda d: d.__setitem__("params", [["N", 1.5]]), r"params\[0\]: value must be"),
    (lambda d: d.__setitem__("params", [["r1", 1]]), "parameter 'r1'"),
])
def test_meta_schema(blob, edit, match):
    _refused(_json_edit(blob, "META", edit), match)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d[0]["rect"].__setitem__(2, 0), r"\[0\].rect: a rect needs w >= 1"),
    (lambda d: d[0].__setitem__("code_length", -1), r"code_length: expected an integer in 0"),
    (lambda d: d[0].__setitem__("code_length", 2), "holds 3 instructions, the regions use 2"),
    (lambda d: d[0].__setitem__("allocs", [["buf", 8, 4]]), "alloc 'buf' at 8 overlaps the code"),
    (lambda d: d[0].__setitem__("labels", [["top", 9]]), "label 'top' at 9 is outside the code"),
    (lambda d: d[0].pop("labels"), "expected an object with keys"),
    (lambda d: d.append(dict(d[0], name="s")), "section CODE: region 's' needs instructions"),
])
def test_regions_schema(blob, edit, match):
    _refused(_json_edit(blob, "REGIONS", edit), match)


def _code(words):
    return lambda payload: struct.pack(f"<{len(words)}Q", *words)


def test_code_is_decoded_and_checked(blob):
    ok = list(_small_program().regions[0].code)
    unused = 0xEE
    _refused(_replace(blob, "CODE", _code([ok[0], unused, ok[2]])),
             "region 'r' instruction 1: unknown opcode 0xee")
    bad_reg = encode("add", {"d": 1, "a": 2, "b": 3}) & ~(0xFF << 24) | 30 << 24
    _refused(_replace(blob, "CODE", _code([ok[0], bad_reg, ok[2]])),
             "region 'r' instruction 1: add: operand 'b' = 30 is not an integer register")
    _refused(_replace(blob, "CODE", _code([ok[0], encode("jmp", {"t": 3}), ok[2]])),
             "region 'r' instruction 1: jmp target 3 is outside the code")
    _refused(_replace(blob, "CODE", lambda p: p[:-4]), "length 20 is not a multiple of 8")


def test_data_tensors_and_symbols_are_checked(blob):
    _refused(_json_edit(blob, "TENSORS", lambda d: d[0].__setitem__("shape", [2, 5])),
             "tensor 'T': 32 bytes of data, shape \\(2, 5\\) of <f4 needs 40")
    _refused(_json_edit(blob, "TENSORS", lambda d: d[0].__setitem__("offset", 4096)),
             "lie outside BLOB")
    _refused(_json_edit(blob, "TENSORS", lambda d: d[0].__setitem__("dtype", "<f8")),
             r"\[0\].dtype: expected one of")
    _refused(_json_edit(blob, "DATA", lambda d: d[0]["tilemap"].__setitem__("tile", [2, 4])),
             "data init 0 \\(tensor 'T'\\): tiles of 2 x 4 .* do not fit tensor 'T' \\(2 x 4\\)")
    _refused(_json_edit(blob, "DATA", lambda d: d[0].__setitem__("tensor", "Q")),
             "unknown tensor 'Q'")
    _refused(_json_edit(blob, "DATA", lambda d: d[1].__setitem__("length", 2)),
             "2 inline bytes, the tile map needs 4")
    _refused(_json_edit(blob, "DATA", lambda d: d[0]["tilemap"]["rect"].__setitem__(0, 1)),
             "is not inside one region")
    _refused(_json_edit(blob, "SYMBOLS", lambda d: d[0].__setitem__("pieces", [])),
             "output 'y' has no pieces")
    _refused(_json_edit(blob, "SYMBOLS", lambda d: d[0].__setitem__("kind", "inout")),
             "kind must be input or output")
    _refused(_replace(blob, "ROUTES", lambda p: p[:-4]), "is not a multiple of 28")
    _refused(_replace(blob, "ROUTES", lambda p: p[:16] + struct.pack("<I", 300) + p[20:]),
             "route 0: bad rule")
    _refused(_replace(blob, "REGIONS", lambda p: b"[{"), "section REGIONS: bad JSON")


def test_write_program_is_atomic(tmp_path, monkeypatch):
    target = tmp_path / "p.bin"
    binfmt.write_program(_small_program(), str(target))
    assert binfmt.read_program(str(target)) == _small_program()
    before = target.read_bytes()

    bad = _small_program()
    bad = type(bad)(**{**bad.__dict__, "regions": ()})
    with pytest.raises(FormatError, match="no regions"):
        binfmt.write_program(bad, str(tmp_path / "new.bin"))
    assert sorted(os.listdir(tmp_path)) == ["p.bin"]

    def fail(*args):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        binfmt.write_program(_small_program(meta={"x": 1}), str(target))
    assert sorted(os.listdir(tmp_path)) == ["p.bin"] and target.read_bytes() == before


def test_read_program_errors(tmp_path):
    with pytest.raises(FormatError, match=r"nope\.bin: cannot read: No such file"):
        binfmt.read_program(str(tmp_path / "nope.bin"))
    (tmp_path / "bad.bin").write_bytes(b"WSEPROG\0")
    with pytest.raises(FormatError, match=r"bad\.bin: truncated header"):
        binfmt.read_program(str(tmp_path / "bad.bin"))


def _leaves(obj, path=()):
    yield path
    children = obj.items() if isinstance(obj, dict) else enumerate(obj) \
        if isinstance(obj, list) else ()
    for key, value in children:
        yield from _leaves(value, path + (key,))


def test_schema_damage_never_escapes_as_another_exception(blob):
    """Every JSON value replaced by wrong-typed ones: a FormatError or a valid file, no crash."""
    names = ("META", "REGIONS", "TENSORS", "DATA", "SYMBOLS", "HBM")
    for kind, payload in _sections(blob):
        if binfmt.SECTIONS[kind] not in names:
            continue
        for path in list(_leaves(json.loads(payload)))[1:]:
            for bad in (None, -1, 2 ** 40, 1.5, "", "x", [], {}):
                doc = json.loads(payload)
                target = doc
                for key in path[:-1]:
                    target = target[key]
                target[path[-1]] = bad
                damaged = _replace(blob, binfmt.SECTIONS[kind], lambda p: json.dumps(doc).encode())
                try:
                    binfmt.loads(damaged)
                except FormatError as e:
                    assert "\n" not in str(e)

"""program.bin: a versioned, sectioned, checksummed container for a Program (docs/program-bin.md).

    header   magic b"WSEPROG\\0", u16 version, u16 flags, u32 section count     (16 bytes)
    section  u32 kind, u32 reserved, u64 length, u32 crc32, u32 reserved     (24 bytes)
             payload, zero padding to a multiple of 8

All integers little-endian. JSON payloads are canonical (sorted keys, no spaces), so dumps()
is deterministic: the same Program always gives the same bytes. loads() validates everything
machine-independent before it returns (check_program); every failure is one FormatError line.
"""

from __future__ import annotations

import bisect
import json
import math
import struct
import zlib
from pathlib import Path

import numpy as np

from wse_emu.isa.builder import SYMBOL_DTYPES, TENSOR_ITEMSIZE
from wse_emu.isa.encoding import decode
from wse_emu.isa.errors import EncodingError, FormatError
from wse_emu.isa.expr import PLAIN_NAME, RESERVED
from wse_emu.isa.info import program_colors
from wse_emu.isa.fileio import atomic_write
from wse_emu.isa.program import (ALL_LAYERS, DIR_BITS, MODEL_FAMILIES, MODEL_MAPPINGS, MODEL_TARGETS,
                                  Alloc, DataInit, HbmAlloc, HbmInit, HbmPiece, ModelInfo,
                                  ModelPart, Program, Rect,
                         Region, RouteRule, Symbol, Tensor, TileMap, tensor_view_2d)
from wse_emu.isa.spec import DTYPE_BYTES, DTYPE_NAMES

MAGIC = b"WSEPROG\0"
VERSION = 2  # 2: the HBM section (buffers, inits and symbol pieces in off-chip memory)
HEADER = struct.Struct("<8sHHI")
SECTION = struct.Struct("<IIQII")
ROUTE = struct.Struct("<7I")
SECTIONS = {1: "META", 2: "REGIONS", 3: "CODE", 4: "ROUTES", 5: "TENSORS", 6: "BLOB", 7: "DATA",
            8: "SYMBOLS", 9: "HBM"}
KINDS = {name: kind for kind, name in SECTIONS.items()}
LIMIT = 1 << 31  # coordinates, sizes and addresses stay below this (a sanity bound, not a machine)
HBM_LIMIT = 1 << 48  # the same for HBM addresses and sizes (a 16 GB model needs more than 2**31)


def _json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _pad8(n: int) -> int:
    return -n % 8


# ---------------------------------------------------------------------------------------------
# Program -> bytes


def _tilemap_json(tm: TileMap) -> dict:
    r = tm.rect
    return {"rect": [r.x, r.y, r.w, r.h], "addr": tm.addr, "dtype": tm.dtype,
            "tile": list(tm.tile), "row": [tm.row0, tm.row_dy, tm.row_dx],
            "col": [tm.col0, tm.col_dy, tm.col_dx], "order": tm.order}


def requirements(program: Program) -> dict:
    """What a machine needs to run the program (recorded in META, checked again by loads)."""
    box = program.bounding_box()
    per_region = dict(zip((r.name for r in program.regions), program.regions_sram_bytes()))
    return {"width": box.w, "height": box.h, "colors": program_colors(program),
            "sram_bytes": max(per_region.values(), default=0), "region_sram_bytes": per_region,
            "hbm_bytes": program.hbm_bytes}


def _hbm_json(program: Program) -> dict:
    return {"allocs": [[a.name, a.addr, a.nbytes] for a in program.hbm_allocs],
            "inits": [{"tensor": i.tensor, "addr": i.addr, "dtype": i.dtype,
                       "tile_rows": i.tile_rows, "order": i.order, "transpose": i.transpose,
                       "rows": None if i.rows is None else list(i.rows)}
                      for i in program.hbm_inits],
            "pieces": [[p.symbol, p.addr, p.dtype] for p in program.hbm_pieces]}


def dumps(program: Program) -> bytes:
    """The program.bin bytes of a valid Program (FormatError if it is not valid)."""
    check_program(program)
    blob = bytearray()

    def put(data: bytes) -> list[int]:
        blob.extend(b"\0" * _pad8(len(blob)))
        offset = len(blob)
        blob.extend(data)
        return [offset, len(data)]

    tensors = []
    for t in program.tensors:
        entry = {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}
        if t.data is not None:
            entry["offset"], entry["length"] = put(t.data)
        else:
            entry["file"], entry["key"] = t.file, t.key
        tensors.append(entry)
    data = []
    for d in program.data:
        entry = {"tilemap": _tilemap_json(d.tilemap)}
        if d.tensor is not None:
            entry["tensor"] = d.tensor
        else:
            entry["offset"], entry["length"] = put(d.inline)
        data.append(entry)
    meta = {"name": program.name, "params": [list(p) for p in program.params],
            "meta": program.meta, "requirements": requirements(program)}
    if program.model is not None:  # a compiled model (isa.program.ModelInfo)
        meta["model"] = _model_json(program.model)
    regions = [{"name": r.name, "rect": [r.rect.x, r.rect.y, r.rect.w, r.rect.h],
                "code_length": len(r.code), "labels": [list(lb) for lb in r.labels],
                "allocs": [[a.name, a.addr, a.nbytes] for a in r.allocs]}
               for r in program.regions]
    symbols = [{"name": s.name, "kind": s.kind, "dtype": s.dtype, "shape": list(s.shape),
                "pieces": [_tilemap_json(p) for p in s.pieces]} for s in program.symbols]
    code = b"".join(struct.pack(f"<{len(r.code)}Q", *r.code) for r in program.regions)
    routes = b"".join(ROUTE.pack(r.rect.x, r.rect.y, r.rect.w, r.rect.h, r.color, r.rx, r.tx)
                      for r in program.routes)
    payloads = [("META", _json(meta)), ("REGIONS", _json(regions)), ("CODE", code),
                ("ROUTES", routes), ("TENSORS", _json(tensors)), ("BLOB", bytes(blob)),
                ("DATA", _json(data)), ("SYMBOLS", _json(symbols)),
                ("HBM", _json(_hbm_json(program)))]
    out = bytearray(HEADER.pack(MAGIC, VERSION, 0, len(payloads)))
    for name, payload in payloads:
        out += SECTION.pack(KINDS[name], 0, len(payload), zlib.crc32(payload), 0)
        out += payload + b"\0" * _pad8(len(payload))
    return bytes(out)


def write_program(program: Program, path: str) -> None:
    """Write program.bin atomically: a temporary file renamed over `path`, or nothing at all."""
    atomic_write(path, dumps(program))


# ---------------------------------------------------------------------------------------------
# bytes -> Program


def read_program(path: str) -> Program:
    """The Program in a program.bin file; FormatError (one line) on any problem."""
    try:
        blob = Path(path).read_bytes()
    except OSError as e:
        raise FormatError(f"{path}: cannot read: {e.strerror or e}") from None
    return loads(blob, where=str(path))


def loads(blob: bytes, where: str = "<bytes>") -> Program:
    """The Program in program.bin bytes; FormatError naming `where` and the problem."""
    try:
        return _loads(bytes(blob))
    except FormatError as e:
        raise FormatError(f"{where}: {e}", e.subject) from None


def _sections(blob: bytes) -> dict[str, bytes]:
    if len(blob) < HEADER.size:
        raise FormatError(f"truncated header: the file is {len(blob)} bytes, "
                          f"the header needs {HEADER.size}")
    magic, version, flags, count = HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise FormatError(f"not a wse-emu program.bin (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise FormatError(f"unsupported program.bin version {version} "
                          f"(this wse-emu reads version {VERSION})")
    if flags != 0:
        raise FormatError(f"unknown header flags {flags:#06x} (version {VERSION} has none)")
    pos = HEADER.size
    found: dict[str, bytes] = {}
    for index in range(count):
        if pos + SECTION.size > len(blob):
            raise FormatError(f"truncated section header {index} at byte offset {pos} "
                              f"(the file is {len(blob)} bytes)")
        kind, reserved1, length, crc, reserved2 = SECTION.unpack_from(blob, pos)
        name = SECTIONS.get(kind)
        where = f"section {index} at byte offset {pos}"
        if name is None:
            raise FormatError(f"{where}: unknown section kind {kind}")
        where = f"section {name} at byte offset {pos}"
        if reserved1 or reserved2:
            raise FormatError(f"{where}: reserved header fields are not zero")
        if name in found:
            raise FormatError(f"{where}: duplicate {name} section")
        start = pos + SECTION.size
        end = start + length
        if end + _pad8(length) > len(blob):
            raise FormatError(f"{where}: payload of {length} bytes runs past the end of the "
                              f"file ({len(blob)} bytes)")
        payload = blob[start:end]
        if zlib.crc32(payload) != crc:
            raise FormatError(f"{where}: CRC32 mismatch (stored {crc:#010x}, computed "
                              f"{zlib.crc32(payload):#010x}): the file is damaged")
        if any(blob[end:end + _pad8(length)]):
            raise FormatError(f"{where}: padding after the payload is not zero")
        found[name] = payload
        pos = end + _pad8(length)
    if pos != len(blob):
        raise FormatError(f"{len(blob) - pos} unexpected bytes after the last section "
                          f"at byte offset {pos}")
    missing = [name for name in KINDS if name not in found]
    if missing:
        raise FormatError(f"missing section{'s' if len(missing) > 1 else ''} "
                          f"{', '.join(missing)}")
    return found


class _Schema:
    """Typed access to decoded JSON; every error names the section and the path."""

    def __init__(self, section: str):
        self.section = section

    def fail(self, path: str, message: str):
        raise FormatError(f"section {self.section}: {path}: {message}")

    def int(self, v, path: str, lo: int = 0, hi: int = LIMIT) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < hi:
            self.fail(path, f"expected an integer in {lo}..{hi - 1}, got {v!r}")
        return v

    def str(self, v, path: str) -> str:
        if not isinstance(v, str) or not v:
            self.fail(path, f"expected a non-empty string, got {v!r}")
        return v

    def list(self, v, path: str, length: int | None = None) -> list:
        if not isinstance(v, list) or (length is not None and len(v) != length):
            size = "" if length is None else f" of {length}"
            self.fail(path, f"expected a list{size}, got {json.dumps(v)[:80]}")
        return v

    def dict(self, v, path: str, keys: set[str]) -> dict:
        if not isinstance(v, dict) or set(v) != keys:
            got = sorted(v) if isinstance(v, dict) else type(v).__name__
            self.fail(path, f"expected an object with keys {sorted(keys)}, got {got}")
        return v

    def rect(self, v, path: str) -> Rect:
        x, y, w, h = (self.int(c, f"{path}[{i}]") for i, c in enumerate(self.list(v, path, 4)))
        if w < 1 or h < 1:
            self.fail(path, f"a rect needs w >= 1 and h >= 1, got {w} x {h}")
        return Rect(x, y, w, h)

    def tilemap(self, v, path: str) -> TileMap:
        d = self.dict(v, path, {"rect", "addr", "dtype", "tile", "row", "col", "order"})
        tile = [self.int(c, f"{path}.tile[{i}]", 1)
                for i, c in enumerate(self.list(d["tile"], f"{path}.tile", 2))]
        row = [self.int(c, f"{path}.row[{i}]", -LIMIT)
               for i, c in enumerate(self.list(d["row"], f"{path}.row", 3))]
        col = [self.int(c, f"{path}.col[{i}]", -LIMIT)
               for i, c in enumerate(self.list(d["col"], f"{path}.col", 3))]
        if d["order"] not in ("F", "C"):
            self.fail(f"{path}.order", f"expected 'F' or 'C', got {d['order']!r}")
        return TileMap(self.rect(d["rect"], f"{path}.rect"), self.int(d["addr"], f"{path}.addr"),
                       self.int(d["dtype"], f"{path}.dtype", 0, len(DTYPE_NAMES)), tuple(tile),
                       *row, *col, d["order"])

    def shape(self, v, path: str) -> tuple[int, ...]:
        dims = self.list(v, path)
        if not dims:
            self.fail(path, "a shape needs at least one dimension")
        return tuple(self.int(d, f"{path}[{i}]", 1) for i, d in enumerate(dims))


def _decode_json(name: str, payload: bytes):
    try:
        return json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"section {name}: bad JSON: {e}") from None


def _blob_slice(s: _Schema, entry: dict, path: str, blob: bytes) -> bytes:
    offset = s.int(entry["offset"], f"{path}.offset")
    length = s.int(entry["length"], f"{path}.length")
    if offset % 8:
        s.fail(f"{path}.offset", f"{offset} is not a multiple of 8")
    if offset + length > len(blob):
        s.fail(path, f"bytes {offset}..{offset + length} lie outside BLOB ({len(blob)} bytes)")
    return blob[offset:offset + length]


def _read_meta(doc) -> tuple[dict, list]:
    s = _Schema("META")
    keys = {"name", "params", "meta", "requirements"}
    meta = s.dict(doc, "META", keys | {"model"} if isinstance(doc, dict) and "model" in doc
                  else keys)
    s.str(meta["name"], "name")
    params = []
    for i, p in enumerate(s.list(meta["params"], "params")):
        name, value = s.list(p, f"params[{i}]", 2)
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            s.fail(f"params[{i}]", f"value must be an integer or a string, got {value!r}")
        params.append((s.str(name, f"params[{i}][0]"), value))
    if not isinstance(meta["meta"], dict):
        s.fail("meta", "expected an object")
    return meta, params


def _read_regions(doc, code: bytes) -> list[Region]:
    if len(code) % 8:
        raise FormatError(f"section CODE: length {len(code)} is not a multiple of 8")
    words = struct.unpack(f"<{len(code) // 8}Q", code)
    s = _Schema("REGIONS")
    regions, pos = [], 0
    for i, r in enumerate(s.list(doc, "REGIONS")):
        path = f"[{i}]"
        r = s.dict(r, path, {"name", "rect", "code_length", "labels", "allocs"})
        n = s.int(r["code_length"], f"{path}.code_length")
        if pos + n > len(words):
            raise FormatError(f"section CODE: region {r['name']!r} needs instructions "
                              f"{pos}..{pos + n}, the section holds {len(words)}")
        labels, allocs = [], []
        for k, lb in enumerate(s.list(r["labels"], f"{path}.labels")):
            name, index = s.list(lb, f"{path}.labels[{k}]", 2)
            labels.append((s.str(name, f"{path}.labels[{k}][0]"),
                           s.int(index, f"{path}.labels[{k}][1]")))
        for k, a in enumerate(s.list(r["allocs"], f"{path}.allocs")):
            name, addr, nbytes = s.list(a, f"{path}.allocs[{k}]", 3)
            allocs.append(Alloc(s.str(name, f"{path}.allocs[{k}][0]"),
                                s.int(addr, f"{path}.allocs[{k}][1]"),
                                s.int(nbytes, f"{path}.allocs[{k}][2]")))
        regions.append(Region(s.str(r["name"], f"{path}.name"), s.rect(r["rect"], f"{path}.rect"),
                              words[pos:pos + n], tuple(allocs), tuple(labels)))
        pos += n
    if pos != len(words):
        raise FormatError(f"section CODE: holds {len(words)} instructions, the regions use {pos}")
    return regions


def _read_routes(raw: bytes) -> list[RouteRule]:
    if len(raw) % ROUTE.size:
        raise FormatError(f"section ROUTES: length {len(raw)} is not a multiple of {ROUTE.size}")
    return [RouteRule(Rect(x, y, w, h), color, rx, tx)
            for x, y, w, h, color, rx, tx in ROUTE.iter_unpack(raw)]


def _read_tensors(doc, blob: bytes) -> list[Tensor]:
    s = _Schema("TENSORS")
    tensors = []
    for i, t in enumerate(s.list(doc, "TENSORS")):
        path = f"[{i}]"
        external = isinstance(t, dict) and "file" in t
        keys = {"name", "dtype", "shape"} | ({"file", "key"} if external else {"offset", "length"})
        t = s.dict(t, path, keys)
        name = s.str(t["name"], f"{path}.name")
        if not isinstance(t["dtype"], str) or t["dtype"] not in TENSOR_ITEMSIZE:
            s.fail(f"{path}.dtype", f"expected one of {', '.join(TENSOR_ITEMSIZE)}, "
                   f"got {t['dtype']!r}")
        shape = s.shape(t["shape"], f"{path}.shape")
        if external:
            tensors.append(Tensor(name, t["dtype"], shape, file=s.str(t["file"], f"{path}.file"),
                                  key=s.str(t["key"], f"{path}.key")))
        else:
            tensors.append(Tensor(name, t["dtype"], shape, _blob_slice(s, t, path, blob)))
    return tensors


def _read_data(doc, blob: bytes) -> list[DataInit]:
    s = _Schema("DATA")
    data = []
    for i, d in enumerate(s.list(doc, "DATA")):
        path = f"[{i}]"
        has_tensor = isinstance(d, dict) and "tensor" in d
        d = s.dict(d, path, {"tilemap"} | ({"tensor"} if has_tensor else {"offset", "length"}))
        tm = s.tilemap(d["tilemap"], f"{path}.tilemap")
        if has_tensor:
            data.append(DataInit(tm, tensor=s.str(d["tensor"], f"{path}.tensor")))
        else:
            data.append(DataInit(tm, inline=_blob_slice(s, d, path, blob)))
    return data


def _read_symbols(doc) -> list[Symbol]:
    s = _Schema("SYMBOLS")
    symbols = []
    for i, sym in enumerate(s.list(doc, "SYMBOLS")):
        path = f"[{i}]"
        sym = s.dict(sym, path, {"name", "kind", "dtype", "shape", "pieces"})
        pieces = tuple(s.tilemap(p, f"{path}.pieces[{k}]")
                       for k, p in enumerate(s.list(sym["pieces"], f"{path}.pieces")))
        if not isinstance(sym["kind"], str) or not isinstance(sym["dtype"], str):
            s.fail(path, "kind and dtype must be strings")
        symbols.append(Symbol(s.str(sym["name"], f"{path}.name"), sym["kind"], sym["dtype"],
                              s.shape(sym["shape"], f"{path}.shape"), pieces))
    return symbols


def _read_hbm(doc) -> tuple[list[HbmAlloc], list[HbmInit], list[HbmPiece]]:
    s = _Schema("HBM")
    doc = s.dict(doc, "HBM", {"allocs", "inits", "pieces"})
    allocs = []
    for i, a in enumerate(s.list(doc["allocs"], "allocs")):
        name, addr, nbytes = s.list(a, f"allocs[{i}]", 3)
        allocs.append(HbmAlloc(s.str(name, f"allocs[{i}][0]"),
                               s.int(addr, f"allocs[{i}][1]", 0, HBM_LIMIT),
                               s.int(nbytes, f"allocs[{i}][2]", 0, HBM_LIMIT)))
    inits = []
    for i, d in enumerate(s.list(doc["inits"], "inits")):
        path = f"inits[{i}]"
        d = s.dict(d, path, {"tensor", "addr", "dtype", "tile_rows", "order", "transpose",
                             "rows"})
        if d["order"] not in ("F", "C"):
            s.fail(f"{path}.order", f"expected 'F' or 'C', got {d['order']!r}")
        if not isinstance(d["transpose"], bool):
            s.fail(f"{path}.transpose", f"expected true or false, got {d['transpose']!r}")
        rows = None
        if d["rows"] is not None:
            rows = tuple(s.int(r, f"{path}.rows[{k}]", 0, HBM_LIMIT)
                         for k, r in enumerate(s.list(d["rows"], f"{path}.rows", 2)))
        inits.append(HbmInit(s.str(d["tensor"], f"{path}.tensor"),
                             s.int(d["addr"], f"{path}.addr", 0, HBM_LIMIT),
                             s.int(d["dtype"], f"{path}.dtype", 0, len(DTYPE_NAMES)),
                             s.int(d["tile_rows"], f"{path}.tile_rows", 0, HBM_LIMIT),
                             d["order"], d["transpose"], rows))
    pieces = []
    for i, p in enumerate(s.list(doc["pieces"], "pieces")):
        symbol, addr, dtype = s.list(p, f"pieces[{i}]", 3)
        pieces.append(HbmPiece(s.str(symbol, f"pieces[{i}][0]"),
                               s.int(addr, f"pieces[{i}][1]", 0, HBM_LIMIT),
                               s.int(dtype, f"pieces[{i}][2]", 0, len(DTYPE_NAMES))))
    return allocs, inits, pieces


def _loads(blob: bytes) -> Program:
    sections = _sections(blob)
    doc = {name: _decode_json(name, sections[name])
           for name in ("META", "REGIONS", "TENSORS", "DATA", "SYMBOLS", "HBM")}
    hbm_allocs, hbm_inits, hbm_pieces = _read_hbm(doc["HBM"])
    data_blob = sections["BLOB"]
    meta, params = _read_meta(doc["META"])
    program = Program(name=meta["name"],
                      regions=tuple(_read_regions(doc["REGIONS"], sections["CODE"])),
                      routes=tuple(_read_routes(sections["ROUTES"])),
                      tensors=tuple(_read_tensors(doc["TENSORS"], data_blob)),
                      data=tuple(_read_data(doc["DATA"], data_blob)),
                      symbols=tuple(_read_symbols(doc["SYMBOLS"])),
                      params=tuple(params), meta=meta["meta"], hbm_allocs=tuple(hbm_allocs),
                      hbm_inits=tuple(hbm_inits), hbm_pieces=tuple(hbm_pieces),
                      model=_read_model(meta.get("model")))
    check_program(program)
    if meta["requirements"] != requirements(program):
        raise FormatError("section META: requirements do not match the program "
                          f"(stored {json.dumps(meta['requirements'], sort_keys=True)[:200]})")
    return program


# ---------------------------------------------------------------------------------------------
# Machine-independent validity of a Program (also run by ProgramBuilder.build and dumps)


def _fail(message: str, *subject) -> None:
    raise FormatError(message, subject or None)


def _rect_ok(r: Rect) -> bool:
    return (all(isinstance(v, int) and not isinstance(v, bool) for v in (r.x, r.y, r.w, r.h))
            and 0 <= r.x < LIMIT and 0 <= r.y < LIMIT and 1 <= r.w < LIMIT and 1 <= r.h < LIMIT)


def rect_inside(inner: Rect, outer: Rect) -> bool:
    return (outer.x <= inner.x and inner.x + inner.w <= outer.x + outer.w
            and outer.y <= inner.y and inner.y + inner.h <= outer.y + outer.h)


def _overlap(a: Rect, b: Rect) -> bool:
    return a.x < b.x + b.w and b.x < a.x + a.w and a.y < b.y + b.h and b.y < a.y + a.h


def view_2d(shape: tuple[int, ...]) -> tuple[int, int]:
    """The (rows, cols) a tile map or an HBM init sees of a tensor or symbol of this shape."""
    return tensor_view_2d(tuple(shape))


def _tile_range(tm: TileMap) -> tuple[int, int, int, int]:
    """Smallest and largest tile row and column index over the PEs of the rect."""
    w, h = tm.rect.w - 1, tm.rect.h - 1
    rows = [tm.row0 + dy * tm.row_dy + dx * tm.row_dx for dx in (0, w) for dy in (0, h)]
    cols = [tm.col0 + dy * tm.col_dy + dx * tm.col_dx for dx in (0, w) for dy in (0, h)]
    return min(rows), max(rows), min(cols), max(cols)


def _check_tilemap(tm: TileMap, what: str, regions, subject: tuple, hint: int) -> int:
    """Index of the region holding tm; FormatError if tm is malformed or outside every region."""
    if not _rect_ok(tm.rect):
        _fail(f"{what}: bad rect {tm.rect}", *subject)
    if tm.dtype not in DTYPE_NAMES or tm.order not in ("F", "C") or len(tm.tile) != 2 \
            or min(tm.tile) < 1 or not 0 <= tm.addr < LIMIT:
        _fail(f"{what}: bad tile map (dtype {tm.dtype}, tile {tm.tile}, order {tm.order!r}, "
              f"addr {tm.addr})", *subject)
    if hint < len(regions) and rect_inside(tm.rect, regions[hint].rect):
        owner = hint
    else:
        owner = next((i for i, r in enumerate(regions) if rect_inside(tm.rect, r.rect)), None)
    if owner is None:
        r = tm.rect
        _fail(f"{what}: rect ({r.x}, {r.y}, {r.w}, {r.h}) is not inside one region", *subject)
    size = DTYPE_BYTES[tm.dtype]
    if tm.addr % size:
        _fail(f"{what}: address {tm.addr} is not a multiple of {size} ({DTYPE_NAMES[tm.dtype]})",
              *subject)
    code_bytes = 8 * len(regions[owner].code)
    if tm.addr < code_bytes:
        _fail(f"{what}: address {tm.addr} overlaps the code of region "
              f"{regions[owner].name!r} (bytes 0..{code_bytes - 1})", *subject)
    return owner


def _check_fits(tm: TileMap, view: tuple[int, int], what: str, target: str, subject) -> None:
    """Every tile must start inside the view; the last row/column of tiles may run past its
    edge (a 50257-row LM head need not divide into equal tiles): loading zero-pads those tiles
    and reading an output clips them."""
    rmin, rmax, cmin, cmax = _tile_range(tm)
    tr, tc = tm.tile
    if rmin < 0 or cmin < 0 or rmax * tr >= view[0] or cmax * tc >= view[1]:
        _fail(f"{what}: tiles of {tr} x {tc} with tile indices rows {rmin}..{rmax}, cols "
              f"{cmin}..{cmax} do not fit {target} ({view[0]} x {view[1]}): its tile grid "
              f"is {-(-view[0] // tr)} x {-(-view[1] // tc)}", *subject)


def _check_regions(program: Program) -> None:
    regions = program.regions
    if not regions:
        _fail("the program has no regions")
    names: set[str] = set()
    for i, r in enumerate(regions):
        where = f"region {r.name!r}"
        if not isinstance(r.name, str) or not r.name:
            _fail(f"region {i}: name must be a non-empty string", "region", i)
        if r.name in names:
            _fail(f"{where}: duplicate region name", "region", i)
        names.add(r.name)
        if not _rect_ok(r.rect):
            _fail(f"{where}: bad rect {r.rect}", "region", i)
        if not r.code:
            _fail(f"{where}: no instructions", "region", i)
        for j, word in enumerate(r.code):
            try:
                ins, values = decode(word)
            except EncodingError as e:
                _fail(f"{where} instruction {j}: {e}", "instr", i, j)
            for name, kind, _slot in ins.operands:
                if kind == "target" and values[name] >= len(r.code):
                    _fail(f"{where} instruction {j}: {ins.mnemonic} target {values[name]} is "
                          f"outside the code (0..{len(r.code) - 1})", "instr", i, j)
        seen: set[str] = set()
        for k, (name, index) in enumerate(r.labels):
            if not isinstance(name, str) or not name or name in seen:
                _fail(f"{where}: label {name!r} is empty or duplicate", "label", i, k)
            seen.add(name)
            if not 0 <= index <= len(r.code):
                _fail(f"{where}: label {name!r} at {index} is outside the code", "label", i, k)
        if list(r.labels) != sorted(r.labels, key=lambda lb: (lb[1], lb[0])):
            _fail(f"{where}: labels must be sorted by index, then name", "region", i)
        code_bytes = 8 * len(r.code)
        seen = set()
        spans = []
        for k, a in enumerate(r.allocs):
            if not isinstance(a.name, str) or not a.name or a.name in seen:
                _fail(f"{where}: alloc {a.name!r} is empty or duplicate", "alloc", i, k)
            seen.add(a.name)
            if not (0 <= a.addr < LIMIT and 0 <= a.nbytes < LIMIT):
                _fail(f"{where}: alloc {a.name!r} has a bad address or size", "alloc", i, k)
            if a.nbytes and a.addr < code_bytes:
                _fail(f"{where}: alloc {a.name!r} at {a.addr} overlaps the code "
                      f"(bytes 0..{code_bytes - 1})", "alloc", i, k)
            for other, lo, hi in spans:
                if a.nbytes and lo < a.addr + a.nbytes and a.addr < hi:
                    _fail(f"{where}: alloc {a.name!r} overlaps alloc {other!r}", "alloc", i, k)
            if a.nbytes:
                spans.append((a.name, a.addr, a.addr + a.nbytes))
    order = sorted(range(len(regions)), key=lambda i: regions[i].rect.x)
    active: list[int] = []
    for i in order:
        rect = regions[i].rect
        active = [j for j in active if regions[j].rect.x + regions[j].rect.w > rect.x]
        for j in active:
            if _overlap(rect, regions[j].rect):
                first, second = sorted((i, j))
                _fail(f"region {regions[second].name!r} overlaps region "
                      f"{regions[first].name!r}", "region", second)
        active.append(i)


def _check_data(program: Program) -> None:
    tensors = {t.name: t for t in program.tensors}
    owner = 0
    for i, d in enumerate(program.data):
        what = f"data init {i}" + (f" (tensor {d.tensor!r})" if d.tensor else " (inline)")
        new_owner = _check_tilemap(d.tilemap, what, program.regions, ("data", i), owner)
        if new_owner < owner:
            _fail(f"{what}: data must be grouped by region in region order (region "
                  f"{program.regions[new_owner].name!r} after {program.regions[owner].name!r})",
                  "data", i)
        owner = new_owner
        tm = d.tilemap
        if d.tensor is not None:
            if d.inline:
                _fail(f"{what}: has both a tensor and inline bytes", "data", i)
            if d.tensor not in tensors:
                _fail(f"{what}: unknown tensor {d.tensor!r}", "data", i)
            _check_fits(tm, view_2d(tensors[d.tensor].shape), what,
                        f"tensor {d.tensor!r}", ("data", i))
        else:
            if (tm.tile[1], tm.row0, tm.row_dy, tm.row_dx, tm.col0, tm.col_dy, tm.col_dx,
                    tm.order) != (1, 0, 0, 0, 0, 0, 0, "C"):
                _fail(f"{what}: inline data needs tile (n, 1), zero row/col steps and order C",
                      "data", i)
            if not isinstance(d.inline, bytes) or len(d.inline) != tm.nbytes:
                _fail(f"{what}: {len(d.inline)} inline bytes, the tile map needs {tm.nbytes}",
                      "data", i)


def _check_symbols(program: Program) -> None:
    names: set[str] = set()
    in_hbm = {p.symbol for p in program.hbm_pieces if isinstance(p.symbol, str)}
    for i, s in enumerate(program.symbols):
        what = f"{s.kind} {s.name!r}"
        if not isinstance(s.name, str) or not s.name or s.name in names:
            _fail(f"symbol {s.name!r} is empty or duplicate", "symbol", i)
        names.add(s.name)
        if s.kind not in ("input", "output"):
            _fail(f"symbol {s.name!r}: kind must be input or output, got {s.kind!r}", "symbol", i)
        if s.dtype not in SYMBOL_DTYPES:
            _fail(f"{what}: dtype must be one of {', '.join(SYMBOL_DTYPES)}", "symbol", i)
        _check_shape(s.shape, what, ("symbol", i))
        if not s.pieces and s.name not in in_hbm:
            _fail(f"{what} has no pieces (say where it lives with .piece or .hbmpiece)",
                  "symbol", i)
        view = view_2d(s.shape)
        owner = 0
        for k, tm in enumerate(s.pieces):
            pwhat = f"{what} piece {k}"
            new_owner = _check_tilemap(tm, pwhat, program.regions, ("piece", i, k), owner)
            if new_owner < owner:
                _fail(f"{pwhat}: pieces must be in region order", "piece", i, k)
            owner = new_owner
            _check_fits(tm, view, pwhat, what, ("piece", i, k))
        if s.kind == "output" and s.pieces:
            _check_coverage(s, view, i)


def _check_coverage(s: Symbol, view: tuple[int, int], index: int) -> None:
    """Every element of an output must be in some piece, or the host would read garbage.

    Tile boundaries all fall on multiples of the gcd of the tile sizes, so coverage is checked
    on a grid of gcd-sized cells rather than per element.
    """
    cell_r = math.gcd(*(tm.tile[0] for tm in s.pieces))
    cell_c = math.gcd(*(tm.tile[1] for tm in s.pieces))
    covered = np.zeros((-(-view[0] // cell_r), -(-view[1] // cell_c)), dtype=bool)
    for tm in s.pieces:
        ry, rx = np.mgrid[0:tm.rect.h, 0:tm.rect.w]
        ti = (tm.row0 + ry * tm.row_dy + rx * tm.row_dx).ravel()
        tj = (tm.col0 + ry * tm.col_dy + rx * tm.col_dx).ravel()
        fr, fc = tm.tile[0] // cell_r, tm.tile[1] // cell_c
        tiles = np.zeros((-(-view[0] // tm.tile[0]), -(-view[1] // tm.tile[1])), dtype=bool)
        tiles[ti, tj] = True
        cells = np.repeat(np.repeat(tiles, fr, axis=0), fc, axis=1)  # may overhang the view
        cells = cells[:covered.shape[0], :covered.shape[1]]
        covered[:cells.shape[0], :cells.shape[1]] |= cells
    if not covered.all():
        r, c = np.argwhere(~covered)[0]
        _fail(f"output {s.name!r}: element ({r * cell_r}, {c * cell_c}) of its "
              f"{view[0]} x {view[1]} view is in no piece", "symbol", index)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_hbm(program: Program) -> None:
    """HBM buffers disjoint and inside HBM_LIMIT; every init and symbol piece well formed,
    aligned to its dtype, inside one buffer, and no init sharing a byte with another init or
    a piece (pieces may share bytes with each other, e.g. an output written in place of an
    input)."""
    names: set[str] = set()
    for i, a in enumerate(program.hbm_allocs):
        if not isinstance(a.name, str) or not a.name or a.name in names:
            _fail(f"HBM buffer {a.name!r}: name is empty or duplicate", "hbm_alloc", i)
        names.add(a.name)
        if not (_is_int(a.addr) and _is_int(a.nbytes) and 0 <= a.addr and 0 <= a.nbytes
                and a.addr + a.nbytes <= HBM_LIMIT):
            _fail(f"HBM buffer {a.name!r}: bad address {a.addr!r} or size {a.nbytes!r}",
                  "hbm_alloc", i)
    spans = sorted((a.addr, a.addr + a.nbytes, i) for i, a in enumerate(program.hbm_allocs)
                   if a.nbytes)
    for (lo0, hi0, i0), (lo1, hi1, i1) in zip(spans, spans[1:]):
        if lo1 < hi0:
            first, second = sorted((i0, i1))
            _fail(f"HBM buffer {program.hbm_allocs[second].name!r} overlaps HBM buffer "
                  f"{program.hbm_allocs[first].name!r} (bytes {max(lo0, lo1)}.."
                  f"{min(hi0, hi1) - 1} are in both)", "hbm_alloc", second)
    starts = [lo for lo, _, _ in spans]
    total = program.hbm_bytes

    def place(addr: int, nbytes: int, dtype: int, what: str, subject: tuple) -> None:
        size = DTYPE_BYTES[dtype]
        if addr % size:
            _fail(f"{what}: HBM address {addr} is not a multiple of {size} "
                  f"({DTYPE_NAMES[dtype]})", *subject)
        end = addr + nbytes
        if end > total:
            _fail(f"{what}: bytes {addr}..{end - 1} run past the end of the program's HBM "
                  f"({total} bytes in its buffers)", *subject)
        k = bisect.bisect_right(starts, addr) - 1
        if k < 0 or end > spans[k][1]:
            _fail(f"{what}: bytes {addr}..{end - 1} are not inside one HBM buffer", *subject)

    tensors = {t.name: t for t in program.tensors}
    used = []  # (start, end, is_init, what, subject)
    for i, init in enumerate(program.hbm_inits):
        what = f"HBM init {i} (tensor {init.tensor!r})"
        rows = init.rows
        if not (isinstance(init.tensor, str) and _is_int(init.addr) and 0 <= init.addr
                and init.dtype in DTYPE_NAMES and _is_int(init.tile_rows) and init.tile_rows >= 0
                and init.order in ("F", "C") and isinstance(init.transpose, bool)
                and (rows is None or (isinstance(rows, tuple) and len(rows) == 2
                                      and all(_is_int(r) for r in rows)))):
            _fail(f"{what}: bad fields (addr {init.addr!r}, dtype {init.dtype!r}, tile_rows "
                  f"{init.tile_rows!r}, order {init.order!r}, transpose {init.transpose!r}, "
                  f"rows {rows!r})", "hbm_init", i)
        if init.tensor not in tensors:
            _fail(f"{what}: unknown tensor {init.tensor!r}", "hbm_init", i)
        r, c = view_2d(tensors[init.tensor].shape)
        if init.transpose:
            r, c = c, r
        stored = f"the {r} x {c} {'transposed ' if init.transpose else ''}tensor"
        if rows is not None and not 0 <= rows[0] < rows[1] <= r:
            _fail(f"{what}: rows {rows[0]}:{rows[1]} are not inside {stored}", "hbm_init", i)
        n = r if rows is None else rows[1] - rows[0]
        if init.tile_rows and n % init.tile_rows:
            _fail(f"{what}: tile_rows {init.tile_rows} does not divide the {n} rows it "
                  f"stores (of {stored})", "hbm_init", i)
        nbytes = init.nbytes(tensors[init.tensor].shape)
        place(init.addr, nbytes, init.dtype, what, ("hbm_init", i))
        used.append((init.addr, init.addr + nbytes, True, what, ("hbm_init", i)))
    symbols = {s.name: s for s in program.symbols}
    seen: set[str] = set()
    for i, p in enumerate(program.hbm_pieces):
        what = f"HBM piece {i} (symbol {p.symbol!r})"
        if not (isinstance(p.symbol, str) and _is_int(p.addr) and 0 <= p.addr
                and p.dtype in DTYPE_NAMES):
            _fail(f"{what}: bad fields (addr {p.addr!r}, dtype {p.dtype!r})", "hbm_piece", i)
        s = symbols.get(p.symbol)
        if s is None:
            _fail(f"{what}: unknown symbol {p.symbol!r} (declare it with input/output)",
                  "hbm_piece", i)
        if p.symbol in seen:
            _fail(f"{what}: the symbol has another HBM piece (one holds all of it)",
                  "hbm_piece", i)
        seen.add(p.symbol)
        if s.pieces:
            _fail(f"{what}: the symbol also has SRAM pieces (it lives in SRAM or in HBM, not "
                  "both)", "hbm_piece", i)
        nbytes = math.prod(s.shape) * DTYPE_BYTES[p.dtype]
        place(p.addr, nbytes, p.dtype, what, ("hbm_piece", i))
        used.append((p.addr, p.addr + nbytes, False, what, ("hbm_piece", i)))
    # Sweep in address order with the furthest end of any init and of anything so far: a span
    # starting before the first overlaps an init; an init starting before the second overlaps
    # something.
    init_end, init_what, any_end, any_what = 0, "", 0, ""
    for lo, hi, is_init, what, subject in sorted(used, key=lambda u: (u[0], u[1])):
        if lo < init_end or (is_init and lo < any_end):
            other = init_what if lo < init_end else any_what
            _fail(f"{what}: bytes {lo}..{hi - 1} overlap {other}", *subject)
        if is_init and hi > init_end:
            init_end, init_what = hi, what
        if hi > any_end:
            any_end, any_what = hi, what


def _check_shape(shape, what: str, subject: tuple) -> None:
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d < LIMIT
                            for d in shape):
        _fail(f"{what}: bad shape {shape!r}", *subject)


def check_program(program: Program) -> None:
    """FormatError (with .subject) for the first machine-independent problem of a Program."""
    if not isinstance(program.name, str) or not program.name:
        _fail("the program needs a non-empty name")
    _check_regions(program)
    dir_limit = 1 << len(DIR_BITS)
    for i, r in enumerate(program.routes):
        if not _rect_ok(r.rect) or not 0 <= r.color < 256 or not 0 <= r.rx < dir_limit \
                or not 0 <= r.tx < dir_limit:
            _fail(f"route {i}: bad rule (rect {r.rect}, color {r.color}, rx {r.rx}, tx {r.tx})",
                  "route", i)
    names: set[str] = set()
    for i, t in enumerate(program.tensors):
        what = f"tensor {t.name!r}"
        if not isinstance(t.name, str) or not t.name or t.name in names:
            _fail(f"{what}: name is empty or duplicate", "tensor", i)
        names.add(t.name)
        if not isinstance(t.dtype, str) or t.dtype not in TENSOR_ITEMSIZE:
            _fail(f"{what}: dtype must be one of {', '.join(TENSOR_ITEMSIZE)}", "tensor", i)
        _check_shape(t.shape, what, ("tensor", i))
        if (t.data is None) == (t.file is None):
            _fail(f"{what}: needs inline data or a file reference (exactly one)", "tensor", i)
        if t.data is not None:
            want = int(np.prod(t.shape)) * TENSOR_ITEMSIZE[t.dtype]
            if len(t.data) != want:
                _fail(f"{what}: {len(t.data)} bytes of data, shape {t.shape} of {t.dtype} "
                      f"needs {want}", "tensor", i)
        elif not (isinstance(t.file, str) and t.file and isinstance(t.key, str) and t.key):
            _fail(f"{what}: a file reference needs a file and a key", "tensor", i)
    _check_data(program)
    _check_symbols(program)
    _check_hbm(program)
    _check_model(program)
    names = set()
    for i, (name, value) in enumerate(program.params):
        if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name) or name in RESERVED \
                or name in names:
            _fail(f"parameter {name!r}: the name is not an identifier, reserved or duplicate",
                  "param", i)
        names.add(name)
        if isinstance(value, bool) or not isinstance(value, (int, str)) \
                or (isinstance(value, str) and value not in SYMBOL_DTYPES):
            _fail(f"parameter {name!r}: value must be an integer or a dtype name", "param", i)
    try:
        _json(program.meta)
    except (TypeError, ValueError) as e:
        _fail(f"meta is not JSON: {e}", "meta")
    if not all(isinstance(k, str) for k in program.meta):
        _fail("meta keys must be strings", "meta")


# ---------------------------------------------------------------------------------------------
# MODEL: what a runtime needs to know about a compiled model (isa.program.ModelInfo)

_MODEL_KEYS = {"family", "target", "mapping", "machine", "dtype", "layers", "hidden", "vocab",
               "max_context", "positions", "parts", "shape_only", "chips", "groups",
               "crossing_cycles", "sequences"}


def _model_json(model: ModelInfo | None):
    if model is None:
        return None
    d = {k: getattr(model, k) for k in _MODEL_KEYS - {"parts", "groups", "crossing_cycles"}}
    d["groups"] = [list(g) for g in model.groups]
    d["crossing_cycles"] = list(model.crossing_cycles)
    d["parts"] = [{"name": p.name, "layer": p.layer, "regions": list(p.regions),
                   "predicted_cycles": p.predicted_cycles} for p in model.parts]
    return d


def _read_model(doc) -> ModelInfo | None:
    if doc is None:
        return None
    s = _Schema("META")
    if isinstance(doc, dict):  # files written before the optional keys existed lack them
        doc = {**{k: v for k, v in (("shape_only", False), ("chips", 1), ("groups", []),
                                    ("crossing_cycles", []), ("sequences", 1))
                  if k not in doc}, **doc}
    d = s.dict(doc, "model", _MODEL_KEYS)
    for k in ("family", "target", "mapping", "machine", "dtype"):
        s.str(d[k], k)
    if not isinstance(d["shape_only"], bool):
        s.fail("model.shape_only", f"expected true or false, got {d['shape_only']!r}")
    chips = s.int(d["chips"], "chips")
    groups = []
    for i, g in enumerate(s.list(d["groups"], "groups")):
        first, count = (s.int(v, f"groups[{i}][{j}]")
                        for j, v in enumerate(s.list(g, f"groups[{i}]", 2)))
        groups.append((first, count))
    crossings = tuple(s.int(v, f"crossing_cycles[{i}]")
                      for i, v in enumerate(s.list(d["crossing_cycles"], "crossing_cycles")))
    ints = {k: s.int(d[k], k) for k in ("layers", "hidden", "vocab", "max_context",
                                        "positions", "sequences")}
    parts = []
    for i, p in enumerate(s.list(d["parts"], "parts")):
        q = s.dict(p, f"parts[{i}]", {"name", "layer", "regions", "predicted_cycles"})
        layer = q["layer"]
        if isinstance(layer, bool) or not isinstance(layer, int):
            s.fail(f"parts[{i}].layer", f"expected an integer, got {layer!r}")
        regions = tuple(s.str(r, f"parts[{i}].regions[{j}]")
                        for j, r in enumerate(s.list(q["regions"], f"parts[{i}].regions")))
        parts.append(ModelPart(s.str(q["name"], f"parts[{i}].name"), layer, regions,
                               s.int(q["predicted_cycles"], f"parts[{i}].predicted_cycles")))
    return ModelInfo(d["family"], d["target"], d["mapping"], d["machine"], d["dtype"],
                     parts=tuple(parts), shape_only=d["shape_only"], chips=chips,
                     groups=tuple(groups), crossing_cycles=crossings, **ints)


def _check_groups(m: ModelInfo) -> None:
    """A split model's groups: one per chip, each (first layer, layers >= 1), contiguous from
    layer 0 to the last; one predicted crossing a boundary between two chips."""
    if not m.groups:
        if m.crossing_cycles:
            _fail("model crossing_cycles given without groups", "model")
        return
    if len(m.groups) != m.chips:
        _fail(f"model groups: {len(m.groups)} groups for {m.chips} chips (one a chip)", "model")
    nxt = 0
    for c, g in enumerate(m.groups):
        if not isinstance(g, tuple) or len(g) != 2 or any(
                isinstance(v, bool) or not isinstance(v, int) for v in g):
            _fail(f"model groups[{c}] must be (first layer, layers), got {g!r}", "model")
        first, count = g
        if first != nxt or count < 1:
            _fail(f"model groups[{c}] = {g!r}: groups must be contiguous from layer 0, each "
                  f"of at least one layer (expected first layer {nxt})", "model")
        nxt = first + count
    if nxt != m.layers:
        _fail(f"model groups cover layers 0..{nxt - 1}, not the model's {m.layers}", "model")
    if len(m.crossing_cycles) != m.chips - 1 or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in m.crossing_cycles):
        _fail(f"model crossing_cycles must be {m.chips - 1} integers >= 0 (one a boundary), "
              f"got {list(m.crossing_cycles)!r}", "model")


def _check_model(program: Program) -> None:
    """The MODEL section's values, and that its parts name the program's regions once each."""
    m = program.model
    if m is None:
        return
    if not isinstance(m, ModelInfo):
        _fail(f"model must be an isa.program.ModelInfo, got {type(m).__name__}", "model")
    for field, allowed in (("family", MODEL_FAMILIES), ("target", MODEL_TARGETS),
                           ("mapping", MODEL_MAPPINGS), ("dtype", ("f32", "f16", "bf16"))):
        if getattr(m, field) not in allowed:
            _fail(f"model {field} must be one of {', '.join(allowed)}, got "
                  f"{getattr(m, field)!r}", "model")
    for field in ("layers", "hidden", "vocab", "max_context", "positions", "sequences"):
        v = getattr(m, field)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            _fail(f"model {field} must be a positive integer, got {v!r}", "model")
    if m.positions > m.max_context:
        _fail(f"model positions {m.positions} exceed max_context {m.max_context}", "model")
    if m.sequences > 1:  # several sequences: one position each a run, B ids and B positions
        if m.positions != 1:
            _fail(f"model sequences {m.sequences} need positions 1 (a decode step), got "
                  f"{m.positions}", "model")
        for sym in program.symbols:
            if sym.name in ("input_ids", "position_ids") and tuple(sym.shape) != (m.sequences,):
                _fail(f"model sequences {m.sequences}: input {sym.name!r} has shape "
                      f"{tuple(sym.shape)}, not ({m.sequences},)", "model")
    if not isinstance(m.shape_only, bool):
        _fail(f"model shape_only must be true or false, got {m.shape_only!r}", "model")
    if isinstance(m.chips, bool) or not isinstance(m.chips, int) or m.chips < 1:
        _fail(f"model chips must be a positive integer, got {m.chips!r}", "model")
    _check_groups(m)
    regions = {r.name for r in program.regions}
    seen: dict[str, str] = {}
    names = set()
    for p in m.parts:
        if not isinstance(p, ModelPart) or not p.name or p.name in names:
            _fail(f"model part {getattr(p, 'name', p)!r}: not a ModelPart, empty or duplicate "
                  f"name", "model")
        names.add(p.name)
        if p.layer != ALL_LAYERS and not -1 <= p.layer <= m.layers:
            _fail(f"model part {p.name!r}: layer {p.layer} is not -1..{m.layers} or "
                  f"{ALL_LAYERS} (every layer)", "model")
        if isinstance(p.predicted_cycles, bool) or not isinstance(p.predicted_cycles, int) \
                or p.predicted_cycles < 0:
            _fail(f"model part {p.name!r}: predicted_cycles must be an integer >= 0", "model")
        for r in p.regions:
            if r not in regions:
                _fail(f"model part {p.name!r} names region {r!r}, which the program does not "
                      f"have", "model")
            if r in seen:
                _fail(f"region {r!r} belongs to model parts {seen[r]!r} and {p.name!r}",
                      "model")
            seen[r] = p.name

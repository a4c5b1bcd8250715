"""program.bin: a versioned, sectioned, checksummed container for a Program (docs/program-bin.md).

    header   magic b"WSEPROG\\0", u16 version, u16 flags, u32 section count     (16 bytes)
    section  u32 kind, u32 reserved, u64 length, u32 crc32, u32 reserved     (24 bytes)
             payload, zero padding to a multiple of 8

All integers little-endian. JSON payloads are canonical (sorted keys, no spaces), so dumps()
is deterministic: the same Program always gives the same bytes. loads() validates everything
machine-independent before it returns (isa/program_checks.py); every failure is one FormatError
line.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

from wse_emu.isa.errors import FormatError
from wse_emu.isa.fileio import atomic_write
from wse_emu.isa.info import program_colors
from wse_emu.isa.program import (Alloc, DataInit, HbmAlloc, HbmInit, HbmPiece, ModelInfo, ModelPart,
                                 Program, Rect, Region, RouteRule, Symbol, Tensor, TileMap)
from wse_emu.isa.program_checks import HBM_LIMIT, LIMIT, check_program
from wse_emu.isa.spec import DTYPE_NAMES, TENSOR_ITEMSIZE

MAGIC = b"WSEPROG\0"
VERSION = 2  # 2: the HBM section (buffers, inits and symbol pieces in off-chip memory)
HEADER = struct.Struct("<8sHHI")
SECTION = struct.Struct("<IIQII")
ROUTE = struct.Struct("<7I")
SECTIONS = {1: "META", 2: "REGIONS", 3: "CODE", 4: "ROUTES", 5: "TENSORS", 6: "BLOB", 7: "DATA",
            8: "SYMBOLS", 9: "HBM"}
KINDS = {name: kind for kind, name in SECTIONS.items()}


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
# MODEL: what a runtime needs to know about a compiled model (isa.program.ModelInfo)

_MODEL_KEYS = {"family", "target", "mapping", "machine", "dtype", "layers", "hidden", "vocab",
               "max_context", "positions", "parts", "shape_only", "chips", "groups",
               "crossing_cycles", "sequences", "prefill"}


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
                                    ("crossing_cycles", []), ("sequences", 1),
                                    ("prefill", False))
                  if k not in doc}, **doc}
    d = s.dict(doc, "model", _MODEL_KEYS)
    for k in ("family", "target", "mapping", "machine", "dtype"):
        s.str(d[k], k)
    for k in ("shape_only", "prefill"):
        if not isinstance(d[k], bool):
            s.fail(f"model.{k}", f"expected true or false, got {d[k]!r}")
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
                     groups=tuple(groups), crossing_cycles=crossings,
                     prefill=d["prefill"], **ints)

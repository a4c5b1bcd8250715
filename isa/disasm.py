"""The disassembler: Program -> .wsa text (+ one .npy per inline tensor) that reassembles to the
same program.bin bytes.

Everything is written with explicit numbers (addresses, tile indices, operands); names are
kept where the Program has them (regions, labels, allocs, tensors, symbols, params) and quoted
as strings when they are not plain identifiers or would be read as something else.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from wse_emu.isa.program_checks import check_program, rect_inside
from wse_emu.isa.encoding import float_text, format_instr
from wse_emu.isa.expr import KEYWORDS, PLAIN_NAME, RESERVED
from wse_emu.isa.program import DIR_NAMES, Program, Region, TileMap
from wse_emu.isa.spec import DTYPE_BYTES, DTYPE_NAMES, TENSOR_DTYPES

_TENSOR_DTYPE_NAMES = {v: k for k, v in TENSOR_DTYPES.items()}
_NPY_DTYPES = {"<f4": "<f4", "<f2": "<f2", "<i4": "<i4", "bf16": "<u2"}


def _name(name: str, avoid: frozenset | set = frozenset()) -> str:
    """A name as the assembler reads it back: bare when plain, else a JSON string."""
    if PLAIN_NAME.fullmatch(name) and name not in KEYWORDS and name not in avoid:
        return name
    return json.dumps(name)


def _ports(mask: int) -> str:
    return "|".join(n for i, n in enumerate(DIR_NAMES) if mask >> i & 1) or "0"


def _affine(c0: int, cdx: int, cdy: int) -> str:
    terms = []
    for coeff, var in ((cdx, "rx"), (cdy, "ry")):
        if coeff == 1:
            terms.append(var)
        elif coeff == -1:
            terms.append(f"-{var}")
        elif coeff:
            terms.append(f"{coeff}*{var}")
    if c0 or not terms:
        terms.append(str(c0))
    return " + ".join(terms).replace("+ -", "- ")


def _rel_rect(tm: TileMap, region: Region) -> tuple[int, int, int, int] | None:
    r = tm.rect
    rel = (r.x - region.rect.x, r.y - region.rect.y, r.w, r.h)
    return None if rel == (0, 0, region.rect.w, region.rect.h) else rel


def _tile_args(tm: TileMap, region: Region, default_order: str) -> str:
    rel = _rel_rect(tm, region)
    rx0, ry0 = (rel[0], rel[1]) if rel else (0, 0)
    # TileMap steps count from the rect's corner; .wsa rx/ry are region-relative.
    row = _affine(tm.row0 - rx0 * tm.row_dx - ry0 * tm.row_dy, tm.row_dx, tm.row_dy)
    col = _affine(tm.col0 - rx0 * tm.col_dx - ry0 * tm.col_dy, tm.col_dx, tm.col_dy)
    text = f"tile=({tm.tile[0]}, {tm.tile[1]}), row={row}, col={col}"
    if tm.order != default_order:
        text += f", order={tm.order}"
    if rel:
        text += f", rect=({', '.join(map(str, rel))})"
    return text


def _hbm_align(cursor: int, addr: int) -> str:
    """The `.hbm` placement suffix that puts a buffer at addr when the last one ended at
    cursor: nothing (the default 64), align=N, or at=addr."""
    if addr == -(-cursor // 64) * 64:
        return ""
    if addr >= cursor:
        align = addr & -addr if addr else 1  # the largest power of two dividing addr
        if addr - cursor < align:
            return f", align={align}"
    return f", at={addr}"


def _hbm_lines(program: Program, params: set[str]) -> tuple[list[str], set[str]]:
    """The .hbm, .hbminit and .hbmpiece lines, and the HBM names written bare (value names)."""
    lines, bare, cursor = [], set(), 0
    for a in program.hbm_allocs:
        reserved = a.name in RESERVED or a.name in params or a.name in bare
        name = json.dumps(a.name) if reserved else _name(a.name)
        if not name.startswith('"'):
            bare.add(a.name)
        lines.append(f".hbm {name}, {a.nbytes}{_hbm_align(cursor, a.addr)}")
        cursor = max(cursor, a.addr + a.nbytes)
    for init in program.hbm_inits:
        text = f".hbminit {_name(init.tensor)}, {init.addr}, {DTYPE_NAMES[init.dtype]}"
        if init.tile_rows:
            text += f", tile_rows={init.tile_rows}"
        if init.order != "F":
            text += f", order={init.order}"
        if init.transpose:
            text += ", transpose"
        if init.rows is not None:
            text += f", rows={init.rows[0]}:{init.rows[1]}"
        lines.append(text)
    for p in program.hbm_pieces:
        lines.append(f".hbmpiece {_name(p.symbol)}, {p.addr}, {DTYPE_NAMES[p.dtype]}")
    return lines, bare


def _region_lines(program: Program, region: Region, params: set[str]) -> list[str]:
    lines = [f".region {_name(region.name)}, {region.rect.x}, {region.rect.y}, "
             f"{region.rect.w}, {region.rect.h}"]
    bare_allocs = set()
    cursor = len(region.code) * 8
    for a in region.allocs:
        reserved = a.name in RESERVED or a.name in params or a.name in bare_allocs
        name = json.dumps(a.name) if reserved else _name(a.name)
        if not name.startswith('"'):
            bare_allocs.add(a.name)
        auto = -(-cursor // 8) * 8
        at = "" if a.addr == auto else f", at={a.addr}"
        lines.append(f"    .alloc {name}, {a.nbytes}{at}")
        cursor = max(cursor, a.addr + a.nbytes)
    for d in program.data:
        tm = d.tilemap
        if not rect_inside(tm.rect, region.rect):
            continue
        dtype = DTYPE_NAMES[tm.dtype]
        if d.tensor is not None:
            lines.append(f"    .load {_name(d.tensor)}, {tm.addr}, {dtype}, "
                         f"{_tile_args(tm, region, 'F')}")
        else:
            size = DTYPE_BYTES[tm.dtype]
            if dtype == "i32":
                values = [str(int.from_bytes(d.inline[i:i + size], "little", signed=True))
                          for i in range(0, len(d.inline), size)]
            else:
                values = [float_text(int.from_bytes(d.inline[i:i + size], "little"), dtype)
                          for i in range(0, len(d.inline), size)]
            rel = _rel_rect(tm, region)
            rect = f", rect=({', '.join(map(str, rel))})" if rel else ""
            lines.append(f"    .init {tm.addr}, {dtype}, {', '.join(values)}{rect}")
    for s in program.symbols:
        for tm in s.pieces:
            if rect_inside(tm.rect, region.rect):
                lines.append(f"    .piece {_name(s.name)}, {tm.addr}, {DTYPE_NAMES[tm.dtype]}, "
                             f"{_tile_args(tm, region, 'C')}")
    value_names = params | bare_allocs | RESERVED
    targets: dict[int, str] = {}
    by_index: dict[int, list[str]] = {}
    for name, index in region.labels:
        by_index.setdefault(index, []).append(name)
        targets.setdefault(index, _name(name, value_names))
    for i in range(len(region.code) + 1):
        for name in by_index.get(i, []):
            plain = PLAIN_NAME.fullmatch(name) and name not in KEYWORDS
            lines.append(f"{name}:" if plain else f"    .label {json.dumps(name)}")
        if i < len(region.code):
            lines.append(f"    {format_instr(region.code[i], targets)}")
    lines.append(".endregion")
    return lines


def _file_name(stem: str, tensor: str, used: set[str]) -> str:
    base = f"{stem}.{re.sub(r'[^A-Za-z0-9_.-]', '_', tensor)}"
    name, n = f"{base}.npy", 1
    while name in used:
        name, n = f"{base}.{n}.npy", n + 1
    used.add(name)
    return name


def disassemble(program: Program, outdir: str, stem: str) -> str:
    """Write outdir/stem.wsa and one stem.NAME.npy per inline tensor; return the .wsa path."""
    check_program(program)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"; disassembled by wse-emu from program {program.name!r}",
             f".program {json.dumps(program.name)}"]
    params = set()
    for name, value in program.params:
        lines.append(f".param {name} = {value}")
        params.add(name)
    for key, value in sorted(program.meta.items()):
        lines.append(f".meta {_name(key)} = {json.dumps(value, sort_keys=True)}")
    used_files: set[str] = set()
    for t in program.tensors:
        shape = f"[{', '.join(map(str, t.shape))}]"
        dtype = _TENSOR_DTYPE_NAMES[t.dtype]
        if t.data is None:
            lines.append(f".tensor {_name(t.name)}, {shape}, safetensors={json.dumps(t.file)}, "
                         f"key={json.dumps(t.key)}, dtype={dtype}")
            continue
        file = _file_name(stem, t.name, used_files)
        np.save(out / file, np.frombuffer(t.data, dtype=_NPY_DTYPES[t.dtype]).reshape(t.shape),
                allow_pickle=False)
        bf16 = ", dtype=bf16" if t.dtype == "bf16" else ""
        lines.append(f".tensor {_name(t.name)}, {shape}, file={json.dumps(file)}{bf16}")
    for s in program.symbols:
        lines.append(f".{s.kind} {_name(s.name)}, {s.dtype}, [{', '.join(map(str, s.shape))}]")
    hbm, hbm_names = _hbm_lines(program, params)
    lines += hbm
    for r in program.routes:
        lines.append(f".route {r.rect.x}, {r.rect.y}, {r.rect.w}, {r.rect.h}, {r.color}, "
                     f"rx={_ports(r.rx)}, tx={_ports(r.tx)}")
    for region in program.regions:
        lines += _region_lines(program, region, params | hbm_names)
    path = out / f"{stem}.wsa"
    path.write_text("\n".join(lines) + "\n")
    return str(path)

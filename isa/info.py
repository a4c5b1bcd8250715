"""What a Program holds and needs, for people (`wse-emu info`) and for program.bin's META."""

from __future__ import annotations

import math
import re

from wse_emu.isa.encoding import decode
from wse_emu.isa.spec import TENSOR_ITEMSIZE
from wse_emu.isa.program import Program, Region
from wse_emu.isa.spec import DTYPE_NAMES


def _region(program: Program, region: Region | str) -> Region:
    if isinstance(region, Region):
        return region
    for r in program.regions:
        if r.name == region:
            return r
    raise KeyError(f"no region {region!r}")


def region_sram_bytes(program: Program, region: Region | str) -> int:
    """Highest SRAM byte (exclusive) used on the region's PEs: code, allocs, data, symbol pieces."""
    return program.region_sram_bytes(_region(program, region))


def program_colors(program: Program) -> int:
    """One more than the highest color a route rule or an instruction names (0 when none)."""
    colors = program.colors_used()
    for r in program.regions:
        for word in r.code:
            ins, values = decode(word)
            for name, kind, _slot in ins.operands:
                if kind == "color":
                    colors = max(colors, values[name] + 1)
    return colors


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Rows as aligned columns: numbers to the right, text to the left."""
    columns = list(zip(*rows))
    widths = [max(map(len, col)) for col in columns]
    numeric = [all(re.fullmatch(r"[\d,]+", cell) for cell in col[1:]) for col in columns]
    return [indent + "  ".join(cell.rjust(w) if num else cell.ljust(w)
                               for cell, w, num in zip(row, widths, numeric)).rstrip()
            for row in rows]


def _hbm_lines(program: Program) -> list[str]:
    """The HBM footprint and one row per buffer with what the program puts in it."""
    total = program.hbm_bytes
    gb = f" ({total / 1e9:.2f} GB)" if total >= 10**7 else ""
    lines = [f"HBM: {total:,} bytes{gb} in {len(program.hbm_allocs)} "
             f"buffer(s), {len(program.hbm_inits)} tensor init(s), "
             f"{len(program.hbm_pieces)} symbol(s)"]
    contents: dict[int, list[str]] = {}
    spans = sorted((a.addr, a.addr + a.nbytes, i) for i, a in enumerate(program.hbm_allocs))

    def owner(addr: int) -> int | None:
        return next((i for lo, hi, i in spans if lo <= addr < hi), None)
    for init in program.hbm_inits:
        text = f"{init.tensor} ({DTYPE_NAMES[init.dtype]}"
        if init.transpose:
            text += ", transposed"
        if init.rows is not None:
            text += f", rows {init.rows[0]}:{init.rows[1]}"
        if init.tile_rows:
            text += f", {init.tile_rows}-row tiles"
        text += ", column-major)" if init.order == "F" else ", row-major)"
        contents.setdefault(owner(init.addr), []).append(text)
    kinds = {s.name: s.kind for s in program.symbols}
    for p in program.hbm_pieces:
        contents.setdefault(owner(p.addr), []).append(
            f"{kinds.get(p.symbol, 'symbol')} {p.symbol} ({DTYPE_NAMES[p.dtype]})")
    rows = [["name", "address", "bytes", "contents"]]
    for i, a in enumerate(program.hbm_allocs):
        rows.append([a.name, f"{a.addr:,}", f"{a.nbytes:,}", "; ".join(contents.get(i, []))
                     or "-"])
    return lines + _table(rows)


REGION_ROWS = 24  # regions describe lists by default; the rest are counted on one line


def model_line(m) -> str:
    """One line on a compiled model (program.bin's MODEL, isa.program.ModelInfo): what it is,
    what it was compiled for, and what a run takes."""
    runs = ("one position a run" if m.positions == 1 and m.sequences == 1
            else f"{m.positions} positions a run" if m.sequences == 1
            else f"a prefill program: {m.sequences} consecutive positions of one sequence a "
                 f"run, one KV cache" if m.prefill
            else f"{m.sequences} sequences in flight: a token of each a run, a KV cache each")
    groups = ", ".join(f"{a}-{a + n - 1}" for a, n in m.groups)
    chips = (f" ({m.chips} chips" + (f"; layers {groups}, a chip each" if groups else "") + ")"
             if m.chips > 1 else "")
    mapping = {"wafer": "the wafer mapping", "chain": "the stage chain",
               "kernel": "an HBM kernel"}.get(m.mapping, m.mapping)
    return (f"model: {m.family}, {m.layers} layers, hidden {m.hidden}, vocabulary {m.vocab}, "
            f"max_context {m.max_context}, weights {m.dtype}"
            + (" (shape only: timing-only runs)" if m.shape_only else "")
            + f"; {mapping} for '{m.machine}'{chips}; {runs}")


def describe(program: Program, max_regions: int | None = REGION_ROWS) -> str:
    """A human-readable summary of the program: regions, routes, tensors, symbols, params, and
    the HBM footprint with its buffers. Past `max_regions` regions (None: no limit) one line
    counts the rest, so that a program with a region per column (the gemv on 256 x 256 PEs
    has 512) still reads as a summary."""
    box = program.bounding_box()
    pes = sum(r.rect.size for r in program.regions)
    lines = [f"program {program.name!r}: {len(program.regions)} region(s), {pes} PEs used, "
             f"bounding box {box.w} x {box.h}, {program_colors(program)} color(s), "
             f"{len(program.routes)} route rule(s)"]
    if program.params:
        lines.append("params: " + ", ".join(f"{k}={v}" for k, v in program.params))
    if program.model is not None:
        lines.append(model_line(program.model))
    lines.append("regions:")
    rows = [["name", "rect (x, y, w x h)", "PEs", "instructions", "SRAM bytes"]]
    shown = program.regions if max_regions is None else program.regions[:max_regions]
    for r, sram in zip(shown, program.regions_sram_bytes()):
        rows.append([r.name, f"({r.rect.x}, {r.rect.y}, {r.rect.w} x {r.rect.h})",
                     str(r.rect.size), str(len(r.code)), f"{sram:,}"])
    lines += _table(rows)
    rest = program.regions[len(shown):]
    if rest:
        lines.append(f"  ... {len(rest)} more region(s), {sum(r.rect.size for r in rest):,} "
                     f"PEs (--all lists every region)")
    if program.routes:
        colors = sorted({rule.color for rule in program.routes})
        lines.append(f"routes: {len(program.routes)} rule(s) on color(s) "
                     + ", ".join(map(str, colors)))
    if program.tensors:
        lines.append("tensors:")
        rows = [["name", "shape", "dtype", "storage", "bytes"]]
        for t in program.tensors:
            nbytes = math.prod(t.shape) * TENSOR_ITEMSIZE[t.dtype]
            where = "inline" if t.data is not None else f"external {t.file}:{t.key}"
            rows.append([t.name, str(tuple(t.shape)), t.dtype, where, f"{nbytes:,}"])
        lines += _table(rows)
    if program.data:
        loads = sum(1 for d in program.data if d.tensor is not None)
        lines.append(f"data initialisers: {loads} tensor load(s), "
                     f"{len(program.data) - loads} inline")
    if program.symbols:
        lines.append("symbols:")
        rows = [["name", "kind", "dtype", "shape", "pieces", "SRAM dtype"]]
        in_hbm = {p.symbol for p in program.hbm_pieces}
        for s in program.symbols:
            stored = ", ".join(sorted({DTYPE_NAMES[p.dtype] for p in s.pieces}))
            pieces = "HBM" if s.name in in_hbm else str(len(s.pieces))
            rows.append([s.name, s.kind, s.dtype, str(tuple(s.shape)), pieces, stored or "-"])
        lines += _table(rows)
    if program.hbm_allocs:
        lines += _hbm_lines(program)
    if program.meta:
        lines.append("meta: " + ", ".join(f"{k}={_brief(v)}" for k, v in sorted(program.meta.items())))
    return "\n".join(lines) + "\n"


def _brief(value) -> str:
    """A metadata value for one line: scalars as they are, a list as its length (a compiler's
    stage table has hundreds of entries), a dict as its brief entries."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_brief(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return repr(value) if len(repr(value)) <= 40 else f"[{len(value)} entries]"
    return repr(value)

"""Machine-independent validity of a Program: `check_program`, run by ProgramBuilder.build,
program.bin's dumps and loads (isa/binfmt.py) and the compiler's pack.

Every failure is one FormatError whose .subject names the offending part ("region", i), ("instr",
region, index), ... so that the builder and the assembler can point at the source line. What a
machine adds (the fabric's size, the SRAM per PE, colors) is checked by the loader
(emulator/load.py), not here.
"""

from __future__ import annotations

import bisect
import json
import math

import numpy as np

from wse_emu.isa.encoding import decode
from wse_emu.isa.errors import EncodingError, FormatError
from wse_emu.isa.expr import PLAIN_NAME, RESERVED
from wse_emu.isa.program import (ALL_LAYERS, DIR_BITS, MODEL_FAMILIES, MODEL_MAPPINGS,
                                 MODEL_TARGETS, ModelInfo, ModelPart, Program, Rect, Symbol,
                                 TileMap, tensor_view_2d)
from wse_emu.isa.spec import DTYPE_BYTES, DTYPE_NAMES, FLOAT_DTYPES, SYMBOL_DTYPES, TENSOR_ITEMSIZE

LIMIT = 1 << 31  # coordinates, sizes and addresses stay below this (a sanity bound, not a machine)
HBM_LIMIT = 1 << 48  # the same for HBM addresses and sizes (a 16 GB model needs more than 2**31)


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
        json.dumps(program.meta, allow_nan=False)
    except (TypeError, ValueError) as e:
        _fail(f"meta is not JSON: {e}", "meta")
    if not all(isinstance(k, str) for k in program.meta):
        _fail("meta keys must be strings", "meta")


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
                           ("mapping", MODEL_MAPPINGS), ("dtype", FLOAT_DTYPES)):
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
    for field in ("shape_only", "prefill"):
        if not isinstance(getattr(m, field), bool):
            _fail(f"model {field} must be true or false, got {getattr(m, field)!r}", "model")
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

"""Program + machine -> the struct-of-arrays state both interpreters run on.

Everything is checked here, before anything runs: the program must fit the machine's fabric,
colors and SRAM, and every route tree must be well formed. A problem raises LoadError with one
line naming what and where (exit code 2 in the CLI).

State is allocated for the PEs the program uses only: an 8 x 8 program on a full wse3 preset
costs what 64 PEs cost. SRAM is one flat uint8 array, `pe_stride` bytes per PE (the largest SRAM
footprint of any region, rounded up to 8), with float32 / uint16 views for the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emulator.machine import Machine
from isa.encoding import decode_fields
from isa.program import DIR_NAMES, DIR_RAMP, DIR_STEP, OPPOSITE, Program, Rect, TileMap
from isa.spec import BY_MNEMONIC, DTYPE_BYTES, DTYPE_NAMES, INSTR_BYTES, N_IREG_SLOTS, SPECIAL_IREGS
from isa.tensors import TensorError, as_2d, tensor_array

N_PORTS = 5  # links per router: N, E, S, W neighbours, and RAMP down to its own PE

OP_DMEM = BY_MNEMONIC["dmem"].opcode
OP_DFOUT = BY_MNEMONIC["dfout"].opcode
OP_DFIN = BY_MNEMONIC["dfin"].opcode


class LoadError(Exception):
    """The program cannot run on this machine; the message is one line."""


@dataclass
class Loaded:
    machine: Machine
    program: Program
    n_pes: int
    pe_x: np.ndarray  # int32 (n_pes,) absolute column
    pe_y: np.ndarray  # int32 (n_pes,) absolute row
    pe_region: np.ndarray  # int32 (n_pes,)
    pe_code_start: np.ndarray  # int32 (n_pes,) first instruction of its region in the code arrays
    pe_code_len: np.ndarray  # int32 (n_pes,)
    code_op: np.ndarray  # int32 (n_instr,) all regions' decoded code, concatenated
    code_a: np.ndarray
    code_b: np.ndarray
    code_c: np.ndarray
    code_imm: np.ndarray  # int64: slot I, sign-extended
    code_il: np.ndarray  # int64: slot IL, unsigned
    code_ih: np.ndarray  # int64: slot IH, signed
    ireg_init: np.ndarray  # int64 (n_pes, N_IREG_SLOTS): zeros and the read-only specials
    pe_stride: int  # SRAM bytes allocated per PE
    sram: np.ndarray  # uint8 (n_pes * pe_stride,)
    grid_w: int  # fabric box the program touches (from (0, 0)); link ids = cell * 5 + port
    grid_h: int
    pe_of_cell: np.ndarray  # int32 (grid_h * grid_w,) PE index of a cell, -1 where no code runs
    tree_start: np.ndarray  # int32 (n_pes * colors,) first entry of the (pe, color) route tree, -1
    tree_count: np.ndarray  # int32 (n_pes * colors,)
    tree_link: np.ndarray  # int32 (n_entries,) link the entry reserves
    tree_parent: np.ndarray  # int32: entry whose router this link leaves from, -1 = source router
    tree_dest: np.ndarray  # int32: PE index for a RAMP delivery, else -1
    base_dir: str | None  # folder external tensors are relative to
    # SRAM row of every PE in sram_view() (-1: no SRAM). Functional: every PE, in order.
    # Timing-only: only PEs whose region has scalar memory instructions (lw/sw/flw/fsw) keep
    # their SRAM (host inputs such as token ids and positions drive their control flow);
    # tensor ops, fabric transfers and DMA move no data, so no other PE needs any.
    sram_row: np.ndarray = None
    timing_only: bool = False

    @property
    def colors(self) -> int:
        return self.machine.colors

    @property
    def n_links(self) -> int:
        return self.grid_w * self.grid_h * N_PORTS

    def sram_view(self) -> np.ndarray:
        """(rows, pe_stride) view of the SRAM: PE p's is row sram_row[p] (row p when
        functional)."""
        return self.sram.reshape(-1, self.pe_stride)

    def pe_index(self, x: int, y: int) -> int:
        if 0 <= x < self.grid_w and 0 <= y < self.grid_h:
            return int(self.pe_of_cell[y * self.grid_w + x])
        return -1


def load(program: Program, machine: Machine, base_dir: str | None = None,
         with_data: bool = True) -> Loaded:
    """Check `program` against `machine` and build the initial state (data initialised)."""
    box = program.bounding_box()
    m = machine
    if box.w > m.width or box.h > m.height:
        raise LoadError(f"program needs a {box.w} x {box.h} fabric but machine '{m.name}' has "
                        f"{m.width} x {m.height}")
    _check_regions(program, m)
    fields = [decode_fields(r.code) for r in program.regions]
    _check_code(program, m, fields)

    pes = [(x, y, ri) for ri, r in enumerate(program.regions) for (x, y) in r.rect.cells()]
    n = len(pes)
    pe_x = np.array([p[0] for p in pes], dtype=np.int32)
    pe_y = np.array([p[1] for p in pes], dtype=np.int32)
    pe_region = np.array([p[2] for p in pes], dtype=np.int32)
    starts = np.cumsum([0] + [len(r.code) for r in program.regions]).astype(np.int32)
    pe_code_start = starts[pe_region]
    pe_code_len = np.array([len(program.regions[i].code) for i in pe_region], dtype=np.int32)
    cat = {k: np.concatenate([np.asarray(f[k], dtype=np.int64) for f in fields] or
                             [np.zeros(0, np.int64)]) for k in ("op", "a", "b", "c", "imm", "il", "ih")}

    ireg = np.zeros((n, N_IREG_SLOTS), dtype=np.int64)
    rects = [program.regions[i].rect for i in pe_region]
    ireg[:, SPECIAL_IREGS["X"]] = pe_x - np.array([r.x for r in rects])
    ireg[:, SPECIAL_IREGS["Y"]] = pe_y - np.array([r.y for r in rects])
    ireg[:, SPECIAL_IREGS["W"]] = [r.w for r in rects]
    ireg[:, SPECIAL_IREGS["H"]] = [r.h for r in rects]
    ireg[:, SPECIAL_IREGS["GX"]] = pe_x
    ireg[:, SPECIAL_IREGS["GY"]] = pe_y

    pe_of_cell = np.full(box.w * box.h, -1, dtype=np.int32)
    pe_of_cell[pe_y * box.w + pe_x] = np.arange(n, dtype=np.int32)

    stride = max([program.region_sram_bytes(r) for r in program.regions] + [8])
    stride = (stride + 7) // 8 * 8
    if with_data:
        sram_row = np.arange(n, dtype=np.int64)
    else:
        scalar = np.array([_has_scalar_memory(f) for f in fields] + [False], dtype=bool)
        keeps = scalar[pe_region]
        sram_row = np.where(keeps, np.cumsum(keeps) - 1, -1).astype(np.int64)
    sram = np.zeros(int(max(1, sram_row.max(initial=-1) + 1)) * stride, dtype=np.uint8)

    trees = _build_trees(program, m, box, pe_of_cell, pe_x, pe_y)
    loaded = Loaded(
        machine=m, program=program, n_pes=n, pe_x=pe_x, pe_y=pe_y, pe_region=pe_region,
        pe_code_start=pe_code_start, pe_code_len=pe_code_len,
        code_op=cat["op"].astype(np.int32), code_a=cat["a"].astype(np.int32),
        code_b=cat["b"].astype(np.int32), code_c=cat["c"].astype(np.int32),
        code_imm=cat["imm"], code_il=cat["il"], code_ih=cat["ih"],
        ireg_init=ireg, pe_stride=stride, sram=sram, grid_w=box.w, grid_h=box.h,
        pe_of_cell=pe_of_cell, base_dir=base_dir, sram_row=sram_row,
        timing_only=not with_data, **trees)
    _init_data(loaded)
    return loaded


_SCALAR_MEMORY = {BY_MNEMONIC[m].opcode for m in ("lw", "sw", "flw", "fsw")}


def _has_scalar_memory(fields) -> bool:
    return any(int(op) in _SCALAR_MEMORY for op in fields["op"])


# ---------------------------------------------------------------------------------------------
# checks


def _check_regions(program: Program, m: Machine) -> None:
    for r in program.regions:
        need = program.region_sram_bytes(r)
        if need > m.sram_bytes:
            code = len(r.code) * INSTR_BYTES
            raise LoadError(
                f"PE ({r.rect.x},{r.rect.y}) of region '{r.name}' needs {need} bytes of SRAM "
                f"(code {code}, data and buffers {need - code}) but machine '{m.name}' has "
                f"{m.sram_bytes}: over by {need - m.sram_bytes}")
    for rule in program.routes:
        if rule.color >= m.colors:
            raise LoadError(f"route at ({rule.rect.x},{rule.rect.y}) uses color {rule.color} but "
                            f"machine '{m.name}' has colors 0-{m.colors - 1}")


def _check_code(program: Program, m: Machine, fields: list[dict]) -> None:
    for r, f in zip(program.regions, fields):
        for i, op in enumerate(f["op"]):
            where = f"region '{r.name}' instruction {i}"
            if op in (OP_DFIN, OP_DFOUT) and f["c"][i] >= m.colors:
                raise LoadError(f"{where}: color {f['c'][i]} but machine '{m.name}' has colors "
                                f"0-{m.colors - 1}")
            if op == OP_DMEM:
                addr, length, dt = f["il"][i], f["ih"][i], f["b"][i]
                end = addr + length * DTYPE_BYTES.get(dt, 4)
                if end > m.sram_bytes:
                    raise LoadError(f"{where}: descriptor at address {addr} of {length} "
                                    f"{DTYPE_NAMES.get(dt, '?')} ends at byte {end}, outside "
                                    f"the {m.sram_bytes}-byte SRAM")


# ---------------------------------------------------------------------------------------------
# routes


def _paint_routes(program: Program, box: Rect, colors: int) -> tuple[np.ndarray, np.ndarray]:
    rx = np.zeros((colors, box.h, box.w), dtype=np.int8)
    tx = np.zeros((colors, box.h, box.w), dtype=np.int8)
    for rule in program.routes:
        r = rule.rect
        rx[rule.color, r.y:r.y + r.h, r.x:r.x + r.w] = rule.rx
        tx[rule.color, r.y:r.y + r.h, r.x:r.x + r.w] = rule.tx
    return rx, tx


def _build_trees(program, m, box, pe_of_cell, pe_x, pe_y) -> dict:
    n = len(pe_x)
    colors = m.colors
    rx, tx = _paint_routes(program, box, colors)
    # A tree for every (PE, color) whose route accepts RAMP: the PE may send there. Sending on
    # a color without one is a fault at run time (SPMD code may hold sends a PE never reaches).
    tree_start = np.full(n * colors, -1, dtype=np.int32)
    tree_count = np.zeros(n * colors, dtype=np.int32)
    link, parent, dest = [], [], []
    senders = np.nonzero((rx[:, pe_y, pe_x] & (1 << DIR_RAMP)).T)  # (pe indices, colors)
    for pe, color in zip(*senders):
        pe, color = int(pe), int(color)
        x0, y0 = int(pe_x[pe]), int(pe_y[pe])
        tree_start[pe * colors + color] = len(link)
        first = len(link)
        seen = {(x0, y0)}
        frontier = [(x0, y0, -1)]  # router position and the entry that reached it
        while frontier:
            x, y, via = frontier.pop(0)
            out = int(tx[color, y, x])
            if out == 0:
                raise LoadError(f"color {color} from PE ({x0},{y0}) is dropped at ({x},{y}): "
                                f"its route forwards nowhere")
            for port in range(5):
                if not out & (1 << port):
                    continue
                cell = y * box.w + x
                link.append(cell * N_PORTS + port)
                parent.append(via)
                if port == DIR_RAMP:
                    target = int(pe_of_cell[cell])
                    if target < 0:
                        raise LoadError(f"color {color} from PE ({x0},{y0}) delivers to "
                                        f"({x},{y}), which runs no code")
                    dest.append(target)
                    continue
                dest.append(-1)
                dx, dy = DIR_STEP[port]
                nx, ny = x + dx, y + dy
                if not (0 <= nx < m.width and 0 <= ny < m.height):
                    raise LoadError(f"route for color {color} at ({x},{y}) sends "
                                    f"{DIR_NAMES[port]} off the fabric (machine '{m.name}' "
                                    f"is {m.width} x {m.height})")
                came_from = OPPOSITE[port]
                if not (nx < box.w and ny < box.h and rx[color, ny, nx] & (1 << came_from)):
                    raise LoadError(f"color {color} from PE ({x0},{y0}) is dropped at "
                                    f"({nx},{ny}): its route for color {color} does not "
                                    f"accept wavelets from {DIR_NAMES[came_from]}")
                if (nx, ny) in seen:
                    raise LoadError(f"color {color} from PE ({x0},{y0}) loops: ({nx},{ny}) "
                                    f"is reached twice")
                seen.add((nx, ny))
                frontier.append((nx, ny, len(link) - 1))
        if all(d < 0 for d in dest[first:]):
            raise LoadError(f"color {color} from PE ({x0},{y0}) reaches no PE (no route "
                            f"ends in RAMP)")
        tree_count[pe * colors + color] = len(link) - first
    as32 = lambda v: np.array(v, dtype=np.int32)  # noqa: E731
    return dict(tree_start=tree_start, tree_count=tree_count, tree_link=as32(link),
                tree_parent=as32(parent), tree_dest=as32(dest))


# ---------------------------------------------------------------------------------------------
# data and symbols


def _storage_bytes(values: np.ndarray, tag: str, dtype: int) -> np.ndarray:
    """Values (any source dtype) -> raw storage bytes of `dtype`, last axis = elements."""
    from kernels.convert import bf16_to_f32_array, f32_to_bf16_array

    name = DTYPE_NAMES[dtype]
    if tag == "bf16":
        if name == "bf16":
            return np.ascontiguousarray(values, dtype=np.uint16).view(np.uint8)
        values = bf16_to_f32_array(values)
    if name == "i32":
        out = np.ascontiguousarray(values, dtype=np.int32)
    elif name == "f32":
        out = np.ascontiguousarray(values, dtype=np.float32)
    elif name == "f16":
        out = np.ascontiguousarray(np.asarray(values, dtype=np.float32).astype(np.float16))
    else:
        out = f32_to_bf16_array(np.ascontiguousarray(values, dtype=np.float32))
    return out.view(np.uint8)


def _tile_pes(loaded: Loaded, tm: TileMap) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pe indices, tile row indices, tile col indices) of every PE of the tile map's rect."""
    ys, xs = np.mgrid[tm.rect.y:tm.rect.y + tm.rect.h, tm.rect.x:tm.rect.x + tm.rect.w]
    xs, ys = xs.ravel(), ys.ravel()
    pes = loaded.pe_of_cell[ys * loaded.grid_w + xs] if loaded.grid_w else np.zeros(0, np.int32)
    if (pes < 0).any():
        k = int(np.argmax(pes < 0))
        raise LoadError(f"data or symbol at ({xs[k]},{ys[k]}) lies on a PE that runs no code")
    rx, ry = xs - tm.rect.x, ys - tm.rect.y
    ti = tm.row0 + ry * tm.row_dy + rx * tm.row_dx
    tj = tm.col0 + ry * tm.col_dy + rx * tm.col_dx
    return pes, ti, tj


def _tiles(t2: np.ndarray, tm: TileMap, ti, tj, what: str) -> np.ndarray:
    """(n_pes, tile elements) of the 2-D tensor in the map's order, zero-padded at the edges."""
    tr, tc = tm.tile
    rows = -(-t2.shape[0] // tr)
    cols = -(-t2.shape[1] // tc)
    if ti.size and (ti.min() < 0 or tj.min() < 0 or ti.max() >= rows or tj.max() >= cols):
        raise LoadError(f"{what}: tile map reaches tile ({int(ti.max())},{int(tj.max())}) of a "
                        f"{rows} x {cols} grid of {tr} x {tc} tiles")
    if rows * tr != t2.shape[0] or cols * tc != t2.shape[1]:
        padded = np.zeros((rows * tr, cols * tc), dtype=t2.dtype)
        padded[:t2.shape[0], :t2.shape[1]] = t2
        t2 = padded
    grid = t2.reshape(rows, tr, cols, tc)
    tiles = grid[ti, :, tj, :]  # (n, tr, tc)
    if tm.order == "F":
        tiles = tiles.transpose(0, 2, 1)
    return tiles.reshape(len(ti), tr * tc)


def _write_tiles(loaded: Loaded, tm: TileMap, values: np.ndarray, tag: str, what: str) -> None:
    pes, ti, tj = _tile_pes(loaded, tm)
    rows = loaded.sram_row[pes]
    keep = rows >= 0
    if not keep.any():
        return
    if not keep.all():
        ti, tj, rows = ti[keep], tj[keep], rows[keep]
    raw = _storage_bytes(_tiles(as_2d(values), tm, ti, tj, what), tag, tm.dtype)
    view = loaded.sram_view()
    view[rows, tm.addr:tm.addr + raw.shape[1]] = raw


def _init_data(loaded: Loaded) -> None:
    view = loaded.sram_view()
    for r, start in zip(loaded.program.regions, _region_starts(loaded)):
        rows = loaded.sram_row[start:start + r.rect.size]
        code = np.asarray(r.code, dtype=np.uint64).view(np.uint8)
        view[rows[rows >= 0], :code.size] = code
    tensors = {t.name: t for t in loaded.program.tensors}
    for d in loaded.program.data:
        if d.tensor is None:
            pes, _, _ = _tile_pes(loaded, d.tilemap)
            rows = loaded.sram_row[pes]
            raw = np.frombuffer(d.inline, dtype=np.uint8)
            view[rows[rows >= 0], d.tilemap.addr:d.tilemap.addr + raw.size] = raw
            continue
        if loaded.timing_only:
            pes, _, _ = _tile_pes(loaded, d.tilemap)
            if (loaded.sram_row[pes] < 0).all():
                continue  # no PE that keeps SRAM needs this tensor: do not even read it
        try:
            values, tag = tensor_array(tensors[d.tensor], loaded.base_dir)
        except TensorError as e:
            raise LoadError(str(e)) from None
        _write_tiles(loaded, d.tilemap, values, tag, f"tensor '{d.tensor}'")


def _region_starts(loaded: Loaded) -> list[int]:
    sizes = [r.rect.size for r in loaded.program.regions]
    return list(np.cumsum([0] + sizes[:-1]))


_HOST_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": np.float32, "i32": np.int32}


def symbol(loaded: Loaded, name: str, kind: str):
    for s in loaded.program.symbols:
        if s.name == name and s.kind == kind:
            return s
    names = [s.name for s in loaded.program.symbols if s.kind == kind]
    raise LoadError(f"program has no {kind} {name!r} ({kind}s: {', '.join(names) or 'none'})")


def write_input(loaded: Loaded, name: str, values: np.ndarray) -> None:
    """Scatter a host array into every piece of input symbol `name`."""
    s = symbol(loaded, name, "input")
    values = np.asarray(values)
    if values.dtype.kind not in "biuf":
        raise LoadError(f"--input {name}: values have dtype {values.dtype}, expected numbers")
    if tuple(values.shape) != tuple(s.shape):
        raise LoadError(f"input {name!r} must have shape {tuple(s.shape)}, got {values.shape}")
    tag = "<i4" if s.dtype == "i32" else "<f4"
    values = values.astype(np.int32 if s.dtype == "i32" else np.float32)
    for piece in s.pieces:
        _write_tiles(loaded, piece, values, tag, f"input '{name}'")


def check_input_names(program: Program, names) -> None:
    """LoadError for a name that is not an input symbol of the program."""
    declared = sorted(s.name for s in program.symbols if s.kind == "input")
    for name in names:
        if name not in declared:
            raise LoadError(f"--input {name}: the program has no input {name!r} "
                            f"(inputs: {', '.join(declared) or 'none'})")


def write_inputs(loaded: Loaded, given: dict[str, np.ndarray]) -> None:
    """Scatter every input symbol: the given arrays, `position_ids` defaulting to 0 .. T-1 (as
    in transformers); any other input left out is an error, not silent zeros."""
    check_input_names(loaded.program, given)
    for s in (s for s in loaded.program.symbols if s.kind == "input"):
        if s.name in given:
            write_input(loaded, s.name, given[s.name])
        elif s.name == "position_ids":
            n = int(np.prod(s.shape))
            write_input(loaded, s.name, np.arange(n, dtype=np.int32).reshape(s.shape))
        else:
            raise LoadError(f"input {s.name!r} not given: pass --input {s.name}=FILE.npy")


def read_output(loaded: Loaded, name: str) -> np.ndarray:
    """Gather output symbol `name` from SRAM into a host array of its shape and dtype."""
    from kernels.convert import bf16_to_f32_array

    s = symbol(loaded, name, "output")
    if loaded.timing_only:
        raise LoadError(f"output {name!r}: a timing-only run computes no values (run "
                        f"functionally to read outputs)")
    shape2 = as_2d(np.zeros(s.shape, dtype=np.int8)).shape
    out = np.zeros(shape2, dtype=_HOST_DTYPES[s.dtype])
    view = loaded.sram_view()
    for tm in s.pieces:
        pes, ti, tj = _tile_pes(loaded, tm)
        _, first = np.unique(np.stack([ti, tj], axis=1), axis=0, return_index=True)
        tr, tc = tm.tile
        nbytes = tr * tc * DTYPE_BYTES[tm.dtype]
        raw = np.ascontiguousarray(view[pes[first], tm.addr:tm.addr + nbytes])
        name_dt = DTYPE_NAMES[tm.dtype]
        if name_dt == "bf16":
            vals = bf16_to_f32_array(raw.view(np.uint16))
        else:
            vals = raw.view({"f32": np.float32, "f16": np.float16, "i32": np.int32}[name_dt])
        vals = vals.reshape(len(first), tr, tc) if tm.order == "C" else \
            vals.reshape(len(first), tc, tr).transpose(0, 2, 1)
        for v, i, j in zip(vals, ti[first], tj[first]):
            r0, c0 = i * tr, j * tc
            r1, c1 = min(r0 + tr, shape2[0]), min(c0 + tc, shape2[1])
            out[r0:r1, c0:c1] = v[:r1 - r0, :c1 - c0]
    return out.reshape(s.shape)


def base_dir_of(path: str | None) -> str | None:
    return str(Path(path).resolve().parent) if path else None

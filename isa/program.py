"""The Program: what the assembler, the builder and the compiler produce and the emulator loads.

A Program is plain data (frozen dataclasses, tuples, bytes), independent of any machine; the
loader checks it against a machine preset. Coordinates are absolute fabric coordinates, x to the
east (columns), y to the south (rows); (0, 0) is the north-west corner.

Compactness: nothing here is per PE. Regions, route rules and tile maps are rectangles with
affine rules, so a program for a 900k-PE wafer is as small as its distinct code and tensors.

HBM (machines with off-chip memory): one flat byte address space per machine, shared by every
core. A program declares named buffers in it (`hbm_allocs`), fills some with tensor data before
the run (`hbm_inits`, e.g. the weights an HBM-streaming program DMAs into SRAM tile by tile),
and may keep whole host inputs / outputs there (`hbm_pieces`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

# Directions of a router port; a route's rx / tx are bit masks over these.
DIR_N, DIR_E, DIR_S, DIR_W, DIR_RAMP = 0, 1, 2, 3, 4
DIR_NAMES = ("N", "E", "S", "W", "RAMP")
DIR_BITS = {name: 1 << i for i, name in enumerate(DIR_NAMES)}
# (dx, dy) of the neighbour reached through an output port.
DIR_STEP = {DIR_N: (0, -1), DIR_E: (1, 0), DIR_S: (0, 1), DIR_W: (-1, 0)}
OPPOSITE = {DIR_N: DIR_S, DIR_S: DIR_N, DIR_E: DIR_W, DIR_W: DIR_E}


@dataclass(frozen=True)
class Rect:
    x: int
    y: int
    w: int
    h: int

    def contains(self, x: int, y: int) -> bool:
        return self.x <= x < self.x + self.w and self.y <= y < self.y + self.h

    def cells(self):
        for y in range(self.y, self.y + self.h):
            for x in range(self.x, self.x + self.w):
                yield x, y

    @property
    def size(self) -> int:
        return self.w * self.h


def _overlaps(a: Rect, b: Rect) -> bool:
    return a.x < b.x + b.w and b.x < a.x + a.w and a.y < b.y + b.h and b.y < a.y + a.h


@dataclass(frozen=True)
class Alloc:
    """A named SRAM buffer of a region (same address on every PE of the region)."""

    name: str
    addr: int  # byte address
    nbytes: int


@dataclass(frozen=True)
class Region:
    """A rectangle of PEs running the same code (SPMD). Regions must not overlap.

    SRAM layout of every PE in the region: the code at address 0 (8 bytes an instruction), then
    whatever the allocs, data initialisers and symbol pieces use. `sram_bytes` is the highest
    byte any of them uses (the loader recomputes and checks it).
    """

    name: str
    rect: Rect
    code: tuple[int, ...]  # encoded 64-bit instruction words
    allocs: tuple[Alloc, ...] = ()
    labels: tuple[tuple[str, int], ...] = ()  # (label, instruction index), for disassembly


@dataclass(frozen=True)
class RouteRule:
    """For every PE in rect, color: wavelets accepted from `rx` (mask) go out on `tx` (mask).

    Rules apply in order; a later rule for the same PE and color replaces an earlier one.
    """

    rect: Rect
    color: int
    rx: int  # mask over DIR_BITS
    tx: int  # mask over DIR_BITS; several bits = multicast


@dataclass(frozen=True)
class TileMap:
    """How a 2-D tensor (rows, cols) is laid out over a rectangle of PEs.

    The PE at region-relative (rx, ry) = (x - rect.x, y - rect.y) holds the tile of `tile`
    = (tile_rows, tile_cols) elements whose tile index is
        ti = row0 + ry * row_dy + rx * row_dx
        tj = col0 + ry * col_dy + rx * col_dx
    i.e. elements [ti*tile_rows : (ti+1)*tile_rows, tj*tile_cols : (tj+1)*tile_cols], stored at
    byte address `addr` in `dtype` (isa.spec.STORAGE_DTYPES), column-major when order == "F" (the
    layout `mv` expects), row-major when "C". A step of 0 replicates a tile over PEs.
    1-D tensors are (n, 1).
    """

    rect: Rect
    addr: int
    dtype: int
    tile: tuple[int, int]
    row0: int = 0
    row_dy: int = 0
    row_dx: int = 0
    col0: int = 0
    col_dy: int = 0
    col_dx: int = 0
    order: str = "C"

    def tile_index(self, x: int, y: int) -> tuple[int, int]:
        rx, ry = x - self.rect.x, y - self.rect.y
        return (self.row0 + ry * self.row_dy + rx * self.row_dx,
                self.col0 + ry * self.col_dy + rx * self.col_dx)

    @property
    def nbytes(self) -> int:
        from wse_emu.isa.spec import DTYPE_BYTES

        return self.tile[0] * self.tile[1] * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Tensor:
    """A named tensor the program's data initialisers read from.

    Either `data` holds the raw bytes (C order, `dtype` a NumPy dtype string such as '<f4' or
    '<f2'), or `file` names a safetensors file (relative to the program.bin's folder, or
    absolute) and `key` the tensor inside it, so that large models are referenced, not copied.
    """

    name: str
    dtype: str  # NumPy dtype string of the source ('<f4', '<f2', '<i4'), or 'bf16'
    shape: tuple[int, ...]
    data: bytes | None = None
    file: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class DataInit:
    """Initialise SRAM before the run: a tile of tensor `tensor` on every PE of `tilemap.rect`,
    or (tensor None) the same `inline` bytes at `tilemap.addr` on every PE of the rect."""

    tilemap: TileMap
    tensor: str | None = None
    inline: bytes = b""


@dataclass(frozen=True)
class Symbol:
    """A named input or output of the program, scattered / gathered by the host.

    `shape` is the logical shape (any rank); its 2-D view for the tile maps is
    (prod(shape[:-1]), shape[-1]) for rank >= 2 and (n, 1) for rank 1. Inputs are written to
    every PE of every piece (pieces may replicate); outputs are read from each piece's PEs, and
    a tile held by several PEs is read from the first in row-major PE order. A symbol kept in
    HBM instead (an HbmPiece of Program.hbm_pieces) has no SRAM pieces.
    """

    name: str
    kind: str  # "input" | "output"
    dtype: str  # logical host dtype: 'f32' | 'f16' | 'bf16' | 'i32'
    shape: tuple[int, ...]
    pieces: tuple[TileMap, ...]  # SRAM pieces; () when the symbol lives in HBM


class HbmAlloc(NamedTuple):
    """A named HBM buffer: bytes [addr, addr + nbytes) of the machine's HBM."""

    name: str
    addr: int
    nbytes: int


def tensor_view_2d(shape: tuple[int, ...]) -> tuple[int, int]:
    """The (rows, cols) that tile maps and HBM inits see of a tensor or symbol of this shape:
    (prod(shape[:-1]), shape[-1]) for rank >= 2, (n, 1) for rank 1."""
    if len(shape) == 1:
        return (shape[0], 1)
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return (rows, shape[-1])


@dataclass(frozen=True)
class HbmInit:
    """Tensor data written into HBM before the run.

    The stored matrix S is the tensor's 2-D view (tensor_view_2d), transposed when `transpose`
    (S = S.T), then cut to rows [rows[0], rows[1]) when `rows` is given. S is split into row
    tiles of `tile_rows` rows (0 = one tile of all rows; it must divide S's row count), written
    one after another from byte address `addr`, each tile column-major when order == "F" (the
    (tile_rows x K) layout `mv` consumes, so a program streams a matrix with one DMA a tile) or
    row-major when "C", converted to `dtype` (isa.spec.STORAGE_DTYPES) as `.load` converts.
    """

    tensor: str
    addr: int
    dtype: int
    tile_rows: int = 0
    order: str = "F"
    transpose: bool = False
    rows: tuple[int, int] | None = None

    def matrix_shape(self, tensor_shape: tuple[int, ...]) -> tuple[int, int]:
        """(rows, cols) of S for a tensor of this shape (after transpose and the row slice)."""
        r, c = tensor_view_2d(tuple(tensor_shape))
        if self.transpose:
            r, c = c, r
        if self.rows is not None:
            r = self.rows[1] - self.rows[0]
        return (r, c)

    def nbytes(self, tensor_shape: tuple[int, ...]) -> int:
        from wse_emu.isa.spec import DTYPE_BYTES

        r, c = self.matrix_shape(tensor_shape)
        return r * c * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class HbmPiece:
    """Input or output `symbol` kept in HBM: all its elements, row-major, contiguous from byte
    address `addr`, in storage dtype `dtype`. Such a symbol has no SRAM pieces."""

    symbol: str
    addr: int
    dtype: int


MODEL_FAMILIES = ("gpt2", "llama", "bert")
MODEL_TARGETS = ("mesh", "hbm")
MODEL_MAPPINGS = ("wafer", "chain", "kernel")
ALL_LAYERS = -2  # the layer of a part that serves every layer (the HBM target's one kernel)


@dataclass(frozen=True)
class ModelPart:
    """The PEs of one part of a compiled model and the compiler's prediction for it.

    layer: -1 before the first layer (embeddings, the position sources), 0 .. layers - 1, or
    `layers` after the last (final norm, LM head); ALL_LAYERS for a part that runs every layer
    (the HBM target's kernel). regions: the names of the regions whose PEs are the part's.
    predicted_cycles: the part's cycles in one decode step by the compiler's cost model (0: not
    predicted)."""

    name: str
    layer: int
    regions: tuple[str, ...]
    predicted_cycles: int = 0


@dataclass(frozen=True)
class ModelInfo:
    """What a runtime needs to know about a compiled model (docs/program-bin.md, MODEL)."""

    family: str  # MODEL_FAMILIES
    target: str  # "mesh": weights resident in SRAM; "hbm": streamed from HBM
    mapping: str  # "wafer" (layers on grids), "chain" (stage chain), "kernel" (HBM target)
    machine: str  # the preset it was compiled for
    dtype: str  # weight storage: f32, f16, bf16
    layers: int
    hidden: int
    vocab: int
    max_context: int  # KV-cache positions
    positions: int  # positions one run processes (1: a decode step)
    parts: tuple[ModelPart, ...] = ()
    shape_only: bool = False  # compiled without weights (no functional run; timing only)
    chips: int = 1  # the chips (wafers) of the system it was compiled for
    # a mesh model split over a system's wafers: per chip (first layer, layers), contiguous
    # and covering every layer in order; () when one chip holds every layer
    groups: tuple[tuple[int, int], ...] = ()
    crossing_cycles: tuple[int, ...] = ()  # predicted cycles of each crossing c -> c + 1
    # independent sequences in flight: B KV caches; a run takes one token of each (input_ids
    # and position_ids of B values, logits B x vocab); the wafer mapping pipelines them
    sequences: int = 1
    # a prefill program (compile --prefill B): the B are consecutive positions of one
    # sequence, appended to one KV cache in order (a run takes B prompt tokens)
    prefill: bool = False

    def part_of_region(self) -> dict[str, ModelPart]:
        return {r: p for p in self.parts for r in p.regions}


def pipelined_cycles(parts: dict, sequences: int = 1) -> int:
    """Predicted cycles of a step that carries `sequences` tokens, one a sequence, through
    regions connected by dataflow (the wafer mapping): the first sequence crosses every part
    in series, and each later one leaves the slowest part one period of that part after the
    one before it (part k works on sequence s while part k + 1 works on s - 1).
    parts: part name -> predicted cycles of one sequence's pass through it.

    A formula over the parts' predictions that ModelInfo records, so it lives beside them:
    the compiler sums its prediction with it, and the host driver (emulator/generate.py)
    reports it beside the emulated cycles without importing the compiler."""
    if not parts:
        return 0
    values = [int(v) for v in parts.values()]
    return sum(values) + (max(sequences, 1) - 1) * max(values)


@dataclass(frozen=True)
class Program:
    name: str
    regions: tuple[Region, ...]
    routes: tuple[RouteRule, ...] = ()
    tensors: tuple[Tensor, ...] = ()
    data: tuple[DataInit, ...] = ()
    symbols: tuple[Symbol, ...] = ()
    params: tuple[tuple[str, int | str], ...] = ()  # resolved parameters, for people and info
    meta: dict = field(default_factory=dict, hash=False, compare=False)  # free-form, JSON-able
    hbm_allocs: tuple[HbmAlloc, ...] = ()
    hbm_inits: tuple[HbmInit, ...] = ()
    hbm_pieces: tuple[HbmPiece, ...] = ()
    model: ModelInfo | None = None  # set by the compiler; None for hand-written programs

    @property
    def hbm_bytes(self) -> int:
        """The program's HBM footprint: the end of its highest HBM buffer (0 = uses no HBM)."""
        return max((a.addr + a.nbytes for a in self.hbm_allocs), default=0)

    def bounding_box(self) -> Rect:
        """Smallest rectangle from (0, 0) holding every region and route rule."""
        rects = [r.rect for r in self.regions] + [r.rect for r in self.routes]
        w = max((r.x + r.w for r in rects), default=0)
        h = max((r.y + r.h for r in rects), default=0)
        return Rect(0, 0, w, h)

    def region_sram_bytes(self, region: Region) -> int:
        """Highest SRAM byte (exclusive) used on the region's PEs by code, allocs, data and symbols."""
        from wse_emu.isa.spec import INSTR_BYTES

        top = len(region.code) * INSTR_BYTES
        for a in region.allocs:
            top = max(top, a.addr + a.nbytes)
        maps = [d.tilemap for d in self.data] + [p for s in self.symbols for p in s.pieces]
        for m in maps:
            if _overlaps(m.rect, region.rect):
                top = max(top, m.addr + m.nbytes)
        return top

    def regions_sram_bytes(self) -> list[int]:
        """region_sram_bytes of every region, in order, vectorised over the tile maps (one
        region_sram_bytes call per region costs regions x maps Python steps: seconds for a
        full-size model)."""
        import numpy as np

        from wse_emu.isa.spec import INSTR_BYTES

        regions = self.regions
        top = np.array([max([len(r.code) * INSTR_BYTES] + [a.addr + a.nbytes for a in r.allocs])
                        for r in regions], dtype=np.int64)
        maps = [d.tilemap for d in self.data] + [p for s in self.symbols for p in s.pieces]
        if maps and regions:
            mx, my, mw, mh, mend = (np.array(v, dtype=np.int64) for v in zip(*(
                (t.rect.x, t.rect.y, t.rect.w, t.rect.h, t.addr + t.nbytes) for t in maps)))
            rx, ry, rw, rh = (np.array([getattr(r.rect, k) for r in regions],
                                       dtype=np.int64)[:, None] for k in ("x", "y", "w", "h"))
            for i in range(0, len(regions), 256):  # blocks bound the (regions, maps) arrays
                b = slice(i, i + 256)
                hit = ((mx < rx[b] + rw[b]) & (rx[b] < mx + mw) & (my < ry[b] + rh[b])
                       & (ry[b] < my + mh))
                top[b] = np.maximum(top[b], np.where(hit, mend, 0).max(axis=1))
        return [int(v) for v in top]

    def colors_used(self) -> int:
        """One more than the highest color any route rule names (0 when none)."""
        return max((r.color + 1 for r in self.routes), default=0)

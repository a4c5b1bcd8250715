"""The wafer-wide decode mapping: every layer on its own R x C grid, activations split over
the grid, products followed by line allreduces, the KV cache spread over the grid
(docs/compiler.md, "The decode mapping").

    compile_decode(plan, machine, dtype, shape_only, base_dir, name) -> (Program, report)

is one function of named passes: extract (the plan's layers), choose (the grid (R, C) from
the cost model), place (grids in bands, snaking), route (allreduce lines, hand-offs, buses),
codegen (one region per grid, through the strategies of STRATEGIES; a layer's line allreduces
of one kind as one shared routine, lines.Shared), pack.

Placement. Row 0 of the fabric holds the RoPE sources (one PE a grid column), column 0 the
mask sources (one PE a grid row); grids sit on a lattice of slots C columns wide from (1, 1),
in bands of R rows. Band b (rows 1 + b R ..) is filled east when b is even and west when odd:
the embedding first, then layer 0, 1, ..., then the head. Two grids side by side in a band
hand the residual over along their rows (R links at once, K = ceil(d / R) wavelets each); at
the end of a band, the next grid is right below, and the residual goes down "the diagonal":
PE (r, r mod C) of the last grid sends row r's block down its column to row r of the grid
below, whose PE there multicasts it along its row. R paths cross the C links between the two
grids, so a grid taller than wide needs ceil(R / C) colors for them: rows r < C go on DIAG,
rows C <= r < 2 C on READY (free when one sequence is in flight; taller grids are not
placed: `levels`).

Colors: 0-4 column allreduces, 5-9 row allreduces, 10-14 the KV heads' row segments, 15-16
the hand-offs (alternating layer to layer), 17 the diagonal, 18 GPT-2's position embedding,
19 the mask bus, 20 the RoPE bus, 21-22 the crossings between wafers (a system), 23 layer 0's
ready wavelet to the embedding (several sequences) or the diagonal's rows C .. 2 C - 1 (R >
C).

Sequences (sequences = B > 1): B KV caches a layer; every region loops over the B sequences
with one loop body (_Emitter.loop), so that the layers' regions pipeline them (SEQ ..
below; docs/compiler.md, "Sequences in flight"). A prefill program (prefill=True,
Decoder.one_cache): the same loop over B consecutive positions of one sequence, one KV cache
(offsets 0), the head keeping the last position's logits only (docs/compiler.md, "Prefill
programs").

Systems. On a machine of several wafers (machine.chips > 1, wafer c holding rows
[c H, (c + 1) H)) the layers are split into contiguous groups, one a wafer and every wafer
used (split_layers, balanced by the cost model); each wafer's items snake through its own
rows from its own row 0 (RoPE sources) as above, the embedding on wafer 0 and the head on the
last, and the residual crosses from the last grid of a wafer to the first of the next
(cross_path, crossing_cycles); with R > C its rows C .. 2 C - 1 cross on the other CROSS
color, which is free there when every wafer between two others has two bands or more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.compiler import map_attention, map_elementwise, map_embedding, map_gemv, \
    map_head
from wse_emu.isa.compiler.decoder import Decoder, Geometry, divisors, extract, geometry, \
    grid_shapes
from wse_emu.isa.compiler.emit import I32, Labels
from wse_emu.isa.compiler.lines import InstrCount, LineKind, Shared, call_cycles, \
    cycles as line_cycles, routes, setup_flags, setup_roles
from wse_emu.isa.compiler.lower import CompileError, Plan
from wse_emu.isa.compiler.pack import CompileReport, Weights, part_name, with_model
from wse_emu.isa.compiler.placement import WEIGHT_BYTES
from wse_emu.isa.compiler.predict import Cost
from wse_emu.isa.errors import BuildError
from wse_emu.isa.machine import MAX_CHIPS, system_of
from wse_emu.isa.program import Rect, pipelined_cycles
from wse_emu.isa.spec import INSTR_BYTES

# One entry a mapping strategy: its module holds its tiling, its routes' needs and its code.
STRATEGIES = {
    "gemv": map_gemv,
    "attention": map_attention,
    "elementwise": map_elementwise,
    "embedding": map_embedding,
    "head": map_head,
}

COL, ROW, SEG = (0, 1, 2, 3, 4), (5, 6, 7, 8, 9), (10, 11, 12, 13, 14)
HANDOFF = (15, 16)
DIAG, WPE, MASK, ROPE = 17, 18, 19, 20
CROSS = (21, 22)  # the crossings between wafers, alternating wafer to wafer
READY = 23  # several sequences: layer 0 tells the embedding it took the last token's row
COLORS_NEEDED = 21  # one wafer; a system of several needs the CROSS colors, sequences READY

# Several sequences in flight (--sequences B): every region runs its step's code in a loop
# over s = 0 .. B-1 (r0 = s); a layer's K and V caches are B blocks, the loop's descriptors
# offset by s blocks (r9, r10 = s times a block's bytes). The strategies and the line
# allreduces leave r0, r9 and r10 alone after the region's setup (lines.setup_roles uses them
# before the loop starts); the embedding and the sources index the B token ids and positions
# with their own loops (map_attention.seq_loop).
SEQ, KOFF, VOFF = "r0", "r9", "r10"


def cross_color(chip: int, level: int = 0) -> int:
    """The color of the crossing into wafer `chip` (from wafer chip - 1) of rows level C ..
    (level + 1) C - 1."""
    return CROSS[(chip - 1 + level) % 2]


def levels(geo: Geometry) -> int:
    """Colors a down hand-off (or a crossing) needs: R paths over C links."""
    return -(-geo.R // geo.C)


def diag_color(level: int) -> int:
    return (DIAG, READY)[level]


@dataclass
class Item:
    """One grid of the placement: the embedding, a layer, or the head."""

    kind: str  # "embed" | "layer" | "head"
    index: int  # layer number (embed -1, head = layers)
    width: int  # columns
    slots: int  # lattice slots it spans
    band: int = 0
    slot: int = 0  # first slot
    west: bool = False  # in a band that grows west: right-aligned in its slots
    handoff_in: str = ""  # "east" | "west" | "diag" | "bus" | "cross" (from the wafer before)
    chip: int = 0  # the wafer it sits on
    row0: int = 0  # that wafer's first fabric row (its RoPE sources' row)

    def x0(self, geo: Geometry) -> int:
        C = geo.C
        return 1 + self.slot * C + (self.slots * C - self.width if self.west else 0)

    def y0(self, geo: Geometry) -> int:
        return self.row0 + 1 + self.band * geo.R


@dataclass
class Mapping:
    """Everything the passes decide."""

    dec: Decoder
    geo: Geometry
    items: list
    embed_cols: list  # [(m, vb)] per table
    head_cols: tuple
    bands: int  # the most bands on one wafer
    predicted: dict = field(default_factory=dict)  # part -> cycles (and "crossing c-c+1")
    groups: list = field(default_factory=list)  # per wafer: (first layer, layers)
    line_groups: tuple = (0, 0)  # two-phase group size of the column and row lines (0: chain)
    seqs: int = 1  # sequences in flight: B KV caches a layer, B tokens a step


# ---------------------------------------------------------------------------------------------
# choose and place

def _snake(items: list, per_band: int) -> int | None:
    """Set every item's band and slot (module docstring); the bands used, or None."""
    band, direction, edge = 0, 1, 0  # edge: the next free slot (east) or one past it (west)
    for k, it in enumerate(items):
        if it.slots > per_band:
            return None
        if direction > 0 and edge + it.slots <= per_band:
            it.band, it.slot = band, edge
            edge += it.slots
            it.handoff_in = "" if k == 0 else ("bus" if items[k - 1].kind == "embed" else "east")
        elif direction < 0 and edge - it.slots >= 0:
            it.band, it.slot = band, edge - it.slots
            edge -= it.slots
            it.handoff_in = "west"
        else:
            if k == 0 or items[k - 1].kind == "embed":
                return None
            prev = items[k - 1]
            band += 1
            direction = -direction
            if direction < 0:  # under the previous item, growing west
                end = prev.slot + prev.slots
                if end - it.slots < 0 or it.slots < prev.slots:
                    return None
                it.band, it.slot = band, end - it.slots
                edge = it.slot
            else:
                if prev.slot + it.slots > per_band or it.slots < prev.slots:
                    return None
                it.band, it.slot = band, prev.slot
                edge = prev.slot + it.slots
            it.handoff_in = "diag"
        it.west = direction < 0
    return band + 1


def _layer_data(dec: Decoder, geo: Geometry, dtype: str, seqs: int = 1) -> int:
    """SRAM a layer PE's data takes: weight tiles, KV caches (seqs of them; one in a prefill
    program, dec.one_cache) and buffers (the
    attention's scratch and the MLP's gate/up vector overlaid: map_attention.scratch_layout);
    on a grid of two column classes the larger class's."""
    wb = WEIGHT_BYTES[dtype]
    return max(map_gemv.tile_bytes(g, wb, dec.family == "gpt2")
               + dec.kept(seqs) * map_attention.cache_bytes(g, wb)
               + map_attention.buffer_bytes(g, bool(dec.rope_theta), 4 * g.M1)
               + 4 * (3 * g.K + g.Mqkv + 1 + 2) + 2 * g.K * wb * 2 for g in geo.variants)


CODE_BOUND = 8 * 1024  # more than any layer PE's code counts (about 4-5 KB)


def _layer_fits(dec: Decoder, geo: Geometry, machine, dtype: str, seqs: int = 1) -> bool:
    """Whether a layer PE's code and data fit its SRAM, and the mask source's beside its band
    (every sequence's mask rows, map_attention.mask_source_bytes). The code is counted
    (layer_code_bytes) only when the data leave less than CODE_BOUND bytes free: counting
    takes dry runs of the grid's code, too slow for every candidate grid of a large model.
    (_pack checks the program's real SRAM.)"""
    if map_attention.mask_source_bytes(geo, seqs) > machine.sram_bytes:
        return False
    free = machine.sram_bytes - _layer_data(dec, geo, dtype, seqs)
    return free >= CODE_BOUND or (free > 0 and layer_code_bytes(dec, geo, machine, dtype,
                                                                 seqs) <= free)


def pass_options(geo: Geometry) -> list:
    """geo with the attention's scores in one pass, then in 2, 4, ... passes (hp heads a
    pass, every divisor of a KV head's query heads): less scratch, more allreduces."""
    return [replace(geo, hp=0 if h == geo.group else h)
            for h in sorted(divisors(geo.group), reverse=True)]


def layouts(dec: Decoder, geo: Geometry, machine, dtype: str) -> list:
    """The layer layouts a grid can have: its head dims padded or in two column classes
    (where s does not divide a head's RoPE pairs), its scores in 1, 2, 4 ... passes
    (pass_options) and each line allreduce in its fastest form or the chain form (the
    two-phase form's roles take about 50 instructions a line kind to set up)."""
    col, row = line_forms(dec, geo, machine, dtype)
    forms = sorted({(col, row), (0, row), (col, 0), (0, 0)})
    balanced = replace(geo, balanced=True)
    classes = [geo, balanced] if balanced.split else [geo]
    return [replace(p, forms=f) for c in classes for p in pass_options(c) for f in forms]


def _fitted(dec: Decoder, geo: Geometry, machine, dtype: str, seqs: int = 1):
    """geo with the fastest layer code that fits a PE (layouts, by layer_cycles), or None:
    its own when that fits (the common case, checked first), None at once when even the
    least data of any layout do not (the code only adds to it)."""
    if _layer_fits(dec, geo, machine, dtype, seqs):
        return geo
    if _least_data(dec, geo, dtype, seqs) >= machine.sram_bytes:
        return None
    fits = [p for p in layouts(dec, geo, machine, dtype)
            if _layer_fits(dec, p, machine, dtype, seqs)]
    return min(fits, key=lambda p: (layer_cycles(dec, p, machine, dtype), p.passes, p.forms),
               default=None)


def _least_data(dec: Decoder, geo: Geometry, dtype: str, seqs: int = 1) -> int:
    """The least data of a layer PE over the grid's layouts (one head a pass of the scores;
    the line forms change code only)."""
    return min(_layer_data(dec, replace(geo, balanced=b, hp=1), dtype, seqs)
               for b in (False, True))


def layer_cycles(dec: Decoder, geo: Geometry, machine, dtype: str, sites=None) -> int:
    """A layer's predicted cycles without its hand-off: its PE's local ops and line
    collectives, with two column classes each op at the slower class's pace."""
    forms = line_forms(dec, geo, machine, dtype)
    if sites is None:
        sites = layer_sites(Mapping(dec, geo, [], [], (0, 0), 0, line_groups=forms), machine,
                            dtype)
    charges = []
    for g in geo.variants:
        dry = _DryRun(g, dtype, machine, bool(dec.rope_theta), dec.family == "gpt2", forms)
        dry.share = Shared(sites)
        _layer_body(dry, dec.layers[0], receive=None, send=None)
        charges.append([c for _, c in dry.charges])
    return sum(max(cs) for cs in zip(*charges))


def layer_code_bytes(dec: Decoder, geo: Geometry, machine, dtype: str, seqs: int = 1) -> int:
    """The bytes of a layer PE's code, counted before any layout (the code does not depend on
    where the data sits): a dry run of the region's code with the grid's line forms and
    shared allreduces, and the largest receiver and sender a placement can give it (in by a
    diagonal, a crossing or the embedding's bus; out by a diagonal, a crossing or along the
    rows). Cached on the decoder by grid, whatever the context (a context's binary search
    asks for the same grid again; the context changes immediates, not instructions)."""
    cache = dec.__dict__.setdefault("code_bytes", {})
    key = (replace(geo, ctx=0), machine.name, dtype, seqs)
    if key not in cache:
        cache[key] = INSTR_BYTES * _layer_code(dec, geo, machine, dtype, seqs)
    return cache[key]


def _layer_code(dec: Decoder, geo: Geometry, machine, dtype: str, seqs: int) -> int:
    """Instructions of the largest layer region's code (of either column class)."""
    mp = Mapping(dec, geo, [], [], (0, 0), 0, line_groups=line_forms(dec, geo, machine, dtype),
                 seqs=seqs)
    em = _Emitter.__new__(_Emitter)  # the code emitters alone: no ProgramBuilder, no data
    em.mp, em.machine, em.dtype, em.geo, em.seqs = mp, machine, dtype, geo, seqs

    def dry(g):
        ctx = _DryRun(g, dtype, machine, bool(dec.rope_theta), dec.family == "gpt2",
                      mp.line_groups)
        ctx.rb, ctx.seqs = InstrCount(), seqs
        ctx.cache_regs = (KOFF, VOFF) if seqs > 1 else None
        return ctx
    code, sites = 0, layer_sites(mp, machine, dtype)
    for g in geo.variants:
        ctx = dry(g)
        ctx.share = Shared(sites)
        em.position_regs(ctx.rb, Item("layer", 0, geo.C, 1))
        em.loop(ctx, lambda: _layer_body(ctx, dec.layers[0], None, None))
        ctx.rb.halt()
        ctx.share.routines(ctx.rb, ctx.labels)
        code = max(code, ctx.rb.n)
    prev, it, nxt = (Item("layer", k, geo.C, 1, slot=k, chip=k) for k in range(3))
    mp.items = [prev, it, nxt]
    ends = []
    for which, kinds in (("receiver", ("diag", "cross", "east", "west", "bus")),
                         ("sender", ("diag", "cross", "east", "west"))):
        most = 0
        for kind in kinds:
            ctx = dry(geo)
            if which == "receiver":
                it.handoff_in = kind
                em.receiver(ctx, it, 1)()
            else:
                nxt.handoff_in = kind
                em.sender(ctx, it, 1)()
            most = max(most, ctx.rb.n)
        ends.append(most)
    return code + sum(ends)


def _arrange(dec: Decoder, geo: Geometry, machine, dtype: str, exact: bool,
             costs: tuple | None = None, seqs: int = 1) -> Mapping | None:
    """The placement of every grid of geometry geo, or None when it does not fit. On a system of
    several wafers (machine.chips > 1) the layers are split into contiguous groups, one a
    wafer and every wafer used, the embedding on wafer 0 and the head on the last; each
    wafer's items snake through its own rows (no grid straddles a wafer boundary). costs =
    (layer, embed, head, crossing) cycles balances the groups; None: layers as even as the
    wafers' room allows."""
    R, C, K = geo.R, geo.C, geo.K
    wb = WEIGHT_BYTES[dtype]
    if levels(geo) > 2 or (levels(geo) > 1 and seqs > 1):
        return None  # no colors for the down hand-offs' paths (module docstring)
    embed_cols = []
    for _, ref, _ in dec.tables:
        m, vb = map_embedding.columns(ref.shape[0], K, wb, exact)
        if m == 0:
            return None
        embed_cols.append((m, vb))
    head = map_head.columns(dec.vocab, K, wb, exact, at_least=C, seqs=dec.kept(seqs))
    if head[0] == 0:
        return None
    ew = sum(m for m, _ in embed_cols)
    L, chips, H = len(dec.layers), machine.chips, machine.chip_height
    per_band = (machine.width - 1) // C

    def items_of(c: int, first: int, count: int) -> list:
        its = [Item("embed", -1, ew, -(-ew // C))] if c == 0 else []
        its += [Item("layer", k, C, 1) for k in range(first, first + count)]
        if c == chips - 1:
            its.append(Item("head", L, head[0], -(-head[0] // C)))
        return its

    def bands_of(its: list) -> int | None:
        bands = _snake(its, per_band)
        return bands if bands is not None and 1 + bands * R <= H else None

    if chips == 1:
        items = items_of(0, 0, L)
        bands = bands_of(items)
        if bands is None:
            return None
        return Mapping(dec, geo, items, embed_cols, head, bands, groups=[(0, L)])
    if L < chips:
        return None
    room = []  # the most layers each wafer holds beside its embedding / head
    for c in range(chips):
        if 1 < c < chips - 1:  # the middle wafers are alike (the first of them computed)
            room.append(room[-1])
            continue
        g = 0
        while g < L and bands_of(items_of(c, 0, g + 1)) is not None:
            g += 1
        room.append(g)
    counts = split_layers(L, room, costs or (1, 0, 0, 0))
    if counts is None:
        return None
    items, first, most = [], 0, 0
    for c, g in enumerate(counts):
        its = items_of(c, first, g)
        bands = bands_of(its)
        if levels(geo) > 1 and 0 < c < chips - 1 and bands < 2:
            return None  # a wafer crossed into and out of: its rows C .. 2 C - 1's colors
        most = max(most, bands)
        for it in its:
            it.chip, it.row0 = c, c * H
        if c > 0:
            its[0].handoff_in = "cross"
        items += its
        first += g
    groups, first = [], 0
    for g in counts:
        groups.append((first, g))
        first += g
    return Mapping(dec, geo, items, embed_cols, head, most, groups=groups)


def split_layers(layers: int, room: list, costs: tuple) -> list | None:
    """Contiguous groups of layers, one a wafer, each of 1 .. room[c] layers, that minimise
    the largest wafer's predicted cycles: g layer cycles, plus the embedding's on wafer 0,
    the head's on the last and a crossing's on every other (costs = (layer, embed, head,
    crossing)). None when the wafers cannot hold the layers."""
    unit, embed, head, cross = costs
    chips = len(room)
    if sum(room) < layers or min(room) < 1:
        return None
    extra = [(embed if c == 0 else cross) + (head if c == chips - 1 else 0)
             for c in range(chips)]

    def counts_at(t: int) -> list:
        return [min(room[c], (t - extra[c]) // max(unit, 1)) for c in range(chips)]

    lo = max(e + unit for e in extra)  # every wafer holds at least one layer
    hi = max(e for e in extra) + layers * max(unit, 1)
    while lo < hi:  # the smallest largest-wafer time at which the wafers hold every layer
        mid = (lo + hi) // 2
        got = counts_at(mid)
        if min(got) >= 1 and sum(got) >= layers:
            hi = mid
        else:
            lo = mid + 1
    counts = counts_at(lo)
    while sum(counts) > layers:  # take the surplus from the slowest wafers, later ones first
        c = max((c for c in range(chips) if counts[c] > 1),
                key=lambda c: (extra[c] + counts[c] * unit, c))
        counts[c] -= 1
    return counts


def parse_grid(grid) -> tuple[int, int] | None:
    """The compile option grid: the side n of a square, "RxC" (or "n"), or (R, C)."""
    if grid is None:
        return None
    if isinstance(grid, str):
        parts = grid.lower().split("x")
        if len(parts) in (1, 2) and all(q.strip().isdigit() for q in parts):
            return int(parts[0]), int(parts[-1])
        raise CompileError(f"grid must be a side n or RxC (rows x columns), got {grid!r}")
    if isinstance(grid, int) and not isinstance(grid, bool):
        return grid, grid
    if isinstance(grid, tuple) and len(grid) == 2:
        return int(grid[0]), int(grid[1])
    raise CompileError(f"grid must be a side n or RxC (rows x columns), got {grid!r}")


def candidates(dec: Decoder, machine) -> list[tuple[int, int]]:
    """The grids choose prices: every unpadded square side first (grid_shapes), then the
    rectangles whose rows fill a band count of the fabric's height (the most rows for it) or
    divide the hidden size, and whose columns fill a slot count of its width or give whole
    RoPE pairs without padding. Rows that would hold no residual element give way to the
    fewest rows with the same block K (the same work on fewer PEs)."""
    H, W = machine.chip_height - 1, machine.width - 1
    half, kv, d = dec.head_dim // 2, dec.kv_heads, dec.hidden
    rows = {H // b for b in range(1, H + 1)} | {r for r in divisors(d) if r <= H}
    cols = {W // p // kv * kv for p in range(1, W + 1)}
    cols |= {kv * t for t in divisors(half) if kv * t <= W}
    rows = sorted({-(-d // -(-d // r)) for r in rows if 1 <= r <= min(d, dec.max_context)})
    squares = grid_shapes(dec)
    return squares + [g for g in grid_shapes(dec, rows, sorted(c for c in cols if c))
                      if g not in squares]


def choose(dec: Decoder, machine, dtype: str, exact: bool, grid=None,
           name: str = "the model", seqs: int = 1) -> Mapping:
    """The fastest grid (R, C) whose layer (with seqs KV caches) fits a PE's SRAM and whose
    grids fit the fabric (only `grid` when given: n, "RxC" or (R, C)); on a system, its
    layers split over the wafers."""
    biases = dec.family == "gpt2"
    best = None
    shapes = candidates(dec, machine)
    want = parse_grid(grid)
    if want is not None:
        if not grid_shapes(dec, [want[0]], [want[1]]):
            raise CompileError(
                f"grid {grid} does not suit the model's shapes: the columns must be a multiple "
                f"of the {dec.kv_heads} KV heads, at most {dec.kv_heads * dec.head_dim // 2}, "
                f"and the rows between 1 and {dec.hidden}")
        R, C = want
        if R > 2 * C or (R > C and seqs > 1):
            raise CompileError(
                f"grid {grid}: a grid of more than {'twice ' if seqs == 1 else ''}as many rows "
                f"as columns has no colors left for its hand-offs down a band"
                + (" with several sequences" if seqs > 1 else ""))
        shapes = [want]
    for shape in shapes:
        geo = _fitted(dec, geometry(dec, shape), machine, dtype, seqs)
        if geo is None:
            continue
        mp, layout = _placed(dec, geo, machine, dtype, exact, seqs)
        if mp is None:
            continue
        forms = line_forms(dec, geo, machine, dtype)
        mp.line_groups, mp.seqs = forms, seqs
        if machine.chips > 1:  # again, with the groups balanced by the cost model
            mp = _arrange(dec, geo, machine, dtype, layout, split_costs(mp, machine, dtype),
                          seqs)
            mp.line_groups, mp.seqs = forms, seqs
        mp.predicted = predict(mp, machine, dtype)
        total = pipelined_cycles(mp.predicted, seqs)
        if best is None or total < best[0]:
            best = (total, mp)
    if best is None:
        raise CompileError(_refusal(dec, machine, dtype, exact, biases, shapes, name, seqs))
    return best[1]


def _placed(dec: Decoder, geo: Geometry, machine, dtype: str, exact: bool,
            seqs: int = 1) -> tuple[Mapping | None, bool]:
    """(_arrange's placement or None, layout): the embedding's and head's columns as a
    functional program takes them (dividing the tables' rows, layout True) where they fit,
    also shape-only on a rectangle, so that its timing is the real model's; shape-only
    squares keep the fewest columns (as before rectangles existed), and so does any grid
    whose divisors do not fit."""
    layout = exact or not geo.square
    mp = _arrange(dec, geo, machine, dtype, layout, seqs=seqs)
    if mp is None and layout and not exact:
        layout = False
        mp = _arrange(dec, geo, machine, dtype, layout, seqs=seqs)
    return mp, layout


def line_forms(dec: Decoder, geo: Geometry, machine, dtype: str) -> tuple:
    """(column, row) group sizes of the layers' line allreduces (0: the chain form): geo's
    own (Geometry.forms), or for each kind of line the form with the fewest cycles over the
    allreduces a layer makes on it (lines.cycles; a dry run of the layer, of each column
    class, lists them)."""
    if geo.forms:
        return geo.forms
    cache = dec.__dict__.setdefault("line_forms", {})
    key = (replace(geo, hp=0, balanced=False), machine.name, dtype)
    if key not in cache:
        cache[key] = _line_forms(dec, geo, machine, dtype)
    return cache[key]


def _line_forms(dec: Decoder, geo: Geometry, machine, dtype: str) -> tuple:
    calls = []
    for g in geo.variants:
        dry = _DryRun(g, dtype, machine, bool(dec.rope_theta), dec.family == "gpt2")
        _layer_body(dry, dec.layers[0], receive=None, send=None)
        calls += dry.calls
    out = []
    for line in (dry.col, dry.row):
        L = line.length
        side = L - 1 - (L - 1) // 2
        mine = [(n, b) for key, n, b in calls if key == line.colors]
        best = min(range(side + 1), key=lambda g: (
            sum(line_cycles(machine, L, n, b, group=g) for n, b in mine), g))
        out.append(best)
    return tuple(out)


def layer_sites(mp: Mapping, machine, dtype: str) -> dict:
    """(line, op, broadcast) -> call sites of a layer's allreduces (a dry run counts them):
    what decides which become shared routines (lines.Shared). Both column classes of a grid
    make the same calls, with other block lengths."""
    dec = mp.dec
    dry = _DryRun(mp.geo.variants[0], dtype, machine, bool(dec.rope_theta),
                  dec.family == "gpt2", mp.line_groups)
    _layer_body(dry, dec.layers[0], receive=None, send=None)
    return dry.sites


def split_costs(mp: Mapping, machine, dtype: str) -> tuple:
    """(layer, embed, head, crossing) predicted cycles for balancing the wafers' groups."""
    p = predict(mp, machine, dtype, senders=False)
    layer = max(v for k, v in p.items() if k.startswith("layer "))
    cross = max((v for k, v in p.items() if k.startswith("crossing ")), default=0)
    return layer, p["embed"], p["head"], cross


def _refusal(dec, machine, dtype, exact, biases, sides, name, seqs: int = 1) -> str:
    """One line: why no grid fits; the wafers that would hold the model, or the largest
    max_context that would fit (with seqs KV caches a layer)."""
    fitting = [g for g in sides if _fitted(dec, geometry(dec, g), machine, dtype, seqs)]
    caches = (f" with {seqs} positions a run" if dec.one_cache else
              f" with {seqs} sequences' KV caches") if seqs > 1 else ""
    fewer = "a smaller --prefill" if dec.one_cache else "fewer sequences"
    # (a binary search over the context on every grid: seconds for a 70B model, and not what
    # a model too big for a system's wafers is told, below)
    fit = _fitting_context(dec, machine, dtype, exact, biases, sides, seqs) if seqs > 1 else None
    if seqs > 1 and fit:  # the caches are what does not fit: a shorter context first
        return (f"max_context {dec.max_context}{caches} does not fit machine "
                f"'{machine.name}' ({machine.width} x {machine.height} PEs, "
                f"{machine.sram_bytes} bytes each): max_context {fit} would fit "
                f"(--max-context {fit}), or {fewer}")
    if fitting and machine.kind == "mesh" and machine.link_bandwidth > 0:
        chip = machine.chip
        L = len(dec.layers)

        def fewest(g):  # the wafers the layers' grids need at least (a wafer's lattice)
            R, C = g
            room = ((chip.height - 1) // R) * ((chip.width - 1) // C)
            return -(-L // room) if room else MAX_CHIPS + 1
        for chips in range(machine.chips + 1, MAX_CHIPS + 1):
            system = system_of(chip, chips)
            fits = next((g for g in sorted(fitting, key=lambda g: g[0] * g[1])
                         if fewest(g) <= chips
                         and _arrange(dec, geometry(dec, g), system, dtype, exact,
                                      seqs=seqs) is not None), None)
            if fits:
                R, C = fits
                weights = _layer_weights(dec) * WEIGHT_BYTES[dtype]
                need = sram_needed(dec, machine, dtype, exact, sides, seqs)
                short = "" if need is None else (
                    f"; on {machine.chips} wafer{'s' if machine.chips > 1 else ''} a layer's "
                    f"PEs would need {need[0]:,} bytes of SRAM each ({need[1][0]} x "
                    f"{need[1][1]} grids), not {machine.sram_bytes:,}")
                return (f"{name}{caches} needs {chips} wafers of {chip.name} (--machine "
                        f"{chip.name}x{chips}): the model needs {L * R * C:,} PEs "
                        f"({L} layers on {R} x {C} grids, {weights / 1e9:.1f} GB "
                        f"of layer weights; embedding and head more) but machine "
                        f"'{machine.name}' is {machine.width} x {machine.height} "
                        f"({machine.pes:,} PEs); it would fit {chips} such wafers, its layers "
                        f"split between them{short}")
    if fit is None:
        fit = _fitting_context(dec, machine, dtype, exact, biases, sides, seqs)
    if fit:
        return (f"max_context {dec.max_context}{caches} does not fit machine "
                f"'{machine.name}' ({machine.width} x {machine.height} PEs, "
                f"{machine.sram_bytes} bytes each): max_context {fit} would fit "
                f"(--max-context {fit})")
    if not fitting:
        hints = (["16-bit weights"] if WEIGHT_BYTES[dtype] > 2 else []) \
            + ([fewer] if seqs > 1 else []) \
            + (["a larger grid"] if len(sides) == 1 else []) + ["a machine with more SRAM a PE"]
        return (f"no grid of the model's layers{caches} fits a PE's {machine.sram_bytes} bytes "
                f"on machine '{machine.name}' at any context (use "
                + ", ".join(hints[:-1]) + (" or " if len(hints) > 1 else "") + hints[-1] + ")")
    R, C = fitting[0]
    pes = len(dec.layers) * R * C
    have = machine.width * machine.height
    if machine.chips > 1 and len(dec.layers) < machine.chips:
        return (f"{name} has {len(dec.layers)} layers, fewer than the {machine.chips} wafers of "
                f"machine '{machine.name}' (the split puts at least one layer on every wafer)")
    if pes <= have:  # enough PEs: the grids, the embedding and the head do not fit in bands
        K = geometry(dec, (R, C)).K
        rows = dec.kept(seqs)
        m, _ = map_head.columns(dec.vocab, K, WEIGHT_BYTES[dtype], exact, at_least=C, seqs=rows)
        held = f", holding {rows} rows of logits" if rows > 1 else ""
        return (f"{name}'s {len(dec.layers)} layers on {R} x {C} grids ({pes:,} PEs), its "
                f"embedding and its head ({m} columns{held}) cannot be placed in bands on "
                f"machine '{machine.name}' ({machine.width} x {machine.height} PEs)"
                + (f": use {fewer}" if seqs > 1 else ""))
    return (f"{name} needs {pes:,} PEs ({len(dec.layers)} layers on {R} x {C} grids, "
            f"{_layer_weights(dec) * WEIGHT_BYTES[dtype] / 1e9:.2f} GB of layer weights; "
            f"embedding and head more) but machine '{machine.name}' is {machine.width} x "
            f"{machine.height} ({have:,} PEs) and "
            + (f"no system of up to {MAX_CHIPS} of its wafers places it"
               + (f" (use {fewer})" if seqs > 1 else "")
               if machine.kind == "mesh" and machine.link_bandwidth > 0
               else "has no links to join more of it"))


def sram_needed(dec, machine, dtype, exact, sides, seqs: int = 1) -> tuple | None:
    """(bytes, grid): the least SRAM a PE would need for the model to be placed on `machine`'s
    wafers as they are (their PEs and fabric), and the grid that needs it; None when no grid
    places it there at any SRAM. A layer PE's data and code decide it (the embedding's and
    head's columns are sized to a fixed budget, map_embedding and map_head); grids are tried
    in order of their data, and the first whose data alone exceed the best so far ends it."""
    roomy = replace(machine, sram_bytes=1 << 40)
    best = None
    data = {g: _least_data(dec, geometry(dec, g), dtype, seqs) for g in sides}
    for g in sorted(sides, key=lambda g: (data[g], g)):
        if best is not None and data[g] >= best[0]:
            break
        geo = geometry(dec, g)
        if _placed(dec, geo, roomy, dtype, exact, seqs)[0] is None:
            continue
        need = min(_layer_data(dec, p, dtype, seqs) + layer_code_bytes(dec, p, roomy, dtype,
                                                                       seqs)
                   for p in layouts(dec, geo, roomy, dtype))
        if best is None or need < best[0]:
            best = (need, g)
    return best


def _fitting_context(dec, machine, dtype, exact, biases, sides, seqs: int) -> int:
    """The largest max_context whose layer (seqs KV caches) fits SRAM and whose grids fit
    the fabric; 0 when none."""
    fit = 0
    for g in sides:
        lo, hi = 0, dec.max_context
        while lo < hi:  # the largest context whose layer fits SRAM
            mid = (lo + hi + 1) // 2
            if _fitted(dec, geometry(dec, g, mid), machine, dtype, seqs):
                lo = mid
            else:
                hi = mid - 1
        if lo > fit and _arrange(dec, geometry(dec, g, lo), machine, dtype, exact,
                                 seqs=seqs) is not None:
            fit = lo
    return fit


def _layer_weights(dec) -> int:
    return sum(m.out * m.ref.shape[-1] for layer in dec.layers
               for m in layer.qkv + [layer.o] + layer.mlp1 + [layer.down])


# ---------------------------------------------------------------------------------------------
# the cost model

def predict(mp: Mapping, machine, dtype: str, senders: bool = True) -> dict:
    """Predicted cycles of each part of a decode step, in series: the embedding, every
    layer, the crossings between wafers, the head. A layer is the sum of its PE's local ops
    and its line collectives (the same code every PE runs, isa.compiler.predict), plus its
    hand-off. With several sequences (mp.seqs > 1) each part's figure is one sequence's pass,
    with the loop's own ops; the step is pipelined_cycles of them.

    A crossing's link latency is charged to the layer that sends across it (senders=True)
    when a row's block (K wavelets) is more than an input queue holds: its senders then stay
    blocked until the far side drains the block, a link latency later, so that layer ends
    that much later (docs/timing-model.md, section 11). senders=False keeps the latency in
    the crossing's figure: split_costs balances the wafers with every layer alike."""
    geo, dec = mp.geo, mp.dec
    body = layer_cycles(dec, geo, machine, dtype, layer_sites(mp, machine, dtype))
    dry = _DryRun(geo, dtype, machine, bool(dec.rope_theta), dec.family == "gpt2",
                  mp.line_groups)
    out = {"embed": map_embedding.cycles(dry.cost, geo.K)}
    loop = 0
    if mp.seqs > 1:  # the loop's scalars (LOOP_SCALARS) and the caches' four daddr
        loop = dry.cost.scalar(LOOP_SCALARS + 4)
        body += loop
        # the embedding waits for layer 0's ready wavelet before each later token's row
        out["embed"] += dry.cost.scalar(LOOP_SCALARS) + dry.cost.op("move", 1)
    for k, it in enumerate(mp.items):
        if it.kind == "layer":
            hand = dry.cost.send(geo.K, geo.C) + dry.cost.scalar(6)
            if it.handoff_in == "diag":
                hand += dry.cost.send(geo.K, geo.R + geo.C)
            if it.handoff_in == "cross":  # the travel is the crossing's; the spread here
                hand += dry.cost.scalar(6) + dry.cost.op("move", geo.K)
                sender = mp.items[k - 1]
                cross = crossing_cycles(sender, it, geo, machine)
                if senders and sender.kind == "layer" and geo.K > machine.queue_depth:
                    out[f"layer {sender.index}"] += machine.link_latency
                    cross -= machine.link_latency
                out[f"crossing {it.chip - 1}-{it.chip}"] = cross
            if it.handoff_in in ("diag", "cross") and levels(geo) > 1:
                hand += dry.cost.scalar(LEVEL_SCALARS)  # the entry PE's row mod C, level
            out[f"layer {it.index}"] = body + hand
    hd = _DryRun(geo, dtype, machine, False, False, mp.line_groups)
    map_elementwise.norm(hd, dec.final_norm, 0, 0, {p: 0 for p in dec.final_norm.params})
    m, vb = mp.head_cols
    hd.charge("lm head", hd.cost.mat(vb, geo.K, 1, dtype, "f32"))
    hd.charge("lm head reduce", line_cycles(machine, geo.R, vb, broadcast=False,
                                            group=mp.line_groups[0]))
    out["head"] = hd.total() + dry.cost.send(geo.K, geo.C)
    if mp.seqs > 1 and dec.one_cache:  # the loop (a prefill program keeps one row)
        out["head"] += dry.cost.scalar(LOOP_SCALARS)
    elif mp.seqs > 1:  # the loop, and the logits block copied to its sequence's row
        out["head"] += dry.cost.scalar(LOOP_SCALARS + 1) + dry.cost.op("move", vb)
    return out


LOOP_SCALARS = 5  # a sequence loop's own scalar ops an iteration (_Emitter.loop)
LEVEL_SCALARS = 4  # a down hand-off's entry test and level branch with R > C (_Emitter)


def crossing_cycles(prev: Item, it: Item, geo: Geometry, machine) -> int:
    """The residual from the last layer of one wafer to the first of the next (cross_path):
    row q's block (K wavelets) goes down from the last grid, across the wafers' boundary, and
    along row q of the next grid to its entry PE; the R blocks share the link between the
    wafers (link_bytes_per_cycle each way) and pay its latency once. Cycles from the senders'
    op start to the last block's tail at its entry PE (the spread along the row is the
    layer's hand-off, as after a diagonal)."""
    R, K = geo.R, geo.K
    py, y0 = prev.y0(geo), it.y0(geo)
    hops = 0
    for q in range(R):
        X, T = cross_path(prev, it, geo, q)
        hops = max(hops, (y0 - py) + abs(T - X))
    bpc = machine.link_bytes_per_cycle
    # the link passes R * K wavelets at bpc bytes a cycle; one block alone streams K
    link = max(K, math.ceil(R * K * machine.wavelet_bytes / bpc)) if bpc > 0 else K
    return (machine.issue_overhead + 1 + 2 * machine.ramp_latency + hops * machine.hop_latency
            + link + machine.link_latency)


class _NoCode:
    """A RegionBuilder stand-in for the cost model's dry run: every call does nothing."""

    def __getattr__(self, name):
        return lambda *a, **k: None


class _Ctx:
    """What the strategies need while emitting one grid's code (or pricing it)."""

    def __init__(self, geo, dtype, machine, rope: bool, biases: bool, groups=(0, 0)):
        self.geo, self.dtype, self.machine = geo, dtype, machine
        self.cost = Cost(machine)
        self.rope, self.biases = rope, biases
        self.col, self.row = line_kinds(geo, groups)
        # the attention's pass counter (map_attention): a register the lines leave free
        self.pass_reg = "r3" if self.col.group else "r7"
        self.calls: list = []  # (line colors, n, broadcast) of every allreduce, in order
        self.sites: dict = {}  # (line, op, broadcast) -> allreduces of that kind so far
        self.share = Shared({})  # the region's shared routines (none: all inline)
        self.seg = LineKind("row", geo.s, SEG, "r12")
        self.colors = {"mask": MASK, "rope": ROPE}
        self.bufs: dict = {}
        self.charges: list = []
        self.labels = Labels()

    def charge(self, what: str, cycles: int) -> None:
        self.charges.append((what, cycles))

    def allreduce(self, line, buf, n, op="add", what="allreduce", broadcast=True,
                  times: int = 1) -> None:
        """The allreduce inline, or a call of the region's shared routine for its kind
        (lines.Shared), with its cycles; `times` the code runs it (in a loop)."""
        self.share.allreduce(self.rb, self.labels, line, buf, n, op, broadcast)
        self.calls += [(line.colors, n, broadcast)] * times
        cycles = line_cycles(self.machine, line.length, n, broadcast, line.group)
        key = (line, op, broadcast)
        if line.length > 1 and n > 0:
            index = self.sites.get(key, 0)
            self.sites[key] = index + 1
            if key in self.share.shared:
                cycles += call_cycles(self.machine, line, broadcast, index,
                                      self.share.sites[key])
        self.charge(what, times * cycles)

    def buf(self, name):
        return self.bufs[name]

    def total(self) -> int:
        return sum(c for _, c in self.charges)

    def error(self, msg):
        return CompileError(msg)


def line_kinds(geo: Geometry, groups: tuple) -> tuple:
    """The column (R PEs) and row (C PEs) lines of an R x C grid: the chain form with
    precomputed flags (column) or compares (row), or the two-phase form with a role
    register."""
    gc, gr = groups
    R, C = geo.R, geo.C
    col = (LineKind("column", R, COL, "r14", group=gc, role_reg="r7") if gc else
           LineKind("column", R, COL, "r14", ("r3", "r4", "r5", "r6")))
    row = LineKind("row", C, ROW, "r13", group=gr, role_reg="r8" if gr else "")
    return col, row


class _DryRun(_Ctx):
    def __init__(self, geo, dtype, machine, rope, biases, groups=(0, 0)):
        super().__init__(geo, dtype, machine, rope, biases, groups)
        self.rb = _NoCode()
        self.shape_only = True
        self.bufs = _Zero()


class _Zero(dict):
    def __missing__(self, key):
        return 0


# ---------------------------------------------------------------------------------------------
# codegen of one layer grid

def _layer_body(ctx, layer, receive, send) -> None:
    """The code of a layer's PEs after their buffers exist (module docstrings of the
    strategies): norm, q/k/v, RoPE, attention, o, residual, norm, MLP, residual."""
    geo, b = ctx.geo, ctx.bufs
    params = b["params"] if "params" in b else {p: 0 for p in layer.norm1.params
                                                  + layer.norm2.params}
    if receive is not None:
        receive()
    map_elementwise.norm(ctx, layer.norm1, b["x"], b["xn"], params)
    map_gemv.product(ctx, "q/k/v", b["wqkv"], geo.Mqkv, geo.K, b["xn"], b["qkv"], ctx.col,
                     b["bqkv"] if ctx.biases else None)
    if ctx.rope:
        map_attention.rope(ctx, b["qkv"])
    map_attention.attend(ctx, layer, b["qkv"])
    map_gemv.product(ctx, "o", b["wo"], geo.K, geo.Mq, b["ao"], b["y"], ctx.row,
                     b["bo"] if ctx.biases else None)
    map_elementwise.residual_add(ctx, b["x"], b["y"])
    map_elementwise.norm(ctx, layer.norm2, b["x"], b["xn"], params)
    map_gemv.product(ctx, "mlp in", b["w1"], geo.M1, geo.K, b["xn"], b["gu"], ctx.col,
                     b["b1"] if ctx.biases else None)
    if layer.activation:
        map_elementwise.activation(ctx, layer.activation, b["gu"], geo.F)
    if layer.swiglu:
        map_elementwise.swiglu(ctx, b["gu"], geo.F)
    map_gemv.product(ctx, "down", b["wd"], geo.K, geo.F, b["gu"], b["y"], ctx.row,
                     b["bd"] if ctx.biases else None)
    map_elementwise.residual_add(ctx, b["x"], b["y"])
    if send is not None:
        send()


class _Replay:
    """A region builder's stand-in that records the code it is given (every call but the
    data's), to give another region the same code: the strips of one column class of a
    layer run the same code on other tiles."""

    DATA = {"alloc", "load", "init", "piece"}

    def __init__(self, rb):
        self.rb, self.calls = rb, []

    def __getattr__(self, name):
        f = getattr(self.rb, name)
        if name in self.DATA or not callable(f):
            return f

        def record(*a, **k):
            self.calls.append((name, a, k))
            return f(*a, **k)
        return record

    def replay(self, rb) -> None:
        for name, a, k in self.calls:
            getattr(rb, name)(*a, **k)


class _Emitter:
    """Codegen of every grid and source of a Mapping into a ProgramBuilder."""

    def __init__(self, pb: ProgramBuilder, mp: Mapping, machine, dtype, shape_only, weights):
        self.pb, self.mp, self.machine = pb, mp, machine
        self.dtype, self.shape_only, self.weights = dtype, shape_only, weights
        self.geo = mp.geo
        self.declared: set = set()
        self.padded: dict = {}  # zero-padded weight copies (map_gemv.padded), once a program
        self.stages: list = []  # region metadata, in region order
        self.seqs = mp.seqs
        self.sites = None  # a layer's allreduce call sites (layer_sites), once a program
        pb.tensor("default_position_ids", np.zeros(self.seqs, dtype=np.int32))

    def region(self, kind: str, name: str, layer: int, x, y, w, h):
        sid = len(self.stages)
        self.stages.append(dict(name=name, kind=kind, layer=layer, rect=(x, y, w, h)))
        return self.pb.region(f"s{sid}.{name}", x, y, w, h)

    def ctx(self, rb):
        c = _Ctx(self.geo, self.dtype, self.machine, bool(self.mp.dec.rope_theta),
                 self.mp.dec.family == "gpt2", self.mp.line_groups)
        c.rb, c.shape_only, c.weights = rb, self.shape_only, self.weights
        c.graph, c.declared, c.padded = self.mp.dec.plan.graph, self.declared, self.padded
        c.seqs = self.seqs
        c.caches = self.mp.dec.kept(self.seqs)
        c.cache_regs = (KOFF, VOFF) if self.seqs > 1 else None
        return c

    def loop(self, ctx, body, strides=(0, 0)) -> None:
        """body() once, or for s = 0 .. B-1 (module constants: SEQ = s, KOFF and VOFF = s
        times strides): LOOP_SCALARS scalar ops an iteration beside the body's."""
        rb = ctx.rb
        if self.seqs == 1:
            body()
            return
        top = ctx.labels("sequence")
        rb.li(SEQ, 0)
        rb.label(top)
        rb.muli(KOFF, SEQ, strides[0])
        rb.muli(VOFF, SEQ, strides[1])
        body()
        rb.addi(SEQ, SEQ, 1)
        rb.li("r1", self.seqs)
        rb.blt(SEQ, "r1", top)

    def position_regs(self, rb, it, flags: bool = True) -> None:
        geo = self.geo
        rb.li("r1", it.x0(geo))
        rb.sub("r13", "GX", "r1")
        rb.li("r1", it.y0(geo))
        rb.sub("r14", "GY", "r1")
        rb.li("r1", geo.s)
        rb.rem("r12", "r13", "r1")
        col, row = line_kinds(geo, self.mp.line_groups)
        w = geo.C if it.kind == "layer" else self.mp.head_cols[0]
        setup_roles(rb, col, lambda q: (0, q, w, 1))  # two-phase lines: each PE's role
        if flags:
            setup_roles(rb, row, lambda q: (q, 0, 1, geo.R))
            if not col.group:  # the chain form's column allreduces dispatch on flags
                setup_flags(rb, col)

    # -- hand-offs ---------------------------------------------------------------------------

    def receiver(self, ctx, it, k: int):
        """The code that fills x (K elements) at the start of item k."""
        rb, geo = ctx.rb, self.geo
        K = geo.K
        x = ctx.bufs["x"]
        color = HANDOFF[it.index % 2]  # layer l (and the head, l = layers) receives on it

        def recv(buf, c):
            rb.dmem("d1", "f32", buf, K)
            rb.dfin("d2", "f32", c, K)
            rb.vmov("d1", "d2")

        def emit():
            if it.handoff_in in ("diag", "cross"):  # the entry PE of each row spreads it
                prev = self.mp.items[k - 1]
                off = prev.x0(geo) - it.x0(geo) if it.handoff_in == "diag" else 0
                other, done = ctx.labels("not_diag"), ctx.labels("received")
                if levels(geo) == 1:  # the entry PE of row r is (r, r + off)
                    rb.sub("r1", "r13", "r14")
                    rb.li("r2", off)
                    rb.bne("r1", "r2", other)
                else:  # (r, r mod C + off)
                    rb.li("r1", geo.C)
                    rb.rem("r2", "r14", "r1")
                    rb.sub("r1", "r13", "r2")
                    rb.li("r2", off)
                    rb.bne("r1", "r2", other)
                self.by_level(ctx, lambda lv: recv(x, diag_color(lv) if it.handoff_in == "diag"
                                                   else cross_color(it.chip, lv)))
                rb.dmem("d1", "f32", x, K)
                rb.dfout("d2", "f32", color, K)
                rb.vmov("d2", "d1")
                rb.jmp(done)
                rb.label(other)
                recv(x, color)
                rb.label(done)
            else:
                recv(x, color)
                if it.handoff_in == "bus" and len(self.mp.dec.tables) > 1:
                    recv(ctx.bufs["y"], WPE)
                if it.handoff_in == "bus" and self.seqs > 1:
                    self.ready(ctx)
                if it.handoff_in == "bus" and len(self.mp.dec.tables) > 1:
                    map_elementwise.residual_add(ctx, x, ctx.bufs["y"])
            ctx.charge("hand-off", ctx.cost.scalar(6) + ctx.cost.op("move", K))
        return emit

    def ready(self, ctx) -> None:
        """Layer 0 has taken sequence s's rows: its first column tells the embedding, which
        then sends sequence s + 1's (map_embedding); nothing after the last sequence."""
        rb = ctx.rb
        skip = ctx.labels("no_ready")
        rb.bne("r13", "r15", skip)
        rb.li("r1", self.seqs - 1)
        rb.bge(SEQ, "r1", skip)
        rb.dmem("d1", "f32", ctx.bufs["x"], 1)
        rb.dfout("d2", "f32", READY, 1)
        rb.vmov("d2", "d1")
        rb.label(skip)

    def by_level(self, ctx, body) -> None:
        """body(level) for this PE's row r: level r // C (0 or 1; just body(0) when R <= C)."""
        rb, geo = ctx.rb, self.geo
        if levels(geo) == 1:
            body(0)
            return
        upper, done = ctx.labels("level1"), ctx.labels("levels_done")
        rb.li("r1", geo.C)
        rb.bge("r14", "r1", upper)
        body(0)
        rb.jmp(done)
        rb.label(upper)
        body(1)
        rb.label(done)

    def sender(self, ctx, it, k: int):
        rb, geo = ctx.rb, self.geo
        K, C = geo.K, geo.C
        nxt = self.mp.items[k + 1]
        x = ctx.bufs["x"]

        def send(color):
            rb.dmem("d1", "f32", x, K)
            rb.dfout("d2", "f32", color, K)
            rb.vmov("d2", "d1")

        def row_mod():  # r2 = this row mod C (the row itself when R <= C)
            if levels(geo) == 1:
                return "r14"
            rb.li("r1", C)
            rb.rem("r2", "r14", "r1")
            return "r2"

        def emit():
            skip = ctx.labels("no_send")
            if nxt.handoff_in == "cross" and nxt.x0(geo) > it.x0(geo):  # the anti-diagonal
                rb.add("r1", "r13", row_mod())
                rb.li("r2", C - 1)
                rb.bne("r1", "r2", skip)
                self.by_level(ctx, lambda lv: send(cross_color(nxt.chip, lv)))
            elif nxt.handoff_in in ("diag", "cross"):
                rb.bne("r13", row_mod(), skip)
                self.by_level(ctx, lambda lv: send(diag_color(lv) if nxt.handoff_in == "diag"
                                                   else cross_color(nxt.chip, lv)))
            else:
                edge = C - 1 if nxt.handoff_in == "east" else 0
                rb.li("r1", edge)
                rb.bne("r13", "r1", skip)
                send(HANDOFF[(it.index + 1) % 2])
            rb.label(skip)
        return emit

    # -- grids -------------------------------------------------------------------------------

    def strips(self, x0: int):
        """[(class geometry, region x, width, KV head g or None)]: the regions of a grid at x0,
        one region of the whole grid (g None), or on a grid of two column classes one a class
        and segment (decoder module docstring)."""
        geo = self.geo
        if not geo.split:
            return [(geo, x0, geo.C, None)]
        return [(v, x0 + g * geo.s + v.first, v.n, g)
                for g in range(geo.kv) for v in geo.variants]

    def layer(self, it, k: int) -> None:
        layer = self.mp.dec.layers[it.index]
        several = self.geo.split
        code: dict = {}  # column class -> its code (the same on each of its strips)
        for v, x, w, g in self.strips(it.x0(self.geo)):
            name = f"layers.{it.index}" + (f".{g}{'hl'[v.part]}" if several else "")
            rb = self.region("layer", name, it.index, x, it.y0(self.geo), w, self.geo.R)
            code[v.part] = self.layer_region(rb, v, layer, it, k, map_gemv.segments(v, v.R, g),
                                             code.get(v.part))

    def layer_region(self, rb, geo, layer, it, k: int, segs, code=None):
        """One region of a layer's grid (all of it, or a strip of one column class): its
        buffers, its tiles (of segs, map_gemv.segments) and its code, emitted (returned as a
        _Replay) or, given the code of another strip of its class, replayed."""
        dtype = self.dtype
        ctx = self.ctx(rb)
        ctx.geo = geo  # the lines stay the grid's (self.ctx)
        if self.sites is None:
            self.sites = layer_sites(self.mp, self.machine, dtype)
        ctx.share = Shared(self.sites)
        wb = WEIGHT_BYTES[dtype]
        K = geo.K
        b = ctx.bufs
        for name, nbytes in (("x", K * 4), ("xn", K * 4), ("y", K * 4),
                             ("qkv", (geo.Mqkv + 1) * 4), ("scalar", 8),
                             ("wqkv", geo.Mqkv * K * wb), ("wo", K * geo.Mq * wb),
                             ("w1", geo.M1 * K * wb), ("wd", K * geo.F * wb)):
            b[name] = rb.alloc(name, nbytes)
        if ctx.biases:
            for name, nbytes in (("bqkv", geo.Mqkv), ("bo", K), ("b1", geo.M1), ("bd", K)):
                b[name] = rb.alloc(name, nbytes * 4)
        rb.init(b["qkv"] + 4 * geo.Mqkv, "f32", [1.0])  # the V cache's constant row
        map_attention.alloc(ctx, rb, geo.M1 * 4)  # gu overlaid on the attention's scratch
        params: dict = {}
        map_elementwise.load_norm(ctx, rb, layer.norm1, params)
        map_elementwise.load_norm(ctx, rb, layer.norm2, params)
        b["params"] = params
        map_gemv.load_qkv(ctx, rb, layer.qkv, b["wqkv"], b.get("bqkv"), segs)
        map_gemv.load_o(ctx, rb, layer.o, b["wo"], b.get("bo"), segs)
        map_gemv.load_mlp1(ctx, rb, layer.mlp1, b["w1"], b.get("b1"), segs)
        map_gemv.load_down(ctx, rb, layer.down, b["wd"], b.get("bd"), segs)
        if code is not None:
            code.replay(rb)
            return code
        ctx.rb = code = _Replay(rb)
        self.position_regs(code, it)
        self.loop(ctx, lambda: _layer_body(ctx, layer, self.receiver(ctx, it, k),
                                           self.sender(ctx, it, k)),
                  (0, 0) if self.mp.dec.one_cache else map_attention.strides(geo, dtype))
        code.halt()
        ctx.share.routines(code, ctx.labels)
        return code

    def head(self, it, k: int) -> None:
        geo, dtype = self.geo, self.dtype
        dec = self.mp.dec
        m, vb = self.mp.head_cols
        rb = self.region("head", "head", len(dec.layers), it.x0(geo), it.y0(geo), m, geo.R)
        ctx = self.ctx(rb)
        K, b = geo.K, ctx.bufs
        for name, nbytes in (("x", K * 4), ("xn", K * 4), ("y", K * 4), ("scalar", 8),
                             ("logits", vb * 4), ("w", vb * K * WEIGHT_BYTES[dtype])):
            b[name] = rb.alloc(name, nbytes)
        params: dict = {}
        map_elementwise.load_norm(ctx, rb, dec.final_norm, params, width=m)
        map_head.load(ctx, rb, dec.head.ref, b["w"], vb, K, m)
        ctx.col = line_kinds(geo, self.mp.line_groups)[0]
        if not ctx.col.group:
            ctx.col = LineKind("column", geo.R, COL, "r14")  # (no flags set up in the head)
        self.position_regs(rb, it, flags=False)
        out = b["logits"]  # a prefill program's: the run's last position's, as it is left
        rows = dec.kept(self.seqs)
        if rows > 1:  # a row of vb logits a sequence, copied after the step's reduce
            out = rb.alloc("logits_out", self.seqs * vb * 4)

        def step():
            self.receiver(ctx, it, k)()
            map_elementwise.norm(ctx, dec.final_norm, b["x"], b["xn"], params)
            rb.dmem("d0", dtype, b["w"], vb)
            rb.d2d("d0", K, vb)
            rb.dmem("d1", "f32", b["xn"], K)
            rb.dmem("d2", "f32", b["logits"], vb)
            rb.mv("d2", "d0", "d1")
            ctx.allreduce(ctx.col, b["logits"], vb, broadcast=False)
            if rows > 1:
                rb.dmem("d1", "f32", b["logits"], vb)
                rb.dmem("d2", "f32", out, vb)
                rb.daddr("d2", KOFF, out)
                rb.vmov("d2", "d1")
        self.loop(ctx, step, (vb * 4, 0))
        map_head.pieces(rb, "logits", out, dec.vocab, vb, m, ctx.col.root, rows)
        rb.halt()

    def embed(self, it) -> None:
        geo = self.geo
        x = it.x0(geo)
        for t, ((wname, ref, index), (m, vb)) in enumerate(zip(self.mp.dec.tables,
                                                                 self.mp.embed_cols)):
            color = HANDOFF[0] if t == 0 else WPE
            rb_name = f"embed.{wname}"
            sid = len(self.stages)
            self.stages.append(dict(name=rb_name, kind="embed", layer=-1,
                                    rect=(x, it.y0(geo), m, geo.R)))
            ctx = self.ctx(None)
            map_embedding.emit(ctx, self.pb, f"s{sid}.{rb_name}", ref, index, x, it.y0(geo), m,
                               vb, self.geo.K, color, "default_position_ids", self.seqs,
                               READY)
            x += m

    def sources(self) -> None:
        """The mask sources (column 0 beside every band with layers) and the RoPE sources
        (each wafer's row 0 above every lattice slot with layers there)."""
        R, C = self.geo.R, self.geo.C
        layers = [it for it in self.mp.items if it.kind == "layer"]
        ctx = self.ctx(None)
        several = self.machine.chips > 1

        def label(kind, chip, k):
            return f"{kind}.{chip}.{k}" if several else f"{kind}.{k}"
        for chip, row0, band in sorted({(it.chip, it.row0, it.band) for it in layers}):
            sid = len(self.stages)
            name, y0 = label("mask", chip, band), row0 + 1 + band * R
            self.stages.append(dict(name=name, kind="source", layer=-1, rect=(0, y0, 1, R)))
            map_attention.mask_source(ctx, self.pb, f"s{sid}.{name}", y0, self.geo, MASK,
                                      "default_position_ids", self.seqs)
        if self.mp.dec.rope_theta:
            for chip, row0, slot in sorted({(it.chip, it.row0, it.slot) for it in layers}):
                for v, x, w, g in self.strips(1 + slot * C):
                    sid = len(self.stages)
                    name = label("rope", chip, slot) + ("" if g is None else
                                                        f".{g}{'hl'[v.part]}")
                    self.stages.append(dict(name=name, kind="source", layer=-1,
                                            rect=(x, row0, w, 1)))
                    map_attention.rope_source(ctx, self.pb, f"s{sid}.{name}", x, v,
                                              self.mp.dec.rope_theta, ROPE,
                                              "default_position_ids", y0=row0, seqs=self.seqs,
                                              g=g)


# ---------------------------------------------------------------------------------------------
# routes

def route(pb, mp: Mapping) -> int:
    """Every route rule of the mapping (module docstring); returns their count."""
    geo = mp.geo
    R, C = geo.R, geo.C
    count = 0

    def add(x, y, w, h, color, rx, tx):  # empty rectangles (no PE between two grids) skipped
        nonlocal count
        if w > 0 and h > 0:
            count += 1
            pb.route(x, y, w, h, color, rx, tx)
    col, row = line_kinds(geo, mp.line_groups)
    seg = LineKind("row", geo.s, SEG, "r12")
    items = mp.items
    for k, it in enumerate(items):
        x0, y0 = it.x0(geo), it.y0(geo)
        if it.kind == "layer":
            routes(add, col, x0, y0, C, R)
            routes(add, row, x0, y0, C, R)
            routes(add, seg, x0, y0, C, R)
        elif it.kind == "head":
            routes(add, col, x0, y0, mp.head_cols[0], R, broadcast=True)
        if it.kind == "embed":
            continue
        # the hand-off into this item
        w = C if it.kind == "layer" else mp.head_cols[0]
        color = HANDOFF[it.index % 2]
        prev = items[k - 1]
        if it.handoff_in == "bus":
            ex = prev.x0(geo)
            for t, (m, _) in enumerate(mp.embed_cols):
                c = HANDOFF[0] if t == 0 else WPE
                add(ex, y0, 1, R, c, "RAMP", "E")
                add(ex + 1, y0, m - 1, R, c, "W|RAMP", "E")
                after = ex + m
                add(after, y0, x0 - after, R, c, "W", "E")  # through the later tables
                add(x0, y0, w - 1, R, c, "W", "E|RAMP")
                add(x0 + w - 1, y0, 1, R, c, "W", "RAMP")
                ex = after
        elif it.handoff_in == "east":
            add(x0 - 1, y0, 1, R, color, "RAMP", "E")
            add(x0, y0, w - 1, R, color, "W", "E|RAMP")
            add(x0 + w - 1, y0, 1, R, color, "W", "RAMP")
        elif it.handoff_in == "west":
            add(x0 + w, y0, 1, R, color, "RAMP", "W")
            add(x0 + 1, y0, w - 1, R, color, "E", "W|RAMP")
            add(x0, y0, 1, R, color, "E", "RAMP")
        elif it.handoff_in == "cross":
            _cross_routes(add, prev, it, geo, w, color)
        else:  # diag: PE (r, r mod C) of the grid above sends down to row r, which spreads it
            px, py = prev.x0(geo), prev.y0(geo)
            for q in range(R):
                x, c = px + q % C, diag_color(q // C)
                add(x, py + q, 1, 1, c, "RAMP", "S")
                add(x, py + q + 1, 1, y0 + q - py - q - 1, c, "N", "S")
                add(x, y0 + q, 1, 1, c, "N", "RAMP")
                _spread(add, x, y0 + q, x0, w, color)
    if mp.seqs > 1:  # layer 0's ready wavelet west to every PE of the embedding's rows
        first = next(k for k, it in enumerate(items) if it.kind == "layer")
        ex, x0, y0 = items[first - 1].x0(geo), items[first].x0(geo), items[first].y0(geo)
        ew = sum(m for m, _ in mp.embed_cols)
        add(x0, y0, 1, R, READY, "RAMP", "W")
        add(ex + ew, y0, x0 - ex - ew, R, READY, "E", "W")  # between the tables and layer 0
        add(ex + 1, y0, ew - 1, R, READY, "E", "W|RAMP")
        add(ex, y0, 1, R, READY, "E", "RAMP")
    # the mask bus: along every row of a band, from column 0 through its layer grids
    layers = [it for it in items if it.kind == "layer"]
    for row0, band in sorted({(it.row0, it.band) for it in layers}):
        y0 = row0 + 1 + band * R
        xs = sorted(it.x0(geo) for it in layers if (it.row0, it.band) == (row0, band))
        last = xs[-1] + C - 1
        add(0, y0, 1, R, MASK, "RAMP", "E")
        x = 1
        for gx in xs:
            add(x, y0, gx - x, R, MASK, "W", "E")
            stop = C if gx + C - 1 < last else C - 1
            add(gx, y0, stop, R, MASK, "W", "E|RAMP")
            x = gx + stop
        add(last, y0, 1, R, MASK, "W", "RAMP")
    if mp.dec.rope_theta:  # the RoPE bus: down every column of a slot from its wafer's row 0
        for row0, slot in sorted({(it.row0, it.slot) for it in layers}):
            x0 = 1 + slot * C
            ys = sorted(it.y0(geo) for it in layers if (it.row0, it.slot) == (row0, slot))
            last = ys[-1] + R - 1
            add(x0, row0, C, 1, ROPE, "RAMP", "S")
            y = row0 + 1
            for gy in ys:
                add(x0, y, C, gy - y, ROPE, "N", "S")
                stop = R if gy + R - 1 < last else R - 1
                add(x0, gy, C, stop, ROPE, "N", "S|RAMP")
                y = gy + stop
            add(x0, last, C, 1, ROPE, "N", "RAMP")
    return count


def cross_path(prev: Item, it: Item, geo: Geometry, q: int) -> tuple[int, int]:
    """(column of the sender in the last grid's row q, column of row q's entry PE in the next
    grid) of a crossing. The R paths go down, then along a row, and never meet on their
    color (rows q and q + C cross on the two colors, `levels`): beside each other (same slot)
    PE (q, q mod C) sends straight down; to a grid further east the anti-diagonal sends (the
    later rows' columns lie west of the earlier rows' turns); to one further west the
    diagonal. The entry PE is always the new grid's (q, q mod C)."""
    px, x0, C = prev.x0(geo), it.x0(geo), geo.C
    j = q % C
    return (px + C - 1 - j if x0 > px else px + j), x0 + j


def _cross_routes(add, prev: Item, it: Item, geo: Geometry, w: int, color: int) -> None:
    """The crossing into `it` from the last grid of the wafer before (crossing_cycles): row q's
    block goes down from the last grid, across the wafers' boundary, to row q of `it`, along
    that row to its entry PE (q, q mod C), which spreads it along the row on the hand-off
    color (as a diagonal hand-off does)."""
    py, x0, y0 = prev.y0(geo), it.x0(geo), it.y0(geo)
    for q in range(geo.R):
        cc = cross_color(it.chip, q // geo.C)
        X, T = cross_path(prev, it, geo, q)
        Y = y0 + q
        add(X, py + q, 1, 1, cc, "RAMP", "S")
        add(X, py + q + 1, 1, Y - py - q - 1, cc, "N", "S")
        if X == T:
            add(X, Y, 1, 1, cc, "N", "RAMP")
        elif T > X:
            add(X, Y, 1, 1, cc, "N", "E")
            add(X + 1, Y, T - X - 1, 1, cc, "W", "E")
            add(T, Y, 1, 1, cc, "W", "RAMP")
        else:
            add(X, Y, 1, 1, cc, "N", "W")
            add(T + 1, Y, X - T - 1, 1, cc, "E", "W")
            add(T, Y, 1, 1, cc, "E", "RAMP")
        _spread(add, T, Y, x0, w, color)


def _spread(add, x: int, y: int, x0: int, w: int, color: int) -> None:
    """PE (x, y) sends along its row to every PE of the row's w columns from x0."""
    west, east = x - x0, x0 + w - 1 - x
    tx = "|".join((["W"] if west else []) + (["E"] if east else []))
    if tx:
        add(x, y, 1, 1, color, "RAMP", tx)
    if west:
        add(x0 + 1, y, west - 1, 1, color, "E", "W|RAMP")
        add(x0, y, 1, 1, color, "E", "RAMP")
    if east:
        add(x + 1, y, east - 1, 1, color, "W", "E|RAMP")
        add(x0 + w - 1, y, 1, 1, color, "W", "RAMP")


# ---------------------------------------------------------------------------------------------
# the pipeline

def compile_decode(plan: Plan, machine, dtype: str, shape_only: bool, base_dir, name: str,
                   dump=(), out=None, grid=None, sequences: int = 1, prefill: bool = False):
    """The decode mapping of a one-position decoder plan: (Program, CompileReport). With
    sequences = B > 1, B independent sequences: B KV caches a layer and B tokens a step
    (input_ids and position_ids of B values, logits B x vocab), every region looping over
    them, so that the regions pipeline the sequences (module constants SEQ ..). prefill: the
    B are consecutive positions of one sequence, one KV cache a layer (Decoder.one_cache):
    a prompt's tokens pipelined through the layers like sequences in flight."""
    # extract: the plan's layers as named parts (NotADecoder: use the stage chain)
    dec = extract(plan)
    dec.one_cache = bool(prefill)
    if isinstance(sequences, bool) or not isinstance(sequences, int) or sequences < 1:
        raise CompileError(f"sequences must be a positive integer, got {sequences!r}")
    need = max(COLORS_NEEDED + (len(CROSS) if machine.chips > 1 else 0),
               READY + 1 if sequences > 1 else 0)
    if machine.colors < need:
        from wse_emu.isa.compiler.decoder import NotADecoder
        raise NotADecoder(f"machine has {machine.colors} colors, the mapping needs {need}")
    # choose: the grid (R, C) with the lowest predicted cycles that fits SRAM and fabric (on
    # a system: and the layers' split over its wafers)
    label = "the model" if name.endswith(".json") else name
    mp = choose(dec, machine, dtype, exact=not shape_only, grid=grid, name=label,
                seqs=sequences)
    pb = ProgramBuilder(name)
    pb.input("input_ids", "i32", (sequences,))
    pb.input("position_ids", "i32", (sequences,))
    # a prefill program's logits: its last position's (the host ends a prompt's runs there)
    pb.output("logits", "f32", (1 if prefill else sequences, dec.vocab))
    # route: allreduce lines, hand-offs, the mask and RoPE buses
    rules = route(pb, mp)
    if "routes" in dump:
        print(f"{rules} route rules", file=out)
    # codegen: one region a grid through the strategies, then the sources
    em = _Emitter(pb, mp, machine, dtype, shape_only, Weights(pb, base_dir))
    for k, it in enumerate(mp.items):
        if it.kind == "embed":
            em.embed(it)
        elif it.kind == "layer":
            em.layer(it, k)
        else:
            em.head(it, k)
    em.sources()
    if "placement" in dump:
        print(format_mapping(mp, em.stages), file=out)
    # pack
    return _pack(pb, mp, em.stages, machine, dtype, name, shape_only)


def wafers_of(mp: Mapping, machine) -> list:
    """Per wafer of a split model: its rows, its layers and their predicted cycles (with the
    embedding on the first, the head on the last and the crossing into every other)."""
    out = []
    H = machine.chip_height
    for c, (first, count) in enumerate(mp.groups):
        parts = [f"layer {k}" for k in range(first, first + count)]
        parts += (["embed"] if c == 0 else [f"crossing {c - 1}-{c}"])
        parts += (["head"] if c == len(mp.groups) - 1 else [])
        out.append({"chip": c, "rows": [c * H, (c + 1) * H], "layers": [first, first + count - 1],
                    "predicted_cycles": sum(mp.predicted.get(p, 0) for p in parts)})
    return out


def _pack(pb, mp: Mapping, stages: list, machine, dtype: str, name: str, shape_only: bool):
    dec = mp.dec
    split = machine.chips > 1
    crossings = [mp.predicted[f"crossing {c}-{c + 1}"] for c in range(machine.chips - 1)]
    wafers = wafers_of(mp, machine) if split else []
    pb.meta("compiler", {"family": dec.family, "machine": machine.name, "dtype": dtype,
                         "max_context": dec.max_context, "vocab": dec.vocab,
                         "hidden": dec.hidden, "layers": len(dec.layers),
                         "mapping": "wafer", "grid": mp.geo.label, "sequences": mp.seqs,
                         "prefill": dec.one_cache,
                         "predicted_cycles": mp.predicted, "wafers": wafers,
                         "stages": [dict(s, rect=list(s["rect"])) for s in stages]})
    try:
        program = pb.build()
    except BuildError as e:
        raise CompileError(f"internal: the generated program is invalid: {e}") from None
    parts: dict = {}
    for k, st in enumerate(stages):
        part = "sources" if st["kind"] == "source" else part_name(st["layer"], len(dec.layers))
        entry = parts.setdefault(part, [part, st["layer"], [], mp.predicted.get(part, 0)])
        entry[2].append(f"s{k}.{st['name']}")
    program = with_model(program, dec.plan.graph.config, "mesh", "wafer", machine, dtype, 1,
                         list(parts.values()), shape_only, mp.groups if split else (),
                         crossings, mp.seqs, dec.one_cache)
    sram = program.regions_sram_bytes()
    worst = max(range(len(sram)), key=lambda i: sram[i])
    if sram[worst] > machine.sram_bytes:
        raise CompileError(f"region '{program.regions[worst].name}' needs {sram[worst]} bytes of "
                           f"SRAM per PE but machine '{machine.name}' has {machine.sram_bytes}: "
                           f"use a smaller max_context or 16-bit weights")
    by_stage = {}
    for r, b in zip(program.regions, sram):
        by_stage[int(r.name[1:].split(".", 1)[0])] = b
    for i, s in enumerate(stages):
        s["sram"] = by_stage.get(i, 0)
    pes = sum(r.rect.size for r in program.regions)
    box = program.bounding_box()
    report = CompileReport(
        model=name, machine=machine.name, dtype=dtype, max_context=dec.max_context,
        fabric=(box.w, box.h), pes=pes, sram_max=max(sram),
        sram_mean=sum(b * r.rect.size for b, r in zip(sram, program.regions)) / pes,
        colors=program.colors_used(), stages=stages, predicted=dict(mp.predicted),
        grid=mp.geo.label, wafers=wafers, sequences=mp.seqs, prefill=dec.one_cache,
        score_passes=mp.geo.passes,
        column_classes=mp.geo.split,
        step_cycles=pipelined_cycles(mp.predicted, mp.seqs))
    return program, report


def format_mapping(mp: Mapping, stages: list) -> str:
    g = mp.geo
    pad = ", ".join(f"{what} {a} to {b}" for what, a, b in (
        ("d", g.d, g.dp), ("f", g.f, g.fp), ("head dims", g.hd, g.hdp)) if a != b)
    pad = f"; padded: {pad}" if pad else ""
    if g.split:
        h, lt = g.variants
        cols = (f"{h.n} of {h.D} head dims and {h.F} hidden units, {lt.n} of {lt.D} and "
                f"{lt.F}")
    else:
        cols = f"{g.D} head dims a column"
    passes = f", scores in {g.passes} passes of {g.hpass} heads" if g.passes > 1 else ""
    lines = [f"grid {g.R} x {g.C} a layer (K = {g.K}, {g.s} columns a KV head: {cols}, "
             f"{g.S} cache slots a PE{pad}{passes}), {mp.bands} bands of {g.R} rows"]
    hand = {(it.kind, it.index): it.handoff_in for it in mp.items}
    for k, s in enumerate(stages):
        x, y, w, h = s["rect"]
        kind = "layer" if s["kind"] == "layer" else s["kind"]
        how = hand.get((kind, s["layer"]), "")
        lines.append(f"  #{k} {s['name']:<30} at ({x}, {y}) {w} x {h}"
                     + (f", residual in by {how}" if how else ""))
    return "\n".join(lines)

"""Mapping strategy `gemv`: a matrix-vector product on an R x C grid as local tile products
followed by one allreduce along a line (docs/compiler.md, "Products").

PE (j, i) (column j, row i) holds the tile of W whose input block it already has and whose
output block its line will own:

    product     input layout   tile at (j, i)                           allreduce   output
    q/k/v       R (block i)    rows of column j's head dims, cols block i  column      C
    o           C (column j)   rows block i, cols of column j's dims       row         R
    gate/up     R              rows block j of gate and of up, cols blk i  column      C
    down        C              rows block i, cols block j                  row         R

so consecutive products alternate their reduction axis and no transpose or gather is ever
needed; q, k and v (and gate and up) are one fused tile and one allreduce. Tiles are stored
column-major (what `mv` reads); rows that are not contiguous in W (a column's head dims) are
gathered at load time, one tile map per run (and per tile column when the runs interleave).

On a padded grid (decoder.Geometry: a side that does not divide its dimension) the tiles come
from zero-padded copies of the weights (`padded`), program tensors of their own: the tile maps
then read the padded matrices with the same indices as an unpadded grid. On a grid of two
column classes each class's tiles come from a copy of the part of the weights its columns hold
(its RoPE pairs of every head, its hidden units), so that a class's tile maps are those of a
grid of its columns alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wse_emu.isa.compiler.placement import WEIGHT_BYTES


@dataclass(frozen=True)
class Padded:
    """A weight's zero-padded logical matrix, held by the program as tensor `name`."""

    name: str
    key: str
    shape: tuple
    rows: None = None
    transpose: bool = False


def pad_array(geo, a: np.ndarray, axes: tuple) -> np.ndarray:
    """The part of a (one axis an entry of axes) that geo's column class holds, zero-padded:
    "d" padded to geo.dp; "f" this class's hidden units (geo.f0 on, kv n F of them, zeros past
    f); "heads" of every head's two halves this class's RoPE pairs (geo.base on, n h2 of
    them: on a grid of one class all of them, zeros past half a head); "rope" a table's
    columns (half a head) the same way; None leaves the axis."""
    for k, how in enumerate(axes):
        if how is None:
            continue
        a = np.moveaxis(a, k, -1)
        lead = a.shape[:-1]
        if how == "d":
            a = np.concatenate([a, np.zeros(lead + (geo.dp - a.shape[-1],), a.dtype)], -1)
        elif how == "f":
            end = geo.f0 + geo.kv * geo.n * geo.F
            a = np.concatenate([a, np.zeros(lead + (max(0, end - a.shape[-1]),), a.dtype)], -1)
            a = a[..., geo.f0:end]
        else:
            half, width = geo.hd // 2, geo.n * geo.h2
            parts = a.reshape(lead + (-1, half))[..., geo.base:geo.base + width]
            pad = np.zeros(parts.shape[:-1] + (width - parts.shape[-1],), a.dtype)
            a = np.concatenate([parts, pad], -1).reshape(lead + (-1,))
        a = np.moveaxis(a, -1, k)
    return np.ascontiguousarray(a)


def padded(ctx, ref, axes: tuple):
    """The ref to load a weight's tiles from: ref itself when its axes need no padding and
    the grid has one column class (or nothing is loaded), else a Padded copy of the part of it
    ctx.geo's class holds (declared once a program)."""
    geo = ctx.geo
    heads = geo.split or geo.hdp != geo.hd
    need = {"d": geo.dp != geo.d, "f": geo.fp != geo.f or geo.split, "heads": heads,
            "rope": heads}
    if ref is None or ctx.shape_only or not any(need[a] for a in axes if a):
        return ref
    from wse_emu.isa.graph_numpy import load_weight
    key = (ref.file, ref.key, ref.rows, ref.transpose, axes, geo.R, geo.C, geo.part)
    made = ctx.padded
    if key not in made:
        a = pad_array(geo, load_weight(ref.key, ref), axes)
        name = f"pad{len(made)}"
        ctx.weights.pb.tensor(name, a)
        made[key] = Padded(name, ref.key, a.shape)
    return made[key]


def _affine(v):
    return v if isinstance(v, tuple) else (v, 0, 0)


def load_block(ctx, rb, ref, addr, rows: int, cols: int, row_idx, col_idx, ld: int, rect,
               dtype: str | None = None) -> None:
    """Put W[r*rows:(r+1)*rows, c*cols:(c+1)*cols] (W the logical (out, in) matrix of ref; r, c
    affine tile indices (start, step_y, step_x) over rect) at addr, column-major with column
    stride ld elements, on every PE of rect (region-relative)."""
    if ctx.shape_only:
        return
    dtype = dtype or ctx.dtype
    name = ref.name if isinstance(ref, Padded) else ctx.weights.tensor(ref)
    r0, rdy, rdx = _affine(row_idx)
    c0, cdy, cdx = _affine(col_idx)
    first = ref.rows[0] if ref.rows else 0
    if first % rows:
        raise ctx.error(f"weight '{ref.key}': its rows start at {first}, not a multiple of "
                        f"the tile height {rows}")
    r0 += first // rows
    size = WEIGHT_BYTES[dtype] if dtype != "f32" else 4
    if ld == rows:  # one contiguous tile
        if ref.transpose:  # stored (in, out): the (cols x rows) C-order tile is W's F-order
            rb.load(name, addr, dtype, (cols, rows), (c0, cdy, cdx), (r0, rdy, rdx), "C",
                    rect=rect)
        else:
            rb.load(name, addr, dtype, (rows, cols), (r0, rdy, rdx), (c0, cdy, cdx), "F",
                    rect=rect)
        return
    for t in range(cols):  # tile columns one by one: a run of `rows` inside each
        col = (c0 * cols + t, cdy * cols, cdx * cols)
        a = addr + t * ld * size
        if ref.transpose:
            rb.load(name, a, dtype, (1, rows), col, (r0, rdy, rdx), "C", rect=rect)
        else:
            rb.load(name, a, dtype, (rows, 1), (r0, rdy, rdx), col, "F", rect=rect)


def qkv_runs(geo):
    """The runs of a column's fused q/k/v tile: (matrix index 0/1/2, offset in the tile,
    tile index of the run in its matrix (in h2 rows, in the part of it the column's class
    holds: pad_array) as a function (start, per-KV-head step) plus the column's place among
    its class's n columns of KV head g). Order: each query head's two half-runs, then k's,
    then v's."""
    n, h2, group = geo.n, geo.h2, geo.group
    runs = []
    off = 0
    for hh in range(group):
        for half in range(2):
            runs.append((0, off, hh * 2 * n + half * n, group * 2 * n))
            off += h2
    for mat in (1, 2):
        for half in range(2):
            runs.append((mat, off, half * n, 2 * n))
            off += h2
    return runs


def segments(geo, height: int, g: int | None = None) -> list:
    """[(KV head g, its columns' rectangle in the region)]: a region of the whole grid (g None)
    holds every segment (columns g s ..); a strip of a two-class grid one class's n columns of
    segment g, all of its region."""
    if g is None:
        return [(k, (k * geo.s, 0, geo.s, height)) for k in range(geo.kv)]
    return [(g, (0, 0, geo.n, height))]


def load_qkv(ctx, rb, mats, waddr, baddr, segs) -> None:
    """The fused q/k/v tile (Mqkv x K) and bias (Mqkv) of every column of segs (segments())."""
    geo = ctx.geo
    h2, K = geo.h2, geo.K
    refs = [(padded(ctx, m.ref, ("heads", "d")), padded(ctx, m.bias_ref, ("heads",)))
            for m in mats]
    for g, rect in segs:
        for mat, off, start, per_head in qkv_runs(geo):
            w, b = refs[mat]
            ri = (g * per_head + start, 0, 1)
            load_block(ctx, rb, w, waddr + off * WEIGHT_BYTES[ctx.dtype], h2, K, ri,
                       (0, 1, 0), geo.Mqkv, rect)
            if b is not None and baddr is not None:
                load_block(ctx, rb, b, baddr + off * 4, h2, 1, ri, 0, h2, rect, "f32")


def load_o(ctx, rb, m, waddr, baddr, segs) -> None:
    """The output projection's tile (K x Mq): rows block i, columns = column j's head dims of
    each query head, in the order of the attention output (ao) of the column."""
    geo = ctx.geo
    n, h2, K, group = geo.n, geo.h2, geo.K, geo.group
    wb = WEIGHT_BYTES[ctx.dtype]
    w = padded(ctx, m.ref, ("d", "heads"))
    bias = padded(ctx, m.bias_ref, ("d",)) if m.bias_ref is not None else None
    for g, rect in segs:
        for hh in range(group):
            for half in range(2):
                t = 2 * hh + half
                ci = ((g * group + hh) * 2 * n + half * n, 0, 1)
                load_block(ctx, rb, w, waddr + t * h2 * K * wb, K, h2, (0, 1, 0), ci, K, rect)
        if bias is not None and baddr is not None:
            load_block(ctx, rb, bias, baddr, K, 1, (0, 1, 0), 0, K, rect, "f32")


def load_mlp1(ctx, rb, mats, waddr, baddr, segs) -> None:
    """Gate and up (or up alone): rows block j of each, stacked; columns block i. Column j's
    block is its place among the columns of its class (pad_array "f")."""
    geo = ctx.geo
    F, K, n = geo.F, geo.K, geo.n
    wb = WEIGHT_BYTES[ctx.dtype]
    for k, m in enumerate(mats):
        w = padded(ctx, m.ref, ("f", "d"))
        b = padded(ctx, m.bias_ref, ("f",)) if m.bias_ref is not None else None
        for g, rect in segs:
            load_block(ctx, rb, w, waddr + k * F * wb, F, K, (g * n, 0, 1), (0, 1, 0), geo.M1,
                       rect)
            if b is not None and baddr is not None:
                load_block(ctx, rb, b, baddr + k * F * 4, F, 1, (g * n, 0, 1), 0, F, rect,
                           "f32")


def load_down(ctx, rb, m, waddr, baddr, segs) -> None:
    geo = ctx.geo
    F, K, n = geo.F, geo.K, geo.n
    w = padded(ctx, m.ref, ("d", "f"))
    b = padded(ctx, m.bias_ref, ("d",)) if m.bias_ref is not None else None
    for g, rect in segs:
        load_block(ctx, rb, w, waddr, K, F, (0, 1, 0), (g * n, 0, 1), K, rect)
        if b is not None and baddr is not None:
            load_block(ctx, rb, b, baddr, K, 1, (0, 1, 0), 0, K, rect, "f32")


def product(ctx, what: str, w, M: int, K: int, x, y, line, bias=None) -> None:
    """y (M) = W (M x K) x (K) on every PE, then the allreduce of y along `line`, then the
    bias (whose block every PE of the line holds)."""
    rb = ctx.rb
    rb.dmem("d0", ctx.dtype, w, M)
    rb.d2d("d0", K, M)
    rb.dmem("d1", "f32", x, K)
    rb.dmem("d2", "f32", y, M)
    rb.mv("d2", "d0", "d1")
    ctx.charge(what, ctx.cost.mat(M, K, 1, ctx.dtype, "f32") + ctx.cost.scalar(4))
    ctx.allreduce(line, y, M, what=f"{what} allreduce")
    if bias is not None:
        rb.dmem("d2", "f32", y, M)
        rb.dmem("d3", "f32", bias, M)
        rb.vadd("d2", "d2", "d3")
        ctx.charge(what, ctx.cost.op("add", M) + ctx.cost.scalar(2))


def tile_bytes(geo, wbytes: int, biases: bool) -> int:
    """SRAM of a layer PE's four weight tiles (and their bias blocks, fp32)."""
    w = (geo.Mqkv * geo.K + geo.K * geo.Mq + geo.M1 * geo.K + geo.K * geo.F) * wbytes
    return w + (4 * (geo.Mqkv + geo.K + geo.M1 + geo.K) if biases else 0)

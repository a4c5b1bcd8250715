"""Mapping strategy `attention`: the KV cache spread over the layer's R x C grid (positions
along the rows, head dims along the columns, a KV head's s columns a segment), attention by
local products and line allreduces (docs/compiler.md, "Attention").

Column j holds (after q/k/v's allreduce) the dims D_j of KV head g's k and v and of its
`group` query heads; row i keeps the positions p with p mod R == i, slot p // R, of those dims:

    K cache  (S x D)      column-major: a dim a column, so the scores are one `mm`
    V cache  (D + 1) x S  column-major: a slot a column, its D dims and a constant 1, so that
                          one `mm` gives both the weighted values and the softmax's sum

A step:
  1. RoPE (Llama): column j's cos and sin of this position arrive on the column's RoPE bus
     (from a PE of row 0 that reads the position); q's and k's pairs rotate locally.
  2. Append: this position's mask row arrives on the row's mask bus (from a PE of column 0):
     [mask (0 or -inf a slot), one-hot of the new slot, 1 - one-hot], kept in bf16 (their
     values are exact there). cache = cache * keep + one-hot x new (an `mma` of the one-hot
     and the new k or [v; 1], rounded to the cache's dtype once): every PE runs the same ops,
     the data says which slot changes, so the code never branches on the position (a
     timing-only run needs no SRAM here).
  3. scores (S x group) = K cache (S x D) q (D x group), + mask; allreduce along the KV head's
     segment of the row (the other dims of the head).
  4. max: each head's over the PE's slots, allreduce (max) along the column (all
     positions); p = exp(scores - max).
  5. [o; l] ((D + 1) x group) = V cache p; allreduce along the column; o / l.
Where the scores of all `group` heads (S x group fp32) would not fit a PE, steps 3-5 run in
passes of h heads (Geometry.hp), reusing an S x h buffer: each pass's scores, their segment
allreduce, p = exp(scores - m) with m each head's max over this PE's slots, and its heads'
[o; l]. After the passes one allreduce (max) of m along the column gives M, each head's
[o; l] is scaled by exp(m - M) (the softmax over all positions, as in flash attention), and
the column's sum and o / l follow as in step 5. A PE whose slots are all masked has m = -inf:
m is kept at least -3.4e38 so that its p and its scale are 0, not NaN.
The cost of a step is set by S = ceil(max_context / R) slots a PE, not by the position.
Where s columns do not divide head_dim / 2 a segment's columns hold lo + 1 or lo RoPE pairs
(decoder.Geometry's two column classes): a column's ops have its class's sizes, and the
segment's allreduce of the scores sums over every column's dims all the same.
"""

from __future__ import annotations

import numpy as np

from wse_emu.isa.compiler import map_gemv
from wse_emu.isa.compiler.map_elementwise import mem_to_scalar
from wse_emu.isa.compiler.emit import I32
from wse_emu.isa.compiler.placement import WEIGHT_BYTES

NEG_INF = float("-inf")
MASK = "bf16"  # a layer PE's mask, one-hot and keep (0, 1 and -inf are exact in it)


def cache_bytes(geo, kvbytes: int) -> int:
    return geo.S * geo.D * kvbytes + (geo.D + 1) * geo.S * kvbytes


def _round8(n: int) -> int:
    return -(-n // 8) * 8


def scratch_layout(geo, rope: bool, mlp_bytes: int) -> tuple[dict, int]:
    """({buffer: offset}, bytes) of a layer PE's scratch region: the attention's fp32 buffers
    and the MLP's gate/up vector (mlp_bytes), overlaid where their lifetimes in a step's code
    (wafer._layer_body) do not overlap. A PE runs its ops one at a time and an op that sends
    has read its whole operand when it ends (docs/timing-model.md), so a buffer is dead after
    the last op that reads it; every buffer here is written in a step before it is read (by
    an op or a `dfin`), none is initialised at load, and none outlives its sequence's pass
    through the loop body. In emission order:

        rope    cs (this position's cos and sin, by its dfin), rt (products)  -> rope's end
        append  mask (dfin) .. step 3; append (one-hot and keep, dfin)        -> append's end
        scores  sc (step 3 .. the values' mm), mx, oe, fold, ao               -> the o product
        mlp     gu (mlp in .. down)

    mask is live across the append and the scores, so it has its own bytes; rope's cs and rt,
    the append's one-hot and keep and the rest of the attention follow it, each group at the
    same offset (one group is dead before the next is written). gu is written by the MLP's
    first product, after the o product has read ao, the last of them: it takes the region
    from offset 0. The region is as large as the largest of these, not their sum."""
    size = scratch_sizes(geo, rope, mlp_bytes)
    offs = {"mask": 0}
    base = _round8(size["mask"])
    top = base
    for group in (("sc", "mx", "fold", "oe", "ao"), ("append",), ("cs", "rt")):
        at = base
        for name in group:
            if name in size:
                offs[name] = at
                at += _round8(size[name])
        top = max(top, at)
    offs["gu"] = 0
    return offs, max(top, _round8(size["gu"]))


def scratch_sizes(geo, rope: bool, mlp_bytes: int) -> dict:
    """{buffer: bytes} of the buffers scratch_layout places (sc: one pass's scores; mask,
    one-hot and keep in bf16)."""
    S, g, D = geo.S, geo.group, geo.D
    size = dict(mask=S * 2, append=2 * S * 2, sc=S * geo.hpass * 4, mx=g * 4, fold=g * 4,
                oe=(D + 1) * g * 4, ao=geo.Mq * 4, gu=mlp_bytes)
    if rope:
        size.update(cs=2 * geo.h2 * 4, rt=2 * (g + 1) * geo.h2 * 4)
    return size


def buffer_bytes(geo, rope: bool = True, mlp_bytes: int = 0) -> int:
    """Bytes of the overlaid fp32 scratch of a layer PE (scratch_layout): the attention's
    scores, maxima, masks, RoPE, o, l and the append's products, and the MLP's mlp_bytes."""
    return scratch_layout(geo, rope, mlp_bytes)[1]


def strides(geo, dtype: str) -> tuple[int, int]:
    """Bytes of one sequence's K cache and V cache on a PE (the caches of B sequences are B
    such blocks, sequence s at s times the stride)."""
    kvb = WEIGHT_BYTES[dtype]
    return geo.S * geo.D * kvb, (geo.D + 1) * geo.S * kvb


def alloc(ctx, rb, mlp_bytes: int = 0) -> None:
    """The caches (ctx.caches of each: a sequence's, or one of a prefill program), the V
    caches' constant row of ones, and one scratch
    region for the attention's buffers and the MLP's gate/up vector (ctx.bufs['gu'],
    mlp_bytes), overlaid as scratch_layout says."""
    geo = ctx.geo
    S, D = geo.S, geo.D
    seqs = getattr(ctx, "caches", getattr(ctx, "seqs", 1))
    kstride, vstride = strides(geo, ctx.dtype)
    ctx.bufs["kc"] = rb.alloc("kcache", seqs * kstride)
    ctx.bufs["vc"] = rb.alloc("vcache", seqs * vstride)
    offs, nbytes = scratch_layout(geo, ctx.rope, mlp_bytes)
    scratch = rb.alloc("scratch", nbytes)
    for name, off in offs.items():
        ctx.bufs[name] = scratch + off
    ones = np.zeros((S, D + 1), np.float32)
    ones[:, D] = 1.0  # slot-major: a slot's D values, then 1
    if not ctx.shape_only:
        rb.init(ctx.bufs["vc"], ctx.dtype, np.tile(ones.ravel(), seqs))


def rope(ctx, qkv) -> None:
    """Receive this position's cos and sin for the column's frequencies; rotate the pairs of
    every query head and of k (in place in the q/k/v buffer)."""
    rb, geo, c = ctx.rb, ctx.geo, ctx.cost
    h2, g = geo.h2, geo.group
    cs, rt = ctx.bufs["cs"], ctx.bufs["rt"]
    rb.dmem("d1", "f32", cs, 2 * h2)
    rb.dfin("d2", "f32", ctx.colors["rope"], 2 * h2)
    rb.vmov("d1", "d2")

    def pairs(d, addr):  # (group + 1) runs of h2 at stride 2 h2: lo (addr = qkv) or hi
        rb.dmem(d, "f32", addr, h2)
        rb.d2d(d, g + 1, 2 * h2)

    def table(d, addr):  # cos or sin repeated for every run
        rb.dmem(d, "f32", addr, h2)
        rb.d2d(d, g + 1, 0)
    lo, hi = qkv, qkv + 4 * h2
    pairs("d5", lo)
    pairs("d6", hi)
    table("d7", cs)
    table("d8", cs + 4 * h2)
    rb.dmem("d9", "f32", rt, (g + 1) * h2)
    rb.dmem("d10", "f32", rt + 4 * (g + 1) * h2, (g + 1) * h2)
    rb.vmul("d9", "d6", "d8")  # hi * sin
    rb.vmul("d10", "d5", "d8")  # lo * sin
    rb.vmul("d5", "d5", "d7")
    rb.vsub("d5", "d5", "d9")  # lo' = lo cos - hi sin
    rb.vmul("d6", "d6", "d7")
    rb.vadd("d6", "d6", "d10")  # hi' = hi cos + lo sin
    m = (g + 1) * h2
    ctx.charge("rope", c.op("move", 2 * h2) + 2 * h2 + 6 * c.op("mul", m) + c.scalar(16))


def attend(ctx, layer, qkv) -> None:
    """Steps 2-5 of the module docstring; the result (the column's Mq attention outputs)
    in ctx.bufs['ao']."""
    rb, geo, c = ctx.rb, ctx.geo, ctx.cost
    S, D, g, Mq = geo.S, geo.D, geo.group, geo.Mq
    kvd = ctx.dtype
    b = ctx.bufs
    mask, oe, ao, fold = (b[k] for k in ("mask", "oe", "ao", "fold"))
    onehot, keep = b["append"], b["append"] + 2 * S
    # the scale on q (Mq values), before its dots with the cached keys
    rb.dmem("d1", "f32", qkv, Mq)
    rb.fli("f5", float(layer.attn["scale"]))
    rb.vmuls("d1", "d1", "f5")
    # 2. this position's mask row, then the append
    rb.dmem("d1", MASK, mask, S)
    rb.dfin("d2", "f32", ctx.colors["mask"], S)
    rb.vmov("d1", "d2")
    rb.dmem("d1", MASK, onehot, 2 * S)
    rb.dfin("d2", "f32", ctx.colors["mask"], 2 * S)
    rb.vmov("d1", "d2")
    k_new, v_new = qkv + 4 * Mq, qkv + 4 * (Mq + D)  # v_new is followed by the constant 1
    _cache(ctx, "d1", "k", S)
    rb.d2d("d1", D, S)  # K cache (S x D)
    rb.dmem("d2", MASK, keep, S)
    rb.d2d("d2", D, 0)  # keep, for every dim
    rb.vmul("d1", "d1", "d2")
    rb.dmem("d3", MASK, onehot, S)  # (S x 1)
    rb.dmem("d4", "f32", k_new, 1)
    rb.d2d("d4", D, 1)  # k (1 x D)
    rb.mma("d1", "d3", "d4")
    _cache(ctx, "d1", "v", D + 1)
    rb.d2d("d1", S, D + 1)  # V cache ((D + 1) x S)
    rb.dmem("d2", MASK, keep, D + 1)
    rb.dstride("d2", 0)
    rb.d2d("d2", S, 1)  # keep[slot], for every row of the slot
    rb.vmul("d1", "d1", "d2")
    rb.dmem("d3", "f32", v_new, D + 1)  # [v; 1] ((D + 1) x 1)
    rb.dmem("d4", MASK, onehot, 1)
    rb.d2d("d4", S, 1)  # one-hot (1 x S)
    rb.mma("d1", "d3", "d4")
    ctx.charge("kv append", c.op("move", S, MASK, "f32") + c.op("move", 2 * S, MASK, "f32")
               + 3 * S + c.op("mul", S * D, kvd, MASK) + c.mat(S, 1, D, kvd, MASK, "f32")
               + c.op("mul", S * (D + 1), kvd, MASK) + c.mat(D + 1, 1, S, kvd, "f32", MASK)
               + c.scalar(27))
    if geo.passes == 1:
        _scores(ctx, qkv, None)
        _softmax(ctx, None)
        _values(ctx, None)
    else:
        _passes(ctx, qkv)
    ctx.allreduce(ctx.col, oe, (D + 1) * g, what="values allreduce")
    # o / l: 1 / l as (1 / sqrt(l))^2 for every head at once
    lsum = fold  # scratch: g values
    rb.dmem("d1", "f32", oe + 4 * D, g)
    rb.dstride("d1", D + 1)  # l of every head
    rb.dmem("d2", "f32", lsum, g)
    rb.vrsqrt("d2", "d1")
    rb.vmul("d2", "d2", "d2")
    rb.dmem("d3", "f32", ao, D)
    rb.d2d("d3", g, D)
    rb.dmem("d4", "f32", oe, D)
    rb.d2d("d4", g, D + 1)
    rb.dmem("d5", "f32", lsum, D)
    rb.dstride("d5", 0)
    rb.d2d("d5", g, 1)
    rb.vmul("d3", "d4", "d5")
    ctx.charge("softmax", c.op("special", g) + c.op("mul", g) + c.op("mul", D * g)
               + c.scalar(10))


def _cache(ctx, d: str, which: str, rows: int) -> None:
    """Descriptor d at this sequence's K ("k") or V ("v") cache, rows long."""
    base = ctx.bufs["kc"] if which == "k" else ctx.bufs["vc"]
    regs = getattr(ctx, "cache_regs", None)  # several sequences: (K, V) cache offsets
    ctx.rb.dmem(d, ctx.dtype, base, rows)
    if regs:
        ctx.rb.daddr(d, regs[0] if which == "k" else regs[1], base)


def _offset(ctx, d: str, addr: int, reg: str | None) -> None:
    """Descriptor d's address: addr, plus register reg's bytes (a pass's offset) if any."""
    if reg:
        ctx.rb.daddr(d, reg, addr)


def _scores(ctx, qkv, reg: str | None) -> None:
    """Step 3 for a pass's h heads (all of them in one pass): sc (S x h) = K q, + mask,
    summed along the segment. reg: the pass's offset into q (None: q's first head)."""
    rb, geo, c = ctx.rb, ctx.geo, ctx.cost
    S, D, h = geo.S, geo.D, geo.hpass
    sc, mask = ctx.bufs["sc"], ctx.bufs["mask"]
    _cache(ctx, "d1", "k", S)
    rb.d2d("d1", D, S)
    rb.dmem("d2", "f32", qkv, D)
    _offset(ctx, "d2", qkv, reg)
    rb.d2d("d2", h, D)
    rb.dmem("d3", "f32", sc, S)
    rb.d2d("d3", h, S)
    rb.mm("d3", "d1", "d2")
    rb.dmem("d4", MASK, mask, S)
    rb.d2d("d4", h, 0)
    rb.vadd("d3", "d3", "d4")
    ctx.charge("scores", geo.passes * (c.mat(S, D, h, ctx.dtype, "f32") + c.op("add", S * h)
                                       + c.scalar(10 + 2 * bool(reg))))
    ctx.allreduce(ctx.seg, sc, S * h, what="scores allreduce", times=geo.passes)


def _softmax(ctx, reg: str | None) -> None:
    """Step 4 for a pass's h heads: each head's max over this PE's slots into mx (reg: the
    pass's offset into mx), and, in one pass, along the column; p = exp(scores - max) in
    sc. With several passes the maxima stay this PE's (at least FLOOR)."""
    rb, geo, c = ctx.rb, ctx.geo, ctx.cost
    S, h = geo.S, geo.hpass
    sc, mx = ctx.bufs["sc"], ctx.bufs["mx"]
    for hh in range(h):
        rb.dmem("d1", "f32", sc + 4 * hh * S, S)
        rb.rmax("f1", "d1")
        if reg:
            rb.fmax("f1", "f1", "f3")
        rb.dmem("d2", "f32", mx + 4 * hh, 1)
        _offset(ctx, "d2", mx + 4 * hh, reg)
        rb.vfill("d2", "f1")
    ctx.charge("softmax", geo.passes * h * (c.op("max", S) + c.op("move", 1)
                                            + c.scalar(2 + 2 * bool(reg))))
    if not reg:
        ctx.allreduce(ctx.col, mx, h, op="max", what="max allreduce")
    rb.dmem("d1", "f32", sc, S)
    rb.d2d("d1", h, S)
    rb.dmem("d2", "f32", mx, S)
    _offset(ctx, "d2", mx, reg)
    rb.dstride("d2", 0)
    rb.d2d("d2", h, 1)  # the head's max for every slot
    rb.vsub("d1", "d1", "d2")
    rb.vexp("d1", "d1")
    ctx.charge("softmax", geo.passes * (c.op("add", S * h) + c.op("special", S * h)
                                        + c.scalar(6 + bool(reg))))


def _values(ctx, reg: str | None) -> None:
    """Step 5's product for a pass's h heads: [o; l] ((D + 1) x h) = V p into oe (reg: the
    pass's offset into oe)."""
    rb, geo, c = ctx.rb, ctx.geo, ctx.cost
    S, D, h = geo.S, geo.D, geo.hpass
    sc, oe = ctx.bufs["sc"], ctx.bufs["oe"]
    _cache(ctx, "d1", "v", D + 1)
    rb.d2d("d1", S, D + 1)
    rb.dmem("d2", "f32", sc, S)
    rb.d2d("d2", h, S)
    rb.dmem("d3", "f32", oe, D + 1)
    _offset(ctx, "d3", oe, reg)
    rb.d2d("d3", h, D + 1)
    rb.mm("d3", "d1", "d2")
    ctx.charge("weighted values", geo.passes * (c.mat(D + 1, S, h, ctx.dtype, "f32")
                                                + c.scalar(6 + bool(reg))))


FLOOR = -3.4e38  # a pass's maxima at least this: a PE with every slot masked gets 0, not NaN


def _passes(ctx, qkv) -> None:
    """Steps 3-5 in passes of h heads (module docstring): a loop on PASS (heads done), then
    the maxima along the column and each head's [o; l] scaled by exp(m - M)."""
    rb, geo, c = ctx.rb, ctx.geo, ctx.cost
    D, g, h = geo.D, geo.group, geo.hpass
    mx, fold, oe = ctx.bufs["mx"], ctx.bufs["fold"], ctx.bufs["oe"]
    reg, off = ctx.pass_reg, "r1"  # off: a temporary no allreduce call keeps
    top = ctx.labels("pass")
    rb.fli("f3", FLOOR)
    rb.li(reg, 0)
    rb.label(top)
    rb.muli(off, reg, 4 * D)
    _scores(ctx, qkv, off)
    rb.muli(off, reg, 4)
    _softmax(ctx, off)
    rb.muli(off, reg, 4 * (D + 1))
    _values(ctx, off)
    rb.addi(reg, reg, h)
    rb.li(off, g)
    rb.blt(reg, off, top)
    ctx.charge("softmax", c.scalar(2 + 6 * geo.passes))
    # M along the column into fold; scale = exp(m - M) into mx; [o; l] of each head scaled
    rb.dmem("d1", "f32", fold, g)
    rb.dmem("d2", "f32", mx, g)
    rb.vmov("d1", "d2")
    ctx.charge("softmax", c.op("move", g) + c.scalar(2))
    ctx.allreduce(ctx.col, fold, g, op="max", what="max allreduce")
    rb.vsub("d2", "d2", "d1")
    rb.vexp("d2", "d2")
    rb.dmem("d3", "f32", oe, D + 1)
    rb.d2d("d3", g, D + 1)
    rb.dmem("d4", "f32", mx, D + 1)
    rb.dstride("d4", 0)
    rb.d2d("d4", g, 1)  # the head's scale for each of its D + 1 values
    rb.vmul("d3", "d3", "d4")
    ctx.charge("softmax", c.op("add", g) + c.op("special", g) + c.op("mul", (D + 1) * g)
               + c.scalar(8))


# ---------------------------------------------------------------------------------------------
# The buses' sources: PEs that read position_ids and send what the grids need. With several
# sequences (seqs > 1) a source computes every sequence's rows in a loop (r0 = s, r10 = 4 s,
# r8 = s times a row's bytes) and sends them as one message: the grids of its bus take one
# sequence's rows at a time from their queues, each at its own pace, so the source never holds
# a grid to the pace of a later one.


def seq_loop(rb, seqs: int, row_bytes: int, body) -> None:
    """body() once (seqs = 1) or for s = 0 .. seqs-1 with r10 = 4 s and r8 = s row_bytes."""
    if seqs == 1:
        body()
        return
    rb.li("r0", 0)
    rb.label("sequence")
    rb.muli("r10", "r0", 4)
    rb.muli("r8", "r0", row_bytes)
    body()
    rb.addi("r0", "r0", 1)
    rb.li("r1", seqs)
    rb.blt("r0", "r1", "sequence")


def _at(rb, d: str, addr, seqs: int) -> None:
    """Descriptor d's address at this sequence's row (seq_loop's r8)."""
    if seqs > 1:
        rb.daddr(d, "r8", addr)

def rope_tables(theta: float, hd: int, ctx_len: int) -> tuple[int, list]:
    """(B, [cos_lo, sin_lo, cos_hi, sin_hi]) with position p = hi * B + lo: cos(p f) =
    cos(hi B f) cos(lo f) - sin(hi B f) sin(lo f). Angles in fp32 as transformers computes
    them (fp32(position) * inv_freq); with B >= max_context hi is 0 and the result is exactly
    the table's."""
    inv = np.float32(1.0) / (np.float32(theta) ** (np.arange(0, hd, 2, dtype=np.float32)
                                                   / np.float32(hd)))
    B = ctx_len if ctx_len * hd * 4 <= 16384 else 1 << int(np.ceil(np.log2(np.sqrt(ctx_len))))
    H = -(-ctx_len // B)
    lo = np.arange(B, dtype=np.float32)[:, None] * inv[None, :]
    hi = (np.arange(H, dtype=np.float32) * np.float32(B))[:, None] * inv[None, :]
    return B, [np.cos(lo).astype(np.float32), np.sin(lo).astype(np.float32),
               np.cos(hi).astype(np.float32), np.sin(hi).astype(np.float32)]


def rope_source(ctx, pb, name: str, x0: int, geo, theta: float, color: int, default_pos,
                y0: int = 0, seqs: int = 1, g: int | None = None) -> None:
    """Row y0 (a wafer's row 0) above a lattice slot of C columns: PE j computes cos and sin
    of this position (of each sequence's) at column j's frequencies and sends them down its
    column (through every grid below on its wafer). On a grid of two column classes one
    source a class and segment g, above that strip (geo a class's, x0 the strip's)."""
    h2 = geo.h2
    n = geo.C if g is None else geo.n
    segs = map_gemv.segments(geo, 1, g)
    B, tables = rope_tables(theta, geo.hd, geo.ctx)
    H = tables[2].shape[0]
    names = []
    tail = ""
    if geo.split or geo.hdp != geo.hd:  # the column's frequencies: its class's, padded
        tables = [map_gemv.pad_array(geo, t, (None, "rope")) for t in tables]
        tail = f"_{geo.base}_{geo.n * h2}"
    for k, t in enumerate(tables):
        tname = f"rope{k}_{geo.hd}_{geo.ctx}_{theta:g}{tail}"
        if tname not in ctx.declared:
            pb.tensor(tname, t)
            ctx.declared.add(tname)
        names.append(tname)
    rb = pb.region(name, x0, y0, n, 1)
    pos = rb.alloc("pos", 4 * seqs)
    rb.piece("position_ids", pos, I32, (seqs, 1))
    rb.load(default_pos, pos, I32, (seqs, 1))
    bufs = [rb.alloc(f"t{k}", rows * h2 * 4) for k, rows in enumerate((B, B, H, H))]
    for _, rect in segs:
        for k, (tname, rows) in enumerate(zip(names, (B, B, H, H))):
            rb.load(tname, bufs[k], "f32", (rows, h2), 0, (0, 0, 1), "C", rect=rect)
    out = rb.alloc("out", seqs * 2 * h2 * 4)
    tmp = rb.alloc("tmp", h2 * 4)

    def one():
        rb.lw("r1", "r10" if seqs > 1 else "r15", pos)
        rb.li("r4", B)
        rb.div("r2", "r1", "r4")  # hi
        rb.mul("r3", "r2", "r4")
        rb.sub("r3", "r1", "r3")  # lo
        rb.muli("r3", "r3", h2 * 4)
        rb.muli("r2", "r2", h2 * 4)
        for d, k, reg in (("d1", 0, "r3"), ("d2", 1, "r3"), ("d3", 2, "r2"), ("d4", 3, "r2")):
            rb.dmem(d, "f32", bufs[k], h2)
            rb.daddr(d, reg, bufs[k])
        rb.dmem("d5", "f32", out, h2)
        _at(rb, "d5", out, seqs)
        rb.dmem("d6", "f32", out + 4 * h2, h2)
        _at(rb, "d6", out + 4 * h2, seqs)
        rb.dmem("d7", "f32", tmp, h2)
        rb.vmul("d5", "d3", "d1")  # cos_hi cos_lo
        rb.vmul("d7", "d4", "d2")  # sin_hi sin_lo
        rb.vsub("d5", "d5", "d7")
        rb.vmul("d6", "d4", "d1")  # sin_hi cos_lo
        rb.vmul("d7", "d3", "d2")  # cos_hi sin_lo
        rb.vadd("d6", "d6", "d7")
    seq_loop(rb, seqs, 2 * h2 * 4, one)
    rb.dmem("d1", "f32", out, 2 * h2 * seqs)
    rb.dfout("d2", "f32", color, 2 * h2 * seqs)
    rb.vmov("d2", "d1")
    rb.halt()


MASK_SOURCE_CODE = 64 * 8  # bytes: more than a mask source's code (about 40 instructions)


def mask_source_bytes(geo, seqs: int = 1) -> int:
    """SRAM of a mask source PE (mask_source): the positions, every sequence's [mask, one-hot,
    keep] row in fp32, and at most MASK_SOURCE_CODE of code."""
    return 4 * seqs + seqs * 3 * geo.S * 4 + MASK_SOURCE_CODE


def mask_source(ctx, pb, name: str, y0: int, geo, color: int, default_pos,
                seqs: int = 1) -> None:
    """Column 0 beside a band of grids: PE i sends row i's [mask, one-hot, keep] of this
    position (of each sequence's) east along its row (through every grid of the band)."""
    n, S = geo.R, geo.S
    rb = pb.region(name, 0, y0, 1, n)
    pos = rb.alloc("pos", 4 * seqs)
    rb.piece("position_ids", pos, I32, (seqs, 1))
    rb.load(default_pos, pos, I32, (seqs, 1))
    buf = rb.alloc("rows", seqs * 3 * S * 4)
    mask, onehot, keep = buf, buf + 4 * S, buf + 8 * S
    done = "have_slot"

    def one():
        rb.lw("r1", "r10" if seqs > 1 else "r15", pos)
        rb.li("r2", y0)
        rb.sub("r2", "GY", "r2")  # this row i
        rb.sub("r3", "r1", "r2")  # pos - i
        rb.fli("f1", NEG_INF)
        rb.fli("f2", 1.0)
        for addr, value in ((mask, "f1"), (onehot, "f15"), (keep, "f2")):
            rb.dmem("d1", "f32", addr, S)
            _at(rb, "d1", addr, seqs)
            rb.vfill("d1", value)
        rb.blt("r3", "r15", done)  # no position of this row is visible yet
        rb.li("r4", n)
        rb.div("r5", "r3", "r4")  # the newest visible slot
        rb.addi("r6", "r5", 1)
        rb.dmem("d1", "f32", mask, 1)
        _at(rb, "d1", mask, seqs)
        rb.dlen("d1", "r6")
        rb.vfill("d1", "f15")  # slots 0 .. r5 visible
        rb.mul("r7", "r5", "r4")
        rb.bne("r7", "r3", done)  # this position is not this row's
        rb.muli("r5", "r5", 4)
        if seqs > 1:
            rb.add("r5", "r5", "r8")
        rb.fsw("f2", "r5", onehot)
        rb.fsw("f15", "r5", keep)
        rb.label(done)
    seq_loop(rb, seqs, 3 * S * 4, one)
    rb.dmem("d1", "f32", buf, 3 * S * seqs)
    rb.dfout("d2", "f32", color, 3 * S * seqs)
    rb.vmov("d2", "d1")
    rb.halt()

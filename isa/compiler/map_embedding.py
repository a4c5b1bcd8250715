"""Mapping strategy `embedding`: the token (and GPT-2's position) table on a grid of R rows
beside the first layer, its rows split into m blocks along the columns.

PE (j, i) holds rows j*vb .. (j+1)*vb - 1 of the table, the hidden block i (K elements: layout
R, as the first layer reads it). Each PE reads the token id; the one PE of each row whose block
holds the token's entry sends its K elements east on the row's bus, a color every router of the
row forwards east (from the west and from its own PE), which delivers to every PE of the first
layer's row: one message of K wavelets a row, R rows at once (on a padded grid, d < R K, the
table's rows padded with zeros to R K). The position table (GPT-2) has
its own bus; the first layer adds the two.

Several sequences (seqs > 1): the region loops over s = 0 .. seqs-1 (r0 = s, r10 = 4 s) and
reads the s-th id. The row's sender changes with the token, so before sending a later
sequence's row every PE waits for one wavelet from the first layer on the `ready` color, which
the first layer sends once it has taken the earlier row: rows reach it in sequence order.
"""

from __future__ import annotations

from wse_emu.isa.compiler.decoder import divisors
from wse_emu.isa.compiler.map_gemv import Padded, load_block, padded
from wse_emu.isa.compiler.emit import I32
from wse_emu.isa.compiler.placement import WEIGHT_BYTES

BUDGET = 36 * 1024  # table bytes a PE (the rest: code, the index, scratch)


def columns(rows: int, K: int, wbytes: int, exact: bool) -> tuple[int, int]:
    """(m, vb): the fewest column blocks whose vb table rows of K elements fit BUDGET; with
    exact, m divides the table's rows (a tile map must lie inside its tensor)."""
    need = -(-rows * K * wbytes // BUDGET)
    if exact:
        fits = [m for m in divisors(rows) if m >= need]
        if not fits:
            return 0, 0
        m = fits[0]
        return m, rows // m
    vb = -(-rows // need)
    return -(-rows // vb), vb


def emit(ctx, pb, name: str, ref, index: str, x0: int, y0: int, m: int, vb: int, K: int,
         color: int, default_pos, seqs: int = 1, ready: int | None = None) -> None:
    """The table's region: (x0, y0), m columns x R rows."""
    n = ctx.geo.R
    wb = WEIGHT_BYTES[ctx.dtype]
    rb = pb.region(name, x0, y0, m, n)
    table = rb.alloc("table", vb * K * wb)
    idx = rb.alloc("index", 4 * seqs)
    rb.piece(index, idx, I32, (seqs, 1))
    if index == "position_ids":
        rb.load(default_pos, idx, I32, (seqs, 1))
    if not ctx.shape_only:  # C order: a table row's K elements contiguous
        ref = padded(ctx, ref, (None, "d"))
        tname = ref.name if isinstance(ref, Padded) else ctx.weights.tensor(ref)
        rb.load(tname, table, ctx.dtype, (vb, K), (0, 0, 1), (0, 1, 0), "C")
    end = "end"
    if seqs > 1:
        scratch = rb.alloc("ready", 4)
        rb.li("r0", 0)
        rb.label("sequence")
        rb.muli("r10", "r0", 4)
        rb.beq("r0", "r15", "first")  # a later row: wait until the first layer took the last
        rb.dmem("d1", "f32", scratch, 1)
        rb.dfin("d2", "f32", ready, 1)
        rb.vmov("d1", "d2")
        rb.label("first")
    rb.lw("r1", "r10" if seqs > 1 else "r15", idx)
    rb.li("r2", x0)
    rb.sub("r2", "GX", "r2")
    rb.muli("r2", "r2", vb)
    rb.sub("r1", "r1", "r2")  # the entry's row inside this PE's block
    rb.blt("r1", "r15", end)
    rb.li("r3", vb)
    rb.bge("r1", "r3", end)
    rb.muli("r1", "r1", K * wb)
    rb.dmem("d1", ctx.dtype, table, K)
    rb.daddr("d1", "r1", table)
    rb.dfout("d2", "f32", color, K)
    rb.vmov("d2", "d1")
    rb.label(end)
    if seqs > 1:
        rb.addi("r0", "r0", 1)
        rb.li("r1", seqs)
        rb.blt("r0", "r1", "sequence")
    rb.halt()


def cycles(cost, K: int) -> int:
    """From the run's start to the sending PE's last wavelet out (the travel into the first
    layer is the first layer's hand-off)."""
    return cost.scalar(13) + cost.m.issue_overhead + K


__all__ = ["columns", "emit", "cycles", "load_block"]

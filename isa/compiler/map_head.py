"""Mapping strategy `head`: the final norm and the LM head on a grid of R rows and m columns
beside the last layer.

The residual arrives in layout R (row i holds block i, replicated along the row), as in a
layer. The final norm is a layer's norm (an allreduce of one scalar along each column). PE
(j, i) holds the tile E[j*vb:(j+1)*vb, i*K:(i+1)*K] of the (vocab, hidden) matrix; its
partial logits are reduced along the column to the column's middle row, which holds logits
block j: the only place a whole vector leaves the wafer (the output symbol's pieces).
"""

from __future__ import annotations

import math

from wse_emu.isa.compiler.map_gemv import load_block, padded
from wse_emu.isa.compiler.placement import WEIGHT_BYTES

BUDGET = 36 * 1024


def columns(vocab: int, K: int, wbytes: int, exact: bool, at_least: int = 1,
            seqs: int = 1) -> tuple[int, int]:
    """(m, vb) with the fewest columns m >= at_least whose tile (vb x K) fits BUDGET (with
    seqs > 1 sequences, beside the seqs rows of vb logits the root row keeps); with exact, m
    divides the vocabulary."""
    from wse_emu.isa.compiler.decoder import divisors
    row = K * wbytes + (4 * seqs if seqs > 1 else 0)  # bytes a vocabulary entry takes a PE
    need = max(at_least, -(-vocab * row // BUDGET))
    if exact:
        fits = [m for m in divisors(vocab) if m >= need]
        if not fits:
            return 0, 0
        return fits[0], vocab // fits[0]
    vb = -(-vocab // need)
    return -(-vocab // vb), vb


def load(ctx, rb, ref, addr, vb: int, K: int, m: int) -> None:
    load_block(ctx, rb, padded(ctx, ref, (None, "d")), addr, vb, K, (0, 0, 1), (0, 1, 0), vb,
               (0, 0, m, ctx.geo.R))


def pieces(rb, name: str, addr, vocab: int, vb: int, m: int, row: int, seqs: int = 1) -> None:
    """The logits blocks at the root row: piece k of every column holds elements
    [j vb + k g, j vb + (k+1) g) with g = gcd(vb, vocab), so that a padded last block puts
    only its real elements in the symbol. Several sequences: row s of the (seqs, vocab)
    symbol from the block at addr + s vb (4-byte) elements."""
    g = vocab if vocab % vb == 0 else math.gcd(vb, vocab)
    for s in range(seqs):
        at = addr + 4 * s * vb
        if vocab % vb == 0:
            rb.piece(name, at, "f32", (1, vb), s, (0, 0, 1), rect=(0, row, m, 1))
            continue
        per = vb // g
        full = vocab // vb  # columns whose block is whole
        tail = (vocab - full * vb) // g  # tiles of g in the last, partial block
        for k in range(per):
            cols = full + (1 if k < tail else 0)
            rb.piece(name, at + 4 * k * g, "f32", (1, g), s, (k, 0, per),
                     rect=(0, row, cols, 1))


def wbytes_of(dtype: str) -> int:
    return WEIGHT_BYTES[dtype]

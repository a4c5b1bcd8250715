"""Codegen of attention stages: one PE per KV head, its K and V caches resident in SRAM.

PE g holds K transposed ((head_dim, max_context), a position a column, so that the scores of
every cached position are one `mv`) and V ((max_context, head_dim), a position a row, so that
the weighted sum over the whole cache is one `mv` with unfilled scores zeroed), for the query
heads g*group .. (g+1)*group - 1 that read it (grouped-query attention); both caches are stored
in the weight dtype (k and v rounded once, on append, as a 16-bit model's KV cache is; the
arithmetic stays fp32, and a 16-bit cache runs at the mixed FMAC width). A run first takes
every position's q, k, v out of the input stream, then appends k and v at their positions
(RoPE first), then attends, then sends the outputs in position order.
"""

from __future__ import annotations

import numpy as np

from wse_emu.isa.compiler.emit import (I32, ZF, ZR, at, drop, mem, positions, recv, rope_code, send,
                               softmax_code)
from wse_emu.isa.compiler.lower import Stage
from wse_emu.isa.compiler.placement import WEIGHT_BYTES, Placed


class AttentionCodegen:
    """Mixed into codegen.Codegen: needs its pb, region(), flow(), own, labels and T."""

    rope_declared: set

    def attn(self, s: Stage, p: Placed) -> None:
        a = s.attrs
        nkv, hd, ctx, T = a["n_kv_heads"], a["head_dim"], a["max_context"], self.T
        group = a["n_heads"] // nkv
        rope = a["rope_q"] or a["rope_k"]
        (fin,) = [self.flow(f) for f in s.in_flows]
        out_color = self.flow(s.out_flows[0]).color
        north = self.own[s.id]["north"]
        tables = self.rope_tensors(rope, ctx, hd) if rope else None
        qn = group * hd  # query (and output) elements a position
        kvd = self.dtype  # the caches are stored in the weight dtype (fp32 arithmetic)
        kvb = WEIGHT_BYTES[kvd]
        for g in range(nkv):
            rb = self.region(s, f".kv{g}", p.rect.x, p.rect.y + g, 1, 1)
            q = rb.alloc("q", qn * T * 4)  # (T, group * hd): a position a row
            k = rb.alloc("k", hd * T * 4)
            v = rb.alloc("v", hd * T * 4)
            kt = rb.alloc("kt", hd * ctx * kvb)  # K^T cache: (hd, ctx), a position a column
            vc = rb.alloc("vc", ctx * hd * kvb)  # V cache (ctx, hd), a position a row
            sc = rb.alloc("scores", ctx * 4)
            o = rb.alloc("o", qn * T * 4)
            tmp = rb.alloc("tmp", hd * 4)
            dump = rb.alloc("dump", 4)
            pos = rb.alloc("pos", T * 4)
            rb.piece("position_ids", pos, I32, (T, 1))
            rb.load(self.default_positions(), pos, I32, (T, 1))
            if rope:
                cos = rb.alloc("cos", ctx * hd * 2)  # (ctx, hd / 2): a position a row
                sin = rb.alloc("sin", ctx * hd * 2)
                rb.load(tables[0], cos, "f32", (ctx, hd // 2), order="C")
                rb.load(tables[1], sin, "f32", (ctx, hd // 2), order="C")
            parts = sorted([(a["q_off"] + g * qn, qn, q), (a["k_off"] + g * hd, hd, k),
                            (a["v_off"] + g * hd, hd, v)], key=lambda t: t[0])

            def receive(_o, _p):
                done = 0
                for off, n, buf in parts:  # this head's q, k, v out of the position's stream
                    if off > done:
                        rb.li("r1", off - done)
                        drop(rb, dump, fin.color, "r1", self.labels)
                    mem(rb, "d1", buf, n)
                    if T > 1:
                        rb.muli("r2", "r10", n * 4)
                        rb.daddr("d1", "r2", buf)
                    recv(rb, "d1", fin.color, n)
                    done = off + n
                if a["in_len"] > done:
                    rb.li("r1", a["in_len"] - done)
                    drop(rb, dump, fin.color, "r1", self.labels)
            positions(rb, self.labels, T, [4], receive)

            def append(p4, _):
                rb.lw("r1", p4 or ZR, pos)  # this position
                if T > 1:
                    rb.muli("r6", "r10", hd * 4)  # this position's k and v
                    rb.muli("r5", "r10", qn * 4)  # and q
                if rope:
                    rb.muli("r2", "r1", hd * 2)
                    rb.dmem("d4", "f32", cos, hd // 2)
                    rb.daddr("d4", "r2", cos)
                    rb.dmem("d5", "f32", sin, hd // 2)
                    rb.daddr("d5", "r2", sin)
                    heads = ([(q + j * hd * 4, "r5") for j in range(group)] if a["rope_q"]
                             else []) + ([(k, "r6")] if a["rope_k"] else [])
                    for x, reg in heads:
                        self.rope(rb, x, reg if T > 1 else None, tmp, hd)
                rb.dmem("d1", kvd, kt, hd)
                rb.dstride("d1", ctx)
                rb.muli("r2", "r1", kvb)
                rb.daddr("d1", "r2", kt)
                mem(rb, "d2", k, hd)
                at(rb, "d2", "r6" if T > 1 else None, k)
                rb.vmov("d1", "d2")
                rb.muli("r2", "r1", hd * kvb)
                rb.dmem("d1", kvd, vc, hd)
                rb.daddr("d1", "r2", vc)
                mem(rb, "d2", v, hd)
                at(rb, "d2", "r6" if T > 1 else None, v)
                rb.vmov("d1", "d2")
            positions(rb, self.labels, T, [4], append)

            def attend(p4, qo):
                # causal: this position and the ones before; bidirectional: every position
                # of the run (the last one's index + 1)
                if a["causal"]:
                    rb.lw("r1", p4 or ZR, pos)
                else:
                    rb.lw("r1", ZR, pos + 4 * (T - 1))
                rb.addi("r3", "r1", 1)
                rb.fli("f5", float(a["scale"]))
                rb.fli("f6", 1.0)
                for j in range(group):
                    mem(rb, "d6", sc, ctx)
                    rb.vfill("d6", ZF)
                    rb.dmem("d7", "f32", sc, 1)
                    rb.dlen("d7", "r3")
                    rb.dmem("d8", kvd, kt, 1)
                    rb.d2d("d8", hd, ctx)
                    rb.dlen("d8", "r3")  # (n, hd) rows of K, column stride ctx
                    mem(rb, "d9", q + j * hd * 4, hd)
                    at(rb, "d9", qo, q + j * hd * 4)
                    rb.mv("d7", "d8", "d9")
                    softmax_code(rb, "d7")
                    rb.dmem("d8", kvd, vc, hd)
                    rb.d2d("d8", ctx, hd)  # V^T: (hd, ctx) column-major; unfilled slots weigh 0
                    mem(rb, "d9", o + j * hd * 4, hd)
                    at(rb, "d9", qo, o + j * hd * 4)
                    rb.mv("d9", "d8", "d6")
            positions(rb, self.labels, T, [4, qn * 4], attend)

            def send(off, _):
                mem(rb, "d2", o, qn)
                at(rb, "d2", off, o)
                self.chain_piece(rb, g, nkv, qn, "d2", north, out_color)
            positions(rb, self.labels, T, [qn * 4], send)
            rb.halt()

    def rope_tensors(self, rope, ctx: int, hd: int) -> tuple[str, str]:
        """Inline tensors of the cos and sin tables, declared once per shape."""
        names = (f"rope_cos_{ctx}x{hd}_{rope[1]:g}", f"rope_sin_{ctx}x{hd}_{rope[1]:g}")
        if names[0] not in self.rope_declared:
            for name, table in zip(names, _rope_tables(rope, ctx, hd)):
                self.pb.tensor(name, table)
            self.rope_declared.add(names[0])
        return names

    def rope(self, rb, x, reg, tmp, hd) -> None:
        rope_code(rb, x, reg, tmp, hd)

    def chain_piece(self, rb, p: int, P: int, n: int, src, north, out_color) -> None:
        """Static version of gather() for a PE whose row p is known at compile time."""
        below = (P - 1 - p) * n
        if p == 0:
            send(rb, src, out_color, n)
            if below:
                rb.dfin("d15", "f32", north[1], below)
                rb.dfout("d14", "f32", out_color, below)
                rb.vmov("d14", "d15")
            return
        send(rb, src, north[p % 2], n)
        if below:
            rb.dfin("d15", "f32", north[(p + 1) % 2], below)
            rb.dfout("d14", "f32", north[p % 2], below)
            rb.vmov("d14", "d15")


def _rope_tables(rope, ctx: int, hd: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of every position at the hd/2 frequencies, (ctx, hd / 2) fp32 as
    transformers computes them (its tables repeat them for both halves)."""
    _, theta = rope
    inv_freq = np.float32(1.0) / (np.float32(theta) ** (np.arange(0, hd, 2, dtype=np.float32)
                                                        / np.float32(hd)))
    angles = np.arange(ctx, dtype=np.float32)[:, None] * inv_freq[None, :]  # (ctx, hd/2)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

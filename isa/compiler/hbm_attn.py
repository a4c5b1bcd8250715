"""Attention on the HBM target (mixed into isa.compiler.hbm.HbmCompiler).

One KV head a core (heads g = X, X + C, ...) with the query heads that read it. The K and V
caches live in HBM, a position a row ((max_context, head_dim) per KV head, in the weight dtype
like the mesh's): the new k and v are rounded to it and appended with `dmast`, and the cached positions come back CH rows a DMA. Scores are one
`mm` a chunk ((1 x hd) q times the chunk's (hd x CH) K^T, which is K row-major), the softmax
runs over positions 0 .. pos as on the mesh, and the weighted sum is one `mva` a chunk (V^T,
also K row-major) with the unfilled rows of the last chunk and their scores zero.
"""

from __future__ import annotations

from wse_emu.isa.compiler.emit import ZF, ZR, rope_code, softmax_code
from wse_emu.isa.compiler.hbm_emit import Ha, smem
from wse_emu.isa.compiler.lower import CompileError, Stage
from wse_emu.isa.compiler.placement import WEIGHT_BYTES


class HbmAttention:
    """Needs the HbmCompiler's rb, labels, arena, C, layout, io and hbm()."""

    def attn_group(self, s: Stage) -> int:
        """Query heads a work item: all of a KV head's (its K and V read once) unless their
        scores over the whole context do not fit a core's SRAM beside the cache chunks (Llama-
        3-70B: 8 heads of 8192 scores); then the largest divisor that fits, each item of a KV
        head reading its K and V again."""
        a = s.attrs
        group = a["n_heads"] // a["n_kv_heads"]
        error = None
        for sg in sorted((d for d in range(1, group + 1) if group % d == 0), reverse=True):
            trial = type(self.arena)(self.arena.base, self.arena.limit, s.name, self.machine)
            try:
                self._attn_buffers(trial, s, sg)
                return sg
            except CompileError as e:
                error = error or e
        raise error

    def _attn_buffers(self, A, s: Stage, sg: int) -> dict:
        a = s.attrs
        hd, ctx = a["head_dim"], a["max_context"]
        kvb = WEIGHT_BYTES[self.dtype]
        CH = self.layout.kv[s.id][2]
        ctxp = -(-ctx // CH) * CH
        qn = sg * hd
        b = dict(q=A.take(qn * 4), k=A.take(hd * 4), v=A.take(hd * 4), cos=A.take(hd * 2),
                 sin=A.take(hd * 2), tmp=A.take(hd * 4))
        b["sc"] = [A.take(ctxp * 4) for _ in range(sg)]
        b.update(o=A.take(qn * 4), kc=A.take(CH * hd * kvb), vc=A.take(CH * hd * kvb),
                 kq=A.take(hd * kvb), vq=A.take(hd * kvb))
        return b

    def emit_attn(self, s: Stage) -> None:
        """Work item i = X, X + C, ...: KV head i // (group / sg) with sg of its query heads
        (attn_group; item i's heads are i * sg ...): RoPE, append k and v to the HBM caches
        (every item of a KV head writes the same row), scores over the cached positions chunk
        by chunk (mm), softmax, weighted sum (mva), the heads' outputs stored into the output
        flow."""
        rb, L, A, C = self.rb, self.labels, self.arena, self.C
        a = s.attrs
        nkv, hd, ctx = a["n_kv_heads"], a["head_dim"], a["max_context"]
        group = self.attn_group(s)  # query heads of this core's item (sg)
        subs = a["n_heads"] // nkv // group  # items a KV head
        items = nkv * subs
        qn = group * hd
        kvd = self.dtype  # caches in the weight dtype, as on the mesh (codegen_attn.py)
        kvb = WEIGHT_BYTES[kvd]
        kha, vha, CH = self.layout.kv[s.id]
        rope = a["rope_q"] or a["rope_k"]
        b = self._attn_buffers(A, s, group)
        q, k, v, cos, sin, tmp = (b[x] for x in ("q", "k", "v", "cos", "sin", "tmp"))
        sc, o, kc, vc = b["sc"], b["o"], b["kc"], b["vc"]
        kq, vq = b["kq"], b["vq"]  # the new k and v in the cache dtype
        (fin,) = s.in_flows
        (fout,) = s.out_flows
        done, head = L("attn_done"), L("kv_head")
        rb.li("r0", items)
        rb.bge("X", "r0", done)
        rb.addi("r13", "X", 0)  # r13: this core's work item
        rb.label(head)
        if subs > 1:  # r9: its KV head
            rb.li("r9", subs)
            rb.div("r9", "r13", "r9")
        kvh = "r9" if subs > 1 else "r13"
        self.hbm("r0", s, Ha(self.layout.flows[fin]))
        for off, per_head, n, buf, idx in ((a["q_off"], qn, qn, q, "r13"),
                                           (a["k_off"], hd, hd, k, kvh),
                                           (a["v_off"], hd, hd, v, kvh)):
            rb.muli("r1", idx, per_head * 4)
            rb.add("r1", "r1", "r0")
            rb.addi("r1", "r1", off * 4)
            smem(rb, "d1", buf, n)
            rb.dmald("d1", "r1", 0)
        rb.lw("r2", ZR, self.io + 4)  # r2: the position
        if rope:
            for addr, buf in zip(self.layout.rope[s.id], (cos, sin)):
                self.hbm_abs("r0", addr)
                rb.muli("r1", "r2", hd * 2)  # (ctx, hd / 2) tables: this position's row
                rb.add("r0", "r0", "r1")
                smem(rb, "d1", buf, hd // 2)
                rb.dmald("d1", "r0", 0)
        rb.dmawait(0)
        if rope:
            smem(rb, "d4", cos, hd // 2)
            smem(rb, "d5", sin, hd // 2)
            heads = ([q + j * hd * 4 for j in range(group)] if a["rope_q"] else []) + \
                ([k] if a["rope_k"] else [])
            for x in heads:
                rope_code(rb, x, None, tmp, hd, mem=smem)
        rb.muli("r1", kvh, ctx * hd * kvb)  # this head's caches: r4 = K, r5 = V
        self.hbm("r4", s, kha)
        rb.add("r4", "r4", "r1")
        self.hbm("r5", s, vha)
        rb.add("r5", "r5", "r1")
        rb.muli("r1", "r2", hd * kvb)
        for base, buf, cast in (("r4", k, kq), ("r5", v, vq)):
            rb.add("r0", base, "r1")
            smem(rb, "d1", cast, hd, kvd)
            smem(rb, "d2", buf, hd)
            rb.vmov("d1", "d2")  # rounded to the cache dtype once, as a 16-bit model's cache
            rb.dmast("d1", "r0", 2)
        rb.addi("r3", "r2", 1)  # r3: positions attended (0 .. position)

        def chunk_rows(row, rows):  # rows = min(CH, r3 - row): the chunk starting at row
            full = L("full_chunk")
            rb.sub(rows, "r3", row)
            rb.li("r8", CH)
            rb.blt(rows, "r8", full)
            rb.addi(rows, "r8", 0)
            rb.label(full)

        def load_chunk(base, buf, tag, row, rows):
            chunk_rows(row, rows)
            rb.muli("r1", row, hd * kvb)
            rb.add("r0", base, "r1")
            smem(rb, "d1", buf, 0, kvd)
            rb.muli("r8", rows, hd)
            rb.dlen("d1", "r8")
            rb.dmald("d1", "r0", tag)

        def stream(base, body):
            """The chunks at rows r6 = 0, CH, ... < r3 through kc and vc in turn (tags 1 and
            3): the next chunk's DMA in flight while body(buf, tag) uses this one."""
            rb.li("r6", 0)
            load_chunk(base, kc, 1, "r6", "r7")
            top, end = L("chunks"), L("chunks_done")
            rb.label(top)
            for i, (buf, tag, other, otag) in enumerate(((kc, 1, vc, 3), (vc, 3, kc, 1))):
                last = L("last_chunk")
                rb.addi("r2", "r6", CH)  # r2: the next chunk's first row (the position is
                rb.bge("r2", "r3", last)  # no longer needed)
                load_chunk(base, other, otag, "r2", "r9")
                rb.label(last)
                body(buf, tag)
                rb.addi("r6", "r6", CH)
                if i == 0:
                    rb.bge("r6", "r3", end)
                else:
                    rb.blt("r6", "r3", top)
            rb.label(end)

        def scores(buf, tag):  # (1 x hd) q times (hd x CH) K^T for each query head
            rb.dmawait(tag)
            rb.muli("r1", "r6", 4)
            for j in range(group):
                smem(rb, "d6", sc[j], 1)
                rb.daddr("d6", "r1", sc[j])
                rb.d2d("d6", CH, 1)
                smem(rb, "d7", q + j * hd * 4, 1)
                rb.d2d("d7", hd, 1)
                smem(rb, "d8", buf, hd, kvd)
                rb.d2d("d8", CH, hd)
                rb.mm("d6", "d7", "d8")

        def weigh(buf, tag):  # o += V_chunk^T p_chunk, the chunk's unfilled rows zero
            chunk_rows("r6", "r7")
            full = L("v_full")
            rb.li("r8", CH)
            rb.sub("r8", "r8", "r7")
            rb.beq("r8", ZR, full)
            rb.muli("r8", "r8", hd)
            smem(rb, "d1", buf, 1, kvd)
            rb.muli("r1", "r7", hd * kvb)
            rb.daddr("d1", "r1", buf)
            rb.dlen("d1", "r8")
            rb.vfill("d1", ZF)
            rb.label(full)
            rb.dmawait(tag)
            rb.muli("r1", "r6", 4)
            for j in range(group):
                smem(rb, "d8", buf, hd, kvd)
                rb.d2d("d8", CH, hd)  # V^T: (hd, CH) column-major
                smem(rb, "d6", sc[j], CH)
                rb.daddr("d6", "r1", sc[j])
                smem(rb, "d9", o + j * hd * 4, hd)
                rb.mva("d9", "d8", "d6")
        # pass 1: the scores of every cached position
        stream("r4", scores)
        # softmax over positions 0 .. r3-1; the rest of the last chunk weighs 0
        rb.fli("f5", float(a["scale"]))
        rb.fli("f6", 1.0)
        rb.sub("r7", "r6", "r3")
        rb.muli("r1", "r3", 4)
        for j in range(group):
            smem(rb, "d7", sc[j], 1)
            rb.dlen("d7", "r3")
            softmax_code(rb, "d7")
            tail = L("no_tail")
            rb.beq("r7", ZR, tail)
            smem(rb, "d7", sc[j], 1)
            rb.daddr("d7", "r1", sc[j])
            rb.dlen("d7", "r7")
            rb.vfill("d7", ZF)
            rb.label(tail)
        # pass 2: the weighted sum of the values
        smem(rb, "d9", o, qn)
        rb.vfill("d9", ZF)
        stream("r5", weigh)
        self.hbm("r0", s, Ha(self.layout.flows[fout]))
        rb.muli("r1", "r13", qn * 4)
        rb.add("r0", "r0", "r1")
        smem(rb, "d1", o, qn)
        rb.dmast("d1", "r0", 2)
        rb.dmawait(2)
        rb.addi("r13", "r13", C)
        rb.li("r0", items)
        rb.blt("r13", "r0", head)
        rb.label(done)

"""Attention on the HBM target (mixed into isa.compiler.hbm.HbmCompiler).

Work items of a KV head and sg of its query heads (all of them unless their scores do not fit
SRAM), each item's positions split over P cores (flash-decoding: the SMs that would otherwise
wait at the barrier). The K and V caches live in HBM, a position a row ((max_context, head_dim)
per KV head, in the weight dtype like the mesh's): the new k and v are rounded to it and
appended with `dmast` (by every core of the KV head: the same bytes), and a core's positions
come back CH rows a DMA, the next chunk in flight while this one is used. Scores are one `mm` a
chunk ((1 x hd) q times the chunk's (hd x CH) K^T, which is K row-major), the softmax runs over
the core's positions, and the weighted sum is one `mva` a chunk (V^T, also K row-major) with
the unfilled rows of the last chunk and their scores zero. With P > 1 each core stores its
part's max m, sum l and normalised output o to HBM; after a barrier one core a query head
combines them: o = sum_p exp(m_p - M) l_p o_p / sum_p exp(m_p - M) l_p.

Several sequences (a batched step): the stage runs once a sequence in a loop (hbm.py's
seq_loop), each with its own K and V caches (B of them a stage, one after the other), its own
position and its own block of parts.
"""

from __future__ import annotations

from wse_emu.isa.compiler.emit import ZF, ZR, rope_code, softmax_code
from wse_emu.isa.compiler.hbm_emit import Ha, _Arena, smem
from wse_emu.isa.compiler.lower import CompileError, Stage
from wse_emu.isa.compiler.placement import WEIGHT_BYTES

EMPTY_MAX = -1e30  # the max of a part with no positions: its weight exp(m - M) is 0


class HbmAttention:
    """Needs the HbmCompiler's rb, labels, arena, C, layout, io and hbm()."""

    def attn_plan(self, s: Stage) -> tuple[int, int]:
        """(sg, P): query heads a work item and cores an item's positions are split over.
        sg: all of a KV head's (its K and V read once) unless their scores over the whole
        context do not fit a core's SRAM beside the cache chunks (Llama-3-70B: 8 heads of 8192
        scores); then the largest divisor that fits, each item of a KV head reading its K and
        V again. P: the cores left to each item (C // items), fewer if the combine's buffer
        does not fit."""
        if s.id in self.attn_plans:
            return self.attn_plans[s.id]
        a = s.attrs
        group = a["n_heads"] // a["n_kv_heads"]

        def fits(sg, P):
            trial = _Arena(self.arena0, self.machine.sram_bytes, s.name, self.machine)
            try:
                self._attn_buffers(trial, s, sg, P)
                return True
            except CompileError:
                return False
        fit = [d for d in range(group, 0, -1) if group % d == 0 and fits(d, 1)]
        if not fit:
            self._attn_buffers(_Arena(self.arena0, self.machine.sram_bytes, s.name,
                                      self.machine), s, 1, 1)  # raises, saying how much
        sg = fit[0]
        P = max(1, self.C // (a["n_kv_heads"] * (group // sg)))
        while P > 1 and not fits(sg, P):
            P -= 1
        self.attn_plans[s.id] = (sg, P)
        return sg, P

    def attn_scratch_bytes(self, s: Stage) -> int:
        """HBM for the parts' (m, l, o) of every query head (0 when P = 1)."""
        sg, P = self.attn_plan(s)
        return 0 if P == 1 else s.attrs["n_heads"] * P * (s.attrs["head_dim"] + 2) * 4

    def attn_seq(self, s: Stage, ha: Ha) -> Ha:
        """The sequence being emitted's K (or V) cache: the B caches of a stage follow each
        other, (n_kv_heads, max_context, head_dim) each. A prefill program's one cache: the
        loop's positions are appended to it in order, so a position's attention (over 0 ..
        itself) reads the earlier ones of the same run; a core appends every position of the
        KV head it works on, so what it reads back it wrote itself."""
        a = s.attrs
        one = a["n_kv_heads"] * a["max_context"] * a["head_dim"] * WEIGHT_BYTES[self.dtype]
        return Ha(ha.off, ha.layer, one if self.seq_rt and not self.one_cache else 0)

    def scratch_at(self, reg: str) -> None:
        """reg = the HBM address of the looping sequence's parts' (m, l, o) (a block a
        sequence, so that the next sequence's parts never overwrite one a core is still
        combining)."""
        self.hbm_abs(reg, self.layout.scratch, self.scratch_one if self.seq_rt else 0)

    def _attn_buffers(self, A, s: Stage, sg: int, P: int = 1) -> dict:
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
        if P > 1:
            b.update(ml=A.take(2 * sg * 4), comb=A.take(P * (hd + 2) * 4))
        return b

    def emit_attn(self, s: Stage) -> None:
        """Unit u = X, X + C, ... < items * P: part u % P of item u // P, which is KV head
        item // (group / sg) with query heads item * sg ... (attn_plan): RoPE, append k and v
        to the HBM caches, scores over the part's positions chunk by chunk (mm), softmax,
        weighted sum (mva); the heads' outputs into the output flow (P = 1), or the parts'
        (m, l, o) into HBM and, after a barrier, one core a head combines them."""
        rb, L, A, C = self.rb, self.labels, self.arena, self.C
        a = s.attrs
        nkv, hd, ctx = a["n_kv_heads"], a["head_dim"], a["max_context"]
        group, P = self.attn_plan(s)  # query heads of an item (sg), cores an item
        subs = a["n_heads"] // nkv // group  # items a KV head
        items = nkv * subs
        qn = group * hd
        blk = P * (hd + 2)  # floats of one head's parts: m[P], l[P], o[P][hd]
        kvd = self.dtype  # caches in the weight dtype, as on the mesh (codegen_attn.py)
        kvb = WEIGHT_BYTES[kvd]
        kha, vha, CH = self.layout.kv[s.id]
        kha, vha = self.attn_seq(s, kha), self.attn_seq(s, vha)
        rope = a["rope_q"] or a["rope_k"]
        b = self._attn_buffers(A, s, group, P)
        q, k, v, cos, sin, tmp = (b[x] for x in ("q", "k", "v", "cos", "sin", "tmp"))
        sc, o, kc, vc = b["sc"], b["o"], b["kc"], b["vc"]
        kq, vq = b["kq"], b["vq"]  # the new k and v in the cache dtype
        (fin,) = s.in_flows
        (fout,) = s.out_flows
        done, head = L("attn_done"), L("kv_head")
        rb.li("r0", items * P)
        rb.bge("X", "r0", done)
        rb.addi("r13", "X", 0)  # r13: this core's unit
        rb.label(head)
        item = "r13"
        if P > 1:  # r9: its item
            rb.li("r9", P)
            rb.div("r9", "r13", "r9")
            item = "r9"
        kvh = item
        if subs > 1:  # r8: its KV head
            rb.li("r8", subs)
            rb.div("r8", item, "r8")
            kvh = "r8"
        self.hbm("r0", s, self.flow(fin))
        for off, per_head, n, buf, idx in ((a["q_off"], qn, qn, q, item),
                                           (a["k_off"], hd, hd, k, kvh),
                                           (a["v_off"], hd, hd, v, kvh)):
            rb.muli("r1", idx, per_head * 4)
            rb.add("r1", "r1", "r0")
            rb.addi("r1", "r1", off * 4)
            smem(rb, "d1", buf, n)
            rb.dmald("d1", "r1", 0)
        self.load_io("r2", "position_ids")  # r2: the position
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
        empty, store = L("empty_part"), L("store_part")
        if P > 1:  # this part's positions: r9 = lo .. r3 = hi, R = ceil(r3 / P) to chunks
            rb.addi("r7", "r3", P - 1)
            rb.li("r8", P)
            rb.div("r7", "r7", "r8")
            rb.addi("r7", "r7", CH - 1)
            rb.li("r8", CH)
            rb.div("r7", "r7", "r8")
            rb.muli("r7", "r7", CH)
            rb.li("r8", P)
            rb.rem("r9", "r13", "r8")
            rb.mul("r9", "r9", "r7")
            rb.bge("r9", "r3", empty)
            rb.add("r7", "r9", "r7")
            keep = L("hi")
            rb.bge("r7", "r3", keep)
            rb.addi("r3", "r7", 0)
            rb.label(keep)
        else:
            rb.li("r9", 0)

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
            """The chunks at rows r6 = lo, lo + CH, ... < r3 through kc and vc in turn (tags 1
            and 3): the next chunk's DMA in flight while body(buf, tag) uses this one."""
            rb.addi("r6", "r9", 0)
            load_chunk(base, kc, 1, "r6", "r7")
            top, end = L("chunks"), L("chunks_done")
            rb.label(top)
            for i, (buf, tag, other, otag) in enumerate(((kc, 1, vc, 3), (vc, 3, kc, 1))):
                last = L("last_chunk")
                rb.addi("r2", "r6", CH)  # r2: the next chunk's first row (the position is
                rb.bge("r2", "r3", last)  # no longer needed)
                load_chunk(base, other, otag, "r2", "r10")
                rb.label(last)
                body(buf, tag)
                rb.addi("r6", "r6", CH)
                if i == 0:
                    rb.bge("r6", "r3", end)
                else:
                    rb.blt("r6", "r3", top)
            rb.label(end)

        def score_at():  # r1 = byte offset of row r6's score
            rb.sub("r1", "r6", "r9")
            rb.muli("r1", "r1", 4)

        def scores(buf, tag):  # (1 x hd) q times (hd x CH) K^T for each query head
            rb.dmawait(tag)
            score_at()
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
            score_at()
            for j in range(group):
                smem(rb, "d8", buf, hd, kvd)
                rb.d2d("d8", CH, hd)  # V^T: (hd, CH) column-major
                smem(rb, "d6", sc[j], CH)
                rb.daddr("d6", "r1", sc[j])
                smem(rb, "d9", o + j * hd * 4, hd)
                rb.mva("d9", "d8", "d6")
        # pass 1: the scores of the part's positions
        stream("r4", scores)
        # softmax over positions lo .. r3-1; the rest of the last chunk weighs 0
        rb.fli("f5", float(a["scale"]))
        rb.fli("f6", 1.0)
        rb.sub("r7", "r6", "r3")
        rb.sub("r2", "r3", "r9")  # r2: positions of the part
        rb.muli("r1", "r2", 4)
        for j in range(group):
            smem(rb, "d7", sc[j], 1)
            rb.dlen("d7", "r2")
            softmax_code(rb, "d7")  # f1: the max, f3: the sum
            if P > 1:
                for i, f in enumerate(("f1", "f3")):
                    smem(rb, "d7", b["ml"] + (2 * j + i) * 4, 1)
                    rb.vfill("d7", f)
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
        if P == 1:
            self.hbm("r0", s, self.flow(fout))
            rb.muli("r1", "r13", qn * 4)
            rb.add("r0", "r0", "r1")
            smem(rb, "d1", o, qn)
            rb.dmast("d1", "r0", 2)
        else:
            rb.jmp(store)
            rb.label(empty)  # no positions: m = EMPTY_MAX, l = 0, o = 0
            rb.fli("f1", EMPTY_MAX)
            for j in range(group):
                for i, f in enumerate(("f1", ZF)):
                    smem(rb, "d7", b["ml"] + (2 * j + i) * 4, 1)
                    rb.vfill("d7", f)
            smem(rb, "d9", o, qn)
            rb.vfill("d9", ZF)
            rb.label(store)  # head c = item * sg + j: m at part, l at P + part, o at 2P + ..
            self.scratch_at("r0")
            rb.li("r8", P)
            rb.div("r1", "r13", "r8")
            rb.muli("r1", "r1", group * blk * 4)
            rb.add("r0", "r0", "r1")
            rb.rem("r2", "r13", "r8")  # r2: the part
            rb.muli("r5", "r2", hd * 4)
            rb.muli("r2", "r2", 4)
            for j in range(group):
                for off, buf, n, part in ((0, b["ml"] + 8 * j, 1, "r2"),
                                          (P, b["ml"] + 8 * j + 4, 1, "r2"),
                                          (2 * P, o + j * hd * 4, hd, "r5")):
                    rb.add("r4", "r0", part)
                    rb.addi("r4", "r4", (j * blk + off) * 4)
                    smem(rb, "d1", buf, n)
                    rb.dmast("d1", "r4", 2)
        rb.dmawait(2)
        rb.addi("r13", "r13", C)
        rb.li("r0", items * P)
        rb.blt("r13", "r0", head)
        rb.label(done)
        if P > 1:
            self.attn_combine(s, b, a["n_heads"], hd, P)

    def attn_combine(self, s: Stage, b: dict, heads: int, hd: int, P: int) -> None:
        """After every part is in HBM (a barrier): head c = X, X + C, ... loads its parts'
        m, l, o in one DMA and stores sum_p w_p o_p, w = exp(m - max m) * l / sum."""
        rb, L, C = self.rb, self.labels, self.C
        self.barrier("full")
        blk = P * (hd + 2)
        comb, o = b["comb"], b["o"]
        done, top = L("combine_done"), L("combine")
        rb.li("r0", heads)
        rb.bge("X", "r0", done)
        rb.addi("r13", "X", 0)
        rb.fli("f6", 1.0)
        rb.label(top)
        self.scratch_at("r0")
        rb.muli("r1", "r13", blk * 4)
        rb.add("r0", "r0", "r1")
        smem(rb, "d1", comb, blk)
        rb.dmald("d1", "r0", 0)
        rb.dmawait(0)
        smem(rb, "d1", comb, P)  # m -> exp(m - max m) * l / sum
        smem(rb, "d2", comb + P * 4, P)
        rb.rmax("f1", "d1")
        rb.fsub("f2", ZF, "f1")
        rb.vadds("d1", "d1", "f2")
        rb.vexp("d1", "d1")
        rb.vmul("d1", "d1", "d2")
        rb.rsum("f3", "d1")
        rb.fdiv("f4", "f6", "f3")
        rb.vmuls("d1", "d1", "f4")
        smem(rb, "d9", o, hd)
        rb.vfill("d9", ZF)
        smem(rb, "d8", comb + 2 * P * 4, hd)
        rb.d2d("d8", P, hd)  # the parts' o, (P, hd) row-major: (hd, P) column-major
        rb.mva("d9", "d8", "d1")
        self.hbm("r0", s, self.flow(s.out_flows[0]))
        rb.muli("r1", "r13", hd * 4)
        rb.add("r0", "r0", "r1")
        rb.dmast("d9", "r0", 2)
        rb.dmawait(2)
        rb.addi("r13", "r13", C)
        rb.li("r0", heads)
        rb.blt("r13", "r0", top)
        rb.label(done)

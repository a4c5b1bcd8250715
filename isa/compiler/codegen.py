"""Codegen: the per-PE code, buffers and weight loads of every stage, through isa.builder.

Code is SPMD wherever PEs of a stage differ only by position: lengths come from `dlen` of
computed registers, and the two alternating chain colors from a branch on the parity of the
position (isa/compiler/emit.py has the register conventions). Attention stages are in
codegen_attn.py.
"""

from __future__ import annotations

import math

import numpy as np

from wse_emu.isa.builder import ProgramBuilder, RegionBuilder
from wse_emu.isa.compiler.codegen_attn import AttentionCodegen
from wse_emu.isa.compiler.emit import (I32, PR, QR, ZF, ZR, Labels, at, drop, forward, mem, norm_code,
                               parity, positions, recv, send, stage_position)
from wse_emu.isa.compiler.lower import CompileError, Flow, Plan, Stage
from wse_emu.isa.compiler.placement import WEIGHT_BYTES, Placed, table_rows, vector_layout


class Codegen(AttentionCodegen):
    """Emits every stage of a placed, routed plan into a ProgramBuilder."""

    def __init__(self, pb: ProgramBuilder, plan: Plan, placed: list[Placed], own: dict,
                 weights, dtype: str, shape_only: bool):
        self.pb, self.plan, self.placed, self.own = pb, plan, placed, own
        self.weights = weights  # pack.Weights: program tensor names for WeightRefs
        self.dtype, self.shape_only = dtype, shape_only
        self.labels = Labels()
        self.T = plan.T
        self._positions_tensor = False
        self.rope_declared = set()

    def default_positions(self) -> str:
        """An inline tensor 0..T-1 that position_ids buffers start with, so that a host that
        writes only input_ids (`wse-emu run --input input_ids=...`) runs a fresh sequence."""
        if not self._positions_tensor:
            self.pb.tensor("default_position_ids", np.arange(self.T, dtype=np.int32))
            self._positions_tensor = True
        return "default_position_ids"

    def flow(self, fid: int) -> Flow:
        return self.plan.flows[fid]

    def region(self, s: Stage, suffix: str, x, y, w, h) -> RegionBuilder:
        return self.pb.region(f"s{s.id}.{s.name}{suffix}", x, y, w, h)

    def load(self, rb, ref, addr, tile, row, col, order, dtype=None, rect=None):
        if self.shape_only:
            return
        name = self.weights.tensor(ref)
        rb.load(name, addr, dtype or self.dtype, tile, row=row, col=col, order=order, rect=rect)

    def run(self) -> None:
        for s, p in zip(self.plan.stages, self.placed):
            getattr(self, s.kind)(s, p)

    # -- gemv -----------------------------------------------------------------------------------

    def gemv(self, s: Stage, p: Placed) -> None:
        r = p.rect
        classes = [(0, 1)] if r.w == 1 else [(0, 1), (1, r.w - 2), (r.w - 1, 1)]
        for c0, cw in classes:
            if cw > 0:
                self.gemv_columns(s, p, c0, cw)

    def gemv_columns(self, s: Stage, p: Placed, c0: int, cw: int) -> None:
        r, tr, tc, Q, P = p.rect, p.tr, p.tc, p.Q, p.P
        last = c0 + cw == Q
        rb = self.region(s, f"[{c0}:{c0 + cw}]", r.x + c0, r.y, cw, P)
        wdt = self.dtype
        wbuf = rb.alloc("w", tr * tc * WEIGHT_BYTES[wdt])
        T = self.T
        xbuf = rb.alloc("x", tc * T * 4)  # (tc, T) column-major: a position a column
        ybuf = rb.alloc("y", tr * T * 4)  # (tr, T)
        dump = rb.alloc("dump", 4)
        ubuf = rb.alloc("up", tc * T * 4) if s.prologue == "swiglu" else None
        row0 = 0
        for m in s.matrices:
            pm = -(-m.out // tr)
            r0 = (m.ref.rows[0] if m.ref.rows else 0) // tr
            rect = (0, row0, cw, pm)
            if m.ref.transpose:  # stored (in, out): the (tc x tr) C-order tile is W's F-order tile
                self.load(rb, m.ref, wbuf, (tc, tr), (c0, 0, 1), (r0, 1, 0), "C", rect=rect)
            else:
                self.load(rb, m.ref, wbuf, (tr, tc), (r0, 1, 0), (c0, 0, 1), "F", rect=rect)
            row0 += pm
        stage_position(rb, p)
        rb.dmem("d0", wdt, wbuf, tr)
        rb.d2d("d0", tc, tr)  # (tr, tc) column-major
        (fin,) = [self.flow(f) for f in s.in_flows]
        n = s.in_len
        rb.muli("r1", QR, tc)  # first element of this column's slice
        rb.li("r2", n - tc)
        rb.sub("r2", "r2", "r1")  # elements after the slice
        rb.li("r3", n - tc)  # SwiGLU: from the gate slice to the up slice

        def receive(off, _):
            mem(rb, "d1", xbuf, tc)
            at(rb, "d1", off, xbuf)
            drop(rb, dump, fin.color, "r1", self.labels)
            recv(rb, "d1", fin.color, tc)
            if s.prologue == "swiglu":  # the stream is gate (n) then up (n) a position
                drop(rb, dump, fin.color, "r3", self.labels)
                mem(rb, "d3", ubuf, tc)
                at(rb, "d3", off, ubuf)
                recv(rb, "d3", fin.color, tc)
            drop(rb, dump, fin.color, "r2", self.labels)
        positions(rb, self.labels, T, [tc * 4], receive)
        mem(rb, "d1", xbuf, tc * T)
        if s.prologue == "swiglu":
            mem(rb, "d3", ubuf, tc * T)
            rb.vsilu("d1", "d1")
            rb.vmul("d1", "d1", "d3")
        if T == 1:
            mem(rb, "d2", ybuf, tr)
            rb.mv("d2", "d0", "d1")
        else:
            mem(rb, "d1", xbuf, tc)
            rb.d2d("d1", T, tc)  # X (tc, T)
            mem(rb, "d2", ybuf, tr)
            rb.d2d("d2", T, tr)  # Y (tr, T)
            rb.mm("d2", "d0", "d1")
            mem(rb, "d2", ybuf, tr * T)
        block = tr * T  # partial sums stream a whole (tr, T) block
        east = self.own[s.id]["east"]
        if Q > 1:
            if c0 == 0:
                send(rb, "d2", east[0], block)
            elif not last:
                def link(cin, cout):
                    def emit():
                        rb.dfin("d15", "f32", cin, block)
                        rb.dfout("d14", "f32", cout, block)
                        rb.vadd("d14", "d15", "d2")
                    return emit
                parity(rb, self.labels, QR, link(east[1], east[0]), link(east[0], east[1]))
            else:
                rb.dfin("d15", "f32", east[(Q - 2) % 2], block)
                rb.vadd("d2", "d15", "d2")
        if not last:
            rb.halt()
            return
        self.gemv_epilogue(s, p, rb, ybuf)

    def gemv_epilogue(self, s: Stage, p: Placed, rb: RegionBuilder, ybuf) -> None:
        tr, P, T = p.tr, p.P, self.T
        if any(m.bias for m in s.matrices):
            bbuf = rb.alloc("bias", tr * 4)
            row0 = 0
            for m in s.matrices:
                pm = -(-m.out // tr)
                if m.bias_ref is not None:
                    r0 = (m.bias_ref.rows[0] if m.bias_ref.rows else 0) // tr
                    self.load(rb, m.bias_ref, bbuf, (tr, 1), (r0, 1, 0), 0, "F", dtype="f32",
                              rect=(0, row0, 1, pm))
                row0 += pm
            mem(rb, "d3", bbuf, tr)
            if T > 1:
                rb.d2d("d3", T, 0)  # the same bias for every position
            rb.vadd("d2", "d2", "d3")
        act = {"gelu_tanh": rb.vgelu, "gelu_erf": rb.vgelue, "silu": rb.vsilu}.get(s.activation)
        if act:
            act("d2", "d2")
        for name, _ in s.outputs:
            self.output_pieces(rb, name, ybuf, s.out_len, tr, P)
        if s.out_flows:
            north, color = self.own[s.id]["north"], self.flow(s.out_flows[0]).color

            def send(off, _):
                mem(rb, "d2", ybuf, tr)
                at(rb, "d2", off, ybuf)
                self.gather(rb, p.rect.h, tr, "d2", north, color)
            positions(rb, self.labels, T, [tr * 4], send)
        rb.halt()

    def output_pieces(self, rb, name, ybuf, out: int, tr: int, P: int) -> None:
        """Row p of the last column holds y[p*tr:(p+1)*tr]. A piece must lie inside its symbol,
        so when the last tile is padded the rows are described in tiles of g = gcd(tr, out)
        elements: piece k holds tile k of every row that has it."""
        if out % tr == 0:  # (tr, T) column-major is a (T, tr) row-major tile of (T, out)
            rb.piece(name, ybuf, "f32", (self.T, tr), row=0, col=(0, 1, 0), order="C")
            return
        if self.T > 1:
            raise CompileError(f"output '{name}': a padded last tile needs one position a run")
        g = math.gcd(tr, out)
        full = (out - (P - 1) * tr) // g  # tiles present in the last row
        for k in range(tr // g):
            rows = P if k < full else P - 1
            rb.piece(name, ybuf + k * g * 4, "f32", (1, g), row=0, col=(k, tr // g, 0),
                     rect=(0, 0, 1, rows))

    def gather(self, rb, P: int, n: int, src: str, north, out_color: int) -> None:
        """Results of rows 0..P-1 (n elements each) leave row 0 in row order: row p sends its
        own piece north, then streams what rows below it send."""
        done = self.labels("gathered")
        not_top = self.labels("not_top")
        rb.bne(PR, ZR, not_top)
        send(rb, src, out_color, n)
        if P > 1:
            rb.li("r4", (P - 1) * n)
            forward(rb, north[1], out_color, "r4", self.labels)
        rb.jmp(done)
        rb.label(not_top)
        if P > 1:
            rb.li("r4", (P - 1) * n)
            rb.muli("r5", PR, n)
            rb.sub("r4", "r4", "r5")  # pieces of the rows below this one

            def link(cin, cout):
                def emit():
                    send(rb, src, cout, n)
                    forward(rb, cin, cout, "r4", self.labels)
                return emit
            parity(rb, self.labels, PR, link(north[1], north[0]), link(north[0], north[1]))
        rb.label(done)

    # -- vector ---------------------------------------------------------------------------------

    def vector(self, s: Stage, p: Placed) -> None:
        T = self.T
        rb = self.region(s, "", p.rect.x, p.rect.y, 1, 1)
        alias, fused = vector_layout(s)  # in-place results, one flow read from the fabric
        fused_buf = s.flow_buffer[fused] if fused is not None else None
        bufs = {name: rb.alloc(name, n * T * 4) for name, n in s.buffers.items()  # (T, n)
                if name not in alias and name != fused_buf}
        for name, home in alias.items():
            bufs[name] = bufs[home]
        pdtype = self.dtype  # norm weights in the model's weight dtype (fp32 arithmetic)
        params = {}
        for op in s.ops:
            for wname in op[3].get("params", ()):
                if wname not in params:
                    n = s.attrs["hidden"]
                    params[wname] = rb.alloc(wname.replace(".", "_"),
                                             n * WEIGHT_BYTES[pdtype])
                    ref = self.plan.graph.weights[wname]
                    self.load(rb, ref, params[wname], (n, 1), 0, 0, "F", dtype=pdtype)
        for fid in s.in_flows:
            if fid == fused:
                continue
            f = self.flow(fid)
            mem(rb, "d1", bufs[s.flow_buffer[fid]], f.length * T)
            recv(rb, "d1", f.color, f.length * T)
        for kind, dst, srcs, attrs in s.ops:
            n = s.buffers[dst]
            if kind == "add":  # every position at once
                mem(rb, "d1", bufs[dst], n * T)
                operands = ["d2", "d3"]
                for d, b in zip(operands, srcs):
                    if b == fused_buf:  # this flow straight from the fabric
                        rb.dfin(d, "f32", self.flow(fused).color, n * T)
                    else:
                        mem(rb, d, bufs[b], n * T)
                rb.vadd("d1", "d2", "d3")
                continue
            positions(rb, self.labels, T, [n * 4],
                       lambda off, _, kind=kind, dst=dst, srcs=srcs, attrs=attrs:
                       self.norm(rb, kind, bufs[dst], bufs[srcs[0]], n, off, attrs, params))
        for fid in s.out_flows:
            f = self.flow(fid)
            mem(rb, "d1", bufs[s.send_buffer[fid]], f.length * T)
            send(rb, "d1", f.color, f.length * T)
        for name, buf in s.outputs:
            rb.piece(name, bufs[buf], "f32", (T, s.buffers[buf]))
        rb.halt()

    def norm(self, rb, kind, dst, src, n: int, off, attrs, params) -> None:
        """LayerNorm / RMSNorm of one position (at offset register off)."""
        norm_code(rb, kind, dst, src, n, off, attrs, params, self.dtype)

    # -- embed ----------------------------------------------------------------------------------

    def embed(self, s: Stage, p: Placed) -> None:
        tc, P, Q, T = p.tc, p.P, p.Q, self.T
        north, east = self.own[s.id]["north"], self.own[s.id]["east"]
        out_color = self.flow(s.out_flows[0]).color
        # tables stack bottom-up in graph order, so the chain adds them in that order
        row0 = P
        for t, (wname, ref, index) in enumerate(s.tables):
            R = p.table_rows[t]
            pt = table_rows(ref) // R
            row0 -= pt
            first = (ref.rows[0] if ref.rows else 0) // R  # a row slice of the stored table
            rb = self.region(s, f".{wname}", p.rect.x, p.rect.y + row0, Q, pt)
            table = rb.alloc("table", R * tc * WEIGHT_BYTES[self.dtype])
            acc = rb.alloc("acc", tc * 4)
            idx = rb.alloc("index", T * 4)
            if index is not None:
                rb.piece(index, idx, I32, (T, 1))
                if index == "position_ids":
                    rb.load(self.default_positions(), idx, I32, (T, 1))
            self.load(rb, ref, table, (R, tc), (first, 1, 0), (0, 0, 1), "C")
            stage_position(rb, p)
            positions(rb, self.labels, T, [4],
                       lambda off, _, rb=rb, R=R, row0=row0, index=index, table=table, acc=acc,
                       idx=idx: self.embedstage_position(rb, P, Q, R, tc, row0, index, table, acc,
                                                    idx, off, north, east, out_color))
            rb.halt()

    def embedstage_position(self, rb, P, Q, R, tc, row0, index, table, acc, idx, off, north, east,
                       out_color) -> None:
        """One position: the column's stream runs bottom-up through every row; the row holding
        the token's entry adds it on the fly (a streaming vadd: fabric in + SRAM -> fabric out)
        and the others forward it, so a column of P PEs costs about tc + P hops, not P * tc.
        Row p sends on north[p % 2] and receives on north[(p + 1) % 2]. The bottom row starts
        the stream (its entry, or zeros); the top row adds into acc, which embed_top joins
        across the columns."""
        located, join, end = self.labels("located"), self.labels("join"), self.labels("end")
        # r2 = the token's row inside this PE's block; r12 = 1 if this PE holds it
        if index is None:
            rb.li("r2", 0)
        else:
            rb.lw("r2", off or ZR, idx)
        rb.addi("r3", PR, -row0)
        rb.muli("r3", "r3", R)
        rb.sub("r2", "r2", "r3")
        rb.li("r12", 0)
        rb.blt("r2", ZR, located)
        rb.li("r3", R)
        rb.bge("r2", "r3", located)
        rb.li("r12", 1)
        rb.muli("r2", "r2", tc * WEIGHT_BYTES[self.dtype])
        rb.dmem("d2", self.dtype, table, tc)
        rb.daddr("d2", "r2", table)
        rb.label(located)
        mem(rb, "d1", acc, tc)

        def add_or_pass(dst, after):
            """dst = the stream from below (+ this PE's entry when it holds the token's)."""
            add = self.labels("add")
            rb.bne("r12", ZR, add)
            rb.vmov(dst, "d15")
            rb.jmp(after)
            rb.label(add)
            rb.vadd(dst, "d15", "d2")
            rb.jmp(after)

        if P > 1:
            top, bottom = self.labels("top"), self.labels("bottom")
            rb.li("r1", P - 1)
            rb.beq(PR, "r1", bottom)
            rb.beq(PR, ZR, top)

            def middle(cin, cout):
                def emit():
                    rb.dfin("d15", "f32", cin, tc)
                    rb.dfout("d14", "f32", cout, tc)
                    add_or_pass("d14", end)
                return emit
            parity(rb, self.labels, PR, middle(north[1], north[0]), middle(north[0], north[1]))
            rb.jmp(end)
            rb.label(top)  # row 0: into acc
            rb.dfin("d15", "f32", north[1], tc)
            add_or_pass("d1", join)
            rb.label(bottom)  # row P - 1 starts the stream
            zeros = self.labels("zeros")
            rb.beq("r12", ZR, zeros)
            send(rb, "d2", north[(P - 1) % 2], tc)
            rb.jmp(end)
            rb.label(zeros)
            rb.vfill("d1", ZF)
            send(rb, "d1", north[(P - 1) % 2], tc)
            rb.jmp(end)
        else:  # one row: acc = its entry or zeros
            rb.vfill("d1", ZF)
            rb.beq("r12", ZR, join)
            rb.vadd("d1", "d1", "d2")
        rb.label(join)
        self.embed_top(rb, Q, tc, east, out_color)
        rb.label(end)

    def embed_top(self, rb, Q, tc, east, out_color) -> None:
        """Top row: column blocks join east in order; the last column sends the vector."""
        if Q == 1:
            send(rb, "d1", out_color, tc)
            return
        rb.muli("r4", QR, tc)  # elements of the columns west of this one
        exit_, done = self.labels("exit"), self.labels("joined")
        rb.li("r1", Q - 1)
        rb.beq(QR, "r1", exit_)

        def link(cin, cout):
            def emit():
                forward(rb, cin, cout, "r4", self.labels)
                send(rb, "d1", cout, tc)
            return emit
        parity(rb, self.labels, QR, link(east[1], east[0]), link(east[0], east[1]))
        rb.jmp(done)
        rb.label(exit_)
        forward(rb, east[(Q - 2) % 2], out_color, "r4", self.labels)
        send(rb, "d1", out_color, tc)
        rb.label(done)

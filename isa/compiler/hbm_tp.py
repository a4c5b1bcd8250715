"""Tensor parallelism on a GPU node (an HBM machine of several chips, e.g. h100x8).

A node of G GPUs is a system of G chips stacked along y (isa/machine.py): GPU g is fabric row
g, its SMs the row's cores, and it owns HBM bytes [g * hbm_bytes, (g + 1) * hbm_bytes). Every
GPU runs the same kernel (isa/compiler/hbm.py) on its own slice of every weight, with every HBM
address offset by its base (r14 = GY * hbm_bytes); the plan it runs is the model's plan cut to
one GPU's share (`shard`):

- column-parallel gemv stages (the matrices that feed attention: q, k, v; those that feed
  another gemv: gate and up, GPT-2's c_fc) keep rows [g * out / G, (g + 1) * out / G) of each
  matrix: GPU g's query heads g * H / G ..., its KV heads (GQA: KV heads g * KV / G ...; when a
  node has more GPUs than KV heads, each KV head is replicated on the G / KV GPUs whose query
  heads read it), its slice of the FFN;
- attention runs on the GPU's heads only, its KV cache in the GPU's own HBM;
- row-parallel gemv stages (o and down, GPT-2's c_proj) keep columns [g * in / G, ...) and
  produce a partial sum of the whole output; the bias is added on GPU 0 only;
- the LM head keeps vocabulary rows [g * Vg, (g + 1) * Vg), Vg = ceil(V / G);
- embeddings, norms and residual adds are replicated (every GPU holds the residual stream).

Two allreduces a layer (after the o and the down projections), in one of two forms, the
cheaper by its cost formula (`allreduce_form`):

- chain: every SM x of every GPU takes slice x (n = ceil(hidden / SMs) floats) of the partial
  output and the SMs of column x (one a GPU) run a chain allreduce along the column toward the
  middle GPU and a broadcast back (isa/collectives.py): about 2 * G / 2 link latencies in a row.
  The only form on GPUs joined point to point (each link between neighbours its own pipe).
- one-shot (GPUs through a switch, link_switch): the SMs pair up, sender 2i and receiver
  2i + 1, slice i (n = ceil(hidden / (SMs // 2)) floats) a pair. Every GPU's sender multicasts
  its slice to the receivers of pair i on every other GPU at once (color first + GY; through
  the switch one link latency, the G - 1 copies over the GPU's port), and every receiver adds
  the G slices in the same order, GPU 0's first (its own from HBM in its place), so every GPU
  holds bit-identical sums. Receivers never send, so no send waits on a blocked sender.

The LM head's logit slices are gathered the same way (each GPU's slice in its own part of a
G-slice block, summed), and GPU 0 stores them into the logits the host reads.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from wse_emu.isa.collectives import Costs, allreduce, cost, default_root
from wse_emu.isa.compiler.emit import ZF, ZR
from wse_emu.isa.compiler.hbm_emit import Ha, _Recorder, li64, smem
from wse_emu.isa.compiler.lower import CompileError, Matrix, Plan, Stage

GB = "r14"  # this GPU's HBM base on a node


@dataclass
class Split:
    """How one gemv stage is cut: kind 'col' | 'row' | 'vocab'; per matrix (in the sharded
    stage's order) the original matrix, and per GPU its logical rows (a, b) of the original
    matrix, its columns (a, b) or None (all), and whether its bias is applied."""

    kind: str
    parts: list = field(default_factory=list)  # [(Matrix, [(rows, cols, bias) per GPU])]


@dataclass
class TensorParallel:
    G: int
    plan: Plan  # one GPU's share of the model's plan
    splits: dict  # stage id -> Split
    vocab: dict  # stage id -> (V, Vg, output symbol)


def _kind_of(plan: Plan, s: Stage) -> str:
    consumers = [plan.stages[plan.flows[f].dst] for f in s.out_flows]
    producers = [plan.stages[plan.flows[f].src] for f in s.in_flows]
    if s.outputs:
        if s.out_flows or len(s.matrices) != 1:
            raise CompileError(f"stage '{s.name}': a tensor-parallel LM head must be one "
                               f"matrix whose output only the host reads")
        return "vocab"
    if consumers and all(c.kind in ("attn", "gemv") for c in consumers):
        return "col"
    if producers and all(p.kind in ("attn", "gemv") for p in producers):
        return "row"
    raise CompileError(f"stage '{s.name}': no tensor-parallel split for a gemv between "
                       f"{[p.kind for p in producers]} and {[c.kind for c in consumers]}")


def shard(plan: Plan, G: int) -> TensorParallel:
    """One GPU's share of `plan` on a node of G GPUs (module docstring); CompileError in one
    line when the model's heads or matrices do not split over G."""
    stages = [copy.copy(s) for s in plan.stages]
    flows = [copy.copy(f) for f in plan.flows]
    splits: dict[int, Split] = {}
    vocab: dict = {}
    for s in stages:
        s.in_flows, s.out_flows = list(s.in_flows), list(s.out_flows)
        s.attrs = dict(s.attrs)
    for s in stages:
        if s.kind != "attn":
            continue
        a = s.attrs
        nh, nkv, hd = a["n_heads"], a["n_kv_heads"], a["head_dim"]
        if nh % G or (nkv % G and G % nkv):
            raise CompileError(f"stage '{s.name}': {nh} attention heads ({nkv} KV heads) do "
                               f"not split over {G} GPUs")
        nhl, kvl = nh // G, max(1, nkv // G)
        (fin,) = s.in_flows
        src = stages[flows[fin].src]
        if src.kind != "gemv" or len(src.out_flows) != 1:
            raise CompileError(f"stage '{s.name}': tensor parallelism needs q, k and v from "
                               f"one gemv stage")
        segs = sorted([(a["q_off"], nh * hd, "q"), (a["k_off"], nkv * hd, "k"),
                       (a["v_off"], nkv * hd, "v")])
        if sum(n for _, n, _ in segs) != src.out_len:
            raise CompileError(f"stage '{src.name}': outputs other than q, k and v cannot be "
                               f"split over GPUs")
        starts, row0 = [], 0
        for m in src.matrices:
            starts.append(row0)
            row0 += m.out
        parts, off = [], {}
        for seg_off, n, what in segs:
            i = max(j for j, st in enumerate(starts) if st <= seg_off)
            m = src.matrices[i]
            if seg_off + n > starts[i] + m.out:
                raise CompileError(f"stage '{src.name}': {what} spans two matrices")
            r0 = seg_off - starts[i]
            per = []
            for g in range(G):
                if what == "q":
                    a0, cnt = g * nhl * hd, nhl * hd
                else:
                    a0, cnt = (g * nkv // G) * hd, kvl * hd
                per.append(((r0 + a0, r0 + a0 + cnt), None, True))
            off[what] = sum(p[0].out for p in parts)
            parts.append((Matrix(m.weight, m.ref, per[0][0][1] - per[0][0][0], m.bias,
                                 m.bias_ref), per))
        splits[src.id] = Split("col", parts)
        src.matrices = [p[0] for p in parts]
        flows[fin].length = src.out_len
        a.update(n_heads=nhl, n_kv_heads=kvl, q_off=off["q"], k_off=off["k"],
                 v_off=off["v"], in_len=src.out_len)
        for f in s.out_flows:
            flows[f].length = nhl * hd
    for s in stages:
        if s.kind != "gemv" or s.id in splits:
            continue
        kind = _kind_of(plan, s)
        parts = []
        if kind == "col":
            for m in s.matrices:
                if m.out % G:
                    raise CompileError(f"stage '{s.name}': {m.weight} has {m.out} rows, not a "
                                       f"multiple of {G} GPUs")
                k = m.out // G
                parts.append((Matrix(m.weight, m.ref, k, m.bias, m.bias_ref),
                              [((g * k, (g + 1) * k), None, True) for g in range(G)]))
        elif kind == "row":
            if s.in_len % G:
                raise CompileError(f"stage '{s.name}': {s.in_len} inputs are not a multiple "
                                   f"of {G} GPUs")
            k = s.in_len // G
            for m in s.matrices:
                parts.append((m, [((0, m.out), (g * k, (g + 1) * k), g == 0)
                                  for g in range(G)]))
            s.in_len = k
        else:
            (m,) = s.matrices
            V = m.out
            vg = -(-V // G)
            parts.append((Matrix(m.weight, m.ref, vg, m.bias, m.bias_ref),
                          [((g * vg, min(V, (g + 1) * vg)), None, True) for g in range(G)]))
            ((name, _),) = s.outputs
            vocab[s.id] = (V, vg, name)
            s.outputs = []
        splits[s.id] = Split(kind, parts)
        s.matrices = [p[0] for p in parts]
        for f in s.out_flows:
            flows[f].length = s.out_len
    for s in stages:  # column-parallel outputs shrink the inputs of their gemv consumers
        if s.kind == "gemv" and splits[s.id].kind == "row":
            want = sum(flows[f].length for f in s.in_flows)
            if s.prologue == "swiglu":
                want //= 2
            if want != s.in_len:
                raise CompileError(f"stage '{s.name}': its input does not split over {G} "
                                   f"GPUs as its matrices do")
    sharded = Plan(plan.graph, stages, flows, plan.symbols, plan.T)
    return TensorParallel(G, sharded, splits, vocab)


def hbm_need(plan: Plan, wb: int) -> int:
    """HBM bytes one GPU needs for `plan` (weights, KV caches, tables, norms, flows, RoPE
    tables), ignoring alignment: the estimate behind the 'how many GPUs' refusal."""
    total = 0
    ropes = set()
    for s in plan.stages:
        if s.kind == "gemv":
            total += s.out_len * s.in_len * wb
            total += 4 * s.out_len if any(m.bias for m in s.matrices) else 0
        elif s.kind == "attn":
            a = s.attrs
            total += 2 * a["n_kv_heads"] * a["max_context"] * a["head_dim"] * wb
            if a["rope_q"] or a["rope_k"]:
                ropes.add((a["max_context"], a["head_dim"]))
        elif s.kind == "embed":
            total += sum(ref.shape[0] * s.attrs["hidden"] * wb for _, ref, _ in s.tables)
        elif s.kind == "vector":
            total += len({w for op in s.ops for w in op[3].get("params", ())}) \
                * s.attrs["hidden"] * wb
    total += sum(ctx * hd * 4 for ctx, hd in ropes)
    total += sum(f.length * 4 for f in plan.flows)
    total += sum(math.prod(shape) * 4 for name, shape in plan.symbols.items()
                 if name not in ("input_ids", "position_ids"))
    return total


def gpus_needed(plan: Plan, wb: int, hbm_bytes: int, most: int = 64) -> int | None:
    """The fewest GPUs of hbm_bytes each whose share of `plan` fits (None: not up to most)."""
    for G in range(1, most + 1):
        try:
            share = plan if G == 1 else shard(plan, G).plan
        except CompileError:
            continue
        if hbm_need(share, wb) <= hbm_bytes:
            return G
    return None


def oneshot_cycles(machine, n: int) -> int:
    """The one-shot allreduce of n floats a pair over the node's G GPUs through a switch, in
    cycles: a sender's multicast (an op: issue overhead, n wavelets at one a cycle), one link
    latency, the G - 1 copies of every pair's n floats through the GPU's port (all pairs at
    once: (G - 1) * pairs * n * 4 bytes over its bandwidth), the ramps and the hops down the
    column, and the receiver's G ops (issue overhead each, n elements at one wavelet a cycle)."""
    G, pairs = machine.chips, machine.width // 2
    c = Costs.of(machine)
    port = math.ceil((G - 1) * pairs * n * 4 / machine.link_bytes_per_cycle)
    return (c.issue + n + machine.link_latency + port + 2 * c.ramp + 2 + G * c.hop
            + G * (c.issue + n))


def allreduce_form(machine, length: int, blocks: int = 1) -> tuple[str, int, int]:
    """(form, n, cycles): the cheaper allreduce of `blocks` length-long vectors side by side
    (the B sequences' hidden vectors; the G vocabulary slices of the logit gather) on
    `machine`: 'oneshot' (oneshot_cycles, n = blocks * ceil(length / pairs)) when the GPUs
    meet through a switch, a GPU has two SMs or more and the barrier leaves G colors, else
    'chain' (allreduce_cycles, n = blocks * ceil(length / SMs))."""
    C, G = machine.width, machine.chips
    chain_n = blocks * -(-length // C)
    best = ("chain", chain_n, allreduce_cycles(machine, chain_n))
    rounds = max(0, math.ceil(math.log2(C))) if C > 1 else 0
    if machine.link_switch and C >= 2 and rounds + 1 + G <= machine.colors:
        n = blocks * -(-length // (C // 2))
        if n <= 65535:
            t = oneshot_cycles(machine, n)
            if t < best[2]:
                best = ("oneshot", n, t)
    return best


def allreduce_cycles(machine, n: int) -> int:
    """The chain allreduce of n floats a column over the node's G GPUs (toward the middle GPU,
    then a broadcast back), in cycles: the wafer formula of isa/collectives.py for a line of G,
    plus, for each of the 2 * max(root, G - 1 - root) link crossings on the way, the link's
    latency, plus the bytes all columns push through one link (width * n * 4) over its
    bandwidth twice (once reducing, once broadcasting)."""
    G = machine.chips
    root = default_root(G)
    far = max(root, G - 1 - root)
    base = cost("allreduce", "chain", G, n, Costs.of(machine), root=root)
    per_link = machine.width * n * 4 / machine.link_bytes_per_cycle
    return base + 2 * far * machine.link_latency + 2 * math.ceil(per_link)


class HbmTensorParallel:
    """The allreduces of the node kernel (mixed into isa.compiler.hbm.HbmCompiler; needs its
    rb, labels, arena, C, G, B, tp, layout, hbm())."""

    def tp_choose(self) -> None:
        """The allreduce form (allreduce_form) of the layers' allreduce of B hidden vectors
        (tp_form) and of the logit gather's block of G vocabulary slices (tp_form_gather),
        each by its cost formula, and the colors of the forms used (the chain's 3, then the
        one-shot's G)."""
        hidden = max((s.out_len for s in self.plan.stages
                      if s.id in self.tp.splits and self.tp.splits[s.id].kind == "row"),
                     default=1)
        self.tp_form = allreduce_form(self.machine, hidden, self.B)[0]
        vg = max((v for _, v, _ in self.tp.vocab.values()), default=1)
        self.tp_form_gather = allreduce_form(self.machine, vg, self.G)[0]
        forms = (self.tp_form, self.tp_form_gather)
        first = self.rounds + 1
        self.tp_chain_colors = tuple(range(first, first + 3)) if "chain" in forms else ()
        first += len(self.tp_chain_colors)
        self.tp_os_colors = tuple(range(first, first + self.G)) if "oneshot" in forms else ()

    def tp_colors(self) -> tuple[int, ...]:
        return self.tp_chain_colors + self.tp_os_colors

    def tp_units(self, gather: bool = False) -> int:
        """Slices a vector is cut into: an SM's for the chain, an SM pair's for the one-shot."""
        form = self.tp_form_gather if gather else self.tp_form
        return self.C // 2 if form == "oneshot" else self.C

    def tp_check_colors(self) -> None:
        self.tp_choose()
        need = self.rounds + 1 + len(self.tp_colors())
        if need > self.machine.colors:
            raise CompileError(f"machine '{self.machine.name}': the grid barrier and the "
                               f"allreduce need {need} colors, the machine has "
                               f"{self.machine.colors}")

    def tp_collective(self, n: int):
        return allreduce((0, 0, self.C, self.G), "column", n, self.tp_chain_colors, form="chain",
                         root=default_root(self.G), costs=Costs.of(self.machine))

    def tp_routes(self, pb) -> None:
        if self.tp_chain_colors:
            self.tp_collective(1).add_routes(pb)
        G = self.G
        for j, color in enumerate(self.tp_os_colors):  # GPU j's senders, to every receiver
            for i in range(self.C // 2):
                x = 2 * i
                pb.route(x, j, 1, 1, color, "RAMP", "E")
                pb.route(x + 1, j, 1, 1, color, "W", "|".join(
                    d for d, ok in (("N", j > 0), ("S", j < G - 1)) if ok))
                if j > 1:
                    pb.route(x + 1, 1, 1, j - 1, color, "S", "N|RAMP")
                if j > 0:
                    pb.route(x + 1, 0, 1, 1, color, "S", "RAMP")
                if j < G - 2:
                    pb.route(x + 1, j + 1, 1, G - 2 - j, color, "N", "S|RAMP")
                if j < G - 1:
                    pb.route(x + 1, G - 1, 1, 1, color, "N", "RAMP")

    def tp_gpu_base(self) -> None:
        """r14 = this GPU's first HBM byte (GY * hbm_bytes)."""
        li64(self.rb, "r0", self.machine.hbm_bytes)
        self.rb.mul(GB, "GY", "r0")

    def _collective(self, n: int, buf: int, done: str, form: str) -> int:
        """Allreduce the n floats at `buf` of every SM taking part; the SRAM address of the
        sum (on an SM that holds one: the chain's every SM, the one-shot's receivers; a
        one-shot sender jumps to `done`)."""
        out = buf if form == "chain" else buf + 4 * n
        if isinstance(self.rb, _Recorder):  # comparing two layers' code: the same n, buffer
            self.rb.calls.append(("allreduce", (n, buf, done, form), ()))
            return out
        if form == "chain":
            self.tp_collective(n).emit(self.rb, buf, buf, dregs=("d9", "d10", "d11", "d12"),
                                       rregs=("r8", "r9"), label=self.labels("ar"))
            return out
        rb, L, colors = self.rb, self.labels, self.tp_os_colors
        recv = L("ar_recv")
        rb.andi("r8", "X", 1)
        rb.bne("r8", ZR, recv)
        rb.dmem("d9", "f32", buf, n)  # a sender: its slice to the receivers of its pair
        for j, color in enumerate(colors):
            other = L("ar_not")
            rb.li("r8", j)
            rb.bne("GY", "r8", other)
            rb.dfout("d10", "f32", color, n)
            rb.vmov("d10", "d9")
            rb.jmp(done)
            rb.label(other)
        rb.jmp(done)
        rb.label(recv)  # a receiver: the G slices in GPU order, its own in its place
        rb.dmem("d9", "f32", buf, n)
        rb.dmem("d11", "f32", out, n)
        for j, color in enumerate(colors):
            other, nxt = L("ar_in"), L("ar_next")
            rb.li("r8", j)
            rb.bne("GY", "r8", other)
            if j == 0:
                rb.vmov("d11", "d9")
            else:
                rb.vadd("d11", "d11", "d9")
            rb.jmp(nxt)
            rb.label(other)
            rb.dfin("d10", "f32", color, n)
            if j == 0:
                rb.vmov("d11", "d10")
            else:
                rb.vadd("d11", "d11", "d10")
            rb.label(nxt)
        return out

    def _tp_index(self, reg: str, done: str, form: str) -> None:
        """reg = the slice this SM handles (X for the chain, its pair X // 2 for the one-shot);
        an SM left out of the pairs (odd SMs a GPU: the last) jumps to `done`."""
        rb = self.rb
        if form == "chain":
            rb.addi(reg, "X", 0)
            return
        if self.C % 2:
            rb.li(reg, self.C - 1)
            rb.bge("X", reg, done)
        rb.shri(reg, "X", 1)

    def emit_allreduce(self, s: Stage) -> None:
        """Sum the partial outputs of row-parallel stage s over the GPUs, in place in each
        GPU's flow buffers: the SM of slice i loads it (of every sequence's row, side by side:
        one allreduce for the B sequences, its link latencies paid once), the SMs of slice i
        on all GPUs allreduce it, the SMs holding the sum store it."""
        rb, n, B = self.rb, self.tp_slice(s.out_len), self.B
        buf = self.tp_buf
        done = self.labels("ar_done")
        self._tp_index("r1", done, self.tp_form)
        rb.muli("r1", "r1", n * 4)
        for self.seq in range(B):
            self.hbm("r0", s, self.flow(s.out_flows[0]))
            rb.add("r0", "r0", "r1")
            smem(rb, "d1", buf + self.seq * n * 4, n)
            rb.dmald("d1", "r0", 0)
        rb.dmawait(0)
        out = self._collective(B * n, buf, done, self.tp_form)
        for f in s.out_flows:
            for self.seq in range(B):
                self.hbm("r0", s, self.flow(f))
                rb.add("r0", "r0", "r1")
                smem(rb, "d1", out + self.seq * n * 4, n)
                rb.dmast("d1", "r0", 1)
        self.seq = 0
        rb.dmawait(1)
        rb.label(done)

    def tp_block_bytes(self) -> int:
        """SRAM bytes of the block every allreduce and the logit gather use (the one-shot's
        receivers: their own slice and the sum)."""
        n = [self.tp_slice(s.out_len) * self.B
             * (2 if self.tp_form == "oneshot" else 1) for s in self.plan.stages
             if s.id in self.tp.splits and self.tp.splits[s.id].kind == "row"]
        n += [self.G * self.tp_slice(vg, True) * (2 if self.tp_form_gather == "oneshot" else 1)
              for _, vg, _ in self.tp.vocab.values()]
        return 4 * max(n, default=1)

    def tp_slice(self, length: int, gather: bool = False) -> int:
        """Floats of a length-long vector one slice of the allreduce (of the gather) holds."""
        return -(-length // self.tp_units(gather))

    def tp_span(self, length: int, gather: bool = False) -> int:
        """Floats of a length-long vector padded to whole slices."""
        return self.tp_slice(length, gather) * self.tp_units(gather)

    def emit_gather(self, s: Stage) -> None:
        """The LM head's logit slices into the logits on GPU 0: SM x puts chunk x of its GPU's
        slice at place GY of a G-chunk block of zeros, the columns sum the blocks, and GPU 0's
        SM x stores chunk x of every GPU's slice."""
        rb, L, G = self.rb, self.labels, self.G
        V, vg, name = self.tp.vocab[s.id]
        n, form = self.tp_slice(vg, True), self.tp_form_gather
        block = self.tp_buf
        skip = L("not_gpu0")
        self._tp_index("r4", skip, form)  # r4: the chunk this SM handles
        smem(rb, "d1", block, G * n)
        rb.vfill("d1", ZF)
        rb.muli("r1", "r4", n * 4)
        self.hbm("r0", s, Ha(self.layout.local_out[s.id],
                             seq=self.tp_span(vg, True) * 4 if self.seq_rt else 0))
        rb.add("r0", "r0", "r1")
        rb.muli("r2", "GY", n * 4)
        smem(rb, "d1", block, n)
        rb.daddr("d1", "r2", block)
        rb.dmald("d1", "r0", 0)
        rb.dmawait(0)
        block = self._collective(G * n, block, skip, form)
        rb.bne("GY", ZR, skip)
        out = self.layout.outputs[name]  # GPU 0's range: no base added
        for g in range(G):
            rows = min(vg, V - g * vg)  # this GPU's logits
            if rows <= 0:
                continue
            none = L("no_chunk")
            rb.li("r2", rows)
            rb.muli("r3", "r4", n)
            rb.sub("r2", "r2", "r3")  # r2 = rows left from chunk X on
            rb.bge(ZR, "r2", none)
            rb.li("r3", n)
            rb.bge("r2", "r3", f"{none}_full")
            rb.addi("r3", "r2", 0)
            rb.label(f"{none}_full")
            li64(rb, "r0", out + g * vg * 4)
            self.seq_offset("r0", self.out_row(name) if self.seq_rt else 0)  # its row
            rb.add("r0", "r0", "r1")
            smem(rb, "d1", block + g * n * 4, n)
            rb.dlen("d1", "r3")
            rb.dmast("d1", "r0", 1)
            rb.label(none)
        rb.dmawait(1)
        rb.label(skip)

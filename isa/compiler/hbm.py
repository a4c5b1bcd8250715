"""The HBM target: a decode step as one persistent kernel over every core of a GPU preset.

What a GPU does for batch-1 decode, written for the emulator's HBM machines (h100, h200, a100:
SMs as a C x 1 row of cores, shared memory as SRAM, every weight in HBM). The same lowered
plan as the mesh target (isa.compiler.lower: embed, vector, gemv and attn stages in order),
mapped differently:

- Every core runs every stage, in plan order (one region, SPMD on the core index X); between
  stages a grid barrier over the fabric (a binary gather tree into core 0, then a multicast
  from core 0 back to every core; only the half a stage boundary needs).
- Every weight lives in HBM and is read once a step (a token of each sequence). A gemv
  stage's matrices (stacked by rows, as on the mesh) are stored as consecutive column-major
  row tiles of tr x K (the layout `mv` reads, one DMA a tile); tile t belongs to core t % C,
  which streams its tiles with double buffering: the DMA of the next tile runs while `mv`
  works on this one (tags 0 and 1), and the y pieces go back with `dmast` (tags 2 and 3).
- Every value that crosses stages (a Flow) is an fp32 buffer in HBM: the producer stores it,
  waits for the store, the barrier passes, and the consumer loads it. A real GPU would hit L2
  for these; this model has none, so each core's read of a gemv input is HBM traffic (a few %
  of the weight bytes; counted in hbm_read_bytes, never hidden).
- Embed and vector stages (gathers, residual adds, norms) run on core 0. Attention runs a KV
  head's query heads a work item, each item's positions split over several cores (isa/
  compiler/hbm_attn.py); the K and V caches are in HBM, a position a row: the new k and v are
  appended with `dmast`, then the cached positions are read back in chunks of CH rows (scores
  with `mm`, softmax, weighted sum with `mva`), and the parts combined.
- On a GPU node (a system of G GPUs, NAMExN) every GPU runs this kernel on its share of the
  model, two allreduces a layer over the node's links (isa/compiler/hbm_tp.py).
- Transformer layers whose code is identical run as a loop over per-layer HBM blocks (a
  register holds the block's base; a GPU kernel's weight pointers), so code stays small at 32
  layers. The code is compared, not assumed: a layer whose code differs is emitted on its own.
- input_ids and position_ids are SRAM pieces on every core (timing-only mode keeps host inputs
  known); outputs (logits) are HBM pieces the host reads after the run.
- Several sequences (sequences = B): a batched step. B ids and B positions a run, flows of B
  rows, B KV caches a stage, logits B x vocab; every gemv reads each tile once and multiplies
  it by the B activations with `mma` (emit_gemv_batch); the other stages loop over the
  sequences (seq_loop), their addresses offset by the sequence's index.

Decode only: one position a run (T = 1), causal attention; encoders are refused in one line.
Register conventions: r15 = 0, r12 = the layer block's HBM base, r11 = the layer loop counter,
r14 = the GPU's HBM base on a node; r0-r10 and r13 are stage scratch; d13-d15 are the
barrier's.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.compiler.codegen_attn import _rope_tables
from wse_emu.isa.compiler.emit import I32, ZF, ZR, Labels, norm_code
from wse_emu.isa.compiler.hbm_attn import HbmAttention
# IO_BYTES: one sequence's io block (tests size a machine's SRAM with it)
from wse_emu.isa.compiler.hbm_emit import IO_BYTES  # noqa: F401
from wse_emu.isa.compiler.hbm_emit import RL, Ha, _Arena, _Recorder, io_bytes, li64, smem
from wse_emu.isa.compiler.hbm_tp import GB, HbmTensorParallel, gpus_needed, hbm_need, shard
from wse_emu.isa.compiler.lower import CompileError, Plan, Stage
from wse_emu.isa.compiler.pack import CompileReport, Weights, with_model
from wse_emu.isa.program import ALL_LAYERS
from wse_emu.isa.compiler.placement import WEIGHT_BYTES
from wse_emu.isa.errors import BuildError
from wse_emu.isa.spec import INSTR_BYTES
from wse_emu.isa.tensors import as_2d, read_safetensor

RC = "r11"  # the layer loop counter (RL, r12: the layer block base address)
MAX_TILE = 64 * 1024  # weight tile bytes: large enough to amortise a DMA, two fit any SM
KV_CHUNK_BYTES = 32 * 1024  # K (or V) rows read back a DMA (isa/compiler/hbm_attn.py)
UP_CHUNK = 2048  # floats of SwiGLU's up half a DMA when both halves do not fit beside the tiles


@dataclass
class _Gemv:
    tr: int
    nt: int  # tiles
    tile_bytes: int
    tiles: Ha
    bias: Ha | None
    up_chunk: int = 0  # SwiGLU on a small SRAM: up loaded this many floats at a time (0: whole)


@dataclass
class _Layout:
    """HBM addresses of everything, and the per-stage choices the code depends on."""

    flows: dict = field(default_factory=dict)  # flow id -> absolute HBM address (sequence 0)
    flow_stride: dict = field(default_factory=dict)  # flow id -> bytes a sequence's row
    outputs: dict = field(default_factory=dict)  # output symbol -> absolute HBM address
    gemv: dict = field(default_factory=dict)  # stage id -> _Gemv
    params: dict = field(default_factory=dict)  # stage id -> {weight name: Ha}
    tables: dict = field(default_factory=dict)  # stage id -> [Ha]
    kv: dict = field(default_factory=dict)  # stage id -> (K Ha, V Ha, chunk rows)
    rope: dict = field(default_factory=dict)  # stage id -> (cos, sin) absolute addresses
    blocks: list = field(default_factory=list)  # per layer: HBM address of its block
    local_out: dict = field(default_factory=dict)  # node: LM head stage id -> its logit slice
    scratch: int = 0  # attention parts' (m, l, o) (isa/compiler/hbm_attn.py)
    weight_bytes: int = 0
    kv_bytes: int = 0


def _bodies(plan: Plan) -> list[list[int]]:
    """The stage ids of each transformer layer's repeating part: the last P stages of every
    layer, P = the last layer's stage count (layer 0 also has the first norm before it). []
    when the layers do not all have that many stages."""
    L = plan.graph.config.layers
    by_layer: dict[int, list[int]] = {}
    for s in plan.stages:
        by_layer.setdefault(s.layer, []).append(s.id)
    if L < 1 or any(lay not in by_layer for lay in range(L)):
        return []
    P = len(by_layer[L - 1])
    if any(len(by_layer[lay]) < P for lay in range(L)):
        return []
    return [by_layer[lay][-P:] for lay in range(L)]


def _norm_params(s: Stage) -> list[str]:
    """The norm weights of a vector stage, in the order of first use."""
    return list(dict.fromkeys(w for op in s.ops for w in op[3].get("params", ())))


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _tile_rows(s: Stage, cores: int, wbytes: int, budget: int) -> int:
    """Tile rows tr for a gemv stage: a divisor of every matrix's rows (tiles never straddle
    two matrices), tiles of at most MAX_TILE bytes that two of fit `budget`, and among those
    the largest that still gives every core a tile (or the smallest when none does)."""
    K = s.in_len
    g = 0
    for m in s.matrices:
        g = math.gcd(g, m.out)
    fits = [d for d in _divisors(g)
            if d * K * wbytes <= MAX_TILE and 2 * d * K * wbytes + 4 * (d * 4 + 64) <= budget]
    if not fits:
        raise CompileError(f"stage '{s.name}': one row of {K} weights does not fit two tile "
                           f"buffers in a core's SRAM ({budget} bytes free)")
    busy = [d for d in fits if s.out_len // d >= cores]
    return max(busy) if busy else min(fits)


class HbmCompiler(HbmAttention, HbmTensorParallel):
    """Emits the kernel of a lowered plan for an HBM machine (module docstring)."""

    def __init__(self, plan: Plan, machine, dtype: str, shape_only: bool, base_dir, name: str,
                 double_buffer: bool = True, sequences: int = 1, prefill: bool = False):
        self.double_buffer = double_buffer  # False: no prefetch (to measure what it buys)
        self.B, self.seq = sequences, 0  # sequences a step; the one being emitted
        # a prefill program: the B are consecutive positions of one sequence, one KV cache a
        # stage that the loop over them appends to in order (hbm_attn.attn_seq)
        self.one_cache = bool(prefill)
        self.seq_rt = False  # True inside seq_loop: addresses follow the loop's sequence
        # embed and vector stages: sequence b on core b (else core 0 loops over them)
        self.spread = 1 < sequences <= machine.width
        self.chunks = {}  # gemv stage id -> columns of its activations a chunk (B > 1)
        if plan.T != 1:
            raise CompileError(f"the HBM target compiles one position a run (decode), not "
                               f"{plan.T}: encoders (attention over the whole sequence in one "
                               f"run) are not supported on machine '{machine.name}'")
        for s in plan.stages:
            if s.kind == "attn" and not s.attrs.get("causal", True):
                raise CompileError(f"stage '{s.name}': the HBM target supports causal "
                                   f"attention only")
        self.machine, self.dtype = machine, dtype
        self.shape_only, self.base_dir, self.name = shape_only, base_dir, name
        if machine.chip_height != 1:
            raise CompileError(f"machine '{machine.name}': the HBM target expects a GPU's cores "
                               f"as one row (height 1), got {machine.width} x "
                               f"{machine.chip_height}")
        self.C, self.G = machine.width, machine.chips  # SMs a GPU, GPUs (rows) of the node
        self.wb = WEIGHT_BYTES[dtype]
        # a node splits every matrix over its GPUs (isa/compiler/hbm_tp.py)
        full = plan
        self.tp = shard(plan, self.G) if self.G > 1 else None
        self.plan = plan = self.tp.plan if self.tp else plan
        need = hbm_need(plan, self.wb)
        if need > machine.hbm_bytes:
            n = gpus_needed(full, self.wb, machine.hbm_bytes)
            base = machine.base
            hold = (f"{n} GPUs would hold it (--machine {base}x{n})" if n
                    else f"no node of up to 64 {base} GPUs holds it")
            raise CompileError(f"the model needs {need / 1e9:.2f} GB of HBM a GPU (weights, KV "
                               f"caches, tables) but machine '{machine.name}' has "
                               f"{machine.hbm_bytes / 1e9:.2f} GB a GPU: {hold}")
        self.bodies = _bodies(plan)
        self.body_of = {sid: (lay, i) for lay, ids in enumerate(self.bodies)
                        for i, sid in enumerate(ids)}
        self.rounds = max(0, math.ceil(math.log2(self.C))) if self.C > 1 else 0
        if self.C > 1 and self.rounds + 1 > machine.colors:
            raise CompileError(f"machine '{machine.name}': the grid barrier needs "
                               f"{self.rounds + 1} colors, the machine has {machine.colors}")
        if self.tp:
            self.tp_check_colors()
    # -- entry ----------------------------------------------------------------------------------

    def compile(self):
        """(Program, CompileReport). The code sits below the SRAM buffers, so its size is
        reserved first and the kernel rebuilt when it does not fit the reserve."""
        reserve = 16 * 1024
        for _ in range(4):
            program, report, code_bytes = self._attempt(reserve)
            if code_bytes <= reserve:
                return program, report
            reserve = -(-code_bytes // 1024) * 1024 + 2048
        raise CompileError(f"internal: the kernel's code ({code_bytes} bytes) does not settle")

    def _attempt(self, reserve: int):
        m, B = self.machine, self.B
        self.io_bytes = io_bytes(B)
        if reserve + self.io_bytes >= m.sram_bytes:
            raise CompileError(f"the kernel's code ({reserve} bytes) does not fit a core's SRAM "
                               f"({m.sram_bytes} bytes) on machine '{m.name}'")
        pb = ProgramBuilder(self.name)
        self.symbols = {name: ((B,) + tuple(shape[1:]) if B > 1 else tuple(shape))
                        for name, shape in self.plan.symbols.items()}
        for name, shape in self.symbols.items():
            if name in ("input_ids", "position_ids"):
                pb.input(name, "i32", shape)
            else:
                pb.output(name, "f32", shape)
        self.pb = pb
        self.weights = Weights(pb, self.base_dir)
        self.io = reserve
        self.arena0 = reserve + self.io_bytes
        if self.tp:  # the allreduce's block: low in SRAM (collectives take 16-bit addresses)
            self.tp_buf = -(-self.arena0 // 64) * 64
            self.arena0 = self.tp_buf + self.tp_block_bytes()
        self.need = {}
        self._slices = 0  # inline tensors of matrix slices (a node)
        self.attn_plans = {}  # stage id -> (query heads an item, cores an item)
        self.layout = self._layout(pb)
        parts = max((self.attn_scratch_bytes(s) for s in self.plan.stages if s.kind == "attn"),
                    default=0)
        self.scratch_one = parts
        if parts:
            self.layout.scratch = pb.hbm_alloc("attn_parts", parts * B)  # a sequence each
        self.gpu_bytes = pb._hbm_cursor  # one GPU's HBM; the others' are copies of its layout
        for c in range(1, self.G):
            pb.hbm_alloc(f"gpu{c}", self.gpu_bytes, at=c * m.hbm_bytes)
        self._hbm_inits(pb)
        self._routes(pb)
        if self.tp:
            self.tp_routes(pb)
        rb = pb.region("gpu", 0, 0, self.C, self.G)
        rb.alloc("io", self.io_bytes, at=self.io)
        for name in ("input_ids", "position_ids"):
            rb.piece(name, self.io + (0 if name == "input_ids" else 4 * B), I32, (B, 1))
        pb.tensor("default_position_ids", np.zeros(B, dtype=np.int32))
        rb.load("default_position_ids", self.io + 4 * B, I32, (B, 1))
        self.rb = rb
        if self.tp:
            self.tp_gpu_base()
        self._emit()
        rb.halt()
        top = max(self.need.values(), default=self.arena0)
        if top > self.arena0:
            rb.alloc("arena", top - self.arena0, at=self.arena0)
        code_bytes = rb.pc * INSTR_BYTES
        if code_bytes > reserve:
            return None, None, code_bytes
        cfg = self.plan.graph.config
        stages = [dict(name=s.name, kind=s.kind, layer=s.layer, rect=[0, 0, self.C, self.G],
                       sram=self.need.get(s.id, self.arena0))
                  for s in self.plan.stages]
        pb.meta("compiler", {"family": cfg.family, "machine": m.name, "dtype": self.dtype,
                             "max_context": cfg.max_context, "vocab": cfg.vocab,
                             "hidden": cfg.hidden, "layers": cfg.layers, "target": "hbm",
                             "weight_hbm_bytes": self.layout.weight_bytes,
                             "kv_hbm_bytes": self.layout.kv_bytes, "gpus": self.G,
                             "sequences": B, "prefill": self.one_cache,
                             "stages": stages})
        try:
            program = pb.build()
        except BuildError as e:
            raise CompileError(f"internal: the generated program is invalid: {e}") from None
        if self.gpu_bytes > m.hbm_bytes:
            raise CompileError(
                f"the model needs {self.gpu_bytes / 1e9:.2f} GB of HBM (weight matrices "
                f"{self.layout.weight_bytes / 1e9:.2f} GB, KV caches "
                f"{self.layout.kv_bytes / 1e9:.2f} GB, embedding tables, norms and activations "
                f"the rest) but "
                f"machine '{m.name}' has {m.hbm_bytes / 1e9:.2f} GB")
        program = with_model(program, cfg, "hbm", "kernel", m, self.dtype, self.plan.T,
                             [("kernel", ALL_LAYERS, [r.name for r in program.regions], 0)],
                             sequences=B, prefill=self.one_cache)
        sram = program.region_sram_bytes(program.regions[0])
        report = CompileReport(
            model=self.name, machine=m.name, dtype=self.dtype, max_context=cfg.max_context,
            fabric=(self.C, self.G), pes=self.C * self.G, sram_max=sram, sram_mean=float(sram),
            colors=program.colors_used(), stages=stages, target="hbm",
            hbm_bytes=self.gpu_bytes if self.tp else program.hbm_bytes,
            weight_hbm_bytes=self.layout.weight_bytes,  # a node: one GPU's
            sequences=B, prefill=self.one_cache)
        return program, report, code_bytes

    # -- HBM layout -----------------------------------------------------------------------------

    def _layout(self, pb) -> _Layout:
        lay = _Layout()
        plan, wb = self.plan, self.wb
        budget = self.machine.sram_bytes - self.arena0
        seen_rope: dict = {}
        # per-layer blocks: the same order and sizes in every layer, so a fixed stride apart
        offsets: dict[int, dict] = {}
        block = 0

        def bump(size: int) -> int:
            nonlocal block
            off = block
            block += -(-size // 64) * 64
            return off
        for i, sid in enumerate(self.bodies[0] if self.bodies else []):
            offsets[i] = self._stage_hbm(plan.stages[sid], bump, budget)
        block_bytes = block
        for n in range(len(self.bodies)):
            lay.blocks.append(pb.hbm_alloc(f"layers.{n}", block_bytes))
        for s in plan.stages:
            if s.id in self.body_of:
                n, i = self.body_of[s.id]
                self._record(lay, s, offsets[i], layer=True)
            else:
                def alloc(size, s=s, k=itertools.count(1)):  # buffers s<id>.1, .2, ...
                    return pb.hbm_alloc(f"s{s.id}.{next(k)}", size)
                self._record(lay, s, self._stage_hbm(s, alloc, budget), layer=False)
            if s.kind == "attn" and (s.attrs["rope_q"] or s.attrs["rope_k"]):
                a = s.attrs
                key = (a["max_context"], a["head_dim"], (a["rope_q"] or a["rope_k"])[1])
                if key not in seen_rope:
                    size = key[0] * key[1] * 2  # (ctx, hd / 2) fp32
                    seen_rope[key] = (pb.hbm_alloc(f"rope_cos_{s.id}", size),
                                      pb.hbm_alloc(f"rope_sin_{s.id}", size))
                lay.rope[s.id] = seen_rope[key]
        # flows: one buffer per consumer role, so every layer's code reads the same addresses
        # (a flow into stage i of a layer's repeating part, input slot k, is the same buffer in
        # every layer; it is rewritten one layer later, after its reader has run)
        period = len(self.bodies[0]) if self.bodies else 0
        keyed: dict = {}
        for f in plan.flows:
            key = ("flow", f.id)
            if f.dst in self.body_of and f.dst - f.src < period:
                key = ("role", self.body_of[f.dst][1], plan.stages[f.dst].in_flows.index(f.id),
                       f.length)
            length = self.tp_span(f.length) if self.tp else f.length
            if key not in keyed:  # on a node, padded to whole slices of the allreduce; B
                keyed[key] = pb.hbm_alloc(f"flow{f.id}.{f.what}", length * 4 * self.B)  # rows
            lay.flows[f.id] = keyed[key]
            lay.flow_stride[f.id] = length * 4  # bytes from one sequence's row to the next
        for sid, (_, vg, name) in (self.tp.vocab.items() if self.tp else ()):
            lay.local_out[sid] = pb.hbm_alloc(f"slice.{name}",
                                              self.tp_span(vg, True) * 4 * self.B)
        for name, shape in self.symbols.items():
            if name not in ("input_ids", "position_ids"):
                lay.outputs[name] = pb.hbm_alloc(f"out.{name}", int(np.prod(shape)) * 4)
                pb.hbm_piece(name, lay.outputs[name], "f32")
        # weight and KV bytes, counted once per layer
        for s in plan.stages:
            if s.kind == "gemv":
                lay.weight_bytes += s.out_len * s.in_len * wb
            elif s.kind == "attn":
                a = s.attrs
                lay.kv_bytes += 2 * a["n_kv_heads"] * a["max_context"] * a["head_dim"] * wb \
                    * (1 if self.one_cache else self.B)
        return lay

    def _stage_hbm(self, s: Stage, alloc, budget: int) -> dict:
        """Allocate stage s's weights (and KV caches) with alloc(size) -> address; returns
        what _record needs."""
        wb = self.wb
        if s.kind == "gemv" and self.B > 1:  # the activations come in chunks of columns
            tr = _tile_rows(s, self.C, wb, budget // 2)  # (emit_gemv_batch): half for them
            out = {"tr": tr, "tiles": alloc(s.out_len * s.in_len * wb), "up_chunk": 0}
            if any(m.bias for m in s.matrices):
                out["bias"] = alloc(s.out_len * 4)
            return out
        if s.kind == "gemv":
            up_chunk = 0  # SwiGLU: up arrives whole beside gate, or UP_CHUNK floats at a time
            x_bytes = s.in_len * 4 * (2 if s.prologue == "swiglu" else 1)
            try:
                tr = _tile_rows(s, self.C, wb, budget - x_bytes - 64)
            except CompileError:
                if s.prologue != "swiglu":
                    raise
                up_chunk = min(UP_CHUNK, s.in_len)
                x_bytes = s.in_len * 4 + 2 * up_chunk * 4 + 128
                tr = _tile_rows(s, self.C, wb, budget - x_bytes - 64)
            out = {"tr": tr, "tiles": alloc(s.out_len * s.in_len * wb), "up_chunk": up_chunk}
            if any(m.bias for m in s.matrices):
                out["bias"] = alloc(s.out_len * 4)
            return out
        if s.kind == "vector":
            n = s.attrs["hidden"]
            return {"params": [alloc(n * wb) for _ in _norm_params(s)]}
        if s.kind == "embed":
            n = s.attrs["hidden"]
            return {"tables": [alloc(ref.shape[0] * n * wb) for _, ref, _ in s.tables]}
        if s.kind == "attn":
            a = s.attrs
            size = a["n_kv_heads"] * a["max_context"] * a["head_dim"] * wb  # a cache a sequence
            size *= 1 if self.one_cache else self.B
            return {"k": alloc(size), "v": alloc(size)}
        raise CompileError(f"stage '{s.name}': kind {s.kind!r} has no HBM mapping")

    def _record(self, lay: _Layout, s: Stage, got: dict, layer: bool) -> None:
        if s.kind == "gemv":
            tr = got["tr"]
            lay.gemv[s.id] = _Gemv(tr, s.out_len // tr, tr * s.in_len * self.wb,
                                   Ha(got["tiles"], layer),
                                   Ha(got["bias"], layer) if "bias" in got else None,
                                   got["up_chunk"])
        elif s.kind == "vector":
            lay.params[s.id] = {w: Ha(a, layer) for w, a in zip(_norm_params(s), got["params"])}
        elif s.kind == "embed":
            lay.tables[s.id] = [Ha(a, layer) for a in got["tables"]]
        else:
            a = s.attrs
            chunk = max(1, min(a["max_context"], KV_CHUNK_BYTES // (a["head_dim"] * self.wb)))
            lay.kv[s.id] = (Ha(got["k"], layer), Ha(got["v"], layer), chunk)

    def _abs(self, s: Stage, ha: Ha) -> int:
        """The absolute HBM address of ha for stage s (its layer's block when relative)."""
        return ha.off + (self.layout.blocks[self.body_of[s.id][0]] if ha.layer else 0)

    def _hbm_inits(self, pb) -> None:
        """Weights (functional programs only) and the RoPE tables into HBM: on a node, into
        every GPU's range, each GPU's slices of the matrices (isa/compiler/hbm_tp.py)."""
        lay, wd = self.layout, self.dtype
        done_rope = set()
        for s in self.plan.stages:
            if s.id in lay.rope and lay.rope[s.id] not in done_rope:
                a = s.attrs
                rope = a["rope_q"] or a["rope_k"]
                tables = _rope_tables(rope, a["max_context"], a["head_dim"])
                for addr, table, kind in zip(lay.rope[s.id], tables, ("cos", "sin")):
                    tname = f"rope_{kind}_{s.id}"
                    pb.tensor(tname, table)
                    for c in range(self.G):
                        pb.hbm_init(tname, c * self.machine.hbm_bytes + addr, "f32", order="C")
                done_rope.add(lay.rope[s.id])
            if self.shape_only:
                continue
            for c in range(self.G):
                self._stage_inits(pb, s, c, c * self.machine.hbm_bytes)

    def _stage_inits(self, pb, s: Stage, c: int, base: int) -> None:
        """Stage s's weights into GPU c's HBM (base: its first byte)."""
        lay, wd = self.layout, self.dtype
        if s.kind == "gemv":
            g = lay.gemv[s.id]
            split = self.tp.splits[s.id] if self.tp else None
            row0 = 0
            for i, m in enumerate(s.matrices):
                addr = base + self._abs(s, g.tiles) + row0 * s.in_len * self.wb
                if split is None:
                    pb.hbm_init(self.weights.tensor(m.ref), addr, wd, tile_rows=g.tr,
                                order="F", transpose=m.ref.transpose, rows=m.ref.rows)
                    if m.bias_ref is not None:
                        pb.hbm_init(self.weights.tensor(m.bias_ref),
                                    base + self._abs(s, g.bias) + row0 * 4, "f32", order="F",
                                    rows=m.bias_ref.rows)
                else:
                    orig, per = split.parts[i]
                    rows, cols, with_bias = per[c]
                    self._slice_init(pb, orig.ref, rows, cols, m.out, addr, g.tr, wd)
                    if orig.bias_ref is not None and with_bias:
                        self._slice_init(pb, orig.bias_ref, rows, None, m.out,
                                         base + self._abs(s, g.bias) + row0 * 4, 0, "f32")
                row0 += m.out
        elif s.kind == "vector":
            for w, ha in lay.params[s.id].items():
                ref = self.plan.graph.weights[w]
                pb.hbm_init(self.weights.tensor(ref), base + self._abs(s, ha), wd, order="F",
                            transpose=ref.transpose, rows=ref.rows)
        elif s.kind == "embed":
            for (_, ref, _), ha in zip(s.tables, lay.tables[s.id]):
                pb.hbm_init(self.weights.tensor(ref), base + self._abs(s, ha), wd, order="C",
                            transpose=ref.transpose, rows=ref.rows)

    def _slice_init(self, pb, ref, rows, cols, out: int, addr: int, tr: int, dtype) -> None:
        """Logical rows [rows) (and columns [cols), all when None) of the weight `ref`, padded
        with zero rows to `out`, into HBM at addr as tr-row column-major tiles. A row range is
        a view of the safetensors file; columns and padding are cut here into an inline
        tensor of the program."""
        r0 = ref.rows[0] if ref.rows else 0
        view = (r0 + rows[0], r0 + rows[1])
        if cols is None and rows[1] - rows[0] == out:
            pb.hbm_init(self.weights.tensor(ref), addr, dtype, tile_rows=tr, order="F",
                        transpose=ref.transpose, rows=view)
            return
        path = Path(ref.file)
        if not path.is_absolute() and self.base_dir is not None:
            path = Path(self.base_dir) / path
        arr, tag = read_safetensor(path, ref.key)
        w = as_2d(np.asarray(arr))
        w = w.T if ref.transpose else w
        w = w[view[0]:view[1]]
        if cols is not None:
            w = w[:, cols[0]:cols[1]]
        if w.shape[0] < out:
            w = np.concatenate([w, np.zeros((out - w.shape[0], w.shape[1]), w.dtype)])
        name = f"tp.{self._slices}"
        self._slices += 1
        pb.tensor(name, np.ascontiguousarray(w), dtype="bf16" if tag == "bf16" else None)
        pb.hbm_init(name, addr, dtype, tile_rows=tr, order="F")

    # -- the grid barrier -----------------------------------------------------------------------

    def _routes(self, pb) -> None:
        """Colors 0 .. rounds-1: the gather tree (round r: core a + 2^r sends west to core a,
        a a multiple of 2^(r+1)); color `rounds`: core 0's multicast east to every core."""
        C, H = self.C, self.G  # every GPU (row) its own barrier
        if C == 1:
            return
        for r in range(self.rounds):
            step = 1 << r
            for a in range(0, C, 2 * step):
                b = a + step
                if b >= C:
                    continue
                pb.route(b, 0, 1, H, r, "RAMP", "W")
                if b - a > 1:
                    pb.route(a + 1, 0, b - a - 1, H, r, "E", "W")
                pb.route(a, 0, 1, H, r, "E", "RAMP")
        bc = self.rounds
        pb.route(0, 0, 1, H, bc, "RAMP", "E")
        if C > 2:
            pb.route(1, 0, C - 2, H, bc, "W", "E|RAMP")
        pb.route(C - 1, 0, 1, H, bc, "W", "RAMP")

    def _token(self, rb, color: int, send: bool) -> None:
        smem(rb, "d13", self.io + 8 * self.B, 1)
        if send:
            rb.dfout("d14", "f32", color, 1)
            rb.vmov("d14", "d13")
        else:
            rb.dfin("d15", "f32", color, 1)
            rb.vmov("d13", "d15")

    def barrier(self, kind: str) -> None:
        """'gather': core 0 continues once every core has arrived; 'bcast': every core waits
        for core 0; 'full': both. Each core's DMAs are complete before it arrives."""
        rb, L, C = self.rb, self.labels, self.C
        if C == 1 or kind == "none":
            return
        if kind in ("gather", "full"):
            out = L("gathered")
            for r in range(self.rounds):
                step = 1 << r
                send, skip = L("tree_send"), L("tree_skip")
                rb.andi("r0", "X", 2 * step - 1)
                rb.li("r1", step)
                rb.beq("r0", "r1", send)
                rb.addi("r0", "X", step)
                rb.li("r1", C)
                rb.bge("r0", "r1", skip)
                self._token(rb, r, send=False)
                rb.jmp(skip)
                rb.label(send)
                self._token(rb, r, send=True)
                rb.jmp(out)
                rb.label(skip)
            rb.label(out)
        if kind in ("bcast", "full"):
            other, done = L("bcast_wait"), L("bcast_done")
            rb.bne("X", ZR, other)
            self._token(rb, self.rounds, send=True)
            rb.jmp(done)
            rb.label(other)
            self._token(rb, self.rounds, send=False)
            rb.label(done)

    @staticmethod
    def _one_core(s: Stage) -> bool:
        return s.kind in ("embed", "vector")

    def _barrier_kind(self, a: Stage, b: Stage | None) -> str:
        if b is None:
            return "none"
        one_a, one_b = self._one_core(a), self._one_core(b)
        if one_a and one_b:
            return "none"  # core 0 (core b: sequence b) after itself: its DMAs are waited for
        if self.spread:  # cores 0 .. B-1 wrote (or will read) what every core reads (wrote)
            return "full"
        return "bcast" if one_a else ("gather" if one_b else "full")

    def skip_idle(self, skip: str) -> None:
        """Branch to skip on the cores an embed or vector stage leaves idle: all but core 0,
        or with the sequences spread, all but cores 0 .. B-1 (core b: sequence b)."""
        if self.spread:
            self.rb.li("r0", self.B)
            self.rb.bge("X", "r0", skip)
        else:
            self.rb.bne("X", ZR, skip)

    # -- the kernel ------------------------------------------------------------------------------

    def _emit(self) -> None:
        stages = self.plan.stages
        nxt = {s.id: (stages[s.id + 1] if s.id + 1 < len(stages) else None) for s in stages}
        real = self.rb
        # which consecutive layers share their code: record each layer's, compare
        codes = []
        for ids in self.bodies:
            self.rb, self.labels = _Recorder(), Labels()
            for sid in ids:
                self.stage(stages[sid], nxt[sid])
            codes.append(self.rb.calls)
        self.rb, self.labels = real, Labels()
        blocks = self.layout.blocks
        runs, n = [], 0
        while n < len(self.bodies):
            end = n + 1
            while (end < len(self.bodies) and codes[end] == codes[n]
                   and blocks[end] - blocks[end - 1] == blocks[n + 1] - blocks[n]):
                end += 1
            runs.append((n, end))
            n = end
        first_of = {self.bodies[a][0]: (a, b) for a, b in runs}
        sid = 0
        while sid < len(stages):
            if sid in first_of:
                a, b = first_of[sid]
                self.layer_run(a, b)
                sid = self.bodies[b - 1][-1] + 1
                continue
            self.stage(stages[sid], nxt[sid])
            sid += 1

    def layer_run(self, a: int, b: int) -> None:
        """Layers a .. b-1 (identical code): a loop over their HBM blocks, or straight code."""
        rb, blocks = self.rb, self.layout.blocks
        self.hbm_abs(RL, blocks[a])
        top = self.labels(f"layers_{a}_{b}")
        if b - a > 1:
            rb.li(RC, b - a)
            rb.label(top)
        for sid in self.bodies[a]:
            s = self.plan.stages[sid]
            self.stage(s, self.plan.stages[sid + 1] if sid + 1 < len(self.plan.stages)
                       else None)
        if b - a > 1:
            stride = blocks[a + 1] - blocks[a]
            if stride < 2 ** 31:
                rb.addi(RL, RL, stride)
            else:
                li64(rb, "r0", stride)
                rb.add(RL, RL, "r0")
            rb.addi(RC, RC, -1)
            rb.bne(RC, ZR, top)

    def stage(self, s: Stage, nxt: Stage | None) -> None:
        """Stage s of every sequence: a gemv once for all of them (each weight tile read once,
        times the B activations), the other kinds once a sequence (its own rows of the flows,
        its KV caches, its token and position)."""
        if s.kind == "gemv" and self.B > 1:
            self.arena = _Arena(self.arena0, self.machine.sram_bytes, s.name, self.machine,
                                "fewer sequences")
            self.emit_gemv_batch(s)
            self.need[s.id] = max(self.need.get(s.id, 0), self.arena.top)
        else:
            self.arena = _Arena(self.arena0, self.machine.sram_bytes, s.name, self.machine,
                                "a smaller max_context" + (" or fewer sequences"
                                                           if self.B > 1 else ""))
            emit = getattr(self, f"emit_{s.kind}")
            if s.kind == "gemv":
                emit(s)
            elif self.spread and self._one_core(s):
                self.seq_spread(lambda: emit(s))
            else:
                self.seq_loop(lambda: emit(s))
            self.need[s.id] = max(self.need.get(s.id, 0), self.arena.top)
        split = self.tp.splits.get(s.id) if self.tp else None
        if split is not None and split.kind in ("row", "vocab"):
            self.barrier("full")  # every SM's partial output is in HBM
            if split.kind == "row":  # the B sequences' rows in one allreduce
                self.emit_allreduce(s)
            else:
                self.seq_loop(lambda: self.emit_gather(s))
        self.barrier(self._barrier_kind(s, nxt))

    def seq_loop(self, body) -> None:
        """body() once (one sequence), or as a loop over the B sequences: its HBM addresses
        and io reads add the sequence's index (a word of the io block) times their stride."""
        if self.B == 1:
            body()
            return
        rb, word = self.rb, self.io + 8 * self.B + 4
        rb.sw(ZR, ZR, word)
        top = self.labels("sequence")
        rb.label(top)
        self.seq_rt = True
        body()
        self.seq_rt = False
        rb.lw("r10", ZR, word)
        rb.addi("r10", "r10", 1)
        rb.sw("r10", ZR, word)
        rb.li("r0", self.B)
        rb.blt("r10", "r0", top)

    def seq_spread(self, body) -> None:
        """body() of an embed or vector stage with sequence b on core b (its index the core's
        X, in the io block's word): the B sequences' norms and adds side by side."""
        self.rb.sw("X", ZR, self.io + 8 * self.B + 4)
        self.seq_rt = True
        body()
        self.seq_rt = False

    def seq_offset(self, reg: str, stride: int) -> None:
        """reg += the looping sequence's index times stride (r10: free between smem calls)."""
        if not stride:
            return
        self.rb.lw("r10", ZR, self.io + 8 * self.B + 4)
        if stride != 1:
            self.rb.muli("r10", "r10", stride)
        self.rb.add(reg, reg, "r10")

    def flow(self, fid: int) -> Ha:
        """The HBM address of flow fid's row of the sequence being emitted (self.seq), or of
        the looping sequence's (in seq_loop)."""
        stride = self.layout.flow_stride[fid]
        if self.seq_rt:
            return Ha(self.layout.flows[fid], seq=stride)
        return Ha(self.layout.flows[fid] + self.seq * stride)

    def out_row(self, name: str) -> int:
        """Bytes of a sequence's row of output `name`."""
        return int(np.prod(self.symbols[name][1:])) * 4 if self.B > 1 else 0

    def load_io(self, reg: str, index: str) -> None:
        """reg = the looping sequence's token id ('input_ids') or position."""
        at = self.io + (0 if index == "input_ids" else 4 * self.B)
        if self.seq_rt:
            self.rb.lw("r10", ZR, self.io + 8 * self.B + 4)
            self.rb.muli("r10", "r10", 4)
            self.rb.lw(reg, "r10", at)
        else:
            self.rb.lw(reg, ZR, at)

    def hbm(self, reg: str, s: Stage, ha: Ha) -> None:
        """reg = the HBM address ha (relative to the layer block inside a layer's code)."""
        if ha.layer:
            li64(self.rb, reg, ha.off)
            self.rb.add(reg, reg, RL)  # RL includes the GPU's base on a node
            self.seq_offset(reg, ha.seq)
        else:
            self.hbm_abs(reg, self._abs(s, ha), ha.seq)

    def hbm_abs(self, reg: str, addr: int, seq: int = 0) -> None:
        """reg = the address addr of this GPU's HBM (addr + its base on a node), plus seq
        bytes a sequence inside seq_loop."""
        li64(self.rb, reg, addr)
        if self.tp:
            self.rb.add(reg, reg, GB)
        self.seq_offset(reg, seq)

    # -- stages -----------------------------------------------------------------------------------

    def emit_gemv(self, s: Stage) -> None:
        """Stream this core's tiles t = X, X + C, ... double-buffered (module docstring)."""
        rb, L, C, A = self.rb, self.labels, self.C, self.arena
        g, wd = self.layout.gemv[s.id], self.dtype
        K, tr = s.in_len, g.tr
        kx = K * (2 if s.prologue == "swiglu" and not g.up_chunk else 1)
        x = A.take(kx * 4)
        ups = [A.take(g.up_chunk * 4) for _ in range(2)] if g.up_chunk else []
        wa, wbuf = A.take(g.tile_bytes), A.take(g.tile_bytes)
        ya, yb = A.take(tr * 4), A.take(tr * 4)
        ba, bb = (A.take(tr * 4), A.take(tr * 4)) if g.bias else (None, None)
        dests = [Ha(self.layout.flows[f]) for f in s.out_flows]
        dests += [Ha(self.layout.outputs[name]) for name, _ in s.outputs]
        if s.id in self.layout.local_out:
            dests.append(Ha(self.layout.local_out[s.id]))
        step, ystep = C * g.tile_bytes, C * tr * 4
        (fin,) = s.in_flows
        self.hbm("r0", s, Ha(self.layout.flows[fin]))
        smem(rb, "d2", x, kx)
        rb.dmald("d2", "r0", 4)
        rb.li("r3", g.nt // C)  # r3: this core's tiles left
        if g.nt % C:
            more = L("more")
            rb.li("r1", g.nt % C)
            rb.bge("X", "r1", more)
            rb.addi("r3", "r3", 1)
            rb.label(more)
        self.hbm("r1", s, g.tiles)  # r1: HBM address of this core's next tile
        rb.muli("r2", "X", g.tile_bytes)
        rb.add("r1", "r1", "r2")
        rb.muli("r2", "X", tr * 4)  # r2: byte offset of its next y piece
        if g.bias:
            self.hbm("r5", s, g.bias)  # r5: its next bias piece
            rb.add("r5", "r5", "r2")
        smem(rb, "d0", wa, tr, wd)
        rb.d2d("d0", K, tr)  # (tr, K) column-major
        smem(rb, "d1", wbuf, tr, wd)
        rb.d2d("d1", K, tr)
        smem(rb, "d3", ya, tr)
        smem(rb, "d4", yb, tr)
        if g.bias:
            smem(rb, "d5", ba, tr)
            smem(rb, "d6", bb, tr)
        done, loop = L("tiles_done"), L("tiles")

        def fetch(dw, db, tag):
            rb.dmald(dw, "r1", tag)
            rb.addi("r1", "r1", step)
            if g.bias:
                rb.dmald(db, "r5", tag)
                rb.addi("r5", "r5", ystep)

        def prefetch(dw, db, tag):  # the tile after this one, if this core has one
            skip = L("no_prefetch")
            rb.li("r6", 1)
            rb.bge("r6", "r3", skip)
            fetch(dw, db, tag)
            rb.label(skip)

        def tile(dy, dw, db, tag):
            rb.mv(dy, dw, "d2")
            if g.bias:
                rb.vadd(dy, dy, db)
            act = {"gelu_tanh": rb.vgelu, "gelu_erf": rb.vgelue, "silu": rb.vsilu}
            if s.activation:
                act[s.activation](dy, dy)
            for dest in dests:
                self.hbm("r4", s, dest)
                rb.add("r4", "r4", "r2")
                rb.dmast(dy, "r4", tag)
            rb.addi("r2", "r2", ystep)

        rb.beq("r3", ZR, done)
        if self.double_buffer:
            fetch("d0", "d5", 0)
        rb.dmawait(4)
        if s.prologue == "swiglu" and not g.up_chunk:  # x = silu(gate) * up: the flow is
            smem(rb, "d7", x, K)                          # gate (K) then up (K)
            smem(rb, "d8", x + K * 4, K)
            rb.vsilu("d7", "d7")
            rb.vmul("d7", "d7", "d8")
        elif s.prologue == "swiglu":
            self.swiglu_chunked(s, x, ups, g.up_chunk)
        smem(rb, "d2", x, K)
        rb.label(loop)
        def consume(dy, dw, db, wtag, ytag):  # the tile has arrived, dy's last store left
            rb.dmawait(wtag)
            rb.dmawait(ytag)
            tile(dy, dw, db, ytag)
            rb.addi("r3", "r3", -1)

        if not self.double_buffer:  # one buffer: every tile's transfer, then its mv
            fetch("d0", "d5", 0)
            consume("d3", "d0", "d5", 0, 2)
            rb.bne("r3", ZR, loop)
            rb.label(done)
            for tag in (2, 4):
                rb.dmawait(tag)
            return
        prefetch("d1", "d6", 1)
        consume("d3", "d0", "d5", 0, 2)
        rb.beq("r3", ZR, done)
        prefetch("d0", "d5", 0)
        consume("d4", "d1", "d6", 1, 3)
        rb.bne("r3", ZR, loop)
        rb.label(done)
        for tag in (2, 3, 4):
            rb.dmawait(tag)

    def emit_gemv_batch(self, s: Stage) -> None:
        """A gemv of B sequences: each of this core's tiles (t = X, X + C, ...) is read from
        HBM once and multiplied by the B activations with `mma` (its (tr x kc) block times
        the (kc x B) activations into the tile's (tr x B) accumulator). When B activations of
        K floats do not fit SRAM beside two blocks, K is taken kc columns at a time: that
        chunk of every sequence's activation is loaded, then the kc columns of each of the
        core's tiles (contiguous in a column-major tile), double-buffered; the accumulators of
        all the core's tiles stay in SRAM until the last chunk, so every weight byte still
        crosses once a step. Then bias, activation and the B rows of y are stored tile by
        tile."""
        rb, L, C, B, A = self.rb, self.labels, self.C, self.B, self.arena
        g, wd, wb = self.layout.gemv[s.id], self.dtype, self.wb
        K, tr = s.in_len, g.tr
        swiglu = s.prologue == "swiglu"
        (fin,) = s.in_flows
        mt = -(-g.nt // C)  # the most tiles a core has
        acc = A.take(mt * tr * B * 4)
        bias = A.take(tr * 4) if g.bias else None
        free = self.machine.sram_bytes - A.top - 4 * 64
        per_col = 2 * tr * wb + B * 4 * (2 if swiglu else 1)  # two blocks, x (and up)
        fits = [d for d in _divisors(K) if d * per_col <= free and d < 2 ** 15]
        if not fits:
            raise CompileError(f"stage '{s.name}': the accumulators of {B} sequences "
                               f"({mt * tr * B * 4} bytes) leave no room for a column of "
                               f"weights and activations in a core's SRAM on machine "
                               f"'{self.machine.name}': use fewer sequences")
        kc = max(fits)
        self.chunks[s.id] = kc
        sub = tr * kc * wb  # bytes of a tile's chunk
        x = A.take(B * kc * 4)
        up = A.take(B * kc * 4) if swiglu else None
        wa, wbuf = A.take(sub), A.take(sub)
        step = C * g.tile_bytes
        idle = L("gemv_idle")
        rb.li("r7", g.nt // C)  # r7: this core's tiles
        if g.nt % C:
            more = L("more")
            rb.li("r1", g.nt % C)
            rb.bge("X", "r1", more)
            rb.addi("r7", "r7", 1)
            rb.label(more)
        rb.beq("r7", ZR, idle)
        smem(rb, "d3", acc, mt * tr * B)
        rb.vfill("d3", ZF)
        rb.li("r9", 0)  # r9: the chunk's first column k0, as bytes of an activation (k0 * 4)
        rb.li("r8", 0)  # r8: its offset in a tile (k0 * tr * wb)
        top, end = L("chunk"), L("chunk_end")
        rb.label(top)
        for b in range(B):  # the chunk of every sequence's activation (tag 4)
            self.seq = b
            self.hbm("r0", s, self.flow(fin))
            rb.add("r0", "r0", "r9")
            smem(rb, "d2", x + b * kc * 4, kc)
            rb.dmald("d2", "r0", 4)
            if swiglu:  # up follows gate in a sequence's row of the flow
                rb.addi("r0", "r0", K * 4)
                smem(rb, "d2", up + b * kc * 4, kc)
                rb.dmald("d2", "r0", 4)
        self.seq = 0
        self.hbm("r1", s, g.tiles)  # r1: this core's next tile's chunk
        rb.muli("r2", "X", g.tile_bytes)
        rb.add("r1", "r1", "r2")
        rb.add("r1", "r1", "r8")
        rb.addi("r3", "r7", 0)  # r3: tiles left in this chunk
        rb.li("r2", 0)  # r2: byte offset of the tile's accumulator
        smem(rb, "d0", wa, tr, wd)
        rb.d2d("d0", kc, tr)  # (tr, kc) column-major
        smem(rb, "d1", wbuf, tr, wd)
        rb.d2d("d1", kc, tr)

        def fetch(dw, tag):
            rb.dmald(dw, "r1", tag)
            rb.addi("r1", "r1", step)

        def prefetch(dw, tag):  # the tile after this one, if this core has one
            skip = L("no_prefetch")
            rb.li("r6", 1)
            rb.bge("r6", "r3", skip)
            fetch(dw, tag)
            rb.label(skip)

        def consume(dw, tag):
            rb.dmawait(tag)
            rb.daddr("d3", "r2", acc)
            rb.mma("d3", dw, "d2")
            rb.addi("r2", "r2", tr * B * 4)
            rb.addi("r3", "r3", -1)

        fetch("d0", 0)
        rb.dmawait(4)
        if swiglu:  # x = silu(gate) * up, every sequence's chunk at once
            smem(rb, "d7", x, B * kc)
            smem(rb, "d8", up, B * kc)
            rb.vsilu("d7", "d7")
            rb.vmul("d7", "d7", "d8")
        smem(rb, "d2", x, kc)
        rb.d2d("d2", B, kc)  # (kc, B): a sequence a column
        smem(rb, "d3", acc, tr)
        rb.d2d("d3", B, tr)  # (tr, B)
        loop = L("tiles")
        rb.label(loop)
        prefetch("d1", 1)
        consume("d0", 0)
        rb.beq("r3", ZR, end)
        prefetch("d0", 0)
        consume("d1", 1)
        rb.bne("r3", ZR, loop)
        rb.label(end)
        rb.addi("r9", "r9", kc * 4)
        rb.addi("r8", "r8", sub)
        rb.li("r0", K * 4)
        rb.blt("r9", "r0", top)
        # bias, activation, and each sequence's piece of y into its row of every destination
        rows = []  # (Ha of sequence 0's row, bytes from a sequence's row to the next)
        rows += [(Ha(self.layout.flows[f]), self.layout.flow_stride[f]) for f in s.out_flows]
        rows += [(Ha(self.layout.outputs[name]), int(np.prod(self.symbols[name][1:])) * 4)
                 for name, _ in s.outputs]
        if s.id in self.layout.local_out:
            _, vg, _ = self.tp.vocab[s.id]
            rows.append((Ha(self.layout.local_out[s.id]), self.tp_span(vg, True) * 4))
        rb.addi("r3", "r7", 0)
        rb.li("r2", 0)
        rb.muli("r6", "X", tr * 4)  # r6: byte offset of the tile's piece in a row
        if g.bias:
            self.hbm("r5", s, g.bias)
            rb.add("r5", "r5", "r6")
        ep = L("epilogue")
        rb.label(ep)
        if g.bias:
            smem(rb, "d5", bias, tr)
            rb.dmald("d5", "r5", 0)
            rb.addi("r5", "r5", C * tr * 4)
            rb.dmawait(0)
            for b in range(B):
                smem(rb, "d4", acc, tr)
                rb.daddr("d4", "r2", acc + b * tr * 4)
                rb.vadd("d4", "d4", "d5")
        act = {"gelu_tanh": rb.vgelu, "gelu_erf": rb.vgelue, "silu": rb.vsilu}
        if s.activation:
            smem(rb, "d4", acc, tr * B)
            rb.daddr("d4", "r2", acc)
            act[s.activation]("d4", "d4")
        for ha, stride in rows:
            for b in range(B):
                self.hbm("r4", s, Ha(ha.off + b * stride, ha.layer))
                rb.add("r4", "r4", "r6")
                smem(rb, "d4", acc, tr)
                rb.daddr("d4", "r2", acc + b * tr * 4)
                rb.dmast("d4", "r4", 2)
        rb.addi("r6", "r6", C * tr * 4)
        rb.addi("r2", "r2", tr * B * 4)
        rb.addi("r3", "r3", -1)
        rb.bne("r3", ZR, ep)
        rb.dmawait(2)
        rb.label(idle)

    def swiglu_chunked(self, s: Stage, x: int, ups: list[int], U: int) -> None:
        """x = silu(gate) * up with up streamed in U-float chunks through two buffers (tags 5
        and 6: chunk c + 1 in flight while chunk c is used), for SRAM that cannot hold both
        halves beside the weight tiles (A100's 164 KB at Llama-3-8B's 14336)."""
        rb, K = self.rb, s.in_len
        flow = self.layout.flows[s.in_flows[0]] + K * 4  # up follows gate in the flow
        chunks = [(c, min(U, K - c)) for c in range(0, K, U)]

        def load(i):
            c, n = chunks[i]
            self.hbm_abs("r0", flow + c * 4)
            smem(rb, "d8", ups[i % 2], n)
            rb.dmald("d8", "r0", 5 + i % 2)
        load(0)
        for i, (c, n) in enumerate(chunks):
            if i + 1 < len(chunks):
                load(i + 1)
            rb.dmawait(5 + i % 2)
            smem(rb, "d7", x + c * 4, n)
            smem(rb, "d8", ups[i % 2], n)
            rb.vsilu("d7", "d7")
            rb.vmul("d7", "d7", "d8")

    def emit_vector(self, s: Stage) -> None:
        """Residual adds and norms on core 0: load the flows and norm weights, compute as the
        mesh does, store what later stages read."""
        rb, A, wd = self.rb, self.arena, self.dtype
        skip = self.labels("not_core0")
        self.skip_idle(skip)
        n = s.attrs["hidden"]
        bufs = {name: A.take(length * 4) for name, length in s.buffers.items()}
        params = {w: A.take(n * self.wb) for w in self.layout.params[s.id]}
        for fid in s.in_flows:
            f = self.plan.flows[fid]
            self.hbm("r0", s, self.flow(fid))
            smem(rb, "d1", bufs[s.flow_buffer[fid]], f.length)
            rb.dmald("d1", "r0", 0)
        for w, ha in self.layout.params[s.id].items():
            self.hbm("r0", s, ha)
            smem(rb, "d1", params[w], n, wd)
            rb.dmald("d1", "r0", 0)
        rb.dmawait(0)
        for kind, dst, srcs, attrs in s.ops:
            length = s.buffers[dst]
            if kind == "add":
                smem(rb, "d1", bufs[dst], length)
                smem(rb, "d2", bufs[srcs[0]], length)
                smem(rb, "d3", bufs[srcs[1]], length)
                rb.vadd("d1", "d2", "d3")
            else:
                norm_code(rb, kind, bufs[dst], bufs[srcs[0]], length, None, attrs, params, wd,
                          mem=smem)
        stores = [(self.flow(fid), s.send_buffer[fid]) for fid in s.out_flows]
        stores += [(Ha(self.layout.outputs[name], seq=self.out_row(name)), buf)
                   for name, buf in s.outputs]
        for ha, buf in stores:
            self.hbm("r0", s, ha)
            smem(rb, "d1", bufs[buf], s.buffers[buf])
            rb.dmast("d1", "r0", 1)
        rb.dmawait(1)
        rb.label(skip)

    def emit_embed(self, s: Stage) -> None:
        """Core 0 gathers the token's (and position's) row of every table and sums them."""
        rb, A, wd = self.rb, self.arena, self.dtype
        skip = self.labels("not_core0")
        self.skip_idle(skip)
        n = s.attrs["hidden"]
        acc = A.take(n * 4)
        rows = [A.take(n * self.wb) for _ in s.tables]
        for (_, _, index), ha, row in zip(s.tables, self.layout.tables[s.id], rows):
            if index is None:  # a constant row (BERT's token type 0)
                rb.li("r1", 0)
            else:
                self.load_io("r1", index)
            self.hbm("r0", s, ha)
            rb.muli("r1", "r1", n * self.wb)
            rb.add("r0", "r0", "r1")
            smem(rb, "d1", row, n, wd)
            rb.dmald("d1", "r0", 0)
        rb.dmawait(0)
        smem(rb, "d1", acc, n)
        smem(rb, "d2", rows[0], n, wd)
        rb.vmov("d1", "d2")
        for row in rows[1:]:
            smem(rb, "d2", row, n, wd)
            rb.vadd("d1", "d1", "d2")
        for fid in s.out_flows:
            self.hbm("r0", s, self.flow(fid))
            rb.dmast("d1", "r0", 1)
        rb.dmawait(1)
        rb.label(skip)


def compile_hbm(plan: Plan, machine, dtype: str, shape_only: bool, base_dir, name: str,
                double_buffer: bool = True, sequences: int = 1, prefill: bool = False):
    """(Program, CompileReport) of `plan` for an HBM machine (module docstring); sequences
    = B: a batched step of B independent sequences, or (prefill) of B consecutive positions
    of one sequence, one KV cache."""
    return HbmCompiler(plan, machine, dtype, shape_only, base_dir, name,
                       double_buffer, sequences, prefill).compile()


def format_hbm(program, report) -> str:
    """The kernel's HBM layout in a few lines (the `placement` dump of the HBM target)."""
    lines = [f"HBM: {report.hbm_bytes} bytes, weights {report.weight_hbm_bytes}"]
    for a in program.hbm_allocs[:12]:
        lines.append(f"  {a.name:<32} at {a.addr:>14} {a.nbytes:>14} B")
    if len(program.hbm_allocs) > 12:
        lines.append(f"  ... {len(program.hbm_allocs) - 12} more buffers")
    return "\n".join(lines)

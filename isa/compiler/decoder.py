"""The decode mapping's view of a model: its layers as named parts, and the grid geometry.

`extract` reads the stage chain of `lower` (one position a run) into a `Decoder`: the
embedding tables, per layer the two norms, the fused q/k/v product, the attention's
attributes, the output projection, the MLP's products, then the final norm and the LM head.
A graph that is not a GPT-2- or Llama-style decoder raises NotADecoder (the pipeline then
uses the stage-chain mapping).

`Geometry` is the layout of one layer on an R x C grid of PEs (R rows, C columns;
docs/compiler.md, "Layouts"):

- the residual x (length d) in blocks of K = ceil(d / R) along the rows: row i holds
  x[i K:(i+1) K], every PE of the row the same block (replicated along the row): layout R;
- q, k, v after their fused allreduce along the columns: column j holds, for KV head
  g = j // s (s = C / kv_heads columns a KV head, its segment), the head-dim slice D_j = two
  runs of h2 dims, pairs {b .. b + h2 - 1} and the same + head_dim / 2, of k, of v and of the
  `group` query heads that read KV head g: layout C. RoPE rotates dim t with dim t +
  head_dim / 2, so each column rotates its own slice. Where s does not divide the head's
  head_dim / 2 RoPE pairs, either every column holds ceil(pairs / s) of them (the head dims
  padded with zeros) or, balanced, the first `heavy` columns of a segment hold one pair more
  than the others (h2 = lo + 1 against lo): two column classes, no head dim padded;
- the KV cache of the layer on the same grid: column j the dims D_j of KV head g, row i the
  positions p with p mod R == i (slot p // R), so appending a token keeps every row's share
  of positions within one of the others';
- the MLP's hidden vector in blocks of F along the columns (layout C); with two column classes
  a light column takes more hidden units than a heavy one (Geometry.Fs), so that both hold
  about as many bytes: the heavy columns' blocks first, then the light ones'.

A grid with two column classes is emitted as one region a class and segment (a strip of the
grid), each with its class's sizes (`Geometry.variants`: part 0 heavy, part 1 light); the code
is otherwise the grid's. Where a side does not divide its dimension, the dimension is padded
with zeros (Geometry.dp, fp, hdp): padded weights are zero, so padded activations stay zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from wse_emu.isa.compiler.lower import Matrix, Plan


class NotADecoder(ValueError):
    """The plan is not a one-position decoder the wafer-wide mapping handles."""


@dataclass
class Norm:
    kind: str  # "rmsnorm" | "layernorm"
    params: list  # weight names (gain, and bias for layernorm)
    eps: float


@dataclass
class Layer:
    index: int
    norm1: Norm
    qkv: list  # [q, k, v] Matrix
    attn: dict  # the attention stage's attributes (heads, head_dim, rope, scale, ...)
    o: Matrix
    norm2: Norm
    mlp1: list  # [up] or [gate, up] Matrix
    activation: str  # "" | "gelu_tanh" | "gelu_erf" | "silu" (on up, GPT-2)
    swiglu: bool  # silu(gate) * up (Llama)
    down: Matrix


@dataclass
class Decoder:
    plan: Plan
    family: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_context: int
    tables: list  # [(weight name, WeightRef, index symbol)]: token, then position table
    layers: list = field(default_factory=list)
    final_norm: Norm | None = None
    head: Matrix | None = None
    rope_theta: float | None = None
    # a prefill program (compile --prefill B): a run's B slots are consecutive positions of
    # one sequence, so a layer holds one KV cache that every slot appends to and reads
    one_cache: bool = False

    def kept(self, seqs: int) -> int:
        """KV caches a layer holds, and rows of logits the head keeps, with seqs slots a run:
        one each in a prefill program, else one a sequence."""
        return 1 if self.one_cache else seqs


def _norm_of(stage) -> Norm:
    norms = [op for op in stage.ops if op[0] in ("rmsnorm", "layernorm")]
    if len(norms) != 1:
        raise NotADecoder(f"stage '{stage.name}' does not hold exactly one norm")
    op = norms[0]
    return Norm(op[0], list(op[3]["params"]), float(op[3]["eps"]))


def extract(plan: Plan) -> Decoder:
    """The Decoder of a lowered one-position plan (NotADecoder when it is not one)."""
    if plan.T != 1 or "logits" not in plan.symbols:
        raise NotADecoder("the wafer-wide mapping compiles decode steps (one position a run)")
    cfg = plan.graph.config
    st = plan.stages
    if not st or st[0].kind != "embed":
        raise NotADecoder("a decoder starts with its embeddings")
    dec = Decoder(plan, cfg.family, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim,
                  cfg.intermediate, cfg.vocab, cfg.max_context, list(st[0].tables))
    pattern = ["vector", "gemv", "attn", "gemv", "vector", "gemv", "gemv"]
    k = 1
    for layer in range(cfg.layers):
        kinds = [s.kind for s in st[k:k + 7]]
        if kinds != pattern:
            raise NotADecoder(f"layer {layer} is not norm, q/k/v, attention, o, norm, MLP")
        v1, qkv, attn, o, v2, m1, down = st[k:k + 7]
        if len(qkv.matrices) != 3 or len(o.matrices) != 1 or len(down.matrices) != 1:
            raise NotADecoder(f"layer {layer}: unexpected products")
        swiglu = down.prologue == "swiglu"
        if swiglu != (len(m1.matrices) == 2) or (not swiglu and len(m1.matrices) != 1):
            raise NotADecoder(f"layer {layer}: unexpected MLP")
        a = attn.attrs
        if not a.get("causal", True):
            raise NotADecoder("bidirectional attention runs on the stage-chain mapping")
        dec.layers.append(Layer(layer, _norm_of(v1), list(qkv.matrices), dict(a),
                                o.matrices[0], _norm_of(v2), list(m1.matrices), m1.activation,
                                swiglu, down.matrices[0]))
        if a.get("rope_q"):
            dec.rope_theta = float(a["rope_q"][1])
        k += 7
    if [s.kind for s in st[k:]] != ["vector", "gemv"]:
        raise NotADecoder("a decoder ends with its final norm and LM head")
    dec.final_norm = _norm_of(st[k])
    if len(st[k + 1].matrices) != 1:
        raise NotADecoder("unexpected LM head")
    dec.head = st[k + 1].matrices[0]
    if len(dec.tables) not in (1, 2) or any(t[2] is None for t in dec.tables):
        raise NotADecoder("a decoder's embeddings are a token table and maybe a position table")
    return dec


@dataclass(frozen=True)
class Geometry:
    """One layer on an R x C grid (R rows, C columns; module docstring); every size in
    elements. A side that does not divide its dimension pads it with zeros: the residual to
    R K elements, the MLP's hidden vector to fp, each head's two halves to s h2 dims (whole
    RoPE pairs a column), the context to R S positions; padded weights and activations are
    zero, so that no padded element changes a result, and norms divide by the true d.
    `balanced` pads no head dim where s does not divide a head's RoPE pairs: the grid has two
    column classes, and `part` picks a class's sizes (0 heavy, 1 light; -1 the whole grid,
    whose sizes are the larger of the two, what a buffer sized for every column needs).
    `hp` splits the attention's scores into passes of that many query heads and `forms` fixes
    the line allreduces' forms. The compiler takes the fastest of these layouts (wafer.layouts)
    that fits a PE's SRAM: two column classes hold fewer weight bytes a PE, more passes need
    less scratch, the chain form less code."""

    R: int  # grid rows (the residual's blocks, the cache's position classes)
    C: int  # grid columns (kv_heads x s: the heads' dims, the MLP's blocks)
    d: int  # hidden
    hd: int  # head dim
    heads: int
    kv: int  # KV heads
    f: int  # intermediate
    ctx: int  # max_context
    swiglu: bool
    part: int = -1  # -1 the whole grid, 0 its heavy columns, 1 its light ones
    balanced: bool = False  # two column classes where s does not divide the RoPE pairs
    hp: int = 0  # query heads a pass of the attention's scores (0: a KV head's all at once)
    forms: tuple = ()  # the (column, row) line allreduces' forms (): the fastest (wafer)

    @property
    def square(self) -> bool:
        return self.R == self.C

    @property
    def label(self):
        """The grid as the compile option and the program's metadata name it: the side n of
        an n x n grid, "RxC" otherwise."""
        return self.R if self.square else f"{self.R}x{self.C}"

    @property
    def K(self) -> int:  # residual block a row (layout R)
        return -(-self.d // self.R)

    @property
    def s(self) -> int:  # columns a KV head (a segment)
        return self.C // self.kv

    @property
    def lo(self) -> int:  # RoPE pairs of a light column
        return (self.hd // 2) // self.s

    @property
    def heavy(self) -> int:  # two column classes: the columns a segment with one pair more
        return (self.hd // 2) % self.s if self.balanced else 0

    @property
    def split(self) -> bool:  # two column classes
        return self.heavy > 0

    @property
    def variants(self) -> list:
        """The grid's column classes, each a Geometry with its sizes: [heavy, light], or
        [self] where every column is alike."""
        return [replace(self, part=0), replace(self, part=1)] if self.split else [self]

    @property
    def n(self) -> int:  # columns of this class a segment
        return {0: self.heavy, 1: self.s - self.heavy}.get(self.part, self.s)

    @property
    def first(self) -> int:  # this class's first column in its segment
        return self.heavy if self.part == 1 else 0

    @property
    def base(self) -> int:  # this class's first RoPE pair in a head's half
        return self.heavy * (self.lo + 1) if self.part == 1 else 0

    @property
    def h2(self) -> int:  # one half-run of a column's head dims (RoPE pairs)
        return self.lo + ((self.hd // 2) % self.s > 0 and self.part != 1)

    @property
    def D(self) -> int:  # head dims a column
        return 2 * self.h2

    @property
    def group(self) -> int:  # query heads a KV head
        return self.heads // self.kv

    @property
    def hpass(self) -> int:  # query heads a pass of the scores (map_attention.attend)
        return self.hp or self.group

    @property
    def passes(self) -> int:
        return self.group // self.hpass

    @property
    def Mq(self) -> int:  # query (and attention output) elements a column
        return self.group * self.D

    @property
    def Mqkv(self) -> int:
        return self.Mq + 2 * self.D

    @property
    def Fs(self) -> tuple[int, int]:
        """(heavy, light) MLP hidden block a column. A heavy column holds 2 K (2 group + 2)
        weight elements more of q/k/v and o, 4 S more of its K and V caches and 6 group + 4
        fp32 values more in its q/k/v, o and l buffers (2 (6 group + 4) elements of 16-bit
        weights); a light column takes that many elements more of the MLP, in whole hidden
        units (3 K elements a unit with a gate, 2 without), the heavy columns' blocks as
        small as the total allows."""
        if not self.split:
            F = -(-self.f // self.C)
            return F, F
        K, g, light = self.K, self.group, self.kv * (self.s - self.heavy)
        unit = (3 if self.swiglu else 2) * K
        more = round((2 * K * (2 * g + 2) + 4 * self.S + 2 * (6 * g + 4)) / unit)
        Fh = max(1, -(-(self.f - light * more) // self.C))
        return Fh, max(1, -(-(self.f - self.kv * self.heavy * Fh) // light))

    @property
    def F(self) -> int:  # MLP hidden block a column of this class
        Fh, Fl = self.Fs
        return {0: Fh, 1: Fl}.get(self.part, max(Fh, Fl))

    @property
    def f0(self) -> int:  # this class's first hidden unit (the heavy columns' blocks first)
        return self.kv * self.heavy * self.Fs[0] if self.part == 1 else 0

    @property
    def M1(self) -> int:  # first MLP product's rows a column (gate and up, or up)
        return 2 * self.F if self.swiglu else self.F

    @property
    def S(self) -> int:  # KV cache slots a PE
        return -(-self.ctx // self.R)

    # the padded sizes (equal to the true ones where a side divides)
    @property
    def dp(self) -> int:  # the residual, padded
        return self.R * self.K

    @property
    def hdp(self) -> int:  # a head's dims, padded (two halves of s h2; none with two classes)
        return self.hd if self.split else 2 * self.s * self.h2

    @property
    def fp(self) -> int:  # the MLP's hidden vector, padded
        Fh, Fl = self.Fs
        return self.kv * (self.heavy * Fh + (self.s - self.heavy) * Fl)

    @property
    def padded(self) -> bool:
        return (self.dp, self.fp, self.hdp) != (self.d, self.f, self.hd)


def grid_shapes(dec: Decoder, rows=None, cols=None) -> list[tuple[int, int]]:
    """Grids (R, C) the layout allows: C = kv_heads x s with 1 <= s <= head_dim / 2 (a column
    holds at least one RoPE pair of every head), 1 <= R <= hidden; rows / cols restrict them
    to the given values. Without restriction only the sides that need no padding (R = C
    divides d and f, s divides head_dim / 2): `candidates` lists the rectangles."""
    half = dec.head_dim // 2
    if dec.head_dim % 2:
        return []
    if rows is None and cols is None:
        out = []
        for s in range(1, half + 1):
            n = s * dec.kv_heads
            if half % s == 0 and dec.hidden % n == 0 and dec.intermediate % n == 0:
                out.append((n, n))
        return out
    rows = [r for r in rows if 1 <= r <= dec.hidden]
    cols = [c for c in cols if c % dec.kv_heads == 0 and 1 <= c // dec.kv_heads <= half]
    return [(r, c) for r in rows for c in cols]


def grid_sides(dec: Decoder) -> list[int]:
    """Square sides n that need no padding (n divides d and f, n / kv_heads divides
    head_dim / 2)."""
    return [r for r, _ in grid_shapes(dec)]


def geometry(dec: Decoder, grid, ctx: int | None = None) -> Geometry:
    """The Geometry of grid (R, C) (or the side n of a square)."""
    R, C = (grid, grid) if isinstance(grid, int) else grid
    return Geometry(R, C, dec.hidden, dec.head_dim, dec.heads, dec.kv_heads, dec.intermediate,
                    ctx or dec.max_context, dec.layers[0].swiglu)


def divisors(v: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(v) + 1) if v % k == 0]
    return sorted(set(small + [v // k for k in small]))

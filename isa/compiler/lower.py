"""Lowering: a decode-step layer graph -> a chain of mesh stages (the compiler's own small IR).

A stage is a unit of the mesh mapping (docs/compiler.md):

  embed   gathers rows of the embedding tables for input_ids / position_ids and sums them;
  vector  residual adds and norms on a vector held by one PE (it keeps the residual stream);
  gemv    one or more weight matrices that read the same input, stacked by rows (fused QKV,
          gate+up), with an optional prologue (SwiGLU of its input) and epilogue (bias, GELU);
  attn    RoPE, the KV cache append and the attention of every head, one PE per KV head.

Every value that crosses stages becomes a Flow from its producer to its consumer. A gemv or
attn stage sends its whole result, in order, as one stream; the consumer keeps the slices it
needs. Lowering is by pattern over the graph's op groups; a graph it cannot map is refused with
one line naming the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wse_emu.isa.graph import Graph, Node, Op, WeightRef


class CompileError(ValueError):
    """The model cannot be compiled for the machine; the message is one line."""


@dataclass
class Flow:
    """`length` fp32 elements a position, sent from stage `src` to stage `dst` each run; with
    T positions the stream is T such vectors in position order."""

    id: int
    src: int
    dst: int
    length: int
    what: str  # label, for the report
    color: int = -1  # set by routing


@dataclass
class Matrix:
    """One weight matrix of a gemv stage: logical (out, in) = W, y = W x (+ bias)."""

    weight: str  # graph weight name
    ref: WeightRef
    out: int
    bias: str | None = None
    bias_ref: WeightRef | None = None


@dataclass
class Stage:
    id: int
    kind: str  # "embed" | "vector" | "gemv" | "attn"
    name: str
    layer: int  # transformer layer (-1 before the first, layers after the last)
    in_flows: list[int] = field(default_factory=list)
    out_flows: list[int] = field(default_factory=list)
    # embed: [(weight name, ref, index input name or None for a constant row)]
    tables: list = field(default_factory=list)
    # vector: ops over named local buffers, [(op, dst, srcs, attrs)]; buffers fed by flows
    ops: list = field(default_factory=list)
    buffers: dict = field(default_factory=dict)  # buffer name -> length
    flow_buffer: dict = field(default_factory=dict)  # in flow id -> buffer name
    send_buffer: dict = field(default_factory=dict)  # out flow id -> buffer name
    # gemv
    matrices: list[Matrix] = field(default_factory=list)
    in_len: int = 0
    prologue: str = ""  # "" | "swiglu"
    activation: str = ""  # "" | "gelu_tanh" | "gelu_erf" | "silu"
    # attn
    attrs: dict = field(default_factory=dict)
    # outputs read by the host: (symbol name, buffer / "y")
    outputs: list = field(default_factory=list)

    @property
    def out_len(self) -> int:
        if self.kind == "gemv":
            return sum(m.out for m in self.matrices)
        if self.kind == "attn":
            return self.attrs["n_heads"] * self.attrs["head_dim"]
        return self.attrs.get("hidden", 0)


@dataclass
class Plan:
    graph: Graph
    stages: list[Stage]
    flows: list[Flow]
    symbols: dict  # input / output name -> shape
    T: int  # positions one run processes (1 for decode)


def _fail(node: Node, why: str):
    label = f" '{node.name}'" if node.name else ""
    raise CompileError(f"node %{node.id}{label} ({node.op.name}): {why}")


def _layer_of(name: str, default: int) -> int:
    parts = name.split(".")
    if len(parts) > 1 and parts[0] == "layers" and parts[1].isdigit():
        return int(parts[1])
    return default


_ACTIVATIONS = {Op.GELU_TANH: "gelu_tanh", Op.GELU_ERF: "gelu_erf", Op.SILU: "silu"}


class _Lowering:
    def __init__(self, graph: Graph):
        self.g = graph
        self.T = graph.inputs[0].shape[0]
        if not isinstance(self.T, int):
            raise CompileError("the graph must be bound to a number of positions first")
        self.stages: list[Stage] = []
        self.flows: list[Flow] = []
        # node id -> ("embed"|"vec", stage, buffer) or ("gemv", stage, offset, length, rope)
        self.where: dict[int, tuple] = {}
        self.layer = -1
        self.consumers: dict[int, list[int]] = {}
        for n in graph.nodes:
            for j in n.inputs:
                self.consumers.setdefault(j, []).append(n.id)

    def stage(self, kind: str, name: str) -> Stage:
        s = Stage(len(self.stages), kind, name, self.layer)
        self.stages.append(s)
        return s

    def flow(self, src: Stage, dst: Stage, length: int, what: str) -> Flow:
        f = Flow(len(self.flows), src.id, dst.id, length, what)
        self.flows.append(f)
        src.out_flows.append(f.id)
        dst.in_flows.append(f.id)
        return f

    def weight(self, node_id: int) -> tuple[str, WeightRef]:
        n = self.g.nodes[node_id]
        if n.op is not Op.WEIGHT:
            _fail(n, "expected a weight")
        return n.name, self.g.weights[n.name]

    def run(self) -> Plan:
        symbols = {}
        for n in self.g.nodes:
            if n.op is not Op.INPUT:
                # nodes after the last layer (final norm, LM head) count as layer `layers`
                after = self.g.config.layers if self.layer >= 0 else -1
                self.layer = _layer_of(n.name, after)
            if n.op is Op.INPUT:
                if n.dtype != "i32" or n.name not in ("input_ids", "position_ids"):
                    _fail(n, "only input_ids and position_ids inputs are supported")
                symbols[n.name] = (self.T,)
            elif n.op is Op.WEIGHT:
                continue
            elif n.op in (Op.EMBEDDING, Op.POS_EMBEDDING):
                self.embedding(n)
            elif n.op is Op.ADD:
                self.add(n)
            elif n.op in (Op.LAYERNORM, Op.RMSNORM):
                self.norm(n)
            elif n.op in (Op.MATMUL, Op.LM_HEAD):
                self.matmul(n)
            elif n.op in _ACTIVATIONS:
                self.activation(n)
            elif n.op is Op.SWIGLU:
                self.swiglu(n)
            elif n.op is Op.ROPE:
                self.rope(n)
            elif n.op is Op.ATTENTION:
                self.attention(n)
            elif n.op is Op.OUTPUT:
                self.output(n)
                symbols[n.name] = (self.T, n.shape[-1])
            else:
                _fail(n, "this op is not supported by the mesh mapping yet")
        return Plan(self.g, self.stages, self.flows, symbols, self.T)

    # -- embed ----------------------------------------------------------------------------------

    def embedding(self, n: Node) -> None:
        ids = self.g.nodes[n.inputs[0]]
        name, ref = self.weight(n.inputs[1])
        s = self.stages[-1] if self.stages and self.stages[-1].kind == "embed" else None
        if s is None:
            s = self.stage("embed", "embed")
            s.attrs["hidden"] = n.shape[-1]
        s.tables.append((name, ref, ids.name))
        self.where[n.id] = ("embed", s)

    # -- vector stages --------------------------------------------------------------------------

    def vector_stage(self) -> Stage:
        last = self.stages[-1] if self.stages else None
        if last is not None and last.kind == "vector":
            return last
        s = self.stage("vector", f"layers.{self.layer}.vector" if self.layer >= 0 else "vector")
        s.attrs["hidden"] = 0
        return s

    def operand(self, s: Stage, node_id: int, length: int) -> str:
        """The local buffer of stage s that holds node node_id's value (a flow if needed)."""
        w = self.where.get(node_id)
        if w is None:
            _fail(self.g.nodes[node_id], "its value cannot feed a vector stage")
        if w[0] == "vec" and w[1] is s:
            return w[2]
        if w[0] == "vec":  # a residual from an earlier vector stage
            src, buf = w[1], w[2]
            f = self.flow(src, s, length, f"{self.g.nodes[node_id].name or 'residual'}")
            src.send_buffer[f.id] = buf
        else:  # the whole stream of an embed / gemv / attn stage
            src = w[1]
            if w[0] == "gemv" and (w[2] != 0 or w[3] != src.out_len):
                _fail(self.g.nodes[node_id], "a vector stage needs the whole gemv result")
            f = self.flow(src, s, length, self.g.nodes[node_id].name or src.name)
        buf = f"in{f.id}"
        s.buffers[buf] = length
        s.flow_buffer[f.id] = buf
        # later uses (the residual) read this copy rather than asking the producer again
        self.where[node_id] = ("vec", s, buf)
        return buf

    def add(self, n: Node) -> None:
        a, b = (self.where.get(j, ("leaf",)) for j in n.inputs)
        if a[0] == "embed" and b[0] == "embed" and a[1] is b[1]:
            self.where[n.id] = a
            return
        consts = [j for j in n.inputs if self.g.nodes[j].op is Op.WEIGHT]
        if consts and a[0] == "embed":  # BERT's token-type row: a one-row table, index 0
            name, ref = self.weight(consts[0])
            a[1].tables.append((name, ref, None))
            self.where[n.id] = a
            return
        if consts:
            _fail(n, "adding a constant vector is only supported in the embeddings")
        length = n.shape[-1]
        s = self.vector_stage()
        srcs = [self.operand(s, j, length) for j in n.inputs]
        dst = f"v{n.id}"
        s.buffers[dst] = length
        s.ops.append(("add", dst, srcs, {}))
        s.attrs["hidden"] = length
        self.where[n.id] = ("vec", s, dst)

    def norm(self, n: Node) -> None:
        length = n.shape[-1]
        s = self.vector_stage()
        src = self.operand(s, n.inputs[0], length)
        params = [self.weight(j)[0] for j in n.inputs[1:]]
        dst = f"v{n.id}"
        s.buffers[dst] = length
        op = "layernorm" if n.op is Op.LAYERNORM else "rmsnorm"
        s.ops.append((op, dst, [src], {"params": params, "eps": n.attr("eps")}))
        s.attrs["hidden"] = length
        self.where[n.id] = ("vec", s, dst)

    # -- gemv -----------------------------------------------------------------------------------

    def matmul(self, n: Node) -> None:
        x = n.inputs[0]
        wname, ref = self.weight(n.inputs[1])
        bias = self.weight(n.inputs[2]) if len(n.inputs) > 2 else (None, None)
        last = self.stages[-1] if self.stages else None
        fused = (last is not None and last.kind == "gemv" and last.attrs.get("x") == x
                 and not last.activation and n.op is Op.MATMUL)
        if fused:
            s = last
            # "layers.0.attn.q" + k + v -> "layers.0.attn.q+k+v"
            s.name += "+" + n.name.rsplit(".", 1)[-1]
        else:
            s = self.stage("gemv", n.name)
            s.attrs["x"] = x
            s.in_len = self.g.nodes[x].shape[-1]
            self.feed(s, x, n)
        offset = s.out_len
        s.matrices.append(Matrix(wname, ref, n.shape[-1], *bias))
        self.where[n.id] = ("gemv", s, offset, n.shape[-1], False)

    def feed(self, s: Stage, x: int, n: Node) -> None:
        w = self.where.get(x)
        if w is None:
            _fail(n, "its input is not produced by a stage")
        if w[0] == "swiglu":
            s.prologue = "swiglu"
            f = self.flow(w[1], s, 2 * s.in_len, "gate+up")
        elif w[0] == "vec":
            f = self.flow(w[1], s, s.in_len, self.g.nodes[x].name)
            w[1].send_buffer[f.id] = w[2]
        elif w[0] in ("gemv", "attn") and w[2] == 0 and w[3] == w[1].out_len:
            f = self.flow(w[1], s, s.in_len, self.g.nodes[x].name)
        else:
            _fail(n, "its input must be a whole vector, a SwiGLU or a norm output")
        s.flow_buffer[f.id] = "x"

    def activation(self, n: Node) -> None:
        w = self.where.get(n.inputs[0])
        if w is None or w[0] != "gemv" or len(w[1].matrices) != 1 or w[1].activation:
            _fail(n, "activations are fused into the matmul that produces their input")
        w[1].activation = _ACTIVATIONS[n.op]
        self.where[n.id] = w

    def swiglu(self, n: Node) -> None:
        gate, up = (self.where.get(j) for j in n.inputs)
        ok = (gate and up and gate[0] == up[0] == "gemv" and gate[1] is up[1]
              and gate[2] == 0 and up[2] == gate[3] and len(gate[1].matrices) == 2)
        if not ok:
            _fail(n, "SwiGLU needs gate and up fused in one matmul stage (gate first)")
        self.where[n.id] = ("swiglu", gate[1])

    # -- attention -------------------------------------------------------------------------------

    def rope(self, n: Node) -> None:
        w = self.where.get(n.inputs[0])
        if w is None or w[0] != "gemv":
            _fail(n, "RoPE must apply to a matmul output")
        self.where[n.id] = w[:4] + ((n.attr("head_dim"), n.attr("theta")),)

    def attention(self, n: Node) -> None:
        parts = [self.where.get(j) for j in n.inputs]
        src = parts[0][1] if parts[0] and parts[0][0] == "gemv" else None
        if src is None or any(p is None or p[0] != "gemv" or p[1] is not src for p in parts):
            _fail(n, "q, k and v must come from one fused matmul stage")
        s = self.stage("attn", n.name)
        s.attrs = {k: v for k, v in n.attrs}
        s.attrs.update(q_off=parts[0][2], k_off=parts[1][2], v_off=parts[2][2],
                       rope_q=parts[0][4], rope_k=parts[1][4], in_len=src.out_len)
        if parts[2][4]:
            _fail(n, "RoPE on values is not supported")
        f = self.flow(src, s, src.out_len, "q+k+v")
        s.flow_buffer[f.id] = "x"
        self.where[n.id] = ("attn", s, 0, s.out_len, False)

    def output(self, n: Node) -> None:
        w = self.where.get(n.inputs[0])
        if w and w[0] == "gemv" and w[2] == 0 and w[3] == w[1].out_len:
            w[1].outputs.append((n.name, "y"))
        elif w and w[0] == "vec":
            w[1].outputs.append((n.name, w[2]))
        else:
            _fail(n, "outputs must be a whole matmul result or a vector stage value")


def lower(graph: Graph) -> Plan:
    """The stage chain of a decode step of `graph` (see the module docstring)."""
    return _Lowering(graph).run()

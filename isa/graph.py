"""The layer-graph IR: what front-ends produce and the compiler's passes consume.

A Graph is a tuple of small immutable Nodes in topological order (every input is an earlier
node), a GraphConfig, and the weights it refers to by safetensors file and key (never copied).
Every op has one shape/dtype rule in `RULES`; `GraphBuilder` applies it as nodes are added and
`verify` re-applies all of them, so a pass that produces a bad graph is caught at its boundary.

Conventions (docs/graph.md has the full op table):
- shapes describe ONE step over a batch of positions of one sequence: activations are
  (T, features), where T is the symbolic dimension `T` = positions processed in this step
  (the prompt length at prefill, 1 at decode); `bind_positions` makes it concrete;
- MATMUL weights are (out, in), as in torch.nn.Linear: y = x @ W^T + b. Sources stored
  (in, out), such as GPT-2's Conv1D, are normalised by the WeightRef view (`transpose`);
- ATTENTION owns a KV cache of `max_context` positions; a step appends its T keys/values.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from wse_emu.isa.spec import FLOAT_DTYPES, SYMBOL_DTYPES

T = "T"  # the symbolic number of positions processed in one step
DTYPES = SYMBOL_DTYPES  # a graph value's types: the floats and i32 (isa/spec.py's table)
FORMAT = "wse-emu.graph"
FORMAT_VERSION = 1

Shape = tuple  # of int | T
AttrValue = int | float | bool


class GraphError(ValueError):
    """A malformed graph or a bad use of one; the message is one line naming the node."""


class Op(enum.Enum):
    INPUT = "INPUT"
    WEIGHT = "WEIGHT"
    OUTPUT = "OUTPUT"
    EMBEDDING = "EMBEDDING"
    POS_EMBEDDING = "POS_EMBEDDING"
    MATMUL = "MATMUL"
    LM_HEAD = "LM_HEAD"
    ADD = "ADD"
    MUL = "MUL"
    GELU_TANH = "GELU_TANH"
    GELU_ERF = "GELU_ERF"
    SILU = "SILU"
    SWIGLU = "SWIGLU"
    LAYERNORM = "LAYERNORM"
    RMSNORM = "RMSNORM"
    SOFTMAX = "SOFTMAX"
    ROPE = "ROPE"
    ATTENTION = "ATTENTION"


# Op groups, so that a pass can say "any elementwise op". Every op is in exactly one group.
LEAVES = frozenset({Op.INPUT, Op.WEIGHT})
SINKS = frozenset({Op.OUTPUT})
GATHERS = frozenset({Op.EMBEDDING, Op.POS_EMBEDDING})
MATMULS = frozenset({Op.MATMUL, Op.LM_HEAD})
UNARY = frozenset({Op.GELU_TANH, Op.GELU_ERF, Op.SILU})
BINARY = frozenset({Op.ADD, Op.MUL, Op.SWIGLU})
ELEMENTWISE = UNARY | BINARY
NORMS = frozenset({Op.LAYERNORM, Op.RMSNORM})
ROWWISE = frozenset({Op.SOFTMAX, Op.ROPE})
STATEFUL = frozenset({Op.ATTENTION})  # ops that keep state (a KV cache) across steps
GROUPS = {"leaves": LEAVES, "sinks": SINKS, "gathers": GATHERS, "matmuls": MATMULS,
          "elementwise": ELEMENTWISE, "norms": NORMS, "rowwise": ROWWISE, "stateful": STATEFUL}


@dataclass(frozen=True)
class WeightRef:
    """A weight tensor inside a safetensors file, seen through a view.

    The logical tensor (what MATMUL etc. see, of shape `shape`) is: the stored tensor `key` of
    `file`, transposed if `transpose` (2-D only), then rows [rows[0], rows[1]) of axis 0 if
    `rows`, then reshaped to `shape` (same element count). `dtype` is the stored dtype.
    file and key are None in a shape-only graph.
    """

    shape: tuple[int, ...]
    dtype: str
    file: str | None = None
    key: str | None = None
    transpose: bool = False
    rows: tuple[int, int] | None = None


@dataclass(frozen=True)
class GraphConfig:
    family: str  # "gpt2" | "llama" | "bert"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_context: int  # KV-cache positions of every ATTENTION node
    dtype: str  # the model's dtype as config.json declares it


@dataclass(frozen=True)
class Node:
    id: int  # its index in Graph.nodes
    op: Op
    inputs: tuple[int, ...]
    shape: Shape
    dtype: str
    attrs: tuple[tuple[str, AttrValue], ...] = ()  # sorted by name
    name: str = ""  # symbol or weight name for leaves and outputs; a readable label otherwise

    def attr(self, key: str) -> AttrValue:
        for k, v in self.attrs:
            if k == key:
                return v
        raise GraphError(f"{_where(self)}: no attribute {key!r}")


@dataclass(frozen=True)
class Graph:
    config: GraphConfig
    nodes: tuple[Node, ...]
    weights: Mapping[str, WeightRef] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))

    @property
    def inputs(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.op is Op.INPUT)

    @property
    def outputs(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.op is Op.OUTPUT)

    def __str__(self) -> str:
        return format_graph(self)


# ---------------------------------------------------------------------------------------------
# Shape/dtype rules: one function per op, over the (shape, dtype) of the inputs.

Value = tuple[Shape, str]


@dataclass(frozen=True)
class OpRule:
    arity: tuple[int, ...]  # allowed numbers of inputs
    attrs: Mapping[str, type]  # required attributes and their types (exactly these)
    infer: Callable[[list[Value], dict], Value] | None  # None for leaves (shape is declared)


def _fmt(v: Value) -> str:
    shape, dtype = v
    return f"({', '.join(str(d) for d in shape)}{',' if len(shape) == 1 else ''}) {dtype}"


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise GraphError(msg)


def _float(v: Value, what: str, rank: int | None = None) -> None:
    _need(v[1] in FLOAT_DTYPES, f"{what} must be a float tensor, got {_fmt(v)}")
    if rank is not None:
        _need(len(v[0]) == rank, f"{what} must have rank {rank}, got {_fmt(v)}")


def _positions(v: Value, what: str) -> None:
    _need(v[1] == "i32" and len(v[0]) == 1, f"{what} must be a (T,) i32 vector, got {_fmt(v)}")


def _positive(attrs: dict, *names: str) -> None:
    for n in names:
        _need(attrs[n] > 0, f"attribute {n} must be positive, got {attrs[n]}")


def _gather(ins, attrs):
    ids, table = ins
    _positions(ids, "indices")
    _float(table, "table", rank=2)
    return (ids[0][0], table[0][1]), table[1]


def _matmul(ins, attrs):
    x, w, *bias = ins
    _float(x, "x", rank=2)
    _float(w, "weight", rank=2)
    _need(w[0][1] == x[0][1], f"weight {_fmt(w)} is (out, in) but x {_fmt(x)} has "
                              f"{x[0][1]} features")
    if bias:
        _float(bias[0], "bias", rank=1)
        _need(bias[0][0] == (w[0][0],), f"bias {_fmt(bias[0])} must be ({w[0][0]},)")
    return (x[0][0], w[0][0]), x[1]


def _lm_head(ins, attrs):
    x, table = ins
    _float(x, "x", rank=2)
    _float(table, "embedding", rank=2)
    _need(table[0][1] == x[0][1], f"embedding {_fmt(table)} is (vocab, hidden) but x "
                                  f"{_fmt(x)} has {x[0][1]} features")
    return (x[0][0], table[0][0]), x[1]


def _binary(ins, attrs):
    a, b = ins
    _float(a, "a")
    _float(b, "b")
    _need(b[0] == a[0] or b[0] == a[0][-1:],
          f"b {_fmt(b)} must have the shape of a {_fmt(a)} or of its last axis")
    return a


def _swiglu(ins, attrs):
    gate, up = ins
    _float(gate, "gate")
    _float(up, "up")
    _need(gate[0] == up[0], f"gate {_fmt(gate)} and up {_fmt(up)} differ in shape")
    return gate


def _unary(ins, attrs):
    _float(ins[0], "x")
    return ins[0]


def _norm(ins, attrs):
    x, *params = ins
    _float(x, "x")
    _need(len(x[0]) >= 1, f"x {_fmt(x)} has no axis to normalise")
    for p, what in zip(params, ("weight", "bias")):
        _float(p, what, rank=1)
        _need(p[0] == x[0][-1:], f"{what} {_fmt(p)} must match the last axis of x {_fmt(x)}")
    _positive(attrs, "eps")
    return x


def _softmax(ins, attrs):
    _float(ins[0], "x")
    _need(len(ins[0][0]) >= 1, f"x {_fmt(ins[0])} has no axis to normalise")
    return ins[0]


def _rope(ins, attrs):
    x, pos = ins
    _float(x, "x", rank=2)
    _positions(pos, "positions")
    _need(pos[0][0] == x[0][0], f"positions {_fmt(pos)} and x {_fmt(x)} differ in T")
    _positive(attrs, "head_dim", "theta")
    hd = attrs["head_dim"]
    _need(hd % 2 == 0, f"head_dim {hd} must be even")
    _need(isinstance(x[0][1], int) and x[0][1] % hd == 0,
          f"x {_fmt(x)} is not a whole number of heads of {hd}")
    return x


def _attention(ins, attrs):
    q, k, v = ins
    for val, what in zip(ins, "qkv"):
        _float(val, what, rank=2)
    _positive(attrs, "n_heads", "n_kv_heads", "head_dim", "scale", "max_context")
    nh, nkv, hd = attrs["n_heads"], attrs["n_kv_heads"], attrs["head_dim"]
    _need(nh % nkv == 0, f"n_heads {nh} is not a multiple of n_kv_heads {nkv}")
    _need(q[0][1] == nh * hd, f"q {_fmt(q)} must have n_heads * head_dim = {nh * hd} features")
    for val, what in ((k, "k"), (v, "v")):
        _need(val[0] == (q[0][0], nkv * hd),
              f"{what} {_fmt(val)} must be ({q[0][0]}, n_kv_heads * head_dim = {nkv * hd})")
    return q


def _output(ins, attrs):
    return ins[0]


_NORM_ATTRS = MappingProxyType({"eps": float})
RULES: Mapping[Op, OpRule] = MappingProxyType({
    Op.INPUT: OpRule((0,), {}, None),
    Op.WEIGHT: OpRule((0,), {}, None),
    Op.OUTPUT: OpRule((1,), {}, _output),
    Op.EMBEDDING: OpRule((2,), {}, _gather),
    Op.POS_EMBEDDING: OpRule((2,), {}, _gather),
    Op.MATMUL: OpRule((2, 3), {}, _matmul),
    Op.LM_HEAD: OpRule((2,), {}, _lm_head),
    Op.ADD: OpRule((2,), {}, _binary),
    Op.MUL: OpRule((2,), {}, _binary),
    Op.GELU_TANH: OpRule((1,), {}, _unary),
    Op.GELU_ERF: OpRule((1,), {}, _unary),
    Op.SILU: OpRule((1,), {}, _unary),
    Op.SWIGLU: OpRule((2,), {}, _swiglu),
    Op.LAYERNORM: OpRule((3,), _NORM_ATTRS, _norm),
    Op.RMSNORM: OpRule((2,), _NORM_ATTRS, _norm),
    Op.SOFTMAX: OpRule((1,), {}, _softmax),
    Op.ROPE: OpRule((2,), {"head_dim": int, "theta": float}, _rope),
    Op.ATTENTION: OpRule((3,), {"n_heads": int, "n_kv_heads": int, "head_dim": int,
                                "causal": bool, "scale": float, "max_context": int}, _attention),
})


def _where(node: Node) -> str:
    label = f" '{node.name}'" if node.name else ""
    return f"node %{node.id}{label} ({node.op.name})"


def canonical_attrs(op: Op, attrs: Mapping[str, Any]) -> tuple[tuple[str, AttrValue], ...]:
    """Check attrs against the op's schema and return them sorted, ints widened for floats."""
    schema = RULES[op].attrs
    missing = sorted(set(schema) - set(attrs))
    extra = sorted(set(attrs) - set(schema))
    _need(not missing, f"missing attribute(s) {', '.join(missing)}")
    _need(not extra, f"unknown attribute(s) {', '.join(extra)} (expected: "
                     f"{', '.join(sorted(schema)) or 'none'})")
    out = []
    for name in sorted(attrs):
        kind, value = schema[name], attrs[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        _need(ok, f"attribute {name} must be {kind.__name__}, got {value!r}")
        out.append((name, value))
    return tuple(out)


def _check_shape(shape: Shape, symbolic: bool) -> None:
    _need(isinstance(shape, tuple), f"shape must be a tuple, got {shape!r}")
    for d in shape:
        ok = (isinstance(d, int) and not isinstance(d, bool) and d > 0) or (symbolic and d == T)
        _need(ok, f"shape {shape} has a bad dimension {d!r} (positive ints"
                  f"{' or T' if symbolic else ''})")


def _check_weight_ref(name: str, ref: WeightRef) -> None:
    where = f"weight '{name}'"
    try:
        _check_shape(ref.shape, symbolic=False)
    except GraphError as e:
        raise GraphError(f"{where}: {e}") from None
    _need(ref.dtype in FLOAT_DTYPES, f"{where}: dtype {ref.dtype!r} is not one of {FLOAT_DTYPES}")
    _need((ref.file is None) == (ref.key is None), f"{where}: file and key go together")
    _need(all(v is None or isinstance(v, str) for v in (ref.file, ref.key)),
          f"{where}: file and key must be strings")
    _need(isinstance(ref.transpose, bool), f"{where}: transpose must be a bool")
    if ref.rows is not None:
        ok = (isinstance(ref.rows, tuple) and len(ref.rows) == 2
              and all(isinstance(r, int) and not isinstance(r, bool) for r in ref.rows)
              and 0 <= ref.rows[0] < ref.rows[1])
        _need(ok, f"{where}: bad row range {ref.rows!r}")


def infer(node: Node, in_values: list[Value], weights: Mapping[str, WeightRef]) -> Value:
    """The (shape, dtype) the op's rule gives this node; GraphError (naming it) if it is bad."""
    try:
        rule = RULES[node.op]
        _need(len(node.inputs) in rule.arity,
              f"takes {' or '.join(map(str, rule.arity))} inputs, got {len(node.inputs)}")
        attrs = dict(canonical_attrs(node.op, dict(node.attrs)))
        _need(tuple(sorted(attrs.items())) == node.attrs, "attributes are not in canonical form")
        if node.op in (Op.INPUT, Op.WEIGHT, Op.OUTPUT):
            _need(isinstance(node.name, str) and bool(node.name),
                  f"an {node.op.name.lower()} needs a name")
        if node.op is Op.WEIGHT:
            _need(node.name in weights, "names no weight of the graph")
            ref = weights[node.name]
            return ref.shape, ref.dtype
        if node.op is Op.INPUT:
            _check_shape(node.shape, symbolic=True)
            _need(node.dtype in DTYPES, f"dtype {node.dtype!r} is not one of {DTYPES}")
            return node.shape, node.dtype
        return rule.infer(in_values, attrs)
    except GraphError as e:
        raise GraphError(f"{_where(node)}: {e}") from None


def _check_config(c: GraphConfig) -> None:
    for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab",
                 "max_context"):
        value = getattr(c, name)
        _need(isinstance(value, int) and not isinstance(value, bool) and value > 0,
              f"graph config: {name} must be a positive int, got {value!r}")
    _need(isinstance(c.family, str) and bool(c.family), f"graph config: bad family {c.family!r}")
    _need(c.dtype in FLOAT_DTYPES, f"graph config: dtype {c.dtype!r} is not one of {FLOAT_DTYPES}")


def verify(graph: Graph) -> None:
    """Check the whole graph: config, order, arity, attrs, shapes, dtypes, weights, names."""
    _check_config(graph.config)
    for name, ref in graph.weights.items():
        _check_weight_ref(name, ref)
    values: list[Value] = []
    names: dict[Op, set[str]] = {Op.INPUT: set(), Op.OUTPUT: set(), Op.WEIGHT: set()}
    for i, node in enumerate(graph.nodes):
        _need(isinstance(node, Node) and node.id == i,
              f"node at position {i} has id {getattr(node, 'id', None)}; ids must be positions")
        _need(isinstance(node.op, Op), f"node %{i}: {node.op!r} is not an Op")
        for j in node.inputs:
            _need(isinstance(j, int) and 0 <= j < i,
                  f"{_where(node)}: input %{j} is not an earlier node (not in topological order)")
            _need(graph.nodes[j].op is not Op.OUTPUT, f"{_where(node)}: uses output %{j}")
        value = infer(node, [values[j] for j in node.inputs], graph.weights)
        _need(value == (node.shape, node.dtype),
              f"{_where(node)}: declared {_fmt((node.shape, node.dtype))}, rule gives "
              f"{_fmt(value)}")
        if node.op in names:
            _need(node.name not in names[node.op],
                  f"{_where(node)}: a second {node.op.name.lower()} named '{node.name}'")
            names[node.op].add(node.name)
        values.append(value)
    unused = sorted(set(graph.weights) - names[Op.WEIGHT])
    _need(not unused, f"weight '{unused[0]}' is not used by any WEIGHT node" if unused else "")
    _need(bool(names[Op.OUTPUT]), "graph has no OUTPUT node")


class GraphBuilder:
    """Adds nodes one at a time, applying each op's rule; `build()` verifies the result."""

    def __init__(self, config: GraphConfig):
        self.config = config
        self._nodes: list[Node] = []
        self._weights: dict[str, WeightRef] = {}
        self._weight_nodes: dict[str, int] = {}

    def _add(self, op: Op, inputs: tuple[int, ...], name: str, attrs: Mapping[str, Any],
             shape: Shape = (), dtype: str = "") -> int:
        node = Node(len(self._nodes), op, tuple(inputs), shape, dtype, (), name)
        try:
            node = replace(node, attrs=canonical_attrs(op, attrs))
        except GraphError as e:
            raise GraphError(f"{_where(node)}: {e}") from None
        for j in inputs:
            _need(isinstance(j, int) and 0 <= j < node.id,
                  f"{_where(node)}: input {j!r} is not an earlier node id")
        shape, dtype = infer(node, [(self._nodes[j].shape, self._nodes[j].dtype) for j in inputs],
                             self._weights)
        self._nodes.append(replace(node, shape=shape, dtype=dtype))
        return node.id

    def input(self, name: str, shape: Shape, dtype: str) -> int:
        return self._add(Op.INPUT, (), name, {}, tuple(shape), dtype)

    def weight(self, name: str, ref: WeightRef) -> int:
        """The WEIGHT node of `name`, created on first use; a second use must give the same ref."""
        if name in self._weight_nodes:
            _need(self._weights[name] == ref, f"weight '{name}' added twice with different refs")
            return self._weight_nodes[name]
        _check_weight_ref(name, ref)
        self._weights[name] = ref
        self._weight_nodes[name] = self._add(Op.WEIGHT, (), name, {})
        return self._weight_nodes[name]

    def op(self, op: Op, *inputs: int, name: str = "", **attrs: Any) -> int:
        """A computing node over earlier node ids; its shape and dtype come from the op's rule."""
        _need(op not in LEAVES and op is not Op.OUTPUT,
              f"use input()/weight()/output() for {op.name}")
        return self._add(op, inputs, name, attrs)

    def output(self, name: str, x: int) -> int:
        return self._add(Op.OUTPUT, (x,), name, {})

    def build(self) -> Graph:
        graph = Graph(self.config, tuple(self._nodes), dict(self._weights))
        verify(graph)
        return graph


def bind_positions(graph: Graph, positions: int) -> Graph:
    """The same graph with T replaced by a concrete number of positions (e.g. 1 for decode)."""
    _need(isinstance(positions, int) and positions > 0,
          f"positions must be a positive int, got {positions!r}")
    nodes = tuple(replace(n, shape=tuple(positions if d == T else d for d in n.shape))
                  for n in graph.nodes)
    bound = Graph(graph.config, nodes, graph.weights)
    verify(bound)
    return bound


def format_graph(graph: Graph) -> str:
    """One line per node, torch.fx style: `%5 = MATMUL(%4, %2, %3)  (T, 128) f32  layers.0...`."""
    c = graph.config
    lines = [f"graph {c.family}: hidden {c.hidden}, {c.layers} layers, {c.heads} heads "
             f"({c.kv_heads} kv, head_dim {c.head_dim}), intermediate {c.intermediate}, "
             f"vocab {c.vocab}, max_context {c.max_context}, {c.dtype}"]
    for n in graph.nodes:
        args = ", ".join(f"%{j}" for j in n.inputs)
        attrs = "".join(f" {k}={v}" for k, v in n.attrs)
        lines.append(f"  %{n.id} = {n.op.name}({args}){attrs}  {_fmt((n.shape, n.dtype))}"
                     f"  {n.name}".rstrip())
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# JSON (*.graph.json): one node per line so that diffs and people can read it.


def _ref_json(ref: WeightRef) -> dict:
    out: dict[str, Any] = {"shape": list(ref.shape), "dtype": ref.dtype}
    if ref.file is not None:
        out.update(file=ref.file, key=ref.key)
    if ref.transpose:
        out["transpose"] = True
    if ref.rows is not None:
        out["rows"] = list(ref.rows)
    return out


def to_json(graph: Graph) -> str:
    def line(obj) -> str:
        return json.dumps(obj, separators=(", ", ": "))

    config = {k: getattr(graph.config, k) for k in GraphConfig.__dataclass_fields__}
    weights = [f"    {json.dumps(name)}: {line(_ref_json(ref))}"
               for name, ref in graph.weights.items()]
    nodes = ["    " + line({"id": n.id, "op": n.op.name, "name": n.name, "inputs": list(n.inputs),
                             "shape": list(n.shape), "dtype": n.dtype, "attrs": dict(n.attrs)})
             for n in graph.nodes]
    return "\n".join([
        "{", f'  "format": "{FORMAT}",', f'  "version": {FORMAT_VERSION},',
        f'  "config": {line(config)},',
        '  "weights": {', ",\n".join(weights), "  },",
        '  "nodes": [', ",\n".join(nodes), "  ]", "}", ""])


def _field(obj: dict, key: str, kind: type, where: str):
    _need(isinstance(obj, dict) and key in obj, f"graph JSON: {where}: missing '{key}'")
    value = obj[key]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    _need(ok, f"graph JSON: {where}: '{key}' has the wrong type ({type(value).__name__})")
    return value


def from_json(text: str) -> Graph:
    """Parse and verify a *.graph.json document."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise GraphError(f"graph JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
    _need(isinstance(doc, dict) and doc.get("format") == FORMAT,
          f"graph JSON: not a {FORMAT} document (no \"format\": \"{FORMAT}\")")
    _need(doc.get("version") == FORMAT_VERSION,
          f"graph JSON: version {doc.get('version')!r} is not supported (this reads "
          f"{FORMAT_VERSION})")
    cfg = _field(doc, "config", dict, "top level")
    keys = list(GraphConfig.__dataclass_fields__)
    _need(sorted(cfg) == sorted(keys), f"graph JSON: config must have exactly {', '.join(keys)}")
    config = GraphConfig(**cfg)
    weights = {}
    for name, w in _field(doc, "weights", dict, "top level").items():
        where = f"weight '{name}'"
        rows = w.get("rows") if isinstance(w, dict) else None
        weights[name] = WeightRef(
            shape=tuple(_field(w, "shape", list, where)),
            dtype=_field(w, "dtype", str, where), file=w.get("file"), key=w.get("key"),
            transpose=w.get("transpose", False),
            rows=tuple(rows) if isinstance(rows, list) else rows)
    nodes = []
    for i, n in enumerate(_field(doc, "nodes", list, "top level")):
        where = f"node {i}"
        op_name = _field(n, "op", str, where)
        _need(op_name in Op.__members__, f"graph JSON: {where}: unknown op '{op_name}' "
                                         f"(known: {', '.join(Op.__members__)})")
        op = Op[op_name]
        try:
            attrs = canonical_attrs(op, _field(n, "attrs", dict, where))
        except GraphError as e:
            raise GraphError(f"graph JSON: {where} ({op_name}): {e}") from None
        nodes.append(Node(_field(n, "id", int, where), op, tuple(_field(n, "inputs", list, where)),
                          tuple(_field(n, "shape", list, where)),
                          _field(n, "dtype", str, where), attrs, _field(n, "name", str, where)))
    graph = Graph(config, tuple(nodes), weights)
    verify(graph)
    return graph

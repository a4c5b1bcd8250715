"""The IR: op table, builder type checks, the verifier, bind_positions, printing."""

import dataclasses

import pytest

from wse_emu.isa.frontends.hf import load_hf
from wse_emu.isa.graph import (GROUPS, RULES, T, Graph, GraphBuilder, GraphConfig, GraphError, Op,
                       WeightRef, bind_positions, format_graph, verify)

CONFIG = GraphConfig("test", hidden=8, layers=1, heads=2, kv_heads=1, head_dim=4,
                     intermediate=16, vocab=10, max_context=8, dtype="f32")


def tiny_builder():
    b = GraphBuilder(CONFIG)
    ids = b.input("input_ids", (T,), "i32")
    x = b.op(Op.EMBEDDING, ids, b.weight("tok_embed.weight", WeightRef((10, 8), "f32")),
             name="embed")
    return b, x


def one_line_error(fn, *needles):
    with pytest.raises(GraphError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


def test_every_op_has_a_rule_and_exactly_one_group():
    assert set(RULES) == set(Op)
    for op in Op:
        assert sum(op in group for group in GROUPS.values()) == 1, op


def test_builder_infers_shapes_and_dtypes_with_symbolic_positions():
    b, x = tiny_builder()
    w = b.weight("up.weight", WeightRef((16, 8), "bf16"))
    y = b.op(Op.MATMUL, x, w, b.weight("up.bias", WeightRef((16,), "f32")), name="up")
    g = b.op(Op.GELU_ERF, y)
    b.output("out", g)
    graph = b.build()
    assert [(n.shape, n.dtype) for n in graph.nodes[-4:]] == [
        ((16,), "f32"), ((T, 16), "f32"), ((T, 16), "f32"), ((T, 16), "f32")]
    assert graph.nodes[w].dtype == "bf16"  # weights keep their stored dtype


def test_builder_refuses_a_matmul_whose_weight_does_not_fit():
    b, x = tiny_builder()
    w = b.weight("up.weight", WeightRef((16, 9), "f32"))
    one_line_error(lambda: b.op(Op.MATMUL, x, w, name="up"), "node %4 'up' (MATMUL)",
                   "weight (16, 9) f32 is (out, in) but x (T, 8) f32 has 8 features")
    one_line_error(lambda: b.op(Op.MATMUL, x), "takes 2 or 3 inputs, got 1")
    one_line_error(lambda: b.op(Op.GELU_TANH, 0), "x must be a float tensor, got (T,) i32")


def test_attributes_follow_the_schema():
    b, x = tiny_builder()
    w = b.weight("norm.weight", WeightRef((8,), "f32"))
    one_line_error(lambda: b.op(Op.RMSNORM, x, w), "(RMSNORM): missing attribute(s) eps")
    one_line_error(lambda: b.op(Op.RMSNORM, x, w, eps=1e-5, bias=1.0),
                   "unknown attribute(s) bias (expected: eps)")
    one_line_error(lambda: b.op(Op.RMSNORM, x, w, eps="small"), "eps must be float")
    one_line_error(lambda: b.op(Op.RMSNORM, x, w, eps=-1.0), "eps must be positive")
    one_line_error(lambda: b.op(Op.ATTENTION, x, x, x, n_heads=True, n_kv_heads=1, head_dim=4,
                                causal=True, scale=0.5, max_context=8), "n_heads must be int")
    n = b.op(Op.RMSNORM, x, w, eps=1)
    assert b._nodes[n].attrs == (("eps", 1.0),) and isinstance(b._nodes[n].attr("eps"), float)


def test_shape_rules_of_broadcast_rope_and_attention():
    b, x = tiny_builder()
    pos = b.input("position_ids", (T,), "i32")
    row = b.weight("row.weight", WeightRef((8,), "f32"))
    assert b._nodes[b.op(Op.ADD, x, row)].shape == (T, 8)
    other = b.op(Op.MATMUL, x, b.weight("w", WeightRef((4, 8), "f32")))
    one_line_error(lambda: b.op(Op.ADD, x, other), "b (T, 4) f32 must have the shape of a")
    one_line_error(lambda: b.op(Op.ROPE, x, pos, head_dim=3, theta=1e4), "head_dim 3 must be even")
    one_line_error(lambda: b.op(Op.ROPE, x, pos, head_dim=16, theta=1e4),
                   "not a whole number of heads of 16")
    attn = dict(n_heads=2, n_kv_heads=1, head_dim=4, causal=True, scale=0.5, max_context=8)
    assert b._nodes[b.op(Op.ATTENTION, x, other, other, **attn)].shape == (T, 8)
    one_line_error(lambda: b.op(Op.ATTENTION, x, x, x, **attn),
                   "k (T, 8) f32 must be (T, n_kv_heads * head_dim = 4)")
    one_line_error(lambda: b.op(Op.ATTENTION, x, x, x, **dict(attn, n_kv_heads=3, head_dim=4)),
                   "n_heads 2 is not a multiple of n_kv_heads 3")


@pytest.fixture
def gpt2_graph(gpt2_dir):
    return load_hf(gpt2_dir, shape_only=True)


def test_verifier_catches_a_node_with_a_wrong_shape(gpt2_graph):
    nodes = list(gpt2_graph.nodes)
    i = next(n.id for n in nodes if n.name == "layers.1.mlp.up")
    nodes[i] = dataclasses.replace(nodes[i], shape=(T, 500))
    one_line_error(lambda: verify(Graph(gpt2_graph.config, nodes, gpt2_graph.weights)),
                   f"node %{i} 'layers.1.mlp.up' (MATMUL)", "declared (T, 500) f32",
                   "rule gives (T, 512) f32")


def test_verifier_catches_a_weight_whose_ref_changed_shape(gpt2_graph):
    weights = dict(gpt2_graph.weights)
    weights["layers.0.attn.q.weight"] = WeightRef((128, 64), "f32")
    one_line_error(lambda: verify(Graph(gpt2_graph.config, gpt2_graph.nodes, weights)),
                   "'layers.0.attn.q.weight' (WEIGHT)", "declared (128, 128) f32",
                   "rule gives (128, 64) f32")


def test_verifier_catches_order_names_and_leftovers(gpt2_graph):
    cfg, nodes, weights = gpt2_graph.config, list(gpt2_graph.nodes), dict(gpt2_graph.weights)
    late = list(nodes)
    late[3] = dataclasses.replace(late[3], inputs=(0, 50))
    one_line_error(lambda: verify(Graph(cfg, late, weights)),
                   "node %3 'tok_embed' (EMBEDDING): input %50 is not an earlier node")
    one_line_error(lambda: verify(Graph(cfg, nodes, {**weights, "spare": WeightRef((2,), "f32")})),
                   "weight 'spare' is not used")
    twice = nodes + [dataclasses.replace(nodes[-1], id=len(nodes))]
    one_line_error(lambda: verify(Graph(cfg, twice, weights)), "a second output named 'logits'")
    one_line_error(lambda: verify(Graph(cfg, nodes[:-1], weights)), "no OUTPUT node")
    one_line_error(lambda: verify(Graph(dataclasses.replace(cfg, dtype="f64"), nodes, weights)),
                   "graph config: dtype 'f64'")


def test_bind_positions_makes_every_shape_concrete(gpt2_graph):
    decode = bind_positions(gpt2_graph, 1)
    assert decode.nodes[-1].shape == (1, 512)
    assert all(T not in n.shape for n in decode.nodes)
    assert [n.op for n in decode.nodes] == [n.op for n in gpt2_graph.nodes]
    one_line_error(lambda: bind_positions(gpt2_graph, 0), "positions must be a positive int")


def test_format_graph_is_one_line_per_node(gpt2_graph):
    text = format_graph(gpt2_graph)
    lines = text.splitlines()
    assert len(lines) == len(gpt2_graph.nodes) + 1
    assert lines[0].startswith("graph gpt2: hidden 128, 2 layers, 4 heads")
    q = next(n for n in gpt2_graph.nodes if n.name == "layers.0.attn.q")
    assert f"  %{q.id} = MATMUL(%{q.inputs[0]}, %{q.inputs[1]}, %{q.inputs[2]})  (T, 128) f32  " \
           f"layers.0.attn.q" in lines
    assert str(gpt2_graph) == text

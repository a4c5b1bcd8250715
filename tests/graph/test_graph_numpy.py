"""The NumPy executor itself: every op against a direct NumPy formula, the KV cache, errors."""

import math

import numpy as np
import pytest

from wse_emu.isa.frontends.hf import load_hf
from wse_emu.isa.graph import LEAVES, T, GraphBuilder, GraphConfig, GraphError, Op, WeightRef, \
    bind_positions
from wse_emu.isa.graph_numpy import _EVAL, GraphRunner, gelu_erf, gelu_tanh, load_weight, silu

RNG = np.random.default_rng(7)
CONFIG = GraphConfig("test", hidden=16, layers=1, heads=4, kv_heads=2, head_dim=4,
                     intermediate=16, vocab=11, max_context=6, dtype="f32")


def test_every_computing_op_has_an_executor():
    assert set(_EVAL) == set(Op) - LEAVES


def test_activations_are_the_isa_float64_formulas_rounded_to_fp32():
    x = np.linspace(-9, 9, 2001, dtype=np.float32)
    exact = {
        gelu_tanh: lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi)
                                                        * (v + 0.044715 * v ** 3))),
        gelu_erf: lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))),
        silu: lambda v: v / (1 + math.exp(-v)),
    }
    for fn, formula in exact.items():
        want = np.array([formula(float(v)) for v in x], dtype=np.float32)
        # Within one fp32 ulp: NumPy's vectorised tanh/exp may differ from libm in the last
        # float64 bit, which shows only where 1 + tanh(...) cancels to ~1e-16.
        np.testing.assert_allclose(fn(x), want, rtol=1.2e-7, atol=1e-14)
        assert fn(x).dtype == np.float32
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x)
    torch_refs = ((gelu_tanh, torch.nn.functional.gelu(t, approximate="tanh")),
                  (gelu_erf, torch.nn.functional.gelu(t)), (silu, torch.nn.functional.silu(t)))
    for fn, ref in torch_refs:  # torch works in fp32, where 1 + tanh(..) cancels for x < 0
        np.testing.assert_allclose(fn(x), ref.numpy(), rtol=2e-6, atol=1e-6)


def _toy(causal: bool):
    """ids -> embedding -> LayerNorm -> RMSNorm -> q, k, v -> ATTENTION -> MUL, SOFTMAX."""
    b = GraphBuilder(CONFIG)
    ids = b.input("input_ids", (T,), "i32")
    ref = {"embed": (11, 16), "ln.w": (16,), "ln.b": (16,), "rms.w": (16,), "q": (16, 16),
           "k": (8, 16), "v": (8, 16)}
    w = {name: b.weight(name, WeightRef(shape, "f32")) for name, shape in ref.items()}
    x = b.op(Op.EMBEDDING, ids, w["embed"])
    x = b.op(Op.LAYERNORM, x, w["ln.w"], w["ln.b"], eps=1e-5)
    x = b.op(Op.RMSNORM, x, w["rms.w"], eps=1e-6)
    q, k, v = (b.op(Op.MATMUL, x, w[n]) for n in "qkv")
    a = b.op(Op.ATTENTION, q, k, v, n_heads=4, n_kv_heads=2, head_dim=4, causal=causal,
             scale=0.5, max_context=6)
    b.output("out", b.op(Op.SOFTMAX, b.op(Op.MUL, a, x)))
    weights = {name: RNG.standard_normal(shape).astype(np.float32) for name, shape in ref.items()}
    return b.build(), weights


def _toy_reference(w, ids, causal):
    x = w["embed"][ids]
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    x = x * w["ln.w"] + w["ln.b"]
    x = w["rms.w"] * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6)
    q, k, v = (x @ w[n].T for n in "qkv")
    heads = []
    for h in range(4):
        g = h // 2
        s = 0.5 * q[:, 4 * h:4 * h + 4] @ k[:, 4 * g:4 * g + 4].T
        if causal:
            s = np.where(np.tri(len(ids), dtype=bool), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        heads.append(p / p.sum(-1, keepdims=True) @ v[:, 4 * g:4 * g + 4])
    y = np.concatenate(heads, axis=1) * x
    e = np.exp(y - y.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("causal", [True, False])
def test_ops_match_direct_numpy_formulas(causal):
    graph, weights = _toy(causal)
    ids = np.array([3, 1, 4, 1, 5])
    ours = GraphRunner(graph, weights).prefill(ids)
    np.testing.assert_allclose(ours, _toy_reference(weights, ids, causal), rtol=1e-5, atol=1e-6)


def test_decode_steps_equal_one_causal_prefill():
    graph, weights = _toy(causal=True)
    ids = [3, 1, 4, 1, 5, 9]
    whole = GraphRunner(graph, weights).prefill(ids)
    runner = GraphRunner(graph, weights)
    runner.prefill(ids[:2])
    steps = [runner.step({"input_ids": np.array([t])})["out"][0] for t in ids[2:]]
    np.testing.assert_allclose(np.stack(steps), whole[2:], rtol=1e-5, atol=1e-6)
    with pytest.raises(GraphError, match="KV cache full: 6 positions cached \\+ 1 new > "
                                         "max_context 6"):
        runner.step({"input_ids": np.array([2])})
    runner.reset()
    assert runner.n_past == 0 and not runner.kv_cache[next(iter(runner.kv_cache))][0].any()


def test_runtime_errors_name_the_problem(bert_dir):
    graph, weights = _toy(causal=True)
    runner = GraphRunner(graph, weights)
    with pytest.raises(GraphError, match="index 11 is outside the table of 11 rows"):
        runner.prefill([1, 11])
    with pytest.raises(GraphError, match=r"step needs inputs \['input_ids'\], got \['ids'\]"):
        runner.step({"ids": np.array([1])})
    with pytest.raises(GraphError, match="input 'input_ids': expected \\('T',\\) i32"):
        runner.step({"input_ids": np.array([1.0])})
    with pytest.raises(GraphError, match="weight 'embed' has no file .*pass it in weights="):
        GraphRunner(graph)
    with pytest.raises(GraphError, match="weights\\['q'\\] has shape \\(16, 8\\)"):
        GraphRunner(graph, {**weights, "q": weights["q"][:, :8]})
    encoder = GraphRunner(load_hf(bert_dir))
    with pytest.raises(GraphError, match="decode needs a decoder graph"):
        encoder.decode(3)
    with pytest.raises(GraphError, match="generate_greedy needs a decoder graph"):
        encoder.generate_greedy([1, 2], 3)


def test_shape_only_graph_runs_with_supplied_weights(gpt2_dir):
    weighted = load_hf(gpt2_dir)
    arrays = {name: load_weight(name, ref) for name, ref in weighted.weights.items()}
    shaped = load_hf(gpt2_dir, shape_only=True)
    np.testing.assert_array_equal(GraphRunner(shaped, arrays).prefill([5, 6, 7]),
                                  GraphRunner(weighted).prefill([5, 6, 7]))


def test_a_graph_bound_to_one_position_decodes_like_the_symbolic_one(llama_dir):
    graph = load_hf(llama_dir)
    symbolic, bound = GraphRunner(graph), GraphRunner(bind_positions(graph, 1))
    for runner in (symbolic, bound):
        runner.prefill([9])
    for token in (4, 8):
        np.testing.assert_array_equal(bound.decode(token), symbolic.decode(token))
    with pytest.raises(GraphError, match="expected shape \\(1,\\)"):
        bound.prefill([1, 2])


def test_a_16_bit_kv_cache_rounds_what_it_stores(llama_dir):
    graph = load_hf(llama_dir)
    full, half = GraphRunner(graph), GraphRunner(graph, kv_dtype="bf16")
    a, b = full.prefill([3, 4, 5]), half.prefill([3, 4, 5])
    (node,) = [n for n in graph.nodes if n.op is Op.ATTENTION][:1]
    k_full, k_half = full.kv_cache[node.id][0][:3], half.kv_cache[node.id][0][:3]
    bits = k_half.view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)  # bf16 values
    np.testing.assert_allclose(k_half, k_full, rtol=2 ** -8)
    assert not np.array_equal(a, b) and np.allclose(a, b, rtol=0.05, atol=0.05)
    with pytest.raises(GraphError, match="kv_dtype must be one of"):
        GraphRunner(graph, kv_dtype="int8")

"""The NumPy reference executor of the graph IR: the golden model for compiled mesh programs.

`GraphRunner` runs a verified Graph one step at a time, in float32 with NumPy's own
accumulation (weights of any stored dtype are widened to fp32 once, at load). Activations
(GELU, SiLU) use the ISA's formulas for `vgelu`/`vgelue`/`vsilu`, evaluated in float64 and
rounded to fp32 (docs/timing-model.md section 3), so the golden model and the mesh differ
there by at most the last float64 bit of a library function, not by an approximation.

Each ATTENTION node owns a KV cache of `max_context` positions ((max_context, n_kv_heads *
head_dim) for keys and for values; fp32, or values rounded to `kv_dtype` "bf16" / "f16" when
they are appended, as a compiled program with 16-bit weights stores its caches). A step appends its T positions after the `n_past` already
cached; the causal mask is over cache slots, so slot j is visible to the step's query i when
j <= n_past + i. Bidirectional attention sees every filled slot.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from wse_emu.isa.graph import T, Graph, GraphError, Node, Op, WeightRef, verify
from wse_emu.isa.tensors import TensorError, read_safetensor

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_erf = np.frompyfunc(math.erf, 1, 1)  # NumPy has no erf; math.erf is exact in float64


def load_weight(name: str, ref: WeightRef) -> np.ndarray:
    """The logical fp32 tensor a WeightRef names (view applied, see isa.graph.WeightRef)."""
    if ref.file is None:
        raise GraphError(f"weight '{name}' has no file (a shape-only graph): pass it in weights=")
    try:
        stored, tag = read_safetensor(Path(ref.file), ref.key)
    except TensorError as e:
        raise GraphError(f"weight '{name}': {e}") from None
    if tag == "bf16":  # bf16 is the upper half of an fp32
        values = (stored.astype(np.uint32) << 16).view(np.float32)
    else:
        values = stored.astype(np.float32)
    if ref.transpose:
        if values.ndim != 2:
            raise GraphError(f"weight '{name}': cannot transpose a {values.ndim}-D tensor")
        values = values.T
    if ref.rows is not None:
        start, stop = ref.rows
        if stop > values.shape[0]:
            raise GraphError(f"weight '{name}': rows {ref.rows} outside {values.shape[0]} rows")
        values = values[start:stop]
    if values.size != math.prod(ref.shape):
        raise GraphError(f"weight '{name}': {ref.file} '{ref.key}' gives {values.shape}, "
                         f"graph expects {ref.shape}")
    return np.ascontiguousarray(values.reshape(ref.shape), dtype=np.float32)


def _f64_to_f32(fn: Callable[[np.ndarray], np.ndarray]):
    def run(x: np.ndarray) -> np.ndarray:
        return fn(x.astype(np.float64)).astype(np.float32)
    return run


def _gelu_tanh64(x):
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


def _gelu_erf64(x):
    return 0.5 * x * (1.0 + _erf(x * _INV_SQRT_2).astype(np.float64))


def _silu64(x):
    return x / (1.0 + np.exp(-x))


gelu_tanh, gelu_erf, silu = map(_f64_to_f32, (_gelu_tanh64, _gelu_erf64, _silu64))


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, max-subtracted so that exp cannot overflow."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def _gather(run, node, ids, table):
    bad = (ids < 0) | (ids >= table.shape[0])
    if bad.any():
        raise GraphError(f"{node.name or node.op.name}: index {int(ids[bad][0])} is outside the "
                         f"table of {table.shape[0]} rows")
    return table[ids]


def _matmul(run, node, x, w, bias=None):
    y = x @ w.T  # (T, out)
    return y if bias is None else y + bias


def _layernorm(run, node, x, w, b):
    mean = np.mean(x, axis=-1, keepdims=True)
    var = np.mean(np.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + np.float32(node.attr("eps"))) * w + b


def _rmsnorm(run, node, x, w):
    ms = np.mean(np.square(x), axis=-1, keepdims=True)
    return w * (x * (np.float32(1.0) / np.sqrt(ms + np.float32(node.attr("eps")))))


def _rope(run, node, x, pos):
    hd, theta = node.attr("head_dim"), node.attr("theta")
    # fp32 throughout, as transformers computes inv_freq, the angles and cos/sin.
    inv_freq = np.float32(1.0) / (np.float32(theta) ** (np.arange(0, hd, 2, dtype=np.float32)
                                                        / np.float32(hd)))
    angles = pos.astype(np.float32)[:, None] * inv_freq[None, :]  # (T, hd/2)
    angles = np.concatenate([angles, angles], axis=-1)[:, None, :]  # (T, 1, hd)
    xh = x.reshape(x.shape[0], -1, hd)  # (T, heads, hd)
    half = hd // 2
    rotated = np.concatenate([-xh[..., half:], xh[..., :half]], axis=-1)  # rotate_half
    return (xh * np.cos(angles) + rotated * np.sin(angles)).reshape(x.shape)


def _attention(run, node, q, k, v):
    nh, nkv, hd = node.attr("n_heads"), node.attr("n_kv_heads"), node.attr("head_dim")
    t, start = q.shape[0], run.n_past
    end = start + t
    cache_k, cache_v = run.kv_cache[node.id]
    cache_k[start:end] = run.kv_round(k)
    cache_v[start:end] = run.kv_round(v)
    keys = cache_k[:end].reshape(end, nkv, hd).transpose(1, 0, 2)  # (nkv, S, hd)
    values = cache_v[:end].reshape(end, nkv, hd).transpose(1, 0, 2)  # (nkv, S, hd)
    group = nh // nkv  # query head h reads kv head h // group, as transformers' repeat_kv
    qh = q.reshape(t, nkv, group, hd).transpose(1, 2, 0, 3)  # (nkv, group, T, hd)
    scores = (qh @ keys[:, None].transpose(0, 1, 3, 2)) * np.float32(node.attr("scale"))
    if node.attr("causal"):
        hidden = np.arange(end)[None, :] > (start + np.arange(t))[:, None]  # (T, S)
        scores = np.where(hidden, np.float32(-np.inf), scores)  # (nkv, group, T, S)
    out = softmax(scores) @ values[:, None]  # (nkv, group, T, hd)
    return out.transpose(2, 0, 1, 3).reshape(t, nh * hd)


_EVAL: Mapping[Op, Callable] = {
    Op.OUTPUT: lambda run, node, x: x,
    Op.EMBEDDING: _gather,
    Op.POS_EMBEDDING: _gather,
    Op.MATMUL: _matmul,
    Op.LM_HEAD: lambda run, node, x, table: x @ table.T,  # (T, vocab)
    Op.ADD: lambda run, node, a, b: a + b,
    Op.MUL: lambda run, node, a, b: a * b,
    Op.GELU_TANH: lambda run, node, x: gelu_tanh(x),
    Op.GELU_ERF: lambda run, node, x: gelu_erf(x),
    Op.SILU: lambda run, node, x: silu(x),
    Op.SWIGLU: lambda run, node, gate, up: silu(gate) * up,
    Op.LAYERNORM: _layernorm,
    Op.RMSNORM: _rmsnorm,
    Op.SOFTMAX: lambda run, node, x: softmax(x),
    Op.ROPE: _rope,
    Op.ATTENTION: _attention,
}


def _bf16_round(x: np.ndarray) -> np.ndarray:
    from wse_emu.kernels.convert import bf16_to_f32_array, f32_to_bf16_array

    return bf16_to_f32_array(f32_to_bf16_array(np.ascontiguousarray(x, dtype=np.float32)))


_KV_ROUND: dict[str, Callable] = {
    "f32": lambda x: x, "fp32": lambda x: x,
    "bf16": _bf16_round,
    "f16": lambda x: np.asarray(x, np.float32).astype(np.float16).astype(np.float32),
    "fp16": lambda x: np.asarray(x, np.float32).astype(np.float16).astype(np.float32)}


class GraphRunner:
    """Runs a graph step by step with a KV cache; see the module docstring for the semantics."""

    def __init__(self, graph: Graph, weights: Mapping[str, np.ndarray] | None = None,
                 kv_dtype: str = "f32"):
        verify(graph)
        if kv_dtype not in _KV_ROUND:
            raise GraphError(f"kv_dtype must be one of {', '.join(_KV_ROUND)}, got {kv_dtype!r}")
        self.kv_round = _KV_ROUND[kv_dtype]
        self.graph = graph
        weights = dict(weights or {})
        unknown = sorted(set(weights) - set(graph.weights))
        if unknown:
            raise GraphError(f"weights given for '{unknown[0]}', which the graph does not have")
        self._weights: dict[int, np.ndarray] = {}
        for node in graph.nodes:
            if node.op is Op.WEIGHT:
                ref = graph.weights[node.name]
                if node.name in weights:
                    value = np.ascontiguousarray(weights[node.name], dtype=np.float32)
                    if value.shape != ref.shape:
                        raise GraphError(f"weights['{node.name}'] has shape {value.shape}, the "
                                         f"graph expects {ref.shape}")
                else:
                    value = load_weight(node.name, ref)
                self._weights[node.id] = value
        self._attention = [n for n in graph.nodes if n.op is Op.ATTENTION]
        self.max_context = min((n.attr("max_context") for n in self._attention),
                               default=graph.config.max_context)
        self.reset()

    def reset(self) -> None:
        """Forget the sequence: empty every KV cache."""
        self.n_past = 0
        self.kv_cache = {}
        for n in self._attention:
            width = n.attr("n_kv_heads") * n.attr("head_dim")
            self.kv_cache[n.id] = (np.zeros((n.attr("max_context"), width), np.float32),
                                   np.zeros((n.attr("max_context"), width), np.float32))

    def step(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Process T more positions of the sequence: {input name: array} -> {output: array}."""
        names = {n.name for n in self.graph.inputs}
        if set(inputs) != names:
            raise GraphError(f"step needs inputs {sorted(names)}, got {sorted(inputs)}")
        t = None
        values: dict[int, np.ndarray] = {}
        for node in self.graph.inputs:
            arr = np.asarray(inputs[node.name])
            t = _bind_input(node, arr, t)
            values[node.id] = arr.astype(np.int64 if node.dtype == "i32" else np.float32)
        if self.n_past + t > self.max_context:
            raise GraphError(f"KV cache full: {self.n_past} positions cached + {t} new > "
                             f"max_context {self.max_context}")
        values.update(self._weights)
        for node in self.graph.nodes:
            if node.id not in values:
                values[node.id] = _EVAL[node.op](self, node, *(values[j] for j in node.inputs))
        self.n_past += t
        return {n.name: values[n.id] for n in self.graph.outputs}

    def prefill(self, input_ids, position_ids=None) -> np.ndarray:
        """Start a new sequence with these tokens; the (first) output for every position, fp32:
        logits (T, vocab) for decoders, last_hidden_state (T, hidden) for encoders."""
        self.reset()
        return self._run(np.asarray(input_ids), position_ids)

    def decode(self, token_id: int) -> np.ndarray:
        """Append one token to the sequence; its logits (vocab,)."""
        self._need_logits("decode")
        return self._run(np.asarray([token_id]), None, output="logits")[0]

    def generate_greedy(self, prompt_ids, n_tokens: int) -> list[int]:
        """The n_tokens next tokens by argmax (the prompt not included)."""
        self._need_logits("generate_greedy")
        self.reset()
        logits = self._run(np.asarray(prompt_ids), None, output="logits")[-1]
        out: list[int] = []
        for i in range(n_tokens):
            out.append(int(np.argmax(logits)))
            if i + 1 < n_tokens:
                logits = self.decode(out[-1])
        return out

    def _need_logits(self, what: str) -> None:
        if "logits" not in {n.name for n in self.graph.outputs}:
            raise GraphError(f"{what} needs a decoder graph (one with a 'logits' output)")

    def _run(self, input_ids: np.ndarray, position_ids, output: str | None = None):
        inputs = {"input_ids": input_ids}
        if any(n.name == "position_ids" for n in self.graph.inputs):
            if position_ids is None:
                position_ids = np.arange(self.n_past, self.n_past + len(input_ids))
            inputs["position_ids"] = np.asarray(position_ids)
        outputs = self.step(inputs)
        return outputs[output] if output else outputs[self.graph.outputs[0].name]


def _bind_input(node: Node, arr: np.ndarray, t: int | None) -> int:
    """Check an input array against its declared shape; returns T (from the first input)."""
    if arr.ndim != len(node.shape) or (node.dtype == "i32" and arr.dtype.kind not in "iu"):
        raise GraphError(f"input '{node.name}': expected {node.shape} {node.dtype}, got an array "
                         f"of shape {arr.shape} and dtype {arr.dtype}")
    for want, got in zip(node.shape, arr.shape):
        if want == T:
            t = got if t is None else t
            want = t
        if want != got:
            bound = f" with T = {t}" if T in node.shape else ""
            raise GraphError(f"input '{node.name}': expected shape {node.shape}{bound}, got "
                             f"{arr.shape}")
    if t is None:  # a graph bound to a concrete T: the first input's first axis is T
        t = arr.shape[0]
    if t < 1:
        raise GraphError(f"input '{node.name}': a step needs at least one position")
    return t

"""Small random-weight models in Hugging Face layout, written with NumPy alone (no PyTorch).

Same signatures as tests/graph/hf_models.py, for the compiler's tests that need a model and a
reference for its numbers but not transformers itself: the reference is the NumPy golden model
(isa.graph_numpy.GraphRunner), which tests/graph/test_hf_numerics.py checks against
transformers. Every parameter gets a random value (norm gains and biases too, so a swapped or
dropped parameter shows in the numbers); tensor names and shapes are the ones
`save_pretrained` writes (GPT-2's Conv1D weights are (in, out), the others (out, in)).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

WEIGHT_STD = 0.2  # as hf_models: logits spread over several units, so argmax is stable


def _bf16_bits(a: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, rounded to nearest even (what torch's .to(bfloat16) does)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    """The safetensors format by hand: safetensors.numpy cannot write bf16 without ml_dtypes."""
    header, blobs, offset = {}, [], 0
    for key, value in tensors.items():
        if dtype == "bfloat16":
            data, code = _bf16_bits(value).tobytes(), "BF16"
        else:
            data, code = np.ascontiguousarray(value, np.float32).tobytes(), "F32"
        header[key] = {"dtype": code, "shape": list(value.shape),
                       "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


class _Params:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.tensors: dict[str, np.ndarray] = {}

    def weight(self, key: str, *shape: int) -> None:
        self.tensors[key] = (self.rng.standard_normal(shape) * WEIGHT_STD).astype(np.float32)

    def bias(self, key: str, n: int) -> None:
        self.tensors[key] = (self.rng.standard_normal(n) * 0.1).astype(np.float32)

    def gain(self, key: str, n: int) -> None:
        self.tensors[key] = (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)

    def layernorm(self, key: str, n: int) -> None:
        self.gain(key + ".weight", n)
        self.bias(key + ".bias", n)

    def linear(self, key: str, n_out: int, n_in: int, bias: bool = True) -> None:
        self.weight(key + ".weight", n_out, n_in)
        if bias:
            self.bias(key + ".bias", n_out)


def _save(folder: Path, config: dict, params: _Params, dtype: str) -> Path:
    folder.mkdir(parents=True, exist_ok=False)
    config = dict(config, torch_dtype=dtype)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    _write_safetensors(folder / "model.safetensors", params.tensors, dtype)
    return folder


def make_gpt2(root: Path, hidden: int = 128, layers: int = 2, heads: int = 4, vocab: int = 512,
              max_positions: int = 64, tie: bool = True, activation: str = "gelu_new",
              seed: int = 0, dtype: str = "float32", name: str = "gpt2") -> Path:
    p, h = _Params(seed), hidden
    p.weight("transformer.wte.weight", vocab, h)
    p.weight("transformer.wpe.weight", max_positions, h)
    for i in range(layers):
        k = f"transformer.h.{i}."
        p.layernorm(k + "ln_1", h)
        p.weight(k + "attn.c_attn.weight", h, 3 * h)  # Conv1D: (in, out)
        p.bias(k + "attn.c_attn.bias", 3 * h)
        p.weight(k + "attn.c_proj.weight", h, h)
        p.bias(k + "attn.c_proj.bias", h)
        p.layernorm(k + "ln_2", h)
        p.weight(k + "mlp.c_fc.weight", h, 4 * h)
        p.bias(k + "mlp.c_fc.bias", 4 * h)
        p.weight(k + "mlp.c_proj.weight", 4 * h, h)
        p.bias(k + "mlp.c_proj.bias", h)
    p.layernorm("transformer.ln_f", h)
    if not tie:
        p.weight("lm_head.weight", vocab, h)
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": h,
              "n_layer": layers, "n_head": heads, "vocab_size": vocab,
              "n_positions": max_positions, "layer_norm_epsilon": 1e-5,
              "activation_function": activation, "tie_word_embeddings": tie,
              "bos_token_id": None, "eos_token_id": None}
    return _save(Path(root) / name, config, p, dtype)


def make_llama(root: Path, hidden: int = 128, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, intermediate: int = 256, vocab: int = 512,
               max_positions: int = 64, tie: bool = False, rope_theta: float = 10000.0,
               seed: int = 0, dtype: str = "float32", name: str = "llama") -> Path:
    p, h = _Params(seed), hidden
    kv = hidden // heads * kv_heads
    p.weight("model.embed_tokens.weight", vocab, h)
    for i in range(layers):
        k = f"model.layers.{i}."
        p.gain(k + "input_layernorm.weight", h)
        p.linear(k + "self_attn.q_proj", h, h, bias=False)
        p.linear(k + "self_attn.k_proj", kv, h, bias=False)
        p.linear(k + "self_attn.v_proj", kv, h, bias=False)
        p.linear(k + "self_attn.o_proj", h, h, bias=False)
        p.gain(k + "post_attention_layernorm.weight", h)
        p.linear(k + "mlp.gate_proj", intermediate, h, bias=False)
        p.linear(k + "mlp.up_proj", intermediate, h, bias=False)
        p.linear(k + "mlp.down_proj", h, intermediate, bias=False)
    p.gain("model.norm.weight", h)
    if not tie:
        p.weight("lm_head.weight", vocab, h)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": h,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "intermediate_size": intermediate,
              "vocab_size": vocab, "max_position_embeddings": max_positions,
              "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": tie,
              "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
              "bos_token_id": None, "eos_token_id": None}
    return _save(Path(root) / name, config, p, dtype)


def make_bert(root: Path, hidden: int = 128, layers: int = 2, heads: int = 4,
              intermediate: int = 256, vocab: int = 512, max_positions: int = 64,
              seed: int = 0, dtype: str = "float32", name: str = "bert") -> Path:
    p, h = _Params(seed), hidden
    e = "embeddings."
    p.weight(e + "word_embeddings.weight", vocab, h)
    p.weight(e + "position_embeddings.weight", max_positions, h)
    p.weight(e + "token_type_embeddings.weight", 2, h)
    p.layernorm(e + "LayerNorm", h)
    for i in range(layers):
        k = f"encoder.layer.{i}."
        for part in ("query", "key", "value"):
            p.linear(k + "attention.self." + part, h, h)
        p.linear(k + "attention.output.dense", h, h)
        p.layernorm(k + "attention.output.LayerNorm", h)
        p.linear(k + "intermediate.dense", intermediate, h)
        p.linear(k + "output.dense", h, intermediate)
        p.layernorm(k + "output.LayerNorm", h)
    p.linear("pooler.dense", h, h)
    config = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": h,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "intermediate_size": intermediate, "vocab_size": vocab,
              "max_position_embeddings": max_positions, "type_vocab_size": 2,
              "layer_norm_eps": 1e-12, "hidden_act": "gelu",
              "position_embedding_type": "absolute"}
    return _save(Path(root) / name, config, p, dtype)

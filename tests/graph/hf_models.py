"""Small random-weight Hugging Face models saved as safetensors folders, for tests.

Every function builds a model from transformers' own config class with a fixed seed, gives
every parameter a random value (norm gains and biases too, so a swapped or dropped parameter
shows up in the numbers), saves it with `save_pretrained` (config.json + model.safetensors)
into a new folder under `root`, and returns that folder. Nothing is downloaded. The compiler's
tests reuse these: `from tests.graph.hf_models import make_llama` (run from the repo root).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# Without transformers and PyTorch, a test module that imports this one at its top is skipped
# whole, and a test or fixture that imports it when it runs is skipped: never an error.
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

WEIGHT_STD = 0.2  # large enough that logits spread over several units and argmax is stable


def _randomise(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied parameters are listed once
            if p.ndim >= 2:
                p.normal_(0.0, WEIGHT_STD)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:  # norm gains
                p.copy_(1.0 + 0.1 * torch.randn_like(p))


def _save(model: torch.nn.Module, folder: Path, dtype: str) -> Path:
    _randomise(model)
    model = model.to(getattr(torch, dtype)).eval()
    folder.mkdir(parents=True, exist_ok=False)
    model.save_pretrained(folder)
    return folder


def make_gpt2(root: Path, hidden: int = 128, layers: int = 2, heads: int = 4, vocab: int = 512,
              max_positions: int = 64, tie: bool = True, activation: str = "gelu_new",
              seed: int = 0, dtype: str = "float32", name: str = "gpt2") -> Path:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_embd=hidden, n_layer=layers, n_head=heads, vocab_size=vocab, n_positions=max_positions,
        activation_function=activation, tie_word_embeddings=tie, bos_token_id=None,
        eos_token_id=None, attn_implementation="eager")
    return _save(transformers.GPT2LMHeadModel(config), Path(root) / name, dtype)


def make_llama(root: Path, hidden: int = 128, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, intermediate: int = 256, vocab: int = 512,
               max_positions: int = 64, tie: bool = False, rope_theta: float = 10000.0,
               seed: int = 0, dtype: str = "float32", name: str = "llama") -> Path:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab,
        max_position_embeddings=max_positions, tie_word_embeddings=tie,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    return _save(transformers.LlamaForCausalLM(config), Path(root) / name, dtype)


def make_bert(root: Path, hidden: int = 128, layers: int = 2, heads: int = 4,
              intermediate: int = 256, vocab: int = 512, max_positions: int = 64,
              seed: int = 0, dtype: str = "float32", name: str = "bert",
              architecture: str = "BertModel") -> Path:
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=intermediate, vocab_size=vocab, max_position_embeddings=max_positions,
        attn_implementation="eager")
    return _save(getattr(transformers, architecture)(config), Path(root) / name, dtype)


def load_torch(model_dir: Path) -> torch.nn.Module:
    """The saved model back from its folder, in fp32 (bf16/fp16 weights widened), eval mode."""
    arch = json.loads((Path(model_dir) / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, arch).from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval()

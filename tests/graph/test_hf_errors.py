"""Every front-end refusal is one FrontendError line that names what is wrong."""

import json
import shutil

import pytest
from safetensors.numpy import load_file, save_file

from wse_emu.isa.frontends.hf import FrontendError, load_hf


def _copy(folder, tmp_path):
    dst = tmp_path / folder.name
    shutil.copytree(folder, dst)
    return dst


def _edit_config(folder, drop=(), **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for key in drop:
        del cfg[key]
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def _edit_tensors(folder, edit):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def _refused(folder, *needles, **kw):
    with pytest.raises(FrontendError) as e:
        load_hf(folder, **kw)
    msg = str(e.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


def test_unsupported_architecture_is_named_with_the_supported_list(llama_dir, tmp_path):
    folder = _copy(llama_dir, tmp_path)
    _edit_config(folder, architectures=["MistralForCausalLM"], model_type="mistral")
    _refused(folder, "config.json", "'MistralForCausalLM'", "GPT2LMHeadModel", "LlamaForCausalLM",
             "BertModel")


def test_unsupported_model_type_without_architectures(gpt2_dir, tmp_path):
    folder = _copy(gpt2_dir, tmp_path)
    _edit_config(folder, drop=["architectures"], model_type="t5")
    _refused(folder, "model_type 't5'", "gpt2, llama, bert")


def test_architecture_and_model_type_must_agree(gpt2_dir, tmp_path):
    folder = _copy(gpt2_dir, tmp_path)
    _edit_config(folder, model_type="llama")
    _refused(folder, "'GPT2LMHeadModel' does not match model_type 'llama'")


@pytest.mark.parametrize("model, key", [("gpt2_dir", "n_embd"), ("llama_dir", "vocab_size"),
                                        ("bert_dir", "num_hidden_layers")])
def test_missing_config_key_is_named(model, key, request, tmp_path):
    folder = _copy(request.getfixturevalue(model), tmp_path)
    _edit_config(folder, drop=[key])
    _refused(folder, f"missing key '{key}'")
    _refused(folder, f"missing key '{key}'", shape_only=True)


def test_missing_tensor_is_named(gpt2_dir, tmp_path):
    folder = _copy(gpt2_dir, tmp_path)
    _edit_tensors(folder, lambda t: t.pop("transformer.h.1.mlp.c_fc.bias"))
    _refused(folder, "model.safetensors", "tensor 'transformer.h.1.mlp.c_fc.bias' is missing")


def test_untied_head_needs_its_tensor(llama_dir, tmp_path):
    folder = _copy(llama_dir, tmp_path)
    _edit_tensors(folder, lambda t: t.pop("lm_head.weight"))
    _refused(folder, "tensor 'lm_head.weight' is missing")


def test_tensor_with_wrong_shape_is_named_with_both_shapes(llama_dir, tmp_path):
    folder = _copy(llama_dir, tmp_path)
    key = "model.layers.0.self_attn.k_proj.weight"
    _edit_tensors(folder, lambda t: t.update({key: t["model.layers.0.self_attn.q_proj.weight"]}))
    _refused(folder, f"tensor '{key}' has shape [128, 128], expected [64, 128]")


def test_unknown_prefix_names_the_expected_key(bert_dir, tmp_path):
    folder = _copy(bert_dir, tmp_path)
    _edit_tensors(folder, lambda t: t.update({f"encoder.{k}": t.pop(k) for k in list(t)}))
    _refused(folder, "tensor 'bert.embeddings.word_embeddings.weight' is missing")


@pytest.mark.parametrize("rope, needle", [
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "'llama3'"),
    ({"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0}}, "'linear'"),
])
def test_unsupported_rope_scaling_is_refused(llama_dir, tmp_path, rope, needle):
    folder = _copy(llama_dir, tmp_path)
    _edit_config(folder, **rope)
    _refused(folder, "RoPE type", needle, "only 'default'")


@pytest.mark.parametrize("model, changes, needle", [
    ("llama_dir", {"hidden_act": "gelu"}, "'hidden_act' = 'gelu' is not supported"),
    ("gpt2_dir", {"activation_function": "relu"}, "'activation_function' = 'relu'"),
    ("gpt2_dir", {"add_cross_attention": True}, "'add_cross_attention'"),
    ("bert_dir", {"is_decoder": True}, "'is_decoder'"),
    ("bert_dir", {"position_embedding_type": "relative_key"}, "'relative_key'"),
    ("llama_dir", {"num_key_value_heads": 3}, "not a multiple of 3 key/value heads"),
    ("llama_dir", {"dtype": "float64"}, "dtype 'float64'"),
])
def test_unsupported_options_are_refused(model, changes, needle, request, tmp_path):
    folder = _copy(request.getfixturevalue(model), tmp_path)
    _edit_config(folder, **changes)
    _refused(folder, needle)


def test_learned_positions_bound_max_context(gpt2_dir):
    _refused(gpt2_dir, "max_context 100 exceeds the model's 64 learned positions",
             max_context=100)


def test_folder_without_weights_suggests_shape_only(gpt2_dir, tmp_path):
    (tmp_path / "cfg").mkdir()
    shutil.copy(gpt2_dir / "config.json", tmp_path / "cfg")
    _refused(tmp_path / "cfg", "no model.safetensors", "shape_only=True")
    _refused(tmp_path / "nothing", "config.json: no such file")

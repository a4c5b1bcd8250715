"""What the Hugging Face front-end builds: structure, weight naming and views, options."""

import json
import shutil

import numpy as np
import pytest
from hf_models import load_torch

from wse_emu.isa.frontends.hf import load_hf
from wse_emu.isa.graph import T, Op
from wse_emu.isa.graph_numpy import GraphRunner, load_weight


@pytest.mark.parametrize("model", ["gpt2_dir", "llama_dir", "llama_tied_dir", "bert_dir"])
def test_shape_only_graph_has_the_weighted_graphs_structure(model, request, tmp_path):
    folder = request.getfixturevalue(model)
    weighted = load_hf(folder)
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(folder / "config.json", config_only)
    shaped = load_hf(config_only, shape_only=True)
    assert shaped.nodes == weighted.nodes
    assert shaped.config == weighted.config
    assert {k: (r.shape, r.dtype) for k, r in shaped.weights.items()} == \
           {k: (r.shape, r.dtype) for k, r in weighted.weights.items()}
    assert all(r.file is None and r.key is None for r in shaped.weights.values())
    assert all(r.file and r.key for r in weighted.weights.values())


def test_gpt2_conv1d_weights_are_viewed_as_out_by_in(gpt2_dir):
    graph = load_hf(gpt2_dir)
    q, k = graph.weights["layers.0.attn.q.weight"], graph.weights["layers.0.attn.k.weight"]
    assert q.key == k.key == "transformer.h.0.attn.c_attn.weight"
    assert (q.transpose, q.rows, k.rows) == (True, (0, 128), (128, 256))
    assert graph.weights["layers.0.attn.v.bias"].rows == (256, 384)
    assert graph.weights["layers.1.mlp.up.weight"].shape == (512, 128)  # (out, in)
    hf = load_torch(gpt2_dir).transformer.h
    np.testing.assert_array_equal(load_weight("up", graph.weights["layers.1.mlp.up.weight"]),
                                  hf[1].mlp.c_fc.weight.detach().numpy().T)
    np.testing.assert_array_equal(load_weight("k", k),
                                  hf[0].attn.c_attn.weight.detach().numpy()[:, 128:256].T)


def test_tied_lm_head_shares_the_token_embedding_node(gpt2_dir, llama_tied_dir, llama_dir):
    for folder, tied in ((gpt2_dir, True), (llama_tied_dir, True), (llama_dir, False)):
        graph = load_hf(folder)
        embed = next(n for n in graph.nodes if n.op is Op.EMBEDDING)
        head = next(n for n in graph.nodes if n.op is Op.LM_HEAD)
        assert (head.inputs[1] == embed.inputs[1]) == tied
        assert ("lm_head.weight" in graph.weights) == (not tied)


def test_llama_graph_has_rope_gqa_and_swiglu(llama_dir):
    graph = load_hf(llama_dir)
    ops = [n.op for n in graph.nodes]
    assert ops.count(Op.ROPE) == 4 and ops.count(Op.SWIGLU) == 2 and ops.count(Op.RMSNORM) == 5
    attn = next(n for n in graph.nodes if n.op is Op.ATTENTION)
    assert dict(attn.attrs) == {"n_heads": 4, "n_kv_heads": 2, "head_dim": 32, "causal": True,
                                "scale": 32 ** -0.5, "max_context": 64}
    k = graph.nodes[attn.inputs[1]]
    assert k.op is Op.ROPE and k.shape == (T, 64)
    assert graph.nodes[k.inputs[1]].name == "position_ids"


def test_bert_is_bidirectional_post_norm_with_type_zero(bert_dir):
    graph = load_hf(bert_dir)
    assert {n.attr("causal") for n in graph.nodes if n.op is Op.ATTENTION} == {False}
    assert [n.name for n in graph.outputs] == ["last_hidden_state"]
    assert graph.nodes[graph.outputs[0].inputs[0]].op is Op.LAYERNORM
    type0 = graph.weights["type_embed.weight"]
    assert (type0.rows, type0.shape) == ((0, 1), (128,))
    table = load_torch(bert_dir).embeddings.token_type_embeddings.weight.detach().numpy()
    np.testing.assert_array_equal(load_weight("type0", type0), table[0])


def test_max_context_sizes_every_kv_cache(gpt2_dir, llama_dir):
    graph = load_hf(llama_dir, max_context=200)  # RoPE has no position table: beyond is fine
    assert graph.config.max_context == 200
    assert {n.attr("max_context") for n in graph.nodes if n.op is Op.ATTENTION} == {200}
    keys, values = next(iter(GraphRunner(graph).kv_cache.values()))
    assert keys.shape == values.shape == (200, 2 * 32)  # (max_context, n_kv_heads * head_dim)
    assert load_hf(gpt2_dir, max_context=16).config.max_context == 16


def test_gpt2_attention_scale_options(gpt2_dir, tmp_path):
    folder = tmp_path / "gpt2"
    shutil.copytree(gpt2_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["scale_attn_by_inverse_layer_idx"] = True
    (folder / "config.json").write_text(json.dumps(cfg))
    scales = [n.attr("scale") for n in load_hf(folder).nodes if n.op is Op.ATTENTION]
    assert scales == [32 ** -0.5, 32 ** -0.5 / 2]


def test_sharded_checkpoint_reads_every_shard(llama_dir, tmp_path):
    folder = tmp_path / "sharded"
    load_torch(llama_dir).save_pretrained(folder, max_shard_size="100KB")
    assert not (folder / "model.safetensors").exists()
    graph = load_hf(folder)
    assert len({r.file for r in graph.weights.values()}) > 1
    np.testing.assert_array_equal(GraphRunner(graph).prefill([1, 2, 3]),
                                  GraphRunner(load_hf(llama_dir)).prefill([1, 2, 3]))

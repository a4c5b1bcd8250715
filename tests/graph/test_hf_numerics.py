"""The NumPy executor on imported graphs agrees with transformers (PyTorch CPU, fp32)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hf_models import load_torch, make_bert, make_llama

from wse_emu.isa.frontends.hf import load_hf
from wse_emu.isa.graph_numpy import GraphRunner

PROMPT = [17, 300, 5, 411, 42, 99, 250]


def assert_matches(ours, ref):
    scale = float(np.max(np.abs(ref)))
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5 * scale)


def torch_out(model, ids, **kw):
    with torch.no_grad():
        out = model(torch.tensor([ids]), **kw)
    ref = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return ref[0].numpy()


@pytest.mark.parametrize("model", ["gpt2_dir", "llama_dir", "llama_tied_dir", "bert_dir"])
def test_prefill_matches_transformers(model, request):
    folder = request.getfixturevalue(model)
    ours = GraphRunner(load_hf(folder)).prefill(PROMPT)
    ref = torch_out(load_torch(folder), PROMPT)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert np.max(np.abs(ref)) > 1.0  # the comparison is not between two near-zero tensors
    assert_matches(ours, ref)


@pytest.mark.parametrize("model", ["gpt2_dir", "llama_dir"])
def test_decode_with_kv_cache_matches_full_sequence(model, request):
    folder = request.getfixturevalue(model)
    sequence = PROMPT + [7, 123, 480, 64]
    ref = torch_out(load_torch(folder), sequence)  # (len(sequence), vocab)
    runner = GraphRunner(load_hf(folder))
    assert_matches(runner.prefill(PROMPT), ref[:len(PROMPT)])
    for i in range(len(PROMPT), len(sequence)):
        assert_matches(runner.decode(sequence[i]), ref[i])
    assert runner.n_past == len(sequence)


@pytest.mark.parametrize("model", ["gpt2_dir", "llama_dir", "llama_tied_dir"])
def test_greedy_generation_equals_transformers_generate(model, request):
    folder = request.getfixturevalue(model)
    ours = GraphRunner(load_hf(folder)).generate_greedy(PROMPT, 8)
    with torch.no_grad():
        ref = load_torch(folder).generate(torch.tensor([PROMPT]), max_new_tokens=8,
                                          do_sample=False, eos_token_id=None, pad_token_id=0)
    assert ours == ref[0, len(PROMPT):].tolist()
    assert len(set(ours)) > 1  # a stuck model would make this test weak


def test_explicit_position_ids_match_transformers(llama_dir):
    # Not a plain shift: RoPE attention depends only on position differences.
    positions = [0, 2, 3, 7, 8, 12, 20]
    ours = GraphRunner(load_hf(llama_dir)).prefill(PROMPT, position_ids=positions)
    ref = torch_out(load_torch(llama_dir), PROMPT, position_ids=torch.tensor([positions]))
    assert_matches(ours, ref)
    assert not np.allclose(ours, GraphRunner(load_hf(llama_dir)).prefill(PROMPT), atol=1e-2)


def test_bf16_weights_are_widened_like_transformers(tmp_path):
    folder = make_llama(tmp_path, hidden=64, dtype="bfloat16")
    graph = load_hf(folder)
    assert graph.config.dtype == "bf16"
    assert {ref.dtype for ref in graph.weights.values()} == {"bf16"}
    ours = GraphRunner(graph).prefill(PROMPT)
    assert_matches(ours, torch_out(load_torch(folder), PROMPT))


def test_bert_for_masked_lm_reads_the_encoder_under_its_prefix(tmp_path):
    folder = make_bert(tmp_path, hidden=64, architecture="BertForMaskedLM")
    graph = load_hf(folder)
    assert graph.weights["tok_embed.weight"].key == "bert.embeddings.word_embeddings.weight"
    model = load_torch(folder)
    with torch.no_grad():
        ref = model.bert(torch.tensor([PROMPT])).last_hidden_state[0].numpy()
    assert_matches(GraphRunner(graph).prefill(PROMPT), ref)

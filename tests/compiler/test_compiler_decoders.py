"""Compiled GPT-2 and Llama decoders on the emulated wse3 against transformers (the bar) and
the NumPy golden model (isa.graph_numpy, checked against transformers in tests/graph).

Random-weight models written with NumPy (tests/compiler/np_models.py); the mesh program runs
one token per run with the KV cache resident in SRAM; prefill feeds the prompt token by token.
Only the tests named ..._transformers need PyTorch; the others run without it.
"""

import numpy as np
import pytest

from wse_emu.emulator.generate import Generator
from wse_emu.emulator.load import LoadError
from wse_emu.isa.machine import load_machine
from wse_emu.isa.binfmt import dumps
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.pipeline import load_graph
from wse_emu.isa.graph_numpy import GraphRunner
from tests.compiler.np_models import make_gpt2, make_llama

PROMPT = [5, 17, 300]
N_TOKENS = 8
MAX_CONTEXT = 16
# The pure-Python interpreter (the definition of the semantics) is fast enough for these
# models; test_numba_core_agrees_with_the_reference checks the core on the same programs.
ENGINE = "core"  # the Numba core; test_numba_core_agrees_with_the_reference checks it


@pytest.fixture(scope="module")
def wse3():
    return load_machine("wse3")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    return {"gpt2": make_gpt2(root), "llama": make_llama(root),
            "gpt2_bf16": make_gpt2(root, dtype="bfloat16", name="gpt2_bf16", seed=3),
            "llama_bf16": make_llama(root, dtype="bfloat16", name="llama_bf16", seed=4)}


def _torch():
    """PyTorch and transformers' model loader, or a skip where they are not installed."""
    torch = pytest.importorskip("torch")
    from tests.graph.hf_models import load_torch
    torch.set_num_threads(2)
    return torch, load_torch


@pytest.fixture(scope="module")
def compiled(models, wse3):
    return {name: compile_model(path, wse3, max_context=MAX_CONTEXT)
            for name, path in models.items() if name in ("gpt2", "llama")}


def _torch_greedy(model_dir, prompt, n):
    torch, load_torch = _torch()
    model = load_torch(model_dir)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
        ids = out[0].tolist()
        logits = model(torch.tensor([ids[:-1]])).logits[0].numpy()  # (T, vocab)
    return ids[len(prompt):], logits


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_greedy_tokens_and_logits_match_transformers(family, models, compiled, wse3):
    program, _ = compiled[family]
    want_ids, want_logits = _torch_greedy(models[family], PROMPT, N_TOKENS)
    gen = Generator(program, wse3, engine=ENGINE)
    result = gen.generate(PROMPT, N_TOKENS)
    assert result.generated_ids == want_ids
    gen.reset()
    got = np.stack([gen.step(t) for t in PROMPT + want_ids[:-1]])  # every position's logits
    scale = np.abs(want_logits).max()
    np.testing.assert_allclose(got, want_logits, rtol=1e-3, atol=1e-4 * scale)


def test_weights_are_referenced_not_copied(models, compiled, tmp_path):
    program, _ = compiled["gpt2"]
    files = {t.file for t in program.tensors if t.file is not None}
    assert files == {str((models["gpt2"] / "model.safetensors").resolve())}
    inline = sum(len(t.data) for t in program.tensors if t.data is not None)
    assert inline < 4096  # position defaults only
    blob = dumps(program)
    assert len(blob) < (models["gpt2"] / "model.safetensors").stat().st_size / 10
    # the fused c_attn is one tensor, addressed three times (q, k, v row blocks)
    keys = [t.key for t in program.tensors]
    assert keys.count("transformer.h.0.attn.c_attn.weight") == 1


def test_generate_reports_cycles_and_per_layer_costs(compiled, wse3):
    program, _ = compiled["gpt2"]
    r = Generator(program, wse3, engine=ENGINE).generate(PROMPT, 3)
    assert len(r.cycles_per_token) == 3 and all(c > 1000 for c in r.cycles_per_token)
    # later positions attend over more cached keys: never cheaper
    assert r.cycles_per_token == sorted(r.cycles_per_token)
    assert r.seconds_per_token == pytest.approx(np.mean(r.cycles_per_token) / wse3.clock_hz)
    assert r.tokens_per_second == pytest.approx(1 / r.seconds_per_token)
    assert list(r.per_layer) == ["embed", "layer 0", "layer 1", "head"]
    assert all(v["compute"] > 0 for v in r.per_layer.values())
    assert r.prefill_cycles > 0 and r.host_seconds > 0


def test_kv_cache_persists_between_runs_and_reset_clears_it(compiled, wse3):
    program, _ = compiled["llama"]
    gen = Generator(program, wse3, engine=ENGINE)
    first = gen.prefill([7, 8])
    again = gen.prefill([7, 8])  # prefill starts a new sequence
    np.testing.assert_array_equal(first, again)
    fresh = gen.prefill([8])  # same token at position 0 sees no cache: differs from above
    assert not np.allclose(fresh, first)


def test_full_cache_is_refused(models, wse3):
    program, _ = compile_model(models["gpt2"], wse3, max_context=3)
    gen = Generator(program, wse3, engine=ENGINE)
    gen.prefill([1, 2, 3])
    with pytest.raises(LoadError, match="KV cache full"):
        gen.step(1)


def _bf16_logits(path, wse3):
    program, report = compile_model(path, wse3, dtype="bf16", max_context=MAX_CONTEXT)
    assert report.dtype == "bf16"
    gen = Generator(program, wse3, engine=ENGINE)
    return np.stack([gen.step(t) if i else gen.prefill([t]) for i, t in enumerate(PROMPT)])


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_bf16_weights_match_the_golden_model(family, models, wse3):
    """A bf16 checkpoint stored as bf16 in SRAM: the mesh reads the same numbers transformers
    widens, and accumulates in fp32 (fmac mixed), so fp32 tolerances still hold. Its KV caches
    are bf16 too (k and v rounded on append), which the golden model does the same way."""
    path = models[f"{family}_bf16"]
    want = GraphRunner(load_graph(path, max_context=MAX_CONTEXT), kv_dtype="bf16").prefill(PROMPT)
    got = _bf16_logits(path, wse3)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_bf16_weights_match_transformers(family, models, wse3):
    """The same against transformers, which widens the bf16 weights and keeps its KV cache in
    fp32: the mesh's bf16 KV cache (2^-9 relative rounding) is all that differs."""
    torch, load_torch = _torch()
    path = models[f"{family}_bf16"]
    got = _bf16_logits(path, wse3)
    with torch.no_grad():
        want = load_torch(path)(torch.tensor([PROMPT])).logits[0].numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=BF16_KV_BOUND * np.abs(want).max())


BF16_KV_BOUND = 1e-2


@pytest.mark.parametrize("dtype, bound", [("fp16", 0.003), ("bf16", 0.02)])
def test_fp32_model_stored_in_16_bits_stays_close(dtype, bound, models, wse3):
    """16-bit storage rounds every weight (fp16: 2^-11 relative, bf16: 2^-8): logits move a
    little, in proportion."""
    path = models["gpt2"]
    program, _ = compile_model(path, wse3, dtype=dtype, max_context=MAX_CONTEXT)
    want = GraphRunner(load_graph(path, max_context=MAX_CONTEXT)).prefill(PROMPT)[-1]
    got = Generator(program, wse3, engine=ENGINE).prefill(PROMPT)
    error = np.abs(got - want).max() / np.abs(want).max()
    assert bound / 100 < error < bound


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_numba_core_agrees_with_the_reference(family, compiled, wse3):
    program, _ = compiled[family]
    runs = {}
    for engine in ("reference", "core"):
        gen = Generator(program, wse3, engine=engine)
        logits = [gen.step(t) for t in PROMPT]
        runs[engine] = (np.stack(logits), gen.last_result.cycles)
    np.testing.assert_array_equal(runs["core"][0], runs["reference"][0])
    assert runs["core"][1] == runs["reference"][1]


@pytest.mark.parametrize("make, options", [
    (make_llama, dict(hidden=64, tie=True, rope_theta=500000.0, kv_heads=4, layers=1)),
    (make_gpt2, dict(hidden=64, tie=False, activation="gelu", layers=3, heads=2)),
])
def test_variants_match_the_golden_model(make, options, tmp_path, wse3):
    """Tied Llama head with another RoPE theta and plain multi-head attention; untied GPT-2
    with erf GELU, three layers and two heads."""
    path = make(tmp_path, seed=7, **options)
    program, _ = compile_model(path, wse3, max_context=4)
    gen = Generator(program, wse3, engine=ENGINE)
    got = np.stack([gen.step(t) for t in PROMPT])
    want = GraphRunner(load_graph(path, max_context=4)).prefill(PROMPT)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())

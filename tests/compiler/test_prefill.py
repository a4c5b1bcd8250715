"""Prefill programs (compile --prefill B): a run takes B consecutive prompt positions of one
sequence, appended in order to one KV cache; pipelined through the layers' regions on a wafer,
batched on a GPU (node). The prompt's logits and the greedy ids after it are transformers',
and its time to first token is far below a token a run.

Functional runs against transformers need torch (skipped without it); the rest needs none.
"""

import dataclasses
import json
from dataclasses import replace

import numpy as np
import pytest

from wse_emu.emulator.generate import Generator
from wse_emu.emulator.load import LoadError
from wse_emu.isa.binfmt import check_program, dumps, loads
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.lower import CompileError
from wse_emu.isa.errors import FormatError
from wse_emu.isa.machine import load_machine, system_of

PROMPT = [5, 17, 300, 7, 8, 1, 2, 3, 4, 9, 11]  # 11 tokens: runs of 4, the last one short
N_TOKENS = 8
SMALL = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=256,
             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=512, vocab_size=1024, max_position_embeddings=64)


def gpu(width: int = 8, **changes):
    return dataclasses.replace(load_machine("h100"), width=width, **changes)


MACHINES = {"wse3": lambda: load_machine("wse3"), "wse3x2": lambda: load_machine("wse3x2"),
            "gpu": gpu, "gpu2": lambda: gpu(2),
            "node": lambda: system_of(gpu(8, hbm_bytes=64 * 2**20), 2)}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    torch = pytest.importorskip("torch")
    from tests.graph.hf_models import load_torch, make_llama
    torch.set_num_threads(2)
    path = make_llama(tmp_path_factory.mktemp("prefill"), hidden=128, layers=4, heads=4,
                      kv_heads=2)
    model = load_torch(path)
    with torch.no_grad():
        ids = model.generate(torch.tensor([PROMPT]), max_new_tokens=N_TOKENS,
                             do_sample=False)[0].tolist()[len(PROMPT):]
        logits = model(torch.tensor([PROMPT])).logits[0].float().numpy()
    return path, ids, logits


@pytest.mark.parametrize("name", list(MACHINES))
def test_prefill_gives_the_ids_of_transformers(name, llama):
    """The prompt in runs of 4 positions (the last one short), then 8 greedy ids: those of
    transformers; on a wafer, split over two, one GPU (8 SMs, and 2: fewer SMs than
    positions) and a node of 2 GPUs."""
    path, want, _ = llama
    m = MACHINES[name]()
    program, report = compile_model(path, m, max_context=32, sequences=4, prefill=True)
    assert report.prefill and program.model.prefill and program.model.sequences == 4
    program = loads(dumps(program))  # the prefill survives program.bin
    assert program.model.prefill
    res = Generator(program, m).generate(PROMPT, N_TOKENS)
    assert res.generated_ids == want
    assert res.prefill_positions == 4 and res.ttft_prompt_lengths == [len(PROMPT)]
    # the first token: the prompt's 3 runs, the last of which gives its logits
    assert res.prefill_cycles + res.cycles_per_token[0] == pytest.approx(
        res.ttft_seconds[0] * m.clock_hz)
    assert res.prefill_tokens_per_second == pytest.approx(len(PROMPT) / res.ttft_seconds[0])


@pytest.mark.parametrize("name", ["wse3", "gpu"])
def test_a_run_has_the_logits_of_transformers_at_its_last_position(name, llama):
    """A run's last position attends to the earlier positions of the same run: the one cache
    is appended in order. A wafer's prefill program outputs that position's logits only (its
    head keeps one row), a GPU's every position's. A run may repeat positions already cached
    (the host ends a prompt's last run at its last token): the same values are rewritten."""
    path, _, want = llama
    m = MACHINES[name]()
    program, _ = compile_model(path, m, max_context=32, sequences=4, prefill=True)
    rows = dict((s.name, s.shape) for s in program.symbols)["logits"][0]
    assert rows == (1 if name == "wse3" else 4)
    gen = Generator(program, m)
    for start in (0, 4, 5):
        got = gen.step_all(PROMPT[start:start + 4], list(range(start, start + 4)))
        w = want[start:start + 4][-rows:]
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


def _folder(tmp_path, config):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_one_cache_and_the_code_of_sequences(tmp_path):
    """A prefill program holds one KV cache a layer (not B), and its layers run the same
    code as B sequences in flight but for the caches' offsets."""
    wse3 = load_machine("wse3")
    folder = _folder(tmp_path, SMALL)

    def caches(p):
        return {(r.name, a.name): a.nbytes for r in p.regions
                for a in r.allocs if a.name in ("kcache", "vcache")}
    one, _ = compile_model(folder, wse3, dtype="bf16", shape_only=True)
    eight, _ = compile_model(folder, wse3, dtype="bf16", shape_only=True, sequences=8)
    pre, report = compile_model(folder, wse3, dtype="bf16", shape_only=True, sequences=8,
                                prefill=True)
    assert caches(pre) == caches(one) and caches(pre)
    assert all(v == 8 * caches(one)[k] for k, v in caches(eight).items())
    def code(p):  # but the head's, which keeps one row of logits, not B
        return {r.name: len(r.code) for r in p.regions if not r.name.endswith(".head")}
    assert code(pre) == code(eight) and len(code(pre)) == len(pre.regions) - 1
    shapes = {s.name: tuple(s.shape) for s in pre.symbols}
    assert shapes["input_ids"] == shapes["position_ids"] == (8,)
    assert "prefill: 8 consecutive prompt positions a run" in str(report)
    gpu_pre, gpu_report = compile_model(folder, gpu(), dtype="bf16", shape_only=True,
                                        sequences=8, prefill=True)
    _, gpu_eight = compile_model(folder, gpu(), dtype="bf16", shape_only=True, sequences=8)
    kv = gpu_pre.meta["compiler"]["kv_hbm_bytes"]
    assert 8 * kv == compile_model(folder, gpu(), dtype="bf16", shape_only=True,
                                   sequences=8)[0].meta["compiler"]["kv_hbm_bytes"]
    assert gpu_report.hbm_bytes < gpu_eight.hbm_bytes


def test_prefill_is_checked(tmp_path):
    wse3 = load_machine("wse3")
    folder = _folder(tmp_path, SMALL)
    with pytest.raises(CompileError, match="2 or more positions"):
        compile_model(folder, wse3, dtype="bf16", shape_only=True, prefill=True)
    with pytest.raises(CompileError, match="--prefill 4 needs the wafer mapping"):
        compile_model(folder, wse3, dtype="bf16", shape_only=True, sequences=4, prefill=True,
                      mapping="chain")
    program, _ = compile_model(folder, wse3, dtype="bf16", shape_only=True, sequences=4,
                               prefill=True)
    for bad in ({"prefill": 1}, {"prefill": "yes"}):
        with pytest.raises(FormatError, match="prefill"):
            check_program(replace(program, model=replace(program.model, **bad)))
    gen = Generator(program, wse3, timing_only=True)
    with pytest.raises(LoadError, match="one prompt"):
        gen.generate([[1, 2], [3]], 1)
    with pytest.raises(LoadError, match="max_context"):
        gen.generate([], 2, position=63)


@pytest.mark.parametrize("name", ["wse3", "gpu"])
def test_prefill_timing(name, tmp_path):
    """Timing-only: a run of 8 positions costs far less than 8 runs of one; the time to first
    token of a long prompt is far below a token a run. On a wafer a run costs the same at
    every position, so one run is emulated; on a GPU the first and the last, the others
    taken as their mean, within a few percent of emulating every run."""
    m = MACHINES[name]()
    folder = _folder(tmp_path, SMALL)
    one, _ = compile_model(folder, m, dtype="bf16", shape_only=True)
    pre, report = compile_model(folder, m, dtype="bf16", shape_only=True, sequences=8,
                                prefill=True)
    step = Generator(one, m, timing_only=True).generate([3], 1, position=39)
    gen = Generator(pre, m, timing_only=True)
    res = gen.generate([3], 1, position=39)  # a prompt of 40 positions: 5 runs of 8
    run = res.cycles_per_token[0]
    assert step.cycles_per_token[0] < run < 0.6 * 8 * step.cycles_per_token[0]
    assert res.ttft_prompt_lengths == [40]
    assert res.ttft_seconds[0] < 40 * step.cycles_per_token[0] / m.clock_hz / 2
    # every run emulated: the functional path of the driver, fed on a timing-only program
    every = 0
    gen.reset()
    for start in range(0, 40, 8):
        gen.step_all([3] * 8, list(range(start, start + 8)))
        every += gen.last_result.cycles
    assert res.ttft_seconds[0] * m.clock_hz == pytest.approx(every, rel=0.03)
    assert ("the one emulated" if name == "wse3" else "the first and the last") in res.note
    if name == "wse3":
        assert res.predicted_cycles == report.step_cycles


def test_gpt2_prefill_gives_the_ids_of_transformers(tmp_path):
    """GPT-2 (learned position embeddings, biases, LayerNorm) in runs of 4 on a wafer."""
    torch = pytest.importorskip("torch")
    from tests.graph.hf_models import load_torch, make_gpt2
    torch.set_num_threads(2)
    path = make_gpt2(tmp_path)
    with torch.no_grad():
        want = load_torch(path).generate(torch.tensor([PROMPT]), max_new_tokens=N_TOKENS,
                                         do_sample=False)[0].tolist()[len(PROMPT):]
    m = load_machine("wse3")
    program, _ = compile_model(path, m, max_context=32, sequences=4, prefill=True)
    assert Generator(program, m).generate(PROMPT, N_TOKENS).generated_ids == want

"""Several sequences on the HBM target (compile --sequences B for a GPU or a GPU node): a
batched step. B token ids and B positions a run, a KV cache a sequence, every weight tile read
from HBM once a step and multiplied by the B activations (`mma`), logits B x vocab: the same
interface as the wafer mapping's sequences (tests/compiler/test_sequences.py), so `generate`
runs it unchanged.

GPU presets cut to a few cores (dataclasses.replace of h100's width) keep the runs short.
"""

import dataclasses

import numpy as np
import pytest
torch = pytest.importorskip("torch")

import wse_emu.isa.compiler.hbm as hbm
from wse_emu.emulator.generate import Generator
from wse_emu.isa.binfmt import dumps, loads
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.lower import CompileError
from wse_emu.isa.machine import load_machine, system_of
from tests.graph.hf_models import load_torch, make_gpt2, make_llama

PROMPTS = [[5, 17, 300], [7, 8], [1, 2, 3, 4, 9]]  # of different lengths
N_TOKENS = 8
MAX_CONTEXT = 16


def gpu(width: int = 8, **changes):
    return dataclasses.replace(load_machine("h100"), width=width, **changes)


def node(gpus: int, width: int = 8):
    return system_of(gpu(width, hbm_bytes=64 * 2**20), gpus)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("hbm_batch")
    return {"llama": make_llama(root, hidden=128, layers=4, heads=4, kv_heads=2),
            "gpt2": make_gpt2(root, vocab=511)}


@pytest.fixture(scope="module")
def want(models):
    """Each prompt's 8 greedy ids from transformers, the prompt alone."""
    out = {}
    for name, path in models.items():
        model = load_torch(path)
        with torch.no_grad():
            out[name] = [model.generate(torch.tensor([p]), max_new_tokens=N_TOKENS,
                                        do_sample=False)[0].tolist()[len(p):]
                         for p in PROMPTS]
    return out


@pytest.mark.parametrize("family,machine", [("llama", "gpu"), ("gpt2", "gpu"),
                                            ("llama", "node"), ("gpt2", "node")])
def test_three_sequences_get_the_ids_each_gets_alone(family, machine, models, want):
    """3 sequences of different prompts in one batched step: each gets the 8 greedy ids
    transformers gives it alone; on one GPU and on a node of 2 (tensor parallel)."""
    m = gpu() if machine == "gpu" else node(2)
    program, report = compile_model(models[family], m, max_context=MAX_CONTEXT, sequences=3)
    assert report.sequences == 3 and program.model.sequences == 3
    shapes = {s.name: tuple(s.shape) for s in program.symbols}
    assert shapes["input_ids"] == shapes["position_ids"] == (3,)
    assert shapes["logits"][0] == 3
    program = loads(dumps(program))  # the sequences survive program.bin
    result = Generator(program, m).generate(PROMPTS, N_TOKENS)
    assert result.ids_per_sequence == want[family]
    assert result.sequences == 3


@pytest.mark.parametrize("width", [8, 2])
def test_a_batched_step_gives_the_logits_of_one_sequence_runs(width, models):
    """Sequence s of a step at positions (t, t, t) has the logits the B = 1 program gives at
    its own position, to the rounding of the order of the sums; with 8 SMs the norms run
    sequence b on SM b, with 2 (fewer SMs than sequences) SM 0 loops over the sequences."""
    m = gpu(width)
    one, _ = compile_model(models["llama"], m, max_context=MAX_CONTEXT)
    three, _ = compile_model(models["llama"], m, max_context=MAX_CONTEXT, sequences=3)
    alone = [Generator(one, m) for _ in range(3)]
    batch = Generator(three, m)
    seqs = [[3, 9, 27], [11, 4, 40], [100, 2, 7]]
    for t in range(3):
        got = batch.step_all([s[t] for s in seqs], [t, t, t])
        for b, (gen, s) in enumerate(zip(alone, seqs)):
            w = gen.step(s[t])
            np.testing.assert_allclose(got[b], w, rtol=1e-5, atol=1e-5 * np.abs(w).max())


@pytest.mark.parametrize("machine", ["gpu", "node"])
def test_timing_only_gives_the_cycles_of_the_functional_run(machine, models):
    m = gpu() if machine == "gpu" else node(2)
    shape, _ = compile_model(models["gpt2"], m, max_context=MAX_CONTEXT, shape_only=True,
                             sequences=3)
    full, _ = compile_model(models["gpt2"], m, max_context=MAX_CONTEXT, sequences=3)
    timing, functional = Generator(shape, m, timing_only=True), Generator(full, m)
    for pos in range(3):
        ids, positions = [5, 6 + pos, 7], [pos, pos, max(0, pos - 1)]
        assert timing.step_all(ids, positions) is None
        functional.step_all(ids, positions)
        assert timing.last_result.cycles == functional.last_result.cycles, pos
        assert timing.last_result.hbm_read_bytes == functional.last_result.hbm_read_bytes


def test_numba_core_agrees_with_the_reference_interpreter(models):
    m = gpu(3)
    program, _ = compile_model(models["llama"], m, max_context=MAX_CONTEXT, sequences=2)
    a, b = Generator(program, m, engine="core"), Generator(program, m, engine="reference")
    for t in range(2):
        np.testing.assert_array_equal(a.step_all([t + 1, 9], [t, t]),
                                      b.step_all([t + 1, 9], [t, t]))
        assert a.last_result.cycles == b.last_result.cycles


def test_weights_are_read_once_a_step_whatever_the_sequences(models):
    """A step of 4 sequences reads the weight matrices once: its HBM reads exceed one
    sequence's by the activations and KV caches only (far less than the weights), and it
    costs less than 4 steps of one sequence."""
    m = gpu()
    reads, cycles = {}, {}
    for B in (1, 4):
        program, report = compile_model(models["llama"], m, max_context=MAX_CONTEXT,
                                        shape_only=True, sequences=B)
        gen = Generator(program, m, timing_only=True)
        gen.step_all([1] * B, [5] * B)
        reads[B], cycles[B] = gen.last_result.hbm_read_bytes, gen.last_result.cycles
        weights = report.weight_hbm_bytes
        assert reads[B] >= weights  # every weight byte crosses
    assert reads[4] - reads[1] < weights / 2
    assert cycles[1] < cycles[4] < 4 * cycles[1]


def test_activations_come_in_column_chunks_when_sram_is_short(models):
    """SRAM too small for 3 sequences' activations beside two weight blocks: the gemvs take
    K a chunk of columns at a time (accumulating with mma); the same logits."""
    big, _ = compile_model(models["llama"], gpu(3), max_context=MAX_CONTEXT, sequences=3)
    want = Generator(big, gpu(3)).step_all([4, 5, 6], [0, 0, 0])
    small = gpu(3, sram_bytes=26 * 1024)
    assert not any(kc < K for kc, K in _chunks(models["llama"], gpu(3)))
    assert any(kc < K for kc, K in _chunks(models["llama"], small))
    program, _ = compile_model(models["llama"], small, max_context=MAX_CONTEXT, sequences=3)
    got = Generator(program, small).step_all([4, 5, 6], [0, 0, 0])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _chunks(model, machine):
    """(columns a chunk, K) of every gemv of the model's 3-sequence kernel."""
    from wse_emu.isa.compiler.lower import lower
    from wse_emu.isa.compiler.pipeline import load_graph
    from wse_emu.isa.graph import bind_positions

    plan = lower(bind_positions(load_graph(model, max_context=MAX_CONTEXT), 1))
    c = hbm.HbmCompiler(plan, machine, "f32", False, None, "m", sequences=3)
    c.compile()
    return [(kc, plan.stages[sid].in_len) for sid, kc in c.chunks.items()]


def test_too_many_sequences_for_sram_are_refused_in_one_line(models):
    with pytest.raises(CompileError) as e:
        compile_model(models["llama"], gpu(3, sram_bytes=40 * 1024), max_context=MAX_CONTEXT,
                      sequences=64)
    assert "\n" not in str(e.value) and "fewer sequences" in str(e.value)


@pytest.mark.parametrize("switch,crossings", [(False, 2), (True, 1)])
def test_a_node_allreduces_the_sequences_together(models, switch, crossings):
    """On a node the B sequences' slices go through one allreduce (its link crossings paid
    once, not once a sequence: 2 for the chain of GPUs joined point to point, 1 for the
    one-shot through a switch), while the logit gather runs once a sequence (a loop, whose
    gathers may overlap): on 2 GPUs with 3 sequences, a longer link latency costs GPT-2's 4
    allreduces that many latencies each, and the gathers between 1 and 3 times as many."""
    cycles = {}
    for latency in (1100, 2100):
        m = dataclasses.replace(node(2), link_switch=switch, link_latency=latency)
        program, _ = compile_model(models["gpt2"], m, max_context=MAX_CONTEXT,
                                   shape_only=True, sequences=3)
        gen = Generator(program, m, timing_only=True)
        gen.step_all([1, 2, 3], [0, 1, 2])
        cycles[latency] = gen.last_result.cycles
    diff = cycles[2100] - cycles[1100]
    assert (4 + 1) * crossings * 1000 <= diff <= (4 + 3) * crossings * 1000


def test_node_core_agrees_with_the_reference_interpreter(models):
    m = node(2, width=3)
    program, _ = compile_model(models["llama"], m, max_context=MAX_CONTEXT, sequences=2)
    a, b = Generator(program, m, engine="core"), Generator(program, m, engine="reference")
    for t in range(2):
        np.testing.assert_array_equal(a.step_all([t + 1, 9], [t, 0]),
                                      b.step_all([t + 1, 9], [t, 0]))
        assert a.last_result.cycles == b.last_result.cycles

"""Tensor parallelism on a GPU node (isa/compiler/hbm_tp.py): a GPT-2 and a Llama split over
2 or 4 GPUs generate transformers' greedy ids, with one-shot allreduces through a switch and
chains point to point; the allreduces cross the node's links with the bytes their formula
says, and the formulas predict what the one-shot saves; every GPU streams only its share of
the weights and the step never beats that share over one GPU's bandwidth; a model too big for
one GPU is refused there saying how many would hold it, and compiles on such a node.

A GPU cut to a few SMs and a small HBM (dataclasses.replace of h100's) keeps the runs short:
the kernel is the same for any width, and each GPU's HBM range is hbm_bytes long.
"""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
torch = pytest.importorskip("torch")

from wse_emu.emulator.generate import Generator
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.hbm_tp import allreduce_cycles, allreduce_form, oneshot_cycles
from wse_emu.isa.compiler.lower import CompileError
from wse_emu.isa.machine import load_machine, system_of
from tests.graph.hf_models import load_torch, make_gpt2, make_llama

PROMPT = [5, 17, 300]
N_TOKENS = 8
MAX_CONTEXT = 16


def node(gpus: int, width: int = 8, hbm_bytes: int = 64 * 2**20, **changes):
    chip = dataclasses.replace(load_machine("h100"), width=width, hbm_bytes=hbm_bytes,
                               **changes)
    return system_of(chip, gpus)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("node")
    # vocabulary 511: the LM head's last slice on 2 GPUs is one row short (padded)
    return {"gpt2": make_gpt2(root, vocab=511), "llama": make_llama(root)}


def _torch_ids(model_dir, prompt, n):
    model = load_torch(model_dir)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0].tolist()[len(prompt):]


@pytest.mark.parametrize("family,gpus,switch,latency", [
    ("gpt2", 2, True, None), ("llama", 2, True, None), ("llama", 4, True, None),
    ("llama", 4, False, None), ("gpt2", 2, True, 100)])
def test_greedy_ids_match_transformers(family, gpus, switch, latency, models):
    """4 GPUs for the Llama (2 KV heads): each KV head is replicated on the two GPUs whose
    query heads read it. Through a switch the allreduces are one-shot, point to point
    chains; with a short latency the logit gather's block is cheaper as a chain."""
    m = node(gpus, link_switch=switch)
    if latency:
        m = dataclasses.replace(m, link_latency=latency)
    program, report = compile_model(models[family], m, max_context=MAX_CONTEXT)
    assert report.fabric == (8, gpus)
    assert allreduce_form(m, 128)[0] == ("oneshot" if switch else "chain")
    if latency:
        assert allreduce_form(m, 256, gpus)[0] == "chain"  # the gather: vocabulary 511
    gen = Generator(program, m)
    got = gen.generate(PROMPT, N_TOKENS).generated_ids
    assert got == _torch_ids(models[family], PROMPT, N_TOKENS)


def test_logits_match_the_one_gpu_program(models):
    ids = PROMPT + [9, 200]
    one, _ = compile_model(models["llama"], node(1), max_context=MAX_CONTEXT)
    two, _ = compile_model(models["llama"], node(2), max_context=MAX_CONTEXT)
    a, b = Generator(one, node(1)), Generator(two, node(2))
    want = np.stack([a.step(t) for t in ids])
    got = np.stack([b.step(t) for t in ids])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_timing_only_gives_the_cycles_of_the_functional_run(models):
    m = node(2)
    shape, _ = compile_model(models["gpt2"], m, max_context=MAX_CONTEXT, shape_only=True)
    full, _ = compile_model(models["gpt2"], m, max_context=MAX_CONTEXT)
    timing, functional = Generator(shape, m, timing_only=True), Generator(full, m)
    for pos, tok in enumerate(PROMPT):
        assert timing.step(tok) is None
        functional.step(tok)
        assert timing.last_result.cycles == functional.last_result.cycles, pos
        assert timing.last_result.hbm_read_bytes == functional.last_result.hbm_read_bytes


@pytest.mark.parametrize("gpus,switch", [(2, True), (4, True), (2, False)])
def test_numba_core_agrees_with_the_reference_interpreter(models, gpus, switch):
    """3 SMs a GPU: the one-shot's one pair and an SM left out."""
    m = node(gpus, width=3, link_switch=switch)
    program, _ = compile_model(models["llama"], m, max_context=MAX_CONTEXT)
    a, b = Generator(program, m, engine="core"), Generator(program, m, engine="reference")
    for tok in PROMPT[:2]:
        np.testing.assert_array_equal(a.step(tok), b.step(tok))
        assert a.last_result.cycles == b.last_result.cycles
        np.testing.assert_array_equal(a.last_result.pipe_wavelets, b.last_result.pipe_wavelets)


def test_each_gpu_streams_its_share_and_the_step_respects_its_floor(models):
    """Per GPU the weight matrices are 1/G of one GPU's (the vocabulary 511 splits 256 + 255,
    the short slice padded); all GPUs read them every token; the step takes at least one
    GPU's share over one GPU's achievable bandwidth."""
    _, one = compile_model(models["gpt2"], node(1), max_context=MAX_CONTEXT, shape_only=True)
    m = node(2)
    program, two = compile_model(models["gpt2"], m, max_context=MAX_CONTEXT, shape_only=True)
    pad = 128 * 4  # the LM head's zero row: hidden 128, f32
    assert 2 * two.weight_hbm_bytes == one.weight_hbm_bytes + pad
    gen = Generator(program, m, timing_only=True)
    gen.step(1)
    r = gen.last_result
    assert r.cycles >= two.weight_hbm_bytes / m.hbm_bytes_per_cycle
    assert r.hbm_read_bytes >= 2 * two.weight_hbm_bytes


def test_the_allreduces_move_the_bytes_of_their_formula(models):
    """Two allreduces a layer of the hidden vector and the logit gather (a block of G slices).
    Point to point (chain, n = ceil(hidden / SMs) floats a column): the reduce and the
    broadcast back each cross every link between neighbouring GPUs once a column. Through a
    switch (one-shot, n = ceil(hidden / pairs) a pair of SMs): every GPU's port carries G - 1
    copies of every pair's slice."""
    hidden, layers, vocab = 128, 2, 511
    for gpus in (2, 4):
        for switch in (False, True):
            m = node(gpus, link_switch=switch)
            program, _ = compile_model(models["gpt2"], m, max_context=MAX_CONTEXT,
                                       shape_only=True)
            gen = Generator(program, m, timing_only=True)
            gen.step(1)
            pipes = gen.last_result.pipe_wavelets
            vg = -(-vocab // gpus)
            if not switch:
                n, nv = -(-hidden // m.width), gpus * -(-vg // m.width)
                per_link = 2 * layers * 2 * n * m.width + 2 * nv * m.width  # both ways
                assert len(pipes) == 2 * (gpus - 1)
                assert int(pipes.sum()) == (gpus - 1) * per_link
            else:
                pairs = m.width // 2
                n, nv = -(-hidden // pairs), gpus * -(-vg // pairs)
                port = (gpus - 1) * pairs * (2 * layers * n + nv)
                assert pipes.tolist() == [port] * gpus


@pytest.mark.parametrize("switch,crossings", [(False, 2), (True, 1)])
def test_a_longer_link_latency_costs_each_allreduce_its_crossings(models, switch, crossings):
    """Point to point, each allreduce waits for 2 x max(root, G - 1 - root) link crossings in
    a row (reduce toward the middle GPU, broadcast back); through a switch, one (the one-shot):
    on 2 GPUs, 4 allreduces and the logit gather cost exactly 10 or 5 latencies more. (At
    latencies this long the gather is one-shot too; at 100 cycles it would be a chain.)"""
    cycles = {}
    for latency in (1100, 2100):
        m = dataclasses.replace(node(2, link_switch=switch), link_latency=latency)
        program, _ = compile_model(models["gpt2"], m, max_context=MAX_CONTEXT,
                                   shape_only=True)
        gen = Generator(program, m, timing_only=True)
        gen.step(1)
        cycles[latency] = gen.last_result.cycles
    assert cycles[2100] - cycles[1100] == 5 * crossings * 1000


@pytest.mark.parametrize("gpus,width", [(2, 8), (4, 8), (4, 16)])
def test_the_formulas_predict_what_the_one_shot_saves(models, gpus, width):
    """The same node point to point (chains) and through a switch (one-shots): the step's
    emulated saving is within 20 % of the formulas' (4 allreduces and the logit gather)."""
    cycles, pred = {}, 0
    for switch in (False, True):
        m = node(gpus, width=width, link_switch=switch)
        program, _ = compile_model(models["gpt2"], m, max_context=MAX_CONTEXT,
                                   shape_only=True)
        gen = Generator(program, m, timing_only=True)
        gen.step(1)
        cycles[switch] = gen.last_result.cycles
        layers, gather = allreduce_form(m, 128), allreduce_form(m, -(-511 // gpus), gpus)
        assert (layers[0], gather[0]) == (("oneshot",) * 2 if switch else ("chain",) * 2)
        pred += (1 if not switch else -1) * (4 * layers[2] + gather[2])
    saved = cycles[False] - cycles[True]
    assert pred > 0 and abs(saved - pred) <= 0.2 * saved, (saved, pred)


def test_the_form_follows_the_cost_formulas():
    """h100x8 at Llama-3-70B's hidden 8192: the one-shot (one latency, 7 copies of 125 floats
    a pair over the port) beats the chain (8 latencies); the same node point to point, or one
    whose latency is negligible beside the copies, keeps the chain."""
    m = load_machine("h100x8")
    form, n, t = allreduce_form(m, 8192)
    assert (form, n) == ("oneshot", 125)
    assert t == oneshot_cycles(m, 125) < allreduce_cycles(m, 63)  # the chain: 63 a column
    assert allreduce_form(dataclasses.replace(m, link_switch=False), 8192)[0] == "chain"
    slow = dataclasses.replace(m, link_latency=1, link_bandwidth=m.link_bandwidth / 100)
    assert allreduce_form(slow, 8192)[0] == "chain"


LLAMA_1K = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
            "intermediate_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 8,
            "num_key_value_heads": 4, "vocab_size": 8192, "max_position_embeddings": 2048,
            "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu"}


def test_a_model_too_big_for_one_gpu_is_refused_saying_how_many_hold_it(tmp_path):
    """92 MB of bf16 matrices and tables (16 MB of them the embedding every GPU keeps) on
    GPUs of 42 MB: refused on one and on two, naming four, which compiles."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_1K))
    small = dict(hbm_bytes=40 * 2**20)
    for gpus in (1, 2):
        with pytest.raises(CompileError) as e:
            compile_model(tmp_path, node(gpus, **small), dtype="bf16", max_context=64,
                          shape_only=True)
        msg = str(e.value)
        assert "\n" not in msg and "GB of HBM a GPU" in msg
        assert msg.endswith("4 GPUs would hold it (--machine h100x4)")
    _, report = compile_model(tmp_path, node(4, **small), dtype="bf16", max_context=64,
                              shape_only=True)
    assert report.hbm_bytes <= small["hbm_bytes"]


def test_heads_that_do_not_split_are_refused_in_one_line(models):
    with pytest.raises(CompileError) as e:
        compile_model(models["llama"], node(3), max_context=MAX_CONTEXT)
    assert "do not split over 3 GPUs" in str(e.value) and "\n" not in str(e.value)


LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
             "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
             "hidden_act": "silu", "torch_dtype": "bfloat16"}


def test_llama_3_70b_is_refused_on_h100_and_compiles_for_h100x8(tmp_path):
    """`wse-emu compile` as a user types it: one line, exit 2, on one GPU."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B))
    wse = str(Path(sys.executable).parent / "wse-emu")
    r = subprocess.run([wse, "compile", str(tmp_path / "config.json"), "--machine", "h100",
                        "--dtype", "bf16", "--shape-only", "-o", str(tmp_path / "m.bin")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("wse-emu: error: the model needs 143.")
    assert line.endswith("2 GPUs would hold it (--machine h100x2)")
    assert not (tmp_path / "m.bin").exists()
    m = load_machine("h100x8")
    program, report = compile_model(tmp_path, m, dtype="bf16", shape_only=True)
    assert report.fabric == (132, 8) and report.hbm_bytes <= m.hbm_bytes
    assert 17.0e9 < report.weight_hbm_bytes < 17.8e9  # 1/8 of 139 GB of matrices, a GPU
    assert len(program.regions[0].code) < 6000  # 80 layers, one loop

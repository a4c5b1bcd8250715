"""Several sequences in flight on the wafer mapping (compile --sequences B): B KV caches a
layer, a step takes one token of each sequence, the layers' regions pipeline them.

Functional runs against transformers need torch (skipped without it); the rest needs none.
"""

import json
from dataclasses import replace

import numpy as np
import pytest

from wse_emu.emulator.generate import Generator
from wse_emu.emulator.load import LoadError
from wse_emu.isa.binfmt import check_program, dumps, loads
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.lower import CompileError
from wse_emu.isa.program import pipelined_cycles
from wse_emu.isa.errors import FormatError
from wse_emu.isa.machine import load_machine

SMALL = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=256,
             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=512, vocab_size=1024, max_position_embeddings=64)
PROMPTS = [[5, 17, 300], [7, 8], [1, 2, 3, 4, 9]]  # of different lengths
N_TOKENS = 8


def _folder(tmp_path, name, config):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def wse3():
    return load_machine("wse3")


def _torch_ids(path, prompts, n):
    torch = pytest.importorskip("torch")
    from tests.graph.hf_models import load_torch
    model = load_torch(path)
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False)
            out.append(ids[0].tolist()[len(p):])
    return out


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_three_sequences_generate_the_ids_of_transformers(family, wse3, tmp_path):
    """3 sequences of different prompts in flight: each gets the 8 greedy ids transformers
    gives it alone, and the ids the same program's sequence gets alone."""
    torch = pytest.importorskip("torch")
    from tests.graph.hf_models import make_gpt2, make_llama
    torch.set_num_threads(2)
    path = (make_llama(tmp_path, hidden=128, layers=4, heads=4, kv_heads=2)
            if family == "llama" else make_gpt2(tmp_path))
    program, report = compile_model(path, wse3, max_context=16, sequences=3)
    assert report.sequences == 3 and program.model.sequences == 3
    program = loads(dumps(program))  # the sequences survive program.bin
    want = _torch_ids(path, PROMPTS, N_TOKENS)
    result = Generator(program, wse3).generate(PROMPTS, N_TOKENS)
    assert result.ids_per_sequence == want
    assert result.generated_ids == want[0] and result.sequences == 3
    # one prompt for all: every sequence gets that prompt's ids
    same = Generator(program, wse3).generate(PROMPTS[1], 3)
    assert same.ids_per_sequence == [want[1][:3]] * 3


def test_three_sequences_on_two_wafers_generate_the_ids_of_transformers(tmp_path):
    """The issue's bar: a 4-layer random Llama split over wse3x2, 3 sequences in flight."""
    torch = pytest.importorskip("torch")
    from tests.graph.hf_models import make_llama
    torch.set_num_threads(2)
    path = make_llama(tmp_path, hidden=128, layers=4, heads=4, kv_heads=2)
    machine = load_machine("wse3x2")
    program, report = compile_model(path, machine, max_context=16, sequences=3)
    assert program.model.chips == 2 and len(program.model.groups) == 2
    want = _torch_ids(path, PROMPTS, N_TOKENS)
    assert Generator(program, machine).generate(PROMPTS, N_TOKENS).ids_per_sequence == want


def test_code_does_not_grow_with_the_sequences_and_caches_do(wse3, tmp_path):
    folder = _folder(tmp_path, "m", SMALL)
    progs = {B: compile_model(folder, wse3, dtype="bf16", shape_only=True, sequences=B)[0]
             for B in (1, 2, 8)}
    code = {B: {r.name: len(r.code) for r in p.regions} for B, p in progs.items()}
    assert code[2] == code[8]  # one loop body, whatever B
    for B, p in progs.items():
        assert p.model.sequences == B
        shapes = {s.name: tuple(s.shape) for s in p.symbols}
        assert shapes["input_ids"] == shapes["position_ids"] == (B,)
        assert shapes["logits"] == (B, SMALL["vocab_size"])
        caches = {a.name: a.nbytes for r in p.regions if ".layers." in "." + r.name
                  for a in r.allocs if a.name in ("kcache", "vcache")}
        one = {a.name: a.nbytes for r in progs[1].regions if ".layers." in "." + r.name
               for a in r.allocs if a.name in ("kcache", "vcache")}
        assert caches and all(caches[k] == B * one[k] for k in caches)


def test_the_refusal_counts_every_sequence_cache(wse3, tmp_path):
    """A context that fits one sequence but not 16: refused in one line that names the
    sequences and a context that would fit, which then compiles."""
    folder = _folder(tmp_path, "m", dict(SMALL, max_position_embeddings=8192))
    compile_model(folder, wse3, dtype="bf16", shape_only=True)
    with pytest.raises(CompileError) as e:
        compile_model(folder, wse3, dtype="bf16", shape_only=True, sequences=16)
    msg = str(e.value)
    assert "\n" not in msg and "16 sequences" in msg and "--max-context" in msg
    fit = int(msg.split("--max-context ")[1].split(")")[0])
    assert fit < 8192
    _, report = compile_model(folder, wse3, dtype="bf16", shape_only=True, sequences=16,
                              max_context=fit)
    assert report.sram_max <= wse3.sram_bytes


def test_the_step_pipelines_the_sequences(wse3, tmp_path):
    """Emulated timing-only steps: B sequences take longer than one but much less than B
    steps of one; the compiler's pipelined prediction is within 25 % of the emulated."""
    folder = _folder(tmp_path, "m", SMALL)
    cycles, predicted = {}, {}
    for B in (1, 4):
        program, report = compile_model(folder, wse3, dtype="bf16", shape_only=True,
                                        sequences=B)
        assert report.step_cycles == pipelined_cycles(report.predicted, B)
        gen = Generator(program, wse3, timing_only=True)
        res = gen.generate([3], 1, position=20)
        cycles[B], predicted[B] = res.cycles_per_token[0], res.predicted_cycles
        assert predicted[B] == report.step_cycles
        assert abs(predicted[B] - cycles[B]) <= 0.25 * cycles[B], (B, predicted[B], cycles[B])
        assert res.aggregate_tokens_per_second == pytest.approx(B * res.tokens_per_second)
    assert cycles[1] < cycles[4] < 2 * cycles[1]


def test_pipelined_cycles():
    assert pipelined_cycles({"a": 10, "b": 30, "c": 20}, 1) == 60
    assert pipelined_cycles({"a": 10, "b": 30, "c": 20}, 4) == 60 + 3 * 30
    assert pipelined_cycles({}, 3) == 0


def test_model_info_sequences_are_validated(wse3, tmp_path):
    folder = _folder(tmp_path, "m", SMALL)
    program, _ = compile_model(folder, wse3, dtype="bf16", shape_only=True, sequences=3)
    assert loads(dumps(program)).model.sequences == 3
    info = program.model
    for bad in ({"sequences": 0}, {"sequences": 2}, {"sequences": True},
                {"sequences": 3, "positions": 2}):
        with pytest.raises(FormatError):
            check_program(replace(program, model=replace(info, **bad)))


def test_sequences_are_refused_where_they_do_not_apply(wse3, tmp_path):
    folder = _folder(tmp_path, "m", SMALL)
    with pytest.raises(CompileError, match="wafer mapping"):
        compile_model(folder, wse3, dtype="bf16", shape_only=True, sequences=2,
                      mapping="chain")
    for bad in (0, -1, 1.5):
        with pytest.raises(CompileError, match="sequences"):
            compile_model(folder, wse3, dtype="bf16", shape_only=True, sequences=bad)


def test_generate_checks_the_prompts_of_several_sequences(wse3, tmp_path):
    folder = _folder(tmp_path, "m", SMALL)
    program, _ = compile_model(folder, wse3, dtype="bf16", shape_only=True, sequences=3)
    gen = Generator(program, wse3, timing_only=True)
    with pytest.raises(LoadError, match="3 sequences"):
        gen.generate([[1], [2]], 1)
    with pytest.raises(LoadError, match="outside the vocabulary"):
        gen.generate([[1], [2], [5000]], 1)
    with pytest.raises(LoadError, match="max_context"):
        gen.generate([[1], [2], [3]], 1, position=64)
    with pytest.raises(LoadError, match="3 token ids"):
        gen.step_all([1, 2], [0, 0])
    res = gen.generate([[1, 2], [3], [4, 5, 6]], 2)
    assert res.sequences == 3 and len(res.cycles_per_token) == 2
    assert len(res.ttft_seconds) == 3 and res.ttft_prompt_lengths == [2, 1, 3]
    assert res.ttft_seconds[1] < res.ttft_seconds[0] < res.ttft_seconds[2]
    assert np.all(gen.positions == [3, 2, 4])  # each sequence's next position


def test_a_head_too_wide_for_the_bands_is_named(wse3, tmp_path):
    """Llama-3-8B's layers fit wse3's PEs, but with 32 sequences' rows of logits its head is
    668 columns wide and no band holds it: the refusal says so, not that PEs are missing."""
    from wse_emu.apps.benchsuite import BUILTIN_MODELS
    folder = _folder(tmp_path, "m", BUILTIN_MODELS["llama-3-8b"])
    with pytest.raises(CompileError) as e:
        compile_model(folder, wse3, dtype="bf16", shape_only=True, sequences=32,
                      max_context=1024)
    msg = str(e.value)
    assert "\n" not in msg and "cannot be placed in bands" in msg, msg
    assert "holding 32 rows of logits" in msg and msg.endswith("use fewer sequences")
    pes = int(msg.split("grids (")[1].split(" PEs")[0].replace(",", ""))
    assert pes < wse3.pes

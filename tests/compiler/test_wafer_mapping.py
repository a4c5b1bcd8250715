"""The wafer mapping of decode steps (isa/compiler/wafer.py): layouts, the cost model against
the emulator, full contexts, the model description in program.bin.

Numbers against transformers are in test_compiler_decoders.py; these tests need no torch:
shape-only compiles run timing-only, and the small functional model is checked against the
NumPy golden model.
"""

import json

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.emulator.generate import Generator
from wse_emu.isa.machine import load_machine
from wse_emu.isa.binfmt import dumps, loads
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.decoder import extract, grid_shapes
from wse_emu.isa.compiler.lower import lower
from wse_emu.isa.compiler.pipeline import load_graph
from wse_emu.isa.compiler.wafer import candidates, parse_grid
from wse_emu.isa.graph import bind_positions

LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=256,
             num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=512, vocab_size=1024, max_position_embeddings=256)
GPT2 = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=192, n_layer=3,
            n_head=6, vocab_size=1000, n_positions=128, activation_function="gelu_new")
LLAMA_3_8B = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096,
                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
                  rope_theta=500000.0)


@pytest.fixture(scope="module")
def wse3():
    return load_machine("wse3")


def _folder(tmp_path, name, config):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _part_cycles(program, result, loaded) -> dict:
    """Emulated cycles of each part of a step: when its last PE halts, minus when the part
    before it ended (the parts run one after the other)."""
    end = {}
    part_of = program.model.part_of_region()
    for ri, region in enumerate(program.regions):
        part = part_of[region.name]
        if part.name == "sources":
            continue  # they halt when the last layer has taken their rows
        pes = np.nonzero(loaded.pe_region == ri)[0]
        end[part.layer] = max(end.get(part.layer, 0), int(result.clock[pes].max()))
    out, prev = {}, 0
    names = {p.layer: p.name for p in program.model.parts if p.name != "sources"}
    for layer in sorted(end):
        out[names[layer]] = end[layer] - prev
        prev = end[layer]
    return out


@pytest.mark.parametrize("config", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_predicted_cycles_agree_with_the_emulator(config, wse3, tmp_path):
    """compile predicts every part's cycles; a timing-only step takes within 25 % of them."""
    folder = _folder(tmp_path, "m", config)
    program, report = compile_model(folder, wse3, dtype="bf16", shape_only=True)
    ex = execute(program, wse3, inputs={"input_ids": np.array([7], np.int32),
                                        "position_ids": np.array([100], np.int32)},
                 timing_only=True)
    got = _part_cycles(program, ex.result, ex.loaded)
    assert set(got) == set(report.predicted)
    for part, cycles in got.items():
        want = report.predicted[part]
        assert abs(want - cycles) <= 0.25 * cycles, (part, want, cycles)
    parts = {p.name: p.predicted_cycles for p in program.model.parts}
    assert all(parts[k] == v for k, v in report.predicted.items())


def test_the_chosen_grid_is_the_fastest(wse3, tmp_path):
    """The cost model's pick against every unpadded square side and a spread of the
    rectangles it priced (padded ones among them), emulated."""
    folder = _folder(tmp_path, "m", LLAMA)
    dec = extract(lower(bind_positions(load_graph(folder, shape_only=True), 1)))
    _, chosen = compile_model(folder, wse3, dtype="bf16", shape_only=True)
    rects = [g for g in candidates(dec, wse3) if g[0] != g[1]]
    grids = grid_shapes(dec) + rects[::max(1, len(rects) // 8)] + [parse_grid(chosen.grid)]
    cycles = {}
    for grid in grids:
        try:
            program, report = compile_model(folder, wse3, dtype="bf16", shape_only=True,
                                            grid=grid)
        except Exception:  # this grid does not fit the SRAM or the fabric
            continue
        gen = Generator(program, wse3, timing_only=True)
        gen.step(3)
        cycles[report.grid] = gen.last_result.cycles
    assert len(cycles) >= 6 and any(isinstance(g, str) for g in cycles)
    assert cycles[chosen.grid] <= 1.05 * min(cycles.values()), cycles


def test_no_activation_is_whole_on_a_layer_pe(wse3, tmp_path):
    """Layer PEs hold blocks: the residual in K = ceil(d / R), q/k/v in a column's head
    dims."""
    folder = _folder(tmp_path, "m", LLAMA)
    program, report = compile_model(folder, wse3, dtype="bf16", shape_only=True)
    d = LLAMA["hidden_size"]
    rows = parse_grid(report.grid)[0]
    for region in program.regions:
        if region.name.split(".", 1)[1].startswith("layers."):
            allocs = {a.name: a.nbytes for a in region.allocs}
            assert allocs["x"] == allocs["xn"] == 4 * -(-d // rows)
            # the MLP's gate/up block lives in the scratch region it shares with the
            # attention's buffers (map_attention.scratch_layout): all of it is less than F
            assert allocs["qkv"] < 4 * d and allocs["scratch"] < 4 * LLAMA["intermediate_size"]


def test_llama_3_8b_compiles_at_its_full_context_on_one_wse3_and_one_h100(wse3, tmp_path):
    folder = _folder(tmp_path, "llama3", LLAMA_3_8B)
    program, report = compile_model(folder, wse3, dtype="bf16", shape_only=True)
    assert report.max_context == 8192 and report.pes <= wse3.width * wse3.height
    assert report.sram_max <= wse3.sram_bytes
    assert program.model.max_context == 8192 and program.model.mapping == "wafer"
    assert [p.name for p in program.model.parts][:3] == ["embed", "layer 0", "layer 1"]
    assert loads(dumps(program)).model == program.model
    h100 = load_machine("h100")
    program, report = compile_model(folder, h100, dtype="bf16", shape_only=True)
    assert report.max_context == 8192 and program.model.target == "hbm"


def test_functional_and_timing_only_steps_take_the_same_cycles(wse3, tmp_path):
    """A shape-only program runs functionally (zero weights) and timing-only: same cycles."""
    folder = _folder(tmp_path, "m", GPT2)
    program, _ = compile_model(folder, wse3, shape_only=True, max_context=32)
    functional = Generator(program, wse3)
    timing = Generator(program, wse3, timing_only=True)
    for token in (5, 9, 11):
        functional.step(token)
        timing.step(token)
        assert functional.last_result.cycles == timing.last_result.cycles

"""The tile size the stage-chain mapping picks (pipeline.place_fastest): smaller tiles cut each PE's
`mv` time but lengthen every gemv's reduction and gather chains, so the smallest tiles are not
the fastest. The pick must beat both ends of the range on an emulated decode step."""

import json

import wse_emu.isa.compiler.pipeline as pipeline
from wse_emu.emulator.generate import Generator
from wse_emu.isa.machine import load_machine
from wse_emu.isa.compiler.placement import place

CONFIG = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 512,
          "n_layer": 2, "n_head": 8, "n_positions": 64, "vocab_size": 4096,
          "activation_function": "gelu_new"}


def _cycles(folder, machine, monkeypatch=None, cap=None):
    if cap is not None:
        monkeypatch.setattr(pipeline, "place_fastest",
                            lambda plan, m, dtype, pad_last: place(plan, m, dtype, pad_last,
                                                                   max_tile=cap))
    program, report = pipeline.compile_model(folder, machine, dtype="bf16", max_context=16,
                                             shape_only=True, mapping="chain")
    gen = Generator(program, machine, timing_only=True)
    gen.step(1)
    return gen.last_result.cycles, report.pes


def test_the_chosen_tiles_beat_the_smallest_and_the_largest(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    wse3 = load_machine("wse3")
    chosen, pes = _cycles(tmp_path, wse3)
    smallest, many = _cycles(tmp_path, wse3, monkeypatch, cap=256)
    largest, few = _cycles(tmp_path, wse3, monkeypatch, cap=32768)
    assert many > pes > few  # the pick lies between the extremes of the range
    assert chosen < smallest and chosen < largest

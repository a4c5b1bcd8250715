"""A decoder split over a system's wafers (isa/compiler/wafer.py, "Systems"): contiguous
groups of layers, one a wafer, every wafer used; the activation crossing between wafers; the
split recorded in program.bin's ModelInfo; a model too big for the system refused with the
wafers that would hold it.

Functional runs against transformers need torch (skipped without it); the rest needs none.
"""

import itertools
import json
import re
from dataclasses import replace

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.isa.binfmt import check_program, dumps, loads
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.lower import CompileError
from wse_emu.isa.compiler.wafer import split_layers
from wse_emu.isa.errors import FormatError
from wse_emu.isa.machine import load_machine, system_of

SMALL = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=256,
             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=512, vocab_size=1024, max_position_embeddings=64)


def _folder(tmp_path, name, config):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _check_split(program, machine):
    """Every wafer holds a contiguous group; no grid straddles a wafer boundary; the
    embedding is on wafer 0 and the head on the last; a route crosses every boundary."""
    info = program.model
    H = machine.chip_height
    assert info.chips == machine.chips and len(info.groups) == machine.chips
    assert [g[0] for g in info.groups] == [0] + list(itertools.accumulate(
        g[1] for g in info.groups[:-1]))
    assert sum(g[1] for g in info.groups) == info.layers and min(g[1] for g in info.groups) >= 1
    chip_of_layer = {first + k: c for c, (first, count) in enumerate(info.groups)
                     for k in range(count)}
    stages = program.meta["compiler"]["stages"]
    for st in stages:
        x, y, w, h = st["rect"]
        assert y // H == (y + h - 1) // H, st  # inside one wafer's rows
        if st["kind"] == "layer":
            assert y // H == chip_of_layer[st["layer"]], st
        if st["kind"] == "embed":
            assert y // H == 0
        if st["kind"] == "head":
            assert y // H == machine.chips - 1
    for c in range(1, machine.chips):
        assert any(r.rect.y < c * H <= r.rect.y + r.rect.h - 1 for r in program.routes), c
    assert len(info.crossing_cycles) == machine.chips - 1
    # a crossing and the layer that sends across it pay the link latency between them
    predicted = {p.layer: p.predicted_cycles for p in info.parts}
    body = min(v for layer, v in predicted.items() if 0 <= layer < info.layers)
    for c, (first, _) in enumerate(info.groups[1:]):
        sent = predicted[first - 1] - body
        assert info.crossing_cycles[c] > 0 and \
            info.crossing_cycles[c] + sent > machine.link_latency, c


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_split_model_generates_the_ids_of_transformers(family, tmp_path):
    """A random-weight model split over two test64 wafers: 8 greedy ids as transformers."""
    torch = pytest.importorskip("torch")
    from tests.graph.hf_models import load_torch, make_gpt2, make_llama
    from wse_emu.emulator.generate import Generator
    torch.set_num_threads(2)
    path = make_llama(tmp_path, layers=4) if family == "llama" else make_gpt2(tmp_path)
    machine = load_machine("test64x2")
    program, report = compile_model(path, machine, max_context=16)
    _check_split(program, machine)
    assert program.model.shape_only is False
    assert [w["layers"] for w in report.wafers] == [[a, a + n - 1] for a, n in
                                                    program.model.groups]
    program = loads(dumps(program))  # the split survives program.bin
    prompt = [5, 17, 300]
    model = load_torch(path)
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=8,
                              do_sample=False)[0].tolist()[len(prompt):]
    result = Generator(program, machine, engine="core").generate(prompt, 8)
    assert result.generated_ids == want


def test_every_wafer_holds_layers_even_of_a_small_model(tmp_path):
    folder = _folder(tmp_path, "m", SMALL)
    machine = load_machine("test64x4")
    program, report = compile_model(folder, machine, dtype="bf16", shape_only=True)
    assert program.model.groups == ((0, 1), (1, 1), (2, 1), (3, 1))
    assert program.model.shape_only
    _check_split(program, machine)
    assert set(report.predicted) >= {f"crossing {c}-{c + 1}" for c in range(3)}
    too_few = _folder(tmp_path, "two", dict(SMALL, num_hidden_layers=2))
    with pytest.raises(CompileError, match="fewer than the 4 wafers"):
        compile_model(too_few, machine, dtype="bf16", shape_only=True)


def test_a_model_too_big_is_refused_with_the_wafers_that_would_hold_it(tmp_path):
    """The refusal names the smallest system that holds the model, and that system compiles
    it while one wafer fewer does not."""
    folder = _folder(tmp_path, "deep", dict(SMALL, num_hidden_layers=300))
    one = load_machine("test64")
    with pytest.raises(CompileError) as e:  # (the stage chain would hold it on one test64)
        compile_model(folder, one, dtype="bf16", shape_only=True, mapping="wafer")
    msg = str(e.value)
    assert "\n" not in msg and "wafers of test64" in msg, msg
    chips = int(msg.split(" needs ", 1)[1].split(" wafers", 1)[0])
    assert f"--machine test64x{chips}" in msg
    program, _ = compile_model(folder, system_of(one, chips), dtype="bf16", shape_only=True)
    assert len(program.model.groups) == chips
    fewer = system_of(one, chips - 1)
    with pytest.raises(CompileError, match=f"needs {chips} wafers") as e:
        compile_model(folder, fewer, dtype="bf16", shape_only=True)
    # and what SRAM a PE would let one wafer fewer hold it: exactly that much does, a byte
    # less does not
    got = re.search(r"on (\d+) wafers a layer's PEs would need ([\d,]+) bytes of SRAM each "
                    r"\((\d+) x (\d+) grids\), not ([\d,]+)", str(e.value))
    assert got, str(e.value)
    assert int(got[1]) == chips - 1 and int(got[5].replace(",", "")) == one.sram_bytes
    need, grid = int(got[2].replace(",", "")), (int(got[3]), int(got[4]))
    assert need > one.sram_bytes
    _, report = compile_model(folder, replace(fewer, sram_bytes=need), dtype="bf16",
                              shape_only=True)
    assert report.grid == "x".join(map(str, grid)) and len(report.wafers) == chips - 1
    assert report.sram_max <= need
    with pytest.raises(CompileError, match=f"needs {chips} wafers"):
        compile_model(folder, replace(fewer, sram_bytes=need - 1), dtype="bf16",
                      shape_only=True)


def test_crossing_prediction_pays_the_link_latency_and_bytes(tmp_path):
    folder = _folder(tmp_path, "m", SMALL)
    base = load_machine("test64x2")
    _, report = compile_model(folder, base, dtype="bf16", shape_only=True)
    slow = replace(base, link_latency=base.link_latency + 1000)
    _, slower = compile_model(folder, slow, dtype="bf16", shape_only=True)
    if slower.grid == report.grid and [w["layers"] for w in slower.wafers] == \
            [w["layers"] for w in report.wafers]:
        # the latency is the sending layer's (its blocks outlast the far side's queues)
        last = f"layer {report.wafers[0]['layers'][-1]}"
        assert slower.predicted["crossing 0-1"] == report.predicted["crossing 0-1"]
        assert slower.predicted[last] == report.predicted[last] + 1000
    narrow = replace(base, link_bandwidth=base.link_bandwidth / 100)
    _, narrower = compile_model(folder, narrow, dtype="bf16", shape_only=True, grid=report.grid)
    # the activation (hidden fp32 values) through a link of 1/100 the bandwidth
    assert narrower.predicted["crossing 0-1"] >= report.predicted["crossing 0-1"] + \
        int(0.9 * SMALL["hidden_size"] * 4 / narrow.link_bytes_per_cycle)


def test_wafer_parts_of_a_split_step_follow_the_prediction(tmp_path):
    """A timing-only step on two wafers: the layers on wafer 0 within 25 % of the cost model,
    the last of them with the link latency of its hand-off across (more wavelets than an
    input queue holds: its senders stay blocked until the far side drains them)."""
    folder = _folder(tmp_path, "m", SMALL)
    machine = load_machine("test64x2")
    program, report = compile_model(folder, machine, dtype="bf16", shape_only=True)
    ex = execute(program, machine, inputs={"input_ids": np.array([7], np.int32),
                                           "position_ids": np.array([40], np.int32)},
                 timing_only=True)
    part_of = program.model.part_of_region()
    end: dict = {}
    for ri, region in enumerate(program.regions):
        part = part_of[region.name]
        if part.name != "sources":
            pes = np.nonzero(ex.loaded.pe_region == ri)[0]
            end[part.layer] = max(end.get(part.layer, 0), int(ex.result.clock[pes].max()))
    first, count = program.model.groups[0]
    prev = end[-1]
    for layer in range(first, first + count):
        got = end[layer] - prev
        want = report.predicted[f"layer {layer}"]
        assert abs(want - got) <= 0.25 * got, (layer, want, got)
        prev = end[layer]


def test_split_layers_minimises_the_slowest_wafer():
    """Against every composition of a few layers over a few wafers."""
    for layers, room, costs in [(7, [3, 4, 3], (10, 5, 7, 20)), (5, [5, 5], (3, 0, 0, 0)),
                                (9, [2, 4, 4, 2], (4, 9, 1, 6)), (3, [1, 1, 1], (1, 1, 1, 1))]:
        unit, embed, head, cross = costs
        chips = len(room)
        extra = [(embed if c == 0 else cross) + (head if c == chips - 1 else 0)
                 for c in range(chips)]
        best = min(max(e + g * unit for e, g in zip(extra, gs))
                   for gs in itertools.product(*(range(1, r + 1) for r in room))
                   if sum(gs) == layers)
        got = split_layers(layers, room, costs)
        assert sum(got) == layers and all(1 <= g <= r for g, r in zip(got, room))
        assert max(e + g * unit for e, g in zip(extra, got)) == best
    assert split_layers(10, [3, 3, 3], (1, 0, 0, 0)) is None
    assert split_layers(2, [2, 0], (1, 0, 0, 0)) is None


def test_model_info_groups_are_validated(tmp_path):
    folder = _folder(tmp_path, "m", SMALL)
    program, _ = compile_model(folder, load_machine("test64x2"), dtype="bf16", shape_only=True)
    back = loads(dumps(program)).model
    assert (back.chips, back.groups, back.crossing_cycles, back.shape_only) == \
        (program.model.chips, program.model.groups, program.model.crossing_cycles, True)
    info = program.model
    for bad in ({"groups": ((0, 2), (3, 2))}, {"groups": ((0, 4),)},
                {"groups": ((0, 2), (2, 1))}, {"groups": ((0, 4), (4, 0))},
                {"crossing_cycles": ()}, {"crossing_cycles": (-1,)},
                {"groups": (), "crossing_cycles": (5,)}, {"chips": 0}, {"shape_only": 1}):
        with pytest.raises(FormatError):
            check_program(replace(program, model=replace(info, **bad)))
    one, _ = compile_model(folder, load_machine("test64"), dtype="bf16", shape_only=True)
    assert one.model.chips == 1 and one.model.groups == () and one.model.shape_only


def test_every_target_records_shape_only(tmp_path):
    """ModelInfo.shape_only is the compile's, whatever the mapping or target."""
    folder = _folder(tmp_path, "m", SMALL)
    for machine, mapping in (("test64", "chain"), ("test64", "wafer"), ("h100", None)):
        program, _ = compile_model(folder, load_machine(machine), dtype="bf16", shape_only=True,
                                   mapping=mapping)
        assert program.model.shape_only is True, (machine, mapping)
        assert loads(dumps(program)).model.shape_only is True


def test_generate_and_bench_put_the_prediction_beside_the_emulated_step(tmp_path):
    """Generator.parts: every part's predicted and emulated cycles a step, the crossing with
    the layer after it; the emulated parts add up to the step, the predicted to the model's
    prediction (which bench reports too)."""
    from wse_emu.apps.benchsuite import predicted_cycles
    from wse_emu.emulator.generate import Generator
    folder = _folder(tmp_path, "m", SMALL)
    machine = load_machine("test64x2")
    program, report = compile_model(folder, machine, dtype="bf16", shape_only=True)
    result = Generator(program, machine, timing_only=True).generate([3], 2, position=20)
    first = program.model.groups[1][0]
    assert f"crossing 0-1 + layer {first}" in result.parts
    assert result.predicted_cycles == sum(report.predicted.values())
    assert sum(p["predicted"] for p in result.parts.values()) == result.predicted_cycles
    mean = sum(result.cycles_per_token) / len(result.cycles_per_token)  # (parts: a step's mean)
    assert abs(sum(p["emulated"] for p in result.parts.values()) - mean) <= len(result.parts)
    assert predicted_cycles(program)[0] == result.predicted_cycles
    assert sum(predicted_cycles(program)[1]) == sum(
        v for k, v in report.predicted.items() if k.startswith("layer "))

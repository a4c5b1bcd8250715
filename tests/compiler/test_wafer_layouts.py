"""The layouts a layer grid can take where its fastest code does not fit a PE (wafer.layouts):
two column classes instead of padded head dims, the attention's scores in passes of h query
heads, the chain form of the line allreduces. The compiler takes the fastest that fits; the
logits stay the golden model's (the softmax over all positions, each PE's own maxima rescaled
after the passes), and the cost model still predicts the emulated cycles."""

from dataclasses import replace

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.emulator.generate import Generator
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.decoder import extract, geometry
from wse_emu.isa.compiler.lower import CompileError, lower
from wse_emu.isa.compiler.pipeline import load_graph
from wse_emu.isa.compiler.wafer import _layer_data, layer_code_bytes, layer_cycles, layouts
from wse_emu.isa.graph import bind_positions
from wse_emu.isa.graph_numpy import GraphRunner
from wse_emu.isa.machine import load_machine
from tests.compiler.np_models import make_llama
from tests.compiler.test_wafer_mapping import _part_cycles

CTX = 128
PROMPT = [5, 17, 20, 3, 9]
# 16 query heads on 2 KV heads (8 a KV head), head dim 8: on 2 x 6 grids 3 columns a KV head
# for its 4 RoPE pairs (padded to 6, or 2 + 1 + 1 in two column classes) and 64 cache slots a
# PE. A small vocabulary keeps the embedding's and head's PEs below the layers' (their
# columns have a fixed budget).
MODEL = dict(hidden=128, heads=16, kv_heads=2, intermediate=96, vocab=32, max_positions=CTX)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = make_llama(tmp_path_factory.mktemp("layouts"), seed=4, layers=2, **MODEL)
    wse3 = load_machine("wse3")
    dec = extract(lower(bind_positions(load_graph(path, max_context=CTX), 1)))
    geo = geometry(dec, (2, 6))

    def need(p):  # a layer PE's data and code
        return _layer_data(dec, p, "f32") + layer_code_bytes(dec, p, wse3, "f32")
    return path, wse3, dec, geo, need


def test_each_lever_needs_less_sram_and_the_compiler_takes_the_fastest_that_fits(setup):
    path, wse3, dec, geo, need = setup
    options = layouts(dec, geo, wse3, "f32")
    assert {(p.split, p.passes) for p in options} == {(c, n) for c in (False, True)
                                                      for n in (1, 2, 4, 8)}
    assert options[0] == replace(geo, forms=options[0].forms)  # padded, one pass
    by = {(p.split, p.passes, p.forms): need(p) for p in options}
    fast = options[0].forms
    assert by[(True, 1, fast)] < by[(False, 1, fast)]  # no padded head dims
    assert by[(True, 8, fast)] < by[(True, 2, fast)] < by[(True, 1, fast)]  # less scratch
    assert by[(True, 8, (0, 0))] <= by[(True, 8, fast)]  # the chain form: less or equal code
    least = min(by.values())
    for sram in (need(geo), by[(True, 1, fast)], least):
        fits = [p for p in options if need(p) <= sram]
        best = min(fits, key=lambda p: (layer_cycles(dec, p, wse3, "f32"), p.passes, p.forms))
        _, report = compile_model(path, replace(wse3, sram_bytes=sram), max_context=CTX,
                                  grid="2x6")
        assert (report.column_classes, report.score_passes) == (best.split, best.passes)
    assert "two column classes" in str(report)
    with pytest.raises(CompileError, match="max_context 128 does not fit"):
        compile_model(path, replace(wse3, sram_bytes=least - 1), max_context=CTX, grid="2x6")


def test_the_tightest_layout_gives_the_golden_logits_and_predicted_cycles(setup):
    """Every prompt position's logits against the golden model; at the first positions a row
    of the grid has no visible slot yet (its maxima are -inf, kept at FLOOR). Then a
    timing-only step: every part's predicted cycles within 25 % of the emulated ones."""
    path, wse3, dec, geo, need = setup
    tight = replace(wse3, sram_bytes=min(need(p) for p in layouts(dec, geo, wse3, "f32")))
    program, report = compile_model(path, tight, max_context=CTX, grid="2x6")
    assert report.column_classes and report.score_passes > 1
    gen = Generator(program, tight, engine="core")
    got = np.stack([gen.step(t) for t in PROMPT])
    want = GraphRunner(load_graph(path, max_context=CTX)).prefill(PROMPT)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())
    assert list(got.argmax(-1)) == list(want.argmax(-1))
    ex = execute(program, tight, inputs={"input_ids": np.array([7], np.int32),
                                         "position_ids": np.array([100], np.int32)},
                 timing_only=True)
    emulated = _part_cycles(program, ex.result, ex.loaded)
    for part, cycles in emulated.items():
        assert abs(report.predicted[part] - cycles) <= 0.25 * cycles, part


def test_the_mask_sources_bound_covers_their_sram(setup):
    """_layer_fits also asks that a band's mask source hold every sequence's rows: its bound
    (map_attention.mask_source_bytes) is at least the compiled source regions' SRAM."""
    from wse_emu.isa.compiler.map_attention import mask_source_bytes
    from wse_emu.isa.compiler.wafer import parse_grid
    path, wse3, dec, geo, need = setup
    for seqs in (1, 3):
        program, report = compile_model(path, wse3, max_context=CTX, sequences=seqs)
        g = geometry(dec, parse_grid(str(report.grid)))
        sram = [b for r, b in zip(program.regions, program.regions_sram_bytes())
                if ".mask." in r.name]
        assert sram and max(sram) <= mask_source_bytes(g, seqs) <= max(sram) + 512

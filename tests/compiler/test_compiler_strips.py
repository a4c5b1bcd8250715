"""The strip placement: when bands of tall matmuls and short stages need more rows than the
machine has, stages stack top to bottom in vertical strips (a free column between strips).

A machine 28 PEs wide and 16 tall cannot hold the test models' stage-chain bands at any tile
size the pipeline tries first, but holds them as strips (the chain is asked for by name: the
wafer mapping's rectangular grids fit this machine without strips); the program still computes what the model
does (numbers against the NumPy golden model, flows crossing from strip to strip), and the
rectangles are disjoint and inside the machine.
"""

import dataclasses

import numpy as np
import pytest

from wse_emu.emulator.generate import Generator
from wse_emu.isa.machine import load_machine
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.lower import CompileError
from wse_emu.isa.compiler.pipeline import load_graph
from wse_emu.isa.compiler.placement import Placed, _bands, _strips
from wse_emu.isa.graph_numpy import GraphRunner
from wse_emu.isa.program import Rect
from tests.compiler.np_models import make_gpt2, make_llama

PROMPT = [5, 17, 300]


@pytest.fixture(scope="module")
def narrow():
    return dataclasses.replace(load_machine("wse3"), name="narrow", width=28, height=16)


@pytest.mark.parametrize("make", [make_gpt2, make_llama])
def test_a_model_placed_in_strips_computes_what_the_model_does(make, narrow, tmp_path):
    path = make(tmp_path)
    program, report = compile_model(path, narrow, max_context=16, mapping="chain")
    rects = [r.rect for r in program.regions]
    for r in rects:
        assert 0 <= r.x and r.x + r.w <= narrow.width and 0 <= r.y and r.y + r.h <= narrow.height
    cells = [(x, y) for r in rects for x in range(r.x, r.x + r.w) for y in range(r.y, r.y + r.h)]
    assert len(cells) == len(set(cells))  # disjoint
    assert len({r.x for r in rects if r.y == 0}) > 1  # several strips, each from the top
    gen = Generator(program, narrow)
    golden = GraphRunner(load_graph(path, max_context=16))
    want = golden.prefill(PROMPT)
    got = np.stack([gen.step(t) if i else gen.prefill([t]) for i, t in enumerate(PROMPT)])
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())


def test_strips_stack_stages_and_open_a_new_strip_one_column_right():
    placed = [Placed(Rect(0, 0, q, p), P=p, Q=q) for p, q in [(6, 2), (3, 4), (5, 1), (2, 2)]]
    assert _bands(placed, 8) == 6 + 1 + 2  # two bands: 2+4+1 wide (6 high), then the last
    assert _strips(placed, 8, 10)
    assert [(p.rect.x, p.rect.y) for p in placed] == [(0, 0), (0, 6), (5, 0), (5, 5)]
    assert not _strips(placed, 6, 10)  # the second strip ends at column 7


def test_a_vector_stage_too_big_for_one_pe_is_refused_at_compile_time(tmp_path):
    path = make_gpt2(tmp_path, hidden=128)
    small = dataclasses.replace(load_machine("wse3"), name="small-sram", sram_bytes=4096)
    with pytest.raises(CompileError, match=r"vector stage keeps its 128-element vectors .* "
                                           r"but a PE has 4096"):
        compile_model(path, small, max_context=16, mapping="chain")


def test_the_llama_3_8b_shape_fits_one_wse3_in_strips(tmp_path):
    """The issue's full-size model on the stage chain: 474,753 PEs in strips (bands would need
    2306 rows), every vector stage within one PE's SRAM."""
    import json

    from wse_emu.apps.benchsuite import BUILTIN_MODELS

    (tmp_path / "config.json").write_text(json.dumps(BUILTIN_MODELS["llama-3-8b"]))
    wse3 = load_machine("wse3")
    program, report = compile_model(tmp_path, wse3, dtype="bf16", max_context=16,
                                    shape_only=True, mapping="chain")
    assert report.pes == sum(r.rect.w * r.rect.h for r in program.regions) > 400_000
    assert max(r.rect.x + r.rect.w for r in program.regions) <= wse3.width
    assert max(r.rect.y + r.rect.h for r in program.regions) <= wse3.height
    assert report.sram_max <= wse3.sram_bytes

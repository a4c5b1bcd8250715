"""Rectangular and padded layer grids (decoder.Geometry: R x C, a side that does not divide
its dimension padded with zeros): small random models on such grids against the NumPy golden
model (and transformers' greedy ids where PyTorch is installed), the hand-offs of grids taller
than wide (down a band, across wafers), and the cost model against the emulator."""

import json
from dataclasses import replace

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.emulator.generate import Generator
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.decoder import Geometry, extract, geometry
from wse_emu.isa.compiler.lower import CompileError, lower
from wse_emu.isa.compiler.map_gemv import pad_array
from wse_emu.isa.compiler.pipeline import load_graph
from wse_emu.isa.compiler.wafer import parse_grid
from wse_emu.isa.graph import bind_positions
from wse_emu.isa.graph_numpy import GraphRunner
from wse_emu.isa.machine import load_machine, system_of
from tests.compiler.np_models import make_gpt2, make_llama
from tests.compiler.test_wafer_mapping import LLAMA, _part_cycles

PROMPT = [5, 17, 300]
CTX = 8
# hidden 96, 4 heads of 24 dims; the Llama has 2 KV heads (GQA) and an MLP of 200
SMALL_LLAMA = dict(hidden=96, heads=4, kv_heads=2, intermediate=200)
SMALL_GPT2 = dict(hidden=96, heads=4)


@pytest.fixture(scope="module")
def wse3():
    return load_machine("wse3")


def _check(path, machine, grid):
    """Compile on `grid`, run the prompt, compare every position's logits with the golden
    model and the greedy ids exactly; the grid the program reports."""
    program, report = compile_model(path, machine, max_context=CTX, grid=grid)
    gen = Generator(program, machine, engine="core")
    got = np.stack([gen.step(t) for t in PROMPT])
    want = GraphRunner(load_graph(path, max_context=CTX)).prefill(PROMPT)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())
    assert list(got.argmax(-1)) == list(want.argmax(-1))
    return program, report


@pytest.mark.parametrize("make, options, grid, padded", [
    (make_llama, SMALL_LLAMA, "6x8", ()),  # K 16, s 4: no padding
    (make_llama, SMALL_LLAMA, "7x6", ("d", "f")),  # K 14 (96 -> 98), F 34 (200 -> 204)
    (make_llama, SMALL_LLAMA, "5x10", ("d", "head dims")),  # s 5: 24 -> 30 head dims
    (make_gpt2, SMALL_GPT2, "13x12", ("d",)),  # LayerNorm over 96 of 104
    (make_gpt2, SMALL_GPT2, "7x20", ("d", "f", "head dims")),
], ids=["llama-6x8", "llama-7x6", "llama-5x10", "gpt2-13x12", "gpt2-7x20"])
def test_rectangular_and_padded_grids_match_the_golden_model(make, options, grid, padded,
                                                            wse3, tmp_path):
    path = make(tmp_path, seed=7, layers=2, **options)
    program, report = _check(path, wse3, grid)
    assert report.grid == grid
    g = geometry(extract(lower(bind_positions(load_graph(path, shape_only=True), 1))),
                 parse_grid(grid))
    got = tuple(k for k, a, b in (("d", g.d, g.dp), ("f", g.f, g.fp),
                                  ("head dims", g.hd, g.hdp)) if a != b)
    assert got == padded
    # padded grids copy the weights they pad into the program; unpadded ones reference them
    copies = [t for t in program.tensors if t.name.startswith("pad")]
    assert bool(copies) == bool(padded)


def test_grids_taller_than_wide_hand_off_down_a_band(wse3, tmp_path):
    """A fabric two slots wide: the residual goes down to the next band on two colors (rows
    r < C and r >= C), into a layer and into the head."""
    narrow = replace(wse3, width=25, height=40, name="narrow")
    path = make_llama(tmp_path, seed=5, layers=5, **SMALL_LLAMA)
    program, report = _check(path, narrow, "10x6")
    assert len({s["rect"][1] for s in report.stages if s["kind"] == "layer"}) >= 2  # bands
    path = make_gpt2(tmp_path, seed=6, layers=5, **SMALL_GPT2)
    _check(path, narrow, "10x8")


def test_grids_taller_than_wide_cross_between_wafers(wse3, tmp_path):
    chip = replace(wse3, width=25, height=22, name="small")
    system = system_of(chip, 2)
    path = make_llama(tmp_path, seed=5, layers=5, **SMALL_LLAMA)
    program, report = _check(path, system, "10x6")
    assert len(report.wafers) == 2 and report.predicted["crossing 0-1"] > 0


def test_transformers_ids_on_a_padded_grid(wse3, tmp_path):
    torch = pytest.importorskip("torch")
    from tests.graph.hf_models import load_torch
    torch.set_num_threads(2)
    path = make_llama(tmp_path, seed=9, layers=2, max_positions=16, **SMALL_LLAMA)
    program, _ = compile_model(path, wse3, max_context=16, grid="7x10")
    model = load_torch(path)
    with torch.no_grad():
        want = model.generate(torch.tensor([PROMPT]), max_new_tokens=6,
                              do_sample=False)[0].tolist()[len(PROMPT):]
    assert Generator(program, wse3, engine="core").generate(PROMPT, 6).generated_ids == want


@pytest.mark.parametrize("grid, machine", [
    ("43x32", "wse3"),  # the cost model's pick for this model: d 256 padded to 258
    ("19x10", "wse3"),  # 5 columns a KV head: 32 head dims padded to 40
    ("40x24", "narrow"),  # taller than wide, over several bands
])
def test_a_padded_grid_predicts_its_emulated_cycles(grid, machine, wse3, tmp_path):
    """Every part's predicted cycles within 25 % of a timing-only step's; a shape-only
    program runs functionally (zero weights) in the same cycles."""
    m = wse3 if machine == "wse3" else replace(wse3, width=100, name="narrow")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    program, report = compile_model(folder, m, dtype="bf16", shape_only=True, grid=grid)
    assert report.grid == grid
    ex = execute(program, m, inputs={"input_ids": np.array([7], np.int32),
                                     "position_ids": np.array([100], np.int32)},
                 timing_only=True)
    got = _part_cycles(program, ex.result, ex.loaded)
    assert set(got) == set(report.predicted)
    for part, cycles in got.items():
        assert abs(report.predicted[part] - cycles) <= 0.25 * cycles, (part, grid)
    if machine == "narrow":  # the layers span two bands: a hand-off goes down
        assert len({s["rect"][1] for s in report.stages if s["kind"] in ("layer", "head")}) == 2
    functional = Generator(program, m)
    functional.step(3)
    timing = Generator(program, m, timing_only=True)
    timing.step(3)
    assert functional.last_result.cycles == timing.last_result.cycles


def test_geometry_pads_and_squares_are_unchanged():
    sq = Geometry(32, 32, 256, 32, 8, 2, 512, 256, True)
    assert (sq.K, sq.s, sq.h2, sq.F, sq.S, sq.padded) == (8, 16, 1, 16, 8, False)
    g = Geometry(43, 40, 256, 32, 8, 2, 512, 256, True)
    assert (g.K, g.dp, g.s, g.h2, g.hdp, g.F, g.fp, g.S) == (6, 258, 20, 1, 40, 13, 520, 6)
    # a head's two halves padded separately: dims t and t + hd / 2 stay RoPE partners
    h = Geometry(4, 6, 8, 8, 1, 1, 8, 8, False)  # s 6: 4 dims a half padded to 6
    w = np.arange(8, dtype=np.float32)[:, None] * np.ones((1, 8), np.float32)
    p = pad_array(h, w, ("heads", None))
    assert p.shape == (12, 8)
    assert list(p[:, 0]) == [0, 1, 2, 3, 0, 0, 4, 5, 6, 7, 0, 0]


def test_geometry_two_column_classes_split_a_head_without_padding():
    sq = Geometry(32, 32, 256, 32, 8, 2, 512, 256, True, balanced=True)
    assert (sq.K, sq.s, sq.h2, sq.F, sq.S, sq.padded, sq.split) == (8, 16, 1, 16, 8, False,
                                                                    False)
    # 12 columns a KV head, 16 pairs a half: padded to 24 pairs, or two classes
    assert Geometry(43, 24, 256, 32, 8, 2, 512, 256, True).hdp == 48
    g = Geometry(43, 24, 256, 32, 8, 2, 512, 256, True, balanced=True)
    assert g.hdp == 32
    h, lt = g.variants
    assert (g.K, g.dp, g.s, g.heavy, g.padded) == (6, 258, 12, 4, True)
    assert (h.n, h.h2, h.first, lt.n, lt.h2, lt.first) == (4, 2, 0, 8, 1, 4)
    assert h.n * h.h2 + lt.n * lt.h2 == g.hd // 2  # no head dim padded
    assert g.kv * (h.n * h.F + lt.n * lt.F) == g.fp >= g.f
    assert (h.F, lt.F, lt.f0) == (14, 25, 112)

    def nbytes(v):  # 16-bit weights and K/V caches, fp32 q/k/v, o and l of a column
        return 2 * ((v.Mqkv + v.Mq + v.M1 + v.F) * v.K + v.S * v.D + (v.D + 1) * v.S) + \
            4 * (v.Mqkv + v.Mq + (v.D + 1) * v.group)
    # light columns take the heavy ones' surplus, to within a hidden unit (3 K 16-bit values)
    assert abs(nbytes(h) - nbytes(lt)) <= 3 * g.K * 2 and nbytes(h) != nbytes(sq)
    # each class's part of a head (of each of 2 heads of 32 dims): its pairs of both halves
    w = np.arange(64, dtype=np.float32)[:, None] * np.ones((1, 4), np.float32)
    hp, lp = (pad_array(v, w, ("heads", None)) for v in g.variants)
    assert list(hp[:, 0]) == [*range(0, 8), *range(16, 24), *range(32, 40), *range(48, 56)]
    assert list(lp[:, 0]) == [*range(8, 16), *range(24, 32), *range(40, 48), *range(56, 64)]
    # and of the MLP's hidden units: the heavy columns' blocks first, zeros past f
    u = np.arange(500, dtype=np.float32)[:, None]
    hu, lu = (pad_array(v, u, ("f", None))[:, 0] for v in g.variants)
    assert list(hu) == list(range(112)) and list(lu[:388]) == list(range(112, 500))
    assert not lu[388:].any() and len(lu) == 400


@pytest.mark.parametrize("grid", ["7y8", "0x8", "8x7", "x8", 3.5, "20x8"])
def test_bad_grids_are_refused_in_one_line(grid, wse3, tmp_path):
    path = make_llama(tmp_path, seed=1, layers=1, **SMALL_LLAMA)
    with pytest.raises(CompileError) as e:
        compile_model(path, wse3, max_context=CTX, grid=grid)
    assert "\n" not in str(e.value) and "grid" in str(e.value)


@pytest.mark.parametrize("dtype, hints", [("f32", "16-bit weights, a larger grid or"),
                                           ("bf16", "(use a larger grid or a machine")])
def test_a_grid_too_small_for_a_pe_says_what_would_help(dtype, hints, tmp_path):
    """A 1 x 8 grid of a small Llama layer (hidden 96, MLP 200) cannot hold its weights in 4 KB
    a PE: the line suggests 16-bit weights only where they are not 16-bit already."""
    path = make_llama(tmp_path, seed=1, layers=1, **SMALL_LLAMA)
    small = replace(load_machine("wse3"), sram_bytes=4096)
    with pytest.raises(CompileError) as e:
        compile_model(path, small, dtype=dtype, max_context=CTX, grid="1x8")
    assert "\n" not in str(e.value) and "at any context" in str(e.value)
    assert hints in str(e.value)


def test_shape_only_takes_the_functional_grid_and_code_on_a_rectangle(tmp_path):
    """The embedding and head columns of a rectangle divide the tables' rows in a shape-only
    compile too (where that fits), so its timing is the functional program's."""
    path = make_gpt2(tmp_path, hidden=64, layers=2, heads=4, vocab=256)
    machine = load_machine("test64")
    full, a = compile_model(path, machine, max_context=16)
    shape, b = compile_model(path, machine, max_context=16, shape_only=True)
    assert a.grid == b.grid and isinstance(a.grid, str)  # a rectangle is the pick here
    assert [r.code for r in full.regions] == [r.code for r in shape.regions]
    assert [r.rect for r in full.regions] == [r.rect for r in shape.regions]


def test_counted_layer_code_covers_the_compiled_code(wse3, tmp_path):
    """wafer.layer_code_bytes (what the grid choice keeps for a layer PE's code where SRAM is
    tight) is at least every compiled layer region's code, whatever hand-offs its placement
    gave it: along a band, down a diagonal, across wafers, with sequences in flight."""
    from wse_emu.isa.compiler.wafer import layer_code_bytes
    path = make_llama(tmp_path, seed=7, layers=4, **SMALL_LLAMA)
    dec = extract(lower(bind_positions(load_graph(path, max_context=CTX), 1)))
    two = system_of(load_machine("test64"), 2)
    for machine, grid, seqs in ((wse3, "6x8", 1), (wse3, "12x6", 1), (wse3, None, 2),
                                (two, None, 1)):
        program, report = compile_model(path, machine, max_context=CTX, grid=grid,
                                        sequences=seqs)
        R, C = parse_grid(str(report.grid))
        counted = layer_code_bytes(dec, geometry(dec, (R, C)), machine, "f32", seqs)
        code = [8 * len(r.code) for r in program.regions if ".layers." in r.name]
        assert max(code) <= counted <= max(code) + 8 * 40, (grid, seqs, counted, code)

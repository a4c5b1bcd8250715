"""Routing and placement units: rule compression, multicast trees, color reuse, dumps."""

import io
import re

import numpy as np
import pytest

from wse_emu.emulator.generate import Generator
from wse_emu.emulator.load import load
from wse_emu.isa.machine import load_machine
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.lower import lower
from wse_emu.isa.compiler.pipeline import load_graph, place_fastest
from wse_emu.isa.compiler.placement import place
from wse_emu.isa.compiler.routing import E, N, RAMP, S, W, _Cells, _path_and_tree, _rules
from wse_emu.isa.graph import bind_positions, to_json
from wse_emu.isa.graph_numpy import GraphRunner
from wse_emu.isa.program import Rect
from tests.compiler.np_models import make_llama


def _paint(rules, w, h):
    rx = np.zeros((h, w), np.int64)
    tx = np.zeros((h, w), np.int64)
    for r in rules:
        rx[r.rect.y:r.rect.y + r.rect.h, r.rect.x:r.rect.x + r.rect.w] = r.rx
        tx[r.rect.y:r.rect.y + r.rect.h, r.rect.x:r.rect.x + r.rect.w] = r.tx
    return rx, tx


def test_rules_reproduce_every_cell_and_merge_rectangles():
    rng = np.random.default_rng(0)
    cells = _Cells()
    want_rx = np.zeros((9, 11), np.int64)
    want_tx = np.zeros((9, 11), np.int64)
    ys, xs = np.nonzero(rng.random((9, 11)) < 0.6)
    rx, tx = rng.integers(1, 3, xs.size), rng.integers(1, 3, xs.size)
    cells.add(xs, ys, rx, tx)
    want_rx[ys, xs], want_tx[ys, xs] = rx, tx
    got_rx, got_tx = _paint(_rules(cells, 4), 11, 9)
    np.testing.assert_array_equal(got_rx, want_rx)
    np.testing.assert_array_equal(got_tx, want_tx)
    block = _Cells()
    yy, xx = np.mgrid[2:7, 3:9]
    block.add(xx.ravel(), yy.ravel(), W, RAMP)
    assert len(_rules(block, 0)) == 1  # a uniform rectangle is one rule


def _walk(cells):
    """Follow a tree from its source: the set of cells that get a RAMP delivery."""
    xs, ys, rx, tx = cells.arrays()
    at = {(int(x), int(y)): (int(r), int(t)) for x, y, r, t in zip(xs, ys, rx, tx)}
    src = next(c for c, (r, _) in at.items() if r == RAMP)
    step = {N: (0, -1, S), S: (0, 1, N), E: (1, 0, W), W: (-1, 0, E)}
    seen, frontier, delivered = {src}, [src], set()
    while frontier:
        x, y = frontier.pop()
        _, t = at[(x, y)]
        if t & RAMP and (x, y) != src:
            delivered.add((x, y))
        for port, (dx, dy, back) in step.items():
            if t & port:
                nxt = (x + dx, y + dy)
                assert at[nxt][0] == back, f"{nxt} does not accept from {back}"
                assert nxt not in seen
                seen.add(nxt)
                frontier.append(nxt)
    return delivered


@pytest.mark.parametrize("src, rect", [((0, 0), Rect(1, 0, 4, 3)), ((9, 5), Rect(1, 0, 4, 3)),
                                       ((2, 7), Rect(1, 0, 4, 3)), ((3, 1), Rect(0, 4, 5, 2)),
                                       ((6, 2), Rect(1, 0, 4, 3))])
def test_multicast_tree_reaches_every_pe_of_the_rect_once(src, rect):
    delivered = _walk(_path_and_tree(src, rect))
    assert delivered == set(rect.cells())


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_llama(tmp_path_factory.mktemp("routing"), hidden=64, intermediate=128, layers=3)


def test_colors_are_reused_across_layers(llama_dir):
    machine = load_machine("wse3")
    program, report = compile_model(llama_dir, machine, max_context=8, mapping="chain")
    assert report.colors <= 8  # the same few colors serve all three layers
    per_layer = {}
    for r in program.routes:
        per_layer.setdefault(r.rect.x // 20, set()).add(r.color)
    assert len(per_layer) > 1 and set.intersection(*per_layer.values())
    load(program, machine, with_data=False)  # every route tree is well formed


def test_graph_json_source_and_dumps(llama_dir, tmp_path):
    path = tmp_path / "llama.graph.json"
    path.write_text(to_json(load_graph(llama_dir, max_context=8)))
    out = io.StringIO()
    program, report = compile_model(path, load_machine("wse3"), dump=("stages", "placement",
                                                                     "routes"), dump_to=out,
                                    mapping="chain")
    text = out.getvalue()
    assert re.search(r"gemv +layers.2.mlp.gate\+up 256 x 64 \[layers.2.mlp.gate.weight, "
                     r"layers.2.mlp.up.weight\]\n", text)
    assert re.search(r"gemv +layers.0.mlp.down 64 x 128 .* prologue swiglu", text)
    assert "at (0, 0)" in text and "route rules" in text
    assert report.model == "llama" and {s.name for s in program.symbols} == {
        "input_ids", "position_ids", "logits"}


def test_placement_takes_the_smallest_tiles_that_fit(llama_dir):
    machine = load_machine("wse3")
    plan = lower(bind_positions(load_graph(llama_dir, max_context=8), 1))
    fastest = place_fastest(plan, machine, "f32", pad_last=False)
    largest = place(plan, machine, "f32")
    gemv = [i for i, s in enumerate(plan.stages) if s.kind == "gemv"]
    assert max(fastest[i].tr * fastest[i].tc for i in gemv) == 256
    assert all(fastest[i].tr * fastest[i].tc <= largest[i].tr * largest[i].tc for i in gemv)
    assert sum(p.P * p.Q for p in fastest) > 4 * sum(p.P * p.Q for p in largest)
    for p in largest:  # the largest tiles still fit a PE's SRAM
        assert p.sram <= machine.sram_bytes


def test_split_embedding_columns_join_in_order(llama_dir, monkeypatch):
    """Tables too wide for one PE are cut into column blocks that join east along the top row
    (GPT-2-XL needs it); force the cut on a small model by hiding the divisor 1 of hidden."""
    import wse_emu.isa.compiler.placement as placement

    divisors = placement._divisors
    monkeypatch.setattr(placement, "_divisors",
                        lambda n: [d for d in divisors(n) if d != 1] if n == 64 else divisors(n))
    machine = load_machine("wse3")
    program, report = compile_model(llama_dir, machine, max_context=8, mapping="chain")
    assert report.stages[0]["kind"] == "embed" and report.stages[0]["rect"][2] > 1
    gen = Generator(program, machine, engine="reference")
    golden = GraphRunner(load_graph(llama_dir, max_context=8))
    for pos, tok in enumerate([11, 200, 7]):
        want = golden.step({"input_ids": np.array([tok]), "position_ids": np.array([pos])})
        np.testing.assert_allclose(gen.step(tok), want["logits"][0], rtol=1e-4, atol=1e-5)

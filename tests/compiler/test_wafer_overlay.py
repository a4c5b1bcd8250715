"""A layer PE's scratch region (map_attention.scratch_layout): the attention's buffers and the
MLP's gate/up vector overlaid where their lifetimes in a step do not overlap, so a layer PE
needs fewer bytes, and two sequences in flight still give the NumPy golden model's ids."""

import numpy as np
import pytest

from wse_emu.emulator.generate import Generator
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.decoder import extract, geometry
from wse_emu.isa.compiler.lower import lower
from wse_emu.isa.compiler.map_attention import scratch_layout, scratch_sizes
from wse_emu.isa.compiler.pipeline import load_graph
from wse_emu.isa.compiler.wafer import parse_grid
from wse_emu.isa.graph import bind_positions
from wse_emu.isa.graph_numpy import GraphRunner
from wse_emu.isa.machine import load_machine
from tests.compiler.np_models import make_llama
from tests.compiler.test_wafer_rect import SMALL_LLAMA

# the buffers' lifetimes in a step's code, as first and last op in wafer._layer_body's order
# (0 rope, 1 append, 2 scores .. the values' mm, 3 o / l, 4 the o product, 5 the MLP)
LIVE = dict(cs=(0, 0), rt=(0, 0), mask=(1, 2), append=(1, 1), sc=(2, 2), mx=(2, 2),
            fold=(3, 3), oe=(2, 3), ao=(3, 4), gu=(5, 5))


def _geometry(path, grid):
    return geometry(extract(lower(bind_positions(load_graph(path, shape_only=True), 1))),
                    parse_grid(grid))


def test_only_buffers_dead_at_once_share_bytes_and_the_region_is_smaller(tmp_path):
    path = make_llama(tmp_path, seed=3, layers=1, **SMALL_LLAMA)
    for grid in ("6x8", "5x10", "7x6"):
        geo = _geometry(path, grid)
        size = scratch_sizes(geo, True, 4 * geo.M1)
        offs, nbytes = scratch_layout(geo, True, 4 * geo.M1)
        assert set(offs) == set(size) == set(LIVE)
        for a in offs:
            for b in offs:
                bytes_overlap = (a < b and offs[a] < offs[b] + size[b]
                                 and offs[b] < offs[a] + size[a])
                alive_together = (LIVE[a][0] <= LIVE[b][1] and LIVE[b][0] <= LIVE[a][1])
                assert not (bytes_overlap and alive_together), (grid, a, b)
        assert max(offs[k] + size[k] for k in offs) <= nbytes < sum(size.values())


def test_two_sequences_on_the_overlaid_scratch_match_the_golden_model(tmp_path):
    """Both sequences' greedy ids are the golden model's: no buffer of the region carries a
    value from one sequence's pass (or phase of a step) into another's."""
    wse3 = load_machine("wse3")
    path = make_llama(tmp_path, seed=11, layers=2, max_positions=16, **SMALL_LLAMA)
    program, report = compile_model(path, wse3, max_context=12, grid="6x8", sequences=2)
    assert report.sequences == 2
    prompts, n = [[5, 17, 300], [7, 8]], 5
    got = Generator(program, wse3, engine="core").generate(prompts, n).ids_per_sequence
    graph = load_graph(path, max_context=12)
    want = [GraphRunner(graph).generate_greedy(p, n) for p in prompts]
    assert got == want
    # every step's logits too, for the first sequence alone
    program1, _ = compile_model(path, wse3, max_context=12, grid="6x8")
    gen = Generator(program1, wse3, engine="core")
    steps = np.stack([gen.step(t) for t in prompts[0]])
    ref = GraphRunner(graph).prefill(prompts[0])
    np.testing.assert_allclose(steps, ref, rtol=1e-3, atol=1e-4 * np.abs(ref).max())

"""allreduce: every PE ends with the sum, for every form, rows, columns and rectangles."""

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.isa import collectives as C
from programs.conftest import build, same_run


def allreduce(rng, n, w, h, mode, engine="core"):
    v = rng.standard_normal((h * w, n), dtype=np.float32)
    ex = execute(build("allreduce", N=n, NX=w, NY=h, MODE=mode), "test64", {"v": v},
                 engine=engine)
    assert ex.result.outcome_name == "halted"
    return ex, v


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("w,h", [(8, 1), (1, 6), (4, 4), (8, 2), (2, 8), (5, 3)])
def test_every_pe_has_the_sum(rng, mode, w, h):
    ex, v = allreduce(rng, 64, w, h, mode)
    s = ex.outputs["s"]
    np.testing.assert_allclose(s, np.broadcast_to(v.sum(axis=0), s.shape), rtol=1e-5, atol=1e-5)
    assert (s == s[0]).all()  # one broadcast value, bit for bit on every PE


def test_chain_streams_and_tree_pays_per_level(rng):
    """A chain pipelines: ~N + hops. A tree stores and forwards: ~N per level."""
    n = 1024
    chain, _ = allreduce(rng, n, 16, 1, 0)
    tree, _ = allreduce(rng, n, 16, 1, 1)
    assert chain.result.cycles < 3 * n  # reduce + broadcast, each ~ N + 16 hops
    assert tree.result.cycles > 4 * n  # log2 levels of N on each half, plus the broadcast


def test_a_row_costs_its_formula_plus_the_dispatch(rng):
    """NY = 1: one line allreduce; the program's one region adds a few scalar cycles of
    branching on the position to what the formula gives for per-role regions."""
    for mode, form in [(0, "chain"), (2, "two_phase")]:
        ex, _ = allreduce(rng, 128, 24, 1, mode)
        _, root = C.best_layout("allreduce", 24, 128, form=form)
        formula = C.cost("allreduce", form, 24, 128, root=root)
        assert formula <= ex.result.cycles <= formula + 24


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_core_equals_reference(mode):
    a, _ = allreduce(np.random.default_rng(5), 24, 4, 3, mode, "core")
    b, _ = allreduce(np.random.default_rng(5), 24, 4, 3, mode, "reference")
    same_run(a, b)

"""allreduce: every PE ends with the sum, for chains and trees, rows and rectangles."""

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from programs.conftest import build, same_run


def allreduce(rng, n, w, h, mode, engine="core"):
    v = rng.standard_normal((h * w, n), dtype=np.float32)
    ex = execute(build("allreduce", N=n, NX=w, NY=h, MODE=mode), "test64", {"v": v},
                 engine=engine)
    assert ex.result.outcome_name == "halted"
    return ex, v


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("w,h", [(8, 1), (4, 4), (8, 2), (2, 8)])
def test_every_pe_has_the_sum(rng, mode, w, h):
    ex, v = allreduce(rng, 64, w, h, mode)
    s = ex.outputs["s"]
    np.testing.assert_allclose(s, np.broadcast_to(v.sum(axis=0), s.shape), rtol=1e-5, atol=1e-5)
    assert (s == s[0]).all()  # one broadcast value, bit for bit on every PE


@pytest.mark.parametrize("w,h", [(5, 1), (3, 5)])
def test_chain_on_odd_sizes(rng, w, h):
    ex, v = allreduce(rng, 16, w, h, 0)
    np.testing.assert_allclose(ex.outputs["s"][-1], v.sum(axis=0), rtol=1e-5, atol=1e-5)


def test_chain_streams_and_tree_pays_per_level(rng):
    """A chain pipelines: ~N + hops. A tree stores and forwards: ~N per level."""
    n = 1024
    chain, _ = allreduce(rng, n, 16, 1, 0)
    tree, _ = allreduce(rng, n, 16, 1, 1)
    assert chain.result.cycles < 3 * n  # reduce + broadcast, each ~ N + 16 hops
    assert tree.result.cycles > 4 * n  # log2(16) = 4 levels of N, plus the broadcast


@pytest.mark.parametrize("mode", [0, 1])
def test_core_equals_reference(mode):
    a, _ = allreduce(np.random.default_rng(5), 24, 4, 2, mode, "core")
    b, _ = allreduce(np.random.default_rng(5), 24, 4, 2, mode, "reference")
    same_run(a, b)

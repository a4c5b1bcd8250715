"""gemv: numbers against NumPy, Numba core against the reference, cycles by their properties."""

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.kernels.convert import bf16_to_f32_array, f32_to_bf16_array
from programs.conftest import build, same_run


def stored(w: np.ndarray, dt: str) -> np.ndarray:
    """W as the PEs hold it (rounded to the storage type), back in fp32."""
    if dt == "f16":
        return w.astype(np.float16).astype(np.float32)
    if dt == "bf16":
        return bf16_to_f32_array(f32_to_bf16_array(w))
    return w


def gemv(rng, m, k, p, q, dt="f32", machine="wse3", engine="core"):
    w = rng.standard_normal((m, k), dtype=np.float32)
    x = rng.standard_normal(k, dtype=np.float32)
    prog = build("gemv", {"W": w}, M=m, K=k, P=p, Q=q, DT=dt)
    ex = execute(prog, machine, {"x": x}, engine=engine)
    assert ex.result.outcome_name == "halted"
    return ex, stored(w, dt) @ x


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_y_matches_numpy(rng, dt):
    ex, ref = gemv(rng, 256, 192, 4, 3, dt)
    np.testing.assert_allclose(ex.outputs["y"], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("p,q", [(1, 1), (1, 4), (4, 1), (2, 3)])
def test_degenerate_rectangles(rng, p, q):
    ex, ref = gemv(rng, 48, 48, p, q)
    np.testing.assert_allclose(ex.outputs["y"], ref, rtol=1e-4, atol=1e-4)


def test_core_equals_reference(rng):
    seed = int(rng.integers(1 << 30))
    a, _ = gemv(np.random.default_rng(seed), 32, 48, 2, 3, "bf16", engine="core")
    b, _ = gemv(np.random.default_rng(seed), 32, 48, 2, 3, "bf16", engine="reference")
    same_run(a, b)


def test_cycles_grow_with_tile_size(rng):
    small, _ = gemv(rng, 64, 64, 4, 4)
    big, _ = gemv(rng, 128, 128, 4, 4)  # tiles 4x larger
    spread, _ = gemv(rng, 128, 128, 8, 8)  # same tiles as `small`, more PEs
    c_small, c_big, c_spread = small.result.cycles, big.result.cycles, spread.result.cycles
    assert 3.0 < c_big / c_small < 4.5  # mv dominates: MT*KT fp32 FMACs at width 1
    assert abs(c_spread - c_small) < 0.25 * c_small  # a wider grid adds only hops


def test_cycles_follow_simd_width(rng):
    f32, _ = gemv(rng, 128, 128, 2, 2, "f32")
    f16, _ = gemv(rng, 128, 128, 2, 2, "f16")
    f16_wse2, _ = gemv(rng, 128, 128, 2, 2, "f16", machine="wse2")
    # wse3: fp32 FMAC x1, fp16-in/fp32-accumulate x4; wse2: x2
    assert f16.result.cycles < f32.result.cycles / 3
    assert f16.result.cycles < f16_wse2.result.cycles < f32.result.cycles


@pytest.mark.parametrize("form", [1, 2, 3])
def test_every_reduce_form(rng, form):
    w = rng.standard_normal((96, 80), dtype=np.float32)
    x = rng.standard_normal(80, dtype=np.float32)
    a = execute(build("gemv", {"W": w}, M=96, K=80, P=3, Q=10, FORM=form), "wse3", {"x": x})
    np.testing.assert_allclose(a.outputs["y"], w @ x, rtol=1e-4, atol=1e-4)
    b = execute(build("gemv", {"W": w}, M=96, K=80, P=3, Q=10, FORM=form), "wse3", {"x": x},
                engine="reference")
    same_run(a, b)


def test_issue_bar_full_size_wse2():
    """16384 x 16384 f16 on 512 x 512 PEs of wse2, timing-only: x enters in the middle row,
    the partials reduce into the middle column with the fastest form."""
    prog = build("gemv", M=16384, K=16384, P=512, Q=512, DT="f16", SHAPE_ONLY=1)
    ex = execute(prog, "wse2", {"x": np.zeros(16384, np.float32)}, timing_only=True)
    assert ex.result.outcome_name == "halted"
    # the broadcast of x (~300 cycles), the tile product, the two-phase reduce (~530): room
    # for a tile product timed as 32 column ops with a start cost each (issue 26, item 9)
    assert ex.result.cycles <= 1500


def test_x_row_and_y_column_can_be_chosen(rng):
    """XROW = 0 and YCOL = Q - 1 with a chain: the layout of a plain chain gemv (x from row 0,
    y in the last column), with the same numbers."""
    w = rng.standard_normal((48, 60), dtype=np.float32)
    x = rng.standard_normal(60, dtype=np.float32)
    prog = build("gemv", {"W": w}, M=48, K=60, P=4, Q=5, FORM=1, XROW=0, YCOL=4)
    assert sorted(r.name for r in prog.regions) == sorted(
        f"gemv_{b}_{c}" for b in (0, 1) for c in range(5))
    y = [s for s in prog.symbols if s.name == "y"][0]
    assert {p.rect.x for p in y.pieces} == {4}
    ex = execute(prog, "wse3", {"x": x})
    np.testing.assert_allclose(ex.outputs["y"], w @ x, rtol=1e-4, atol=1e-4)

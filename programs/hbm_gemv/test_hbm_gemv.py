"""hbm_gemv: numbers against NumPy, Numba core against the reference, HBM timing by its physics."""

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.emulator.load import LoadError
from wse_emu.isa.machine import load_machine
from wse_emu.kernels.convert import bf16_to_f32_array, f32_to_bf16_array
from programs.conftest import build, same_run

H100 = load_machine("h100")


def hbm_gemv(rng, m=2048, k=1024, c=8, mt=32, engine="core", machine=H100):
    w = rng.standard_normal((m, k), dtype=np.float32)
    x = rng.standard_normal(k, dtype=np.float32)
    prog = build("hbm_gemv", {"W": w}, M=m, K=k, C=c, MT=mt)
    ex = execute(prog, machine, {"x": x}, engine=engine)
    assert ex.result.outcome_name == "halted"
    return ex, bf16_to_f32_array(f32_to_bf16_array(w)) @ x


@pytest.mark.parametrize("m, k, c, mt", [(2048, 1024, 8, 32), (512, 256, 4, 16), (256, 64, 1, 128)])
def test_y_matches_numpy(rng, m, k, c, mt):
    ex, ref = hbm_gemv(rng, m, k, c, mt)
    np.testing.assert_allclose(ex.outputs["y"], ref, rtol=1e-4, atol=1e-4)


def test_core_equals_reference(rng):
    seed = int(rng.integers(1 << 30))
    a, _ = hbm_gemv(np.random.default_rng(seed), 256, 128, 4, 16, engine="core")
    b, _ = hbm_gemv(np.random.default_rng(seed), 256, 128, 4, 16, engine="reference")
    same_run(a, b)
    assert (a.result.hbm_read_bytes, a.result.hbm_write_bytes) == (
        b.result.hbm_read_bytes, b.result.hbm_write_bytes)


def test_every_weight_byte_is_streamed_and_the_bandwidth_is_never_beaten(rng):
    m, k, c = 4096, 1024, 64
    ex, _ = hbm_gemv(rng, m, k, c)
    r = ex.result
    assert r.hbm_read_bytes == m * k * 2 + c * k * 4  # W once, x once a core
    assert r.hbm_write_bytes == m * 4
    floor = m * k * 2 / H100.hbm_bytes_per_cycle + H100.hbm_latency
    assert floor <= r.cycles < 2 * floor  # bandwidth bound, not compute bound


def test_more_cores_approach_the_bandwidth_floor(rng):
    """Each core keeps one tile in flight while it computes, so a few cores are latency bound;
    many cores together saturate HBM, and cycles approach bytes / bandwidth."""
    few, _ = hbm_gemv(rng, 4096, 1024, 8)
    many, _ = hbm_gemv(rng, 4096, 1024, 64)
    floor = 4096 * 1024 * 2 / H100.hbm_bytes_per_cycle
    assert many.result.cycles < 0.75 * few.result.cycles
    assert many.result.cycles < 1.5 * (floor + H100.hbm_latency)


def test_a_machine_without_hbm_refuses_it(rng):
    with pytest.raises(LoadError, match="HBM"):
        hbm_gemv(rng, 256, 64, 1, 128, machine=load_machine("wse3"))

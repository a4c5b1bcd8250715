"""Systems of chips (docs/timing-model.md, "Systems: links between chips"): the pipes between
chips in the timing model (core and reference), per-GPU HBM, and their statistics."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wse_emu.emulator.api import execute
from wse_emu.emulator.load import LoadError, load
from wse_emu.emulator.report import problem_line, summary, text
from wse_emu.isa.asm import assemble
from wse_emu.isa.machine import PRESET_DIR, load_machine
from programs.conftest import build, same_run
from tests.emulator.test_reference_vs_core import HBM_BYTES, both, build_program

TINY = (PRESET_DIR / "tiny.toml").read_text()
CLOCK = 1.1e9  # tiny's clock: latency_ns * 1.1 = cycles
# the machines come from fixtures (TOML files in tmp_path): the same for every example
SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]

# NX columns each send N f32 from row Y0 straight to row Y1 (down when Y1 > Y0, else up): on a
# system of two 8-row chips a route from a row < 8 to a row >= 8 crosses the pipe 0 -> 1.
COLUMNS = """
.param NX = 1
.param Y0 = 6
.param Y1 = 9
.param N = 16
.set DOWN = Y1 > Y0
.set LO = DOWN * Y0 + (1 - DOWN) * Y1
.set HI = DOWN * Y1 + (1 - DOWN) * Y0
.input v, f32, [NX, N]
.output out, f32, [NX, N]
.if DOWN
.route 0, Y0, NX, 1, 0, rx=RAMP, tx=S
.route 0, LO + 1, NX, HI - LO - 1, 0, rx=N, tx=S
.route 0, Y1, NX, 1, 0, rx=N, tx=RAMP
.else
.route 0, Y0, NX, 1, 0, rx=RAMP, tx=N
.route 0, LO + 1, NX, HI - LO - 1, 0, rx=S, tx=N
.route 0, Y1, NX, 1, 0, rx=S, tx=RAMP
.endif
.region src, 0, Y0, NX, 1
    .alloc buf, N * 4
    .piece v, buf, f32, tile=(1, N), row=rx, col=0
    dmem d0, f32, buf, N
    dfout d1, f32, 0, N
    vmov d1, d0
    halt
.endregion
.region dst, 0, Y1, NX, 1
    .alloc acc, N * 4
    .piece out, acc, f32, tile=(1, N), row=rx, col=0
    dmem d0, f32, acc, N
    dfin d1, f32, 0, N
    vmov d0, d1
    halt
.endregion
"""


def columns(**params):
    return assemble(COLUMNS, "columns.wsa", {k: str(v) for k, v in params.items()}, {})


def chip_toml(tmp_path: Path, name: str, *, latency_ns: float = 10.0,
              bandwidth: float = 1.5e11, height: int = 8, hbm: str = "",
              switch: bool = True) -> str:
    """A tiny-like chip in a TOML file with the given [link] figures (and rows, and an
    optional [hbm] table; switch=False: chips joined point to point); its path, to name as
    PATHxN."""
    doc = re.sub(r"(?m)^name = .*$", f'name = "{name}"', TINY)
    doc = re.sub(r"(?m)^switch = \S+", f"switch = {str(switch).lower()}", doc)
    doc = re.sub(r"(?m)^height = \d+", f"height = {height}", doc)
    doc = re.sub(r"(?m)^bandwidth_bytes_per_s = \S+", f"bandwidth_bytes_per_s = {bandwidth!r}",
                 doc)
    doc = re.sub(r"(?m)^latency_ns = \S+", f"latency_ns = {latency_ns!r}", doc)
    path = tmp_path / f"{name}.toml"
    path.write_text(doc + hbm)
    return str(path)


def cycles(program, machine, v=None, engine="core") -> int:
    ex = execute(program, machine, {"v": v} if v is not None else {}, engine=engine)
    assert ex.result.outcome_name == "halted"
    return ex.result.cycles


def values(nx, n):
    return np.arange(nx * n, dtype=np.float32).reshape(nx, n) * 0.25 - 3.0


@pytest.fixture
def tall(tmp_path):
    """One chip of 16 rows: the same fabric as a system of two 8-row chips, with ordinary
    links where the system has its pipe."""
    return load_machine(chip_toml(tmp_path, "tall", height=16))


@pytest.fixture
def wide(tmp_path):
    """Two 8-row chips, tiny's 150 GB/s pipe (34 wavelets a cycle), 10 ns = 11 cycles."""
    return load_machine(chip_toml(tmp_path, "wide", latency_ns=10.0) + "x2")


@pytest.fixture
def narrow(tmp_path):
    """Two 8-row chips joined by a pipe of half a wavelet a cycle (2 bytes), 11 cycles."""
    return load_machine(chip_toml(tmp_path, "narrow", latency_ns=10.0, bandwidth=2 * CLOCK) + "x2")


def test_system_machines(wide, narrow):
    assert (wide.chips, wide.height, wide.chip_height, wide.link_latency) == (2, 16, 8, 11)
    assert narrow.link_bytes_per_cycle == pytest.approx(2.0)


@settings(max_examples=12, deadline=None, suppress_health_check=SLOW_OK)
@given(y0=st.integers(0, 7), y1=st.integers(8, 15), n=st.integers(1, 80),
       up=st.booleans())
def test_a_crossing_costs_exactly_the_latency(tall, wide, narrow, y0, y1, n, up):
    """One message alone on a free pipe: exactly link_latency more than over an ordinary link
    (a pipe at least one wavelet a cycle), either way across the boundary."""
    if y1 - y0 < 2:
        y1 = y0 + 2
    if up:
        y0, y1 = y1, y0
    p = columns(NX=1, Y0=y0, Y1=y1, N=n)
    v = values(1, n)
    base = cycles(p, tall, v)
    assert cycles(p, wide, v) == base + wide.link_latency
    # half a wavelet a cycle: the pipe, not the fabric link, bounds the tail
    assert cycles(p, narrow, v) >= base + narrow.link_latency + n - 1


def test_more_bytes_cost_more(wide, narrow):
    for machine in (wide, narrow):
        c = [cycles(columns(NX=2, N=n), machine, values(2, n)) for n in (4, 16, 64, 256)]
        assert c == sorted(c) and len(set(c)) == len(c), c
    # on the narrow pipe each further wavelet of a column costs two cycles (two columns)
    c16 = cycles(columns(NX=2, N=16), narrow, values(2, 16))
    c64 = cycles(columns(NX=2, N=64), narrow, values(2, 64))
    assert c64 - c16 >= 2 * 2 * (64 - 16) - 4


def test_flows_at_once_share_a_narrow_pipe(wide, narrow):
    n = 64
    one = cycles(columns(NX=1, N=n), narrow, values(1, n))
    two = cycles(columns(NX=2, N=n), narrow, values(2, n))
    four = cycles(columns(NX=4, N=n), narrow, values(4, n))
    # half a wavelet a cycle: every further column's n wavelets take 2n more cycles
    assert two - one >= 2 * n - 2 and four - two >= 2 * 2 * n - 2
    # a wide pipe (34 wavelets a cycle) hardly notices four columns: the fabric links bound them
    w1 = cycles(columns(NX=1, N=n), wide, values(1, n))
    w4 = cycles(columns(NX=4, N=n), wide, values(4, n))
    assert w4 - w1 < n // 4


@pytest.mark.parametrize("bandwidth", [2 * CLOCK, 1.5e11])
@pytest.mark.parametrize("nx,n", [(1, 16), (3, 40), (8, 7)])
def test_a_longer_latency_adds_exactly_its_latency(tmp_path, bandwidth, nx, n):
    short = load_machine(chip_toml(tmp_path, "short", latency_ns=10.0, bandwidth=bandwidth) + "x2")
    long = load_machine(chip_toml(tmp_path, "long", latency_ns=200.0, bandwidth=bandwidth) + "x2")
    assert long.link_latency - short.link_latency == 209
    for y0, y1 in ((5, 10), (12, 3)):
        p = columns(NX=nx, Y0=y0, Y1=y1, N=n)
        v = values(nx, n)
        assert cycles(p, long, v) - cycles(p, short, v) == 209


def test_core_and_reference_agree_on_columns(wide, narrow):
    for machine in (wide, narrow):
        for nx, y0, y1 in ((3, 6, 8), (8, 2, 13), (5, 14, 1)):
            p = columns(NX=nx, Y0=y0, Y1=y1, N=33)
            v = values(nx, 33)
            a = execute(p, machine, {"v": v}, engine="core")
            b = execute(p, machine, {"v": v}, engine="reference")
            same_run(a, b)
            np.testing.assert_array_equal(a.result.pipe_wavelets, b.result.pipe_wavelets)
            np.testing.assert_array_equal(a.outputs["out"], v)
            pipe = 0 if y1 > y0 else 1
            assert a.result.pipe_wavelets[pipe] == nx * 33
            assert a.result.pipe_wavelets[1 - pipe] == 0
            # timing-only mode times the pipes alike
            t = execute(p, machine, {"v": v}, timing_only=True)
            assert t.result.cycles == a.result.cycles
            np.testing.assert_array_equal(t.result.pipe_wavelets, a.result.pipe_wavelets)


def test_routes_within_a_chip_are_ordinary_links(tall, narrow):
    """Only the links across a chip boundary are system links: a route inside chip 0 or
    inside chip 1 times as on one chip, and crosses no pipe."""
    for y0, y1 in ((0, 7), (7, 0), (8, 15), (14, 9)):
        p = columns(NX=4, Y0=y0, Y1=y1, N=20)
        ex = execute(p, narrow, {"v": values(4, 20)})
        assert ex.result.cycles == cycles(p, tall, values(4, 20))
        assert not ex.result.pipe_wavelets.any()


# NX columns of row Y0 each send N f32 north to row Y0 - D (when UP) and south to row Y0 + D
# (when DOWN) in one multicast message
FANOUT = """
.param NX = 1
.param Y0 = 12
.param D = 8
.param N = 16
.param UP = 1
.param DOWN = 1
.input v, f32, [NX, N]
.output out, f32, [(UP + DOWN) * NX, N]
.if UP * DOWN
.route 0, Y0, NX, 1, 0, rx=RAMP, tx=N|S
.elif UP
.route 0, Y0, NX, 1, 0, rx=RAMP, tx=N
.else
.route 0, Y0, NX, 1, 0, rx=RAMP, tx=S
.endif
.if UP
.route 0, Y0 - D + 1, NX, D - 1, 0, rx=S, tx=N
.route 0, Y0 - D, NX, 1, 0, rx=S, tx=RAMP
.endif
.if DOWN
.route 0, Y0 + 1, NX, D - 1, 0, rx=N, tx=S
.route 0, Y0 + D, NX, 1, 0, rx=N, tx=RAMP
.endif
.region src, 0, Y0, NX, 1
    .alloc buf, N * 4
    .piece v, buf, f32, tile=(1, N), row=rx, col=0
    dmem d0, f32, buf, N
    dfout d1, f32, 0, N
    vmov d1, d0
    halt
.endregion
.if UP
.region north, 0, Y0 - D, NX, 1
    .alloc acc, N * 4
    .piece out, acc, f32, tile=(1, N), row=rx, col=0
    dmem d0, f32, acc, N
    dfin d1, f32, 0, N
    vmov d0, d1
    halt
.endregion
.endif
.if DOWN
.region south, 0, Y0 + D, NX, 1
    .alloc acc, N * 4
    .piece out, acc, f32, tile=(1, N), row=rx + UP * NX, col=0
    dmem d0, f32, acc, N
    dfin d1, f32, 0, N
    vmov d0, d1
    halt
.endregion
.endif
"""


def fanout(**params):
    return assemble(FANOUT, "fanout.wsa", {k: str(v) for k, v in params.items()}, {})


@pytest.mark.parametrize("switch", [True, False])
def test_two_flows_from_one_chip_share_its_port_only_through_a_switch(tmp_path, switch):
    """Chip 1 of three sends to chips 0 and 2 at once. Through a switch both copies leave by
    chip 1's port (its [link] bandwidth, whatever the destination): longer than one flow.
    Point to point they take two pipes (1 -> 0 and 1 -> 2): as long as one flow."""
    machine = load_machine(chip_toml(tmp_path, "fan", latency_ns=10.0, bandwidth=2 * CLOCK,
                                     switch=switch) + "x3")
    assert machine.link_switch is switch
    nx, n = 4, 48
    v = values(nx, n)
    both_ways = fanout(NX=nx, N=n)
    one = [cycles(fanout(NX=nx, N=n, UP=up, DOWN=1 - up), machine, v) for up in (0, 1)]
    two = cycles(both_ways, machine, v)
    ex = execute(both_ways, machine, {"v": v})
    ref = execute(both_ways, machine, {"v": v}, engine="reference")
    same_run(ex, ref)
    np.testing.assert_array_equal(ex.result.pipe_wavelets, ref.result.pipe_wavelets)
    np.testing.assert_array_equal(ex.outputs["out"], np.concatenate([v, v]))
    if switch:
        # half a wavelet a cycle: the second copy's nx * n wavelets take 2 nx n more cycles
        assert two - max(one) >= 2 * nx * n - 2
        assert ex.result.pipe_wavelets.tolist() == [0, 2 * nx * n, 0]
    else:
        assert two == max(one)
        assert ex.result.pipe_wavelets.tolist() == [0, nx * n, nx * n, 0]  # 1 -> 0, 1 -> 2


@pytest.mark.parametrize("switch", [True, False])
def test_a_switch_reaches_a_far_chip_in_one_latency(tmp_path, switch):
    """Chip 0 to chip 2 of three: through a switch one latency (chip 0's port sends a copy for
    chip 1's boundary and one for chip 2's, which the switch delivers with no second latency);
    point to point two, one a boundary, and each pipe carries one copy."""
    tall = load_machine(chip_toml(tmp_path, "tall3", height=24))
    machine = load_machine(chip_toml(tmp_path, "far", latency_ns=50.0, switch=switch) + "x3")
    lat = machine.link_latency
    for nx, n in ((1, 16), (1, 60), (5, 40)):
        p = fanout(NX=nx, N=n, Y0=4, D=16, UP=0, DOWN=1)
        v = values(nx, n)
        base = cycles(p, tall, v)
        got = cycles(p, machine, v)
        if nx == 1:  # one column: the fabric link, not the port, bounds it
            assert got == base + (lat if switch else 2 * lat)
        else:  # the port's copies may delay the later columns' heads, by their bytes at most
            port = math.ceil(2 * nx * n * 4 / machine.link_bytes_per_cycle)
            low = base + (lat if switch else 2 * lat)
            assert low <= got <= low + port + 1
        a = execute(p, machine, {"v": v})
        b = execute(p, machine, {"v": v}, engine="reference")
        same_run(a, b)
        np.testing.assert_array_equal(a.result.pipe_wavelets, b.result.pipe_wavelets)
        np.testing.assert_array_equal(a.outputs["out"], v)
        want = [2 * nx * n, 0, 0] if switch else [nx * n, 0, nx * n, 0]
        assert a.result.pipe_wavelets.tolist() == want


ROW_HBM = f"""
[hbm]
capacity_bytes = {HBM_BYTES}
bandwidth_bytes_per_s = 1.1e10
efficiency = 0.9
latency_ns = 15
channels = 3
interleave_bytes = 32
"""


@settings(max_examples=20, deadline=None, suppress_health_check=SLOW_OK)
@given(seed=st.integers(0, 2**31 - 1), narrow_pipe=st.booleans(), switch=st.booleans())
def test_random_programs_agree_on_a_system(tmp_path, seed, narrow_pipe, switch):
    """The random programs of test_reference_vs_core, exchanging southwards on a system of
    one-row chips with their own HBM each: every exchange crosses a pipe (a port through a
    switch, a pipe between neighbours point to point)."""
    chip = chip_toml(tmp_path, "row", latency_ns=20.0, height=1, hbm=ROW_HBM,
                     bandwidth=1.5 * CLOCK if narrow_pipe else 1.5e11, switch=switch)
    machine = load_machine(chip + "x3")
    program = build_program(seed, vertical=True, hbm_per_row=HBM_BYTES)
    a, b = both(program, machine)
    assert a.result.outcome_name == "halted", problem_line(a.loaded, a.result)
    same_run(a, b)
    np.testing.assert_array_equal(a.result.pipe_wavelets, b.result.pipe_wavelets)
    rows = a.loaded.grid_h
    assert (a.result.pipe_wavelets[0] > 0) == (rows > 1)
    assert len(a.result.hbm_channel_busy) == 3 * 3


def test_allreduce_gives_the_same_numbers_on_one_and_two_chips(tall):
    """A functional program across the boundary: the same sums, bit for bit, later."""
    rng = np.random.default_rng(7)
    v = rng.standard_normal((16 * 4, 64), dtype=np.float32)
    p = build("allreduce", N=64, NX=4, NY=16, MODE=0)
    one = execute(p, tall, {"v": v})
    two = execute(p, "tinyx2", {"v": v})
    ref = execute(p, "tinyx2", {"v": v}, engine="reference")
    assert one.result.outcome_name == two.result.outcome_name == "halted"
    np.testing.assert_array_equal(one.outputs["s"], two.outputs["s"])
    np.testing.assert_allclose(two.outputs["s"][0], v.sum(axis=0), rtol=1e-5, atol=1e-5)
    same_run(two, ref)
    # down the columns and back up: both pipes, 2 us each way at least once
    assert (two.result.pipe_wavelets > 0).all()
    assert two.result.cycles >= one.result.cycles + 2 * load_machine("tinyx2").link_latency


def test_report_shows_the_pipes(wide):
    ex = execute(columns(NX=4, N=50), wide, {"v": values(4, 50)})
    d = summary(ex.loaded, ex.result)
    s = d["system"]
    assert s["chips"] == 2 and s["link_latency_cycles"] == 11
    down, up = s["pipes"]  # tiny's chips meet through a switch: a port a chip
    assert down["pipe"] == "chip 0 -> switch" and up["pipe"] == "chip 1 -> switch"
    assert down["bytes"] == 4 * 50 * 4 and up["bytes"] == 0
    # 200 wavelets at 1923 ticks each over the run's cycles
    assert down["busy_fraction"] == pytest.approx(200 * 1923 / 65536 / ex.result.cycles,
                                                  abs=1e-6)
    assert "chip 0 -> switch" in text(d)
    one_chip = execute(columns(NX=1, N=8), "test64", {"v": values(1, 8)})
    assert "system" not in summary(one_chip.loaded, one_chip.result)


# ---------------------------------------------------------------------------------------------
# per-GPU HBM

GPU_HBM = """
[hbm]
capacity_bytes = 4096
bandwidth_bytes_per_s = 4.4e9
efficiency = 1.0
latency_ns = 10
channels = 4
interleave_bytes = 64
"""

# one SM on each GPU (rows 0 and 1) loads 64 bytes at A0 (GPU 0's SM) and A1 (GPU 1's SM)
DMA = """
.param A0 = 0
.param A1 = 4096
.hbm all, 8192
.region sm, 0, 0, 1, 2
    .alloc buf, 64
    dmem d0, f32, buf, 16
    li r1, A0
    beq GY, r0, go
    li r1, A1
go:
    dmald d0, r1, 0
    dmawait 0
    halt
.endregion
"""


@pytest.fixture
def gpus(tmp_path):
    doc = re.sub(r'(?m)^kind = "mesh"', 'kind = "hbm"', TINY)
    doc = re.sub(r"(?m)^height = \d+", "height = 1", doc)
    doc = re.sub(r"(?m)^width = \d+", "width = 2", doc)
    path = tmp_path / "gpu.toml"
    path.write_text(doc + GPU_HBM)
    return load_machine(str(path) + "x2")


def dma(**params):
    return assemble(DMA, "dma.wsa", {k: str(v) for k, v in params.items()}, {})


@pytest.mark.parametrize("a0,a1", [(0, 4096), (128, 4096 + 3 * 64), (64 * 5, 4096 + 4032)])
def test_each_gpu_has_its_own_channels(gpus, a0, a1):
    a = execute(dma(A0=a0, A1=a1), gpus, engine="core")
    b = execute(dma(A0=a0, A1=a1), gpus, engine="reference")
    assert a.result.outcome_name == "halted"
    same_run(a, b)
    busy = a.result.hbm_channel_busy
    np.testing.assert_array_equal(busy, b.result.hbm_channel_busy)
    assert len(busy) == 8
    # GPU c's byte x is on channel c * 4 + ((x - c * 4096) // 64) % 4
    expect = {(a0 // 64) % 4, 4 + ((a1 - 4096) // 64) % 4}
    assert set(np.flatnonzero(busy).tolist()) == expect


def test_two_gpus_do_not_share_bandwidth(gpus):
    """The same channel index on two GPUs: no contention (each its own HBM), unlike two SMs
    of one GPU on one channel."""
    apart = execute(dma(A0=0, A1=4096), gpus).result.cycles
    alone = execute(dma(A0=0, A1=4096 + 64), gpus).result.cycles
    assert apart == alone


@pytest.mark.parametrize("engine", ["core", "reference"])
def test_dma_into_another_gpus_hbm_is_a_fault(gpus, engine):
    ex = execute(dma(A0=4096 + 64, A1=4096), gpus, engine=engine)
    assert ex.result.outcome_name == "fault"
    line = problem_line(ex.loaded, ex.result)
    assert "\n" not in line
    assert "PE (0,0)" in line and "another GPU's HBM" in line
    assert "0x1040" in line and "GPU 1 owns" in line and "on GPU 0" in line
    # reaching past its own range from the inside names the first byte outside
    ex = execute(dma(A0=4096 - 32, A1=4096), gpus, engine=engine)
    assert "reach byte 0x1000, which GPU 1 owns" in problem_line(ex.loaded, ex.result)


def test_core_and_reference_fault_alike(gpus):
    a = execute(dma(A0=0, A1=64), gpus, engine="core")
    b = execute(dma(A0=0, A1=64), gpus, engine="reference")
    assert a.result.outcome_name == b.result.outcome_name == "fault"
    assert (a.result.fault_pe, a.result.fault_reason, a.result.fault_detail) == \
        (b.result.fault_pe, b.result.fault_reason, b.result.fault_detail)
    assert "GPU 0 owns" in a.result.fault_detail and "on GPU 1" in a.result.fault_detail


def test_hbm_capacity_is_per_gpu_times_gpus(gpus):
    load(dma(), gpus)  # 8192 bytes = 2 x 4096
    big = DMA.replace(".hbm all, 8192", ".hbm all, 8193")
    with pytest.raises(LoadError, match=r"needs 8,193 bytes of HBM; .* has 8,192 bytes \(2 x "
                                        r"4,096 bytes\)"):
        load(assemble(big, "big.wsa", {}, {}), gpus)

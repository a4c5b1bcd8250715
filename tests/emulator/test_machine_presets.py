"""Machine presets: the GPU (HBM) presets carry their cited figures, derived values follow from
them, and malformed [hbm] tables are refused in one line."""

import dataclasses

import pytest

from wse_emu.isa.machine import PRESET_DIR, MachineError, load_machine, machine_from_dict


@pytest.mark.parametrize("name, sms, bw, cap, clock", [
    ("a100", 108, 2.04e12, 80e9, 1.41e9),
    ("h100", 132, 3.35e12, 80e9, 1.98e9),
    ("h200", 132, 4.8e12, 141e9, 1.98e9),
])
def test_gpu_presets_have_facts_figures(name, sms, bw, cap, clock):
    m = load_machine(name)
    assert m.kind == "hbm" and m.pes == sms and m.height == 1
    assert m.hbm_bandwidth == bw and m.hbm_bytes == cap and m.clock_hz == clock
    assert 0 < m.hbm_efficiency <= 1
    # bytes per cycle is the achievable bandwidth over the core clock
    assert m.hbm_bytes_per_cycle == pytest.approx(bw * m.hbm_efficiency / clock)
    # dense fp16 peak matches the datasheet figure it was derived from (FACTS.md)
    peak = {"a100": 312e12, "h100": 989e12, "h200": 989e12}[name]
    assert m.peak_flops == pytest.approx(peak, rel=0.01)


def test_wafers_have_no_hbm():
    for name in ("wse2", "wse3", "test64", "tiny"):
        m = load_machine(name)
        assert m.kind == "mesh" and m.hbm_bytes == 0 and m.hbm_bytes_per_cycle == 0.0


def _doc(**hbm):
    base = load_machine("h100")
    doc = {"name": "x", "kind": "hbm",
           "fabric": {k: getattr(base, k) for k in ("width", "height", "colors", "hop_latency",
                                                    "ramp_latency", "queue_depth",
                                                    "wavelet_bytes")},
           "pe": {k: getattr(base, k) for k in ("sram_bytes", "clock_hz", "issue_overhead",
                                                "scalar_cycles", "special_scalar_cycles")},
           "simd": dict(base.simd)}
    if hbm is not None:
        doc["hbm"] = {"capacity_bytes": 10**9, "bandwidth_bytes_per_s": 1e12, "efficiency": 0.5,
                      "latency_ns": 100, "channels": 4, "interleave_bytes": 256, **hbm}
    return doc


def test_latency_converts_to_cycles():
    m = machine_from_dict(_doc())
    assert m.hbm_latency == round(100e-9 * m.clock_hz)
    assert m.hbm_bytes_per_cycle == pytest.approx(1e12 * 0.5 / m.clock_hz)


@pytest.mark.parametrize("change, message", [
    ({"efficiency": 1.5}, "efficiency is a fraction of peak"),
    ({"channels": 0}, "[hbm] channels must be a positive number"),
    ({"channels": 2.5}, "[hbm] channels must be an integer"),
    ({"bandwidth_bytes_per_s": "fast"}, "bandwidth_bytes_per_s must be a positive number"),
])
def test_bad_hbm_tables_are_refused(change, message):
    with pytest.raises(MachineError, match=message.replace("[", r"\[").replace("]", r"\]")):
        machine_from_dict(_doc(**change))


def test_hbm_kind_needs_an_hbm_table_and_unknown_kinds_are_refused():
    doc = _doc()
    del doc["hbm"]
    with pytest.raises(MachineError, match="needs an \\[hbm\\] table"):
        machine_from_dict(doc)
    with pytest.raises(MachineError, match="kind 'tpu' is not supported"):
        machine_from_dict({**_doc(), "kind": "tpu"})
    # a mesh machine may have HBM too (a wafer with attached memory, for experiments)
    m = machine_from_dict({**_doc(), "kind": "mesh"})
    assert m.hbm_bytes == 10**9
    assert dataclasses.replace(m, hbm_bytes=0).hbm_bytes_per_cycle == 0.0


def test_systems_by_name():
    """NAMExN: N chips of a preset stacked along y, joined by the preset's [link] table."""
    one, four = load_machine("wse3"), load_machine("wse3x4")
    assert (four.name, four.base, four.chips) == ("wse3x4", "wse3", 4)
    assert (four.width, four.height, four.chip_height) == (one.width, 4 * one.height, one.height)
    assert four.chip == one
    assert four.chip_of(one.height - 1) == 0 and four.chip_of(one.height) == 1
    assert four.link_bandwidth == 150e9 and four.link_latency == round(2e-6 * one.clock_hz)
    node = load_machine("h100x8")
    assert (node.chips, node.height, node.hbm_bytes) == (8, 8, load_machine("h100").hbm_bytes)
    assert node.link_bandwidth == 450e9 and node.link_switch


@pytest.mark.parametrize("name, words", [("wse3x0", "1 to 64 chips"), ("wse3x65", "1 to 64"),
                                         ("nopex2", "a system of 'nope'"),
                                         ("wse3x4x2", "wse3x4 is already a system; a system "
                                                      "of 8 wse3 chips is wse3x8"),
                                         ("wse3x40x2", "a system has at most 64 chips"),
                                         ("nopex4x2", "a system of 'nopex4', but unknown")])
def test_bad_systems_are_one_line(name, words):
    with pytest.raises(MachineError, match=words):
        load_machine(name)


def test_a_chip_without_links_cannot_be_joined(tmp_path):
    text = (PRESET_DIR / "tiny.toml").read_text().split("[link]")[0]
    path = tmp_path / "solo.toml"
    path.write_text(text.replace('name = "tiny"', 'name = "solo"'))
    assert load_machine(str(path)).chips == 1
    with pytest.raises(MachineError, match="no \\[link\\] table"):
        load_machine(f"{path}x2")


def test_machines_lists_the_systems():
    """`wse-emu machines` ends with the systems: NAMExN for any preset, each preset's links."""
    from click.testing import CliRunner

    from wse_emu.apps.cli import main

    out = CliRunner().invoke(main, ["machines"])
    assert out.exit_code == 0
    lines = out.output.splitlines()
    assert any("NAMExN" in line for line in lines)
    [wse] = [line for line in lines if line.strip().startswith("wse3x4 ")]
    assert "4 wafers, links 150 GB/s each way, 2 us through a switch" in wse
    [gpu] = [line for line in lines if line.strip().startswith("h100x8 ")]
    assert "8 GPUs, links 450 GB/s each way, 1 us" in gpu
    # the presets' own lines are as before: unindented, first word a preset name
    names = [line.split()[0] for line in lines if line and not line[0].isspace()]
    assert sorted(names) == sorted(p.stem for p in PRESET_DIR.glob("*.toml"))

"""The built-in demo (the README's first command): the wafer's tokens beside the emulated
HBM baseline, both checked, so a wrong number cannot hide behind a nice tokens/s."""

import re

from wse_emu.apps.demo import run_demo


def test_the_demo_runs_the_wafer_and_the_hbm_baseline_and_checks_both(capsys):
    assert run_demo("wse3", tokens=3) == 0
    out = capsys.readouterr().out
    assert "(NumPy golden model: identical)" in out
    assert "baseline  h100, emulated" in out and "generated the same ids" in out
    wafer = float(re.search(r"= ([\d,]+) tokens/s on wse3", out).group(1).replace(",", ""))
    gpu = float(re.search(r"us/token = ([\d,]+) tokens/s; generated", out).group(1)
                .replace(",", ""))
    ratio = float(re.search(r"tokens/s = ([\d.]+)x h100", out).group(1))
    assert abs(ratio - wafer / gpu) < 0.01 * ratio + 0.01
    floor_us = float(re.search(r"TB/s = ([\d.]+) us/token", out).group(1))
    assert 1e6 / gpu >= floor_us  # the emulated GPU never beats its bandwidth floor

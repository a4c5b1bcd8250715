"""What the core's host-speed features buy: the helper thread, the prefetch hints and the
explicit-SIMD tile kernel (kernels/columns.py), each measured by turning it off.

Each variant runs bench/features.py in its own process (the prefetch and SIMD switches are read
when the kernels are compiled, so those processes get their own Numba cache and compile afresh:
the case takes several minutes). The default build runs first and last, and each case's
reference is the shorter of those two. A feature stays only where it buys at least 10 % on one of the cases
(bench/README.md records the figures): extra_info holds `<variant>_<case>` = the variant's time
over the default build's (above 1.10 = the feature pays there).

Run: .venv/bin/python -m pytest bench/test_keep_bench.py -o addopts=""
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.conftest import record

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"no_helper": ({}, ["--no-helper"]), "no_prefetch": ({"WSE_EMU_WITHOUT": "prefetch"}, []),
            "no_simd": ({"WSE_EMU_WITHOUT": "simd"}, [])}


def _measure(tmp_path: Path, name: str, env: dict, args: list[str]) -> dict:
    full = {k: v for k, v in os.environ.items() if k != "WSE_EMU_WITHOUT"} | env
    if "WSE_EMU_WITHOUT" in env:
        full["NUMBA_CACHE_DIR"] = str(tmp_path / f"numba-{name}")
    done = subprocess.run([sys.executable, "-m", "bench.features", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True)
    assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_what_the_features_buy(benchmark, tmp_path):
    first = benchmark.pedantic(_measure, args=(tmp_path, "default", {}, []), rounds=1,
                               iterations=1)
    variants = {name: _measure(tmp_path, name, env, args)
                for name, (env, args) in VARIANTS.items()}
    last = _measure(tmp_path, "default-again", {}, [])
    base = {case: min(first[case], last[case]) for case in first}
    figures = {f"default_{case}_seconds": s for case, s in base.items()}
    for name, times in variants.items():
        for case, seconds in times.items():
            assert seconds > 0
            figures[f"{name}_{case}"] = seconds / base[case]
    record(benchmark, **figures)
    for key, value in figures.items():
        print(f"{key:28} {value:.3f}")

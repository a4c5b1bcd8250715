"""Shared helpers of the benchmark cases (pytest-benchmark; run with -o addopts="")."""

from __future__ import annotations

import time


def best_of(fn, rounds: int = 5) -> float:
    """The shortest of `rounds` host times of fn(): the reference figure beside a benchmark."""
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)

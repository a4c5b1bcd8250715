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


def fastest(benchmark) -> float | None:
    """The benchmark's shortest round, or None when timing is off (--benchmark-disable runs
    each case once as a plain test: the checks still run, the ratios are not recorded)."""
    stats = getattr(benchmark, "stats", None)
    return stats.stats.min if stats is not None else None


def record(benchmark, **figures) -> None:
    """extra_info figures; a callable value gets the fastest time and is skipped without it."""
    seconds = fastest(benchmark)
    for key, value in figures.items():
        if callable(value):
            if seconds is None:
                continue
            value = value(seconds)
        benchmark.extra_info[key] = value

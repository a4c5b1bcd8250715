"""Without PyTorch and transformers (the `reference` extra) the suite still collects and the
tests that need them are skipped, never errors: checked in a subprocess in which importing them
fails as it does where they are not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PATHS = ["tests", "programs", "bench"]

WITHOUT_TORCH = """
import importlib.abc, sys


class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "transformers"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Absent())
try:
    import torch
except ModuleNotFoundError:
    pass
else:
    sys.exit("the blocker let torch be imported")
import pytest

sys.exit(pytest.main(sys.argv[1:]))
"""


def pytest_without_torch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, "-q", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, capture_output=True, text=True)


def test_the_suite_collects_without_torch():
    done = pytest_without_torch("--collect-only", *PATHS)
    summary = done.stdout.splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "collected" in summary and "error" not in summary, summary
    # the modules that need torch everywhere are skipped whole, and say why
    assert "SKIPPED [1] tests/graph/test_hf_numerics.py" in done.stdout


def test_tests_of_imported_models_are_skipped_without_torch():
    """tests/graph: the tests that ask for a random Hugging Face model skip, the others pass."""
    done = pytest_without_torch("tests/graph")
    summary = done.stdout.splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "passed" in summary and "skipped" in summary and "error" not in summary, summary


def test_compiler_tests_run_without_torch_against_the_golden_model():
    """tests/compiler: models written with NumPy, numbers from the NumPy golden model; only
    the comparisons with transformers itself skip."""
    done = pytest_without_torch("tests/compiler/test_compiler_encoder.py")
    summary = done.stdout.splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # the two golden-model prefills pass; BERT against transformers (fp32, bf16) skips
    assert summary.startswith("2 passed, 2 skipped"), summary

#!/usr/bin/env python3
"""Set up a local virtual environment (once) and run the demo or the test suite.

    python3 dev.py demo     # the main job
    python3 dev.py test     # the test suite (what .ci/run calls)

Idempotent: the venv in .venv is created on first use and re-installed only when
pyproject.toml changes. Needs nothing but Python 3.11+ and access to the package index.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")

EXTRAS = {"demo": "", "test": "[test,reference]"}


def ensure_env(extras: str) -> None:
    stamp = VENV / f".dev-stamp{extras}"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.is_file() and stamp.read_text() == want and PY.is_file():
        return
    if not PY.is_file():
        print("dev.py: creating .venv", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print(f"dev.py: installing wse-emu{extras} into .venv (first run takes a few minutes)",
          flush=True)
    for args in (["--upgrade", "pip"], ["-e", f".{extras}"]):
        # pip and setuptools chatter (index warnings, editable-install notes) is shown only
        # when the install fails
        done = subprocess.run([str(PY), "-m", "pip", "install", "--quiet", *args], cwd=ROOT,
                              capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            why = (f"killed by signal {-done.returncode}" if done.returncode < 0
                   else f"exit code {done.returncode}")
            sys.exit(f"dev.py: pip install {' '.join(args)} failed ({why}; pip's output above)")
    stamp.write_text(want)


def refresh_numba_cache() -> None:
    """Drop Numba's cached machine code compiled from sources that changed since: the check
    that the core runs when it is imported (emulator/jit_cache.py), run here too because tests
    of the kernels alone never import the core. Loaded by its path: no venv needed."""
    spec = importlib.util.spec_from_file_location("wse_emu_jit_cache",
                                                  ROOT / "emulator" / "jit_cache.py")
    jit_cache = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(jit_cache)
    jit_cache.drop_stale(jit_cache.in_tree_cache_dirs(ROOT), ROOT)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in EXTRAS:
        print(__doc__.strip())
        return 2
    job, rest = argv[0], argv[1:]
    ensure_env(EXTRAS[job])
    refresh_numba_cache()
    if job == "demo":
        cmd = [str(BIN / "wse-emu"), "demo", *rest]
    else:
        cmd = [str(PY), "-m", "pytest", "-q", "-p", "no:cacheprovider", *rest]
    return subprocess.run(cmd, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

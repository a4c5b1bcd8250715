"""Shared pieces of the `wse-emu` command-line tests.

Two ways to run a command, both returning an `Outcome` (exit code, stdout, stderr):
- `wse(...)` runs the real console script next to sys.executable in a subprocess: what a user
  types, with the real exit code, streams and interpreter start-up;
- `cli(...)` runs the same click command in-process (CliRunner): much faster, for sweeps. An
  exception that escapes the command lands in `stderr` as a traceback, so the same checks
  catch it.

Helpers are fixtures (this folder is not a package, so test files cannot import them).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from wse_emu.apps.cli import main

WSE_EMU = Path(sys.executable).parent / "wse-emu"
REPO = Path(__file__).resolve().parents[2]
GEMV_WSA = REPO / "programs" / "gemv" / "gemv.wsa"
# A cold Numba cache compiles the core on the first `run` (most of a minute on 2 cores).
SUBPROCESS_TIMEOUT = 600


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def wse():
    def run(*args, cwd) -> Outcome:
        p = subprocess.run([str(WSE_EMU), *map(str, args)], cwd=cwd, capture_output=True,
                           text=True, timeout=SUBPROCESS_TIMEOUT)
        return Outcome(p.returncode, p.stdout, p.stderr)

    return run


@pytest.fixture(scope="session")
def cli():
    def invoke(*args, cwd) -> Outcome:
        with contextlib.chdir(cwd):
            r = CliRunner().invoke(main, [str(a) for a in args])
        stderr = r.stderr
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            stderr += "Traceback (most recent call last):\n" + "".join(
                traceback.format_exception(r.exception))
        return Outcome(r.exit_code, r.stdout, stderr)

    return invoke


@pytest.fixture(scope="session")
def user_error():
    """Check the CLI's contract for a user error and return its one line."""

    def check(outcome: Outcome, *fragments: str) -> str:
        assert "Traceback" not in outcome.stderr + outcome.stdout, outcome.stderr
        assert outcome.code == 2, (outcome.code, outcome.stderr)
        lines = outcome.stderr.splitlines()
        assert len(lines) == 1, outcome.stderr
        assert lines[0].startswith("wse-emu: error: "), lines[0]
        for fragment in fragments:
            assert fragment in lines[0], (fragment, lines[0])
        return lines[0]

    return check


@pytest.fixture(scope="session")
def gemv_bar(tmp_path_factory, wse):
    """The issue's bar as a new user types it: random fp32 W (512 x 512) and x as .npy files,
    then `wse-emu asm programs/gemv/gemv.wsa ... --data W=W.npy -o g.bin`. Read-only: tests
    that damage or rewrite the binary copy it first."""
    root = tmp_path_factory.mktemp("bar")
    rng = np.random.default_rng(20240611)
    W = rng.standard_normal((512, 512), dtype=np.float32)
    x = rng.standard_normal(512, dtype=np.float32)
    np.save(root / "W.npy", W)
    np.save(root / "x.npy", x)
    asm = wse("asm", GEMV_WSA, "-D", "M=512", "-D", "K=512", "-D", "P=8", "-D", "Q=8",
              # the plain chain layout: x from row 0, y in the last column, chain reduce
              "-D", "XROW=0", "-D", "YCOL=7", "-D", "FORM=1",
              "--data", "W=W.npy", "-o", "g.bin", cwd=root)
    return {"root": root, "W": W, "x": x, "bin": root / "g.bin", "asm": asm}


@pytest.fixture(scope="session")
def small_gemv(tmp_path_factory, wse):
    """A 64 x 32 gemv on a 4 x 4 rectangle: cheap to run, trace and plot."""
    root = tmp_path_factory.mktemp("small")
    rng = np.random.default_rng(7)
    W = rng.standard_normal((64, 32), dtype=np.float32)
    x = rng.standard_normal(32, dtype=np.float32)
    np.save(root / "W.npy", W)
    np.save(root / "x.npy", x)
    asm = wse("asm", GEMV_WSA, "-D", "M=64", "-D", "K=32", "-D", "P=4", "-D", "Q=4",
              "--data", "W=W.npy", "-o", "small.bin", cwd=root)
    assert asm.code == 0, asm.stderr
    return {"root": root, "W": W, "x": x, "bin": root / "small.bin"}


@pytest.fixture(scope="session")
def gemv_wsa() -> Path:
    return GEMV_WSA


@pytest.fixture
def assemble(cli):
    """Write a .wsa into a folder and assemble it with the CLI; returns the program.bin path."""

    def build(folder: Path, name: str, source: str, *args) -> Path:
        (folder / f"{name}.wsa").write_text(source)
        out = cli("asm", f"{name}.wsa", "-o", f"{name}.bin", *args, cwd=folder)
        assert out.code == 0, out.stderr
        return folder / f"{name}.bin"

    return build

"""The README's shell block and the command blocks of the programs' READMEs run as written,
each line in order in a fresh folder beside the checkout's `programs/` (as from the checkout's
root), with the project's `wse-emu` and `python` first on PATH. Each line must exit 0 without a
traceback; then the results the READMEs claim are checked against NumPy."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STARTS = ("wse-emu ", "python -c ", "source ")


def command_blocks(markdown: str) -> list[list[str]]:
    """The fenced blocks whose every line is a command (not the ASCII pictures)."""
    blocks = re.findall(r"^```\n(.*?)^```", markdown, flags=re.S | re.M)
    out = []
    for block in blocks:
        lines = [line for line in block.splitlines() if line.strip()]
        if lines and all(line.startswith(STARTS) for line in lines):
            out.append(lines)
    return out


def run_lines(lines: list[str], folder: Path, skip=()) -> list[subprocess.CompletedProcess]:
    (folder / "programs").symlink_to(REPO / "programs")
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    done = []
    for line in lines:
        if line.startswith("source ") or line.startswith(skip):
            continue
        p = subprocess.run(["bash", "-c", line], cwd=folder, env=env, capture_output=True,
                           text=True, timeout=900)
        assert p.returncode == 0, f"{line}\n{p.stdout}\n{p.stderr}"
        assert "Traceback" not in p.stdout + p.stderr, f"{line}\n{p.stderr}"
        done.append(p)
    return done


def test_readme_shell_block_runs_as_written(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    text = (REPO / "README.md").read_text()
    using = text[text.index("## Using it"):]
    lines = command_blocks(using)[0]
    assert any(line.startswith("wse-emu generate") for line in lines)
    # bench compiles and runs four full-size models on two machines (minutes): its own tests
    # run it on small shapes
    done = run_lines(lines, tmp_path, skip=("wse-emu bench",))
    W, x = np.load(tmp_path / "W.npy"), np.load(tmp_path / "x.npy")
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), W @ x, rtol=1e-4,
                               atol=1e-3)
    assert (tmp_path / "dis" / "g.wsa").is_file() and (tmp_path / "g.png").is_file()
    generated = [next(ln for ln in p.stdout.splitlines()
                      if ln.startswith(("generated ids", "sequence 0"))) for line, p in
                 zip([l for l in lines if not l.startswith(("source ", "wse-emu bench"))],
                     done) if line.startswith("wse-emu generate m")]
    # the same model on the wafer, h100, two wafers, a node of two GPUs, and as a prefill
    # program: the same ids; with three sequences in flight, the first (the same prompt) gets
    # them too
    assert len(generated) == 6 and generated[0].startswith("generated ids")
    assert generated[1:4] + generated[5:] == [generated[0]] * 4
    assert generated[4].split()[2:] == generated[0].split()[2:]  # "sequence 0  <ids>"


PROGRAM_READMES = ["gemm", "softmax", "stress", "hbm_gemv"]


@pytest.mark.parametrize("name", PROGRAM_READMES)
def test_program_readme_runs_as_written(tmp_path, name):
    blocks = command_blocks((REPO / "programs" / name / "README.md").read_text())
    assert blocks, f"programs/{name}/README.md has no command block"
    run_lines([line for block in blocks for line in block], tmp_path)
    load = lambda f: np.load(tmp_path / f).astype(np.float64)  # noqa: E731
    if name == "gemm":
        np.testing.assert_allclose(load("out/C.npy"), load("A.npy") @ load("B.npy"),
                                   rtol=1e-4, atol=1e-3)
    elif name == "softmax":
        x = load("x.npy")
        e = np.exp(x - x.max())
        np.testing.assert_allclose(load("out/y.npy"), e / e.sum(), rtol=1e-4, atol=1e-7)
    elif name == "stress":
        assert (load("out/acc.npy") == 10.0).all()
    else:  # W is stored as bf16 in HBM: compare with bf16-rounded W
        W = np.load(tmp_path / "W.npy").view(np.uint32)
        Wb = ((W + 0x7FFF + ((W >> 16) & 1)) & 0xFFFF0000).view(np.float32).astype(np.float64)
        np.testing.assert_allclose(load("out/y.npy"), Wb @ load("x.npy"), rtol=1e-3, atol=1e-2)

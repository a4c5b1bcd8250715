"""The project installs under one import name, `wse_emu`, and shadows no other distribution's
packages: Hugging Face ships a top-level `kernels` (which `transformers` imports), and our
folders `isa/`, `emulator/`, `kernels/` sit at the checkout's top, where a Python started there
finds them first unless they are namespace portions (no __init__.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("isa", "emulator", "kernels")


def test_the_wheel_installs_only_the_wse_emu_namespace(tmp_path):
    # built with this environment's setuptools (no network): it must be one pyproject accepts
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    minimum = next(r.split(">=")[1] for r in requires if r.startswith("setuptools>="))
    pytest.importorskip("setuptools", minversion=minimum)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--quiet", "-w", str(tmp_path), str(REPO)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    wheel, = tmp_path.glob("wse_emu-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"wse_emu"}
    for folder in FOLDERS:
        assert f"wse_emu/{folder}/spec.py" in names or any(
            n.startswith(f"wse_emu/{folder}/") and n.endswith(".py") for n in names)
    assert "wse_emu/isa/machines/wse3.toml" in names
    # the applications: emulator/apps/ installs as wse_emu.apps, not inside the emulator
    assert "wse_emu/apps/cli.py" in names
    assert not any(n.startswith("wse_emu/emulator/apps/") for n in names)
    entry = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "wse-emu = wse_emu.apps.cli:main" in entry


@pytest.mark.parametrize("name", FOLDERS)
def test_the_checkout_root_does_not_shadow_a_package_of_the_same_name(tmp_path, name):
    """Another distribution's `kernels` (here a stand-in on PYTHONPATH) is what `import kernels`
    gets from the checkout's root, where the working directory comes first on sys.path."""
    other = tmp_path / name
    other.mkdir()
    (other / "__init__.py").write_text("WHO = 'the other distribution'\n")
    probe = subprocess.run([sys.executable, "-c", f"import {name}; print({name}.WHO)"],
                           cwd=REPO, env={"PYTHONPATH": str(tmp_path), "PATH": ""},
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "the other distribution"


def _imported_modules(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_no_module_imports_the_folders_by_their_bare_names():
    """Under pytest the checkout's root is on sys.path, so `import isa.spec` would still work
    here and fail only once installed: catch it in the source."""
    roots = [*FOLDERS, "tests", "programs", "bench"]
    offenders = []
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            for module in _imported_modules(path):
                if module.split(".")[0] in FOLDERS:
                    offenders.append(f"{path.relative_to(REPO)}: {module}")
    assert offenders == []

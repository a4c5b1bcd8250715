"""Numba's cache is dropped when a source compiled into it changes (emulator/jit_cache.py), by
the one check that both the core's import and dev.py run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from wse_emu.emulator import core, jit_cache

ROOT = Path(__file__).resolve().parents[2]


def fake_checkout(root: Path) -> Path:
    """The folders the check reads, with one cached function in each cache folder."""
    for name in ("kernels/access.py", "emulator/core_sched.py", "emulator/result.py",
                 "isa/spec.py", "isa/costs.py", "isa/asm.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")
    cache_files(root)
    return root


def cache_files(root: Path) -> list[Path]:
    files = []
    for folder in jit_cache.in_tree_cache_dirs(root):
        folder.mkdir(exist_ok=True)
        for suffix in ("nbi", "nbc"):
            files.append(folder / f"m.f-10.py311.{suffix}")
            files[-1].write_bytes(b"machine code")
        (folder / "m.cpython-311.pyc").write_bytes(b"bytecode")
    return files


def test_cache_is_dropped_exactly_when_a_jitted_source_changes(tmp_path):
    root = fake_checkout(tmp_path)
    dirs = jit_cache.in_tree_cache_dirs(root)
    first = jit_cache.drop_stale(dirs, root)  # no stamp yet: nothing is known to be fresh
    assert len(first) == 4 and all(not p.exists() for p in first)
    files = cache_files(root)
    assert jit_cache.drop_stale(dirs, root) == []
    (root / "isa" / "asm.py").write_text("# not compiled into the core\n")
    assert jit_cache.drop_stale(dirs, root) == []
    for edited in ("kernels/access.py", "isa/spec.py", "isa/costs.py", "emulator/result.py"):
        (root / edited).write_text("# edited\n")
        assert sorted(jit_cache.drop_stale(dirs, root)) == sorted(files)
        assert all((d / "m.cpython-311.pyc").is_file() for d in dirs)  # Python's own cache stays
        files = cache_files(root)
    (root / "kernels" / "new_kernel.py").write_text("# a new kernel module\n")
    assert sorted(jit_cache.drop_stale(dirs, root)) == sorted(files)


def test_dev_py_runs_the_same_check_with_the_standard_library_only(tmp_path):
    """dev.py runs outside the venv: -I -S leaves out site-packages, so Numba and NumPy."""
    root = fake_checkout(tmp_path)
    (root / "emulator" / "jit_cache.py").write_bytes((ROOT / "emulator" / "jit_cache.py").read_bytes())
    script = ("import importlib.util, sys\n"
              "spec = importlib.util.spec_from_file_location('dev', sys.argv[1])\n"
              "dev = importlib.util.module_from_spec(spec); spec.loader.exec_module(dev)\n"
              "dev.ROOT = dev.Path(sys.argv[2])\n"
              "dev.refresh_numba_cache()\n"
              "assert 'numpy' not in sys.modules and 'numba' not in sys.modules\n")
    run = [sys.executable, "-I", "-S", "-c", script, str(ROOT / "dev.py"), str(root)]
    subprocess.run(run, check=True)
    dirs = jit_cache.in_tree_cache_dirs(root)
    assert not [p for d in dirs for p in d.glob("*.nb[ic]")]
    assert all((d / jit_cache.STAMP).read_text() == jit_cache.sources_digest(root) for d in dirs)
    files = cache_files(root)
    subprocess.run(run, check=True)  # stamped: the cache stays
    assert all(p.is_file() for p in files)


def test_the_core_stamps_the_folders_numba_caches_it_in():
    """The core's import ran the check on the folders of its own and the kernels' caches."""
    dirs = jit_cache.numba_cache_dirs()
    cached_in = {Path(core.run_slice._cache._cache_path)}
    assert cached_in <= set(dirs) and len(dirs) >= 2  # the core's folder and the kernels'
    assert all((d / jit_cache.STAMP).read_text() == jit_cache.sources_digest() for d in dirs)


def test_the_measuring_switches_keep_their_machine_code_apart(tmp_path, monkeypatch):
    """WSE_EMU_WITHOUT (kernels/prefetch.py) and WSE_EMU_COUNT (core_state.COUNT_LOOP) change
    what the sources compile to, so each setting has its own digest and the default build's
    cache is not reused for a measuring one (nor the other way round)."""
    root = fake_checkout(tmp_path)
    monkeypatch.delenv("WSE_EMU_WITHOUT", raising=False)
    monkeypatch.delenv("WSE_EMU_COUNT", raising=False)
    plain = jit_cache.sources_digest(root)
    digests = {plain}
    for name, value in (("WSE_EMU_WITHOUT", "prefetch"), ("WSE_EMU_COUNT", "loop")):
        monkeypatch.setenv(name, value)
        digests.add(jit_cache.sources_digest(root))
    assert len(digests) == 3
    monkeypatch.delenv("WSE_EMU_WITHOUT")
    monkeypatch.delenv("WSE_EMU_COUNT")
    assert jit_cache.sources_digest(root) == plain

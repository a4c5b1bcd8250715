"""Numba's on-disk cache kept from going stale: the one check that the core runs when it is
imported and dev.py runs before the test suite.

Numba revalidates a cached function against its own source file only, yet the cached machine
code also holds the functions it calls and inlines from other modules (the kernels, the core's
sibling modules) and the constants it reads from isa/spec.py and emulator/result.py: after an
edit to any of those, Numba would still take the cache as valid and run the old code. So each
cache folder keeps a stamp, a digest of all those sources, and its cached functions are dropped
(and compiled afresh on next use) whenever the stamp differs from the sources' digest.

Standard library only, and no imports from this package: dev.py loads this file by its path,
with the system Python, outside the virtual environment.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

# The folder that holds isa/, emulator/ and kernels/: the checkout, or the installed wse_emu
ROOT = Path(__file__).resolve().parent.parent
STAMP = "wse-emu-sources.sha256"
CACHED = ("*.nbi", "*.nbc")  # Numba's index and machine code files


def jitted_sources(root: Path = ROOT) -> list[Path]:
    """Every source whose code or constants can end up in cached machine code."""
    return sorted({*root.glob("kernels/*.py"), *root.glob("emulator/core*.py"),
                   root / "emulator" / "result.py", root / "isa" / "spec.py",
                   root / "isa" / "costs.py"})


def sources_digest(root: Path = ROOT) -> str:
    digest = hashlib.sha256()
    # the measuring switches (kernels/prefetch.py, core_state.COUNT_LOOP) change the machine
    # code the sources compile to
    digest.update(os.environ.get("WSE_EMU_WITHOUT", "").encode() + b"\0")
    digest.update(os.environ.get("WSE_EMU_COUNT", "").encode() + b"\0")
    for path in jitted_sources(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def in_tree_cache_dirs(root: Path = ROOT) -> list[Path]:
    """Where Numba caches the jitted functions of a writable checkout (its default)."""
    return [root / "kernels" / "__pycache__", root / "emulator" / "__pycache__"]


def numba_cache_dirs(root: Path = ROOT) -> list[Path]:
    """The cache folders Numba uses for the jitted functions of the modules imported so far
    (the source folder's __pycache__, or a user-wide folder when that is read-only or
    NUMBA_CACHE_DIR is set); the in-tree folders when Numba does not say."""
    folders = set()
    for name, module in list(sys.modules.items()):
        if not name.startswith(("wse_emu.kernels.", "wse_emu.emulator.core")):
            continue
        for value in list(vars(module).values()):
            path = getattr(getattr(value, "_cache", None), "_cache_path", None)
            if isinstance(path, str):
                folders.add(Path(path))
    return sorted(folders) or in_tree_cache_dirs(root)


def drop_stale(cache_dirs, root: Path = ROOT) -> list[Path]:
    """Drop the cached functions in every folder of `cache_dirs` whose stamp is not the digest
    of root's jitted sources, and stamp the folder. Returns the files dropped. A folder that
    cannot be written (a read-only install) is left as it is: Numba does not cache there."""
    digest = sources_digest(root)
    dropped = []
    for folder in cache_dirs:
        stamp = Path(folder) / STAMP
        try:
            if stamp.is_file() and stamp.read_text() == digest:
                continue
            stamp.parent.mkdir(parents=True, exist_ok=True)
            for pattern in CACHED:
                for cached in sorted(stamp.parent.glob(pattern)):
                    cached.unlink(missing_ok=True)
                    dropped.append(cached)
            stamp.write_text(digest)
        except OSError:
            continue
    return dropped

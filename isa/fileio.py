"""Writing files the way a user expects: all or nothing, with the usual permissions, and errors
that name the path the user gave (not a temporary file)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_folder(path: str | os.PathLike) -> None:
    """FileNotFoundError naming `path` if the folder it would be written into does not exist."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`."""
    check_folder(path)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a plain open() would not
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

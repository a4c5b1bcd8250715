"""Reading the tensors a Program refers to: inline bytes or a tensor inside a safetensors file.

safetensors files are memory-mapped and parsed here directly (the header is JSON), because
NumPy has no bfloat16 and large models must not be read whole: a slice of a memmap reads only
the pages it touches.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from wse_emu.isa.program import Tensor

_ST_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "bf16", "I32": "<i4", "I64": "<i8", "F64": "<f8"}


class TensorError(Exception):
    """A tensor that cannot be read; one line naming it."""


def safetensors_index(path: Path) -> tuple[dict, int]:
    """(header dict, byte offset of the data area) of a safetensors file."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise TensorError(f"{path}: not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", head)
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise TensorError(f"{path}: no such safetensors file") from None
    except (json.JSONDecodeError, UnicodeDecodeError, MemoryError, OverflowError):
        raise TensorError(f"{path}: not a safetensors file (bad header)") from None
    return header, 8 + n


def read_safetensor(path: Path, key: str) -> tuple[np.ndarray, str]:
    """A memory-mapped tensor and its dtype tag ('<f4', '<f2', '<i4', or 'bf16' as uint16 bits)."""
    header, base = safetensors_index(path)
    if key not in header:
        raise TensorError(f"{path}: no tensor {key!r}")
    info = header[key]
    tag = _ST_DTYPES.get(info.get("dtype"))
    if tag is None:
        raise TensorError(f"{path}: tensor {key!r} has unsupported dtype {info.get('dtype')}")
    start, end = info["data_offsets"]
    np_dtype = np.uint16 if tag == "bf16" else np.dtype(tag)
    shape = tuple(info["shape"])
    count = int(np.prod(shape)) if shape else 1
    if end - start != count * np.dtype(np_dtype).itemsize:
        raise TensorError(f"{path}: tensor {key!r} has {end - start} bytes for shape {shape}")
    arr = np.memmap(path, dtype=np_dtype, mode="r", offset=base + start, shape=shape or (1,))
    return arr, tag


def tensor_array(t: Tensor, base_dir: str | Path | None = None) -> tuple[np.ndarray, str]:
    """The tensor's values in their source dtype, shaped `t.shape`, and the dtype tag."""
    if t.data is not None:
        np_dtype = np.uint16 if t.dtype == "bf16" else np.dtype(t.dtype)
        arr = np.frombuffer(t.data, dtype=np_dtype)
        want = int(np.prod(t.shape)) if t.shape else 1
        if arr.size != want:
            raise TensorError(f"tensor {t.name!r}: {arr.size} elements stored, shape {t.shape}")
        return arr.reshape(t.shape), t.dtype
    path = Path(t.file)
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    arr, tag = read_safetensor(path, t.key or t.name)
    if tuple(arr.shape) != tuple(t.shape) and arr.size == int(np.prod(t.shape)):
        arr = arr.reshape(t.shape)
    if tuple(arr.shape) != tuple(t.shape):
        raise TensorError(f"tensor {t.name!r}: {path} holds shape {tuple(arr.shape)}, "
                          f"program expects {tuple(t.shape)}")
    return arr, tag


def as_2d(arr: np.ndarray) -> np.ndarray:
    """The 2-D view tile maps use: (prod(shape[:-1]), shape[-1]); rank 1 -> (n, 1)."""
    if arr.ndim == 0:
        return arr.reshape(1, 1)
    if arr.ndim == 1:
        return arr.reshape(-1, 1)
    return arr.reshape(-1, arr.shape[-1])

"""Cycle costs of tensor ops (docs/timing-model.md sections 4 and 6).

`work` is the element count the op computes on: n for elementwise ops and reductions, M * K for
mv, M * K * N for mm. `width` is the machine's SIMD width for the op's class and dtypes (at
least 1, checked when the machine preset is loaded).
"""

import numpy as np
from numba import njit


@njit(cache=True)
def compute_cycles(work, width):
    """ceil(work / width) in integers (no float rounding at any size)."""
    w = np.int64(work)
    return (w + np.int64(width) - 1) // np.int64(width)


@njit(cache=True)
def tensor_cycles(work, width, overhead):
    """A tensor op without fabric operands: issue overhead + ceil(work / width)."""
    return np.int64(overhead) + compute_cycles(work, width)


@njit(cache=True)
def fabric_chunk_cycles(work, width, k):
    """Duration of a chunk of k elements of an op with fabric operands (overhead excluded):
    the SIMD time, but never faster than one wavelet per cycle."""
    return max(compute_cycles(work, width), np.int64(k))

"""Reductions over fp32 buffers, accumulated in fp32 in element order.

Each takes the accumulator to start from, so an op that runs in chunks (fabric inputs) continues
the same sequential reduction: rsum(a[:n], n, 0) == rsum(a[m:n], n-m, rsum(a[:m], m, 0)).
The order is part of the ISA semantics, so these loops are deliberately not reassociated (no
fastmath); they do not vectorise, and that is the price of bit-reproducible results.
"""

import numpy as np
from numba import njit

from wse_emu.kernels.scalar import fmax


@njit(cache=True)
def rsum(a, k, acc):
    """fp32(acc + a[0] + a[1] + ...), rounded after every addition."""
    total = np.float32(acc)
    for i in range(k):
        total = total + a[i]
    return total


@njit(cache=True)
def rmax(a, k, acc):
    """max(acc, a[0], ..., a[k-1]) like numpy.max: any NaN gives NaN; start from -inf."""
    best = np.float32(acc)
    for i in range(k):
        best = fmax(best, a[i])
    return best


@njit(cache=True)
def rdot(a, b, k, acc):
    """acc = fp32(acc + fp32(a[i] * b[i])) for i = 0 .. k-1 in order."""
    total = np.float32(acc)
    for i in range(k):
        total = total + a[i] * b[i]
    return total

"""Scalar fp32 functions shared by the scalar float instructions and the tensor kernels.

Transcendentals and division are evaluated in float64 and rounded once to fp32
(docs/timing-model.md section 3). Every argument is cast to fp32 on entry, so a Python float
from the reference interpreter gives the same bits as an fp32 register from the Numba core.
Kernels use error_model="numpy": division by zero gives inf/NaN as IEEE says, not an exception.
"""

import math

import numpy as np
from numba import njit


@njit(cache=True, error_model="numpy")
def fexp(a):
    return np.float32(math.exp(np.float64(np.float32(a))))


@njit(cache=True, error_model="numpy")
def frsqrt(a):
    return np.float32(1.0 / np.sqrt(np.float64(np.float32(a))))


@njit(cache=True, error_model="numpy")
def fsqrt(a):
    return np.float32(np.sqrt(np.float64(np.float32(a))))


@njit(cache=True, error_model="numpy")
def fdiv(a, b):
    # float64 has more than twice fp32's precision, so rounding its quotient to fp32 gives the
    # correctly rounded fp32 quotient.
    return np.float32(np.float64(np.float32(a)) / np.float64(np.float32(b)))


@njit(cache=True)
def fmax(a, b):
    """max like numpy.maximum: a NaN in either operand gives NaN; equal values (+0 and -0)
    give b, as numpy does."""
    x = np.float32(a)
    y = np.float32(b)
    return x if (x > y or x != x) else y


@njit(cache=True)
def fmin(a, b):
    """min like numpy.minimum: a NaN in either operand gives NaN; equal values give b."""
    x = np.float32(a)
    y = np.float32(b)
    return x if (x < y or x != x) else y

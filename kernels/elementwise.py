"""Elementwise tensor kernels over fp32 buffers (the emulator gathers operands into fp32 first).

Each op selects its loop once, outside the element loop, so every inner loop is tight and the
arithmetic ones vectorise. Arithmetic is fp32 with one rounding per operation: no fused
multiply-add (`fma_scalar` rounds the product, then the sum) and no fastmath. Transcendental
activations are evaluated in float64 and rounded to fp32 (docs/timing-model.md section 3).
`out` may be the same buffer as an input: element i depends only on element i.
"""

import math

import numpy as np
from numba import njit

from wse_emu.kernels.scalar import fexp, fmax, fmin, frsqrt

UN_MOV = 0
UN_EXP = 1
UN_GELU_TANH = 2
UN_GELU_ERF = 3
UN_SILU = 4
UN_RSQRT = 5
UN_TANH = 6

BIN_ADD = 0
BIN_SUB = 1
BIN_MUL = 2
BIN_MAX = 3
BIN_MIN = 4

# The kernel names of isa/spec.py's elementwise instructions (Instr.kernel: vexp -> "exp",
# vadd and vadds -> "add") -> the code `unary` or `binary`/`binary_scalar` selects them by.
UNARY_OPS = {"mov": UN_MOV, "exp": UN_EXP, "gelu": UN_GELU_TANH, "gelue": UN_GELU_ERF,
             "silu": UN_SILU, "rsqrt": UN_RSQRT, "tanh": UN_TANH}
BINARY_OPS = {"add": BIN_ADD, "sub": BIN_SUB, "mul": BIN_MUL, "max": BIN_MAX, "min": BIN_MIN}

# The GELUs are evaluated in float64 in forms equal to the documented formulas but free of
# their cancellation: for x << 0, 1 + tanh(u) and 1 + erf(v) lose every significant bit in
# float64, leaving results that are noise (and differ between libms). Since
# 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)) and 1 + erf(v) = erfc(-v), these are accurate over the
# whole range and nearly always the correctly rounded fp32 value.


@njit(cache=True, error_model="numpy")
def gelu_tanh(a):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in float64, rounded to fp32."""
    x = np.float64(np.float32(a))
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)  # sqrt(2 / pi) (x + 0.044715 x^3)
    return np.float32(x / (1.0 + math.exp(-2.0 * u)))


@njit(cache=True, error_model="numpy")
def gelu_erf(a):
    """0.5 x (1 + erf(x / sqrt 2)), in float64, rounded to fp32."""
    x = np.float64(np.float32(a))
    return np.float32(0.5 * x * math.erfc(-x * 0.7071067811865476))  # x / sqrt 2


@njit(cache=True, error_model="numpy")
def silu(a):
    """x / (1 + exp(-x)) in float64, rounded to fp32."""
    x = np.float64(np.float32(a))
    return np.float32(x / (1.0 + math.exp(-x)))


@njit(cache=True, error_model="numpy")
def unary(op, a, out, k):
    """out[i] = f(a[i]) for i < k, f chosen by an UN_* code."""
    if op == UN_MOV:
        for i in range(k):
            out[i] = a[i]
    elif op == UN_EXP:
        for i in range(k):
            out[i] = fexp(a[i])
    elif op == UN_GELU_TANH:
        for i in range(k):
            out[i] = gelu_tanh(a[i])
    elif op == UN_GELU_ERF:
        for i in range(k):
            out[i] = gelu_erf(a[i])
    elif op == UN_SILU:
        for i in range(k):
            out[i] = silu(a[i])
    elif op == UN_RSQRT:
        for i in range(k):
            out[i] = frsqrt(a[i])
    elif op == UN_TANH:
        for i in range(k):
            out[i] = np.float32(math.tanh(np.float64(a[i])))


@njit(cache=True)
def binary(op, a, b, out, k):
    """out[i] = a[i] op b[i] in fp32 for i < k, op a BIN_* code (max/min as numpy's)."""
    if op == BIN_ADD:
        for i in range(k):
            out[i] = a[i] + b[i]
    elif op == BIN_SUB:
        for i in range(k):
            out[i] = a[i] - b[i]
    elif op == BIN_MUL:
        for i in range(k):
            out[i] = a[i] * b[i]
    elif op == BIN_MAX:
        for i in range(k):
            out[i] = fmax(a[i], b[i])
    elif op == BIN_MIN:
        for i in range(k):
            out[i] = fmin(a[i], b[i])


@njit(cache=True)
def binary_scalar(op, a, s, out, k):
    """out[i] = a[i] op s in fp32 for i < k, op a BIN_* code."""
    v = np.float32(s)
    if op == BIN_ADD:
        for i in range(k):
            out[i] = a[i] + v
    elif op == BIN_SUB:
        for i in range(k):
            out[i] = a[i] - v
    elif op == BIN_MUL:
        for i in range(k):
            out[i] = a[i] * v
    elif op == BIN_MAX:
        for i in range(k):
            out[i] = fmax(a[i], v)
    elif op == BIN_MIN:
        for i in range(k):
            out[i] = fmin(a[i], v)


@njit(cache=True)
def fma_scalar(d, a, s, out, k):
    """out[i] = fp32(d[i] + fp32(a[i] * s)) for i < k: axpy with two roundings."""
    v = np.float32(s)
    for i in range(k):
        out[i] = d[i] + a[i] * v

"""Conversions between fp32 and the 16-bit storage types (IEEE fp16 and bf16).

Storage keeps 16-bit values as their uint16 bit patterns; the emulator computes in fp32. Reads
are exact, writes round to nearest, ties to even (docs/timing-model.md section 2). fp16 matches
`numpy.float16` bit for bit, NaN payloads included (numpy keeps the top payload bits and forces
a non-zero significand). bf16 is the upper half of binary32; NaNs stay NaN and become quiet.

The scalar functions are jitted so the Numba core and the pure-Python reference interpreter run
the same machine code. Bit manipulation is done in int64, or in uint32 cast back after every
step where vectorisation matters: Numba's promotion of mixed unsigned/signed integers is
surprising (uint64 with int64 gives float64).
"""

import numpy as np
from numba import njit

F32_EXP = 0x7F800000
F32_SIG = 0x007FFFFF
F16_EXP = 0x7C00
BF16_QUIET = 0x0040


@njit(cache=True)
def f32_bits(x):
    """The IEEE binary32 bits of x (rounded to fp32 first) as an int64 in 0..2**32-1."""
    return np.int64(np.float32(x).view(np.uint32))


@njit(cache=True)
def f32_from_bits(bits):
    """The fp32 whose IEEE binary32 bits are the low 32 bits of `bits`."""
    return np.uint32(np.int64(bits) & 0xFFFFFFFF).view(np.float32)


@njit(cache=True)
def f16_to_f32(h):
    """fp32 value of the fp16 bit pattern in the low 16 bits of h (exact; NaN payloads kept,
    as numpy does)."""
    # Column widening in kernels.matrix vectorises this. Every step is cast back to uint32
    # (Numba would widen it to int64 and halve the SIMD lanes), it selects instead of branching,
    # and it never touches an fp32 subnormal (slow on x86, and zero if some library set DAZ).
    U = np.uint32
    hb = U(h)
    shifted = U(U(hb & U(0x7FFF)) << U(13))
    exp = U(shifted & U(0x0F800000))
    normal = U(shifted + U(0x38000000))  # rebias the exponent by 127 - 15
    bits = U(normal + U(0x38000000)) if exp == U(0x0F800000) else normal  # inf/NaN: 31 -> 255
    # Subnormals and zero: give the significand the exponent of 2**-14, then subtract 2**-14
    # (exact: both are multiples of 2**-24 below 2**-13).
    sub = U(shifted + U(0x38800000)).view(np.float32) - np.float32(6.103515625e-05)
    bits = np.float32(sub).view(np.uint32) if exp == U(0) else bits
    return U(bits | U(U(hb & U(0x8000)) << U(16))).view(np.float32)


@njit(cache=True)
def f32_to_f16(x):
    """fp16 bit pattern (uint16) of fp32 x, rounded to nearest even; overflow gives inf."""
    bits = f32_bits(x)
    sign = (bits >> 16) & 0x8000
    exp = (bits >> 23) & 0xFF
    sig = bits & F32_SIG
    if exp == 0xFF:
        if sig == 0:
            return np.uint16(sign | F16_EXP)
        payload = sig >> 13
        return np.uint16(sign | F16_EXP | (payload if payload != 0 else 1))
    if exp >= 143:  # 2**16 and above: beyond the largest finite fp16 (65504) even after rounding
        return np.uint16(sign | F16_EXP)
    if exp >= 113:
        # Normal range: round the 23-bit significand to 10 bits; a carry out of the significand
        # correctly bumps the exponent (and reaches inf from 65520 upwards).
        mag = ((exp - 112) << 23) | sig
        mag = (mag + 0xFFF + ((mag >> 13) & 1)) >> 13
        return np.uint16(sign | mag)
    if exp < 102:  # below 2**-25: rounds to zero
        return np.uint16(sign)
    # Subnormal result: the full significand (with its implicit bit) shifted down to units of
    # 2**-24, rounded to nearest even on the bits shifted out.
    full = sig | 0x00800000
    shift = 126 - exp  # 14..24
    q = full >> shift
    rem = full - (q << shift)
    half = np.int64(1) << (shift - 1)
    if rem > half or (rem == half and (q & 1) == 1):
        q += 1
    return np.uint16(sign | q)


@njit(cache=True)
def bf16_to_f32(h):
    """fp32 value of the bf16 bit pattern in the low 16 bits of h (exact: bf16 is the upper
    half of binary32)."""
    U = np.uint32  # uint32 throughout, like f16_to_f32, so that widening loops vectorise
    return U(U(U(h) & U(0xFFFF)) << U(16)).view(np.float32)


@njit(cache=True)
def f32_to_bf16(x):
    """bf16 bit pattern (uint16) of fp32 x, rounded to nearest even; NaN stays NaN, quiet."""
    bits = f32_bits(x)
    if (bits & F32_EXP) == F32_EXP and (bits & F32_SIG) != 0:
        return np.uint16((bits >> 16) | BF16_QUIET)
    return np.uint16((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)


def f32_to_bf16_array(a: np.ndarray) -> np.ndarray:
    """Host-side bf16 rounding of an array (same bits as `f32_to_bf16`), as uint16 patterns."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    is_nan = ((bits & F32_EXP) == F32_EXP) & ((bits & F32_SIG) != 0)
    out = np.where(is_nan, (bits >> 16) | BF16_QUIET, rounded)
    return out.astype(np.uint16)


def bf16_to_f32_array(u16: np.ndarray) -> np.ndarray:
    """Host-side fp32 values of an array of bf16 bit patterns (exact)."""
    bits = np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32)

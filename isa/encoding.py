"""Instruction words <-> (Instr, operand values), derived from the table in isa/spec.py.

Operand values by kind: register numbers (ireg 0..21 with the specials 16..21, iregw 0..15,
freg/dreg 0..15), dtype codes (isa.spec.DTYPES), colors 0..255, integers for imm/u16/s16,
absolute instruction indices for `target`, and for `fimm` a float (or `FBits` for an exact bit
pattern) stored as IEEE-754 binary32 bits. Floats are converted with exact round-to-nearest-even
and NaN payloads survive, so encode(decode(w)) == w for every valid word.

Also the float <-> storage-bits helpers the assembler and disassembler share (`float_bits`,
`bits_float`, `float_text`), for f32, f16 and bf16.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from wse_emu.isa.errors import EncodingError
from wse_emu.isa.spec import (BY_MNEMONIC, BY_OPCODE, DTYPE_NAMES, DTYPES, KIND_SIGNED, N_DREGS,
                      N_FREGS, N_IREG_SLOTS, N_IREGS, OPCODE_BITS, SLOTS, SPECIAL_IREGS, Instr)

WORD_MASK = (1 << 64) - 1

# ---------------------------------------------------------------------------------------------
# Register names.

SPECIAL_NAMES = {num: name for name, num in SPECIAL_IREGS.items()}
REGISTERS: dict[str, tuple[str, int]] = {
    **{f"r{i}": ("i", i) for i in range(N_IREGS)},
    **{name: ("i", num) for name, num in SPECIAL_IREGS.items()},
    **{f"f{i}": ("f", i) for i in range(N_FREGS)},
    **{f"d{i}": ("d", i) for i in range(N_DREGS)},
}


def ireg_name(num: int) -> str:
    return SPECIAL_NAMES.get(num, f"r{num}")


# ---------------------------------------------------------------------------------------------
# Floats and their storage bits.

FLOAT_FORMATS = {"f32": (8, 23), "f16": (5, 10), "bf16": (8, 7)}  # (exponent bits, mantissa bits)


@dataclass(frozen=True)
class FBits:
    """A float operand given as its exact storage bits (assembly: `fbits(0x7fc00001)`)."""

    bits: int


def float_bits(x: float, fmt: str = "f32") -> int:
    """The storage bits of x in fmt, rounded to nearest even; ValueError if it overflows."""
    ebits, mbits = FLOAT_FORMATS[fmt]
    x = float(x)
    sign = 1 if math.copysign(1.0, x) < 0 else 0
    exp_all = (1 << ebits) - 1
    if math.isnan(x):
        # Keep the top mantissa bits of the double's payload; a payload that does not survive
        # the narrowing becomes the quiet bit, so the value stays a NaN.
        payload = (struct.unpack("<Q", struct.pack("<d", x))[0] & ((1 << 52) - 1)) >> (52 - mbits)
        return (sign << (ebits + mbits)) | (exp_all << mbits) | (payload or 1 << (mbits - 1))
    if math.isinf(x):
        return (sign << (ebits + mbits)) | (exp_all << mbits)
    if x == 0.0:
        return sign << (ebits + mbits)
    num, den = abs(x).as_integer_ratio()
    bias = (1 << (ebits - 1)) - 1
    emin = 1 - bias
    e = num.bit_length() - den.bit_length()  # floor(log2 |x|) is e or e - 1
    if (num << max(0, -e)) < (den << max(0, e)):
        e -= 1
    e = max(e, emin)
    shift = mbits - e
    n, d = (num << shift, den) if shift >= 0 else (num, den << -shift)
    q, r = divmod(n, d)
    if 2 * r > d or (2 * r == d and q & 1):
        q += 1
    if q >> (mbits + 1):
        q >>= 1
        e += 1
    if e > bias:
        raise ValueError(f"{x!r} is out of range for {fmt}")
    if q < (1 << mbits):
        exp_field = 0
    else:
        exp_field = e + bias
        q -= 1 << mbits
    return (sign << (ebits + mbits)) | (exp_field << mbits) | q


def bits_float(bits: int, fmt: str = "f32") -> float:
    """The value of storage bits in fmt, exactly (NaN payloads kept in the returned double)."""
    ebits, mbits = FLOAT_FORMATS[fmt]
    sign = (bits >> (ebits + mbits)) & 1
    exp_field = (bits >> mbits) & ((1 << ebits) - 1)
    mant = bits & ((1 << mbits) - 1)
    if exp_field == (1 << ebits) - 1:
        dbits = (sign << 63) | (0x7FF << 52) | (mant << (52 - mbits))
        return struct.unpack("<d", struct.pack("<Q", dbits))[0]
    bias = (1 << (ebits - 1)) - 1
    if exp_field == 0:
        value = math.ldexp(mant, 1 - bias - mbits)
    else:
        value = math.ldexp(mant | (1 << mbits), exp_field - bias - mbits)
    return -value if sign else value


def float_text(bits: int, fmt: str = "f32") -> str:
    """An assembly literal that the assembler turns back into exactly these bits."""
    value = bits_float(bits, fmt)
    if math.isnan(value):
        return "nan" if bits == float_bits(math.nan, fmt) else f"fbits({bits:#x})"
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    for digits in range(1, 18):
        text = f"{value:.{digits}g}"
        try:
            if float_bits(float(text), fmt) == bits:
                break
        except ValueError:  # a short decimal can round past the largest finite value
            continue
    if not any(ch in text for ch in ".en"):
        text += ".0"
    return text


def _fimm_bits(value) -> int:
    if isinstance(value, FBits):
        if not 0 <= value.bits < 1 << 32:
            raise ValueError(f"fbits({value.bits:#x}) does not fit 32 bits")
        return value.bits
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a float, got {value!r}")
    return float_bits(value, "f32")


# ---------------------------------------------------------------------------------------------
# Operands.

_KIND_TEXT = {
    "ireg": "an integer register (r0..r15, X, Y, W, H, GX, GY)",
    "iregw": "a writable integer register (r0..r15)",
    "freg": "a float register (f0..f15)",
    "dreg": "a descriptor register (d0..d15)",
    "dtype": f"a dtype ({', '.join(DTYPES)})",
    "color": "a color (0..255)",
    "imm": "a signed 32-bit integer",
    "u16": "an unsigned 16-bit integer (0..65535)",
    "s16": "a signed 16-bit integer (-32768..32767)",
    "target": "an instruction index (0..2147483647)",
    "fimm": "an fp32 value",
}
_KIND_RANGE = {
    "ireg": (0, N_IREG_SLOTS - 1), "iregw": (0, N_IREGS - 1), "freg": (0, N_FREGS - 1),
    "dreg": (0, N_DREGS - 1), "dtype": (0, len(DTYPES) - 1), "color": (0, 255),
    "imm": (-(1 << 31), (1 << 31) - 1), "u16": (0, 0xFFFF), "s16": (-(1 << 15), (1 << 15) - 1),
    "target": (0, (1 << 31) - 1),
}


def kind_text(kind: str) -> str:
    """What an operand of this kind must be, for error messages."""
    return _KIND_TEXT[kind]


def operand_field(ins: Instr, index: int, value) -> int:
    """The integer a slot holds for operand `index` of `ins`; EncodingError if illegal."""
    name, kind, _slot = ins.operands[index]
    where = f"{ins.mnemonic}: operand {name!r}"
    if kind == "fimm":
        try:
            bits = _fimm_bits(value)
        except ValueError as e:
            raise EncodingError(f"{where}: {e}") from None
        return bits - (1 << 32) if bits >> 31 else bits
    if isinstance(value, bool) or not isinstance(value, int):
        raise EncodingError(f"{where} must be {kind_text(kind)}, got {value!r}")
    if kind == "iregw" and value in SPECIAL_NAMES:
        raise EncodingError(f"{where} must be {kind_text(kind)}: "
                            f"{SPECIAL_NAMES[value]} is read-only")
    lo, hi = _KIND_RANGE[kind]
    if not lo <= value <= hi:
        raise EncodingError(f"{where} = {value} does not fit: must be {kind_text(kind)}")
    return value


def encode(mnemonic: str, values: dict[str, int | float]) -> int:
    """The 64-bit word of `mnemonic` with operand values by operand name (see module doc)."""
    ins = BY_MNEMONIC.get(mnemonic)
    if ins is None:
        raise EncodingError(f"unknown mnemonic {mnemonic!r}")
    names = [op[0] for op in ins.operands]
    if set(values) != set(names):
        raise EncodingError(f"{mnemonic}: operands are ({', '.join(names)}), "
                            f"got ({', '.join(values)})")
    word = ins.opcode
    for i, (name, _kind, slot_name) in enumerate(ins.operands):
        slot = SLOTS[slot_name]
        field = operand_field(ins, i, values[name])
        word |= (field & ((1 << slot.width) - 1)) << slot.lo
    return word


def decode(word: int) -> tuple[Instr, dict[str, int | float]]:
    """(Instr, operand values by name) of a word; EncodingError if it is not a valid word."""
    if isinstance(word, bool) or not isinstance(word, int) or not 0 <= word <= WORD_MASK:
        raise EncodingError(f"instruction word {word!r} is not a 64-bit unsigned integer")
    opcode = word & ((1 << len(OPCODE_BITS)) - 1)
    ins = BY_OPCODE.get(opcode)
    if ins is None:
        raise EncodingError(f"unknown opcode {opcode:#04x}")
    used = (1 << len(OPCODE_BITS)) - 1
    values: dict[str, int | float] = {}
    for i, (name, kind, slot_name) in enumerate(ins.operands):
        slot = SLOTS[slot_name]
        mask = (1 << slot.width) - 1
        field = (word >> slot.lo) & mask
        used |= mask << slot.lo
        if kind == "fimm":
            values[name] = bits_float(field, "f32")
            continue
        if KIND_SIGNED.get(kind, False) and field >> (slot.width - 1):
            field -= 1 << slot.width
        lo, hi = _KIND_RANGE[kind]
        if not lo <= field <= hi or (kind == "iregw" and field in SPECIAL_NAMES):
            raise EncodingError(f"{ins.mnemonic}: operand {name!r} = {field} is not "
                                f"{kind_text(kind)}")
        values[name] = field
    if word & ~used & WORD_MASK:
        raise EncodingError(f"{ins.mnemonic}: unused bits set ({word & ~used & WORD_MASK:#x})")
    return ins, values


def fimm_field_bits(word: int, ins: Instr) -> int:
    """The raw binary32 bits of the fimm operand of a word of `ins` (bit-exact, unlike floats)."""
    for _name, kind, slot_name in ins.operands:
        if kind == "fimm":
            slot = SLOTS[slot_name]
            return (word >> slot.lo) & ((1 << slot.width) - 1)
    raise ValueError(f"{ins.mnemonic} has no fimm operand")


def format_operand(kind: str, value, labels: dict[int, str] | None = None) -> str:
    if kind in ("ireg", "iregw"):
        return ireg_name(value)
    if kind == "freg":
        return f"f{value}"
    if kind == "dreg":
        return f"d{value}"
    if kind == "dtype":
        return DTYPE_NAMES[value]
    if kind == "target" and labels and value in labels:
        return labels[value]
    return str(value)


def format_instr(word: int, labels: dict[int, str] | None = None) -> str:
    """One line of assembly for a word; `labels` maps instruction index -> text for targets."""
    ins, values = decode(word)
    parts = []
    for name, kind, _slot in ins.operands:
        if kind == "fimm":
            parts.append(float_text(fimm_field_bits(word, ins), "f32"))
        else:
            parts.append(format_operand(kind, values[name], labels))
    return f"{ins.mnemonic} {', '.join(parts)}" if parts else ins.mnemonic


def decode_fields(words: Sequence[int]) -> dict[str, list[int]]:
    """Raw fields of every word, for the emulator's loader (it never decodes bits itself).

    op, a, b, c: bits 0-7, 8-15, 16-23, 24-31; imm: bits 32-63 sign-extended; il: bits 32-47
    unsigned; ih: bits 48-63, sign-extended when the instruction's IH operand is s16 (its kind
    decides, as for `decode`). Every word is validated first (EncodingError naming it).
    """
    fields: dict[str, list[int]] = {k: [] for k in ("op", "a", "b", "c", "imm", "il", "ih")}
    for i, word in enumerate(words):
        try:
            ins, _ = decode(word)
        except EncodingError as e:
            raise EncodingError(f"instruction {i}: {e}") from None
        ih_signed = any(slot == "IH" and kind == "s16" for _n, kind, slot in ins.operands)
        imm = word >> 32
        ih = word >> 48
        fields["op"].append(word & 0xFF)
        fields["a"].append((word >> 8) & 0xFF)
        fields["b"].append((word >> 16) & 0xFF)
        fields["c"].append((word >> 24) & 0xFF)
        fields["imm"].append(imm - (1 << 32) if imm >> 31 else imm)
        fields["il"].append(imm & 0xFFFF)
        fields["ih"].append(ih - (1 << 16) if ih_signed and ih >> 15 else ih)
    return fields

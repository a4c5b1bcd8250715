"""Instruction words: encode/decode round trips, the float conversions, and refused words."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wse_emu.isa.asm import assemble
from wse_emu.isa.builder import _bf16_bits
from wse_emu.isa.encoding import (FBits, bits_float, decode, decode_fields, encode, float_bits,
                          float_text, format_instr)
from wse_emu.isa.errors import EncodingError, FormatError
from wse_emu.isa.spec import BY_OPCODE, INSTRUCTIONS, N_IREG_SLOTS

KIND_VALUES = {
    "ireg": st.integers(0, N_IREG_SLOTS - 1),
    "iregw": st.integers(0, 15),
    "freg": st.integers(0, 15),
    "dreg": st.integers(0, 15),
    "dtype": st.integers(0, 2),
    "color": st.integers(0, 255),
    "imm": st.integers(-(1 << 31), (1 << 31) - 1),
    "u16": st.integers(0, 0xFFFF),
    "s16": st.integers(-(1 << 15), (1 << 15) - 1),
    "target": st.integers(0, (1 << 31) - 1),
    "fimm": st.builds(FBits, st.integers(0, (1 << 32) - 1)),
}


def _same(kind, given_value, decoded) -> bool:
    if kind == "fimm":
        return float_bits(decoded, "f32") == given_value.bits
    return decoded == given_value


@pytest.mark.parametrize("ins", INSTRUCTIONS, ids=lambda i: i.mnemonic)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_encode_decode_round_trip(ins, data):
    values = {name: data.draw(KIND_VALUES[kind], label=name) for name, kind, _ in ins.operands}
    word = encode(ins.mnemonic, values)
    assert 0 <= word < 1 << 64 and word & 0xFF == ins.opcode
    decoded_ins, decoded = decode(word)
    assert decoded_ins is ins
    assert all(_same(kind, values[name], decoded[name]) for name, kind, _ in ins.operands)
    assert encode(ins.mnemonic, decoded) == word


@pytest.mark.parametrize("ins", INSTRUCTIONS, ids=lambda i: i.mnemonic)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_format_instr_reassembles_to_the_same_word(ins, data):
    kinds = dict(KIND_VALUES, target=st.integers(0, 1))
    values = {name: data.draw(kinds[kind], label=name) for name, kind, _ in ins.operands}
    word = encode(ins.mnemonic, values)
    text = format_instr(word)
    program = assemble(f".region r, 0, 0, 1, 1\n    {text}\n    halt\n.endregion\n")
    assert program.regions[0].code[0] == word, text


def test_format_instr_uses_register_names_and_labels():
    word = encode("bne", {"a": 17, "b": 0, "t": 5})
    assert format_instr(word) == "bne Y, r0, 5"
    assert format_instr(word, {5: "loop"}) == "bne Y, r0, loop"
    assert format_instr(encode("dmem", {"d": 3, "t": 1, "addr": 640, "len": 32})) == \
        "dmem d3, f16, 640, 32"
    assert format_instr(encode("fli", {"d": 1, "v": 1.5})) == "fli f1, 1.5"
    assert format_instr(encode("halt", {})) == "halt"


def test_fimm_is_stored_as_binary32_bits():
    word = encode("fli", {"d": 0, "v": 1.5})
    assert word >> 32 == 0x3FC00000
    assert encode("fli", {"d": 0, "v": FBits(0x7F800001)}) >> 32 == 0x7F800001
    assert encode("fli", {"d": 0, "v": -0.0}) >> 32 == 0x80000000


@pytest.mark.parametrize("mnemonic, values, message", [
    ("add", {"d": 16, "a": 0, "b": 0}, "X is read-only"),
    ("add", {"d": 0, "a": 22, "b": 0}, "'a' = 22 does not fit"),
    ("li", {"d": 0, "v": 1 << 31}, "'v' = 2147483648 does not fit"),
    ("dmem", {"d": 0, "t": 3, "addr": 0, "len": 1}, "'t' = 3 does not fit"),
    ("dmem", {"d": 0, "t": 0, "addr": 65536, "len": 1}, "'addr' = 65536"),
    ("d2d", {"d": 0, "n": 1, "s": -32769}, "'s' = -32769"),
    ("jmp", {"t": -1}, "'t' = -1"),
    ("fli", {"d": 0, "v": 1e39}, "out of range for f32"),
    ("fli", {"d": 0, "v": "one"}, "expected a float"),
    ("add", {"d": 0, "a": 0}, "operands are"),
    ("frobnicate", {}, "unknown mnemonic"),
])
def test_encode_refuses_illegal_values(mnemonic, values, message):
    with pytest.raises(EncodingError, match=message):
        encode(mnemonic, values)


def test_decode_refuses_bad_words():
    unused = next(op for op in range(256) if op not in BY_OPCODE)
    with pytest.raises(EncodingError, match=f"unknown opcode {unused:#04x}"):
        decode(unused)
    halt = encode("halt", {})
    with pytest.raises(EncodingError, match="unused bits set"):
        decode(halt | 1 << 40)
    add = encode("add", {"d": 1, "a": 2, "b": 3})
    with pytest.raises(EncodingError, match="'b' = 22"):
        decode((add & ~(0xFF << 24)) | 22 << 24)
    with pytest.raises(EncodingError, match="'d' = 16"):
        decode((add & ~0xFF00) | 16 << 8)
    with pytest.raises(EncodingError, match="64-bit"):
        decode(1 << 64)
    assert issubclass(EncodingError, FormatError)


def test_decode_fields_matches_numpy_bit_extraction():
    rng = np.random.default_rng(7)
    ranges = {"ireg": (0, 22), "iregw": (0, 16), "freg": (0, 16), "dreg": (0, 16),
              "dtype": (0, 3), "color": (0, 256), "imm": (-(1 << 31), 1 << 31),
              "u16": (0, 1 << 16), "s16": (-(1 << 15), 1 << 15), "target": (0, 1 << 31)}
    words = []
    for _ in range(5):
        for ins in INSTRUCTIONS:
            values = {name: (float(rng.normal()) if kind == "fimm"
                             else int(rng.integers(*ranges[kind])))
                      for name, kind, _ in ins.operands}
            words.append(encode(ins.mnemonic, values))
    fields = decode_fields(words)
    arr = np.array(words, dtype=np.uint64)
    assert fields["op"] == (arr & 0xFF).astype(np.int64).tolist()
    assert fields["a"] == ((arr >> 8) & 0xFF).astype(np.int64).tolist()
    assert fields["b"] == ((arr >> 16) & 0xFF).astype(np.int64).tolist()
    assert fields["c"] == ((arr >> 24) & 0xFF).astype(np.int64).tolist()
    assert fields["imm"] == (arr >> 32).astype(np.uint32).view(np.int32).astype(np.int64).tolist()
    assert fields["il"] == ((arr >> 32) & 0xFFFF).astype(np.int64).tolist()
    ih_signed = (arr >> 48).astype(np.uint16).view(np.int16).astype(np.int64)
    ih_unsigned = (arr >> 48).astype(np.int64)
    # the IH slot is sign-extended only where the operand there is an s16 (d2d's stride)
    signed = np.array([any(k == "s16" for _n, k, slot in BY_OPCODE[int(w) & 0xFF].operands
                           if slot == "IH") for w in words])
    assert fields["ih"] == np.where(signed, ih_signed, ih_unsigned).tolist()
    assert min(fields["ih"]) < 0 and min(fields["imm"]) < 0  # sign extension was exercised
    dmem_len = [ih for w, ih in zip(words, fields["ih"]) if BY_OPCODE[w & 0xFF].mnemonic == "dmem"]
    assert max(dmem_len) >= 1 << 15  # a u16 length above 32767 stays positive
    unused = next(op for op in range(256) if op not in BY_OPCODE)
    with pytest.raises(EncodingError, match="instruction 1: unknown opcode"):
        decode_fields([words[0], unused])


# -- float conversions --------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=True))
def test_float_bits_rounds_like_numpy(x):
    for fmt, np_type, uint in (("f32", np.float32, np.uint32), ("f16", np.float16, np.uint16)):
        with np.errstate(over="ignore"):
            expected = np.array(x, dtype=np.float64).astype(np_type)
        if np.isinf(expected) and not math.isinf(x):
            with pytest.raises(ValueError, match="out of range"):
                float_bits(x, fmt)
        else:
            assert float_bits(x, fmt) == int(expected.view(uint)), (fmt, x)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, (1 << 32) - 1))
def test_bf16_matches_the_vectorised_conversion(bits32):
    x = np.array([bits32], dtype=np.uint32).view(np.float32)
    if np.isnan(x[0]):
        assert math.isnan(bits_float(float_bits(float(x[0]), "bf16"), "bf16"))
        return
    expected = int(_bf16_bits(x)[0])
    if expected & 0x7F80 == 0x7F80 and not np.isinf(x[0]):
        with pytest.raises(ValueError):
            float_bits(float(x[0]), "bf16")
    else:
        assert float_bits(float(x[0]), "bf16") == expected


@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_every_16_bit_pattern_round_trips(fmt):
    patterns = np.arange(1 << 16, dtype=np.uint32)
    with np.errstate(invalid="ignore"):
        if fmt == "f16":
            values = patterns.astype(np.uint16).view(np.float16).astype(np.float64)
        else:
            values = (patterns << 16).view(np.float32).astype(np.float64)
    for bits in range(1 << 16):
        v = bits_float(bits, fmt)
        assert float_bits(v, fmt) == bits
        assert (math.isnan(v) and math.isnan(values[bits])) or v == values[bits]


def test_hand_checked_values():
    assert float_bits(1.0, "bf16") == 0x3F80
    assert float_bits(1 + 2 ** -8, "bf16") == 0x3F80  # tie -> even
    assert float_bits(1 + 3 * 2 ** -8, "bf16") == 0x3F82  # tie -> even (up)
    assert float_bits(65504.0, "f16") == 0x7BFF
    assert float_bits(2 ** -24, "f16") == 0x0001  # smallest subnormal
    assert float_bits(-math.inf, "f32") == 0xFF800000
    assert float_bits(math.nan, "f32") == 0x7FC00000


@pytest.mark.parametrize("bits", [0x3FC00000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                                  0x7FC00001, 0xFF812345, 0x00000001, 0x3DCCCCCD, 0x7F7FFFFF])
def test_float_text_reads_back_to_the_same_bits(bits):
    text = float_text(bits, "f32")
    program = assemble(f".region r, 0, 0, 1, 1\n    fli f0, {text}\n    halt\n.endregion\n")
    assert program.regions[0].code[0] >> 32 == bits, text
    assert float_text(0x3DCCCCCD) == "0.1" and float_text(0x80000000) == "-0.0"

"""Every kind of assembly error names FILE:LINE:COL of the offending token, in one line."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wse_emu.isa.asm import assemble
from wse_emu.isa.errors import AsmError

R = ".region r, 0, 0, 1, 1\n"
E = "    halt\n.endregion\n"


def _error(src: str, **kwargs) -> str:
    with pytest.raises(AsmError) as info:
        assemble(src, "t.wsa", **kwargs)
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text
    return text


CASES = [
    # (source, expected "t.wsa:LINE:COL: message start")
    (R + "    vad d0, d1, d2\n" + E, "2:5: unknown mnemonic 'vad' (did you mean vadd"),
    (R + "    vadd d0, d1\n" + E, "2:5: vadd takes 3 operand(s) (d, a, b), got 2"),
    (R + "    halt 1\n" + E, "2:10: halt takes 0 operand(s)"),
    (R + "    vadd d0, r1, d2\n" + E,
     "2:14: vadd operand 'a' must be a descriptor register (d0..d15), got r1"),
    (R + "    add X, r1, r2\n" + E, "2:9: add operand 'd' must be a writable integer register"),
    (R + "    li r1, 1 << 31\n" + E, "2:12: li: operand 'v' = 2147483648 does not fit"),
    (R + "    li r1, 1.5\n" + E, "2:12: li operand 'v' must be an integer, got 1.5"),
    (R + "    dmem d0, f64, 0, 1\n" + E, "2:14: dmem operand 't' must be one of f32, f16, bf16"),
    (R + "    .alloc big, 70000\n    .alloc b, 4\n    dmem d0, f32, b, 1\n" + E,
     "4:19: dmem: operand 'addr' = 70016 does not fit"),
    (R + "    li r1, N + 1\n" + E, "2:12: undefined name 'N'"),
    (".param NN = 1\n" + R + "    li r1, N\n" + E, "3:12: undefined name 'N' (did you mean NN?)"),
    (R + "    li r1, r2 + 1\n" + E, "2:12: register r2 cannot be used in an expression"),
    (R + "    li r1, rx\n" + E, "2:12: rx and ry can only be used in row= and col="),
    (R + "    li r1, 4 / (2 - 2)\n" + E, "2:14: division by zero"),
    (R + "    li r1, 3 $ 4\n" + E, "2:14: unexpected character '$'"),
    (R + "    li r1, (3\n" + E, "2:14: expected ',' or ')'"),
    (".program \"open\n", "1:10: unterminated string"),
    (R + "    jmp nowhere\n" + E, "2:9: region 'r': unknown label 'nowhere'"),
    (R + "    jmp 5\n" + E, "2:5: region 'r' instruction 0: jmp target 5 is outside the code"),
    (R + "a:\na:\n" + E, "3:1: region 'r': duplicate label 'a'"),
    (".tensor W, [4, 4]\n" + R + E, "1:9: tensor 'W' has no data: pass --data W=FILE.npy"),
    (".tensor W, [2], file=\"nope.npy\"\n" + R + E, "1:17: cannot read tensor file 'nope.npy'"),
    (".param A = 1\n.param A = 2\n", "2:8: duplicate parameter 'A'"),
    (".param A = 1\n.set A = 2\n", "2:6: duplicate name 'A': already a parameter"),
    (".param r3 = 1\n", "1:8: 'r3' is reserved"),
    (R + "    .alloc a, 4\n    .alloc a, 4\n" + E, "3:12: duplicate name 'a': already an alloc"),
    (R + E + R + E, "4:1: region 'r': duplicate region name"),
    (".region a, 0, 0, 2, 2\n" + E + ".region b, 1, 1, 2, 2\n" + E,
     "4:1: region 'b' overlaps region 'a'"),
    (R + "    .alloc b, 4\n    .piece z, b, f32, tile=(1, 1)\n" + E,
     "3:5: region 'r': piece of undeclared symbol 'z'"),
    (".input x, f32, [4]\n" + R + E, "1:8: input 'x' has no pieces"),
    (".output y, f32, [8]\n.region r, 0, 0, 3, 1\n    .alloc b, 16\n"
     "    .piece y, b, f32, tile=(4, 1), row=rx\n" + E,
     "4:5: output 'y' piece 0: tiles of 4 x 1 with tile indices rows 0..2"),
    (".output y, f32, [8]\n" + R + "    .alloc b, 16\n    .piece y, b, f32, tile=(4, 1)\n" + E,
     "1:9: output 'y': element (4, 0) of its 8 x 1 view is in no piece"),
    (R + "    .alloc b, 16\n    .load Q, b, f32, tile=(1, 1)\n" + E,
     "3:5: data init 0 (tensor 'Q'): unknown tensor 'Q'"),
    (R + "    .alloc b, 16\n    .load Q, b, f32, tile=(1, 1), row=rx * rx\n" + E,
     "3:39: row= must be affine in rx and ry"),
    (R + "    .alloc b, 16\n    .init b, f32, 1, rect=(0, 0, 2, 2)\n" + E,
     "3:5: rect (0, 0, 2, 2) is not inside region 'r'"),
    (R + "    .init 0, f32, 1\n" + E, "2:5: data init 0 (inline): address 0 overlaps the code"),
    (R + "    .init 9, f32, 1e39\n" + E, "2:5: value 0 (1e+39) is out of range for f32"),
    (".param M = 5\n.assert M % 2 == 0, \"M must be even\"\n",
     "2:1: assertion failed: M must be even"),
    (".rep i = 0, 2\nnop\n", "1:1: .rep is never closed with .endrep"),
    (".endif\n", "1:1: .endif without .if"),
    (".if 1\n.else\n.else\n.endif\n", "3:1: .else after .else"),
    (".if 1\n.endrep\n", "2:1: .endrep without .rep (inside .if, which needs .endif)"),
    ("nop\n", "1:1: instruction 'nop' must be inside .region"),
    (R + ".route 0, 0, 1, 1, 0, rx=W, tx=E\n" + E, "2:1: .route is not allowed inside a .region"),
    (".parm A = 1\n", "1:1: unknown directive '.parm' (did you mean .param?)"),
    (".route 0, 0, 1, 1, 0, rx=W, tx=E, foo=1\n", "1:35: .route has no argument foo="),
    (".route 0, 0, 1, 1, 0, rx=W\n", "1:1: .route needs tx="),
    (".route 0, 0, 1, 1, 0, rx=Q, tx=E\n", "1:26: undefined name 'Q'"),
    (".route 0, 0, 0, 1, 0, rx=W, tx=E\n", "1:14: route w must be at least 1, got 0"),
    (".region r, 0, 0, 1, 1\n.region s, 1, 0, 1, 1\n", "2:1: .region inside a .region"),
    (".tensor W, 4\n", "1:12: a shape must be a list like [R, C]"),
    (".set X1 = 3 +\n", "1:14: expected a value"),
    (".meta k = {bad json}\n", "1:12: .meta value is not JSON"),
    (R + "    .alloc b, 8\n    .load W, b, f32, tile=(1, 2, 3)\n" + E,
     "3:27: tile must be a tuple of 2 integers"),
    (".if f32\n.endif\n", "1:5: dtype 'f32' is not a condition"),
    (R + "    beq r1, r2\n" + E, "2:5: beq takes 3 operand(s) (a, b, t), got 2"),
    (R + "    li r1,, 3\n" + E, "2:11: missing argument"),
    (R + "    jmp done_{q + 1}\n" + E, "2:15: undefined name 'q'"),
    (R + "    li r{1.5}, 0\n" + E, "2:10: {...} in a name must be an integer"),
    (".if A = 1\n.endif\n", "1:5: .if has no argument A= (to compare, use ==)"),
    (R + "x: .meta k = 1\n" + E, "2:4: expected .meta KEY = JSON-VALUE"),
]


@pytest.mark.parametrize("src, expected", CASES, ids=[c[1][:40] for c in CASES])
def test_error_location_and_message(src, expected):
    assert _error(src).startswith(f"t.wsa:{expected}")


def test_shape_mismatch_with_the_data():
    text = _error(".tensor W, [4, 4]\n" + R + E, data={"W": np.zeros((4, 3), np.float32)})
    assert text.startswith(
        "t.wsa:1:12: tensor 'W' is declared [4, 4] but its data has shape [4, 3]")


def test_unsupported_array_dtype():
    text = _error(".tensor W, [2]\n" + R + E, data={"W": np.zeros(2, np.complex64)})
    assert text.startswith("t.wsa:1:9: tensor 'W': arrays of complex64 cannot be stored")


def test_define_errors():
    src = ".param A = 1\n" + R + E
    assert _error(src, defines={"Z": "1"}).startswith("t.wsa:1:1: -D Z=1: no .param Z")
    assert _error(src, defines={"A": "foo"}).startswith("t.wsa:1:8: -D A=foo: undefined name 'foo'")
    assert _error(src, defines={"A": "1.5"}).startswith(
        "t.wsa:1:8: -D A=1.5: parameter 'A' must be an integer or a dtype name")
    assert _error(src, data={"Q": np.zeros(2)}).startswith("t.wsa:1:1: --data Q: no .tensor Q")


def test_assemble_file_missing(tmp_path):
    from wse_emu.isa.asm import assemble_file
    with pytest.raises(AsmError, match=r"nope\.wsa:1:1: cannot read: No such file"):
        assemble_file(str(tmp_path / "nope.wsa"))


_PIECES = [".region r, 0, 0, 2, 2", ".endregion", ".rep i = 0, 2", ".endrep", ".if 1", ".else",
           ".endif", ".param A = 1", ".set S = buf", ".alloc buf, 8", ".init buf, f16, 1, nan",
           ".piece y, buf, f32, tile=(1, 1), row=rx", ".tensor T, [2]", ".output y, f32, [2]",
           "lab_{i}:", "li r{i}, S", "vadd d0, d1", "jmp lab_1", "dmem d0, f32, buf, 99999",
           "fli f0, 1/0", "halt", ".route 0, 0, 1, 1, 0, rx=W, tx=E", "(", "]", '"', "{", "=",
           ".meta k = {", ".load T, buf, f32, tile=(1, 1)", "bne X, r0, 3", ".assert 0"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=3).map(" ".join),
                min_size=1, max_size=10))
def test_any_input_gives_a_program_or_one_asm_error(lines):
    try:
        assemble("\n".join(lines), "f.wsa", data={"T": np.zeros(2, np.float32)})
    except AsmError as e:
        assert str(e).startswith("f.wsa:") and "\n" not in str(e)

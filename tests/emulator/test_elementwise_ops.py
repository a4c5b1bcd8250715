"""Every elementwise instruction of the ISA table, end to end: a program assembled from text,
run on the Numba core and on the reference interpreter (same bits, same cycles), against NumPy.

`NUMPY` is the one place a new elementwise instruction needs a test (docs/contributing.md): the
cases below come from the table (isa.spec.Instr.shape), so an instruction without a NumPy model
here fails `test_every_elementwise_instruction_has_a_numpy_model`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.isa.asm import assemble
from wse_emu.isa.spec import BY_MNEMONIC, INSTRUCTIONS

ROOT = Path(__file__).resolve().parents[2]
ELEMENTWISE = [i.mnemonic for i in INSTRUCTIONS if i.shape is not None]
_erfc = np.vectorize(math.erfc, otypes=[np.float64])

# mnemonic -> NumPy model over float64 operands (a, b or the scalar s), rounded to fp32 once
NUMPY = {
    "vmov": lambda a: a,
    "vadd": np.add, "vsub": np.subtract, "vmul": np.multiply,
    "vmax": np.maximum, "vmin": np.minimum,
    "vadds": np.add, "vmuls": np.multiply,
    "vexp": np.exp,
    "vgelu": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
    "vgelue": lambda x: 0.5 * x * _erfc(-x / np.sqrt(2)),  # 1 + erf(v) = erfc(-v), exactly
    "vsilu": lambda x: x / (1 + np.exp(-x)),
    "vrsqrt": lambda x: 1 / np.sqrt(x),
    "vtanh": np.tanh,
}
# fp32 operations whose NumPy model is not one rounding of the exact value: computed in fp32
FP32_EXACT = {"vadd", "vsub", "vmul", "vmax", "vmin", "vadds", "vmuls", "vmov"}
N = 64
SCALAR = 1.5


def program_text(ins) -> str:
    """One PE: y = op(a[, b | s]) over N fp32 elements in SRAM."""
    call = {"unary": "d2, d0", "binary": "d2, d0, d1", "scalar": "d2, d0, f1"}[ins.shape]
    return f"""
.input a, f32, [{N}]
.input b, f32, [{N}]
.output y, f32, [{N}]
.region one, 0, 0, 1, 1
    .alloc abuf, {N} * 4
    .alloc bbuf, {N} * 4
    .alloc ybuf, {N} * 4
    .piece a, abuf, f32, tile=({N}, 1), row=0, col=0
    .piece b, bbuf, f32, tile=({N}, 1), row=0, col=0
    .piece y, ybuf, f32, tile=({N}, 1), row=0, col=0
    dmem d0, f32, abuf, {N}
    dmem d1, f32, bbuf, {N}
    dmem d2, f32, ybuf, {N}
    fli f1, {SCALAR}
    {ins.mnemonic} {call}
    halt
.endregion
"""


def operands(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.uniform(-6, 6, N).astype(np.float32)
    a[:6] = [0.0, -0.0, 1.0, -1.0, 1e-3, 30.0]
    b = rng.uniform(-6, 6, N).astype(np.float32)
    return a, b


def numpy_model(ins, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    fn = NUMPY[ins.mnemonic]
    args = {"unary": (a,), "binary": (a, b), "scalar": (a, np.float32(SCALAR))}[ins.shape]
    with np.errstate(all="ignore"):
        if ins.mnemonic in FP32_EXACT:
            return np.asarray(fn(*args), dtype=np.float32)
        return np.asarray(fn(*(np.float64(x) for x in args)), dtype=np.float64).astype(np.float32)


def test_every_elementwise_instruction_has_a_numpy_model():
    assert len(ELEMENTWISE) >= 14  # the table's shapes are recognised
    assert sorted(set(ELEMENTWISE) - set(NUMPY)) == []
    assert sorted(set(NUMPY) - set(ELEMENTWISE)) == []


@pytest.mark.parametrize("mnemonic", ELEMENTWISE)
def test_elementwise_instruction_end_to_end(mnemonic):
    ins = BY_MNEMONIC[mnemonic]
    program = assemble(program_text(ins), f"<{mnemonic}>")
    a, b = operands(seed=ins.opcode)
    runs = [execute(program, "wse3", inputs={"a": a, "b": b}, engine=engine)
            for engine in ("core", "reference")]
    core, ref = (r.outputs["y"].astype(np.float32) for r in runs)
    np.testing.assert_array_equal(core.view(np.uint32), ref.view(np.uint32))
    assert runs[0].result.cycles == runs[1].result.cycles > 0
    np.testing.assert_array_equal(core, numpy_model(ins, a, b))

# -- docs/contributing.md's worked example ----------------------------------------------------

CONTRIBUTING = ROOT / "docs" / "contributing.md"


def example_files() -> tuple[str, list[str]]:
    """The example's mnemonic and the files the document says it touches (its file list)."""
    text = CONTRIBUTING.read_text()
    op = re.search(r"<!-- example-op: (\w+) -->", text).group(1)
    listed = re.search(r"<!-- files -->\n(.*?)<!-- /files -->", text, re.S).group(1)
    return op, re.findall(r"^\d+\. `([^`]+)`", listed, re.M)


def test_contributing_example_op_is_in_the_table_and_tested():
    op, files = example_files()
    ins = BY_MNEMONIC[op]  # the example was really added
    assert ins.shape is not None and op in NUMPY


def test_contributing_example_touches_only_the_files_it_lists():
    op, files = example_files()
    assert 1 <= len(files) <= 4, files
    for name in files:  # each listed file has the op (or its kernel)
        text = (ROOT / name).read_text()
        assert op in text or BY_MNEMONIC[op].kernel in text, name
    mentions = {p.relative_to(ROOT).as_posix()
                for folder in ("isa", "emulator", "kernels", "tests", "docs", "programs")
                for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".wsa", ".toml")
                and re.search(rf"\b{op}\b", p.read_text())}
    # nothing outside the listed files (and this guide) needed to name the new instruction
    assert mentions - {"docs/contributing.md"} <= set(files), mentions


def test_contributing_example_code_is_the_code():
    """Every line of the guide's code blocks that names the op or its kernel is in a listed file."""
    op, files = example_files()
    kernel = BY_MNEMONIC[op].kernel
    code = "\n".join((ROOT / name).read_text() for name in files)
    blocks = re.findall(r"```python\n(.*?)```", CONTRIBUTING.read_text(), re.S)
    shown = [line.strip() for block in blocks for line in block.splitlines()
             if re.search(rf"{op}|{kernel}", line, re.I) and "..." not in line]
    assert len(shown) >= 4, shown
    for line in shown:
        assert line in code, line

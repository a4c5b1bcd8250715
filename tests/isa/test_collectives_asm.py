"""`.collective` / `.collect` in the assembler, and docs/assembly.md's first example."""

import re
from pathlib import Path

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.isa.asm import assemble
from wse_emu.isa.errors import AsmError

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_first_example_of_the_assembly_doc_runs():
    text = (DOCS / "assembly.md").read_text()
    source = re.search(r"```\n(; y = W x on a P x P grid.*?)```", text, re.S).group(1)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 512), dtype=np.float32)
    x = rng.standard_normal(512, dtype=np.float32)
    ex = execute(assemble(source, "example.wsa", {}, {"W": w}), "wse3", {"x": x})
    assert ex.result.outcome_name == "halted"
    np.testing.assert_allclose(ex.outputs["y"], w @ x, rtol=1e-4, atol=1e-4)


ROW = """.input v, f32, [6, 4]
.output s, f32, [6, 4]
{decl}
.region r, 0, 0, 6, 1
    .alloc a, 16
    .piece v, a, f32, tile=(1, 4), row=rx, col=0
    .piece s, a, f32, tile=(1, 4), row=rx, col=0
    .collect {name}, a, a
    halt
.endregion
"""


@pytest.mark.parametrize("form", ["chain", "two_phase", "tree", "fastest", "2"])
def test_a_row_allreduce(form):
    decl = f".collective ar, allreduce, 0, 0, 6, 1, axis=row, n=4, colors=(1, 2, 3, 4, 5), " \
           f"form={form}\n.assert ar_len == 6"
    v = np.random.default_rng(1).standard_normal((6, 4), dtype=np.float32)
    ex = execute(assemble(ROW.format(decl=decl, name="ar")), "test64", {"v": v})
    np.testing.assert_allclose(ex.outputs["s"], np.broadcast_to(v.sum(0), (6, 4)), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("decl,name,message", [
    (".collective ar, allreduce, 0, 0, 6, 1, axis=row, n=4, colors=(1, 2), form=two_phase",
     "ar", "needs 5 colors, got 2"),
    (".collective ar, sum, 0, 0, 6, 1, axis=row, n=4, colors=(1, 2, 3)", "ar",
     "kind must be one of broadcast, reduce, allreduce"),
    (".collective ar, reduce, 0, 0, 6, 1, axis=diagonal, n=4, colors=(1, 2, 3)", "ar",
     "axis must be 'row' or 'column'"),
    (".collective ar, reduce, 0, 0, 6, 1, axis=row, n=4, colors=(1, 2, 3), form=9", "ar",
     "form must be"),
    (".collective ar, reduce, 0, 0, 6, 1, axis=row, n=4, colors=(1, 2, 3), root=6", "ar",
     "root 6 is outside the line"),
    (".collective ar, reduce, 0, 0, 6, 1, axis=row, n=4, colors=(1, 2, 3)", "nope",
     "undefined collective 'nope'"),
    (".collective ar, reduce, 0, 0, 3, 1, axis=row, n=4, colors=(1, 2, 3)", "ar",
     "is not inside the collective's rectangle"),
])
def test_errors_name_the_line(decl, name, message):
    with pytest.raises(AsmError, match=message) as e:
        assemble(ROW.format(decl=decl, name=name), "row.wsa")
    assert str(e.value).startswith("row.wsa:")

"""stress: the dispatch-heavy benchmark program computes what its README says."""

import numpy as np

from wse_emu.emulator.api import execute
from programs.conftest import build, same_run


def test_result_and_instruction_count():
    w, h, loops = 6, 3, 7
    ex = execute(build("stress", NX=w, NY=h, L=loops), "tiny")
    assert ex.result.outcome_name == "halted"
    np.testing.assert_array_equal(ex.outputs["acc"], np.full((h * w, 8), 0.5 * loops, np.float32))
    # setup: 12 instructions (13 with the jmp of even columns), loop: 8 (interior), halt: 1
    per_pe = ex.result.instructions.reshape(h, w)
    assert per_pe[0, 1] == per_pe[0, 3]  # odd interior columns alike
    assert per_pe[0, 2] - per_pe[0, 1] == 1  # even columns take the extra jmp
    interior_loop = 8 * loops
    assert per_pe[0, 2] == 13 + interior_loop + 1


def test_core_equals_reference():
    a = execute(build("stress", NX=4, NY=2, L=5), "tiny", engine="core")
    b = execute(build("stress", NX=4, NY=2, L=5), "tiny", engine="reference")
    same_run(a, b)

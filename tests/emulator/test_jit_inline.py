"""emulator/jit_inline.py: Numba's inliner copies a callee's variables once an inlining, not once
a block, and what it compiles computes the same."""

import contextlib
import copy

from numba import njit
from numba.core import ir

from wse_emu.emulator import jit_inline


def _branchy(x, n):
    """Many blocks (each branch and loop one) and many variables."""
    acc = 0
    for i in range(n):
        a = x + i
        b = a * 3
        if b % 2 == 0:
            c = b // 2
        elif b % 3 == 0:
            c = b // 3
        else:
            c = b - 1
        d = c ^ a
        if d > 100:
            e = d - 100
        else:
            e = d + 7
        acc += e
    return acc


def _count_var_copies(fn, *args):
    """Compile fn (jitted, nothing cached) for args; returns its value and how many ir.Var
    objects were deep-copied while it compiled."""
    counted = [0]
    original = ir.Var.__deepcopy__

    def counting(self, memo):
        counted[0] += 1
        return original(self, memo)

    ir.Var.__deepcopy__ = counting
    try:
        value = fn(*args)
    finally:
        ir.Var.__deepcopy__ = original
    return value, counted[0]


def test_install_patches_this_numba():
    """The Numba this project pins has the internals the patch needs: if a new Numba moved
    them, this says so (compiling the core would take ~30 s longer, not fail)."""
    assert jit_inline.install()
    assert jit_inline.install()  # once only
    from numba.core import inline_closurecall as icc
    assert isinstance(icc.copy, jit_inline._SharedMemoCopy)
    assert icc.copy.memo is None  # no inlining under way


@contextlib.contextmanager
def _unpatched():
    """Numba's own inliner for a while."""
    from numba.core import inline_closurecall as icc

    shim, patched = icc.copy, icc.InlineWorker.inline_ir
    icc.copy, icc.InlineWorker.inline_ir = copy, patched.__wrapped__
    try:
        yield
    finally:
        icc.copy, icc.InlineWorker.inline_ir = shim, patched


def _three_sites():
    inlined = njit(inline="always")(_branchy)

    @njit
    def three_sites(x, n):
        return inlined(x, n) + 2 * inlined(x + 1, n) - inlined(x - 5, n + 1)
    return three_sites


def test_inlined_callee_computes_the_same_and_is_copied_once():
    jit_inline.install()
    from numba.core.compiler import run_frontend
    frontend = run_frontend(_branchy)
    n_vars = len(frontend.blocks[0].scope.localvars._con)
    n_blocks = len(frontend.blocks)
    assert n_blocks >= 8 and n_vars >= 20
    py = _branchy(3, 20) + 2 * _branchy(4, 20) - _branchy(-2, 21)

    value, copies = _count_var_copies(_three_sites(), 3, 20)
    assert value == py
    with _unpatched():
        value_numba, copies_numba = _count_var_copies(_three_sites(), 3, 20)
    assert value_numba == py
    # three inlinings, each copying the callee's variables twice (the copy spliced in and the
    # untouched one inline_ir returns); Numba's own copy does that again for every block
    assert copies <= 3 * 2 * n_vars + 50, (copies, n_vars)
    assert copies_numba > 3 * copies, (copies_numba, copies, n_blocks)

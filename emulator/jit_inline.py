"""A faster copy of inlined callees for Numba's `inline="always"` (the core's first compile).

The core's loop (core_sched.run_slice) inlines its executors and their helpers at Numba's IR
level, and Numba copies the callee's IR for every call site it inlines
(numba.core.inline_closurecall.InlineWorker.inline_ir, twice: the copy it splices in and an
untouched one it returns). Its copy deep-copies the callee's blocks one at a time, each with a
memo of its own, and every block refers to the function's scope, which holds all of its
variables: so every block copies all the variables again, a cost of blocks x variables. For
the core's larger executors that made Numba's inlining 42-54 s of run_slice's 95-108 s first
compile on our 2-core host (bench/README, "The core's first compile"). Numba's issue #8989
("Spurious deep copies in inlining", open) reports the same copies.

`install()` makes the copies inside one inline_ir share one memo, so that the scope and the
variables are copied once for all the blocks. The IR Numba then builds and types is the same:
the inliner renames the callee's variables into the caller's scope and re-points each spliced
block at the caller's scope, so whether the callee's blocks shared a copied scope or had one
each is not seen after inlining: run_slice's assembly with and without it differs only in the
random names of byte constants.
Where this Numba lacks the names patched (they are internals), nothing is patched and
compiling is only slower. Installed by the core's driver (emulator/core.py) before anything is
compiled; it changes no machine code, so it is not part of jit_cache's digest.
"""

from __future__ import annotations

import copy as _copy
import functools

_installed = False


class _SharedMemoCopy:
    """Stands in for the `copy` module inside numba.core.inline_closurecall: `deepcopy`
    without a memo uses the memo of the inline_ir call under way, if any."""

    def __init__(self):
        self.memo = None

    def __getattr__(self, name):
        return getattr(_copy, name)

    def deepcopy(self, x, memo=None):
        if memo is None:
            memo = self.memo
        return _copy.deepcopy(x, memo)


def install() -> bool:
    """Patch Numba's inliner once (see the module docstring); False where it cannot be."""
    global _installed
    if _installed:
        return True
    try:
        from numba.core import inline_closurecall as icc
    except ImportError:
        return False
    worker = getattr(icc, "InlineWorker", None)
    inline_ir = getattr(worker, "inline_ir", None)
    if getattr(icc, "copy", None) is not _copy or inline_ir is None:
        return False  # another Numba: leave it as it is
    shim = _SharedMemoCopy()

    @functools.wraps(inline_ir)
    def shared_memo_inline_ir(self, *args, **kwargs):
        outer, shim.memo = shim.memo, {}
        try:
            return inline_ir(self, *args, **kwargs)
        finally:
            shim.memo = outer

    icc.copy = shim
    worker.inline_ir = shared_memo_inline_ir
    _installed = True
    return True

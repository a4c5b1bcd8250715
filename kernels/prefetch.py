"""A software prefetch hint for jitted loops that stream memory the hardware does not foresee.

`prefetch(arr, i)` asks the CPU to start loading the cache line holding arr[i] (LLVM's
llvm.prefetch: read, data cache). It is only a hint: it never faults, changes no value and
no result, and compiles to nothing on a target without prefetch instructions; an index past the
end is harmless but wasted, so callers clamp it. Used where the emulator walks data the hardware
prefetcher picks up too late: the scheduler's next PE's rows of the per-PE tables (core_sched),
which a large mesh keeps in DRAM, and the lines the loop and the helper thread hand each other
(core_jobs), which sit in the other core's cache. `prefetch_span` covers a run of elements.
(The tile products' column loop, kernels.columns, emits the same intrinsic from its own IR.)
"""

import os

from llvmlite import binding as llvm
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


# The intrinsic's name carries its pointer type: opaque "p0" since LLVM 17 (typed pointers are
# gone), "p0i8" for the i8* of the LLVM 14-16 that older llvmlite releases build on.
INTRINSIC = "llvm.prefetch." + ("p0" if llvm.llvm_version_info[0] >= 17 else "p0i8")


# Features that bench/test_keep_bench.py turns off to measure what they buy, by naming them in
# WSE_EMU_WITHOUT (comma-separated: "prefetch" = no prefetch hints at all, "simd" = the tile
# products' column loop as a plain Numba loop instead of kernels.columns). Read once, at import;
# the value is part of emulator/jit_cache.py's digest, so machine code cached with other values
# is not reused. Results are the same bits and cycles either way: only host time changes.
WITHOUT = frozenset(f.strip() for f in os.environ.get("WSE_EMU_WITHOUT", "").split(",")
                    if f.strip())
PREFETCH = "prefetch" not in WITHOUT


def _make(locality, write=0):
    def codegen(context, builder, sig, args):
        if not PREFETCH:
            return context.get_dummy_value()
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        index = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = builder.gep(ary.data, [index])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, INTRINSIC)
        # read (0) or write (1), temporal locality 0..3, data cache (1)
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, write),
                          ir.Constant(i32, locality), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return codegen


def _typed(arr, index, codegen):
    if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
        return None
    return types.void(arr, index), codegen


@intrinsic
def prefetch(typingctx, arr, index):
    """Hint that the element at flat index `index` of C-contiguous `arr` (arr.ravel()[index],
    in range) will be read soon, and kept (all cache levels)."""
    return _typed(arr, index, _make(3))


@intrinsic
def prefetch_write(typingctx, arr, index):
    """As prefetch, for an element that will be written soon: the line is loaded ready to be
    modified (taken from another core's cache, where it would otherwise be moved on the
    store)."""
    return _typed(arr, index, _make(3, write=1))


@njit(cache=True, inline="always")
def prefetch_span(arr, first, count, write):
    """prefetch (or, with `write`, prefetch_write) every 64-byte line that holds the elements
    first .. first + count - 1 of C-contiguous `arr` (flat indices; the part outside arr is
    skipped)."""
    end = min(first + count, arr.size)
    i = max(first, 0)
    if i >= end:
        return
    step = max(1, 64 // arr.itemsize)
    while True:
        if write:
            prefetch_write(arr, i)
        else:
            prefetch(arr, i)
        if i >= end - 1:
            return
        i = min(i + step, end - 1)  # (the last element too: a span need not start a line)

"""The column update of the tile products, written as explicit SIMD in LLVM IR.

    axpy_f32(w, w_start, m, k, cstride, x, acc, acc_start)          # w: fp32 view of SRAM
    axpy_16(w, w_start, m, k, cstride, dtype, x, acc, acc_start)    # w: uint16 view

do `acc[acc_start + i] = fp32(acc[acc_start + i] + fp32(W[i, j] * x[j]))` for j = 0 .. k-1 in
order, W (m x k) column-major at element w_start of `w` (fp32, or the uint16 bits of fp16 or
bf16 elements) with column stride `cstride` elements: the semantics of docs/timing-model.md
section 3, bit for bit what a scalar loop gives (IEEE multiply, then add: no fused
multiply-add, no reassociation; only where two NaNs meet, which payload survives is the
hardware's choice, as in any compiled loop).

Why IR: the loop Numba compiles from Python keeps its accumulators in memory (it cannot tell
the accumulator array from the tile's), so it reloads and stores them for every few columns,
and each pass pays slice set-up and the vectoriser's run-time alias checks. Here a block of
64 rows keeps its accumulators in four 16-lane vector registers for all k columns: per column,
four vector loads of W, a broadcast of x[j], four multiplies and four adds. Measured against
the Numba loop it replaced (which folded eight columns into each pass over acc): 64 x 64 fp32
tiles 0.20-0.23 us instead of 0.31 us in cache, 4096 of them laid out as in the 4096 x 4096
gemv 3.2 ms instead of 4.2-4.4 ms from DRAM; bf16 4.4-4.6 ms instead of 5.9, fp16 5.0 instead
of 6.1-6.4. The rows left after the 64-row blocks (m % 64) take one more pass of as many
vectors as they need, the last one masked (llvm.masked.load / store: lanes past the tile are
neither read nor written), so any m costs ceil(m / 64) passes over the columns: tiles of 8,
12 or 24 rows run 1.5-2.3x faster than in the Numba loop too (96 rows, two passes: 0.9-1.1x).

16-bit storage is widened inside the loop with the same integer steps as
kernels.convert.f16_to_f32 / bf16_to_f32, on vectors (exact, NaN payloads kept).

Before each column the loop prefetches the lines AHEAD_BYTES further on (clamped to w): a hint
that changes nothing. For a contiguous tile that reaches past its end into whatever follows
it in SRAM, usually the tile of the PE that runs next. The tile, x and acc must lie within
their arrays (IndexError otherwise: the IR itself indexes without checks).
"""

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from wse_emu.kernels.access import DT_BF16, DT_F16, DT_F32
from wse_emu.kernels.prefetch import INTRINSIC as PREFETCH, PREFETCH as PREFETCH_ON

LANES = 16  # fp32 lanes of a 512-bit vector; LLVM splits them on narrower targets
BLOCK = 4  # vectors of accumulators per row block (64 rows)
LINE_FLOATS = 16  # a 64-byte cache line
# How far ahead the column loop prefetches, in bytes (as the Numba loop before it did, where
# 8 KB measured fastest for 64 x 64 fp32 tiles streamed from DRAM)
AHEAD_BYTES = 8192

_F32 = ir.FloatType()
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_I8P = ir.IntType(8).as_pointer()
_MASK = ir.VectorType(ir.IntType(1), LANES)
_OPAQUE = PREFETCH.endswith(".p0")  # LLVM 17 on: intrinsic names carry opaque pointers


def _splat(b, value, ty):
    """A vector of LANES copies of `value`."""
    vt = ir.VectorType(ty, LANES)
    v = b.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(_I32, 0))
    return b.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                            ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))


def _const(value, ty=_I32):
    return ir.Constant(ir.VectorType(ty, LANES), [value] * LANES)


def _masked(b, op, vec_ty, ptr, mask, value=None):
    """llvm.masked.load / store of `vec_ty` at ptr (lanes off in `mask` are not touched)."""
    elem = "f32" if vec_ty.element == _F32 else "i16"
    mangle = f"v{LANES}{elem}.p0" + ("" if _OPAQUE else f"v{LANES}{elem}")
    align = _I32(4 if vec_ty.element == _F32 else 2)
    ptr = b.bitcast(ptr, vec_ty.as_pointer())
    if op == "load":
        fnty = ir.FunctionType(vec_ty, [vec_ty.as_pointer(), _I32, _MASK, vec_ty])
        fn = cgutils.get_or_insert_function(b.module, fnty, f"llvm.masked.load.{mangle}")
        return b.call(fn, [ptr, align, mask, ir.Constant(vec_ty, None)])
    fnty = ir.FunctionType(ir.VoidType(), [vec_ty, vec_ty.as_pointer(), _I32, _MASK])
    fn = cgutils.get_or_insert_function(b.module, fnty, f"llvm.masked.store.{mangle}")
    return b.call(fn, [value, ptr, align, mask])


def _load_widened(b, ptr, dtype, mask):
    """LANES consecutive elements at ptr (fp32, or 16-bit bits) as an fp32 vector; with a
    mask, only its lanes are read (the others are 0)."""
    elem = _F32 if dtype == DT_F32 else _I16
    ty = ir.VectorType(elem, LANES)
    if mask is None:
        raw = b.load(b.bitcast(ptr, ty.as_pointer()), align=4 if dtype == DT_F32 else 2)
    else:
        raw = _masked(b, "load", ty, ptr, mask)
    if dtype == DT_F32:
        return raw
    u32 = ir.VectorType(_I32, LANES)
    f32 = ir.VectorType(_F32, LANES)
    h = b.zext(raw, u32)
    if dtype == DT_BF16:
        return b.bitcast(b.shl(h, _const(16)), f32)
    # kernels.convert.f16_to_f32, step for step
    shifted = b.shl(b.and_(h, _const(0x7FFF)), _const(13))
    exp = b.and_(shifted, _const(0x0F800000))
    normal = b.add(shifted, _const(0x38000000))
    special = b.icmp_unsigned("==", exp, _const(0x0F800000))
    bits = b.select(special, b.add(normal, _const(0x38000000)), normal)
    sub = b.fsub(b.bitcast(b.add(shifted, _const(0x38800000)), f32),
                 _const(6.103515625e-05, _F32))
    zero_exp = b.icmp_unsigned("==", exp, _const(0))
    bits = b.select(zero_exp, b.bitcast(sub, u32), bits)
    sign = b.shl(b.and_(h, _const(0x8000)), _const(16))
    return b.bitcast(b.or_(bits, sign), f32)


def _row_block(b, args, dtype, nvec, first, last_rows):
    """Rows first .. first + LANES * nvec - 1 (the last vector only its first `last_rows`, a
    runtime value, when that is not None): `nvec` accumulator vectors stay in registers
    across all k columns."""
    w, cs, k, x, y, limit, ahead = args
    acc_ty = ir.VectorType(_F32, LANES)
    slots = [cgutils.alloca_once(b, acc_ty) for _ in range(nvec)]  # registers after mem2reg
    masks = [None] * nvec
    if last_rows is not None:
        lane = ir.Constant(ir.VectorType(_I32, LANES), list(range(LANES)))
        limit_lanes = _splat(b, b.trunc(last_rows, _I32), _I32)
        masks[-1] = b.icmp_signed("<", lane, limit_lanes)
    fn = cgutils.get_or_insert_function(
        b.module, ir.FunctionType(ir.VoidType(), [_I8P, _I32, _I32, _I32]), PREFETCH)
    per_line = LINE_FLOATS if dtype == DT_F32 else 2 * LINE_FLOATS
    for q in range(nvec):
        b.store(_load_widened(b, b.gep(y, [b.add(first, _I64(q * LANES))]), DT_F32, masks[q]),
                slots[q])
    with cgutils.for_range(b, k) as col:
        xs = _splat(b, b.load(b.gep(x, [col.index])), _F32)
        at = b.add(b.mul(col.index, cs), first)  # element (first, j) of W
        for line in range(0, LANES * nvec if PREFETCH_ON else 0, per_line):
            i = b.add(b.add(at, ahead), _I64(line))
            i = b.select(b.icmp_signed("<", i, limit), i, limit)
            # read, locality 0 (non-temporal: a tile is read once, and should not push the
            # scheduler's per-PE rows out of the outer caches), data cache
            b.call(fn, [b.bitcast(b.gep(w, [i]), _I8P), _I32(0), _I32(0), _I32(1)])
        for q in range(nvec):
            v = _load_widened(b, b.gep(w, [b.add(at, _I64(q * LANES))]), dtype, masks[q])
            b.store(b.fadd(b.load(slots[q]), b.fmul(v, xs)), slots[q])
    for q in range(nvec):
        ptr = b.gep(y, [b.add(first, _I64(q * LANES))])
        if masks[q] is None:
            b.store(b.load(slots[q]), b.bitcast(ptr, acc_ty.as_pointer()), align=4)
        else:
            _masked(b, "store", acc_ty, ptr, masks[q], b.load(slots[q]))


def _define(module, dtype):
    """The IR function void(w*, cstride, m, k, x*, y*, limit, ahead) for `dtype`, defined once
    per module (w, y at their first elements; limit: the last element of w from w's pointer)."""
    name = f"wse_axpy_tile_{dtype}"
    if name in module.globals:
        return module.globals[name]
    elem = _F32 if dtype == DT_F32 else _I16
    fp = _F32.as_pointer()
    fnty = ir.FunctionType(ir.VoidType(), [elem.as_pointer(), _I64, _I64, _I64, fp, fp, _I64,
                                           _I64])
    fn = ir.Function(module, fnty, name)
    fn.linkage = "internal"
    w, cs, m, k, x, y, limit, ahead = fn.args
    args = (w, cs, k, x, y, limit, ahead)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    wide = LANES * BLOCK
    full = b.sdiv(m, _I64(wide))
    with cgutils.for_range(b, full) as block:  # blocks of 64 rows
        _row_block(b, args, dtype, BLOCK, b.mul(block.index, _I64(wide)), None)
    first = b.mul(full, _I64(wide))
    rest = b.sub(m, first)  # 0 .. 63 rows: one more pass, of as many vectors as they need
    nvec = b.sdiv(b.add(rest, _I64(LANES - 1)), _I64(LANES))
    done = fn.append_basic_block("done")
    switch = b.switch(nvec, done)
    for n in range(1, BLOCK + 1):
        case = fn.append_basic_block(f"tail{n}")
        switch.add_case(_I64(n), case)
        b.position_at_end(case)
        _row_block(b, args, dtype, n, first, b.sub(rest, _I64(LANES * (n - 1))))
        b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return fn


@intrinsic
def _axpy_ir(typingctx, w, w_start, m, k, cstride, x, acc, acc_start, dtype_const, ahead):
    if not isinstance(dtype_const, types.IntegerLiteral):
        return None
    dtype = dtype_const.literal_value
    if w.dtype != (types.float32 if dtype == DT_F32 else types.uint16):
        return None
    sig = types.void(w, w_start, m, k, cstride, x, acc, acc_start, dtype_const, ahead)

    def codegen(context, builder, sig, args):
        fn = _define(builder.module, dtype)
        wa = context.make_array(sig.args[0])(context, builder, args[0])
        xa = context.make_array(sig.args[5])(context, builder, args[5])
        ya = context.make_array(sig.args[6])(context, builder, args[6])

        def i64(i):
            return context.cast(builder, args[i], sig.args[i], types.int64)
        start = i64(1)
        wp = builder.gep(wa.data, [start])
        limit = builder.sub(builder.extract_value(wa.shape, 0), builder.add(start, _I64(1)))
        yp = builder.gep(ya.data, [i64(7)])
        builder.call(fn, [wp, i64(4), i64(2), i64(3), xa.data, yp, limit, i64(9)])
        return context.get_dummy_value()
    return sig, codegen


@njit(cache=True, inline="always")
def _ahead(m, cstride, size):
    """Elements from a column to the one AHEAD_BYTES later (linear for a contiguous tile)."""
    if cstride == m:
        return AHEAD_BYTES // size
    if cstride <= 0:
        return 0
    return max(1, AHEAD_BYTES // (size * max(m, 1))) * cstride


@njit(cache=True, inline="always")
def _check(w, w_start, m, k, cstride, x, acc, acc_start):
    """The IR indexes without checks: refuse a tile, x or acc outside its array (callers check
    first; this keeps a caller's mistake from reading or writing outside them)."""
    reach = (k - 1) * cstride
    if w_start + min(0, reach) < 0 or w_start + max(0, reach) + m > w.shape[0] or \
            k > x.shape[0] or acc_start < 0 or acc_start + m > acc.shape[0]:
        raise IndexError("tile product operand outside its array")


@njit(cache=True)
def axpy_f32(w, w_start, m, k, cstride, x, acc, acc_start):
    """acc[acc_start + i] += W[i, j] * x[j], j = 0 .. k-1 in order (module docstring), for a
    tile of fp32 elements of `w` (float32)."""
    if m <= 0 or k <= 0:
        return
    _check(w, w_start, m, k, cstride, x, acc, acc_start)
    _axpy_ir(w, w_start, m, k, cstride, x, acc, acc_start, DT_F32, _ahead(m, cstride, 4))


@njit(cache=True)
def axpy_16(w, w_start, m, k, cstride, dtype, x, acc, acc_start):
    """As axpy_f32 for a tile of fp16 (dtype DT_F16) or bf16 bits in `w` (uint16)."""
    if m <= 0 or k <= 0:
        return
    _check(w, w_start, m, k, cstride, x, acc, acc_start)
    if dtype == DT_F16:
        _axpy_ir(w, w_start, m, k, cstride, x, acc, acc_start, DT_F16, _ahead(m, cstride, 2))
    else:
        _axpy_ir(w, w_start, m, k, cstride, x, acc, acc_start, DT_BF16, _ahead(m, cstride, 2))

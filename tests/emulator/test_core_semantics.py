"""The Numba core's instruction semantics, checked against NumPy and plain Python.

Each test builds a one-PE program, runs it on the core and reads results back from SRAM; the
expected values come from NumPy (fp32 arithmetic, fp16 / bf16 rounding) or Python integers
(64-bit wrap-around), never from the emulator's own kernels.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.emulator.result import RUN_HALTED
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.kernels.convert import bf16_to_f32_array, f32_to_bf16_array

MASK = (1 << 64) - 1


def wrap(v: int) -> int:
    v &= MASK
    return v - (1 << 64) if v >> 63 else v


def stored(values, dtype: str) -> np.ndarray:
    """fp32 values as a dtype holds them, back in fp32."""
    v = np.asarray(values, dtype=np.float32)
    if dtype == "f16":
        with np.errstate(over="ignore"):  # overflow to inf is the rounding we want
            return v.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        return bf16_to_f32_array(f32_to_bf16_array(v))
    return v


class One:
    """A one-PE program under construction; `run` executes it and reads buffers back."""

    def __init__(self):
        self.pb = ProgramBuilder("one")
        self.rb = self.pb.region("pe", 0, 0, 1, 1)
        self.bufs: dict[str, tuple[str, int]] = {}

    def buf(self, name: str, dtype: str, values=None, n: int | None = None):
        n = len(values) if values is not None else n
        addr = self.rb.alloc(name, n * 4)
        if values is not None:
            self.rb.init(addr, dtype, [float(v) for v in values])
        self.bufs[name] = (dtype, n)
        return addr

    def run(self, engine: str = "core"):
        self.rb.halt()
        ex = execute(self.pb.build(), "tiny", engine=engine)
        assert ex.result.outcome == RUN_HALTED, ex.result.outcome_name
        self.ex = ex
        return self

    def read(self, name: str) -> np.ndarray:
        dtype, n = self.bufs[name]
        allocs = {a.name: a.addr for a in self.ex.loaded.program.regions[0].allocs}
        raw = self.ex.loaded.sram_view()[0, allocs[name]:allocs[name] + 4 * n]
        if dtype == "f32":
            return raw.view(np.float32)[:n].copy()
        bits = raw[:2 * n].view(np.uint16)
        return bf16_to_f32_array(bits) if dtype == "bf16" else bits.view(np.float16).astype(
            np.float32)

    def read_i64(self, name: str) -> list[int]:
        allocs = {a.name: a.addr for a in self.ex.loaded.program.regions[0].allocs}
        _, n = self.bufs[name]
        raw = self.ex.loaded.sram_view()[0, allocs[name]:allocs[name] + 4 * n]
        return [int(v) for v in raw.view(np.int64)]


def big(rb, reg: str, value: int) -> None:
    """Load any 64-bit value into an integer register with li / shli / or."""
    value &= MASK
    rb.li(reg, 0)
    for shift in (48, 32, 16, 0):
        rb.shli(reg, reg, 16)
        rb.li("r15", (value >> shift) & 0xFFFF)
        rb.or_(reg, reg, "r15")


def dump64(rb, reg: str, base_reg: str, offset: int) -> None:
    rb.sw(reg, base_reg, offset)
    rb.shri("r14", reg, 32)
    rb.sw("r14", base_reg, offset + 4)


EDGE = [0, 1, -1, 7, -7, 3, 1 << 62, (1 << 63) - 1, -(1 << 63), 123456789012345]


def _int_model(op: str, a: int, b: int) -> int:
    if op in ("div", "rem"):
        if b == 0:
            return 0
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        return wrap(q if op == "div" else a - b * q)
    return wrap({"add": a + b, "sub": a - b, "mul": a * b, "and": a & b, "or": a | b,
                 "xor": a ^ b, "slt": int(a < b)}[op])


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "rem", "and", "or", "xor", "slt"])
def test_integer_ops_wrap_and_round_toward_zero(op):
    pairs = [(a, b) for a in EDGE for b in EDGE[:7] + [-(1 << 63)]]
    one = One()
    out = one.buf("out", "f32", n=2 * len(pairs))
    one.rb.li("r9", out)
    for i, (a, b) in enumerate(pairs):
        big(one.rb, "r1", a)
        big(one.rb, "r2", b)
        one.rb.emit(op, "r3", "r1", "r2")
        dump64(one.rb, "r3", "r9", 8 * i)
    got = one.run().read_i64("out")
    assert got == [_int_model(op, a, b) for a, b in pairs]


@pytest.mark.parametrize("op", ["addi", "muli", "andi", "shli", "shri"])
def test_integer_immediates(op):
    cases = [(a, v) for a in EDGE for v in (0, 1, 5, -3, 63, 64, 70, -(1 << 31))]
    one = One()
    out = one.buf("out", "f32", n=2 * len(cases))
    one.rb.li("r9", out)
    for i, (a, v) in enumerate(cases):
        big(one.rb, "r1", a)
        one.rb.emit(op, "r3", "r1", v)
        dump64(one.rb, "r3", "r9", 8 * i)
    model = {"addi": lambda a, v: a + v, "muli": lambda a, v: a * v, "andi": lambda a, v: a & v,
             "shli": lambda a, v: a << (v & 63), "shri": lambda a, v: a >> (v & 63)}[op]
    assert one.run().read_i64("out") == [wrap(model(a, v)) for a, v in cases]


def test_branches_loads_stores_and_specials():
    one = One()
    out = one.buf("out", "f32", n=18)
    words = one.buf("words", "f32", n=2)
    rb = one.rb
    rb.li("r9", out)
    rb.li("r1", 0)
    for cond, a, b in (("beq", 3, 3), ("bne", 3, 3), ("blt", -2, 1), ("bge", -2, 1),
                       ("bge", 5, 5), ("blt", 5, 5)):
        rb.li("r2", a)
        rb.li("r3", b)
        rb.shli("r1", "r1", 1)
        label = f"t{rb.pc}"
        rb.emit(cond, "r2", "r3", label)
        rb.jmp(label + "n")
        rb.label(label)
        rb.addi("r1", "r1", 1)
        rb.label(label + "n")
    dump64(rb, "r1", "r9", 0)
    rb.li("r4", words)
    rb.li("r5", -5)
    rb.sw("r5", "r4", 0)  # low 32 bits of -5
    rb.lw("r6", "r4", 0)  # sign-extended back
    dump64(rb, "r6", "r9", 8)
    big(rb, "r7", 0x1234_5678_9ABC_DEF0)
    rb.sw("r7", "r4", 4)
    rb.lw("r8", "r4", 4)
    dump64(rb, "r8", "r9", 16)
    for i, special in enumerate(("X", "Y", "W", "H", "GX", "GY")):
        rb.mov("r10", special)
        dump64(rb, "r10", "r9", 24 + 8 * i)
    got = one.run().read_i64("out")
    taken = [1, 0, 1, 0, 1, 0]
    assert got[0] == int("".join(map(str, taken)), 2)
    assert got[1] == -5
    assert got[2] == wrap(0x9ABC_DEF0 - (1 << 32))
    assert got[3:9] == [0, 0, 1, 1, 0, 0]


F32_CASES = [1.5, -3.25, 0.0, -0.0, 1e-3, 7e4, np.inf, -np.inf, np.nan, 3.4e38, 1e-40]


@pytest.mark.parametrize("op", ["fadd", "fsub", "fmul", "fmax", "fmin", "fdiv"])
def test_float_binary_ops(op):
    pairs = [(a, b) for a in F32_CASES for b in F32_CASES]
    one = One()
    src = one.buf("src", "f32", [v for p in pairs for v in p])
    out = one.buf("out", "f32", n=len(pairs))
    rb = one.rb
    rb.li("r9", src)
    rb.li("r8", out)
    for i in range(len(pairs)):
        rb.flw("f1", "r9", 8 * i)
        rb.flw("f2", "r9", 8 * i + 4)
        rb.emit(op, "f3", "f1", "f2")
        rb.fsw("f3", "r8", 4 * i)
    a = np.array([p[0] for p in pairs], dtype=np.float32)
    b = np.array([p[1] for p in pairs], dtype=np.float32)
    with np.errstate(all="ignore"):
        want = {"fadd": a + b, "fsub": a - b, "fmul": a * b, "fmax": np.maximum(a, b),
                "fmin": np.minimum(a, b),
                "fdiv": (a.astype(np.float64) / b.astype(np.float64)).astype(np.float32)}[op]
    np.testing.assert_array_equal(one.run().read("out").view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("op", ["fmov", "fexp", "frsqrt", "fsqrt"])
def test_float_unary_ops(op):
    vals = [0.5, 2.0, 100.0, -1.0, 0.0, -0.0, np.inf, np.nan, 88.7, 1e-30]
    one = One()
    src = one.buf("src", "f32", vals)
    out = one.buf("out", "f32", n=len(vals))
    rb = one.rb
    rb.li("r9", src)
    rb.li("r8", out)
    for i in range(len(vals)):
        rb.flw("f1", "r9", 4 * i)
        rb.emit(op, "f2", "f1")
        rb.fsw("f2", "r8", 4 * i)
    x = np.array(vals, dtype=np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        want = {"fmov": x, "fexp": np.exp(x), "frsqrt": 1 / np.sqrt(x), "fsqrt": np.sqrt(x)}[op]
        want = want.astype(np.float32)
    np.testing.assert_array_equal(one.run().read("out"), want)


def test_int_float_conversions_and_fp32_immediates():
    floats = [2.75, -2.75, 1e30, -1e30, np.nan, np.inf, 9.2e18, -9.2e18]
    ints = [3, -3, (1 << 62) + 12345, -(1 << 63), 16777217]
    one = One()
    src = one.buf("src", "f32", floats)
    out = one.buf("out", "f32", n=2 * len(floats))
    fout = one.buf("fout", "f32", n=len(ints) + 1)
    rb = one.rb
    rb.li("r9", src)
    rb.li("r8", out)
    rb.li("r7", fout)
    for i in range(len(floats)):
        rb.flw("f1", "r9", 4 * i)
        rb.ftoi("r1", "f1")
        dump64(rb, "r1", "r8", 8 * i)
    for i, v in enumerate(ints):
        big(rb, "r1", v)
        rb.itof("f1", "r1")
        rb.fsw("f1", "r7", 4 * i)
    rb.fli("f4", -0.1)
    rb.fsw("f4", "r7", 4 * len(ints))
    one.run()
    want = [int(v) if math.isfinite(v) and abs(np.float32(v)) < 2.0 ** 63 else 0
            for v in np.array(floats, dtype=np.float32).astype(np.float64)]
    assert one.read_i64("out") == want
    np.testing.assert_array_equal(one.read("fout"),
                                  np.array(ints + [0], dtype=np.float64).astype(np.float32)
                                  + np.array([0] * len(ints) + [np.float32(-0.1)], np.float32))


DTYPES = ["f32", "f16", "bf16"]
VALS_A = [0.5, -1.25, 3.0, 1e-3, -7.5, 60000.0, 0.0, -2.0, 1.0009765625, 2.5e-8, 100.0, -0.0]
VALS_B = [2.0, 0.75, -3.0, 5.0, 1e3, 2.0, -0.0, 4.5, -1.0, 3.0, 0.1, 8.0]


def _vector_model(op, a, b, s, d):
    with np.errstate(all="ignore"):
        x = a.astype(np.float64)
        return {
            "vadd": a + b, "vsub": a - b, "vmul": a * b, "vmax": np.maximum(a, b),
            "vmin": np.minimum(a, b), "vmov": a, "vadds": a + s, "vmuls": a * s,
            "vfma": d + (a * s).astype(np.float32),
            "vexp": np.exp(x).astype(np.float32),
            "vrsqrt": (1 / np.sqrt(x)).astype(np.float32),
            "vsilu": (x / (1 + np.exp(-x))).astype(np.float32),
            # 0.5 x (1 + tanh u) written as x / (1 + exp(-2u)), free of cancellation for x << 0
            "vgelu": (x / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))))
            .astype(np.float32),
        }[op]


@pytest.mark.parametrize("dt_out,dt_a,dt_b", [("f32", "f32", "f32"), ("f16", "f16", "f16"),
                                              ("bf16", "bf16", "bf16"), ("f32", "f16", "bf16"),
                                              ("f16", "f32", "f16")])
@pytest.mark.parametrize("op", ["vadd", "vsub", "vmul", "vmax", "vmin", "vmov", "vadds",
                                "vmuls", "vfma", "vexp", "vrsqrt", "vsilu", "vgelu"])
def test_elementwise_ops_over_dtypes(op, dt_out, dt_a, dt_b):
    one = One()
    n = len(VALS_A)
    addr = {"a": one.buf("a", dt_a, VALS_A), "b": one.buf("b", dt_b, VALS_B),
            "d": one.buf("d", dt_out, [0.25 * i for i in range(n)])}
    rb = one.rb
    rb.fli("f1", 1.5)
    for reg, name in ((0, "a"), (1, "b"), (2, "d")):  # d2 is the destination
        rb.dmem(reg, one.bufs[name][0], addr[name], n)
    if op in ("vadd", "vsub", "vmul", "vmax", "vmin"):
        rb.emit(op, 2, 0, 1)
    elif op in ("vadds", "vmuls", "vfma"):
        rb.emit(op, 2, 0, "f1")
    else:
        rb.emit(op, 2, 0)
    got = one.run().read("d")
    a, b = stored(VALS_A, dt_a), stored(VALS_B, dt_b)
    d = stored([0.25 * i for i in range(n)], dt_out)
    want = stored(_vector_model(op, a, b, np.float32(1.5), d), dt_out)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_vfill_gelu_erf_and_strided_2d_operands():
    one = One()
    src = [float(v) for v in np.linspace(-4, 4, 24)]
    a = one.buf("a", "f32", src)
    dst = one.buf("dst", "f16", n=24)
    fill = one.buf("fill", "bf16", n=6)
    rb = one.rb
    # every other element of a, as 3 rows of 4 (row stride 8 elements) -> dst rows of 4
    rb.dmem(0, "f32", a, 4)
    rb.dstride(0, 2)
    rb.d2d(0, 3, 8)
    rb.dmem(1, "f16", dst, 4)
    rb.d2d(1, 3, 4)
    rb.vgelue(1, 0)
    rb.dmem(2, "bf16", fill, 6)
    rb.fli("f3", -2.71875)
    rb.vfill(2, "f3")
    one.run()
    picked = np.array(src, dtype=np.float64).reshape(3, 8)[:, 0:8:2].ravel()
    erf = np.vectorize(math.erf)
    want = stored((0.5 * picked * (1 + erf(picked / math.sqrt(2)))).astype(np.float32), "f16")
    np.testing.assert_array_equal(one.read("dst")[:12], want)
    np.testing.assert_array_equal(one.read("fill"), np.full(6, -2.71875, np.float32))


@pytest.mark.parametrize("dt", DTYPES)
def test_reductions_accumulate_in_element_order(dt):
    huge = 1e8 if dt != "f16" else 3e4  # big enough that the order of the sum shows
    vals = [huge, 1.0, -huge, 3.5, 2.25, -0.5, 7.0, 1e-3]
    other = [0.5, 2.0, 1.0, -1.0, 4.0, 8.0, 0.25, 1.0]
    one = One()
    a = one.buf("a", dt, vals)
    b = one.buf("b", "f32", other)
    out = one.buf("out", "f32", n=3)
    rb = one.rb
    rb.dmem(0, dt, a, len(vals))
    rb.dmem(1, "f32", b, len(vals))
    rb.rsum("f1", 0)
    rb.rmax("f2", 0)
    rb.rdot("f3", 0, 1)
    rb.li("r9", out)
    for i in range(3):
        rb.fsw(f"f{i + 1}", "r9", 4 * i)
    x, y = stored(vals, dt), np.array(other, np.float32)
    acc_sum, acc_dot = np.float32(0), np.float32(0)
    for i in range(len(vals)):
        acc_sum = np.float32(acc_sum + x[i])
        acc_dot = np.float32(acc_dot + np.float32(x[i] * y[i]))
    np.testing.assert_array_equal(one.run().read("out"), [acc_sum, x.max(), acc_dot])


def _mv_model(w, x, acc):
    acc = acc.astype(np.float32).copy()
    for j in range(w.shape[1]):
        acc = (acc + (w[:, j] * x[j]).astype(np.float32)).astype(np.float32)
    return acc


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_mv_and_mm_match_sequential_fp32(dt, accumulate):
    rng = np.random.default_rng(7)
    m, k, n = 10, 6, 3
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32)
    bm = rng.standard_normal((k, n)).astype(np.float32)
    y0 = rng.standard_normal(m).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    one = One()
    wa = one.buf("w", dt, w.ravel(order="F"))  # column-major tile
    xa = one.buf("x", "f32", x)
    ba = one.buf("bm", dt, bm.ravel(order="F"))
    ya = one.buf("y", "f32", y0)
    ca = one.buf("c", "f32", c0.ravel(order="F"))
    rb = one.rb
    rb.dmem(0, dt, wa, m)
    rb.d2d(0, k, m)
    rb.dmem(1, "f32", xa, k)
    rb.dmem(2, "f32", ya, m)
    rb.dmem(3, dt, ba, k)
    rb.d2d(3, n, k)
    rb.dmem(4, "f32", ca, m)
    rb.d2d(4, n, m)
    rb.emit("mva" if accumulate else "mv", 2, 0, 1)
    rb.emit("mma" if accumulate else "mm", 4, 0, 3)
    one.run()
    ws, bs = stored(w.ravel(), dt).reshape(m, k), stored(bm.ravel(), dt).reshape(k, n)
    np.testing.assert_array_equal(one.read("y"), _mv_model(ws, x, y0 if accumulate else 0 * y0))
    want_c = np.stack([_mv_model(ws, bs[:, j], c0[:, j] if accumulate else 0 * c0[:, j])
                       for j in range(n)], axis=1)
    np.testing.assert_array_equal(one.read("c").reshape(n, m).T, want_c)


def test_daddr_and_dlen_retarget_a_descriptor():
    one = One()
    src = one.buf("src", "f32", [float(i) for i in range(16)])
    dst = one.buf("dst", "f32", n=16)
    rb = one.rb
    rb.dmem(0, "f32", dst, 16)
    rb.fli("f1", -1.0)
    rb.vfill(0, "f1")
    rb.dmem(1, "f32", 0, 1)
    rb.li("r1", src)
    rb.daddr(1, "r1", 8)  # from element 2 of src
    rb.li("r2", 5)
    rb.dlen(1, "r2")
    rb.dlen(0, "r2")
    rb.vmov(0, 1)
    want = np.full(16, -1.0, np.float32)
    want[:5] = np.arange(2, 7)
    np.testing.assert_array_equal(one.run().read("dst"), want)

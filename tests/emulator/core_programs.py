"""Programs for the behaviour tests of the Numba core: each is sized to take the core off its
first-run sizes (more messages or payload in flight than its pools start with, a tensor op
longer than its scratch rows, more tile products than the helper's ring holds), so that a run
equal to the reference's shows the growth changed nothing."""

from __future__ import annotations

import numpy as np

from wse_emu.isa.builder import ProgramBuilder
from programs.conftest import build


class Run:  # what programs.conftest.same_run compares
    def __init__(self, loaded, result):
        self.loaded, self.result = loaded, result


def bursts(k: int = 6, n: int = 2):
    """The 8 x 8 machine 'tiny': PE (0,0) multicasts k messages of n wavelets to all 64 PEs on
    color 0 and every PE sends k to itself on color 1; each waits until all are queued, then
    adds them up. 2 k n wavelets per queue stay within 'tiny''s 14 (no backpressure), so
    k (64 + 1) messages and 2 k 64 deliveries are in flight at once."""
    pb = ProgramBuilder("bursts")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="E|S|RAMP")
    pb.route(1, 0, 6, 1, 0, rx="W", tx="E|S|RAMP")
    pb.route(7, 0, 1, 1, 0, rx="W", tx="S|RAMP")
    pb.route(0, 1, 8, 6, 0, rx="N", tx="S|RAMP")
    pb.route(0, 7, 8, 1, 0, rx="N", tx="RAMP")
    pb.route(0, 0, 8, 8, 1, rx="RAMP", tx="RAMP")
    rb = pb.region("all", 0, 0, 8, 8)
    src = rb.alloc("src", 4 * n)
    acc = rb.alloc("acc", 4 * n)
    rb.init(src, "f32", [0.5 + i for i in range(n)])
    rb.dmem(0, "f32", src, n)
    rb.dmem(1, "f32", acc, n)
    rb.dfout(2, "f32", 1, n)
    rb.dfout(3, "f32", 0, n)
    rb.dfin(4, "f32", 1, n)
    rb.dfin(5, "f32", 0, n)
    rb.fli("f1", 0.25)
    rb.li("r1", k)
    rb.label("send")
    rb.vadds(0, 0, "f1")  # every message differs
    rb.vmov(2, 0)
    rb.bne("X", "r0", "next")
    rb.bne("Y", "r0", "next")
    rb.vmov(3, 0)
    rb.label("next")
    rb.addi("r2", "r2", 1)
    rb.blt("r2", "r1", "send")
    rb.li("r3", 300)
    rb.label("spin")
    rb.addi("r3", "r3", -1)
    rb.bne("r3", "r0", "spin")
    rb.li("r2", 0)
    rb.label("recv")
    rb.vadd(1, 1, 4)
    rb.vadd(1, 1, 5)
    rb.addi("r2", "r2", 1)
    rb.blt("r2", "r1", "recv")
    rb.halt()
    return pb.build()


def big_messages(senders: int, rounds: int, n: int = 10000):
    """`senders` PEs in row 0 each send `rounds` messages of n fp32 wavelets south, one color
    each; receiver x starts reading only after 500 + 3000 x cycles, so the senders block on
    backpressure with their whole messages held, and the first receivers free theirs while
    the others still hold."""
    pb = ProgramBuilder("big")
    for x in range(senders):
        pb.route(x, 0, 1, 1, x, rx="RAMP", tx="S")
        pb.route(x, 1, 1, 1, x, rx="N", tx="RAMP")

    def by_column(rb, make):
        for x in range(1, senders):
            rb.li("r5", x)
            rb.beq("X", "r5", f"c{x}")
        for x in range(senders):
            if x:
                rb.label(f"c{x}")
            make(x)
            rb.jmp("go")
        rb.label("go")

    tx = pb.region("tx", 0, 0, senders, 1)
    buf = tx.alloc("buf", 4 * n)
    tx.dmem(0, "f32", buf, n)
    tx.mov("r4", "X")
    tx.itof("f1", "r4")
    tx.vfill(0, "f1")
    tx.fli("f2", 0.5)
    tx.li("r1", rounds)
    by_column(tx, lambda x: tx.dfout(1, "f32", x, n))
    tx.label("send")
    tx.vadds(0, 0, "f2")
    tx.vmov(1, 0)
    tx.addi("r2", "r2", 1)
    tx.blt("r2", "r1", "send")
    tx.halt()
    rx = pb.region("rx", 0, 1, senders, 1)
    acc = rx.alloc("acc", 4 * n)
    rx.dmem(0, "f32", acc, n)
    rx.li("r1", rounds)
    by_column(rx, lambda x: (rx.dfin(1, "f32", x, n), rx.li("r3", 500 + 3000 * x)))
    rx.label("spin")
    rx.addi("r3", "r3", -1)
    rx.bne("r3", "r0", "spin")
    rx.label("recv")
    rx.vadd(0, 0, 1)
    rx.addi("r2", "r2", 1)
    rx.blt("r2", "r1", "recv")
    rx.halt()
    return pb.build()


def repeated_columns(m: int = 1000, k: int = 120, products: int = 3):
    """One PE: y = W x, where W (m x k) repeats the column w (a stride-0 outer dimension: m k
    elements from m words of SRAM), then s[i] = the sum over the same m k elements; x halves
    after each product. m k is far more elements than the PE's SRAM holds, so far more than
    a run's scratch rows start with."""
    pb = ProgramBuilder("repeated")
    pb.output("y", "f32", [m])
    pb.output("s", "f32", [products])
    rb = pb.region("pe", 0, 0, 1, 1)
    w = rb.alloc("w", 4 * m)
    x = rb.alloc("x", 4 * k)
    y = rb.alloc("y", 4 * m)
    s = rb.alloc("s", 4 * products)
    rb.piece("y", y, "f32", (m, 1))
    rb.piece("s", s, "f32", (products, 1))
    rb.init(w, "f32", list(repeated_columns_w(m)))
    rb.init(x, "f32", list(repeated_columns_x(k)))
    rb.dmem(0, "f32", w, m)
    rb.d2d(0, k, 0)
    rb.dmem(1, "f32", x, k)
    rb.dmem(2, "f32", y, m)
    rb.dmem(3, "f32", w, m)
    rb.d2d(3, k, 0)
    rb.li("r8", s)
    rb.fli("f2", 0.5)
    rb.li("r1", products)
    rb.label("again")
    rb.mv(2, 0, 1)
    rb.rsum("f3", 3)
    rb.fsw("f3", "r8", 0)
    rb.addi("r8", "r8", 4)
    rb.vmuls(1, 1, "f2")
    rb.addi("r2", "r2", 1)
    rb.blt("r2", "r1", "again")
    rb.halt()
    return pb.build()


def repeated_columns_w(m: int) -> np.ndarray:
    return np.array([((i * 37) % 11 - 5) * 0.125 for i in range(m)], np.float32)


def repeated_columns_x(k: int) -> np.ndarray:
    return np.array([((i * 13) % 7 - 3) * 0.25 for i in range(k)], np.float32)


def gemv_program(m: int, k: int, p: int, q: int, seed: int = 1234):
    """(program, W, x) of programs/gemv with random fp32 data."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k), dtype=np.float32)
    x = rng.standard_normal(k, dtype=np.float32)
    return build("gemv", {"W": w}, M=m, K=k, P=p, Q=q), w, x


MANY_W = np.array([[(3 * i + 5 * j) % 7 - 3 for j in range(4)] for i in range(4)], np.float32)
MANY_X = np.array([2, -1, 0, 1], np.float32)
MANY_BIG_W = np.array([(i % 5) - 2 for i in range(400)], np.float32)
MANY_BIG_X = np.array([(i % 3) - 1 for i in range(100)], np.float32)


def many_products(iterations: int = 1100, big_every: int = 100):
    """A 2 x 2 region; each PE, `iterations` times: y += W x (a 4 x 4 tile) and at once
    acc += y[0]; every `big_every`-th time also z = Z xb with Z 400 x 100 repeating one
    column (more elements than the SRAM holds) and at once big += z[0]. x is MANY_X + GX.
    Integer values small enough that every sum is exact in fp32: numpy gives the bits."""
    pb = ProgramBuilder("many")
    pb.output("y", "f32", [2, 8])  # PE (gx, gy): y[gy, 4 gx:4 gx + 4]
    pb.output("acc", "f32", [2, 4])  # PE (gx, gy): acc[gy, 2 gx:2 gx + 2]
    rb = pb.region("pes", 0, 0, 2, 2)
    w = rb.alloc("w", 4 * 16)
    x = rb.alloc("x", 4 * 4)
    y = rb.alloc("y", 4 * 4)
    zw = rb.alloc("zw", 4 * 400)
    zx = rb.alloc("zx", 4 * 100)
    z = rb.alloc("z", 4 * 400)
    acc = rb.alloc("acc", 4 * 2)
    rb.piece("y", y, "f32", (1, 4), row=(0, 1, 0), col=(0, 0, 1))
    rb.piece("acc", acc, "f32", (1, 2), row=(0, 1, 0), col=(0, 0, 1))
    rb.init(w, "f32", list(MANY_W.T.ravel()))  # column-major tile
    rb.init(x, "f32", list(MANY_X))
    rb.init(zw, "f32", list(MANY_BIG_W))
    rb.init(zx, "f32", list(MANY_BIG_X))
    rb.dmem(0, "f32", w, 4)
    rb.d2d(0, 4, 4)
    rb.dmem(1, "f32", x, 4)
    rb.dmem(2, "f32", y, 4)
    rb.dmem(3, "f32", zw, 400)
    rb.d2d(3, 100, 0)
    rb.dmem(4, "f32", zx, 100)
    rb.dmem(5, "f32", z, 400)
    rb.mov("r4", "GX")
    rb.itof("f1", "r4")
    rb.vadds(1, 1, "f1")
    rb.li("r6", y)
    rb.li("r7", z)
    rb.li("r1", iterations)
    rb.li("r3", big_every)
    rb.label("again")
    rb.mva(2, 0, 1)
    rb.flw("f2", "r6", 0)
    rb.fadd("f3", "f3", "f2")
    rb.addi("r5", "r5", 1)
    rb.blt("r5", "r3", "next")
    rb.li("r5", 0)
    rb.mv(5, 3, 4)
    rb.flw("f4", "r7", 0)
    rb.fadd("f5", "f5", "f4")
    rb.label("next")
    rb.addi("r2", "r2", 1)
    rb.blt("r2", "r1", "again")
    rb.li("r8", acc)
    rb.fsw("f3", "r8", 0)
    rb.fsw("f5", "r8", 4)
    rb.halt()
    return pb.build()


def many_products_expected(iterations: int = 1100, big_every: int = 100):
    """(y, acc) of many_products from NumPy, by PE (y, x)."""
    y = np.zeros((2, 2, 4), np.float32)
    acc = np.zeros((2, 2, 2), np.float32)
    big = MANY_BIG_W[0] * MANY_BIG_X.sum()
    for gy in range(2):
        for gx in range(2):
            wx = MANY_W @ (MANY_X + gx)
            y[gy, gx] = iterations * wx
            acc[gy, gx] = iterations * (iterations + 1) // 2 * wx[0], \
                iterations // big_every * big
    return y.reshape(2, 8), acc.reshape(2, 4)

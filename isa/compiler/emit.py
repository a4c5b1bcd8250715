"""Small emitters shared by the stage code generators (isa.compiler.codegen*).

Register conventions (every region): r15 and f15 are never written, so they hold 0; r13 and
r14 hold this PE's column and row inside its stage (GX, GY minus the stage's corner); r10 is
the position counter of `positions` loops, r7-r9 belong to them. Descriptors d11-d15 are the
scratch of these helpers.
"""

from __future__ import annotations

from wse_emu.isa.builder import RegionBuilder
from wse_emu.isa.compiler.placement import Placed
from wse_emu.isa.spec import STORAGE_DTYPES

ZR, ZF = "r15", "f15"  # always zero
QR, PR = "r13", "r14"  # stage-relative column, row
I32 = STORAGE_DTYPES["i32"]  # the builder takes int32 pieces by code, not by name


class Labels:
    def __init__(self):
        self.n = 0

    def __call__(self, stem: str) -> str:
        self.n += 1
        return f"{stem}_{self.n}"


def stage_position(rb: RegionBuilder, p: Placed) -> None:
    rb.li("r12", p.rect.x)
    rb.sub(QR, "GX", "r12")
    rb.li("r12", p.rect.y)
    rb.sub(PR, "GY", "r12")


def mem(rb, d, addr, n, dtype="f32"):
    rb.dmem(d, dtype, addr, n)


def recv(rb, dst, color, n):
    """Receive n elements of `color` into the SRAM descriptor dst (set up by the caller)."""
    rb.dfin("d15", "f32", color, n)
    rb.vmov(dst, "d15")


def send(rb, src, color, n):
    rb.dfout("d14", "f32", color, n)
    rb.vmov("d14", src)


def drop(rb, dump, color, reg, labels):
    """Receive and drop `reg` elements of `color` (stride 0 keeps the sink one word)."""
    skip = labels("nodump")
    rb.beq(reg, ZR, skip)
    rb.dmem("d13", "f32", dump, 0)
    rb.dstride("d13", 0)
    rb.dlen("d13", reg)
    rb.dfin("d12", "f32", color, 0)
    rb.dlen("d12", reg)
    rb.vmov("d13", "d12")
    rb.label(skip)


def forward(rb, cin, cout, reg, labels):
    """Stream `reg` elements from color cin to color cout (a chain link), unless reg is 0."""
    skip = labels("noforward")
    rb.beq(reg, ZR, skip)
    rb.dfin("d12", "f32", cin, 0)
    rb.dlen("d12", reg)
    rb.dfout("d11", "f32", cout, 0)
    rb.dlen("d11", reg)
    rb.vmov("d11", "d12")
    rb.label(skip)


def at(rb, d, reg, addr) -> None:
    """Point descriptor d at addr + reg (reg None: leave it at addr)."""
    if reg is not None:
        rb.daddr(d, reg, addr)


def positions(rb, labels, T: int, stride_bytes: list[int], body) -> None:
    """Run body() for t = 0..T-1 (r10 = t); r8, r7 hold t * stride_bytes[0], [1] so body can
    address this position's slice. With T = 1 body runs once, without a loop."""
    if T == 1:
        body(None, None)
        return
    top = labels("position")
    rb.li("r10", 0)
    rb.label(top)
    for reg, stride in zip(("r8", "r7"), stride_bytes):
        rb.muli(reg, "r10", stride)
    body("r8", "r7" if len(stride_bytes) > 1 else None)
    rb.addi("r10", "r10", 1)
    rb.li("r9", T)
    rb.blt("r10", "r9", top)


def parity(rb, labels, reg, even, odd):
    """Emit even() or odd() depending on reg's low bit."""
    lo, end = labels("odd"), labels("join")
    rb.andi("r11", reg, 1)
    rb.bne("r11", ZR, lo)
    even()
    rb.jmp(end)
    rb.label(lo)
    odd()
    rb.label(end)


def norm_code(rb, kind, dst, src, n: int, off, attrs, params, dtype, mem=mem) -> None:
    """LayerNorm / RMSNorm of one vector of n fp32 elements at dst <- src (plus register off
    when not None); params maps the norm's weight names to their SRAM addresses (in `dtype`).
    `mem(rb, d, addr, n[, dtype])` sets up an SRAM descriptor (the HBM target's reaches past
    64 KB)."""
    mem(rb, "d1", dst, n)
    at(rb, "d1", off, dst)
    mem(rb, "d2", src, n)
    at(rb, "d2", off, src)
    rb.fli("f7", 1.0 / n)
    rb.fli("f8", float(attrs["eps"]))
    if kind == "layernorm":
        rb.rsum("f1", "d2")
        rb.fmul("f1", "f1", "f7")  # mean
        rb.fsub("f1", ZF, "f1")
        rb.vadds("d1", "d2", "f1")  # x - mean
        rb.rdot("f2", "d1", "d1")
    else:
        rb.vmov("d1", "d2")
        rb.rdot("f2", "d2", "d2")
    rb.fmul("f2", "f2", "f7")
    rb.fadd("f2", "f2", "f8")
    rb.frsqrt("f3", "f2")
    rb.vmuls("d1", "d1", "f3")
    mem(rb, "d3", params[attrs["params"][0]], n, dtype)
    rb.vmul("d1", "d1", "d3")
    if kind == "layernorm":
        mem(rb, "d3", params[attrs["params"][1]], n, dtype)
        rb.vadd("d1", "d1", "d3")


def rope_code(rb, x, reg, tmp, hd: int, mem=mem) -> None:
    """RoPE of one head in place, transformers' x * cos + rotate_half(x) * sin with the halves
    l, h of x: l' = l * c - h * s, h' = h * c + l * s (c, s: this position's cos and sin of the
    hd/2 frequencies, in descriptors d4 and d5; each product rounded to fp32, then one add).
    x is at address x (+ register reg when not None); tmp is hd fp32 of scratch."""
    h = hd // 2

    def half(d, addr):
        mem(rb, d, addr, h)
        at(rb, d, reg, addr)
    mem(rb, "d1", tmp, h)
    half("d2", x + h * 4)
    rb.vmul("d1", "d2", "d5")  # tmp[:h] = h * s
    mem(rb, "d1", tmp + h * 4, h)
    half("d2", x)
    rb.vmul("d1", "d2", "d5")  # tmp[h:] = l * s
    rb.vmul("d2", "d2", "d4")  # l = l * c
    mem(rb, "d1", tmp, h)
    rb.vsub("d2", "d2", "d1")  # l = l * c - h * s
    half("d2", x + h * 4)
    rb.vmul("d2", "d2", "d4")  # h = h * c
    mem(rb, "d1", tmp + h * 4, h)
    rb.vadd("d2", "d2", "d1")  # h = h * c + l * s


def softmax_code(rb, d) -> None:
    """Scaled softmax of the scores in descriptor d, in place: d = exp(f5 * d - max) / sum
    (f5 holds the scale and f6 1.0; f1-f4 are scratch)."""
    rb.vmuls(d, d, "f5")
    rb.rmax("f1", d)
    rb.fsub("f2", ZF, "f1")
    rb.vadds(d, d, "f2")
    rb.vexp(d, d)
    rb.rsum("f3", d)
    rb.fdiv("f4", "f6", "f3")
    rb.vmuls(d, d, "f4")

"""Mapping strategy `elementwise`: norms, residual adds, activations and SwiGLU where the
slices are (docs/compiler.md, "Layouts").

A residual add is local: both operands have layout R. A norm of a vector in layout R (row i
holds block i, replicated along the row) sums its block locally and allreduces one scalar
along the column (the column's PEs hold every block once): RMSNorm the sum of squares,
LayerNorm first the sum (for the mean), then the sum of squared deviations, as transformers
computes them. SiLU, GELU and the SwiGLU product are local on layout C.

Padded residual elements (decoder.Geometry: d padded to R K) are zero and their gains and
biases too, so a norm's output stays zero there; the norms divide by the true d, and
LayerNorm takes the padded elements' (0 - mean)^2 back out of its sum of squared deviations.
"""

from __future__ import annotations

ZF = "f15"  # always zero


def scalar_to_mem(rb, buf, freg) -> None:
    """Store f register freg at buf: a one-element vfill (no scalar store, so that the PE
    keeps no SRAM in a timing-only run)."""
    rb.dmem("d4", "f32", buf, 1)
    rb.vfill("d4", freg)


def mem_to_scalar(rb, freg, buf) -> None:
    rb.dmem("d4", "f32", buf, 1)
    rb.rsum(freg, "d4")


def norm(ctx, nrm, x, out, params: dict) -> None:
    """out = norm(x) over the whole vector; x and out in layout R (K elements a PE); params
    maps the norm's weight names to their blocks (weight dtype)."""
    rb, geo, c = ctx.rb, ctx.geo, ctx.cost
    K, scal = geo.K, ctx.buf("scalar")
    rb.dmem("d1", "f32", x, K)
    rb.dmem("d2", "f32", out, K)
    rb.fli("f7", 1.0 / geo.d)
    rb.fli("f8", float(nrm.eps))
    if nrm.kind == "layernorm":
        rb.rsum("f1", "d1")
        scalar_to_mem(rb, scal, "f1")
        ctx.charge("norm", c.op("add", K) + c.op("move", 1) + c.scalar(5))
        ctx.allreduce(ctx.col, scal, 1, what="norm allreduce")
        mem_to_scalar(rb, "f1", scal)
        rb.fmul("f1", "f1", "f7")
        rb.fsub("f1", ZF, "f1")
        rb.dmem("d1", "f32", x, K)
        rb.dmem("d2", "f32", out, K)
        rb.vadds("d2", "d1", "f1")  # x - mean
        rb.rdot("f2", "d2", "d2")
        ctx.charge("norm", c.op("add", 1) + c.op("add", K) + c.op("fmac", K) + c.op("move", 1)
                   + c.scalar(8))
    else:
        rb.rdot("f2", "d1", "d1")
        ctx.charge("norm", c.op("fmac", K) + c.op("move", 1) + c.scalar(5))
    scalar_to_mem(rb, scal, "f2")
    ctx.allreduce(ctx.col, scal, 1, what="norm allreduce")
    mem_to_scalar(rb, "f2", scal)
    if nrm.kind == "layernorm" and geo.dp != geo.d:  # the padded elements' mean^2 each
        rb.fli("f4", float(geo.dp - geo.d))
        rb.fmul("f4", "f4", "f1")
        rb.fmul("f4", "f4", "f1")
        rb.fsub("f2", "f2", "f4")
        ctx.charge("norm", c.scalar(4))
    rb.fmul("f2", "f2", "f7")
    rb.fadd("f2", "f2", "f8")
    rb.frsqrt("f3", "f2")
    rb.dmem("d1", "f32", x, K)
    rb.dmem("d2", "f32", out, K)
    if nrm.kind == "layernorm":
        rb.vmuls("d2", "d2", "f3")
    else:
        rb.vmuls("d2", "d1", "f3")
    rb.dmem("d3", ctx.dtype, params[nrm.params[0]], K)
    rb.vmul("d2", "d2", "d3")
    if nrm.kind == "layernorm":
        rb.dmem("d3", ctx.dtype, params[nrm.params[1]], K)
        rb.vadd("d2", "d2", "d3")
    ctx.charge("norm", c.op("add", 1) + c.scalar(8) + c.special(1) + c.op("mul", K)
               + c.op("mul", K, ctx.dtype, "f32")
               + (c.op("add", K, ctx.dtype, "f32") + c.scalar(1)
                  if nrm.kind == "layernorm" else 0))


def load_norm(ctx, rb, nrm, params: dict, width: int | None = None) -> None:
    """Allocate and load the blocks (K elements, row i's) of a norm's weights on every PE of
    the region's first `width` columns (all of them by default)."""
    K, R = ctx.geo.K, ctx.geo.R
    from wse_emu.isa.compiler.map_gemv import load_block, padded
    from wse_emu.isa.compiler.placement import WEIGHT_BYTES
    for wname in nrm.params:
        if wname in params:
            continue
        params[wname] = rb.alloc("n_" + wname.replace(".", "_"), K * WEIGHT_BYTES[ctx.dtype])
        if not ctx.shape_only:
            ref = padded(ctx, ctx.graph.weights[wname], ("d",))
            load_block(ctx, rb, ref, params[wname], K, 1, (0, 1, 0), 0, K,
                       (0, 0, width or rb.rect.w, R))


def residual_add(ctx, x, y) -> None:
    """x += y (both layout R, K elements)."""
    rb, K = ctx.rb, ctx.geo.K
    rb.dmem("d1", "f32", x, K)
    rb.dmem("d2", "f32", y, K)
    rb.vadd("d1", "d1", "d2")
    ctx.charge("residual", ctx.cost.op("add", K) + ctx.cost.scalar(2))


def activation(ctx, kind: str, buf, n: int) -> None:
    rb = ctx.rb
    rb.dmem("d1", "f32", buf, n)
    {"gelu_tanh": rb.vgelu, "gelu_erf": rb.vgelue, "silu": rb.vsilu}[kind]("d1", "d1")
    ctx.charge("activation", ctx.cost.op("special", n) + ctx.cost.scalar(1))


def swiglu(ctx, gu, F: int) -> None:
    """gu[0:F] = silu(gate) * up, with gate = gu[0:F], up = gu[F:2F]."""
    rb = ctx.rb
    rb.dmem("d1", "f32", gu, F)
    rb.dmem("d2", "f32", gu + 4 * F, F)
    rb.vsilu("d1", "d1")
    rb.vmul("d1", "d1", "d2")
    ctx.charge("swiglu", ctx.cost.op("special", F) + ctx.cost.op("mul", F) + ctx.cost.scalar(2))

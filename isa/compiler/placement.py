"""Placement: give every stage a rectangle of PEs and a tiling whose shards fit SRAM.

Tiling:
- gemv: a P x Q grid; PE (q, p) holds the (tr x tc) tile W[p*tr:(p+1)*tr, q*tc:(q+1)*tc]
  column-major. tc divides the input length; tr divides every fused matrix's rows (in a
  shape-only compile the LM head may pad its last tile instead). Among the tilings that
  fit, the fewest PEs win, then the squarest grid (shorter reduction chains).
- embed: each table's rows are cut into blocks of R rows (R divides its rows) and the
  hidden axis into Q column blocks; the row blocks of all tables stack into one column per
  column block.
- attn: one PE per KV head (its K and V caches, for max_context positions, resident).
- vector: one PE.

Stages are packed left to right in bands across the fabric, top-aligned; a stage that does not
fit the rest of a band starts the next band, one empty row below (the row is a free lane for
the flows between bands). When the bands need more rows than the machine has (tall matmuls in
bands with short stages waste most of each band), the stages are packed top to bottom in
vertical strips of the machine's height instead, a free column between strips. A model that
does not fit either way is refused with one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wse_emu.isa.compiler.lower import CompileError, Plan, Stage
from wse_emu.isa.program import Rect
from wse_emu.isa.spec import FLOAT_BYTES

class DoesNotFit(CompileError):
    """The stages need more of the fabric than the machine has."""


CODE_RESERVE = 3072  # bytes of SRAM kept for code (8 bytes an instruction) and scalars
WEIGHT_BYTES = FLOAT_BYTES  # bytes of a weight element by dtype name (isa/spec.py's table)


@dataclass
class Placed:
    """Where a stage sits and how it is tiled (fields unused by a kind stay 0)."""

    rect: Rect
    P: int = 1  # grid rows
    Q: int = 1  # grid columns
    tr: int = 0  # tile rows (gemv) / table rows per PE (embed)
    tc: int = 0  # tile columns (gemv) / hidden columns per PE (embed)
    sram: int = 0  # estimated bytes per PE (the largest)
    sram_total: int = 0  # estimated bytes over the stage's PEs
    table_rows: tuple = ()  # embed: rows per PE of each table


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _gemv_tiling(s: Stage, wbytes: int, sram: int, max_rows: int, final: bool,
                 T: int, max_tile: int | None) -> Placed:
    g = math.gcd(*[m.out for m in s.matrices])
    out = s.out_len
    best = None
    x_copies = 2 if s.prologue == "swiglu" else 1  # gate and up slices
    for tc in _divisors(s.in_len):
        if tc > 1024:
            continue
        fixed = CODE_RESERVE + 4 * tc * T * x_copies  # x (and up) slices, (tc, T)
        tr_max = (sram - fixed) // (tc * wbytes + 4 * (T + 1))  # a tile row, y (T), bias
        if max_tile is not None:
            tr_max = min(tr_max, max_tile // tc)
        if tr_max < 1:
            continue
        if final:
            P = -(-out // min(tr_max, out))
            tr = -(-out // P)
        else:
            fits = [d for d in _divisors(g) if d <= tr_max]
            if not fits:
                continue
            tr = fits[-1]
            P = out // tr
        Q = s.in_len // tc
        if P > max_rows:
            continue
        score = (P * Q, abs(math.log2(P / Q)))
        if best is None or score < best[0]:
            per_pe = fixed + tr * tc * wbytes + 4 * (T + 1) * tr
            best = (score, Placed(Rect(0, 0, Q, P), P, Q, tr, tc, per_pe, per_pe * P * Q))
    if best is None:
        raise CompileError(f"stage '{s.name}': no tiling of its {out} x {s.in_len} weights fits "
                           f"{sram} bytes of SRAM per PE in at most {max_rows} rows")
    return best[1]


def table_rows(ref) -> int:
    """Rows of an embedding table; a 1-D weight (a constant row) is one."""
    return ref.shape[0] if len(ref.shape) == 2 else 1


def _embed_tiling(s: Stage, wbytes: int, sram: int, max_rows: int) -> Placed:
    hidden = s.attrs["hidden"]
    for Q in _divisors(hidden):
        tc = hidden // Q
        per_row = tc * wbytes
        rows = (sram - CODE_RESERVE - 4 * tc) // per_row  # table rows per PE, + one vector
        if rows < 1:
            continue
        # rows per PE divide each table (a tile map must lie inside its tensor)
        per_table = tuple(max(d for d in _divisors(table_rows(ref)) if d <= rows)
                          for _, ref, _ in s.tables)
        P = sum(table_rows(ref) // r for (_, ref, _), r in zip(s.tables, per_table))
        if P <= max_rows:
            per_pe = CODE_RESERVE + 4 * tc + max(per_table) * per_row
            return Placed(Rect(0, 0, Q, P), P, Q, max(per_table), tc, per_pe, per_pe * P * Q,
                          per_table)
    raise CompileError(f"stage '{s.name}': the embedding tables do not fit {max_rows} rows of "
                       f"PEs")


def attn_bytes(s: Stage, T: int = 1, dtype: str = "f32") -> int:
    """SRAM bytes of one attention PE: K and V caches (in the weight dtype), RoPE tables and
    buffers (fp32)."""
    a = s.attrs
    ctx, hd = a["max_context"], a["head_dim"]
    group = a["n_heads"] // a["n_kv_heads"]
    cache = 2 * ctx * hd * WEIGHT_BYTES[dtype]
    rope = ctx * hd if (a["rope_q"] or a["rope_k"]) else 0  # cos and sin, (ctx, hd / 2) each
    buffers = T * (2 * group * hd + 2 * hd + 1) + hd + ctx + 1  # q, o, k, v, pos; tmp, scores
    return CODE_RESERVE + cache + 4 * (rope + buffers)


def _attn_tiling(s: Stage, sram: int, T: int, dtype: str) -> Placed:
    need = attn_bytes(s, T, dtype)
    a = s.attrs
    if need > sram:
        rope = 1 if (a["rope_q"] or a["rope_k"]) else 0
        # cache (+ RoPE table) bytes a position
        per_pos = 2 * a["head_dim"] * WEIGHT_BYTES[dtype] + 4 * (rope * a["head_dim"] + 1)
        fit = max(0, (sram - (need - per_pos * a["max_context"])) // per_pos)
        raise CompileError(
            f"stage '{s.name}': one KV head needs {need} bytes of SRAM for max_context "
            f"{a['max_context']} (K and V caches resident) but a PE has {sram}; max_context "
            f"{fit} would fit")
    n = a["n_kv_heads"]
    return Placed(Rect(0, 0, 1, n), n, 1, 0, 0, need, need * n)


def vector_layout(s: Stage) -> tuple[dict, int | None]:
    """How a vector stage saves SRAM: (alias, fused).

    alias maps a buffer to the buffer whose SRAM it reuses: an op's result overwrites its
    first source when nothing else reads that source (elementwise adds and norms work in
    place). fused is the in-flow that the stage's first op, an add, reads straight from the
    fabric instead of a buffer: the last flow received, read by nothing else, so the receive
    order is unchanged. A Llama-3-8B residual stage needs 43 KB instead of 80 KB this way."""
    reads: dict[str, int] = {}
    for _, _, srcs, _ in s.ops:
        for b in srcs:
            reads[b] = reads.get(b, 0) + 1
    for b in list(s.send_buffer.values()) + [b for _, b in s.outputs]:
        reads[b] = reads.get(b, 0) + 1
    fused = None
    if s.ops and s.ops[0][0] == "add" and s.in_flows:
        last = s.in_flows[-1]
        b = s.flow_buffer.get(last)
        if b in s.ops[0][2] and reads.get(b) == 1 and s.ops[0][2][0] != s.ops[0][2][1]:
            fused = last
    alias: dict[str, str] = {}
    for kind, dst, srcs, _ in s.ops:
        first = srcs[0]
        if fused is not None and first == s.flow_buffer[fused]:
            first = srcs[1] if kind == "add" else None
        if first is not None and reads.get(first) == 1:
            alias[dst] = alias.get(first, first)
    return alias, fused


def _vector_bytes(s: Stage, T: int, dtype: str = "f32") -> int:
    params = sum(len(op[3].get("params", ())) for op in s.ops) * s.attrs["hidden"]
    alias, fused = vector_layout(s)
    skip = set(alias) | ({s.flow_buffer[fused]} if fused is not None else set())
    held = sum(n for b, n in s.buffers.items() if b not in skip)
    return CODE_RESERVE + 4 * T * held + WEIGHT_BYTES[dtype] * params  # norm weights: weight dtype


def place(plan: Plan, machine, dtype: str, pad_last: bool = False,
          max_tile: int | None = None) -> list[Placed]:
    """A rectangle and tiling for every stage of `plan` on `machine` (see module docstring).

    pad_last lets the final matmul (the LM head) pad its last tile row, which only a
    shape-only compile can do: a tile map must lie inside its tensor. max_tile caps the
    elements of a weight tile (None: as many as SRAM holds): smaller tiles, more PEs, fewer
    cycles a matmul."""
    wbytes = WEIGHT_BYTES[dtype]
    sram, width, height = machine.sram_bytes, machine.width, machine.height
    placed = []
    for s in plan.stages:
        final = s.kind == "gemv" and not s.out_flows and pad_last
        if s.kind == "gemv":
            p = _gemv_tiling(s, wbytes, sram, height, final, plan.T, max_tile)
        elif s.kind == "embed":
            p = _embed_tiling(s, wbytes, sram, height)
        elif s.kind == "attn":
            p = _attn_tiling(s, sram, plan.T, dtype)
        else:
            need = _vector_bytes(s, plan.T, dtype)
            if need > sram:
                raise CompileError(
                    f"stage '{s.name}': a vector stage keeps its {s.attrs['hidden']}-element "
                    f"vectors and norm weights on one PE, {need} bytes, but a PE has {sram} "
                    f"(vector stages are not split over PEs yet)")
            p = Placed(Rect(0, 0, 1, 1), sram=need, sram_total=need)
        placed.append(p)
    for s, p in zip(plan.stages, placed):
        if p.Q > width:
            raise CompileError(f"stage '{s.name}' is {p.Q} PEs wide; machine '{machine.name}' "
                               f"is {width} wide")
    rows = _bands(placed, width)
    if rows > height and _strips(placed, width, height):
        return placed
    if rows > height:  # DoesNotFit: a smaller tile cap cannot help, a larger one may
        pes = sum(p.P * p.Q for p in placed)
        nbytes = sum(p.sram_total for p in placed)
        wafers = -(-rows // height)
        raise DoesNotFit(
            f"model needs {pes} PEs ({nbytes / 1e9:.2f} GB of SRAM), which the band placement "
            f"spreads over {width} x {rows} PEs (nor do they fit as column strips); machine '{machine.name}' is {width} x {height} "
            f"({width * height} PEs, {width * height * sram / 1e9:.2f} GB): it would fit "
            f"{wafers} such wafers, or one with a smaller max_context or 16-bit weights")
    return placed


def _bands(placed: list[Placed], width: int) -> int:
    """Rows of bands: stages left to right, top-aligned, a new band one empty row lower when a
    stage does not fit the rest of the band. Sets every rect; returns the rows used."""
    x = y = band_h = 0
    for p in placed:
        if x + p.Q > width:
            x, y, band_h = 0, y + band_h + 1, 0
        p.rect = Rect(x, y, p.Q, p.P)
        x += p.Q
        band_h = max(band_h, p.P)
    return y + band_h


def _strips(placed: list[Placed], width: int, height: int) -> bool:
    """The fallback for models whose tall matmuls make bands waste most of the fabric: stages
    top to bottom in vertical strips of the machine's height, left-aligned, a new strip one
    empty column to the right (a free lane) when a stage does not fit the rest of the strip.
    Sets every rect and returns True when the strips fit the width; leaves the rects of the
    bands otherwise."""
    x = y = strip_w = 0
    rects = []
    for p in placed:
        if p.P > height:
            return False
        if y + p.P > height:
            x, y, strip_w = x + strip_w + 1, 0, 0
        rects.append(Rect(x, y, p.Q, p.P))
        y += p.P
        strip_w = max(strip_w, p.Q)
    if x + strip_w > width:
        return False
    for p, r in zip(placed, rects):
        p.rect = r
    return True

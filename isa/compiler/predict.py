"""Predicted cycles: the emulator's cost rules (docs/timing-model.md section 4), for the
compiler's cost model. Each mapping strategy adds the cycles of the ops it emits on one PE
(every PE of a grid runs the same local ops) and of its line collectives (isa.compiler.lines).

The tile-product rule comes from `isa.costs` when it is there (a mesh PE issues `mv` / `mm` as
one op per column of the tile); otherwise the tile is one op.
"""

from __future__ import annotations

from wse_emu.isa.spec import DTYPES, simd_key

try:  # the one definition of the op costs, shared with the emulator
    from wse_emu.isa.costs import matrix_cycles as _matrix_cycles
    from wse_emu.isa.costs import products_by_column as _by_column
except ImportError:  # pragma: no cover - an emulator without the per-column rule
    def _by_column(kind):
        return False

    def _matrix_cycles(m, k, n, width, overhead, by_column):
        return overhead + -(-(m * k * n) // width)

F32 = DTYPES["f32"]


class Cost:
    """Cycles of tensor and scalar ops on one machine."""

    def __init__(self, machine):
        self.m = machine
        self.by_column = _by_column(machine.kind)

    def width(self, cls: str, dtypes) -> int:
        return self.m.simd_width(simd_key(cls, tuple(DTYPES[d] for d in dtypes)))

    def op(self, cls: str, n: int, *dtypes: str) -> int:
        """An elementwise op or reduction of n elements (memory operands)."""
        return self.m.issue_overhead + -(-n // self.width(cls, dtypes or ("f32",)))

    def mat(self, M: int, K: int, N: int, *dtypes: str) -> int:
        """mv (N = 1) or mm of an M x K tile."""
        return _matrix_cycles(M, K, N, self.width("fmac", dtypes), self.m.issue_overhead,
                              self.by_column)

    def scalar(self, k: int = 1) -> int:
        return k * self.m.scalar_cycles

    def special(self, k: int = 1) -> int:
        return k * self.m.special_scalar_cycles

    def send(self, n: int, hops: int) -> int:
        """A message of n wavelets from a PE's op start to its tail's delivery `hops` away."""
        return self.m.issue_overhead + 1 + 2 * self.m.ramp_latency + hops * self.m.hop_latency + n


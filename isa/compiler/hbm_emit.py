"""Small emitters of the HBM target (isa/compiler/hbm.py, hbm_attn.py, hbm_tp.py): HBM
addresses in registers, SRAM descriptors anywhere in a core's SRAM, a stage's SRAM arena and
the recorder that compares two layers' code (here so that those modules need not import
hbm.py, which imports them)."""

from __future__ import annotations

from dataclasses import dataclass

from wse_emu.isa.compiler.emit import ZR
from wse_emu.isa.compiler.lower import CompileError

RL = "r12"  # the layer block's HBM base address inside a layer's code
S0 = "r10"  # scratch of smem for lengths past 16 bits
IO_BYTES = 64  # input_ids, position_ids, the barrier token (one sequence)


def io_bytes(sequences: int) -> int:
    """SRAM bytes of the io block for B sequences: B input ids at 0, B positions at 4B, the
    barrier token at 8B, the index of the sequence a loop is at at 8B + 4 (one sequence: the
    64 bytes of IO_BYTES)."""
    return max(IO_BYTES, -(-(8 * sequences + 8) // 64) * 64)


@dataclass(frozen=True)
class Ha:
    """An HBM address: `off` bytes from 0, or from the layer block's base (r12) when layer;
    inside a loop over the sequences, plus `seq` bytes times the sequence's index."""

    off: int
    layer: bool = False
    seq: int = 0


def li64(rb, reg: str, v: int) -> None:
    """reg = v for any non-negative address (li takes 32 bits)."""
    if -2 ** 31 <= v < 2 ** 31:
        rb.li(reg, v)
        return
    rb.li(reg, v >> 20)
    rb.shli(reg, reg, 20)
    if v & 0xFFFFF:
        rb.addi(reg, reg, v & 0xFFFFF)


def smem(rb, d, addr: int, n, dtype="f32") -> None:
    """SRAM descriptor d: n elements (an int or a register) at addr, anywhere in SRAM (dmem
    takes 16-bit addresses and lengths)."""
    small = isinstance(n, int) and n < 65536
    if small and addr < 65536:
        rb.dmem(d, dtype, addr, n)
        return
    rb.dmem(d, dtype, 0, n if small else 0)
    rb.daddr(d, ZR, addr)
    if not small:
        if isinstance(n, int):
            rb.li(S0, n)
            n = S0
        rb.dlen(d, n)


class _Arena:
    """Bump allocation of one stage's SRAM buffers (every stage reuses the same space)."""

    def __init__(self, base: int, limit: int, what: str, machine,
                 fix: str = "a smaller max_context"):
        self.base, self.top, self.limit, self.what, self.machine = base, base, limit, what, machine
        self.fix = fix

    def take(self, nbytes: int, align: int = 64) -> int:
        addr = -(-self.top // align) * align
        self.top = addr + nbytes
        if self.top > self.limit:
            raise CompileError(f"stage '{self.what}' needs {self.top} bytes of SRAM a core but "
                               f"machine '{self.machine.name}' has {self.machine.sram_bytes} "
                               f"(with {self.base} for code): use {self.fix}")
        return addr


class _Recorder:
    """Stands in for a RegionBuilder: records every call, so that two layers' code compares."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.calls.append((name, args, tuple(sorted(kwargs.items()))))
        return record

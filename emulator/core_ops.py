"""The Numba core's semantic ids and the tables derived for them from isa/spec.py.

Instructions are dispatched on *semantic ids* of our own (S_*), mapped from the mnemonics of
isa.spec at run time rather than on opcode numbers baked into compiled code: renumbering an
opcode in the spec then cannot leave a stale Numba cache decoding the wrong instruction.

`SEMANTICS` (mnemonic -> (semantic id, kernel sub-code)) is derived, not kept by hand: an
elementwise tensor instruction (isa.spec.ELEMENTWISE_SHAPES) runs on its shape's executor with
the kernel its mnemonic names in kernels/elementwise.py; every other instruction has an
executor of its own, the S_ id named after its mnemonic (`add` -> S_ADD). An instruction the
core has no semantics for is an error at import, not a silent no-op.

`OPERAND_ROLES` (per semantic id: the destination and source descriptor slots, and whether the
destination must be SRAM) is derived from the spec's operand roles, for core_exec.roles and
check_operands.
"""

from __future__ import annotations

import numpy as np

from wse_emu.isa.spec import INSTRUCTIONS
from wse_emu.kernels import elementwise as ew

# Semantic ids, grouped so that one comparison picks the executor of a family.
(S_NOP, S_HALT, S_JMP, S_BEQ, S_BNE, S_BLT, S_BGE, S_LI, S_MOV, S_ADD, S_SUB, S_MUL, S_DIV,
 S_REM, S_AND, S_OR, S_XOR, S_SLT, S_ADDI, S_MULI, S_ANDI, S_SHLI, S_SHRI, S_LW,
 S_SW) = range(1, 26)
S_FLOAT = 32  # first scalar-float id
(S_FLI, S_FMOV, S_FADD, S_FSUB, S_FMUL, S_FMAX, S_FMIN, S_FDIV, S_FEXP, S_FRSQRT, S_FSQRT,
 S_FLW, S_FSW, S_ITOF, S_FTOI) = range(S_FLOAT, S_FLOAT + 15)
S_DESC = 64  # first descriptor id
S_DMEM, S_DFIN, S_DFOUT, S_DSTRIDE, S_D2D, S_DADDR, S_DLEN = range(S_DESC, S_DESC + 7)
S_DMA = 72  # first DMA id (dmald and dmast touch the shared HBM; dmawait is local)
S_DMALD, S_DMAST, S_DMAWAIT = range(S_DMA, S_DMA + 3)
S_TENSOR = 80  # first tensor id
(S_UNARY, S_BINARY, S_BINSCALAR, S_FILL, S_FMA, S_RSUM, S_RMAX, S_RDOT) = range(S_TENSOR,
                                                                                S_TENSOR + 8)
S_MATRIX = 96  # first matrix id
S_MV, S_MVA, S_MM, S_MMA = range(S_MATRIX, S_MATRIX + 4)
N_SEMANTICS = S_MATRIX + 4

# Executors of the elementwise shapes and where their kernel's sub-code comes from.
SHAPE_EXECUTORS = {"unary": (S_UNARY, ew.UNARY_OPS), "binary": (S_BINARY, ew.BINARY_OPS),
                   "scalar": (S_BINSCALAR, ew.BINARY_OPS)}
# Tensor instructions with an executor of their own whose mnemonic is not their S_ name.
OWN_EXECUTORS = {"vfill": S_FILL, "vfma": S_FMA}

# Columns of OPERAND_ROLES: the operand slot (0 = A, 1 = B, 2 = C; -1 none) of the destination
# and the two source descriptors, and 1 if the destination must be an SRAM descriptor.
R_DST, R_SRC0, R_SRC1, R_DST_MEM = range(4)


def _semantics(ins) -> tuple[int, int]:
    if ins.shape is not None:
        sem, codes = SHAPE_EXECUTORS[ins.shape]
        if ins.kernel not in codes:
            raise ImportError(f"emulator.core: {ins.mnemonic} needs kernel {ins.kernel!r} in "
                              f"kernels/elementwise.py ({ins.shape} shape)")
        return sem, codes[ins.kernel]
    sem = OWN_EXECUTORS.get(ins.mnemonic, globals().get(f"S_{ins.mnemonic.upper()}"))
    if sem is None:  # the table and this core must grow together
        raise ImportError(f"emulator.core has no semantics for {ins.mnemonic} (isa/spec.py)")
    return sem, 0


def _roles(ins) -> tuple[int, int, int, int]:
    def slot(i):
        return "ABC".index(ins.operands[i][2])
    dst = slot(ins.destination) if ins.destination >= 0 else -1
    srcs = [slot(i) for i in ins.sources] + [-1, -1]
    mem = int(dst >= 0 and ins.roles[ins.destination].startswith("mem"))
    return dst, srcs[0], srcs[1], mem


SEMANTICS = {ins.mnemonic: _semantics(ins) for ins in INSTRUCTIONS}


def operand_roles() -> np.ndarray:
    """(N_SEMANTICS, 4) int64: per semantic id of a tensor executor its R_* columns, the same
    for every instruction it runs (else ImportError: the executor could not serve them all)."""
    table = np.full((N_SEMANTICS, 4), -1, dtype=np.int64)
    seen: dict[int, str] = {}
    for ins in INSTRUCTIONS:
        sem = SEMANTICS[ins.mnemonic][0]
        if not S_TENSOR <= sem < S_MATRIX:
            continue
        roles = _roles(ins)
        if sem in seen and tuple(table[sem]) != roles:
            raise ImportError(f"emulator.core: {ins.mnemonic} and {seen[sem]} share an executor "
                              "but not their operand roles (isa/spec.py)")
        seen[sem] = ins.mnemonic
        table[sem] = roles
    return table


OPERAND_ROLES = operand_roles()

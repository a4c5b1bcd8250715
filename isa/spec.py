"""The wse-emu instruction set as one table.

Every instruction is one `Instr` row: mnemonic, opcode, operands (each an operand kind placed in
a slot of the 64-bit word, with its role: what the instruction does with it), cost class, group
and a one-line doc. The encoder, decoder, assembler, disassembler, the emulator's dispatch and
operand checks (emulator/core_ops.py, core_exec.py, reference.py), the cost classes and
docs/ISA.md are all derived from `INSTRUCTIONS`; `check_table()` verifies the table itself.
docs/contributing.md shows how to add an instruction.

Instruction word (64 bits, little-endian when stored):

    bits  0-7   opcode
    bits  8-15  slot A      (register, dtype or color)
    bits 16-23  slot B
    bits 24-31  slot C
    bits 32-63  slot I      (32-bit immediate), or
    bits 32-47  slot IL and bits 48-63 slot IH (two 16-bit immediates)

This module is pure Python (no NumPy, no Numba): the assembler and `wse-emu --help` import it.
"""

from __future__ import annotations

from dataclasses import dataclass

INSTR_BYTES = 8  # every instruction occupies 8 bytes of its PE's SRAM

# ---------------------------------------------------------------------------------------------
# Slots: where operand values live in the instruction word.


@dataclass(frozen=True)
class Slot:
    name: str
    lo: int  # first bit
    width: int  # number of bits

    @property
    def bits(self) -> range:
        return range(self.lo, self.lo + self.width)


SLOTS = {
    "A": Slot("A", 8, 8),
    "B": Slot("B", 16, 8),
    "C": Slot("C", 24, 8),
    "I": Slot("I", 32, 32),
    "IL": Slot("IL", 32, 16),
    "IH": Slot("IH", 48, 16),
}
# Signedness belongs to the operand kind, not the slot: decoders sign-extend `imm` and `s16`
# operands and zero-extend the rest (fimm keeps its raw 32 bits).
OPCODE_BITS = range(0, 8)

# ---------------------------------------------------------------------------------------------
# Registers.

N_IREGS = 16  # r0..r15, general purpose, int64 semantics (r0 is an ordinary register)
N_FREGS = 16  # f0..f15, fp32
N_DREGS = 16  # d0..d15, tensor descriptors

# Read-only integer registers a PE can read to address its own shard (SPMD regions).
SPECIAL_IREGS = {
    "X": 16,  # column of this PE inside its region (0-based)
    "Y": 17,  # row of this PE inside its region (0-based)
    "W": 18,  # region width in PEs
    "H": 19,  # region height in PEs
    "GX": 20,  # absolute column on the fabric
    "GY": 21,  # absolute row on the fabric
}
N_IREG_SLOTS = 22  # size of the per-PE integer register file, specials included

# ---------------------------------------------------------------------------------------------
# Element types: the one table of them. Every other dtype table of the project (the builder's
# tensor types, the graph's, the compiler's aliases and weight sizes, the kernels' codes) is
# derived here.


@dataclass(frozen=True)
class DType:
    name: str  # as written in .wsa files, graphs and symbols
    code: int  # as stored in tile maps, data initialisers and the dmem/dfin/dfout dtype slot
    nbytes: int
    tensor: str  # the Program.Tensor dtype string (NumPy's, but bf16, which NumPy lacks)
    descriptor: bool  # a tensor descriptor may hold it (the float types the SIMD units compute)
    aliases: tuple[str, ...] = ()  # other spellings accepted on command lines (fp32, fp16)


DTYPE_TABLE: tuple[DType, ...] = (
    DType("f32", 0, 4, "<f4", True, ("fp32",)),
    DType("f16", 1, 2, "<f2", True, ("fp16",)),
    DType("bf16", 2, 2, "bf16", True),
    # int32 (token ids, positions): data initialisers and symbol pieces may store it, `lw` reads it
    DType("i32", 3, 4, "<i4", False),
)
DTYPES = {t.name: t.code for t in DTYPE_TABLE if t.descriptor}  # element types of descriptors
STORAGE_DTYPES = {t.name: t.code for t in DTYPE_TABLE}  # what data and symbol pieces may store
DTYPE_BYTES = {t.code: t.nbytes for t in DTYPE_TABLE}
DTYPE_NAMES = {t.code: t.name for t in DTYPE_TABLE}
FLOAT_DTYPES = tuple(DTYPES)  # names of the float types
SYMBOL_DTYPES = tuple(STORAGE_DTYPES)  # names a symbol (and a dtype parameter) may have
FLOAT_BYTES = {t.name: t.nbytes for t in DTYPE_TABLE if t.descriptor}  # by name
TENSOR_DTYPES = {t.name: t.tensor for t in DTYPE_TABLE}  # .wsa name -> Program.Tensor dtype
TENSOR_ITEMSIZE = {t.tensor: t.nbytes for t in DTYPE_TABLE}
# Float type spellings accepted on command lines (f32, fp32, ...) -> the name
FLOAT_ALIASES = {a: t.name for t in DTYPE_TABLE if t.descriptor for a in (t.name, *t.aliases)}

# ---------------------------------------------------------------------------------------------
# Descriptor and operand kinds.

# Descriptor kinds (stored in the descriptor register).
DSD_MEM = 0  # SRAM operand: addr, len, stride, count, cstride, dtype
DSD_FABIN = 1  # fabric input: wavelets received on a color
DSD_FABOUT = 2  # fabric output: wavelets sent on a color

# Operand kinds: how the assembler parses an operand and what values are legal.
#   ireg   integer register r0..r15 or a read-only special (X, Y, W, H, GX, GY)
#   iregw  writable integer register r0..r15
#   freg   float register f0..f15
#   dreg   descriptor register d0..d15
#   dtype  f32 | f16 | bf16
#   color  fabric color (0..255 encodable; the machine preset limits it)
#   imm    signed 32-bit integer expression
#   u16    unsigned 16-bit integer expression
#   s16    signed 16-bit integer expression
#   target branch target: a label (encoded as an absolute instruction index)
#   fimm   fp32 immediate (encoded as its IEEE-754 bits)
OPERAND_KINDS = ("ireg", "iregw", "freg", "dreg", "dtype", "color", "imm", "u16", "s16", "target", "fimm")

KIND_SIGNED = {"imm": True, "s16": True}

# Slot each kind may occupy.
KIND_SLOTS = {
    "ireg": ("A", "B", "C"),
    "iregw": ("A", "B", "C"),
    "freg": ("A", "B", "C"),
    "dreg": ("A", "B", "C"),
    "dtype": ("A", "B", "C"),
    "color": ("A", "B", "C"),
    "imm": ("I",),
    "target": ("I",),
    "fimm": ("I",),
    "u16": ("IL", "IH"),
    "s16": ("IH",),
}

# ---------------------------------------------------------------------------------------------
# Cost classes. A tensor op costs  issue_overhead + ceil(elements / simd[width_key]); the width
# key is chosen from the class and the operand dtypes (see `simd_key`). Scalar classes cost a
# fixed number of cycles from the machine preset.

COST_CLASSES = {
    "scalar": "integer, control and descriptor setup: machine.scalar_cycles",
    "fscalar": "scalar fp32 add/mul/max/move: machine.scalar_cycles",
    "fspecial": "scalar fp32 div/exp/rsqrt/sqrt: machine.special_scalar_cycles",
    "move": "tensor copy/fill/convert: simd move_f32 | move_f16 | convert",
    "add": "tensor add/sub and sum reduction: simd add_f32 | add_f16",
    "mul": "tensor multiply: simd mul_f32 | mul_f16",
    "max": "tensor max/min and max reduction: simd max_f32 | max_f16",
    "fmac": "multiply-accumulate (axpy, dot, GEMV, GEMM): simd fmac_f32 | fmac_mixed | fmac_f16",
    "special": "tensor transcendental (exp, gelu, silu, rsqrt): simd special",
    "dma": "DMA request between HBM and SRAM: machine.issue_overhead to issue; the transfer "
           "runs asynchronously on the HBM channels",
}

# Classes whose cost is a fixed number of cycles (no SIMD width); "dma" costs issue_overhead.
SCALAR_CLASSES = ("scalar", "fscalar", "fspecial")
FIXED_CLASSES = SCALAR_CLASSES + ("dma",)

GROUPS = ("control", "int", "float", "descriptor", "tensor", "reduce", "matrix", "memory")

# ---------------------------------------------------------------------------------------------
# Operand roles: what an instruction does with each operand. The emulator's operand checks and
# dispatch (which descriptor is the destination, which are sources, which must be SRAM) and the
# role column of docs/ISA.md are derived from them.
#   reg-r, reg-w, reg-rw   the register itself is read, written, or both (a descriptor register
#                          counts as a register for the instructions that set it up)
#   imm                    a value encoded in the instruction word
#   mem-r, mem-w, mem-rw   SRAM, through the SRAM descriptor in that register
#   dsd-r, dsd-w           SRAM or the fabric, through the descriptor in that register: a fabric
#                          input when read, a fabric output when written
ROLES = {
    "reg-r": "register, read", "reg-w": "register, written", "reg-rw": "register, read and written",
    "imm": "immediate",
    "mem-r": "SRAM, read", "mem-w": "SRAM, written", "mem-rw": "SRAM, read and written",
    "dsd-r": "SRAM or fabric input, read", "dsd-w": "SRAM or fabric output, written",
}
IMMEDIATE_KINDS = ("dtype", "color", "imm", "u16", "s16", "target", "fimm")
# Roles each operand kind may have.
KIND_ROLES = {
    "ireg": ("reg-r",),
    "iregw": ("reg-w", "reg-rw"),
    "freg": ("reg-r", "reg-w", "reg-rw"),
    "dreg": ("reg-w", "reg-rw", "mem-r", "mem-w", "mem-rw", "dsd-r", "dsd-w"),
    **{kind: ("imm",) for kind in IMMEDIATE_KINDS},
}
DATA_ROLES = ("mem-r", "mem-w", "mem-rw", "dsd-r", "dsd-w")  # data reached through a descriptor
# Groups whose instructions move data through descriptors (only these may have DATA_ROLES).
DATA_GROUPS = ("tensor", "reduce", "matrix", "memory")

# Elementwise shapes: the (kind, role) signature of a tensor instruction's operands names its
# shape, and the shape says how the emulator runs it: read the sources element by element, call
# the kernel of kernels/elementwise.py that the mnemonic names (`Instr.kernel`), write the
# destination. A new instruction of one of these shapes needs no emulator code.
ELEMENTWISE_SHAPES = {
    (("dreg", "dsd-w"), ("dreg", "dsd-r")): "unary",  # d = f(a): kernels.elementwise.UNARY_OPS
    (("dreg", "dsd-w"), ("dreg", "dsd-r"), ("dreg", "dsd-r")): "binary",  # d = f(a, b): BINARY_OPS
    (("dreg", "dsd-w"), ("dreg", "dsd-r"), ("freg", "reg-r")): "scalar",  # d = f(a, s): BINARY_OPS
}


@dataclass(frozen=True)
class Instr:
    mnemonic: str
    opcode: int
    operands: tuple[tuple[str, str, str], ...]  # (name, kind, slot)
    cost: str
    group: str
    doc: str
    roles: tuple[str, ...] = ()  # one of ROLES per operand

    @property
    def is_tensor(self) -> bool:
        return self.group in ("tensor", "reduce", "matrix")

    @property
    def destination(self) -> int:
        """Index into `operands` of the descriptor the instruction writes data through, or -1."""
        return next((i for i, r in enumerate(self.roles)
                     if r in DATA_ROLES and r.endswith("w")), -1)

    @property
    def sources(self) -> tuple[int, ...]:
        """Indices into `operands` of the descriptors it only reads data through, in order."""
        return tuple(i for i, r in enumerate(self.roles) if r in DATA_ROLES and r.endswith("-r"))

    @property
    def shape(self) -> str | None:
        """The elementwise shape (ELEMENTWISE_SHAPES) of a tensor instruction, or None."""
        if self.group != "tensor":
            return None
        return ELEMENTWISE_SHAPES.get(tuple((k, r) for (_n, k, _s), r in
                                            zip(self.operands, self.roles)))

    @property
    def kernel(self) -> str | None:
        """The name of an elementwise instruction's kernel in kernels/elementwise.py: the
        mnemonic without its leading `v` (and the trailing `s` of the scalar shape):
        vadd -> add, vadds -> add, vexp -> exp."""
        if self.shape is None:
            return None
        return self.mnemonic[1:-1] if self.shape == "scalar" else self.mnemonic[1:]


def _i(mnemonic, opcode, operands, cost, group, doc):
    fields = [o.split(":") for o in operands.split()]
    ops = tuple(tuple(f[:3]) for f in fields)
    roles = tuple(f[3] if len(f) > 3 else "" for f in fields)
    return Instr(mnemonic, opcode, ops, cost, group, doc, roles)


# Operand strings are "name:kind:slot:role" (ROLES). Semantics of each row: docs/ISA.md
# (generated from `doc`) and emulator/reference.py (the executable definition).
INSTRUCTIONS: tuple[Instr, ...] = (
    # -- control ------------------------------------------------------------------------------
    _i("nop", 0x00, "", "scalar", "control", "Do nothing for one scalar cycle."),
    _i("halt", 0x01, "", "scalar", "control",
       "Stop this PE; the run ends when every PE has halted."),
    _i("jmp", 0x02, "t:target:I:imm", "scalar", "control", "Jump to label t."),
    _i("beq", 0x03, "a:ireg:A:reg-r b:ireg:B:reg-r t:target:I:imm", "scalar", "control",
       "Branch to t if a == b."),
    _i("bne", 0x04, "a:ireg:A:reg-r b:ireg:B:reg-r t:target:I:imm", "scalar", "control",
       "Branch to t if a != b."),
    _i("blt", 0x05, "a:ireg:A:reg-r b:ireg:B:reg-r t:target:I:imm", "scalar", "control",
       "Branch to t if a < b (signed)."),
    _i("bge", 0x06, "a:ireg:A:reg-r b:ireg:B:reg-r t:target:I:imm", "scalar", "control",
       "Branch to t if a >= b (signed)."),
    # -- integer ------------------------------------------------------------------------------
    _i("li", 0x10, "d:iregw:A:reg-w v:imm:I:imm", "scalar", "int",
       "d = v (sign-extended 32-bit immediate)."),
    _i("mov", 0x11, "d:iregw:A:reg-w a:ireg:B:reg-r", "scalar", "int", "d = a."),
    _i("add", 0x12, "d:iregw:A:reg-w a:ireg:B:reg-r b:ireg:C:reg-r", "scalar", "int",
       "d = a + b."),
    _i("sub", 0x13, "d:iregw:A:reg-w a:ireg:B:reg-r b:ireg:C:reg-r", "scalar", "int",
       "d = a - b."),
    _i("mul", 0x14, "d:iregw:A:reg-w a:ireg:B:reg-r b:ireg:C:reg-r", "scalar", "int",
       "d = a * b."),
    _i("div", 0x15, "d:iregw:A:reg-w a:ireg:B:reg-r b:ireg:C:reg-r", "scalar", "int",
       "d = a / b rounded toward zero; d = 0 when b == 0."),
    _i("rem", 0x16, "d:iregw:A:reg-w a:ireg:B:reg-r b:ireg:C:reg-r", "scalar", "int",
       "d = a - b * (a / b) (sign of a); d = 0 when b == 0."),
    _i("and", 0x17, "d:iregw:A:reg-w a:ireg:B:reg-r b:ireg:C:reg-r", "scalar", "int",
       "d = a & b."),
    _i("or", 0x18, "d:iregw:A:reg-w a:ireg:B:reg-r b:ireg:C:reg-r", "scalar", "int", "d = a | b."),
    _i("xor", 0x19, "d:iregw:A:reg-w a:ireg:B:reg-r b:ireg:C:reg-r", "scalar", "int",
       "d = a ^ b."),
    _i("slt", 0x1A, "d:iregw:A:reg-w a:ireg:B:reg-r b:ireg:C:reg-r", "scalar", "int",
       "d = 1 if a < b (signed) else 0."),
    _i("addi", 0x1B, "d:iregw:A:reg-w a:ireg:B:reg-r v:imm:I:imm", "scalar", "int", "d = a + v."),
    _i("muli", 0x1C, "d:iregw:A:reg-w a:ireg:B:reg-r v:imm:I:imm", "scalar", "int", "d = a * v."),
    _i("andi", 0x1D, "d:iregw:A:reg-w a:ireg:B:reg-r v:imm:I:imm", "scalar", "int", "d = a & v."),
    _i("shli", 0x1E, "d:iregw:A:reg-w a:ireg:B:reg-r v:imm:I:imm", "scalar", "int",
       "d = a << v (v in 0..63)."),
    _i("shri", 0x1F, "d:iregw:A:reg-w a:ireg:B:reg-r v:imm:I:imm", "scalar", "int",
       "d = a >> v, arithmetic (v in 0..63)."),
    _i("lw", 0x20, "d:iregw:A:reg-w a:ireg:B:reg-r v:imm:I:imm", "scalar", "int",
       "d = the int32 at SRAM byte address a + v (4-byte aligned), sign-extended."),
    _i("sw", 0x21, "s:ireg:A:reg-r a:ireg:B:reg-r v:imm:I:imm", "scalar", "int",
       "Store the low 32 bits of s at SRAM byte address a + v (4-byte aligned)."),
    # -- scalar float -------------------------------------------------------------------------
    _i("fli", 0x30, "d:freg:A:reg-w v:fimm:I:imm", "fscalar", "float", "d = v (fp32 immediate)."),
    _i("fmov", 0x31, "d:freg:A:reg-w a:freg:B:reg-r", "fscalar", "float", "d = a."),
    _i("fadd", 0x32, "d:freg:A:reg-w a:freg:B:reg-r b:freg:C:reg-r", "fscalar", "float",
       "d = a + b."),
    _i("fsub", 0x33, "d:freg:A:reg-w a:freg:B:reg-r b:freg:C:reg-r", "fscalar", "float",
       "d = a - b."),
    _i("fmul", 0x34, "d:freg:A:reg-w a:freg:B:reg-r b:freg:C:reg-r", "fscalar", "float",
       "d = a * b."),
    _i("fmax", 0x35, "d:freg:A:reg-w a:freg:B:reg-r b:freg:C:reg-r", "fscalar", "float",
       "d = max(a, b)."),
    _i("fmin", 0x36, "d:freg:A:reg-w a:freg:B:reg-r b:freg:C:reg-r", "fscalar", "float",
       "d = min(a, b)."),
    _i("fdiv", 0x37, "d:freg:A:reg-w a:freg:B:reg-r b:freg:C:reg-r", "fspecial", "float",
       "d = a / b."),
    _i("fexp", 0x38, "d:freg:A:reg-w a:freg:B:reg-r", "fspecial", "float", "d = exp(a)."),
    _i("frsqrt", 0x39, "d:freg:A:reg-w a:freg:B:reg-r", "fspecial", "float", "d = 1 / sqrt(a)."),
    _i("fsqrt", 0x3A, "d:freg:A:reg-w a:freg:B:reg-r", "fspecial", "float", "d = sqrt(a)."),
    _i("flw", 0x3B, "d:freg:A:reg-w a:ireg:B:reg-r v:imm:I:imm", "fscalar", "float",
       "d = the fp32 at SRAM byte address a + v (4-byte aligned)."),
    _i("fsw", 0x3C, "s:freg:A:reg-r a:ireg:B:reg-r v:imm:I:imm", "fscalar", "float",
       "Store s as fp32 at SRAM byte address a + v (4-byte aligned)."),
    _i("itof", 0x3D, "d:freg:A:reg-w a:ireg:B:reg-r", "fscalar", "float", "d = float(a)."),
    _i("ftoi", 0x3E, "d:iregw:A:reg-w a:freg:B:reg-r", "fscalar", "float",
       "d = int(a), rounded toward zero."),
    # -- descriptors --------------------------------------------------------------------------
    _i("dmem", 0x40, "d:dreg:A:reg-w t:dtype:B:imm addr:u16:IL:imm len:u16:IH:imm",
       "scalar", "descriptor",
       "d = SRAM operand of len elements of type t at byte address addr, stride 1, count 1."),
    _i("dfin", 0x41, "d:dreg:A:reg-w t:dtype:B:imm c:color:C:imm len:imm:I:imm",
       "scalar", "descriptor",
       "d = fabric input: len elements of type t received on color c."),
    _i("dfout", 0x42, "d:dreg:A:reg-w t:dtype:B:imm c:color:C:imm len:imm:I:imm",
       "scalar", "descriptor",
       "d = fabric output: len elements of type t sent on color c."),
    _i("dstride", 0x43, "d:dreg:A:reg-rw v:imm:I:imm", "scalar", "descriptor",
       "Set the inner stride of SRAM descriptor d to v elements."),
    _i("d2d", 0x44, "d:dreg:A:reg-rw n:u16:IL:imm s:s16:IH:imm", "scalar", "descriptor",
       "Give SRAM descriptor d an outer dimension: n rows of len elements, s elements apart."),
    _i("daddr", 0x45, "d:dreg:A:reg-rw a:ireg:B:reg-r v:imm:I:imm", "scalar", "descriptor",
       "Set the byte address of SRAM descriptor d to a + v."),
    _i("dlen", 0x46, "d:dreg:A:reg-rw a:ireg:B:reg-r", "scalar", "descriptor",
       "Set the (inner) length of descriptor d to a elements."),
    # -- tensor elementwise (any operand may be a fabric descriptor) --------------------------
    _i("vmov", 0x50, "d:dreg:A:dsd-w a:dreg:B:dsd-r", "move", "tensor",
       "d = a, converting between dtypes; with fabric operands this is send or receive."),
    _i("vfill", 0x51, "d:dreg:A:mem-w s:freg:B:reg-r", "move", "tensor",
       "d = s for every element."),
    _i("vadd", 0x52, "d:dreg:A:dsd-w a:dreg:B:dsd-r b:dreg:C:dsd-r", "add", "tensor",
       "d = a + b."),
    _i("vsub", 0x53, "d:dreg:A:dsd-w a:dreg:B:dsd-r b:dreg:C:dsd-r", "add", "tensor",
       "d = a - b."),
    _i("vmul", 0x54, "d:dreg:A:dsd-w a:dreg:B:dsd-r b:dreg:C:dsd-r", "mul", "tensor",
       "d = a * b."),
    _i("vmax", 0x55, "d:dreg:A:dsd-w a:dreg:B:dsd-r b:dreg:C:dsd-r", "max", "tensor",
       "d = max(a, b)."),
    _i("vmin", 0x56, "d:dreg:A:dsd-w a:dreg:B:dsd-r b:dreg:C:dsd-r", "max", "tensor",
       "d = min(a, b)."),
    _i("vadds", 0x57, "d:dreg:A:dsd-w a:dreg:B:dsd-r s:freg:C:reg-r", "add", "tensor",
       "d = a + s."),
    _i("vmuls", 0x58, "d:dreg:A:dsd-w a:dreg:B:dsd-r s:freg:C:reg-r", "mul", "tensor",
       "d = a * s."),
    _i("vfma", 0x59, "d:dreg:A:mem-rw a:dreg:B:dsd-r s:freg:C:reg-r", "fmac", "tensor",
       "d = d + a * s (axpy)."),
    _i("vexp", 0x5A, "d:dreg:A:dsd-w a:dreg:B:dsd-r", "special", "tensor", "d = exp(a)."),
    _i("vgelu", 0x5B, "d:dreg:A:dsd-w a:dreg:B:dsd-r", "special", "tensor",
       "d = gelu(a), tanh approximation."),
    _i("vgelue", 0x5C, "d:dreg:A:dsd-w a:dreg:B:dsd-r", "special", "tensor",
       "d = gelu(a), exact (erf)."),
    _i("vsilu", 0x5D, "d:dreg:A:dsd-w a:dreg:B:dsd-r", "special", "tensor", "d = a * sigmoid(a)."),
    _i("vrsqrt", 0x5E, "d:dreg:A:dsd-w a:dreg:B:dsd-r", "special", "tensor", "d = 1 / sqrt(a)."),
    _i("vtanh", 0x5F, "d:dreg:A:dsd-w a:dreg:B:dsd-r", "special", "tensor", "d = tanh(a)."),
    # -- reductions ---------------------------------------------------------------------------
    _i("rsum", 0x60, "d:freg:A:reg-w a:dreg:B:dsd-r", "add", "reduce",
       "d = sum of a, in element order, fp32."),
    _i("rmax", 0x61, "d:freg:A:reg-w a:dreg:B:dsd-r", "max", "reduce", "d = max of a."),
    _i("rdot", 0x62, "d:freg:A:reg-w a:dreg:B:dsd-r b:dreg:C:dsd-r", "fmac", "reduce",
       "d = sum of a * b, in element order, fp32 accumulation."),
    # -- matrix -------------------------------------------------------------------------------
    _i("mv", 0x70, "y:dreg:A:mem-w w:dreg:B:mem-r x:dreg:C:mem-r", "fmac", "matrix",
       "y = W x: W is a column-major tile (len = rows, count = columns), fp32 accumulation."),
    _i("mva", 0x71, "y:dreg:A:mem-rw w:dreg:B:mem-r x:dreg:C:mem-r", "fmac", "matrix",
       "y = y + W x (as mv)."),
    _i("mm", 0x72, "c:dreg:A:mem-w a:dreg:B:mem-r b:dreg:C:mem-r", "fmac", "matrix",
       "C = A B: column-major tiles, A (M x K), B (K x N), C (M x N), fp32 accumulation."),
    _i("mma", 0x73, "c:dreg:A:mem-rw a:dreg:B:mem-r b:dreg:C:mem-r", "fmac", "matrix",
       "C = C + A B (as mm)."),
    # -- off-chip memory (HBM) ----------------------------------------------------------------
    _i("dmald", 0x80, "d:dreg:A:mem-w a:ireg:B:reg-r t:u16:IL:imm", "dma", "memory",
       "Start copying the raw bytes of contiguous SRAM descriptor d from HBM byte address a "
       "(tag t, 0..7); asynchronous: dmawait t before using them."),
    _i("dmast", 0x81, "d:dreg:A:mem-r a:ireg:B:reg-r t:u16:IL:imm", "dma", "memory",
       "Start copying the raw bytes of contiguous SRAM descriptor d to HBM byte address a "
       "(tag t, 0..7); asynchronous: dmawait t before reusing the buffer."),
    _i("dmawait", 0x82, "t:u16:IL:imm", "scalar", "memory",
       "Wait until every DMA of this PE with tag t (0..7) is complete."),
)
N_DMA_TAGS = 8  # DMA tags per PE (dmald/dmast/dmawait t < N_DMA_TAGS)

BY_MNEMONIC = {ins.mnemonic: ins for ins in INSTRUCTIONS}
BY_OPCODE = {ins.opcode: ins for ins in INSTRUCTIONS}


def simd_key(cost: str, dtypes: tuple[int, ...]) -> str:
    """The machine SIMD-width key for a tensor op of cost class `cost` over its descriptor dtypes.

    Any fp32 operand makes an op an fp32 op; an fmac whose operands mix 16-bit and fp32 types is
    'mixed' (Cerebras @fmachs: fp16 in, fp32 accumulate); all 16-bit is the f16 width (bf16 shares
    it); a move between different dtypes is a conversion.
    """
    if cost == "special":
        return "special"
    all32 = all(d == DTYPES["f32"] for d in dtypes)
    any32 = any(d == DTYPES["f32"] for d in dtypes)
    if cost == "fmac":
        return "fmac_f32" if all32 else ("fmac_mixed" if any32 else "fmac_f16")
    if cost == "move" and len(set(dtypes)) > 1:
        return "convert"
    return f"{cost}_{'f32' if any32 else 'f16'}"


SIMD_KEYS = ("move_f32", "move_f16", "convert", "add_f32", "add_f16", "mul_f32", "mul_f16",
             "max_f32", "max_f16", "fmac_f32", "fmac_mixed", "fmac_f16", "special")


class SpecError(Exception):
    pass


def check_table(instructions=INSTRUCTIONS) -> None:
    """Raise SpecError if the table is inconsistent (riscv-opcodes style checks)."""
    seen_ops: dict[int, str] = {}
    seen_names: set[str] = set()
    for ins in instructions:
        where = f"instruction {ins.mnemonic!r}"
        if not ins.mnemonic.isidentifier() or ins.mnemonic != ins.mnemonic.lower():
            raise SpecError(f"{where}: mnemonic must be a lower-case identifier")
        if ins.mnemonic in seen_names:
            raise SpecError(f"{where}: mnemonic defined twice")
        seen_names.add(ins.mnemonic)
        if not 0 <= ins.opcode < (1 << len(OPCODE_BITS)):
            raise SpecError(f"{where}: opcode {ins.opcode:#x} does not fit {len(OPCODE_BITS)} bits")
        if ins.opcode in seen_ops:
            raise SpecError(f"{where}: opcode {ins.opcode:#x} already used by {seen_ops[ins.opcode]!r}")
        seen_ops[ins.opcode] = ins.mnemonic
        if ins.cost not in COST_CLASSES:
            raise SpecError(f"{where}: unknown cost class {ins.cost!r}")
        if ins.group not in GROUPS:
            raise SpecError(f"{where}: unknown group {ins.group!r}")
        if not ins.doc or not ins.doc.endswith("."):
            raise SpecError(f"{where}: needs a one-line doc ending with a period")
        used_bits = set(OPCODE_BITS)
        names = set()
        for op in ins.operands:
            if len(op) != 3:
                raise SpecError(f"{where}: operand {op!r} must be name:kind:slot")
            name, kind, slot = op
            if name in names:
                raise SpecError(f"{where}: operand name {name!r} used twice")
            names.add(name)
            if kind not in OPERAND_KINDS:
                raise SpecError(f"{where}: unknown operand kind {kind!r}")
            if slot not in SLOTS:
                raise SpecError(f"{where}: unknown slot {slot!r}")
            if slot not in KIND_SLOTS[kind]:
                raise SpecError(f"{where}: operand kind {kind!r} cannot sit in slot {slot}")
            bits = set(SLOTS[slot].bits)
            if bits & used_bits:
                raise SpecError(f"{where}: operand {name!r} overlaps bits already assigned")
            used_bits |= bits
        if len(ins.roles) != len(ins.operands):
            raise SpecError(f"{where}: every operand needs a role (name:kind:slot:role)")
        for (name, kind, _slot), role in zip(ins.operands, ins.roles):
            if role not in ROLES:
                raise SpecError(f"{where}: operand {name!r} has unknown role {role!r}")
            if role not in KIND_ROLES[kind]:
                raise SpecError(f"{where}: a {kind} operand cannot have role {role!r}")
            if role in DATA_ROLES and ins.group not in DATA_GROUPS:
                raise SpecError(f"{where}: only {'/'.join(DATA_GROUPS)} instructions reach "
                                f"data through a descriptor (operand {name!r})")
        written = [r for r in ins.roles if r in DATA_ROLES and r.endswith("w")]
        if len(written) > 1 or len(ins.sources) > 2:
            raise SpecError(f"{where}: at most one destination and two source descriptors")
        if ins.is_tensor and ins.cost in SCALAR_CLASSES + ("dma",):
            raise SpecError(f"{where}: tensor ops need a tensor cost class")

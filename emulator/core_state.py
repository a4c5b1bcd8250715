"""The Numba core's state: field indices, per-instruction tables and the arrays of one run.

Everything the jitted loop touches is a plain NumPy array allocated here and passed explicitly
(DESIGN.md section 6), grouped in a few named parts (namedtuples of arrays, which Numba passes
as one argument and reads by attribute; see PARTS below). Small records are rows of 2-D int64
tables with named columns (a PE, a delivery, a message) so that one record sits in one or two
cache lines.

Instructions are dispatched on *semantic ids* of our own (S_*, emulator/core_ops.py), mapped
from the mnemonics of isa.spec when the code table is decoded (decode_table).
"""

from __future__ import annotations

import os
import sys
import weakref
from collections import namedtuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from wse_emu.emulator.load import Loaded, pipe_ticks_per_wavelet
from wse_emu.emulator.result import LOOP_PARTS  # (ticks, count) each in the counters
from wse_emu.isa.costs import products_by_column
from wse_emu.isa.spec import (COST_CLASSES, DTYPES, FIXED_CLASSES, INSTRUCTIONS, N_DMA_TAGS, N_DREGS,
                      N_FREGS, SIMD_KEYS, SPECIAL_IREGS, simd_key)

# Semantic ids and the mnemonic -> (id, sub-code) table: emulator/core_ops.py (derived from
# isa/spec.py), imported here for the modules that take the core's constants from this one.
from wse_emu.emulator.core_ops import (  # noqa: F401
    S_ADD, S_ADDI, S_AND, S_ANDI, S_BEQ, S_BGE, S_BINARY, S_BINSCALAR, S_BLT, S_BNE, S_D2D,
    S_DADDR, S_DESC, S_DFIN, S_DFOUT, S_DIV, S_DLEN, S_DMA, S_DMALD, S_DMAST, S_DMAWAIT, S_DMEM,
    S_DSTRIDE, S_FADD, S_FDIV, S_FEXP, S_FILL, S_FLI, S_FLOAT, S_FLW, S_FMA, S_FMAX, S_FMIN,
    S_FMOV, S_FMUL, S_FRSQRT, S_FSQRT, S_FSUB, S_FSW, S_FTOI, S_HALT, S_ITOF, S_JMP, S_LI, S_LW,
    S_MATRIX, S_MM, S_MMA, S_MOV, S_MUL, S_MULI, S_MV, S_MVA, S_NOP, S_OR, S_RDOT, S_REM, S_RMAX,
    S_RSUM, S_SHLI, S_SHRI, S_SLT, S_SUB, S_SW, S_TENSOR, S_UNARY, S_XOR, SEMANTICS)

# ---------------------------------------------------------------------------------------------
# Columns of the decoded code table (one row per instruction of every region).
C_SEM, C_SUB, C_CLASS, C_COST, C_A, C_B, C_C, C_IMM, C_IL, C_IH = range(10)
N_CODE_COLS = 10

# Columns of the per-PE table.
# P_HULL_LO/HI: the span of its SRAM the PE has written so far (empty when equal), whose
# original contents are in the undo log, for an exact replay (core.py).
# P_FABRIC: bit r set when descriptor r is a fabric input, bit FABOUT_BIT + r when a fabric
# output, so that finding a PE's next fabric operation needs no descriptor loads.
# P_SRAM0: byte offset of the PE's SRAM in the flat SRAM arrays (Loaded.sram_base; negative
# for a PE without SRAM in timing-only mode, which then has no scalar memory access).
# P_SRAM_LEN: its size, the footprint of its region: every address check's limit.
# Timing-only mode: P_FTAINT has bit r set while f register r holds an unknown value (one
# computed from data); unknown SRAM words are marked in State.unknown (Loaded.unknown).
# P_DMASTALL: cycles waited in dmawait; P_TAG0 + t: the cycle DMA tag t's transfers complete.
# P_PENDING: 1 + the number of the PE's tile product still on the helper's ring, or 0
# (core_jobs).
(P_PC, P_CLOCK, P_STATUS, P_WAIT, P_DONE, P_INSTR, P_BUSY, P_RSTALL, P_BPSTALL, P_FAULT,
 P_CODE0, P_CODELEN, P_HULL_LO, P_HULL_HI, P_FABRIC, P_SRAM0, P_SRAM_LEN,
 P_FTAINT, P_DMASTALL, P_PENDING) = range(20)
P_TAG0 = 20
N_PE_COLS = P_TAG0 + N_DMA_TAGS
FABOUT_BIT = N_DREGS

# Descriptor registers: dsd[pe, reg] is eight int32 words (32 bytes a register, 512 a PE of
# 16), read and written only through the accessors below (d_kind ... set_2d). The fields and
# what they can hold (isa/spec.py's operand kinds; the reference keeps them as Python ints):
# kind (0-2), dtype and color (8-bit slots) share the word D_TYPE, a byte each; stride (a
# 32-bit immediate) and count (u16) are stored XOR 1, so that the empty descriptor (memory,
# length 0, stride 1, count 1) is all zeros and a fresh table needs no reset; cstride (u16,
# s16 or a 32-bit immediate); address and length take two words each, low then high, as
# daddr and dlen copy any int64 from a register (only the SRAM's range is valid, but a
# larger value must fault as the reference's does, not wrap to a valid one). DMA's HBM
# address is a register operand, not a descriptor field.
D_TYPE, D_STRIDE, D_COUNT, D_CSTRIDE, D_ADDR, D_ADDR_HI, D_LEN, D_LEN_HI = range(8)
N_DSD_WORDS = 8


def _wide_ptr(context, builder, sig, args):
    """An int64 pointer to words lo, lo + 1 of dsd[p, r] (non-negative indices)."""
    aryty = sig.args[0]
    ary = context.make_array(aryty)(context, builder, args[0])
    index = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:4], sig.args[1:4])]
    ptr = cgutils.get_item_pointer(context, builder, aryty, ary, index, wraparound=False)
    return builder.bitcast(ptr, ir.IntType(64).as_pointer())


def _descriptor_table(dsd) -> bool:
    return isinstance(dsd, types.Array) and dsd.dtype == types.int32 and dsd.ndim == 3


# Address and length are read and written as one int64 each (the low word first: this host is
# little-endian). Combining two int32 loads instead, LLVM's code for the loop's tensor ops ran
# 1.4x slower on programs/stress for 3 % more instructions.
assert sys.byteorder == "little"


@intrinsic
def _wide(typingctx, dsd, p, r, lo):
    """Words lo, lo + 1 of dsd[p, r] as one int64."""
    if not _descriptor_table(dsd):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_wide_ptr(context, builder, sig, args), align=4)
    return types.int64(dsd, p, r, lo), codegen


@intrinsic
def _set_wide(typingctx, dsd, p, r, lo, v):
    """Words lo, lo + 1 of dsd[p, r] = the int64 v."""
    if not _descriptor_table(dsd) or not isinstance(v, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        value = context.cast(builder, args[4], sig.args[4], types.int64)
        builder.store(value, _wide_ptr(context, builder, sig, args), align=4)
        return context.get_dummy_value()
    return types.void(dsd, p, r, lo, v), codegen


@njit(cache=True, inline="always")
def d_kind(dsd, p, r):
    """DSD_MEM, DSD_FABIN or DSD_FABOUT."""
    return dsd[p, r, D_TYPE] & 0xFF


@njit(cache=True, inline="always")
def d_dtype(dsd, p, r):
    return (dsd[p, r, D_TYPE] >> 8) & 0xFF


@njit(cache=True, inline="always")
def d_color(dsd, p, r):
    return dsd[p, r, D_TYPE] >> 16


@njit(cache=True, inline="always")
def d_addr(dsd, p, r):
    return _wide(dsd, p, r, D_ADDR)


@njit(cache=True, inline="always")
def d_len(dsd, p, r):
    return _wide(dsd, p, r, D_LEN)


@njit(cache=True, inline="always")
def d_stride(dsd, p, r):
    return np.int64(dsd[p, r, D_STRIDE] ^ 1)


@njit(cache=True, inline="always")
def d_count(dsd, p, r):
    return np.int64(dsd[p, r, D_COUNT] ^ 1)


@njit(cache=True, inline="always")
def d_cstride(dsd, p, r):
    return np.int64(dsd[p, r, D_CSTRIDE])


@njit(cache=True, inline="always")
def set_descriptor(dsd, p, r, kind, dtype, color, addr, n, cstride):
    """Descriptor r of PE p = a new one (dmem, dfin, dfout): stride 1, count 1."""
    dsd[p, r, D_TYPE] = np.int32(kind | (dtype << 8) | (color << 16))
    dsd[p, r, D_STRIDE] = 0  # 1 ^ 1
    dsd[p, r, D_COUNT] = 0
    dsd[p, r, D_CSTRIDE] = np.int32(cstride)
    _set_wide(dsd, p, r, D_ADDR, addr)
    _set_wide(dsd, p, r, D_LEN, n)


@njit(cache=True, inline="always")
def set_addr(dsd, p, r, addr):
    _set_wide(dsd, p, r, D_ADDR, addr)


@njit(cache=True, inline="always")
def set_len(dsd, p, r, n):
    _set_wide(dsd, p, r, D_LEN, n)


@njit(cache=True, inline="always")
def set_stride(dsd, p, r, stride):
    dsd[p, r, D_STRIDE] = np.int32(stride ^ 1)


@njit(cache=True, inline="always")
def set_2d(dsd, p, r, count, cstride):
    dsd[p, r, D_COUNT] = np.int32(count ^ 1)
    dsd[p, r, D_CSTRIDE] = np.int32(cstride)


def descriptor(dsd: np.ndarray, p: int, r: int) -> tuple[int, ...]:
    """Descriptor r of PE p as the reference keeps it: (kind, addr, len, stride, count,
    cstride, dtype, color), Python ints (for the driver and tests, outside the loop)."""
    w = [int(v) for v in dsd[p, r]]
    wide = [(w[i + 1] << 32) | (w[i] & 0xFFFFFFFF) for i in (D_ADDR, D_LEN)]
    return (w[D_TYPE] & 0xFF, wide[0], wide[1], w[D_STRIDE] ^ 1, w[D_COUNT] ^ 1,
            w[D_CSTRIDE], (w[D_TYPE] >> 8) & 0xFF, w[D_TYPE] >> 16)

# Input queue per (PE, color) slot: first and last delivery, wavelets queued (0 = empty,
# and then first and last mean nothing: no delivery is empty).
Q_FIRST, Q_LAST, Q_QUEUED = range(3)

# Route trees: per (PE, color) slot its first entry (-1 = none), entries and RAMP deliveries;
# per entry the link it reserves, the entry it leaves from (-1 = the source router) and the
# PE a RAMP entry delivers to, or -1 for a router-to-router link, or E_PIPE0 - pipe for a
# system link into that pipe (load.link_pipes): a send tells the three apart in the branch it
# takes anyway, so one chip's sends cost what they did before systems (no extra column).
T_START, T_COUNT, T_NDEST = range(3)
E_LINK, E_PARENT, E_DEST = range(3)
E_PIPE0 = -2

# A delivery of a message to one input queue. DL_NEXT chains a queue, or the free records.
# Records are taken from the free list, else from the never-used ones above K_DL_USED.
DL_MSG, DL_HEAD, DL_TAIL, DL_CONSUMED, DL_NEXT, DL_BP, DL_LEN = range(7)
N_DL_COLS = 7

# A message: its payload in the shared pool, the sender, backpressure bookkeeping, the
# deliveries not yet consumed (0 = free record; M_NEXT chains the free records).
M_OFF, M_LEN, M_SENDER, M_BP_PENDING, M_BP_RELEASE, M_REFS, M_NEXT = range(7)
N_MSG_COLS = 7

# Undo log entries: the first uint16 word of SRAM saved, how many, where in the log's data.
U_START, U_LEN, U_OFF = range(3)

# Links: first free cycle, wavelets carried. The system's pipes (docs/timing-model.md,
# "Systems: links between chips") are the rows after the fabric's links (from MP_PIPE_BASE):
# first free tick (1/load.PIPE_TICKS cycle), wavelets crossed.
L_FREE, L_WAVELETS = range(2)

# The scheduler's heap holds keys clock << MP_PE_BITS | PE: one int64 compare orders them by
# (clock, PE), and the heap is half the size of (clock, PE) pairs.
MAX_KEY_BITS = 62

# Run parameters (int64 vector).
# MP_UNDO: log the original contents of written SRAM (for a replay in strict order).
# MP_TIMING: timing-only mode (no data moves or is computed; cycles as in functional mode).
# MP_ASYNC: tile products go to the helper thread's ring (core_jobs) instead of running at once.
# MP_HBM_*: the program's HBM size (the DMA range limit), latency, channels and interleave.
# MP_BY_COLUMN: tile products issue one op a column (isa.costs.products_by_column).
# MP_PIPE_*: the system pipes' first row in the link table, ticks per wavelet, latency.
# MP_HBM_CHIP: bytes of one GPU's HBM when every GPU of a system has its own (0: one shared
# HBM); MP_CHIP_H: fabric rows a chip.
(MP_ISSUE, MP_HOP, MP_RAMP, MP_QDEPTH, MP_COLORS, MP_MAX_CYCLES, MP_STRICT, MP_TRACE_CAP,
 MP_UNDO, MP_PE_BITS, MP_TIMING, MP_HBM_BYTES, MP_HBM_LAT, MP_HBM_CH, MP_HBM_IL,
 MP_ASYNC, MP_BY_COLUMN, MP_PIPE_BASE, MP_PIPE_TPW, MP_PIPE_LAT, MP_HBM_CHIP,
 MP_CHIP_H, MP_HBM_HOST) = range(23)
N_MP = 23

# HBM channels (State.hbm_ch rows): first free time and time spent transferring, in ticks of
# 1/HBM_TICKS cycle (exact sums of many short transfers; emulator/reference.py does the same).
H_FREE, H_BUSY = range(2)
HBM_TICKS = 1024

# The helper's ring (core_jobs): per job its state, number, PE, semantic id, the PE's SRAM
# offset, shape (rows and columns of W, columns of X, elements of Y), then copies of the
# descriptors of y, w and x (J_DSD: 3 x 8 int32 words in 12 columns); 24 columns, three cache
# lines.
J_STATE, J_SEQ, J_P, J_SEM, J_BASE, J_MROWS, J_KCOLS, J_NCOLS, J_TOTAL = range(9)
J_DSD = 9
N_JOB_COLS = 24
J_FREE, J_READY, J_CLAIMED, J_DONE = range(4)
# The ring's control words, one cache line each (the loop writes the head, the helper polls it):
# jobs published, stop, jobs the loop ran itself, jobs the helper ran; the helper's progress
# (every job numbered below it is done, CT_DONE, written by the helper) and the loop's own copy
# of it as last read (CT_SEEN, a line the helper never touches); 1 once the helper has
# stopped touching the run's arrays (CT_OUT, core.py waits for it after setting CT_STOP).
CT_HEAD, CT_STOP, CT_STOLEN, CT_HELPED, CT_DONE, CT_SEEN, CT_OUT = range(0, 56, 8)
N_CT = 56

# Counters and requests between the jitted loop and the driver (int64 vector).
# The instruction count of cost class i is counters[K_CLASS0 + i].
# Records: head and length of the free list, records ever used (the rest are fresh zeros).
# Undo log: entries and uint16 words used.
# K_QUEUED: wavelets in all input queues (0 at a run's end: the next run need not reset them).
(K_MESSAGES, K_WAVELETS, K_HOPS, K_POOL_TOP, K_DL_HEAD, K_DL_NFREE, K_DL_USED, K_MSG_HEAD,
 K_MSG_NFREE, K_MSG_USED, K_TRACE_N, K_HEAP_N, K_NEED, K_NEED_AMOUNT, K_OUTCOME, K_FAULT_PE,
 K_FAULT_REASON, K_INSTR_TOTAL, K_UNDO_N, K_UNDO_TOP, K_HBM_READ, K_HBM_WRITE, K_HALTED,
 K_QUEUED, K_CLASS0) = range(25)
# The counting build (WSE_EMU_COUNT=loop, read once at import; emulator/jit_cache.py keeps its
# machine code apart): run_slice reads the host's cycle counter around every step and every
# heap update and adds the ticks and counts here, per kind of work (LOOP_PARTS); core.py
# reports them as RunResult.loop_profile. The default build compiles none of it.
COUNT_LOOP = "loop" in {f.strip() for f in os.environ.get("WSE_EMU_COUNT", "").split(",")}
LOOP_FIRST, LOOP_TENSOR, LOOP_SCALAR, LOOP_HEAP = range(len(LOOP_PARTS))
K_LOOP0 = K_CLASS0 + len(COST_CLASSES)
K_LOOP_ALL = K_LOOP0 + 2 * len(LOOP_PARTS)  # ticks of whole visits, heap update included
N_K = K_LOOP_ALL + 1

# What an executor tells the scheduler: carry on with this PE / it left the runnable set
# (halted or blocked) / it faulted / something must grow first (nothing was changed).
X_OK, X_STOP, X_FAULT, X_GROW = range(4)

# What the driver must grow before re-entering (K_NEED).
NEED_NONE, NEED_SCRATCH, NEED_RECORDS, NEED_POOL, NEED_TRACE, NEED_UNDO = range(6)

# SIMD width variants chosen by isa.spec.simd_key's rule (see core_exec.simd_variant). The
# class table holds, per cost class, the machine's width for each variant and the class's rule.
V_F32, V_F16, V_MIXED, V_CONVERT, V_SPECIAL = range(5)
N_VARIANTS = 5
CL_KIND = N_VARIANTS
# What kind of rule a cost class follows.
CK_PLAIN, CK_MOVE, CK_FMAC, CK_SPECIAL, CK_SCALAR = range(5)

# ---------------------------------------------------------------------------------------------
# The parts the jitted code takes (core_sched.run_slice(const, sched, mem, fab, far, ...)): each
# a namedtuple of arrays, built by State.parts from the State's attributes of the same names.
# A new array is one field here and one attribute set in State.__init__ (or State.grow).
# Const: read-only within a slice: the decoded code, the cost classes' widths, the run's
# parameters (MP_*; the driver changes MP_ASYNC between slices only).
Const = namedtuple("Const", ["code", "classes", "mp"])
# Sched: per PE its row (P_*), registers and descriptors; the scheduler's heap and the PEs a
# step woke; the counters and requests (K_*), the trace, the tensor ops' fp32 scratch rows.
Sched = namedtuple("Sched", ["pe", "ireg", "freg", "dsd", "heap", "wake", "counters", "trace",
                             "scratch"])
# Mem: the SRAM (three views of the same bytes), the timing-only unknown-word map, the undo
# log. Executors write SRAM only through the gateway (core_sram), which keeps the log, the
# unknown map and the helper's ring in step.
Mem = namedtuple("Mem", ["sram_f32", "sram_u16", "sram_i32", "unknown", "undo", "undo_data"])
# Fabric: route trees (per (PE, color) slot and per entry) and a sender's scratch of arrival
# times, the input queues, links (then the system's pipes), delivery and message records,
# the payload pool, the send hints the scheduler prefetches.
Fabric = namedtuple("Fabric", ["tree_of", "tree", "tree_tmp", "queue", "link", "dl", "msg",
                               "payload", "send_hint"])
# Far: the HBM, its channels and rate, and the helper thread's ring (core_jobs).
Far = namedtuple("Far", ["hbm", "hbm_ch", "hbm_rate", "jobs", "jdsd", "ctl"])
PARTS = (Const, Sched, Mem, Fabric, Far)


F32, F16 = DTYPES["f32"], DTYPES["f16"]
_REPRESENTATIVE = {V_F32: (F32,), V_F16: (F16,), V_MIXED: (F32, F16), V_CONVERT: (F32, F16),
                   V_SPECIAL: (F32,)}


def class_kinds() -> np.ndarray:
    """CK_* per cost class (order of COST_CLASSES)."""
    kinds = []
    for name in COST_CLASSES:
        if name in FIXED_CLASSES:
            kinds.append(CK_SCALAR)
        else:
            kinds.append({"move": CK_MOVE, "fmac": CK_FMAC, "special": CK_SPECIAL}.get(name,
                                                                                   CK_PLAIN))
    return np.array(kinds, dtype=np.int64)


def simd_key_table() -> np.ndarray:
    """(classes, variants) -> index into SIMD_KEYS (-1 for scalar classes)."""
    table = np.full((len(COST_CLASSES), N_VARIANTS), -1, dtype=np.int64)
    for ci, name in enumerate(COST_CLASSES):
        if name in FIXED_CLASSES:
            continue
        for v, dts in _REPRESENTATIVE.items():
            table[ci, v] = SIMD_KEYS.index(simd_key(name, dts))
    return table


def class_table(loaded: Loaded) -> np.ndarray:
    """(classes, N_VARIANTS + 1): the machine's SIMD width per variant (1 where a class has
    none), then the class's CK_* rule."""
    widths = np.array([loaded.machine.simd_width(k) for k in SIMD_KEYS], dtype=np.int64)
    keys = simd_key_table()
    table = np.zeros((len(COST_CLASSES), N_VARIANTS + 1), dtype=np.int64)
    table[:, :N_VARIANTS] = np.where(keys >= 0, widths[np.maximum(keys, 0)], 1)
    table[:, CL_KIND] = class_kinds()
    return table


def _slots_of(kind: str) -> np.ndarray:
    """Per opcode, a mask of the operand slots (bit 0 A, 1 B, 2 C) of operand kind `kind`."""
    mask = np.zeros(256, dtype=np.int64)
    for ins in INSTRUCTIONS:
        for _name, k, slot in ins.operands:
            if k == kind:
                mask[ins.opcode] |= 1 << "ABC".index(slot)
    return mask


_DREG_SLOTS = _slots_of("dreg")
_WRITES_IREG = _slots_of("iregw")  # writable integer registers (the specials are "ireg")
_NAMES_FREG = _slots_of("freg")  # f registers, read or written


def _named(loaded: Loaded, slots: np.ndarray) -> np.ndarray:
    """The sorted registers that the code names in the operand slots `slots[opcode]` marks."""
    op = np.asarray(loaded.code_op, dtype=np.int64)
    mask = slots[op]
    named = [np.asarray(regs, dtype=np.int64)[(mask & bit) != 0]
             for bit, regs in ((1, loaded.code_a), (2, loaded.code_b), (4, loaded.code_c))]
    return np.unique(np.concatenate(named))


def dregs_used(loaded: Loaded) -> int:
    """1 + the highest descriptor register the code names (at least 1): the loop indexes the
    descriptor table only with registers taken from the code (the loader checked them)."""
    named = _named(loaded, _DREG_SLOTS)
    return max(1, min(int(named[-1]) + 1 if named.size else 0, N_DREGS))


def decode_table(loaded: Loaded) -> np.ndarray:
    """The code of every region as (n_instr, N_CODE_COLS) int64 rows."""
    m = loaded.machine
    sem = np.zeros(256, dtype=np.int64)
    sub = np.zeros(256, dtype=np.int64)
    cls = np.zeros(256, dtype=np.int64)
    cost = np.zeros(256, dtype=np.int64)
    for ins in INSTRUCTIONS:
        sem[ins.opcode], sub[ins.opcode] = SEMANTICS[ins.mnemonic]
        cls[ins.opcode] = list(COST_CLASSES).index(ins.cost)
        cost[ins.opcode] = (m.special_scalar_cycles if ins.cost == "fspecial" else
                            m.issue_overhead if ins.cost == "dma" else m.scalar_cycles)
    op = np.asarray(loaded.code_op, dtype=np.int64)
    code = np.zeros((len(op), N_CODE_COLS), dtype=np.int64)
    code[:, C_SEM], code[:, C_SUB], code[:, C_CLASS], code[:, C_COST] = sem[op], sub[op], \
        cls[op], cost[op]
    code[:, C_A], code[:, C_B], code[:, C_C] = loaded.code_a, loaded.code_b, loaded.code_c
    code[:, C_IMM], code[:, C_IL], code[:, C_IH] = loaded.code_imm, loaded.code_il, loaded.code_ih
    return code


def send_hints(loaded: Loaded) -> np.ndarray:
    """Per PE, the (PE, color) slot of its first route tree (by color) and the input-queue slot
    of that tree's first receiving PE, -1 where there is none: what the scheduler prefetches
    for the PE it will most likely run next (core_sched._prefetch_next), as a PE's fabric
    output usually goes out on that tree. int32, 8 bytes a PE, so the table stays in cache."""
    return _send_hints(loaded.tree_start, loaded.tree_count, loaded.tree_dest, loaded.colors,
                       loaded.n_pes)


@njit(cache=True)
def _send_hints(tree_start, tree_count, dest, colors, n):
    """send_hints in one pass over the slots (Llama-3-70B's 81 M slots and 129 M route
    entries: 0.1 s, where NumPy's passes over all entries took 2.7 s)."""
    hint = np.full((n, 2), -1, dtype=np.int32)
    for slot in range(tree_start.shape[0]):
        start = tree_start[slot]
        p = slot // colors
        if start < 0 or hint[p, 0] >= 0:  # (no tree, or not the PE's first)
            continue
        hint[p, 0] = slot
        for e in range(start, start + tree_count[slot]):
            if dest[e] >= 0:
                hint[p, 1] = dest[e] * colors + slot % colors
                break
    return hint


class Static:
    """What every run of a Loaded shares (built once per Loaded, see `static`): the tables no
    run changes, and the run's buffers, which a new run re-initialises in place. Fresh memory
    would cost a page fault per page touched, milliseconds for a 64 x 64 GEMV: more than the
    reset, and as much as a short run itself."""

    def __init__(self, loaded: Loaded):
        self.code = decode_table(loaded)
        self.classes = class_table(loaded)
        # the route tables and the input queues trees deliver to (the only ones a run can
        # write, so a reset skips the others), as the loader built them: int32, not copied
        self.tree_of, self.tree, self.queue_slots = loaded.tree_of, loaded.tree, loaded.queue_slots
        self.tree_width = max(1, int(loaded.tree_count.max(initial=0)))
        self.send_hint = send_hints(loaded)
        # the columns of the pe table a run starts from (the others start at 0)
        self.pe_start = np.stack([loaded.pe_code_start, loaded.pe_code_len, loaded.sram_base,
                                  loaded.sram_len]).astype(np.int64)
        self.dregs = dregs_used(loaded)
        # the integer registers an instruction can write (the others, the read-only specials
        # among them, keep the values a run starts with), and whether any f register is named
        self.ireg_written = _named(loaded, _WRITES_IREG)
        # a run resets those to 0 (none is a special: those are read-only), not to a new
        # Loaded.ireg_init (1.5 s on Llama-3-70B's 3.4 M PEs)
        self.ireg_zero = not np.isin(self.ireg_written, list(SPECIAL_IREGS.values())).any()
        self.uses_freg = _named(loaded, _NAMES_FREG).size > 0
        self.has_products = bool((self.code[:, C_SEM] >= S_MATRIX).any())  # (mv, mm ...)
        self.queues_empty = True  # the input queues hold nothing (the run's buffer, below)
        self.ring_settled = True  # no job of the helper's ring is ready or claimed (core.py)
        self.buffers: dict[str, np.ndarray] = {}

    def buffer(self, name: str, shape: tuple, dtype) -> np.ndarray:
        """The run buffer `name`: the one kept from an earlier run (pools may have grown),
        or a new zero-filled one."""
        if name not in self.buffers:
            self.buffers[name] = np.zeros(shape, dtype=dtype)
        return self.buffers[name]

    def zeroed(self, name: str, shape: tuple, dtype) -> np.ndarray:
        """The run buffer `name`, all zeros. A new one is zero already and left alone: its
        pages are mapped only when the run touches them, and most of a full-size program's
        input queues and links never are (host time and memory)."""
        if name in self.buffers:
            self.buffers[name][:] = 0
            return self.buffers[name]
        return self.buffer(name, shape, dtype)


_STATIC: dict[int, tuple] = {}


def static(loaded: Loaded) -> Static:
    """The Static of `loaded`, cached while it lives (benchmarks run one Loaded many times)."""
    hit = _STATIC.get(id(loaded))
    if hit is not None and hit[0]() is loaded:
        return hit[1]
    tables = Static(loaded)
    key = id(loaded)
    _STATIC[key] = (weakref.ref(loaded, lambda _ref: _STATIC.pop(key, None)), tables)
    return tables


class State:
    """All arrays of one run. Pools start small and grow (doubling) when the loop asks."""

    def __init__(self, loaded: Loaded, max_cycles: int | None, strict: bool, trace: bool,
                 trace_cap: int):
        m = loaded.machine
        n = loaded.n_pes
        fixed = static(loaded)
        self.fixed = fixed
        self.loaded = loaded
        self.code, self.classes = fixed.code, fixed.classes
        self.tree_of, self.tree = fixed.tree_of, fixed.tree
        self.send_hint = fixed.send_hint
        self.tree_tmp = fixed.buffer("tree_tmp", (fixed.tree_width, 2), np.int64)
        self.pe = fixed.buffer("pe", (n, N_PE_COLS), np.int64)
        _reset_pe(self.pe, fixed.pe_start)
        # registers as a run starts them: only those the code can change are reset (a 64 x 64
        # GEMV changes none: 0.7 MB of integer and 0.25 MB of float registers left alone)
        cols = fixed.ireg_written
        if "ireg" not in fixed.buffers:
            fixed.buffers["ireg"] = loaded.ireg_init  # (a new array each time it is read)
        elif cols.size and fixed.ireg_zero:
            _zero_columns(fixed.buffers["ireg"], cols)
        elif cols.size:
            fixed.buffers["ireg"][:, cols] = loaded.ireg_init[:, cols]
        self.ireg = fixed.buffers["ireg"]
        self.freg = (fixed.zeroed if fixed.uses_freg else fixed.buffer)("freg", (n, N_FREGS),
                                                                         np.float32)
        # only the descriptor registers the code names: a 64 x 64 GEMV uses 6 of the 16, and
        # the run resets, prefetches and misses on 6 lines a PE instead of 16
        # (int32 words, all zeros for the empty descriptor: a new table is left to the
        # kernel's zero pages, mapped as the run writes them)
        self.dsd = fixed.zeroed("dsd", (n, fixed.dregs, N_DSD_WORDS), np.int32)
        self.sram_f32 = loaded.sram.view(np.float32)
        self.sram_u16 = loaded.sram.view(np.uint16)
        self.sram_i32 = loaded.sram.view(np.int32)
        # timing-only: the unknown-word map, kept with the SRAM (a stand-in when functional)
        self.unknown = loaded.unknown if loaded.unknown.size else np.zeros(1, dtype=np.uint8)
        # the undo log: a run reads back only what it logged itself
        self.undo = fixed.buffer("undo", (2 * n + 64, 3), np.int64)
        self.undo_data = fixed.buffer("undo_data", (max(1 << 12, 64 * n),), np.uint16)
        self.mp = np.zeros(N_MP, dtype=np.int64)
        self.mp[MP_ISSUE] = m.issue_overhead
        self.mp[MP_BY_COLUMN] = int(products_by_column(m.kind))
        self.mp[MP_HOP] = m.hop_latency
        self.mp[MP_RAMP] = m.ramp_latency
        self.mp[MP_QDEPTH] = m.queue_depth
        self.mp[MP_COLORS] = m.colors
        self.mp[MP_MAX_CYCLES] = np.iinfo(np.int64).max if max_cycles is None else max_cycles
        self.mp[MP_STRICT] = int(strict)
        self.mp[MP_TRACE_CAP] = trace_cap if trace else 0
        self.mp[MP_UNDO] = int(not strict)
        self.mp[MP_PE_BITS] = pe_bits(n)
        self.mp[MP_TIMING] = int(loaded.timing_only)
        self.mp[MP_HBM_BYTES] = loaded.program.hbm_bytes
        self.mp[MP_HBM_LAT] = m.hbm_latency
        self.mp[MP_HBM_CH] = max(1, m.hbm_channels)
        self.mp[MP_HBM_IL] = max(1, m.hbm_interleave)
        self.mp[MP_PIPE_BASE] = loaded.n_links
        self.mp[MP_PIPE_TPW] = pipe_ticks_per_wavelet(m)
        self.mp[MP_PIPE_LAT] = m.link_latency
        per_chip = m.chips > 1 and m.hbm_bytes > 0
        self.mp[MP_HBM_CHIP] = m.hbm_bytes if per_chip else 0
        self.mp[MP_CHIP_H] = m.chip_height
        self.mp[MP_HBM_HOST] = loaded.hbm_stride  # host bytes a chip (load.Loaded.hbm_offset)
        # HBM contents (a stand-in when the program has none or in timing-only mode), the
        # channels (every GPU's own, one after another), and one channel's bytes a cycle
        self.hbm = loaded.hbm if loaded.hbm.size else np.zeros(1, dtype=np.uint8)
        self.hbm_ch = np.zeros((max(1, m.hbm_channels) * (m.chips if per_chip else 1), 2),
                               dtype=np.int64)
        self.hbm_rate = np.array([m.hbm_bytes_per_cycle / max(1, m.hbm_channels)], np.float64)
        # the input queues: only a queue's wavelet count matters while it is 0, so after a run
        # that ended with every queue empty (Static.queues_empty) they are as a run starts them
        self.queue = fixed.buffer("queue", (n * m.colors, 3), np.int32)  # (records < 2**31)
        if not fixed.queues_empty:
            _zero_rows(self.queue, fixed.queue_slots)
        fixed.queues_empty = False  # until this run ends with none queued (core._loop)
        self.link = fixed.zeroed("link", (loaded.n_links + loaded.n_pipes, 2), np.int64)
        # records and payloads are initialised when taken: no reset
        records = max(256, 2 * n)
        self.dl = fixed.buffer("dl", (records, N_DL_COLS), np.int64)
        self.msg = fixed.buffer("msg", (records, N_MSG_COLS), np.int64)
        # timing-only messages have no payload
        pool = 16 if loaded.timing_only else max(1 << 16, 16 * n)
        self.payload = fixed.buffer("payload", (pool,), np.uint32)
        self.heap = fixed.buffer("heap", (n,), np.int64)
        _count_up(self.heap)  # all clocks 0: index order is a heap
        self.wake = fixed.buffer("wake", (n,), np.int64)
        self.scratch = fixed.buffer("scratch", (4, max(1024, loaded.pe_stride // 2)), np.float32)
        self.trace = np.zeros((min(trace_cap, 1 << 16) if trace else 1, 4), dtype=np.int64)
        self.counters = np.zeros(N_K, dtype=np.int64)
        self.counters[K_DL_HEAD] = -1
        self.counters[K_MSG_HEAD] = -1
        self.counters[K_HEAP_N] = n
        self.counters[K_FAULT_PE] = -1
        # the helper thread's ring (core_jobs); a one-slot stand-in while the driver runs none
        self.jobs, self.jdsd, self.ctl = new_ring(1)

    # -- growth, on the loop's request ---------------------------------------------------------

    def grow(self) -> None:
        """Grow what the loop asked for; the bigger array is kept for later runs too."""
        k = self.counters
        need, amount = int(k[K_NEED]), int(k[K_NEED_AMOUNT])
        if need == NEED_SCRATCH:
            if amount > 1 << 31:
                raise MemoryError(f"a tensor op names {amount} elements; the emulator supports "
                                  f"at most {1 << 31} per op")
            self._keep("scratch", np.zeros((4, max(2 * self.scratch.shape[1], amount)),
                                           np.float32))
        elif need == NEED_RECORDS:
            if k[K_DL_NFREE] + len(self.dl) - k[K_DL_USED] < amount:
                self._keep("dl", _bigger(self.dl, int(k[K_DL_USED]) + amount))
            if k[K_MSG_NFREE] + len(self.msg) - k[K_MSG_USED] < 1:
                self._keep("msg", _bigger(self.msg, int(k[K_MSG_USED]) + 1))
        elif need == NEED_POOL:  # the loop has compacted the pool already
            self._keep("payload", _bigger(self.payload, amount))
        elif need == NEED_UNDO:
            self._keep("undo", _bigger(self.undo, int(k[K_UNDO_N]) + 2))
            self._keep("undo_data", _bigger(self.undo_data, int(k[K_UNDO_TOP]) + amount))
        elif need == NEED_TRACE:
            self.trace = _bigger(self.trace, min(2 * len(self.trace), int(self.mp[MP_TRACE_CAP])))
        k[K_NEED] = NEED_NONE
        k[K_NEED_AMOUNT] = 0

    def _keep(self, name: str, array: np.ndarray) -> None:
        setattr(self, name, array)
        self.fixed.buffers[name] = array

    def class_counts(self) -> np.ndarray:
        return self.counters[K_CLASS0:K_LOOP0].copy()

    def parts(self) -> tuple:
        """(Const, Sched, Mem, Fabric, Far) of the current arrays, what core_sched.run_slice
        takes: built anew for each slice, as State.grow may have replaced an array."""
        return tuple(part(*[getattr(self, name) for name in part._fields]) for part in PARTS)


def new_ring(slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(jobs, jdsd, ctl): a ring of `slots` free jobs for the helper thread (core_jobs), the
    descriptor copies of its jobs as (slots, 3, 8) int32 (a view into jobs), and its control
    words."""
    jobs = np.zeros((max(1, slots), N_JOB_COLS), dtype=np.int64)
    return jobs, job_descriptors(jobs), np.zeros(N_CT, dtype=np.int64)


def job_descriptors(jobs: np.ndarray) -> np.ndarray:
    """The descriptor copies of a ring's jobs, as (slots, 3, N_DSD_WORDS) int32, the state's
    descriptor table's type: a view into `jobs`."""
    words = 3 * N_DSD_WORDS
    jdsd = jobs[:, J_DSD:J_DSD + words // 2].view(np.int32).reshape(jobs.shape[0], 3,
                                                                     N_DSD_WORDS)
    assert np.shares_memory(jobs, jdsd)
    return jdsd


def pe_bits(n_pes: int) -> int:
    """Bits of a heap key that hold the PE index."""
    return max(1, int(n_pes - 1).bit_length())


def max_clock(n_pes: int) -> int:
    """The largest clock a heap key holds (2**43 cycles, hours of host time, at 900k PEs)."""
    return (1 << (MAX_KEY_BITS - pe_bits(n_pes))) - 1


@njit(cache=True)
def _reset_pe(pe, start):
    """Every PE's row as a run starts it: P_WAIT -1, code and SRAM from `start` (code0, code
    length, SRAM offset, SRAM length per PE), the rest 0; one pass over the table, row by row
    (numpy's column assignments made one strided pass each)."""
    for p in range(pe.shape[0]):
        pe[p, :] = 0
        pe[p, P_WAIT] = -1
        pe[p, P_CODE0] = start[0, p]
        pe[p, P_CODELEN] = start[1, p]
        pe[p, P_SRAM0] = start[2, p]
        pe[p, P_SRAM_LEN] = start[3, p]


@njit(cache=True)
def result_columns(pe, link):
    """The per-PE figures a RunResult reports, in one pass over the pe table (NumPy's column
    copies made a strided pass each): int32 (pc, status, wait color) and int64 (clock,
    instructions, busy, receive, backpressure and DMA stalls) rows, the links' wavelets, and
    the last cycle (of a clock or a DMA tag). Rows are padded by a line: n int64 apart, for
    n a power of two, every row's element p would fall in one L1 set."""
    n = pe.shape[0]
    i32 = np.empty((3, n + 16), dtype=np.int32)
    i64 = np.empty((6, n + 8), dtype=np.int64)
    last = 0
    for p in range(n):
        i32[0, p] = pe[p, P_PC]
        i32[1, p] = pe[p, P_STATUS]
        i32[2, p] = pe[p, P_WAIT]
        i64[0, p] = pe[p, P_CLOCK]
        i64[1, p] = pe[p, P_INSTR]
        i64[2, p] = pe[p, P_BUSY]
        i64[3, p] = pe[p, P_RSTALL]
        i64[4, p] = pe[p, P_BPSTALL]
        i64[5, p] = pe[p, P_DMASTALL]
        last = max(last, pe[p, P_CLOCK])
        for t in range(P_TAG0, P_TAG0 + N_DMA_TAGS):
            last = max(last, pe[p, t])
    wavelets = np.empty(link.shape[0], dtype=np.int64)
    for i in range(link.shape[0]):
        wavelets[i] = link[i, L_WAVELETS]
    return i32, i64, wavelets, last


@njit(cache=True)
def _zero_rows(table, rows):
    for r in rows:
        table[r, :] = 0


@njit(cache=True)
def _zero_columns(table, cols):
    for r in range(table.shape[0]):
        for c in cols:
            table[r, c] = 0


@njit(cache=True)
def _count_up(a):
    for i in range(a.shape[0]):
        a[i] = i


def _bigger(table: np.ndarray, rows: int) -> np.ndarray:
    """`table` with at least `rows` rows and at least twice as many as before, zero-filled."""
    new = max(2 * table.shape[0], rows)
    out = np.zeros((new,) + table.shape[1:], dtype=table.dtype)
    out[:table.shape[0]] = table
    return out

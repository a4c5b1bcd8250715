"""Instructions of the Numba core: scalar integer, float and descriptor instructions, and what
tensor ops share (operand checks, SIMD widths, chunk timing), per docs/timing-model.md
sections 2 to 4 and 6. emulator/reference.py is the readable twin; tensor ops: core_tensor.py.

Scalar executors return the next pc (or -reason); the others return an X_* code. A fault is
recorded in the PE's P_FAULT column and leaves its state untouched (pc on the faulting
instruction): the scheduler reports it when that PE's key comes first, so that the first fault
in (clock, PE) order wins even when PEs run ahead.
An instruction that needs a bigger pool or buffer returns X_GROW before changing anything and
is retried after the driver has grown it. All arithmetic is done by kernels/; SRAM is read and
written through the gateway in core_sram.py (the undo log, timing-only marks, the helper's ring).
Executors take the state's parts (core_state.PARTS: const, sched, mem, fab, far).
"""

import numpy as np
from numba import njit

from wse_emu.emulator.core_fabric import need
from wse_emu.emulator.core_jobs import borrowed
from wse_emu.emulator.core_ops import OPERAND_ROLES, R_DST, R_DST_MEM, R_SRC0, R_SRC1
from wse_emu.emulator.core_state import (
    CK_FMAC, CK_MOVE, CK_SPECIAL, FABOUT_BIT, K_CLASS0, K_HALTED, K_INSTR_TOTAL, K_TRACE_N,
    MP_TIMING, MP_TRACE_CAP,
    NEED_TRACE, P_BUSY, P_CLOCK, P_DONE, P_FABRIC, P_FAULT, P_FTAINT, P_INSTR, P_PC, P_RSTALL,
    P_SRAM0, P_SRAM_LEN, P_STATUS,
    S_ADD, S_ADDI, S_AND, S_ANDI, S_BEQ, S_BGE, S_BLT, S_BNE, S_D2D, S_DADDR, S_DFIN,
    S_DFOUT, S_DIV, S_DLEN, S_DMEM, S_DSTRIDE, S_FADD, S_FDIV, S_FEXP, S_FLI, S_FLW,
    S_FMAX, S_FMIN, S_FMOV, S_FMUL, S_FRSQRT, S_FSQRT, S_FSUB, S_FSW, S_FTOI, S_HALT, S_ITOF, S_JMP,
    S_LI, S_LW, S_MATRIX, S_MOV, S_MUL, S_MULI, S_OR, S_REM, S_SHLI, S_SHRI,
    S_SLT, S_SUB, S_SW, S_TENSOR, S_XOR, V_CONVERT, V_F16, V_F32, V_MIXED, V_SPECIAL, X_FAULT,
    S_DMALD, S_DMAST, H_BUSY, H_FREE, HBM_TICKS, K_HBM_READ, K_HBM_WRITE, MP_HBM_BYTES,
    MP_HBM_CH, MP_HBM_IL, MP_HBM_LAT, MP_ISSUE, P_CODELEN, P_DMASTALL, P_TAG0, X_GROW, X_OK,
    MP_CHIP_H, MP_HBM_CHIP, MP_HBM_HOST, d_addr, d_color, d_count, d_cstride, d_dtype, d_kind,
    d_len, d_stride, set_2d, set_addr, set_descriptor, set_len, set_stride)
from wse_emu.emulator.core_sram import mem_bytes, store_dma, store_f32, store_i32
from wse_emu.emulator.result import (F_ALIGN, F_COUNT, F_DEST_NOT_MEM, F_DMA_DESC, F_DMA_TAG,
                             F_FABIN_DEST, F_FABOUT_SRC, F_HBM_CHIP, F_HBM_RANGE, F_OOB,
                             F_SAME_COLOR,
                             F_SCALAR_MEM, F_TARGET, F_TIMING_DATA, ST_HALT)
from wse_emu.isa.spec import DSD_FABIN, DSD_FABOUT, DSD_MEM, DTYPES, N_DMA_TAGS, SPECIAL_IREGS
from wse_emu.kernels import scalar
from wse_emu.kernels.convert import f32_from_bits

DT_F32 = DTYPES["f32"]
GY = SPECIAL_IREGS["GY"]  # a PE's absolute fabric row (read-only): its chip in a system
# Magnitudes beyond which an address computation is certainly outside any SRAM: checking
# against them first keeps the exact int64 arithmetic below free of overflow.
FAR = 1 << 50
MANY = 1 << 62  # element counts saturate here (nothing that large can run)
MANY_ROWS = 1 << 46
SHORT = 1 << 20  # (len - 1) * stride of shorter descriptors cannot overflow


@njit(cache=True)
def _fault(pe, p, reason):
    pe[p, P_FAULT] = reason
    return X_FAULT


# ---------------------------------------------------------------------------------------------
# Scalar instructions: each returns the next pc, or -reason for a fault.


@njit(cache=True)
def _target(t, code_len):
    return t if 0 <= t < code_len else -F_TARGET


@njit(cache=True, inline="always")
def _word_index(pe, p, addr):
    """Index into the int32/fp32 view of SRAM of PE p's byte address, or -1 if not allowed
    (outside the footprint of its region, or misaligned)."""
    if addr < 0 or addr > pe[p, P_SRAM_LEN] - 4 or addr & 3 != 0:
        return -1
    return (pe[p, P_SRAM0] + addr) // 4


@njit(cache=True)
def _trunc_div(a, b):
    """a / b rounded toward zero with int64 wrap-around (b != 0)."""
    if b == -1:
        return -a
    q = a // b
    if q * b != a and (a < 0) != (b < 0):
        q += 1
    return q


@njit(cache=True, inline="always")
def exec_int(p, sem, a, b, c, imm, pc, const, sched, mem):
    pe, ireg, counters, mp = sched.pe, sched.ireg, sched.counters, const.mp
    code_len = pe[p, P_CODELEN]
    nxt = pc + 1
    if sem == S_HALT:
        pe[p, P_STATUS] = ST_HALT
        counters[K_HALTED] += 1
    elif sem == S_JMP:
        nxt = _target(imm, code_len)
    elif sem == S_BEQ:
        if ireg[p, a] == ireg[p, b]:
            nxt = _target(imm, code_len)
    elif sem == S_BNE:
        if ireg[p, a] != ireg[p, b]:
            nxt = _target(imm, code_len)
    elif sem == S_BLT:
        if ireg[p, a] < ireg[p, b]:
            nxt = _target(imm, code_len)
    elif sem == S_BGE:
        if ireg[p, a] >= ireg[p, b]:
            nxt = _target(imm, code_len)
    elif sem == S_LI:
        ireg[p, a] = imm
    elif sem == S_MOV:
        ireg[p, a] = ireg[p, b]
    elif sem == S_ADD:
        ireg[p, a] = ireg[p, b] + ireg[p, c]
    elif sem == S_SUB:
        ireg[p, a] = ireg[p, b] - ireg[p, c]
    elif sem == S_MUL:
        ireg[p, a] = ireg[p, b] * ireg[p, c]
    elif sem == S_DIV:
        y = ireg[p, c]
        ireg[p, a] = 0 if y == 0 else _trunc_div(ireg[p, b], y)
    elif sem == S_REM:
        x, y = ireg[p, b], ireg[p, c]
        ireg[p, a] = 0 if y == 0 else x - y * _trunc_div(x, y)
    elif sem == S_AND:
        ireg[p, a] = ireg[p, b] & ireg[p, c]
    elif sem == S_OR:
        ireg[p, a] = ireg[p, b] | ireg[p, c]
    elif sem == S_XOR:
        ireg[p, a] = ireg[p, b] ^ ireg[p, c]
    elif sem == S_SLT:
        ireg[p, a] = 1 if ireg[p, b] < ireg[p, c] else 0
    elif sem == S_ADDI:
        ireg[p, a] = ireg[p, b] + imm
    elif sem == S_MULI:
        ireg[p, a] = ireg[p, b] * imm
    elif sem == S_ANDI:
        ireg[p, a] = ireg[p, b] & imm
    elif sem == S_SHLI:
        ireg[p, a] = ireg[p, b] << (imm & 63)
    elif sem == S_SHRI:
        ireg[p, a] = ireg[p, b] >> (imm & 63)
    elif sem == S_LW or sem == S_SW:
        addr = ireg[p, b] + imm
        w = _word_index(pe, p, addr)
        if w < 0:
            return -F_SCALAR_MEM
        if sem == S_LW:
            if mp[MP_TIMING] and mem.unknown[w]:
                return -F_TIMING_DATA
            ireg[p, a] = np.int64(mem.sram_i32[w])
        else:
            store_i32(p, addr, w, np.int32(ireg[p, a] & 0xFFFFFFFF), const, sched, mem)
    return nxt


@njit(cache=True, inline="always")
def exec_float(p, sem, a, b, c, imm, pc, const, sched, mem):
    pe, ireg, freg, mp = sched.pe, sched.ireg, sched.freg, const.mp
    if mp[MP_TIMING] and sem == S_FTOI and (pe[p, P_FTAINT] >> b) & 1:
        return -F_TIMING_DATA  # an integer (a count, an address) from computed data
    if sem == S_FLI:
        freg[p, a] = f32_from_bits(imm)
    elif sem == S_FMOV:
        freg[p, a] = freg[p, b]
    elif sem == S_FADD:
        freg[p, a] = freg[p, b] + freg[p, c]
    elif sem == S_FSUB:
        freg[p, a] = freg[p, b] - freg[p, c]
    elif sem == S_FMUL:
        freg[p, a] = freg[p, b] * freg[p, c]
    elif sem == S_FMAX:
        freg[p, a] = scalar.fmax(freg[p, b], freg[p, c])
    elif sem == S_FMIN:
        freg[p, a] = scalar.fmin(freg[p, b], freg[p, c])
    elif sem == S_FDIV:
        freg[p, a] = scalar.fdiv(freg[p, b], freg[p, c])
    elif sem == S_FEXP:
        freg[p, a] = scalar.fexp(freg[p, b])
    elif sem == S_FRSQRT:
        freg[p, a] = scalar.frsqrt(freg[p, b])
    elif sem == S_FSQRT:
        freg[p, a] = scalar.fsqrt(freg[p, b])
    elif sem == S_ITOF:
        freg[p, a] = np.float32(ireg[p, b])
    elif sem == S_FTOI:
        v = np.float64(freg[p, b])
        ireg[p, a] = np.int64(v) if np.isfinite(v) and abs(v) < 9.223372036854775808e18 else 0
    elif sem == S_FLW or sem == S_FSW:
        addr = ireg[p, b] + imm
        w = _word_index(pe, p, addr)
        if w < 0:
            return -F_SCALAR_MEM
        if sem == S_FLW:
            freg[p, a] = mem.sram_f32[w]
            if mp[MP_TIMING]:  # a float from computed data is only unknown, not yet a problem
                bit = np.int64(1) << a
                pe[p, P_FTAINT] = (pe[p, P_FTAINT] | bit) if mem.unknown[w] else \
                    (pe[p, P_FTAINT] & ~bit)
                return pc + 1
        else:
            store_f32(p, addr, w, freg[p, a], (pe[p, P_FTAINT] >> a) & 1, const, sched, mem)
    if mp[MP_TIMING]:
        _taint(p, sem, a, b, c, pe)
    return pc + 1


@njit(cache=True, inline="always")
def _taint(p, sem, a, b, c, pe):
    """Timing-only mode: f register a is unknown after a scalar float op iff an operand was."""
    t = pe[p, P_FTAINT]
    if sem == S_FLI or sem == S_ITOF:
        pe[p, P_FTAINT] = t & ~(np.int64(1) << a)
    elif sem == S_FMOV or sem == S_FEXP or sem == S_FRSQRT or sem == S_FSQRT:
        pe[p, P_FTAINT] = (t & ~(np.int64(1) << a)) | (((t >> b) & 1) << a)
    elif sem != S_FSW and sem != S_FTOI:
        u = ((t >> b) | (t >> c)) & 1
        pe[p, P_FTAINT] = (t & ~(np.int64(1) << a)) | (u << a)


@njit(cache=True, inline="always")
def exec_desc(p, sem, a, b, c, imm, il, ih, sched):
    pe, ireg, dsd = sched.pe, sched.ireg, sched.dsd
    if sem == S_DMEM or sem == S_DFIN or sem == S_DFOUT:
        bits = np.int64(1) << a | np.int64(1) << (FABOUT_BIT + a)
        pe[p, P_FABRIC] &= ~bits
        if sem == S_DFIN:
            pe[p, P_FABRIC] |= np.int64(1) << a
        elif sem == S_DFOUT:
            pe[p, P_FABRIC] |= np.int64(1) << (FABOUT_BIT + a)
    if sem == S_DMEM:
        set_descriptor(dsd, p, a, DSD_MEM, b, 0, il, ih, ih)
    elif sem == S_DFIN or sem == S_DFOUT:
        set_descriptor(dsd, p, a, DSD_FABIN if sem == S_DFIN else DSD_FABOUT, b, c, 0, imm, imm)
    elif sem == S_DSTRIDE:
        set_stride(dsd, p, a, imm)
    elif sem == S_D2D:
        set_2d(dsd, p, a, il, ih)
    elif sem == S_DADDR:
        set_addr(dsd, p, a, ireg[p, b] + imm)
    elif sem == S_DLEN:
        set_len(dsd, p, a, ireg[p, b])


# ---------------------------------------------------------------------------------------------
# Descriptor operands.


@njit(cache=True, inline="always")
def elements(dsd, p, r):
    """Elements descriptor r names: len * count (SRAM) or len (fabric); -1 if negative."""
    n, count = d_len(dsd, p, r), d_count(dsd, p, r)
    if n < 0 or count < 0:
        return -1
    if d_kind(dsd, p, r) != DSD_MEM:
        return n
    if n > MANY_ROWS and count > 0:  # count < 2**16, so smaller products are exact
        return MANY
    return n * count


@njit(cache=True, inline="always")
def check_mem(dsd, p, r, limit):
    """0, or the fault of an SRAM descriptor that is misaligned or reaches outside the SRAM
    (bytes 0 .. limit - 1: the footprint of the PE's region, pe[p, P_SRAM_LEN])."""
    size = 4 if d_dtype(dsd, p, r) == DT_F32 else 2
    addr = d_addr(dsd, p, r)
    if addr & (size - 1) != 0:  # == addr % size for a power of two, negative addr too
        return F_ALIGN
    n, stride = d_len(dsd, p, r), d_stride(dsd, p, r)
    if n == 0 or d_count(dsd, p, r) == 0:
        return 0
    # stride is a 32-bit immediate, count and cstride 16-bit ones: within these bounds the
    # exact products of mem_bytes fit in int64 (the float product only screens long ones)
    if addr < -FAR or addr > FAR or \
            (n > SHORT and stride != 0 and np.float64(n - 1) * abs(stride) > FAR):
        return F_OOB
    lo, hi = mem_bytes(dsd, p, r)
    if lo < 0 or hi > limit:
        return F_OOB
    return 0


@njit(cache=True)
def simd_variant(kind, d0, d1, d2, nd):
    """isa.spec.simd_key's rule over nd operand dtypes, as a V_* variant of the cost class."""
    if kind == CK_SPECIAL:
        return V_SPECIAL
    all32 = d0 == DT_F32 and (nd < 2 or d1 == DT_F32) and (nd < 3 or d2 == DT_F32)
    any32 = d0 == DT_F32 or (nd >= 2 and d1 == DT_F32) or (nd >= 3 and d2 == DT_F32)
    if kind == CK_FMAC:
        return V_F32 if all32 else (V_MIXED if any32 else V_F16)
    mixed = (nd >= 2 and d1 != d0) or (nd >= 3 and d2 != d0)
    if kind == CK_MOVE and mixed:
        return V_CONVERT
    return V_F32 if any32 else V_F16


@njit(cache=True, inline="always")
def _in_slot(slot, a, b, c):
    return a if slot == 0 else (b if slot == 1 else (c if slot == 2 else -1))


@njit(cache=True)
def roles(sem, a, b, c):
    """(destination, source 0, source 1) descriptor registers of a tensor op, -1 for none: the
    operand roles of isa/spec.py (core_ops.OPERAND_ROLES, a constant of the compiled code, which
    the stale-cache check keeps in step with the spec)."""
    return (_in_slot(OPERAND_ROLES[sem, R_DST], a, b, c),
            _in_slot(OPERAND_ROLES[sem, R_SRC0], a, b, c),
            _in_slot(OPERAND_ROLES[sem, R_SRC1], a, b, c))


@njit(cache=True, inline="always")
def is_fabric(sem, a, b, c, fabric):
    """Whether a tensor op takes a fabric input or sends (only these touch other PEs' state),
    from the PE's P_FABRIC mask."""
    if sem < S_TENSOR or sem >= S_MATRIX:
        return False
    dst, s0, s1 = roles(sem, a, b, c)
    return ((dst >= 0 and (fabric >> (FABOUT_BIT + dst)) & 1 != 0)
            or (s0 >= 0 and (fabric >> s0) & 1 != 0)
            or (s1 >= 0 and (fabric >> s1) & 1 != 0))


@njit(cache=True, inline="always")
def check_operands(sem, dst, s0, s1, dsd, p, limit):
    """0 or the fault of a tensor op's operands, in emulator/reference.py's order."""
    if dst >= 0:
        if d_kind(dsd, p, dst) == DSD_FABIN:
            return F_FABIN_DEST
        if OPERAND_ROLES[sem, R_DST_MEM] and d_kind(dsd, p, dst) != DSD_MEM:
            return F_DEST_NOT_MEM
    if (s0 >= 0 and d_kind(dsd, p, s0) == DSD_FABOUT) or \
            (s1 >= 0 and d_kind(dsd, p, s1) == DSD_FABOUT):
        return F_FABOUT_SRC
    n = -2
    for r in (dst, s0, s1):
        if r >= 0:
            e = elements(dsd, p, r)
            if e < 0 or (n != -2 and e != n):
                return F_COUNT
            n = e
    for r in (dst, s0, s1):
        if r >= 0 and d_kind(dsd, p, r) == DSD_MEM:
            f = check_mem(dsd, p, r, limit)
            if f:
                return f
    if s0 >= 0 and s1 >= 0 and d_kind(dsd, p, s0) == DSD_FABIN and \
            d_kind(dsd, p, s1) == DSD_FABIN and d_color(dsd, p, s0) == d_color(dsd, p, s1):
        return F_SAME_COLOR
    return 0


@njit(cache=True, inline="always")
def chunk_times(p, dur, a_head, a_tail, pe, issue):
    """(start, end) of a chunk of `dur` cycles (isa.costs; section 6), after the issue
    overhead if it is the op's first chunk; advances the PE's clock and statistics."""
    ovh = issue if pe[p, P_DONE] == 0 else 0
    t0 = pe[p, P_CLOCK]
    start = max(t0 + ovh, a_head)
    end = max(start + dur, a_tail + 1)
    pe[p, P_BUSY] += ovh + dur
    pe[p, P_RSTALL] += end - t0 - ovh - dur
    pe[p, P_CLOCK] = end
    return start, end


@njit(cache=True)
def room_for_trace(mp, trace, counters):
    """False (and a request to grow) when the trace buffer is full below the cap."""
    n = counters[K_TRACE_N]
    if n < mp[MP_TRACE_CAP] and n == trace.shape[0]:
        need(counters, NEED_TRACE, n + 1)
        return False
    return True


@njit(cache=True, inline="always")
def finish_chunk(p, cls, k, n, start, end, pe, mp, trace, counters):
    t = counters[K_TRACE_N]
    if t < mp[MP_TRACE_CAP]:
        trace[t, 0] = p
        trace[t, 1] = pe[p, P_PC]
        trace[t, 2] = start
        trace[t, 3] = end
        counters[K_TRACE_N] = t + 1
    pe[p, P_DONE] += k
    if pe[p, P_DONE] >= n:
        pe[p, P_DONE] = 0
        pe[p, P_PC] += 1
        pe[p, P_INSTR] += 1
        counters[K_CLASS0 + cls] += 1
        counters[K_INSTR_TOTAL] += 1


# ---------------------------------------------------------------------------------------------
# DMA between HBM and SRAM (docs/timing-model.md, HBM and DMA; emulator/reference.py dma_op).


@njit(cache=True, inline="always")
def is_dma(sem):
    """dmald / dmast: they reserve the shared HBM channels, so they run in (clock, PE) order."""
    return sem == S_DMALD or sem == S_DMAST


@njit(cache=True)
def hbm_reserve(t0, addr, nbytes, mp, hbm_ch, rate, ch0):
    """Reserve the HBM channels for bytes [addr, addr + nbytes) of a request leaving at cycle
    t0 (first come first served, in ticks); the cycle the transfer is complete. `addr` is
    relative to the GPU's own HBM, whose channels are rows ch0 .. ch0 + channels - 1."""
    if nbytes == 0:
        return t0
    channels, il = mp[MP_HBM_CH], mp[MP_HBM_IL]
    b0, b1 = addr // il, (addr + nbytes - 1) // il
    full = b1 - b0 - 1
    last = np.int64(0)
    for ch in range(channels):
        if b0 == b1:
            n_c = nbytes if b0 % channels == ch else 0
        else:
            n_c = 0
            if b0 % channels == ch:
                n_c += (b0 + 1) * il - addr
            if b1 % channels == ch:
                n_c += addr + nbytes - b1 * il
            if full > 0:
                j = (ch - (b0 + 1)) % channels  # block b0 + 1 + j is this channel's first
                if j < full:
                    n_c += (full // channels + (1 if j < full % channels else 0)) * il
        if n_c == 0:
            continue
        dur = np.int64(np.ceil(np.float64(n_c) * np.float64(HBM_TICKS) / rate))
        s_c = max(t0 * HBM_TICKS, hbm_ch[ch0 + ch, H_FREE])
        hbm_ch[ch0 + ch, H_FREE] = s_c + dur
        hbm_ch[ch0 + ch, H_BUSY] += dur
        last = max(last, s_c + dur)
    return (last + HBM_TICKS - 1) // HBM_TICKS + mp[MP_HBM_LAT]


@njit(cache=True)
def exec_dma(p, sem, a, b, tag, cls, const, sched, mem, far):
    """dmald / dmast: check (the reference's order), copy the raw bytes at once (functional),
    reserve the channels, note the tag's completion; an X_* code."""
    const, sched, mem, far = borrowed(const), borrowed(sched), borrowed(mem), borrowed(far)
    pe, ireg, dsd, trace, counters = sched.pe, sched.ireg, sched.dsd, sched.trace, sched.counters
    mp, hbm = const.mp, far.hbm
    if tag >= N_DMA_TAGS:
        return _fault(pe, p, F_DMA_TAG)
    if d_kind(dsd, p, a) != DSD_MEM or d_stride(dsd, p, a) != 1 or \
            not (d_count(dsd, p, a) == 1 or d_cstride(dsd, p, a) == d_len(dsd, p, a)):
        return _fault(pe, p, F_DMA_DESC)
    n = elements(dsd, p, a)
    if n < 0:
        return _fault(pe, p, F_COUNT)
    f = check_mem(dsd, p, a, pe[p, P_SRAM_LEN])
    if f:
        return _fault(pe, p, f)
    size = 4 if d_dtype(dsd, p, a) == DT_F32 else 2
    nbytes = n * size
    addr = ireg[p, b]
    if addr < 0 or addr > mp[MP_HBM_BYTES] or addr % size != 0 or \
            addr + nbytes > mp[MP_HBM_BYTES]:
        return _fault(pe, p, F_HBM_RANGE)
    # a system of GPUs: each SM reaches its own GPU's HBM only
    own = np.int64(0)
    chip = np.int64(0)
    if mp[MP_HBM_CHIP] > 0:
        chip = ireg[p, GY] // mp[MP_CHIP_H]
        own = chip * mp[MP_HBM_CHIP]
        if addr < own or addr + nbytes > own + mp[MP_HBM_CHIP]:
            return _fault(pe, p, F_HBM_CHIP)
    host = addr  # where the bytes are in `hbm` (a system's chips are kept compacted)
    if mp[MP_HBM_HOST] > 0:
        if addr - own + nbytes > mp[MP_HBM_HOST]:
            return _fault(pe, p, F_HBM_RANGE)
        host = chip * mp[MP_HBM_HOST] + addr - own
    if not room_for_trace(mp, trace, counters):
        return X_GROW
    if sem == S_DMALD:
        store_dma(p, a, n, nbytes, hbm, host, const, sched, mem)
        counters[K_HBM_READ] += nbytes
    else:
        if mp[MP_TIMING] == 0:
            sram_u16 = mem.sram_u16
            w = (pe[p, P_SRAM0] + d_addr(dsd, p, a)) // 2
            for i in range(nbytes // 2):
                v = sram_u16[w + i]
                hbm[host + 2 * i] = np.uint8(v & 0xFF)
                hbm[host + 2 * i + 1] = np.uint8(v >> 8)
        counters[K_HBM_WRITE] += nbytes
    start = pe[p, P_CLOCK]
    t0 = start + mp[MP_ISSUE]
    pe[p, P_CLOCK] = t0
    pe[p, P_BUSY] += mp[MP_ISSUE]
    done = hbm_reserve(t0, addr - own, nbytes, mp, far.hbm_ch, far.hbm_rate[0],
                       chip * mp[MP_HBM_CH])
    if done > pe[p, P_TAG0 + tag]:
        pe[p, P_TAG0 + tag] = done
    finish_chunk(p, cls, 0, 0, start, t0, pe, mp, trace, counters)
    return X_OK


@njit(cache=True, inline="always")
def exec_dmawait(p, tag, cost, pe):
    """dmawait: 0, or the fault; the wait beyond the instruction's own cost is a DMA stall
    (the caller adds the cost)."""
    if tag >= N_DMA_TAGS:
        return F_DMA_TAG
    wait = pe[p, P_TAG0 + tag] - (pe[p, P_CLOCK] + cost)
    if wait > 0:
        pe[p, P_DMASTALL] += wait
        pe[p, P_CLOCK] += wait
    return 0

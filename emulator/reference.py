"""The pure-Python reference interpreter: the executable definition of docs/timing-model.md.

Written for reading, not speed: one instruction at a time, strictly in (clock, PE index) order,
with plain Python objects for queues and messages. The Numba core (emulator/core.py) must give
the same bits and the same cycles; tests compare the two on every instruction and on random
programs. Numerics come from kernels/ (the same compiled functions the core calls).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from wse_emu.emulator.load import (PIPE_COPY, PIPE_RELAY, PIPE_TICKS, Loaded, entry_pipe,
                                   hbm_chip_detail, pipe_ticks_per_wavelet)
from wse_emu.emulator.result import (
    F_ALIGN, F_COUNT, F_DEST_NOT_MEM, F_DMA_DESC, F_DMA_TAG, F_FABIN_DEST, F_FABOUT_SRC,
    F_HBM_CHIP, F_HBM_RANGE, F_MATRIX_FABRIC, F_NONE, F_OOB,
    F_NO_ROUTE, F_PC_END, F_SAME_COLOR, F_SCALAR_MEM, F_SHAPE, F_TARGET, RUN_DEADLOCK, RUN_FAULT, RUN_HALTED,
    RUN_MAX_CYCLES, ST_FAULT, ST_HALT, ST_RUN, ST_WAIT_BP, ST_WAIT_RECV, RunResult)
from wse_emu.isa.spec import (BY_OPCODE, COST_CLASSES, DSD_FABIN, DSD_FABOUT, DSD_MEM, DTYPE_BYTES,
                      INSTRUCTIONS, N_DMA_TAGS, N_DREGS, N_FREGS, simd_key)
from wse_emu.kernels import access, elementwise as ew, matrix, reduce, scalar
from wse_emu.isa.costs import chunk_cycles, matrix_cycles, products_by_column

# descriptor fields
KIND, ADDR, LEN, STRIDE, COUNT, CSTRIDE, DTYPE, COLOR = range(8)
CLASS_INDEX = {name: i for i, name in enumerate(COST_CLASSES)}
MASK64 = (1 << 64) - 1
HBM_TICKS = 1024  # HBM channel times are kept in 1/1024-cycle ticks (docs/timing-model.md)

# Elementwise instructions by shape (isa.spec.ELEMENTWISE_SHAPES): mnemonic -> the code of the
# kernel its mnemonic names in kernels/elementwise.py.
UNARY = {i.mnemonic: ew.UNARY_OPS[i.kernel] for i in INSTRUCTIONS if i.shape == "unary"}
BINARY = {i.mnemonic: ew.BINARY_OPS[i.kernel] for i in INSTRUCTIONS if i.shape == "binary"}
BINARY_SCALAR = {i.mnemonic: ew.BINARY_OPS[i.kernel] for i in INSTRUCTIONS
                 if i.shape == "scalar"}
INT_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
    "slt": lambda a, b: int(a < b),
    "div": lambda a, b: 0 if b == 0 else _trunc_div(a, b),
    "rem": lambda a, b: 0 if b == 0 else a - b * _trunc_div(a, b),
}
INT_IMM = {"addi": lambda a, v: a + v, "muli": lambda a, v: a * v, "andi": lambda a, v: a & v,
           "shli": lambda a, v: a << (v & 63), "shri": lambda a, v: a >> (v & 63)}
BRANCH = {"beq": lambda a, b: a == b, "bne": lambda a, b: a != b, "blt": lambda a, b: a < b,
          "bge": lambda a, b: a >= b}
F32 = np.float32
FLOAT_BINARY = {"fadd": lambda a, b: F32(a + b), "fsub": lambda a, b: F32(a - b),
                "fmul": lambda a, b: F32(a * b), "fmax": scalar.fmax, "fmin": scalar.fmin,
                "fdiv": scalar.fdiv}
FLOAT_UNARY = {"fmov": lambda a: a, "fexp": scalar.fexp, "frsqrt": scalar.frsqrt,
               "fsqrt": scalar.fsqrt}


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _wrap(v: int) -> int:
    v &= MASK64
    return v - (1 << 64) if v >> 63 else v


@dataclass
class Message:
    payload: np.ndarray  # uint32 wavelets
    sender: int
    bp_pending: int = 0
    bp_release: int = 0


@dataclass
class Delivery:
    msg: Message
    head: int
    tail: int
    consumed: int = 0
    backpressure: bool = False

    def arrival(self, i: int) -> int:
        n = len(self.msg.payload)
        return self.head if n == 1 else self.head + (i * (self.tail - self.head)) // (n - 1)


@dataclass
class PE:
    index: int
    pc: int = 0
    clock: int = 0
    status: int = ST_RUN
    wait_color: int = -1
    done: int = 0  # elements finished of the current chunked tensor op
    instructions: int = 0
    busy: int = 0
    recv_stall: int = 0
    bp_stall: int = 0
    dma_stall: int = 0
    tag_done: list = field(default_factory=lambda: [0] * N_DMA_TAGS)  # completion per DMA tag
    dsd: list = field(default_factory=lambda: [[DSD_MEM, 0, 0, 1, 1, 0, 0, 0]
                                               for _ in range(N_DREGS)])


class Fault(Exception):
    def __init__(self, reason: int):
        self.reason = reason


class Reference:
    def __init__(self, loaded: Loaded, max_cycles: int | None, trace: bool, trace_cap: int):
        if loaded.timing_only:
            raise ValueError("the reference interpreter runs functional programs only (it "
                             "defines the numbers); timing-only mode is the core's")
        self.ld = loaded
        self.m = loaded.machine
        self.max_cycles = max_cycles
        self.trace_on = trace
        self.trace_cap = trace_cap
        n = loaded.n_pes
        self.pes = [PE(i) for i in range(n)]
        self.ireg = loaded.ireg_init.copy()
        self.freg = np.zeros((n, N_FREGS), dtype=np.float32)
        sram = loaded.sram
        self.f32 = sram.view(np.float32)
        self.u16 = sram.view(np.uint16)
        self.i32 = sram.view(np.int32)
        self.queues: dict[tuple[int, int], deque] = {}
        self.queued = np.zeros(n * loaded.colors, dtype=np.int64)
        self.link_free = np.zeros(loaded.n_links, dtype=np.int64)
        self.link_wavelets = np.zeros(loaded.n_links, dtype=np.int64)
        self.class_counts = np.zeros(len(COST_CLASSES), dtype=np.int64)
        self.messages = self.wavelets = self.wavelet_hops = 0
        self.trace: list = []
        self.heap = [(0, i) for i in range(n)]
        self.fault_pe, self.fault_reason = -1, F_NONE
        m = self.m
        # a system of GPUs: every GPU its own HBM of hbm_bytes and its own channels
        self.per_chip = m.chips > 1 and m.hbm_bytes > 0
        channels = max(1, m.hbm_channels) * (m.chips if self.per_chip else 1)
        self.hbm_free = [0] * channels  # per channel: first free tick
        self.hbm_busy = [0] * channels  # per channel: ticks transferring
        self.hbm_read = self.hbm_written = 0
        self.fault_detail = ""
        # a system's pipes between chips: first free tick, wavelets crossed
        self.pipe_free = [0] * loaded.n_pipes
        self.pipe_wavelets = np.zeros(loaded.n_pipes, dtype=np.int64)
        self.pipe_tpw = pipe_ticks_per_wavelet(m)

    # -- the scheduler -------------------------------------------------------------------------

    def run(self) -> RunResult:
        outcome = None
        while self.heap:
            clock, i = heapq.heappop(self.heap)
            pe = self.pes[i]
            if self.max_cycles is not None and clock > self.max_cycles:
                outcome = RUN_MAX_CYCLES
                break
            try:
                self.step(pe)
            except Fault as f:
                pe.status = ST_FAULT
                self.fault_pe, self.fault_reason = i, f.reason
                outcome = RUN_FAULT
                break
            if pe.status == ST_RUN:
                heapq.heappush(self.heap, (pe.clock, i))
        if outcome is None:
            done = all(p.status == ST_HALT for p in self.pes)
            outcome = RUN_HALTED if done else RUN_DEADLOCK
        # DMAs still outstanding at the end finish after the last instruction
        cycles = max((max(p.clock, *p.tag_done) for p in self.pes), default=0)
        if outcome == RUN_MAX_CYCLES:
            cycles = self.max_cycles
        return self.result(outcome, cycles)

    def wake(self, pe: PE) -> None:
        pe.status = ST_RUN
        pe.wait_color = -1
        heapq.heappush(self.heap, (pe.clock, pe.index))

    # -- one instruction -----------------------------------------------------------------------

    def step(self, pe: PE) -> None:
        ld = self.ld
        i = pe.index
        if pe.pc >= ld.pe_code_len[i]:
            raise Fault(F_PC_END)
        at = ld.pe_code_start[i] + pe.pc
        ins = BY_OPCODE[int(ld.code_op[at])]
        a, b, c = int(ld.code_a[at]), int(ld.code_b[at]), int(ld.code_c[at])
        imm, il, ih = int(ld.code_imm[at]), int(ld.code_il[at]), int(ld.code_ih[at])
        name = ins.mnemonic
        if ins.is_tensor:
            self.tensor_op(pe, ins, a, b, c)
            return
        if ins.cost == "dma":
            self.dma_op(pe, name, a, b, il)
            return
        r = self.ireg[i]
        f = self.freg[i]
        next_pc = pe.pc + 1
        if name == "halt":
            pe.status = ST_HALT
        elif name == "nop":
            pass
        elif name == "jmp":
            next_pc = self.target(pe, imm)
        elif name in BRANCH:
            if BRANCH[name](int(r[a]), int(r[b])):
                next_pc = self.target(pe, imm)
        elif name == "li":
            r[a] = imm
        elif name == "mov":
            r[a] = r[b]
        elif name in INT_BINARY:
            r[a] = _wrap(INT_BINARY[name](int(r[b]), int(r[c])))
        elif name in INT_IMM:
            r[a] = _wrap(INT_IMM[name](int(r[b]), imm))
        elif name in ("lw", "sw", "flw", "fsw"):
            index = self.scalar_address(pe, int(r[b]) + imm)
            if name == "lw":
                r[a] = int(self.i32[index])
            elif name == "sw":
                self.i32[index] = np.int64(r[a]).astype(np.int32)
            elif name == "flw":
                f[a] = self.f32[index]
            else:
                self.f32[index] = f[a]
        elif name == "fli":
            f[a] = np.array([imm & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]
        elif name in FLOAT_UNARY:
            f[a] = FLOAT_UNARY[name](f[b])
        elif name in FLOAT_BINARY:
            f[a] = FLOAT_BINARY[name](f[b], f[c])
        elif name == "itof":
            f[a] = np.float32(np.int64(r[b]))
        elif name == "ftoi":
            v = float(f[b])
            r[a] = int(v) if np.isfinite(v) and abs(v) < 2.0 ** 63 else 0
        elif ins.group == "descriptor":
            self.descriptor_op(pe, name, a, b, c, imm, il, ih)
        elif name == "dmawait":
            if il >= N_DMA_TAGS:
                raise Fault(F_DMA_TAG)
            # the wait's own cost first, then whatever is left of the transfers is a stall
            cost = self.m.scalar_cycles
            wait = max(0, pe.tag_done[il] - (pe.clock + cost))
            pe.dma_stall += wait
            pe.clock += wait
        else:  # pragma: no cover - the table and this interpreter must grow together
            raise AssertionError(f"reference: no semantics for {name}")
        pe.clock += self.m.special_scalar_cycles if ins.cost == "fspecial" else self.m.scalar_cycles
        pe.busy += self.m.special_scalar_cycles if ins.cost == "fspecial" else self.m.scalar_cycles
        pe.pc = next_pc
        pe.instructions += 1
        self.class_counts[CLASS_INDEX[ins.cost]] += 1

    def target(self, pe: PE, t: int) -> int:
        if not 0 <= t < self.ld.pe_code_len[pe.index]:
            raise Fault(F_TARGET)
        return t

    def scalar_address(self, pe: PE, addr: int) -> int:
        if addr % 4 or addr < 0 or addr + 4 > int(self.ld.sram_len[pe.index]):
            raise Fault(F_SCALAR_MEM)
        return (int(self.ld.sram_base[pe.index]) + addr) // 4

    def descriptor_op(self, pe, name, a, b, c, imm, il, ih) -> None:
        d = pe.dsd[a]
        r = self.ireg[pe.index]
        if name == "dmem":
            d[:] = [DSD_MEM, il, ih, 1, 1, ih, b, 0]
        elif name in ("dfin", "dfout"):
            d[:] = [DSD_FABIN if name == "dfin" else DSD_FABOUT, 0, imm, 1, 1, imm, b, c]
        elif name == "dstride":
            d[STRIDE] = imm
        elif name == "d2d":
            d[COUNT], d[CSTRIDE] = il, ih
        elif name == "daddr":
            d[ADDR] = _wrap(int(r[b]) + imm)
        elif name == "dlen":
            d[LEN] = int(r[b])

    # -- DMA between HBM and SRAM ---------------------------------------------------------------

    def dma_op(self, pe: PE, name: str, a: int, b: int, tag: int) -> None:
        """dmald / dmast (docs/timing-model.md, HBM and DMA): check, copy the raw bytes at once
        (functional), reserve the HBM channels and note when the transfer completes."""
        m, ld = self.m, self.ld
        if tag >= N_DMA_TAGS:
            raise Fault(F_DMA_TAG)
        d = pe.dsd[a]
        if d[KIND] != DSD_MEM or d[STRIDE] != 1 or not (d[COUNT] == 1 or d[CSTRIDE] == d[LEN]):
            raise Fault(F_DMA_DESC)
        n = self.elements(d)
        self.check_mem(pe, d)
        size = DTYPE_BYTES[d[DTYPE]]
        nbytes = n * size
        addr = int(self.ireg[pe.index][b])
        if addr < 0 or addr % size or addr + nbytes > ld.program.hbm_bytes:
            raise Fault(F_HBM_RANGE)
        chip, own = 0, 0
        if self.per_chip:  # an SM reaches its own GPU's HBM only
            chip = int(ld.pe_y[pe.index]) // m.chip_height
            own = chip * m.hbm_bytes
            if addr < own or addr + nbytes > own + m.hbm_bytes:
                self.fault_detail = hbm_chip_detail(ld, pe.index, addr, nbytes)
                raise Fault(F_HBM_CHIP)
        host = addr  # where the bytes are in ld.hbm (a system's chips are kept compacted)
        if ld.hbm_stride:
            if addr - own + nbytes > ld.hbm_stride:
                raise Fault(F_HBM_RANGE)
            host = chip * ld.hbm_stride + addr - own
        lo = int(ld.sram_base[pe.index]) + d[ADDR]
        if name == "dmald":
            ld.sram[lo:lo + nbytes] = ld.hbm[host:host + nbytes]
            self.hbm_read += nbytes
        else:
            ld.hbm[host:host + nbytes] = ld.sram[lo:lo + nbytes]
            self.hbm_written += nbytes
        start = pe.clock
        t0 = start + m.issue_overhead
        pe.clock = t0
        pe.busy += m.issue_overhead
        done = self.hbm_reserve(t0, addr - own, nbytes, chip * m.hbm_channels)
        pe.tag_done[tag] = max(pe.tag_done[tag], done)
        if self.trace_on and len(self.trace) < self.trace_cap:
            self.trace.append((pe.index, pe.pc, start, t0))
        pe.pc += 1
        pe.instructions += 1
        self.class_counts[CLASS_INDEX["dma"]] += 1

    def hbm_reserve(self, t0: int, addr: int, nbytes: int, ch0: int = 0) -> int:
        """Reserve the channels for bytes [addr, addr + nbytes) of a request leaving at cycle
        t0, first come first served; return the cycle the transfer is complete. `addr` is
        relative to the GPU's own HBM, whose channels are ch0 .. ch0 + hbm_channels - 1."""
        if nbytes == 0:
            return t0
        m = self.m
        rate = m.hbm_bytes_per_cycle / m.hbm_channels  # bytes a cycle, one channel
        last = 0
        for ch, n_c in enumerate(channel_bytes(addr, nbytes, m.hbm_interleave, m.hbm_channels),
                                 start=ch0):
            if n_c == 0:
                continue
            dur = math.ceil(n_c * float(HBM_TICKS) / rate)
            s_c = max(t0 * HBM_TICKS, self.hbm_free[ch])
            self.hbm_free[ch] = s_c + dur
            self.hbm_busy[ch] += dur
            last = max(last, s_c + dur)
        return -(-last // HBM_TICKS) + m.hbm_latency

    # -- tensor ops ----------------------------------------------------------------------------

    def elements(self, d) -> int:
        if d[LEN] < 0 or d[COUNT] < 0:
            raise Fault(F_COUNT)
        return d[LEN] * (d[COUNT] if d[KIND] == DSD_MEM else 1)

    def check_mem(self, pe: PE, d) -> None:
        """Fault unless SRAM descriptor d is aligned and inside PE pe's SRAM, which is its
        region's footprint (docs/timing-model.md section 2)."""
        size = DTYPE_BYTES[d[DTYPE]]
        if d[ADDR] % size:
            raise Fault(F_ALIGN)
        if d[LEN] == 0 or d[COUNT] == 0:
            return
        inner = (d[LEN] - 1) * d[STRIDE]
        outer = (d[COUNT] - 1) * d[CSTRIDE]
        lo = min(0, inner) + min(0, outer)
        hi = max(0, inner) + max(0, outer)
        limit = int(self.ld.sram_len[pe.index])
        if d[ADDR] + lo * size < 0 or d[ADDR] + (hi + 1) * size > limit:
            raise Fault(F_OOB)

    def tensor_op(self, pe: PE, ins, a: int, b: int, c: int) -> None:
        name = ins.mnemonic
        dsd = pe.dsd
        if ins.group == "matrix":
            self.matrix_op(pe, ins, dsd[a], dsd[b], dsd[c])
            return
        # operand roles (isa/spec.py): the descriptors data is written and read through
        regs = {"A": a, "B": b, "C": c}
        dst = dsd[regs[ins.operands[ins.destination][2]]] if ins.destination >= 0 else None
        srcs = [dsd[regs[ins.operands[i][2]]] for i in ins.sources]
        if pe.done == 0:
            self.check_operands(pe, ins, dst, srcs)
            if dst is not None and dst[KIND] == DSD_FABOUT and \
                    self.ld.tree_start[pe.index * self.ld.colors + dst[COLOR]] < 0:
                raise Fault(F_NO_ROUTE)
        n = self.elements(dst if dst is not None else srcs[0])
        fab_in = [s for s in srcs if s[KIND] == DSD_FABIN]
        k = n - pe.done
        for s in fab_in:
            avail = self.queued[pe.index * self.ld.colors + s[COLOR]]
            if avail == 0 and k > 0:
                pe.status, pe.wait_color = ST_WAIT_RECV, s[COLOR]
                return
            k = min(k, int(avail))
        fabric = bool(fab_in) or (dst is not None and dst[KIND] == DSD_FABOUT)
        dtypes = tuple(d[DTYPE] for d in ([dst] if dst is not None else []) + srcs)
        width = self.m.simd_width(simd_key(ins.cost, dtypes))
        a_head = a_tail = -1
        for s in fab_in if k > 0 else ():
            q = self.queues[(pe.index, s[COLOR])]
            a_head = max(a_head, self.arrival(q, 0))
            a_tail = max(a_tail, self.arrival(q, k - 1))
        start, end = self.chunk_times(pe, chunk_cycles(k, width, fabric), a_head, a_tail)

        # numerics of elements done .. done + k
        vals = [self.read(pe, s, k) for s in srcs]
        out = np.zeros(k, dtype=np.float32)
        f = self.freg[pe.index]
        if name in UNARY:
            ew.unary(UNARY[name], vals[0], out, k)
        elif name in BINARY:
            ew.binary(BINARY[name], vals[0], vals[1], out, k)
        elif name in BINARY_SCALAR:
            ew.binary_scalar(BINARY_SCALAR[name], vals[0], f[c], out, k)
        elif name == "vfill":
            out[:] = f[b]
        elif name == "vfma":
            cur = self.read(pe, dst, k)
            ew.fma_scalar(cur, vals[0], f[c], out, k)
        elif name == "rsum":
            f[a] = reduce.rsum(vals[0], k, f[a] if pe.done else np.float32(0))
        elif name == "rmax":
            f[a] = reduce.rmax(vals[0], k, f[a] if pe.done else np.float32(-np.inf))
        elif name == "rdot":
            f[a] = reduce.rdot(vals[0], vals[1], k, f[a] if pe.done else np.float32(0))
        for s in fab_in:
            self.consume(pe, s[COLOR], k, end)
        if dst is not None:
            if dst[KIND] == DSD_FABOUT:
                self.send(pe, dst, out, start, end)
            else:
                self.write(pe, dst, out, k)
        self.finish_chunk(pe, ins, k, n, start, end)

    def check_operands(self, pe: PE, ins, dst, srcs) -> None:
        if dst is not None:
            if dst[KIND] == DSD_FABIN:
                raise Fault(F_FABIN_DEST)
            if ins.roles[ins.destination].startswith("mem") and dst[KIND] != DSD_MEM:
                raise Fault(F_DEST_NOT_MEM)
        for s in srcs:
            if s[KIND] == DSD_FABOUT:
                raise Fault(F_FABOUT_SRC)
        ops = ([dst] if dst is not None else []) + srcs
        counts = {self.elements(d) for d in ops}
        if len(counts) > 1:
            raise Fault(F_COUNT)
        for d in ops:
            if d[KIND] == DSD_MEM:
                self.check_mem(pe, d)
        colors = [s[COLOR] for s in srcs if s[KIND] == DSD_FABIN]
        if len(colors) != len(set(colors)):
            raise Fault(F_SAME_COLOR)

    def chunk_times(self, pe, dur, a_head, a_tail) -> tuple[int, int]:
        """(start, end) of a chunk of `dur` cycles, after the issue overhead if it is the op's
        first chunk; advances the PE's clock and statistics."""
        ovh = self.m.issue_overhead if pe.done == 0 else 0
        t0 = pe.clock
        start = max(t0 + ovh, a_head)
        end = max(start + dur, a_tail + 1)
        pe.busy += ovh + dur
        pe.recv_stall += end - t0 - ovh - dur
        pe.clock = end
        return start, end

    def finish_chunk(self, pe, ins, k, n, start, end) -> None:
        if self.trace_on and len(self.trace) < self.trace_cap:
            self.trace.append((pe.index, pe.pc, start, end))
        pe.done += k
        if pe.done >= n:
            pe.done = 0
            pe.pc += 1
            pe.instructions += 1
            self.class_counts[CLASS_INDEX[ins.cost]] += 1

    def matrix_op(self, pe: PE, ins, d0, d1, d2) -> None:
        if any(d[KIND] != DSD_MEM for d in (d0, d1, d2)):
            raise Fault(F_MATRIX_FABRIC)
        for d in (d0, d1, d2):
            self.elements(d)
        if ins.mnemonic in ("mv", "mva"):
            y, w, x = d0, d1, d2
            m_rows, k_cols = w[LEN], w[COUNT]
            if w[STRIDE] != 1 or self.elements(x) != k_cols or self.elements(y) != m_rows:
                raise Fault(F_SHAPE)
            n_cols = 1
        else:
            cc, w, x = d0, d1, d2  # C = A B
            m_rows, k_cols, n_cols = w[LEN], w[COUNT], x[COUNT]
            if (w[STRIDE] != 1 or x[STRIDE] != 1 or x[LEN] != k_cols or cc[LEN] != m_rows
                    or cc[COUNT] != n_cols):
                raise Fault(F_SHAPE)
            y = cc
        for d in (d0, d1, d2):
            self.check_mem(pe, d)
        width = self.m.simd_width(simd_key(ins.cost, (d0[DTYPE], d1[DTYPE], d2[DTYPE])))
        # one op a column of the tile on a PE (isa.costs): the first op's overhead, then the rest
        ovh = self.m.issue_overhead
        total_cycles = matrix_cycles(m_rows, k_cols, n_cols, width, ovh,
                                     products_by_column(self.m.kind))
        start, end = self.chunk_times(pe, total_cycles - ovh, -1, -1)
        total = m_rows * n_cols
        acc = self.read(pe, y, total) if ins.mnemonic in ("mva", "mma") else \
            np.zeros(total, dtype=np.float32)
        base = int(self.ld.sram_base[pe.index])
        if n_cols == 1 and ins.mnemonic in ("mv", "mva"):
            xv = self.read(pe, x, k_cols)
            matrix.mv(self.f32, self.u16, base + w[ADDR], m_rows, k_cols, w[CSTRIDE], w[DTYPE],
                      xv, acc)
        else:
            matrix.mm(self.f32, self.u16, base + w[ADDR], m_rows, k_cols, w[CSTRIDE], w[DTYPE],
                      base + x[ADDR], n_cols, x[CSTRIDE], x[DTYPE], acc)
        self.write(pe, y, acc, total)
        self.finish_chunk(pe, ins, total, total, start, end)

    # -- operands ------------------------------------------------------------------------------

    def read(self, pe: PE, d, k: int) -> np.ndarray:
        out = np.zeros(k, dtype=np.float32)
        if d[KIND] == DSD_FABIN:
            q = self.queues[(pe.index, d[COLOR])]
            got = 0
            for dl in q:
                take = min(k - got, len(dl.msg.payload) - dl.consumed)
                part = np.zeros(take, dtype=np.float32)
                access.wavelets_to_f32(dl.msg.payload, dl.consumed, take, d[DTYPE], part)
                out[got:got + take] = part
                got += take
                if got == k:
                    break
            return out
        base = int(self.ld.sram_base[pe.index]) + d[ADDR]
        access.gather(self.f32, self.u16, base, d[LEN], d[STRIDE], d[COUNT], d[CSTRIDE],
                      d[DTYPE], pe.done, k, out)
        return out

    def write(self, pe: PE, d, vals: np.ndarray, k: int) -> None:
        base = int(self.ld.sram_base[pe.index]) + d[ADDR]
        access.scatter(self.f32, self.u16, base, d[LEN], d[STRIDE], d[COUNT], d[CSTRIDE],
                       d[DTYPE], pe.done, k, vals)

    # -- the fabric ----------------------------------------------------------------------------

    @staticmethod
    def arrival(q: deque, i: int) -> int:
        """Arrival cycle of the i-th unconsumed wavelet of a queue."""
        for dl in q:
            left = len(dl.msg.payload) - dl.consumed
            if i < left:
                return dl.arrival(dl.consumed + i)
            i -= left
        raise AssertionError("arrival past the queued wavelets")

    def consume(self, pe: PE, color: int, k: int, when: int) -> None:
        q = self.queues[(pe.index, color)]
        self.queued[pe.index * self.ld.colors + color] -= k
        while k:
            dl = q[0]
            take = min(k, len(dl.msg.payload) - dl.consumed)
            dl.consumed += take
            k -= take
            if dl.consumed == len(dl.msg.payload):
                q.popleft()
                if dl.backpressure:
                    self.release(dl.msg, when)

    def release(self, msg: Message, when: int) -> None:
        msg.bp_release = max(msg.bp_release, when)
        msg.bp_pending -= 1
        if msg.bp_pending == 0:
            sender = self.pes[msg.sender]
            new = max(sender.clock, msg.bp_release - self.m.queue_depth)
            sender.bp_stall += new - sender.clock
            sender.clock = new
            self.wake(sender)

    def send(self, pe: PE, d, vals: np.ndarray, start: int, end: int) -> None:
        ld, m = self.ld, self.m
        k = len(vals)
        if k == 0:
            return
        payload = np.zeros(k, dtype=np.uint32)
        access.f32_to_wavelets(vals, k, d[DTYPE], payload, 0)
        msg = Message(payload, pe.index)
        self.messages += 1
        self.wavelets += k
        color = d[COLOR]
        first, count, _ = (int(v) for v in ld.tree_of[pe.index * ld.colors + color])
        head_tail = {}
        root = (start + 1 + m.ramp_latency, end + m.ramp_latency)
        deliveries = []
        for e in range(first, first + count):
            link, parent, dest = (int(v) for v in ld.tree[e])  # (load.TREE_LINK, ...)
            h, t = root if parent < 0 else head_tail[parent]
            pipe = entry_pipe(dest)
            if pipe == PIPE_RELAY:  # the switch relays it: no link of the line of chips
                s_h, s_t = h, max(t, h + k - 1)
            else:
                s_h = max(h, int(self.link_free[link]))
                s_t = max(t, s_h + k - 1)
                self.link_free[link] = s_t + 1
            self.link_wavelets[link] += k
            self.wavelet_hops += k
            if 0 <= pipe < PIPE_RELAY:  # a system link: the chips' shared pipe as well (through a
                copies = 1 + pipe // PIPE_COPY  # switch, the sender's port: a copy a chip)
                s_h, s_t = self.cross_pipe(pipe % PIPE_COPY, s_h, s_t, k * copies)
            if dest >= 0:
                deliveries.append((dest, s_h + m.ramp_latency, s_t + m.ramp_latency))
            else:
                head_tail[e] = (s_h + m.hop_latency, s_t + m.hop_latency)
        for dest, head, tail in deliveries:
            dl = Delivery(msg, head, tail)
            slot = dest * ld.colors + color
            self.queued[slot] += k
            if self.queued[slot] > m.queue_depth:
                dl.backpressure = True
                msg.bp_pending += 1
            self.queues.setdefault((dest, color), deque()).append(dl)
            target = self.pes[dest]
            if target.status == ST_WAIT_RECV and target.wait_color == color:
                self.wake(target)
        if msg.bp_pending:
            pe.status = ST_WAIT_BP
            pe.wait_color = color

    def cross_pipe(self, pipe: int, s_h: int, s_t: int, k: int) -> tuple[int, int]:
        """k wavelets whose head and tail pass the fabric link into `pipe` at s_h and s_t
        cross it: the cycles head and tail leave it (docs/timing-model.md, "Systems")."""
        start = max(s_h * PIPE_TICKS, self.pipe_free[pipe])
        end = start + k * self.pipe_tpw
        self.pipe_free[pipe] = end
        self.pipe_wavelets[pipe] += k
        c_h = -(-start // PIPE_TICKS)
        c_t = max(s_t, c_h, -(-end // PIPE_TICKS) - 1)
        return c_h + self.m.link_latency, c_t + self.m.link_latency

    # -- the result ----------------------------------------------------------------------------

    def result(self, outcome: int, cycles: int) -> RunResult:
        p = self.pes
        arr = lambda attr, dt=np.int64: np.array([getattr(x, attr) for x in p], dtype=dt)  # noqa
        return RunResult(
            outcome=outcome, cycles=int(cycles), pc=arr("pc", np.int32),
            status=arr("status", np.int32), clock=arr("clock"),
            wait_color=arr("wait_color", np.int32), instructions=arr("instructions"),
            busy=arr("busy"), recv_stall=arr("recv_stall"), bp_stall=arr("bp_stall"),
            class_counts=self.class_counts, link_wavelets=self.link_wavelets,
            messages=self.messages, wavelets=self.wavelets, wavelet_hops=self.wavelet_hops,
            fault_pe=self.fault_pe, fault_reason=self.fault_reason, trace=self.trace,
            hbm_read_bytes=self.hbm_read, hbm_write_bytes=self.hbm_written,
            dma_stall=arr("dma_stall"),
            hbm_channel_busy=np.array([-(-t // HBM_TICKS) for t in self.hbm_busy], np.int64),
            pipe_wavelets=self.pipe_wavelets, fault_detail=self.fault_detail)


def channel_bytes(addr: int, nbytes: int, interleave: int, channels: int) -> list[int]:
    """Bytes of [addr, addr + nbytes) on each HBM channel: block addr // interleave lives on
    channel block % channels."""
    out = [0] * channels
    b0, b1 = addr // interleave, (addr + nbytes - 1) // interleave
    if b0 == b1:
        out[b0 % channels] = nbytes
        return out
    out[b0 % channels] += (b0 + 1) * interleave - addr
    out[b1 % channels] += addr + nbytes - b1 * interleave
    full = b1 - b0 - 1  # whole blocks b0 + 1 .. b1 - 1, dealt round robin
    for j in range(min(full, channels)):
        out[(b0 + 1 + j) % channels] += (full // channels + (1 if j < full % channels else 0)) \
            * interleave
    return out


def run(loaded: Loaded, max_cycles: int | None = None, trace: bool = False,
        trace_cap: int = 1_000_000, progress=None) -> RunResult:
    """Run `loaded` to completion with the reference interpreter (mutates loaded.sram)."""
    t = time.perf_counter()
    with np.errstate(all="ignore"):  # IEEE results (inf, nan) are the semantics, not errors
        result = Reference(loaded, max_cycles, trace, trace_cap).run()
    result.host_seconds = time.perf_counter() - t
    return result

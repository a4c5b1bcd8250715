"""What a run returns, shared by the Numba core and the reference interpreter."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# PE status codes (both interpreters use these values).
ST_RUN = 0  # runnable
ST_HALT = 1  # executed halt
ST_WAIT_RECV = 2  # blocked: a fabric input operand has no wavelet queued
ST_WAIT_BP = 3  # blocked: its last message overflowed a receiver queue (backpressure)
ST_FAULT = 4  # an instruction could not execute
STATUS_NAMES = {ST_RUN: "running", ST_HALT: "halted", ST_WAIT_RECV: "waiting for wavelets",
                ST_WAIT_BP: "blocked by backpressure", ST_FAULT: "fault"}

# A system's pipes between chips keep their free time in ticks of 1/PIPE_TICKS cycle: a
# wafer's pipe carries 34 wavelets a cycle, so whole cycles would charge a one-wavelet message
# 34 times its time. (Here, among the constants the core's cached code holds: jit_cache.)
PIPE_TICKS = 1 << 16

# Run outcomes.
RUN_HALTED, RUN_DEADLOCK, RUN_MAX_CYCLES, RUN_FAULT = 0, 1, 2, 3
OUTCOME_NAMES = {RUN_HALTED: "halted", RUN_DEADLOCK: "deadlock", RUN_MAX_CYCLES: "max-cycles",
                 RUN_FAULT: "fault"}

# Fault reasons (index into FAULT_REASONS; detail values are reason-specific).
FAULT_REASONS = (
    "no fault",
    "descriptor outside SRAM",
    "misaligned descriptor address",
    "operand element counts differ",
    "matrix ops take SRAM descriptors only",
    "destination must be an SRAM descriptor",
    "fabric input used as a destination",
    "fabric output used as a source",
    "pc past the end of the code",
    "branch target outside the code",
    "scalar access outside SRAM or misaligned",
    "the same color twice among fabric inputs",
    "matrix operand shapes do not match",
    "no route for this color here (its route at this PE does not accept RAMP)",
    "timing-only: this reads a value computed from data (the program's control flow or "
    "addresses depend on data); run it functionally",
    "DMA descriptor must be a contiguous SRAM descriptor (stride 1, one row or rows back to back)",
    "DMA range outside the program's HBM (hbm_bytes), or its HBM address not aligned to the "
    "element size",
    "DMA tag must be 0..7",
    "DMA range in another GPU's HBM: an SM reaches only its own GPU's",
)
(F_NONE, F_OOB, F_ALIGN, F_COUNT, F_MATRIX_FABRIC, F_DEST_NOT_MEM, F_FABIN_DEST, F_FABOUT_SRC,
 F_PC_END, F_TARGET, F_SCALAR_MEM, F_SAME_COLOR, F_SHAPE, F_NO_ROUTE,
 F_TIMING_DATA, F_DMA_DESC, F_HBM_RANGE, F_DMA_TAG, F_HBM_CHIP) = range(len(FAULT_REASONS))


# the parts of the scheduler's loop the counting build times (core_state.COUNT_LOOP)
LOOP_PARTS = ("first_step", "tensor_ahead", "scalar_ahead", "heap")


@dataclass
class RunResult:
    outcome: int  # RUN_*
    cycles: int  # halted: largest PE clock; max-cycles: the limit; else largest clock reached
    # per PE (index order of Loaded): final state and statistics
    pc: np.ndarray
    status: np.ndarray
    clock: np.ndarray
    wait_color: np.ndarray  # color a blocked PE waits on (-1 if none)
    instructions: np.ndarray
    busy: np.ndarray
    recv_stall: np.ndarray
    bp_stall: np.ndarray
    class_counts: np.ndarray  # instructions per cost class, order of isa.spec.COST_CLASSES
    link_wavelets: np.ndarray  # per link id (cell * 5 + port)
    messages: int
    wavelets: int
    wavelet_hops: int
    fault_pe: int = -1
    fault_reason: int = F_NONE
    host_seconds: float = 0.0  # the run's host time, less compile_seconds
    compile_seconds: float = 0.0  # Numba compiling the core's machine code (a kind's first run)
    host_threads: int = 1  # 2 when tile products ran on the core's helper thread
    trace: list = field(default_factory=list)  # (pe, pc, start, end) tuples when tracing
    # off-chip memory (docs/timing-model.md, HBM and DMA): bytes moved by dmald / dmast, per PE
    # cycles spent waiting in dmawait, per HBM channel cycles it was transferring (rounded up)
    hbm_read_bytes: int = 0
    hbm_write_bytes: int = 0
    dma_stall: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    hbm_channel_busy: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # a system (docs/timing-model.md, "Systems: links between chips"): per pipe (2b: chip b to
    # b + 1, 2b + 1: back) the wavelets that crossed it
    pipe_wavelets: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # what the fault's reason alone does not say (an address, the GPU that owns it), or ""
    fault_detail: str = ""
    # the counting build's split of the loop's host time (WSE_EMU_COUNT=loop, core_state
    # COUNT_LOOP; core.loop_profile): a count and seconds for each of LOOP_PARTS; else empty
    loop_profile: dict = field(default_factory=dict)

    @property
    def outcome_name(self) -> str:
        return OUTCOME_NAMES[self.outcome]

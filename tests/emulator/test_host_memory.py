"""Host memory per PE of a loaded program and of its runs, by the arrays' sizes (nbytes, not
timings or RSS), so that it cannot grow silently: a Llama-3-70B step on four wafers has 3.5 M
PEs, and every 100 bytes a PE is 350 MB there (bench/README.md, "Host memory").

The route tables are built once by the loader, in the int32 form the core runs on, and shared
(not copied) by every run; a timing-only SRAM takes host memory only for the pages written."""

from __future__ import annotations

import ctypes
import json
import mmap
import sys

import numpy as np
import pytest

from wse_emu.emulator import core
from wse_emu.emulator.api import execute
from wse_emu.emulator.core_state import descriptor, static
from wse_emu.emulator.load import SPARSE_MIN, host_zeros, load, write_inputs
from wse_emu.emulator.result import F_COUNT, F_OOB, RUN_FAULT, RUN_HALTED
from wse_emu.isa.compiler.pipeline import compile_model
from wse_emu.isa.machine import load_machine
from programs.conftest import same_run
from tests.emulator.test_core_outcomes import one_pe

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 64, "intermediate_size": 512, "vocab_size": 512,
         "max_position_embeddings": 64, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}

# Bytes a PE (nbytes of every array, SRAM, HBM and the timing-only unknown-word map aside, as
# those scale with what the program declares, not with its PEs). This program measures 544
# (loader) + 58 (a run's shared tables) + 1,799 (a run's buffers) = 2,401, of which the
# descriptor table is 512 (int32 words); it measured 2,913 with int64 descriptors, and
# 667 + 779 + 2,609 = 4,055 before that (int64 route entries and copies of the loader's tables
# in every Loaded's run tables, int64 input queues, the registers' initial values kept by the
# loader): any one of those coming back crosses a budget.
LOADER_BUDGET = 650
TOTAL_BUDGET = 2_550
DATA = {"sram", "unknown", "hbm"}


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    (folder / "config.json").write_text(json.dumps(LLAMA))
    machine = load_machine("wse3")
    program, _ = compile_model(str(folder), machine, dtype="bf16", shape_only=True,
                               max_context=32)
    loaded = load(program, machine, with_data=False)
    write_inputs(loaded, {"input_ids": np.array([1], np.int32),
                          "position_ids": np.array([3], np.int32)})
    result = core.run(loaded)
    assert result.outcome_name == "halted"
    return loaded


def _arrays(obj) -> dict[str, np.ndarray]:
    return {k: v for k, v in vars(obj).items() if isinstance(v, np.ndarray)}


def test_route_tables_are_int32_and_shared_with_every_run(llama_run):
    ld = llama_run
    fixed = static(ld)
    assert ld.tree.dtype == ld.tree_of.dtype == ld.queue_slots.dtype == np.int32
    assert ld.tree.shape == (len(ld.tree), 3) and ld.tree_of.shape == (ld.n_pes * ld.colors, 3)
    assert fixed.tree is ld.tree and fixed.tree_of is ld.tree_of
    assert fixed.queue_slots is ld.queue_slots
    # the named columns are views, not copies
    for name in ("tree_start", "tree_count", "tree_link", "tree_parent", "tree_dest"):
        assert np.shares_memory(getattr(ld, name), ld.tree_of if "start" in name or
                                "count" in name else ld.tree)
    # nothing the run keeps duplicates a loader table
    for name, arr in _arrays(fixed).items():
        for kept in _arrays(ld).values():
            assert arr is kept or not np.shares_memory(arr, kept), name
    assert fixed.buffers["queue"].dtype == np.int32


def test_host_bytes_per_pe_stay_within_the_budget(llama_run):
    ld = llama_run
    n = ld.n_pes
    fixed = static(ld)
    mine = _arrays(ld)
    loader = sum(a.nbytes for k, a in mine.items() if k not in DATA)
    shared = sum(a.nbytes for a in _arrays(fixed).values()
                 if not any(a is b for b in mine.values()))
    buffers = sum(a.nbytes for a in fixed.buffers.values())
    assert loader / n <= LOADER_BUDGET, f"loader: {loader / n:.0f} bytes a PE"
    assert (loader + shared + buffers) / n <= TOTAL_BUDGET, \
        f"loader {loader / n:.0f} + tables {shared / n:.0f} + buffers {buffers / n:.0f} a PE"


def _resident_pages(arr: np.ndarray) -> int:
    """Pages of `arr` that are in memory (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    addr = arr.__array_interface__["data"][0]
    lo = addr // page * page
    n = -(-(addr + arr.nbytes - lo) // page)
    vec = (ctypes.c_ubyte * n)()
    assert libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(n * page), vec) == 0
    return int(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8) & 1))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore: Linux")
def test_a_timing_only_sram_takes_memory_only_where_written(llama_run):
    """A byte written every 37 KB (code at the start of every PE's SRAM) maps a 4 KB page
    each, not the whole array, as NumPy's 2 MB pages did; pages only read map nothing."""
    size = 64 * SPARSE_MIN
    a = host_zeros(size)
    assert a.size == size and a.dtype == np.uint8 and a.flags.writeable
    at = np.arange(0, size, 36_980)
    a[at] = 1
    assert not a[at + 1].any()  # (reads of the pages written)
    assert _resident_pages(a) <= len(at) + 2
    assert int(a.sum()) == len(at)  # zeros elsewhere
    small = host_zeros(100)
    assert small.size == 100 and not small.any()


def test_the_loader_and_the_core_name_the_same_columns():
    """The core runs on the loader's tables as they are: their columns must mean the same."""
    from wse_emu.emulator import core_state as cs, load as ld, load_routes as lr

    assert (ld.TREE_START, ld.TREE_COUNT, ld.TREE_NDEST) == (cs.T_START, cs.T_COUNT,
                                                             cs.T_NDEST) == \
        (lr.SLOT_START, lr.SLOT_COUNT, lr.SLOT_NDEST)
    assert (ld.TREE_LINK, ld.TREE_PARENT, ld.TREE_DEST) == (cs.E_LINK, cs.E_PARENT,
                                                            cs.E_DEST) == \
        (lr.ENTRY_LINK, lr.ENTRY_PARENT, lr.ENTRY_DEST)
    assert ld.TREE_PIPE0 == cs.E_PIPE0 == lr.PIPE0
    assert [ld.entry_pipe(d) for d in (5, 0, -1, -2, -3, -9)] == [-1, -1, -1, 0, 1, 7]



def _set(rb, reg, value):
    """reg = value, any int64 whose high half fits 32 bits signed, from 32-bit immediates."""
    rb.li(reg, value >> 32)
    rb.shli(reg, reg, 32)
    rb.li("r2", (value >> 16) & 0xFFFF)
    rb.shli("r2", "r2", 16)
    rb.addi("r2", "r2", value & 0xFFFF)
    rb.add(reg, reg, "r2")


BIG = 1 << 32
# body(rb, buf), the fault expected (None: the run halts), and (register, field, value) of a
# descriptor as it must read back afterwards (descriptor(): kind, addr, len, stride, count,
# cstride, dtype, color)
DESCRIPTORS = {
    # an address or length that only a wrap to 32 bits would make valid
    "addr 2**32 + 64": (lambda rb, buf: (_set(rb, "r1", BIG), rb.daddr(0, "r1", 64),
                                         rb.vmov(1, 0)), F_OOB, (0, 1, BIG + 64)),
    "len 2**32 + 8": (lambda rb, buf: (_set(rb, "r1", BIG + 8), rb.dlen(1, "r1"),
                                       rb.vadd(1, 0, 1)), F_COUNT, (1, 2, BIG + 8)),
    "len -2**40": (lambda rb, buf: (_set(rb, "r1", -(1 << 40)), rb.dlen(1, "r1"),
                                    rb.vmov(1, 0)), F_COUNT, (1, 2, -(1 << 40))),
    "stride -2**31": (lambda rb, buf: (rb.dstride(0, -(1 << 31)), rb.vmov(1, 0)), F_OOB,
                      (0, 3, -(1 << 31))),
    "stride 2**31 - 1": (lambda rb, buf: (rb.dstride(0, (1 << 31) - 1), rb.vmov(1, 0)), F_OOB,
                         (0, 3, (1 << 31) - 1)),
    "count 65535, cstride -32768": (lambda rb, buf: (rb.d2d(0, 65535, -32768), rb.vmov(1, 0)),
                                    F_COUNT, (0, 4, 65535)),
    # count 0: no element whatever the length, and a run that halts
    "len 2**40, count 0": (lambda rb, buf: (_set(rb, "r1", 1 << 40), rb.dlen(0, "r1"),
                                            rb.d2d(0, 0, 3), rb.d2d(1, 0, -3), rb.vmov(1, 0)),
                           None, (0, 2, 1 << 40)),
}


@pytest.mark.parametrize("case", DESCRIPTORS)
def test_int32_descriptors_keep_every_field_whole(case):
    """The descriptor table is int32 words (core_state, D_TYPE ...): an int64 address or length
    from a register and the extreme immediates of stride, count and cstride must fault (or
    not) exactly as the reference's Python ints do, and read back whole."""
    body, fault, (reg, field, value) = DESCRIPTORS[case]
    program = one_pe(body)
    a = execute(program, "tiny", engine="core")
    b = execute(program, "tiny", engine="reference")
    same_run(a, b)
    assert (a.result.fault_pe, a.result.fault_reason) == (b.result.fault_pe,
                                                          b.result.fault_reason)
    assert a.result.outcome == (RUN_HALTED if fault is None else RUN_FAULT)
    if fault is not None:
        assert a.result.fault_reason == fault
    assert descriptor(static(a.loaded).buffers["dsd"], 0, reg)[field] == value

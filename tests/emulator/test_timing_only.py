"""Timing-only mode: no SRAM contents, no values computed, and exactly the functional cycles.

A program whose control flow or addresses would depend on computed data is refused with a
fault saying so; host inputs (token ids, positions) still drive control flow, because the PEs
that read them with scalar loads keep their SRAM."""

from __future__ import annotations

import numpy as np
import pytest

from emulator.api import execute
from emulator.generate import Generator
from emulator.load import LoadError, load, read_output
from emulator.machine import load_machine
from emulator.result import FAULT_REASONS, F_TIMING_DATA, RUN_FAULT, RUN_HALTED
from isa.builder import ProgramBuilder
from isa.compiler import compile_model
from programs.conftest import build

FIELDS = ("pc", "status", "clock", "instructions", "busy", "recv_stall", "bp_stall",
          "class_counts", "link_wavelets")


def same_timing(a, b) -> None:
    ra, rb = a.result, b.result
    assert ra.outcome == rb.outcome == RUN_HALTED
    assert ra.cycles == rb.cycles
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(ra, field), getattr(rb, field), err_msg=field)
    assert (ra.messages, ra.wavelets, ra.wavelet_hops) == (rb.messages, rb.wavelets,
                                                            rb.wavelet_hops)


rng = np.random.default_rng(7)
PROGRAMS = {
    "gemv-f32": (lambda: build("gemv", {"W": rng.standard_normal((64, 96), dtype=np.float32)},
                               M=64, K=96, P=4, Q=3), "tiny",
                 {"x": rng.standard_normal(96).astype(np.float32)}),
    "gemv-bf16": (lambda: build("gemv", {"W": rng.standard_normal((64, 64), dtype=np.float32)},
                                M=64, K=64, P=2, Q=4, DT="bf16"), "tiny",
                  {"x": rng.standard_normal(64).astype(np.float32)}),
    "allreduce-tree": (lambda: build("allreduce", N=32, NX=4, NY=4, MODE=3), "test64",
                       {"v": rng.standard_normal((16, 32)).astype(np.float32)}),
    "gemm": (lambda: build("gemm", {"A": rng.standard_normal((16, 16), dtype=np.float32),
                                    "B": rng.standard_normal((16, 16), dtype=np.float32)},
                           M=16, K=16, N=16, P=2), "tiny", {}),
    "softmax": (lambda: build("softmax", N=96, Q=4), "tiny",
                {"x": rng.standard_normal(96).astype(np.float32)}),
    "stress": (lambda: build("stress", NX=4, NY=4, L=6), "tiny", {}),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_example_programs_take_the_same_cycles_without_data(name):
    make, machine, inputs = PROGRAMS[name]
    program = make()
    try:
        functional = execute(program, machine, inputs)
    except LoadError as e:  # a parameter set the program does not take
        pytest.skip(str(e))
    timing = execute(program, machine, inputs, timing_only=True)
    same_timing(functional, timing)
    assert timing.outputs == {}
    # only PEs whose code has scalar loads or stores keep SRAM
    ld = timing.loaded
    scalar = {"lw", "sw", "flw", "fsw"}
    keeps = [any(line.split()[0] in scalar for line in _mnemonics(r)) for r in program.regions]
    expected = np.repeat(keeps, [r.rect.size for r in program.regions])
    np.testing.assert_array_equal(ld.sram_row >= 0, expected)
    assert ld.sram.size == max(1, int(expected.sum())) * ld.pe_stride


def _mnemonics(region):
    from isa.encoding import decode_fields
    from isa.spec import INSTRUCTIONS
    names = {i.opcode: i.mnemonic for i in INSTRUCTIONS}
    return [names[int(op)] for op in decode_fields(region.code)["op"]]


def _reads_computed_value(via: str):
    pb = ProgramBuilder("depends")
    rb = pb.region("one", 0, 0, 1, 1)
    buf = rb.alloc("buf", 64)
    rb.dmem("d1", "f32", buf, 16)
    rb.fli("f1", 2.0)
    rb.vfill("d1", "f1")
    if via == "ftoi":
        rb.rsum("f2", "d1")
        rb.ftoi("r1", "f2")  # a loop count from a reduction
    else:
        rb.lw("r1", "r0", buf + 8)  # an address from a computed buffer
    rb.halt()
    return pb.build()


@pytest.mark.parametrize("via", ["ftoi", "lw"])
def test_control_flow_on_computed_data_is_refused(via):
    program = _reads_computed_value(via)
    assert execute(program, "tiny").result.outcome == RUN_HALTED
    ex = execute(program, "tiny", timing_only=True)
    assert ex.result.outcome == RUN_FAULT
    assert ex.result.fault_reason == F_TIMING_DATA
    assert "run it functionally" in FAULT_REASONS[F_TIMING_DATA]


def test_float_taint_follows_scalar_ops_and_clears_on_immediates():
    pb = ProgramBuilder("taint")
    rb = pb.region("one", 0, 0, 1, 1)
    buf = rb.alloc("buf", 64)
    rb.dmem("d1", "f32", buf, 16)
    rb.rsum("f2", "d1")
    rb.fli("f3", 1.0)
    rb.fadd("f4", "f3", "f3")  # known + known: known
    rb.ftoi("r1", "f4")
    rb.fmul("f5", "f2", "f3")  # unknown * known: unknown
    rb.fli("f5", 4.0)  # overwritten by an immediate: known again
    rb.ftoi("r2", "f5")
    rb.fmul("f6", "f2", "f3")
    rb.ftoi("r3", "f6")  # this one depends on data
    rb.halt()
    ex = execute(pb.build(), "tiny", timing_only=True)
    assert ex.result.outcome == RUN_FAULT and ex.result.fault_reason == F_TIMING_DATA
    assert int(ex.result.pc[0]) == 9  # the last ftoi, not the earlier ones


def test_host_inputs_still_drive_control_flow():
    """A PE that reads an input with lw keeps its SRAM: a loop count from the host works."""
    pb = ProgramBuilder("loops")
    pb.input("n", "i32", (1,))
    rb = pb.region("one", 0, 0, 1, 1)
    cell = rb.alloc("n", 4)
    buf = rb.alloc("buf", 64)
    rb.piece("n", cell, "i32", (1, 1))
    rb.lw("r1", "r0", cell)
    rb.dmem("d1", "f32", buf, 16)
    rb.label("top")
    rb.vmov("d1", "d1")
    rb.addi("r1", "r1", -1)
    rb.blt("r0", "r1", "top")
    rb.halt()
    program = pb.build()
    for n in (1, 5):
        f = execute(program, "tiny", {"n": np.array([n], np.int32)})
        t = execute(program, "tiny", {"n": np.array([n], np.int32)}, timing_only=True)
        same_timing(f, t)
        assert t.loaded.sram_row.tolist() == [0]
    assert execute(program, "tiny", {"n": np.array([5], np.int32)}).result.cycles > \
        execute(program, "tiny", {"n": np.array([1], np.int32)}).result.cycles


def test_outputs_cannot_be_read_in_timing_only_mode():
    make, machine, inputs = PROGRAMS["softmax"]
    ld = load(make(), load_machine(machine), with_data=False)
    with pytest.raises(LoadError, match="timing-only run computes no values"):
        read_output(ld, "y")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from tests.graph.hf_models import make_gpt2, make_llama
    root = tmp_path_factory.mktemp("models")
    return {"gpt2": make_gpt2(root, hidden=64, layers=2, heads=4, vocab=256),
            "llama": make_llama(root, hidden=64, layers=2, heads=4, kv_heads=2,
                                intermediate=128, vocab=256)}


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_shape_only_decoders_decode_in_the_same_cycles(tiny_models, arch):
    machine = load_machine("test64")
    full, _ = compile_model(tiny_models[arch], machine, max_context=16)
    shape, _ = compile_model(tiny_models[arch], machine, max_context=16, shape_only=True)
    assert [r.code for r in full.regions] == [r.code for r in shape.regions]
    a = Generator(full, machine).generate([3, 1, 4], 4)
    # the token id picks which embedding PE adds its row (a data-dependent branch on a host
    # input, which timing-only mode follows): feed the functional run's tokens
    g = Generator(shape, machine, timing_only=True)
    cycles = []
    for tok in [3, 1, 4] + a.generated_ids[:3]:
        assert g.step(tok) is None
        cycles.append(g.last_result.cycles)
    assert cycles[2:] == a.cycles_per_token
    assert sum(cycles[:2]) == a.prefill_cycles
    b = Generator(shape, machine, timing_only=True).generate([3, 1, 4], 4)
    assert b.generated_ids == [] and b.timing_only and len(b.cycles_per_token) == 4
    assert set(b.per_layer) == set(a.per_layer)
    g = Generator(shape, machine, timing_only=True)
    assert g.loaded.sram.size < 0.2 * g.loaded.n_pes * g.loaded.pe_stride

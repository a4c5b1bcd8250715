"""Timing-only mode: no SRAM contents, no values computed, and exactly the functional cycles.

A program whose control flow or addresses would depend on computed data is refused with a
fault saying so; host inputs (token ids, positions) still drive control flow, because the PEs
that read them with scalar loads keep their SRAM. Computed words are tracked one by one and
stay unknown across runs, like the SRAM that holds them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wse_emu.emulator.api import execute
from wse_emu.emulator.core import run
from wse_emu.emulator.core_state import static
from wse_emu.emulator.generate import Generator
from wse_emu.emulator.load import LoadError, load, read_output, write_input
from wse_emu.isa.machine import load_machine
from wse_emu.emulator.result import (FAULT_REASONS, F_SCALAR_MEM, F_TIMING_DATA, RUN_FAULT,
                             RUN_HALTED)
from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.encoding import decode_fields
from wse_emu.isa.spec import INSTRUCTIONS
from programs.conftest import build
from tests.emulator.test_reference_vs_core import KINDS, TINY_HBM, build_program

FIELDS = ("pc", "status", "clock", "instructions", "busy", "recv_stall", "bp_stall",
          "class_counts", "link_wavelets")
MNEMONIC = {i.opcode: i.mnemonic for i in INSTRUCTIONS}


def same_timing(a, b) -> None:
    ra, rb = a.result, b.result
    assert ra.outcome == rb.outcome == RUN_HALTED
    assert ra.cycles == rb.cycles
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(ra, name), getattr(rb, name), err_msg=name)
    assert (ra.messages, ra.wavelets, ra.wavelet_hops) == (rb.messages, rb.wavelets,
                                                            rb.wavelet_hops)


def _mnemonics(region) -> list[str]:
    return [MNEMONIC[int(op)] for op in decode_fields(region.code)["op"]]


rng = np.random.default_rng(7)


def _vec(n):
    return rng.standard_normal(n).astype(np.float32)


def _mat(m, k):
    return rng.standard_normal((m, k), dtype=np.float32)


# every example program in programs/, in the configurations its own tests use
PROGRAMS = {
    **{f"gemv-{dt}-{p}x{q}": (lambda dt=dt, p=p, q=q: build(
        "gemv", {"W": _mat(64, 96)}, M=64, K=96, P=p, Q=q, DT=dt), "tiny", {"x": _vec(96)})
       for dt in ("f32", "f16", "bf16") for p, q in ((1, 1), (4, 1), (2, 3))},
    **{f"allreduce-mode{mode}-{w}x{h}": (lambda mode=mode, w=w, h=h: build(
        "allreduce", N=32, NX=w, NY=h, MODE=mode), "test64",
        {"v": rng.standard_normal((w * h, 32)).astype(np.float32)})
       for mode in (0, 1) for w, h in ((8, 1), (4, 4), (2, 8))},
    **{f"gemm-{dt}-p{p}": (lambda dt=dt, p=p: build(
        "gemm", {"A": _mat(16, 16), "B": _mat(16, 16)}, M=16, K=16, N=16, P=p, DT=dt), "tiny",
        {}) for dt in ("f32", "bf16") for p in (2, 4)},
    **{f"softmax-q{q}": (lambda q=q: build("softmax", N=96, Q=q), "tiny", {"x": _vec(96)})
       for q in (2, 3, 8)},
    "stress": (lambda: build("stress", NX=4, NY=4, L=6), "tiny", {}),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_example_programs_take_the_same_cycles_without_data(name):
    make, machine, inputs = PROGRAMS[name]
    program = make()
    functional = execute(program, machine, inputs)
    timing = execute(program, machine, inputs, timing_only=True)
    same_timing(functional, timing)
    assert timing.outputs == {} and functional.outputs
    # only PEs whose code has scalar loads or stores keep SRAM, their region's footprint
    ld = timing.loaded
    scalar = {"lw", "sw", "flw", "fsw"}
    keeps = [bool(scalar & set(_mnemonics(r))) for r in program.regions]
    expected = np.repeat(keeps, [r.rect.size for r in program.regions])
    np.testing.assert_array_equal(ld.sram_base >= 0, expected)
    assert ld.sram.size == max(8, int(((ld.sram_len[expected] + 7) // 8 * 8).sum()))
    np.testing.assert_array_equal(ld.sram_len, functional.loaded.sram_len)
    # messages carry no payload: the pool never grew from its stand-in size
    assert static(ld).buffers["payload"].size == 16


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_random_programs_take_the_same_cycles_or_are_refused(seed):
    """Random programs of every instruction class: the functional cycles, or a refusal at an
    instruction that turns computed data into an integer (lw of a computed word, ftoi)."""
    program = build_program(seed)
    functional = execute(program, TINY_HBM)
    timing = execute(program, TINY_HBM, timing_only=True)
    r = timing.result
    if r.outcome == RUN_FAULT:
        assert r.fault_reason == F_TIMING_DATA
        code = _mnemonics(program.regions[0])
        assert code[int(r.pc[r.fault_pe])] in ("lw", "ftoi")
        # up to the refusal the run went as the functional one did
        assert r.instructions[r.fault_pe] <= functional.result.instructions[r.fault_pe]
    else:
        same_timing(functional, timing)
    # without conversions and scalar loads nothing can be refused
    clean = build_program(seed, kinds=[k for k in KINDS if k not in ("conv", "scalar_mem")])
    same_timing(execute(clean, TINY_HBM), execute(clean, TINY_HBM, timing_only=True))


def _one_pe(body, inputs=()):
    pb = ProgramBuilder("one")
    for name in inputs:
        pb.input(name, "i32", (1,))
    rb = pb.region("one", 0, 0, 1, 1)
    buf = rb.alloc("buf", 64)
    rb.init(buf, "i32", list(range(100, 116)))
    body(rb, buf)
    rb.halt()
    return pb.build()


def _refused(program, at: int | None = None, inputs=None):
    assert execute(program, "tiny", inputs).result.outcome == RUN_HALTED
    r = execute(program, "tiny", inputs, timing_only=True).result
    assert (r.outcome, r.fault_reason) == (RUN_FAULT, F_TIMING_DATA)
    if at is not None:
        assert int(r.pc[0]) == at
    return r


def _allowed(program, inputs=None):
    same_timing(execute(program, "tiny", inputs), execute(program, "tiny", inputs,
                                                          timing_only=True))


def test_a_branch_on_a_reduction_is_refused():
    def body(rb, buf):
        rb.dmem("d1", "f32", buf, 16)
        rb.rsum("f2", "d1")
        rb.ftoi("r1", "f2")  # a loop count from a reduction
        rb.label("top")
        rb.addi("r1", "r1", -1)
        rb.blt("r0", "r1", "top")
    _refused(_one_pe(body), at=2)
    assert "timing-only" in FAULT_REASONS[F_TIMING_DATA]
    assert "run it functionally" in FAULT_REASONS[F_TIMING_DATA]


@pytest.mark.parametrize("op", ["vfill", "mv"])
def test_a_load_of_a_computed_word_is_refused(op):
    def body(rb, buf):
        rb.dmem("d1", "f32", buf, 4)
        if op == "vfill":
            rb.fli("f1", 2.0)
            rb.vfill("d1", "f1")
        else:  # y = W x with a 4 x 1 W at buf + 16 and x at buf + 32: y is buf[0:4]
            rb.dmem("d2", "f32", buf + 16, 4)
            rb.dmem("d3", "f32", buf + 32, 1)
            rb.mv("d1", "d2", "d3")
        rb.lw("r1", "r0", buf + 8)  # an address or a count from computed data
    _refused(_one_pe(body), at=3 if op == "vfill" else 4)


def test_a_load_of_a_received_word_is_refused():
    pb = ProgramBuilder("recv")
    pb.route(0, 0, 1, 1, 0, rx="RAMP", tx="E")
    pb.route(1, 0, 1, 1, 0, rx="W", tx="RAMP")
    a = pb.region("send", 0, 0, 1, 1)
    src = a.alloc("src", 16)
    a.dmem("d1", "f32", src, 4)
    a.dfout("d2", "f32", 0, 4)
    a.vmov("d2", "d1")
    a.halt()
    b = pb.region("recv", 1, 0, 1, 1)
    dst = b.alloc("dst", 16)
    b.dmem("d1", "f32", dst, 4)
    b.dfin("d2", "f32", 0, 4)
    b.vmov("d1", "d2")
    b.lw("r1", "r0", dst + 4)
    b.halt()
    program = pb.build()
    assert execute(program, "tiny").result.outcome == RUN_HALTED
    r = execute(program, "tiny", timing_only=True).result
    assert (r.outcome, r.fault_pe, r.fault_reason, int(r.pc[1])) == (RUN_FAULT, 1,
                                                                     F_TIMING_DATA, 3)


def test_computed_words_are_tracked_one_by_one():
    """A strided or 16-bit write marks exactly the words it touches."""
    def strided(word):
        def body(rb, buf):
            rb.dmem("d1", "f32", buf, 4)
            rb.dstride("d1", 2)  # words 0, 2, 4, 6
            rb.fli("f1", 1.0)
            rb.vfill("d1", "f1")
            rb.lw("r1", "r0", buf + 4 * word)
        return _one_pe(body)
    for word in (1, 3, 5, 7, 8):
        _allowed(strided(word))
    for word in (0, 2, 6):
        _refused(strided(word), at=4)

    def half(word):
        def body(rb, buf):
            rb.dmem("d1", "bf16", buf + 2, 3)  # bytes 2..7: words 0 and 1
            rb.fli("f1", 1.0)
            rb.vfill("d1", "f1")
            rb.lw("r1", "r0", buf + 4 * word)
        return _one_pe(body)
    _refused(half(0))
    _refused(half(1))
    _allowed(half(2))


def test_stores_decide_what_a_word_holds():
    def body(store_unknown):
        def fn(rb, buf):
            rb.dmem("d1", "f32", buf, 4)
            rb.fli("f1", 1.0)
            rb.vfill("d1", "f1")  # words 0..3 unknown
            rb.li("r2", 5)
            rb.sw("r2", "r0", buf)  # word 0 known again
            rb.lw("r3", "r0", buf)
            rb.rsum("f2", "d1")
            rb.fsw("f2" if store_unknown else "f1", "r0", buf + 16)  # word 4
            rb.flw("f3", "r0", buf + 16)  # a float may be unknown ...
            rb.ftoi("r4", "f3")  # ... an integer from it may not
        return _one_pe(fn)
    _allowed(body(store_unknown=False))
    _refused(body(store_unknown=True), at=9)


def test_float_taint_follows_scalar_ops_and_clears_on_immediates():
    def body(rb, buf):
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
    _refused(_one_pe(body), at=9)


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
        assert t.loaded.sram_base.tolist() == [0]
    assert execute(program, "tiny", {"n": np.array([5], np.int32)}).result.cycles > \
        execute(program, "tiny", {"n": np.array([1], np.int32)}).result.cycles


def test_computed_words_stay_unknown_across_runs_until_the_host_writes_them():
    """Like a KV cache: what one run computed, the next run must not branch on; a host
    input written over it is known again."""
    pb = ProgramBuilder("twice")
    pb.input("n", "i32", (1,))
    rb = pb.region("one", 0, 0, 1, 1)
    cell = rb.alloc("n", 16)
    rb.piece("n", cell, "i32", (1, 1))
    rb.lw("r1", "r0", cell)
    rb.dmem("d1", "f32", cell, 4)
    rb.fli("f1", 3.0)
    rb.vfill("d1", "f1")  # overwrites the input with computed data
    rb.halt()
    program = pb.build()
    ld = load(program, load_machine("tiny"), with_data=False)
    write_input(ld, "n", np.array([2], np.int32))
    assert run(ld).outcome == RUN_HALTED
    r = run(ld)
    assert (r.outcome, r.fault_reason, int(r.pc[0])) == (RUN_FAULT, F_TIMING_DATA, 0)
    write_input(ld, "n", np.array([2], np.int32))
    assert run(ld).outcome == RUN_HALTED


def test_a_replayed_fault_starts_from_the_unknown_words_the_run_started_with():
    """PE 0 loads a word, then computes over it; PE 1 faults a cycle later. PE 0 ran ahead
    past its store before the fault, so the strict replay must see PE 0's word as it was."""
    pb = ProgramBuilder("replay")
    a = pb.region("a", 0, 0, 1, 1)
    buf = a.alloc("buf", 16)
    a.lw("r1", "r0", buf)
    a.dmem("d1", "f32", buf, 4)
    a.fli("f1", 1.0)
    a.vfill("d1", "f1")
    a.halt()
    b = pb.region("b", 1, 0, 1, 1)
    b.li("r1", 2)
    b.lw("r2", "r1", 0)  # misaligned
    b.halt()
    program = pb.build()
    f = execute(program, "tiny").result
    t = execute(program, "tiny", timing_only=True).result
    for r in (f, t):
        assert (r.outcome, r.fault_pe, r.fault_reason) == (RUN_FAULT, 1, F_SCALAR_MEM)
    assert t.cycles == f.cycles and t.pc.tolist() == f.pc.tolist()


def test_outputs_cannot_be_read_in_timing_only_mode():
    make, machine, inputs = PROGRAMS["softmax-q2"]
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
    assert [r.rect for r in full.regions] == [r.rect for r in shape.regions]
    assert full.routes == shape.routes
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
    # per-PE statistics too: the functional generator's last run was the same position
    f = Generator(full, machine)
    for tok in [3, 1, 4] + a.generated_ids[:3]:
        f.step(tok)
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(f.last_result, name),
                                      getattr(g.last_result, name), err_msg=name)
    # memory: only the embedding and attention PEs keep SRAM
    assert g.loaded.sram.size < 0.25 * f.loaded.sram.size
    assert f.loaded.sram.size == ((f.loaded.sram_len + 7) // 8 * 8).sum()


def test_timing_only_generate_feeds_a_given_token(tiny_models):
    machine = load_machine("test64")
    shape, _ = compile_model(tiny_models["gpt2"], machine, max_context=16, shape_only=True)
    res = Generator(shape, machine, timing_only=True).generate([3, 1], 3, decode_token=9)
    assert res.generated_ids == [] and res.timing_only and res.mode == "timing-only"
    assert res.decode_token == 9 and "no token can be sampled" in res.note
    g = Generator(shape, machine, timing_only=True)
    steps = []
    for tok in (3, 1, 9, 9):
        g.step(tok)
        steps.append(g.last_result.cycles)
    assert res.cycles_per_token == steps[1:] and res.prefill_cycles == steps[0]
    # the attention PEs appended to their caches: computed words, forgotten by a reset
    assert g.loaded.unknown.any()
    g.reset()
    assert not g.loaded.unknown.any() and g.n_past == 0
    default = Generator(shape, machine, timing_only=True).generate([3, 1], 2)
    assert default.decode_token == 1
    full, _ = compile_model(tiny_models["gpt2"], machine, max_context=16)
    with pytest.raises(LoadError, match="only given in timing-only mode"):
        Generator(full, machine).generate([3], 2, decode_token=9)
    assert Generator(full, machine).generate([3], 1).mode == "functional"


def test_generate_reports_a_run_s_progress_while_it_goes(tiny_models, monkeypatch):
    """Generator.on_cycles is called from inside a run (the CLI's bar within a long step),
    with the cycles reached so far, rising, and changes nothing the run gives."""
    from wse_emu.emulator import core

    machine = load_machine("test64")
    shape, _ = compile_model(tiny_models["gpt2"], machine, max_context=16, shape_only=True)
    plain = Generator(shape, machine, timing_only=True).generate([3], 2)
    monkeypatch.setattr(core, "PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr(core, "SLICE_SECONDS", 0.0)
    monkeypatch.setattr(core, "FIRST_BUDGET", 16)
    monkeypatch.setattr(core, "MIN_BUDGET", 16)
    g = Generator(shape, machine, timing_only=True)
    calls = []
    g.on_cycles = lambda cycles, instructions: calls.append((cycles, instructions))
    watched = g.generate([3], 2)
    assert watched.cycles_per_token == plain.cycles_per_token
    assert watched.prefill_cycles == plain.prefill_cycles
    assert len(calls) > 4
    cycles = [c for c, _ in calls]
    # the earliest clock the loop has not passed (a woken PE may be pushed a little behind the
    # one before): never beyond the run's end, and it gets there
    longest = max(plain.prefill_cycles, *plain.cycles_per_token)
    assert 0 <= min(cycles) and max(cycles) <= longest and max(cycles) > longest // 2


def test_the_sram_snapshot_puts_back_exactly_what_was_there():
    from wse_emu.emulator.load import PAGE, PageSnapshot

    sram = np.zeros(5 * PAGE + 24, dtype=np.uint8)
    sram[[10, PAGE * 3 + 7, 5 * PAGE + 3]] = [1, 2, 3]  # pages 0 and 3 and the tail
    original = sram.copy()
    snap = PageSnapshot(sram)
    assert snap.pages.tolist() == [0, 3]
    sram[PAGE * 3 + 7] = 9  # a kept page changed
    sram[PAGE * 1 + 1] = 5  # a page that was empty
    sram[5 * PAGE + 20] = 4  # the tail
    snap.restore(sram)
    np.testing.assert_array_equal(sram, original)


def test_a_big_shape_only_program_needs_a_fraction_of_the_memory(tmp_path):
    """GPT-2 with a 4k vocabulary and 8 layers on wse3: the timing-only Loaded keeps SRAM for
    the embedding and attention PEs only, and no weights are read."""
    import json
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 512,
           "n_layer": 8, "n_head": 4, "n_positions": 64, "vocab_size": 4096,
           "activation_function": "gelu_new"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    machine = load_machine("wse3")
    program, _ = compile_model(tmp_path, machine, dtype="bf16", max_context=16, shape_only=True)
    ld = load(program, machine, with_data=False)
    functional_bytes = int(((ld.sram_len + 7) // 8 * 8).sum())
    assert ld.n_pes > 3000  # thousands of PEs
    assert ld.sram.size < 0.1 * functional_bytes
    assert ld.unknown.size == ld.sram.size // 4
    write_input(ld, "input_ids", np.array([5], np.int32))
    assert run(ld).outcome == RUN_HALTED

"""Host cost of a model-sized decode step, each beside a NumPy forward pass of the same model.

Run: .venv/bin/python -m pytest bench/test_model_bench.py -o addopts=""  (the test suite skips
benchmarks). Each case stores the emulator's host seconds a decode step, the NumPy reference's
and their ratio in extra_info, with the emulated cycles and tokens/s; bench/README.md lists them.

Each case runs on wse3 (weights resident in PE SRAM) and on h100 (the HBM target: weights
streamed from HBM through the SMs, isa/compiler/hbm.py).

- Llama-3-8B shape, timing-only: a shape-only compile (bf16, max_context 16) and one
  decode step at position 15. The NumPy reference (isa.graph_numpy.GraphRunner, fp32) runs the
  same graph with random weights, but reuses ONE layer's weights for all 32 layers and the
  token-embedding table as the LM head: the same shapes and FLOPs (every matrix is still read
  once a layer), in 3 GB instead of the 32 GB that distinct fp32 weights would need.
- GPT-2-small shape (124 M weights), functional, bf16: random weights rounded to bf16
  values, so the fp32 reference reads the very numbers the mesh holds (and keeps bf16 KV
  caches, as the compiled program does); the emulator's logits must match the reference's
  (a wrong decode cannot produce a good ratio). The vocabulary is
  padded from 50257 to 50304 (= 64 x 786, as nanoGPT pads it): the placement tiles a matrix
  whose rows a tile-row count divides, and 50257 = 29 x 1733 has no such tiling in 1172 rows
  (a shape-only compile pads the LM head's last tile instead, which real weights cannot).
"""

from __future__ import annotations

import gc
import json
import time

import numpy as np
import pytest

from bench.conftest import best_of, record
from wse_emu.apps.benchsuite import BUILTIN_MODELS
from wse_emu.isa.machine import load_machine
from wse_emu.isa.compiler.pipeline import compile_model, load_graph
from wse_emu.isa.graph_numpy import GraphRunner

TOKEN = 1


def config_folder(root, name: str, config: dict):
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def shared_layer_weights(graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random fp32 weights for every graph weight; layers > 0 and the LM head reuse arrays."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    out = {}
    for name, ref in graph.weights.items():
        key = name
        if name.startswith("layers."):
            key = "layers.0." + name.split(".", 2)[2]
        elif name == "lm_head.weight":
            key = "tok_embed.weight"
        if key not in arrays:
            scale = 1.0 if len(ref.shape) == 1 else ref.shape[-1] ** -0.5
            arrays[key] = rng.standard_normal(ref.shape, dtype=np.float32) * np.float32(scale)
        out[name] = arrays[key]
    return out


@pytest.mark.parametrize("machine_name", ["wse3", "h100"])
def test_llama_8b_timing_only_decode_vs_numpy(benchmark, tmp_path, machine_name):
    """One timing-only decode step of the Llama-3-8B shape (resident on wse3, streamed from
    HBM on h100) vs NumPy's forward pass."""
    from wse_emu.emulator.generate import Generator

    from wse_emu.isa.compiler.lower import CompileError

    folder = config_folder(tmp_path, "llama-3-8b", BUILTIN_MODELS["llama-3-8b"])
    ctx, position = 16, 15
    machine = load_machine(machine_name)
    t0 = time.perf_counter()
    try:
        program, report = compile_model(folder, machine, dtype="bf16", max_context=ctx,
                                        shape_only=True)
    except CompileError as e:  # the compiler's mapping, not this benchmark, is what is missing
        pytest.skip(f"blocked: the Llama-3-8B shape does not compile for {machine_name}: {e}")
    compile_s = time.perf_counter() - t0
    graph = load_graph(folder, shape_only=True, max_context=ctx)
    runner = GraphRunner(graph, shared_layer_weights(graph))

    def numpy_decode():
        runner.reset()
        runner.n_past = position
        return runner.decode(TOKEN)

    numpy_s = best_of(numpy_decode, rounds=3)
    del runner
    gc.collect()

    t0 = time.perf_counter()
    gen = Generator(program, machine, timing_only=True)
    load_s = time.perf_counter() - t0

    def emulator_decode():
        gen.reset()
        gen.n_past = position
        gen.step(TOKEN)

    benchmark.pedantic(emulator_decode, rounds=2, iterations=1)
    cycles = int(gen.last_result.cycles)
    record(
        benchmark, numpy_seconds=numpy_s, ratio_to_numpy=lambda emu_s: emu_s / numpy_s,
        compile_seconds=compile_s,
        load_seconds=load_s, pes=report.pes, emulated_cycles=cycles,
        emulated_tokens_per_second=machine.clock_hz / cycles,
        instructions=int(gen.last_result.instructions.sum()))


def bf16_gpt2(folder, config: dict):
    """demo.write_gpt2's random GPT-2, every weight rounded to the nearest bf16 value."""
    from safetensors.numpy import load_file, save_file

    from wse_emu.apps.demo import write_gpt2

    write_gpt2(folder, config)
    tensors = load_file(str(folder / "model.safetensors"))
    for key, value in tensors.items():
        bits = value.astype(np.float32).view(np.uint32)
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
        tensors[key] = rounded.view(np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("machine_name", ["wse3", "h100"])
def test_gpt2_small_functional_decode_vs_numpy(benchmark, tmp_path, machine_name):
    """Functional bf16 decode of a random-weight GPT-2-small (on wse3, or streamed from HBM on
    h100) vs NumPy's forward pass."""
    from wse_emu.emulator.generate import Generator

    ctx, prompt = 64, [464, 1068, 7, 318]
    config = dict(BUILTIN_MODELS["gpt2-small"], vocab_size=50304)
    folder = bf16_gpt2(tmp_path / "gpt2-small", config)
    runner = GraphRunner(load_graph(folder, max_context=ctx), kv_dtype="bf16")  # as compiled
    machine = load_machine(machine_name)
    program, report = compile_model(folder, machine, dtype="bf16", max_context=ctx)
    gen = Generator(program, machine)
    gen.prefill(prompt)
    runner.prefill(prompt)
    results = []

    def emulator_decode():
        results.append(gen.step(TOKEN))

    benchmark.pedantic(emulator_decode, rounds=3, iterations=1)
    reference = [runner.decode(TOKEN) for _ in results]  # the same positions, in order
    for got, want in zip(results, reference):
        # bf16 KV caches round k and v: a last-bit fp32 difference in how the two sum a dot
        # product can flip a bf16 rounding, so the logits agree to ~0.1 % of their range (an
        # fp32-cache reference would be 0.4 % off, a wrong decode tens of %)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-3 * np.abs(want).max())
        assert np.argmax(got) == np.argmax(want)
    position = runner.n_past

    def numpy_decode():  # the next position, again and again (its cache slot is overwritten)
        runner.n_past = position
        runner.decode(TOKEN)

    numpy_s = best_of(numpy_decode, rounds=3)
    cycles = int(gen.last_result.cycles)
    record(
        benchmark, numpy_seconds=numpy_s, ratio_to_numpy=lambda emu_s: emu_s / numpy_s,
        pes=report.pes,
        emulated_cycles=cycles, emulated_tokens_per_second=machine.clock_hz / cycles,
        instructions=int(gen.last_result.instructions.sum()))


def test_llama_8b_full_context_wafer_against_h100(benchmark, tmp_path):
    """The issue-26 bar: the Llama-3-8B shape at its own context (8192, no --max-context) on
    one wse3 and on one h100, one timing-only decode step at position 4096 each. Records both
    machines' emulated seconds a token, their ratio (at least 5x), the h100's HBM floor, and
    every wafer layer's emulated cycles against the compiler's prediction (within 25 %)."""
    from wse_emu.emulator.api import execute

    folder = config_folder(tmp_path, "llama-3-8b", BUILTIN_MODELS["llama-3-8b"])
    position = 4096
    inputs = {"input_ids": np.array([TOKEN], np.int32),
              "position_ids": np.array([position], np.int32)}
    wse3, h100 = load_machine("wse3"), load_machine("h100")
    program, report = compile_model(folder, wse3, dtype="bf16", shape_only=True)
    assert report.max_context == BUILTIN_MODELS["llama-3-8b"]["max_position_embeddings"]
    runs = []
    benchmark.pedantic(lambda: runs.append(execute(program, wse3, inputs=inputs,
                                                   timing_only=True)), rounds=1, iterations=1)
    ex = runs[-1]
    wafer_s = ex.result.cycles / wse3.clock_hz
    # every layer against its prediction: a layer's end minus the end of the part before it
    end = {}
    part_of = program.model.part_of_region()
    for ri, region in enumerate(program.regions):
        part = part_of[region.name]
        if part.name != "sources":
            pes = np.nonzero(ex.loaded.pe_region == ri)[0]
            end[part.layer] = max(end.get(part.layer, 0), int(ex.result.clock[pes].max()))
    worst, prev = 0.0, 0
    for p in sorted((p for p in program.model.parts if p.name != "sources"),
                    key=lambda p: p.layer):
        got = end[p.layer] - prev
        prev = end[p.layer]
        if p.name.startswith("layer"):
            worst = max(worst, abs(p.predicted_cycles - got) / got)
    gpu_program, gpu_report = compile_model(folder, h100, dtype="bf16", shape_only=True)
    gpu = execute(gpu_program, h100, inputs=inputs, timing_only=True)
    gpu_s = gpu.result.cycles / h100.clock_hz
    floor_s = gpu_report.weight_hbm_bytes / h100.hbm_bandwidth
    record(benchmark, wafer_cycles=int(ex.result.cycles), wafer_seconds=wafer_s,
           h100_cycles=int(gpu.result.cycles), h100_seconds=gpu_s, ratio=gpu_s / wafer_s,
           worst_layer_prediction_error=worst, pes=report.pes,
           instructions=int(ex.result.instructions.sum()),
           host_seconds=ex.result.host_seconds)
    assert gpu_s >= floor_s
    assert gpu_s / wafer_s >= 5
    assert worst <= 0.25

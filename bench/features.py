"""One process's host times of three cases users run, for bench/test_keep_bench.py.

    python -m bench.features [--no-helper]     (set WSE_EMU_WITHOUT=prefetch or =simd to turn
                                                those off; kernels/prefetch.py)

Prints one JSON object: the shortest host seconds of each case, after a warm-up run:
- "gemv": a functional 4096 x 4096 fp32 gemv on 64 x 64 PEs of wse3 (programs/gemv);
- "decode": a functional decode step of the demo's GPT-2 (fp32, random weights) on wse3;
- "step": a timing-only decode step of a GPT-2-small shape at position 512 on wse3.
`--no-helper` keeps the core from starting its helper thread (emulator/core.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # programs.conftest builds the gemv

from wse_emu.emulator import core  # noqa: E402
from wse_emu.emulator.core import run  # noqa: E402
from wse_emu.apps.demo import DEMO_CONFIG, PROMPT, write_gpt2  # noqa: E402
from wse_emu.emulator.generate import Generator  # noqa: E402
from wse_emu.emulator.load import load, write_input  # noqa: E402
from wse_emu.isa.compiler.pipeline import compile_model  # noqa: E402
from wse_emu.isa.machine import load_machine  # noqa: E402
from programs.conftest import build  # noqa: E402

GPT2_SMALL = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 768,
              "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024,
              "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"}


def shortest(fn, rounds: int) -> float:
    fn()  # warm-up: Numba compiles or loads its cache, pages get mapped
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def gemv() -> float:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4096, 4096), dtype=np.float32)
    loaded = load(build("gemv", {"W": w}, M=4096, K=4096, P=64, Q=64), load_machine("wse3"))
    write_input(loaded, "x", rng.standard_normal(4096, dtype=np.float32))
    return shortest(lambda: run(loaded), 10)


def decode(tmp: Path) -> float:
    machine = load_machine("wse3")
    model = write_gpt2(tmp / "demo", DEMO_CONFIG)
    program, _ = compile_model(model, machine, dtype="fp32", max_context=64)
    gen = Generator(program, machine)
    gen.prefill(PROMPT)
    return shortest(lambda: gen.step(PROMPT[-1]), 5)


def step(tmp: Path) -> float:
    machine = load_machine("wse3")
    folder = tmp / "gpt2-small"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GPT2_SMALL))
    program, _ = compile_model(folder, machine, dtype="bf16", shape_only=True)
    gen = Generator(program, machine, timing_only=True)
    return shortest(lambda: gen.generate([1], 1, position=512), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-helper", action="store_true")
    args = ap.parse_args()
    if args.no_helper:
        core.HELPER_MIN_SRAM = 1 << 62
    with tempfile.TemporaryDirectory() as tmp:
        out = {"gemv": gemv(), "decode": decode(Path(tmp)), "step": step(Path(tmp))}
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""A GPU node's HBM on the host: every GPU's part kept compacted (load.Loaded.hbm_offset), so
a small model compiled for a node of 80 GB GPUs runs functionally in host memory that fits
what it uses, with the same numbers as one GPU and the same bits and cycles on the core and
the reference interpreter."""

from pathlib import Path

import numpy as np
import pytest

from wse_emu.apps.demo import write_gpt2
from wse_emu.emulator.generate import Generator
from wse_emu.emulator.load import LoadError, load
from wse_emu.isa.compiler.pipeline import compile_model
from wse_emu.isa.frontends.hf import load_hf
from wse_emu.isa.graph_numpy import GraphRunner
from wse_emu.isa.machine import load_machine

CONFIG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64,
          "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 32,
          "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
          "tie_word_embeddings": True}
PROMPT = [5, 17, 3]


@pytest.fixture(scope="module")
def node_program(tmp_path_factory):
    folder = write_gpt2(tmp_path_factory.mktemp("node") / "gpt2", CONFIG)
    machine = load_machine("h100x2")
    program, _ = compile_model(folder, machine, dtype="fp32", max_context=16)
    return folder, machine, program


def test_a_node_of_80_gb_gpus_fits_in_little_host_memory(node_program):
    _, machine, program = node_program
    assert program.hbm_bytes > machine.hbm_bytes  # GPU 1's buffers start at 80 GB
    loaded = load(program, machine)
    assert loaded.hbm_stride > 0 and loaded.hbm.size == 2 * loaded.hbm_stride
    assert loaded.hbm.size < 1 << 30
    with pytest.raises(LoadError, match="outside the buffers"):
        loaded.hbm_offset(machine.hbm_bytes + loaded.hbm_stride, 4)


def test_a_node_generates_the_golden_ids_on_core_and_reference(node_program):
    folder, machine, program = node_program
    golden = GraphRunner(load_hf(folder, max_context=16)).generate_greedy(PROMPT, 4)
    core = Generator(program, machine).generate(PROMPT, 4)
    ref = Generator(program, machine, engine="reference").generate(PROMPT, 4)
    assert core.generated_ids == golden == ref.generated_ids
    assert core.cycles_per_token == ref.cycles_per_token

"""Several positions per run: a BERT encoder (bidirectional) and a batched decoder prefill,
against transformers (the tests named so, which need PyTorch) and the NumPy golden model."""

import numpy as np
import pytest

from wse_emu.emulator.api import execute
from wse_emu.emulator.generate import Generator
from wse_emu.emulator.load import LoadError
from wse_emu.isa.machine import load_machine
from wse_emu.isa.compiler import CompileError, compile_model
from wse_emu.isa.compiler.pipeline import load_graph
from wse_emu.isa.graph_numpy import GraphRunner
from tests.compiler.np_models import make_bert, make_gpt2, make_llama

IDS = np.array([3, 99, 7, 400, 12, 5, 250, 31])
ENGINE = "core"  # test_compiler_decoders checks the Numba core against the reference


@pytest.fixture(scope="module")
def wse3():
    return load_machine("wse3")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("positions")


def _transformers_bert(path, ids):
    torch = pytest.importorskip("torch")
    from tests.graph.hf_models import load_torch
    torch.set_num_threads(2)
    with torch.no_grad():
        return load_torch(path)(torch.tensor(ids[None])).last_hidden_state[0].numpy()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bert_last_hidden_state_matches_transformers(dtype, root, wse3):
    """fp32 and bf16 checkpoints (bf16 stays bf16 in SRAM and is widened on use, as
    transformers widens it; an encoder keeps no KV cache, so the fp32 tolerance holds)."""
    path = make_bert(root, dtype=dtype, name=f"bert_{dtype}")
    want = _transformers_bert(path, IDS)
    program, _ = compile_model(path, wse3, max_context=8)  # T = max_context = 8
    assert {s.name: s.shape for s in program.symbols} == {
        "input_ids": (8,), "position_ids": (8,), "last_hidden_state": (8, 128)}
    run = execute(program, wse3, {"input_ids": IDS, "position_ids": np.arange(8)},
                  engine=ENGINE)
    got = run.outputs["last_hidden_state"]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())
    # position_ids default to 0..T-1: input_ids alone (as `wse-emu run --input`) is enough
    alone = execute(program, wse3, {"input_ids": IDS}, engine=ENGINE).outputs
    np.testing.assert_array_equal(alone["last_hidden_state"], got)
    # bidirectional: changing the last token changes the first position's state
    later = execute(program, wse3, {"input_ids": np.r_[IDS[:-1], 1]}, engine=ENGINE).outputs
    assert not np.allclose(later["last_hidden_state"][0], got[0])


@pytest.mark.parametrize("make", [make_gpt2, make_llama])
def test_decoder_prefill_in_one_run_matches_the_golden_model(make, root, wse3):
    path = make(root, hidden=64, name=f"{make.__name__}_prefill", seed=5)
    program, _ = compile_model(path, wse3, max_context=16, positions=4)
    run = execute(program, wse3, {"input_ids": IDS[:4], "position_ids": np.arange(4)},
                  engine=ENGINE)
    want = GraphRunner(load_graph(path, max_context=16)).prefill(IDS[:4])
    np.testing.assert_allclose(run.outputs["logits"], want, rtol=1e-3,
                               atol=1e-4 * np.abs(want).max())
    with pytest.raises(LoadError, match="4 positions a run"):
        Generator(program, wse3, engine=ENGINE)
    with pytest.raises(CompileError, match="positions must be 1..max_context"):
        compile_model(path, wse3, max_context=16, positions=17)

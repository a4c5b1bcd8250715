"""Attention on the HBM target split over cores (isa/compiler/hbm_attn.py): each work item's
positions in parts on the cores that would otherwise wait, the parts' max, sum and output
combined after a barrier; with chunks of 4 positions a 12-token sequence gives parts of
several chunks, a last chunk partly filled and, early on, parts with no positions at all.
"""

import dataclasses

import numpy as np
import pytest
torch = pytest.importorskip("torch")

import wse_emu.isa.compiler.hbm as hbm
from wse_emu.emulator.generate import Generator
from wse_emu.isa.compiler import compile_model
from wse_emu.isa.compiler.lower import CompileError, lower
from wse_emu.isa.compiler.pipeline import load_graph
from wse_emu.isa.graph import bind_positions
from wse_emu.isa.machine import load_machine
from tests.graph.hf_models import load_torch, make_llama

IDS = [5, 17, 300, 7, 9, 11, 200, 3, 4, 8, 100, 42]


def gpu(width):
    return dataclasses.replace(load_machine("h100"), width=width)


def _logits(program, machine, ids):
    gen = Generator(program, machine)
    return np.stack([gen.step(t) for t in ids])


def _plans(model, machine, context=16):
    plan = lower(bind_positions(load_graph(model, max_context=context), 1))
    c = hbm.HbmCompiler(plan, machine, "f32", True, None, "m")
    c.compile()
    return c.attn_plans


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    torch.set_num_threads(2)
    return make_llama(tmp_path_factory.mktemp("attn"), kv_heads=1)


@pytest.mark.parametrize("width", [12, 2])
def test_split_attention_matches_transformers(width, llama, monkeypatch):
    """One KV head of 4 query heads: on 12 cores its positions go to 12 parts, on 2 to 2;
    the logits of every position match transformers either way."""
    monkeypatch.setattr(hbm, "KV_CHUNK_BYTES", 4 * 32 * 4)  # head_dim 32: 4 positions
    ((sg, parts),) = set(_plans(llama, gpu(width)).values())
    assert (sg, parts) == (4, width)
    program, _ = compile_model(llama, gpu(width), max_context=16)
    gen = Generator(program, gpu(width))
    got = np.stack([gen.step(t) for t in IDS])
    with torch.no_grad():
        want = load_torch(llama)(torch.tensor([IDS])).logits[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())


def test_query_heads_that_do_not_fit_sram_go_to_several_items(tmp_path, monkeypatch):
    """At context 512 four heads' scores take 8 KB: on the smallest core that compiles the
    model, an item takes fewer query heads (each item of the KV head reading K and V), and
    the numbers are those of a large core's program."""
    monkeypatch.setattr(hbm, "KV_CHUNK_BYTES", 4 * 32 * 4)
    model = make_llama(tmp_path, kv_heads=1, max_positions=512)
    big = gpu(4)

    def compiles(sram):
        try:
            _plans(model, dataclasses.replace(big, sram_bytes=sram), context=512)
            return True
        except CompileError:
            return False
    lo, hi = 16 * 1024, big.sram_bytes
    while hi - lo > 64:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compiles(mid) else (mid, hi)
    small = dataclasses.replace(big, sram_bytes=hi)
    assert {sg for sg, _ in _plans(model, small, context=512).values()} == {1}
    assert {sg for sg, _ in _plans(model, big, context=512).values()} == {4}
    got, want = (_logits(compile_model(model, m, max_context=512)[0], m, IDS[:3])
                 for m in (small, big))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())

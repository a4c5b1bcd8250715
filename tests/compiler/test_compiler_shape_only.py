"""Shape-only compiles at full model sizes, and models the machine cannot hold."""

import json

import pytest

from wse_emu.isa.machine import load_machine
from wse_emu.isa.compiler import CompileError, compile_model
from wse_emu.isa.compiler.pipeline import load_graph
from wse_emu.isa.graph import to_json

GPT2_XL = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 1600,
           "n_layer": 48, "n_head": 25, "n_positions": 1024, "vocab_size": 50257,
           "activation_function": "gelu_new"}


def _config(tmp_path, name, **changes):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**GPT2_XL, **changes}))
    return folder


@pytest.fixture(scope="module")
def wse3():
    return load_machine("wse3")


def test_gpt2_xl_shape_only_fits_wse3(tmp_path, wse3):
    program, report = compile_model(_config(tmp_path, "xl"), wse3, max_context=64, mapping="chain",
                                    shape_only=True)
    h, v = 1600, 50257
    weight_bytes = 4 * (48 * 12 * h * h + 2 * v * h + 1024 * h)  # layers, wte twice (tied), wpe
    assert weight_bytes < report.pes * report.sram_mean < 1.3 * weight_bytes
    assert report.pes <= wse3.width * wse3.height
    assert report.fabric[0] <= wse3.width and report.fabric[1] <= wse3.height
    assert report.sram_max <= wse3.sram_bytes
    assert report.sram_mean <= report.sram_max
    # the placement takes the smallest tiles that still fit: most of the wafer is used
    assert report.pes > 0.4 * wse3.width * wse3.height
    assert report.colors <= wse3.colors
    # no weights (shape only): the only data is the default position 0; every layer is placed
    assert [t.name for t in program.tensors] == ["default_position_ids"]
    assert {d.tensor for d in program.data} == {"default_position_ids"}
    layers = report.layers()
    assert set(layers) == {str(i) for i in range(-1, 49)}
    text = str(report)
    assert f"{report.pes} PEs" in text and "layers.47.mlp.down" in text


def test_too_large_a_model_is_refused_with_what_would_fit(tmp_path, wse3):
    with pytest.raises(CompileError) as e:
        compile_model(_config(tmp_path, "big", n_layer=600), wse3, max_context=64,
                      shape_only=True)
    msg = str(e.value)
    assert "\n" not in msg
    assert "model needs" in msg and "PEs" in msg and "GB" in msg
    assert f"machine 'wse3' is 762 x 1172 ({wse3.width * wse3.height:,} PEs" in msg
    assert "would fit 3 such wafers" in msg  # 600 layers on 34 x 100 grids (fp32 weights)


def test_a_context_that_does_not_fit_names_the_context_that_would(tmp_path, wse3):
    """The KV caches are spread over the layers' grids: GPT-2-XL holds its own 1024 positions,
    a Llama-3-8B shape asked for 10^6 positions is refused with the context that fits."""
    compile_model(_config(tmp_path, "xl"), wse3, shape_only=True)
    folder = tmp_path / "long"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(
        model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=128256, max_position_embeddings=1_000_000)))
    with pytest.raises(CompileError, match=r"max_context 1000000 does not fit machine 'wse3'.*"
                                           r"max_context (\d+) would fit") as e:
        compile_model(folder, wse3, dtype="bf16", shape_only=True)
    fit = int(str(e.value).rsplit("--max-context ", 1)[1].rstrip(")"))
    assert 8192 <= fit < 1_000_000
    compile_model(folder, wse3, dtype="bf16", shape_only=True, max_context=fit)


def test_unsupported_graph_is_refused_naming_the_node(tmp_path, wse3):
    path = tmp_path / "gelu_twice.graph.json"
    graph = load_graph(_config(tmp_path, "small", n_embd=64, n_layer=1, n_head=2, vocab_size=64,
                               n_positions=8), shape_only=True)
    text = to_json(graph).replace('"op": "GELU_TANH"', '"op": "SOFTMAX"')
    path.write_text(text)
    with pytest.raises(CompileError, match=r"node %\d+ 'layers.0.mlp.act' \(SOFTMAX\): this op "
                                           r"is not supported"):
        compile_model(path, wse3, shape_only=True)


def test_bad_dtype_and_dump_names_are_refused(tmp_path, wse3):
    folder = _config(tmp_path, "xl")
    with pytest.raises(CompileError, match="dtype 'int8'"):
        compile_model(folder, wse3, dtype="int8", shape_only=True)
    with pytest.raises(CompileError, match="cannot dump 'tiles'"):
        compile_model(folder, wse3, shape_only=True, dump=("tiles",))

"""The *.graph.json format: exact round trips, the documented example, clear refusals."""

import json
import re
from pathlib import Path

import pytest

from wse_emu.isa.frontends.hf import load_hf
from wse_emu.isa.graph import GraphError, from_json, to_json

DOC = Path(__file__).resolve().parents[2] / "docs" / "graph.md"


@pytest.mark.parametrize("model", ["gpt2_dir", "llama_dir", "llama_tied_dir", "bert_dir"])
@pytest.mark.parametrize("shape_only", [False, True])
def test_round_trip_is_exact(model, shape_only, request):
    graph = load_hf(request.getfixturevalue(model), shape_only=shape_only)
    text = to_json(graph)
    back = from_json(text)
    assert back == graph
    assert dict(back.weights) == dict(graph.weights)  # views (transpose, rows) included
    assert to_json(back) == text


def test_documented_example_parses_and_prints_back_identically():
    block = re.search(r"```json\n(.*?)```", DOC.read_text(), re.S).group(1)
    graph = from_json(block)
    assert to_json(graph) == block
    assert graph.weights["layers.0.mlp.up.weight"].transpose is True
    assert graph.nodes[graph.outputs[0].inputs[0]].inputs[1] == 2  # the tied head


def _broken(gpt2_dir, edit) -> str:
    doc = json.loads(to_json(load_hf(gpt2_dir, shape_only=True)))
    edit(doc)
    return json.dumps(doc)


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.update(format="onnx"), 'not a wse-emu.graph document'),
    (lambda d: d.update(version=9), "version 9 is not supported"),
    (lambda d: d["nodes"][3].update(op="CONV"), "node 3: unknown op 'CONV'"),
    (lambda d: d["nodes"][3].pop("inputs"), "node 3: missing 'inputs'"),
    (lambda d: d["nodes"][9].update(attrs={"eps": "1e-5"}), "node 9 (LAYERNORM): attribute eps"),
    (lambda d: d["nodes"][12].update(shape=["T", 7]), "declared (T, 7) f32, rule gives"),
    (lambda d: d["weights"]["tok_embed.weight"].update(shape=[512, 7]),
     "'tok_embed.weight' (WEIGHT): declared (512, 128) f32, rule gives (512, 7) f32"),
    (lambda d: d["config"].pop("vocab"), "config must have exactly"),
])
def test_bad_documents_are_refused_in_one_line(gpt2_dir, edit, needle):
    with pytest.raises(GraphError) as e:
        from_json(_broken(gpt2_dir, edit))
    assert "\n" not in str(e.value) and needle in str(e.value), str(e.value)


def test_syntax_errors_give_line_and_column():
    with pytest.raises(GraphError, match=r"graph JSON: line 2 column 3: "):
        from_json('{\n  oops\n}')

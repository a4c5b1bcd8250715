"""`wse-emu compile | generate | run` end to end, as a user types them, against the NumPy
golden model (isa.graph_numpy, which tests/graph/test_hf_numerics.py checks against
transformers): no PyTorch needed.

Each command runs as a subprocess of the venv's `wse-emu`, so what is tested is the exit code,
stdout/stderr and the files written, not the Python API underneath.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from wse_emu.isa.compiler.pipeline import load_graph
from wse_emu.isa.graph_numpy import GraphRunner
from tests.compiler.np_models import make_bert, make_gpt2, make_llama

WSE_EMU = str(Path(sys.executable).parent / "wse-emu")
PROMPT = [1, 2, 3]
TOKENS = 8

GPT2_XL = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=1600, n_layer=48,
               n_head=25, vocab_size=50257, n_positions=1024, n_ctx=1024,
               activation_function="gelu_new", layer_norm_epsilon=1e-5)


def wse(*args, cwd):
    return subprocess.run([WSE_EMU, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wse-emu: error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="module")
def models(root):
    return {"gpt2": make_gpt2(root), "llama": make_llama(root), "bert": make_bert(root)}


@pytest.fixture(scope="module")
def binaries(root, models):
    out = {}
    for name in ("gpt2", "llama"):
        result = wse("compile", models[name], "-o", f"{name}.bin", cwd=root)
        assert result.returncode == 0, result.stderr
        out[name] = root / f"{name}.bin"
    return out


def test_compile_reports_pes_sram_colors_and_placement(root, models, binaries):
    human = wse("compile", models["gpt2"], "-o", "again.bin", cwd=root)
    as_json = wse("compile", models["gpt2"], "-o", "again_json.bin", "--json", "--dump",
                  "placement", cwd=root)
    assert human.returncode == as_json.returncode == 0, human.stderr + as_json.stderr
    report = json.loads(as_json.stdout)
    # a compile is deterministic: the same folder gives the same program.bin
    assert (root / "again.bin").read_bytes() == (root / "again_json.bin").read_bytes() \
        == binaries["gpt2"].read_bytes()

    assert report["machine"] == "wse3" and report["dtype"] == "f32"
    stages = report["stages"]
    assert report["pes"] == sum(s["rect"][2] * s["rect"][3] for s in stages)
    assert report["sram_max"] == max(s["sram"] for s in stages)
    # a stage's figure is its fullest PE, so the mean over PEs is at most their PE-weighted mean
    pe_weighted = sum(s["sram"] * s["rect"][2] * s["rect"][3] for s in stages) / report["pes"]
    assert report["sram_mean"] <= pe_weighted
    assert 0 < report["sram_mean"] <= report["sram_max"] <= 48 * 1024
    assert report["colors"] >= 2
    assert {s["layer"] for s in stages} == {-1, 0, 1, 2}  # embed, two blocks, head
    names = [s["name"] for s in stages]
    assert names[0].startswith("embed") and {"layers.0", "layers.1", "head"} <= set(names)
    # the predicted cycles of every part of a decode step, in the report and the JSON
    assert set(report["predicted"]) == {"embed", "layer 0", "layer 1", "head"}
    assert all(v > 0 for v in report["predicted"].values())
    assert f"predicted cycles a decode step: {sum(report['predicted'].values())}" in human.stdout

    text = human.stdout
    assert f"{report['pes']} PEs" in text and f"{report['colors']} colors" in text
    assert f"SRAM per PE: max {report['sram_max']} bytes, mean {round(report['sram_mean'])}" \
        in text
    for s in stages:
        x, y, w, h = s["rect"]
        assert re.search(rf"^{re.escape(s['name'])}\s+{s['kind']}\s+\({x}, {y}\)\s+{w} x {h}\s+"
                         rf"{w * h}\s+{s['sram']}$", text, re.M), s
    # the placement dump goes to stderr, keeping stdout one JSON document
    for s in stages:
        x, y, w, h = s["rect"]
        assert re.search(rf"{re.escape(s['name'])}\s+at \({x}, {y}\) {w} x {h}", as_json.stderr)


@pytest.fixture(scope="module")
def reference_ids(models):
    out = {}
    for name in ("gpt2", "llama"):
        out[name] = GraphRunner(load_graph(models[name])).generate_greedy(PROMPT, TOKENS)
    return out


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_generate_json_matches_the_golden_models_greedy(name, root, binaries, reference_ids):
    result = wse("generate", binaries[name], "--prompt-ids", ",".join(map(str, PROMPT)),
                 "--tokens", TOKENS, "--json", cwd=root)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["generated_ids"] == reference_ids[name]
    cycles = report["cycles_per_token"]
    assert len(cycles) == TOKENS and all(isinstance(c, int) and c > 0 for c in cycles)
    assert report["tokens_per_second"] == pytest.approx(1 / report["seconds_per_token"])
    assert 0 < report["host_seconds"] < 120
    per_layer = report["per_layer"]
    assert {"embed", "layer 0", "layer 1", "head"} <= set(per_layer)
    for layer, split in per_layer.items():
        assert set(split) == {"compute", "fabric", "stall"}, layer
        assert all(v >= 0 for v in split.values()) and split["compute"] > 0, layer


def test_generate_human_output(root, binaries, reference_ids):
    result = wse("generate", binaries["gpt2"], "--prompt-ids", "1,2,3", "--tokens", TOKENS,
                 cwd=root)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    ids = ",".join(map(str, reference_ids["gpt2"]))
    assert re.search(rf"^generated ids\s+{ids}$", text, re.M), text
    assert re.search(r"[\d,]+ tokens/s on wse3", text), text
    assert re.search(r"^host\s+[\d.]+ s \(after [\d.]+ s loading the program\)$", text,
                     re.M), text


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_run_one_token_gives_the_golden_models_logits(name, root, models, binaries):
    work = root / f"run_{name}"
    work.mkdir()
    np.save(work / "ids.npy", np.array([5], dtype=np.int32))
    result = wse("run", binaries[name], "--input", "input_ids=ids.npy", "--dump-dir", "out",
                 cwd=work)
    assert result.returncode == 0, result.stderr
    got = np.load(work / "out" / "logits.npy")
    want = GraphRunner(load_graph(models[name])).prefill([5])  # (1, vocab)
    assert got.shape in (want.shape, want.shape[1:])
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-3,
                               atol=1e-4 * np.abs(want).max())


def test_run_bert_gives_the_golden_models_last_hidden_state(root, models):
    work = root / "run_bert"
    work.mkdir()
    compiled = wse("compile", models["bert"], "-o", "bert.bin", "--max-context", 8, cwd=work)
    assert compiled.returncode == 0, compiled.stderr
    ids = np.array([3, 99, 7, 400, 12, 5, 250, 31], dtype=np.int32)
    np.save(work / "ids.npy", ids)
    result = wse("run", "bert.bin", "--input", "input_ids=ids.npy", "--dump-dir", "out",
                 cwd=work)
    assert result.returncode == 0, result.stderr
    got = np.load(work / "out" / "last_hidden_state.npy")
    want = GraphRunner(load_graph(models["bert"], max_context=8)).prefill(ids)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())


def _config_only(root, name, **changes):
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**GPT2_XL, **changes}))
    return folder


def test_shape_only_gpt2_xl_fits_wse3_with_a_short_context(root):
    folder = _config_only(root, "xl")
    result = wse("compile", folder, "-o", "xl.bin", "--shape-only", "--max-context", 64,
                 "--json", cwd=root)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["machine"] == "wse3" and report["max_context"] == 64
    assert 100_000 < report["pes"] <= 893_064  # billions of weights, one wafer
    assert 0 < report["sram_mean"] <= report["sram_max"] <= 48 * 1024
    assert {s["layer"] for s in report["stages"]} == set(range(-1, 49))
    assert (root / "xl.bin").is_file()


def test_shape_only_refusals_say_what_would_fit(root):
    # GPT-2-XL holds its own 1024 positions (the KV caches are spread over the layers' grids)
    folder = _config_only(root, "xl_default")
    result = wse("compile", folder, "-o", "xl_default.bin", "--shape-only", cwd=root)
    assert result.returncode == 0, result.stderr
    assert "max_context 1024" in result.stdout

    deep = _config_only(root, "xl_600", n_layer=600)
    line = assert_one_line_error(wse("compile", deep, "-o", "deep.bin", "--shape-only",
                                     "--max-context", 64, cwd=root), "wse3")
    # names the model's need (PEs) and the machine's size, and how many such wafers would do
    assert re.search(r"needs [\d,]+ PEs", line) and "(893,064 PEs" in line, line
    machine_w, machine_h = map(int, re.search(r"'wse3' is (\d+) x (\d+)", line).groups())
    assert (machine_w, machine_h) == (762, 1172)
    assert re.search(r"would fit \d+ such wafers", line), line
    assert not (root / "deep.bin").exists()


def test_bad_folders_and_options_are_one_line_errors(root, models):
    unsupported = root / "mamba"
    shutil.copytree(models["gpt2"], unsupported)
    config = json.loads((unsupported / "config.json").read_text())
    config.update(model_type="mamba", architectures=["MambaForCausalLM"])
    (unsupported / "config.json").write_text(json.dumps(config))
    assert_one_line_error(wse("compile", unsupported, "-o", "m.bin", cwd=root), "mamba")
    assert not (root / "m.bin").exists()

    missing = root / "missing_tensor"
    shutil.copytree(models["gpt2"], missing)
    weights = load_file(missing / "model.safetensors")
    gone = "transformer.h.1.mlp.c_fc.weight"
    del weights[gone]
    save_file(weights, missing / "model.safetensors", metadata={"format": "pt"})
    assert_one_line_error(wse("compile", missing, "-o", "t.bin", cwd=root), gone)
    assert not (root / "t.bin").exists()


def test_bad_dtype_is_a_one_line_error(root, models):
    result = wse("compile", models["gpt2"], "-o", "d.bin", "--dtype", "int8", cwd=root)
    assert result.returncode == 2 and not (root / "d.bin").exists()
    assert "Traceback" not in result.stderr
    assert_one_line_error(result, "--dtype", "int8")

"""`compile --sequences B`, `generate --sequences B` and `bench --sequences B`: several
sequences in flight on the wafer mapping, a batched step on the HBM target."""

import json
import re

import pytest

SMALL = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=256,
             num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=512, vocab_size=1024, max_position_embeddings=64)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, request):
    """The small model's config compiled shape-only for 3 sequences and for h100."""
    from click.testing import CliRunner
    from wse_emu.apps.cli import main
    root = tmp_path_factory.mktemp("seqs")
    (root / "config.json").write_text(json.dumps(SMALL))
    for args in (["--sequences", "3", "-o", root / "s3.bin"],
                 ["--machine", "h100", "-o", root / "gpu.bin"]):
        r = CliRunner().invoke(main, ["compile", str(root / "config.json"), "--shape-only",
                                      "--dtype", "bf16", *map(str, args)])
        assert r.exit_code == 0, r.output
    return root


def _one_line_error(out) -> str:
    assert out.code == 2 and "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("wse-emu: error")]
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_compile_reports_the_sequences(cli, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    out = cli("compile", "config.json", "--shape-only", "--dtype", "bf16", "--sequences", "4",
              "-o", "m.bin", "--json", cwd=tmp_path)
    assert out.code == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["sequences"] == 4 and rep["step_cycles"] > sum(rep["predicted"].values())
    text = cli("compile", "config.json", "--shape-only", "--dtype", "bf16", "--sequences", "4",
               "-o", "m.bin", cwd=tmp_path)
    assert "sequences in flight: 4" in text.stdout
    bad = cli("compile", "config.json", "--shape-only", "--sequences", "0", "-o", "m.bin",
              cwd=tmp_path)
    assert bad.code == 2


def test_generate_timing_only_prints_per_sequence_and_aggregate(cli, compiled):
    out = cli("generate", "s3.bin", "--timing-only", "--position", "10", "--tokens", "2",
              cwd=compiled)
    assert out.code == 0, out.stderr
    assert "3 sequences x 2 decode steps" in out.stdout
    assert "a sequence" in out.stdout and "aggregate" in out.stdout
    assert "predicted" in out.stdout and "first token" in out.stdout
    assert re.search(r"^host +[0-9.]+ s \(after [0-9.]+ s loading the program\)", out.stdout,
                     re.M), out.stdout
    js = cli("generate", "s3.bin", "--timing-only", "--position", "10", "--tokens", "1",
             "--json", cwd=compiled)
    res = json.loads(js.stdout)
    assert res["sequences"] == 3 and res["load_seconds"] > 0
    assert res["aggregate_tokens_per_second"] == pytest.approx(3 * res["tokens_per_second"])
    assert res["ttft_prompt_lengths"] == [11, 11, 11]


def test_generate_takes_a_prompt_a_sequence(cli, compiled):
    out = cli("generate", "s3.bin", "--timing-only", "--tokens", "1", "--prompt-ids", "1,2",
              "--prompt-ids", "3", "--prompt-ids", "4,5,6", "--json", cwd=compiled)
    assert out.code == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["ttft_prompt_lengths"] == [2, 1, 3]
    two = cli("generate", "s3.bin", "--timing-only", "--prompt-ids", "1", "--prompt-ids", "2",
              cwd=compiled)
    assert "given 2 times for 3 sequences" in _one_line_error(two)


def test_generate_refuses_a_mismatch(cli, compiled):
    other = cli("generate", "s3.bin", "--timing-only", "--position", "1", "--sequences", "2",
                cwd=compiled)
    assert "compiled for 3 sequences" in _one_line_error(other)
    gpu = cli("generate", "gpu.bin", "--timing-only", "--position", "1", "--sequences", "2",
              cwd=compiled)
    assert "compiled for 1 sequence " in _one_line_error(gpu)
    gpu_compile = cli("compile", "config.json", "--shape-only", "--machine", "h100",
                      "--sequences", "2", "-o", "x.bin", cwd=compiled)
    assert gpu_compile.code == 0, gpu_compile.stderr
    assert "once a step of 2 sequences" in gpu_compile.stdout
    two = cli("generate", "x.bin", "--timing-only", "--position", "3", "--json", cwd=compiled)
    assert two.code == 0, two.stderr
    assert json.loads(two.stdout)["sequences"] == 2


def test_bench_runs_sequences_on_the_wafer_and_on_a_gpu(cli, compiled, tmp_path):
    out = cli("bench", "--models", str(compiled / "config.json"), "--machines", "wse3,h100",
              "--max-context", "32", "--sequences", "2", "-o", tmp_path / "b", cwd=tmp_path)
    assert out.code == 0, out.stderr
    suite = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert suite["meta"]["sequences"] == [2]  # bench takes a list of B
    wafer, gpu = suite["cases"]
    assert wafer["status"] == "ok" and wafer["figures"]["sequences"] == 2
    f = wafer["figures"]
    assert f["aggregate_tokens_per_second"] == pytest.approx(2 * f["tokens_per_second"])
    assert f["flops_per_step"] == pytest.approx(2 * f["flops_per_token"])
    assert gpu["status"] == "ok" and gpu["figures"]["sequences"] == 2
    g = gpu["figures"]
    assert g["aggregate_tokens_per_second"] == pytest.approx(2 * g["tokens_per_second"])
    assert "2 sequences in flight" in out.stdout and "aggregate" in out.stdout


def test_compile_and_generate_a_prefill_program(cli, tmp_path):
    """`compile --prefill B`: B prompt positions a run, one KV cache; generate prints the
    prompt's rate and its time to first token; mistakes are one line each."""
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    for machine in ("wse3", "h100"):
        out = cli("compile", "config.json", "--shape-only", "--dtype", "bf16", "--prefill", "4",
                  "--machine", machine, "-o", f"{machine}.bin", "--json", cwd=tmp_path)
        assert out.code == 0, out.stderr
        rep = json.loads(out.stdout)
        assert rep["prefill"] is True and rep["sequences"] == 4
        run = cli("generate", f"{machine}.bin", "--timing-only", "--position", "20", "--tokens",
                  "1", cwd=tmp_path)
        assert run.code == 0, run.stderr
        assert re.search(r"^prefill +[0-9,]+ prompt tokens/s: a prefill program: the prompt of "
                         r"21 tokens in runs of 4 positions", run.stdout, re.M), run.stdout
        assert re.search(r"^first token +[0-9.]+ ms for a prompt of 21 tokens \(in runs of 4 "
                         r"positions\)", run.stdout, re.M), run.stdout
        info = cli("info", f"{machine}.bin", cwd=tmp_path)
        assert re.search(r"^model: llama, 2 layers, hidden 256, vocabulary 1024, max_context 64, "
                         r"weights bf16 \(shape only: timing-only runs\); (the wafer mapping|an "
                         r"HBM kernel) for '" + machine + r"'; a prefill program: 4 consecutive "
                         r"positions of one sequence a run, one KV cache$", info.stdout, re.M), \
            info.stdout
    both = cli("compile", "config.json", "--shape-only", "--prefill", "4", "--sequences", "2",
               "-o", "x.bin", cwd=tmp_path)
    assert "two kinds of program" in _one_line_error(both)
    assert cli("compile", "config.json", "--shape-only", "--prefill", "1", "-o", "x.bin",
               cwd=tmp_path).code == 2
    many = cli("generate", "wse3.bin", "--timing-only", "--prompt-ids", "1,2", "--prompt-ids",
               "3", cwd=tmp_path)
    assert "give --prompt-ids once" in _one_line_error(many)
    assert not (tmp_path / "x.bin").exists()

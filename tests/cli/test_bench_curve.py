"""`wse-emu bench --sequences 1,2` on systems: the throughput curve and the systems' floors.

A tiny Llama on one small wafer (test64), on a system of two of them (test64x2) and on a node
of two GPUs (h100x2), each at B = 1 and 2, beside a Llama whose vocabulary no test64 system
holds. What a wrong suite would break: a row and a curve point per case and B, aggregate =
B x per-sequence, one position for every B, a refused case as a row with its one-line reason
(the run still succeeds), and on a system the floors of its links (the bytes over the busiest
pipe / the link bandwidth) and of one GPU's HBM (its tensor-parallel share of the weights /
one GPU's bandwidth), each one checked.
"""

import json
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from wse_emu.apps.benchreport import fmt_seconds, markdown, violations
from wse_emu.apps.benchsuite import (BUILTIN_MODELS, DEFAULT_MODELS, BenchError, Case,
                                         ModelFigures, machine_json, measure, parse_sequences)
from wse_emu.isa.machine import load_machine

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 2048,
         "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu"}
# a 200,000-word head: more SRAM than test64 or test64x2 has
BIG = dict(LLAMA, hidden_size=1024, intermediate_size=2048, num_attention_heads=8,
           vocab_size=200_000)
MACHINES = ("test64", "test64x2", "h100x2")


@pytest.fixture(scope="module")
def run(tmp_path_factory, cli):
    root = tmp_path_factory.mktemp("curve")
    for name, config in (("llama", LLAMA), ("big", BIG)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    out = cli("bench", "--models", "llama,big", "--machines", ",".join(MACHINES),
              "--sequences", "2,1", "--max-context", "64", "-o", "res", cwd=root)
    assert out.code == 0 and "Traceback" not in out.stderr, out.stderr
    suite = json.loads((root / "res" / "bench.json").read_text())
    cases = {(c["model"], c["machine"], c["sequences"]): c for c in suite["cases"]}
    return SimpleNamespace(root=root, out=out, suite=suite, cases=cases,
                           table=(root / "res" / "bench.md").read_text())


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_every_model_machine_and_b_is_a_case_in_order(run):
    assert run.suite["meta"]["sequences"] == [1, 2]
    assert "--sequences 1,2" in run.suite["meta"]["command"]
    assert [(c["model"], c["machine"], c["sequences"]) for c in run.suite["cases"]] == [
        (model, m, b) for model in ("llama", "big") for m in MACHINES for b in (1, 2)]
    assert "[12/24]" in run.out.stderr  # progress: a compile and a run per case


def test_the_wafers_run_every_b_at_one_position(run):
    for machine in ("test64", "test64x2"):
        for b in (1, 2):
            c = run.cases["llama", machine, b]
            assert c["status"] == "ok", c["reason"]
            f = c["figures"]
            assert f["sequences"] == b
            assert f["aggregate_tokens_per_second"] == pytest.approx(
                b * f["tokens_per_second"], rel=1e-12)
            assert f["flops_per_step"] == pytest.approx(b * f["flops_per_token"], rel=1e-12)
            assert all(x["ok"] for x in c["checks"])
    positions = {c["position"] for c in run.suite["cases"]
                 if c["model"] == "llama" and c["status"] == "ok"}
    assert positions == {63}  # every machine and B decodes the same position


def test_the_table_has_a_row_and_a_curve_row_per_case_and_b(run):
    assert run.table.strip() in run.out.stdout
    rows = run.table.splitlines()
    for (model, machine, b), c in run.cases.items():
        head = f"| {model} | {machine} | {b} | "
        assert sum(r.startswith(head) for r in rows) == 3, head  # results, curve, host cost
        if c["status"] == "ok":
            f = c["figures"]
            pair = (f" | {f['tokens_per_second']:,.0f} | "
                    f"{f['aggregate_tokens_per_second']:,.0f} | ")
            assert sum(pair in r for r in rows if r.startswith(head)) == 2
    assert "Per-user against aggregate tokens/s" in run.table
    one = run.cases["llama", "test64", 1]["figures"]
    two = run.cases["llama", "test64", 2]["figures"]
    ratio = two["aggregate_tokens_per_second"] / one["aggregate_tokens_per_second"]
    assert f"| llama | test64 | 2 | {two['tokens_per_second']:,.0f} | " \
           f"{two['aggregate_tokens_per_second']:,.0f} | " in run.table
    assert f" | {ratio:.2f}x |" in run.table
    ttft = [r for r in rows if r.startswith("- llama on test64, B = 2: first token")]
    assert ttft == [f"- llama on test64, B = 2: first token of a 64-token prompt "
                    f"{fmt_seconds(two['ttft_seconds'])} (fed a token a step)"]
    assert two["ttft_seconds"] == pytest.approx(64 / two["tokens_per_second"], rel=1e-12)


def test_the_curve_and_the_other_plots_are_written(run):
    res = run.root / "res"
    w, h = png_size((res / "throughput_curve.png").read_bytes())
    assert w > 400 and h > 300
    for name in ["tokens_per_second.png"] + [f"roofline-{m}.png" for m in MACHINES]:
        png_size((res / name).read_bytes())
    assert "throughput_curve.png" in run.out.stderr


def test_a_model_no_machine_holds_is_a_refused_row_with_its_reason(run):
    for machine in ("test64", "test64x2"):
        for b in (1, 2):
            c = run.cases["big", machine, b]
            assert c["status"] == "not compiled" and c["reason"] and "\n" not in c["reason"]
            assert f"machine '{machine}'" in c["reason"]
            label = f"big on {machine}" + (", B = 2" if b == 2 else "")
            assert f"] {label}: {c['reason']}" in run.table
    assert violations(run.suite) == []


def test_a_system_of_wafers_respects_its_links_floor(run):
    m = load_machine("test64x2")
    for b in (1, 2):
        c = run.cases["llama", "test64x2", b]
        f = c["figures"]
        assert [x["name"] for x in c["checks"]] == ["SIMD", "link", "system links"]
        assert len(f["pipe_bytes"]) == 2 and f["pipe_bytes"][0] > 0  # wafer 0 -> 1
        floor = max(f["pipe_bytes"]) / m.link_bandwidth
        check = c["checks"][2]
        assert check["floor_seconds"] == pytest.approx(floor, rel=1e-12) and check["ok"]
        assert f["seconds_per_token"] >= floor
        assert f["system_link_bytes_per_step"] == sum(f["pipe_bytes"])
        assert 0 < f["hottest_pipe_utilisation"] <= 1
    # one wafer has no system links to check
    assert [x["name"] for x in run.cases["llama", "test64", 1]["checks"]] == ["SIMD", "link"]


def test_a_gpu_node_respects_each_gpus_hbm_and_its_links(run):
    m = load_machine("h100x2")
    c = run.cases["llama", "h100x2", 1]
    assert c["status"] == "ok", c["reason"]
    f = c["figures"]
    names = [x["name"] for x in c["checks"]]
    assert names == ["HBM weights", "HBM moved", "HBM per GPU", "SIMD", "link", "system links"]
    checks = {x["name"]: x for x in c["checks"]}
    # tensor parallel: each GPU holds about half of every matrix, none less than half
    assert f["weight_bytes_per_token"] / 2 <= f["gpu_weight_bytes"] < f["weight_bytes_per_token"]
    assert checks["HBM per GPU"]["floor_seconds"] == pytest.approx(
        f["gpu_weight_bytes"] / m.hbm_bandwidth, rel=1e-12)
    # the node's peak is both GPUs' bandwidth
    assert checks["HBM weights"]["floor_seconds"] == pytest.approx(
        f["weight_bytes_per_token"] / (2 * m.hbm_bandwidth), rel=1e-12)
    assert f["pipe_bytes"][0] > 0 and f["pipe_bytes"][1] > 0  # the allreduces go both ways
    assert all(x["ok"] for x in c["checks"])
    # B = 2 runs as soon as the HBM target batches; until then it is refused, in one line
    two = run.cases["llama", "h100x2", 2]
    assert two["status"] == "ok" or (two["status"] == "not compiled"
                                     and "sequences" in two["reason"]
                                     and "\n" not in two["reason"]), two


def test_a_result_under_the_links_floor_is_an_emulator_bug():
    m = load_machine("test64x2")
    figures = ModelFigures("llama", 2, 10**6, 10**6, ((4, 16), (4, 16)))
    case = Case("m", m.name, status="ok", max_context=16, position=3, sequences=2)
    # 1,000 cycles, but 10^6 wavelets (4 MB) over the pipe from wafer 0 to wafer 1
    result = SimpleNamespace(cycles=1_000, hbm_read_bytes=0, hbm_write_bytes=0,
                             link_wavelets=np.array([0, 5, 900]), wavelets=7, wavelet_hops=9,
                             pipe_wavelets=np.array([10**6, 0]))
    measure(case, figures, m, "bf16", result, None)
    failed = [c["name"] for c in case.checks if not c["ok"]]
    assert failed == ["system links"]
    floor = 10**6 * m.wavelet_bytes / m.link_bandwidth
    assert case.checks[-1]["floor_seconds"] == pytest.approx(floor)
    suite = {"meta": {"dtype": "bf16", "date": "d", "host": "h", "command": "", "batch": 1,
                      "sequences": [2], "batch_sweep": "b", "host_seconds": 1.0,
                      "peak_rss_bytes": 1, "machines": [machine_json(m)]},
             "cases": [case.to_json()]}
    assert violations(suite) == [f"m on test64x2, B = 2: {1_000 / m.clock_hz * 1e9:.3g} ns "
                                 f"a token is under the system links floor of "
                                 f"{floor * 1e6:.3g} us"]
    assert "**VIOLATION (system links): emulator bug**" in markdown(suite)


def test_llama_3_70b_is_built_in_but_opt_in():
    c = BUILTIN_MODELS["llama-3-70b"]
    assert (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
            c["num_key_value_heads"], c["intermediate_size"], c["vocab_size"],
            c["max_position_embeddings"]) == (8192, 80, 64, 8, 28672, 128256, 8192)
    assert "llama-3-70b" not in DEFAULT_MODELS and "llama-3-8b" in DEFAULT_MODELS


def test_sequences_parse_as_a_sorted_list():
    assert parse_sequences("8,1, 2,4,2") == [1, 2, 4, 8]
    assert parse_sequences(3) == [3]
    for bad in ("0", "1,x", "-2", ","):
        with pytest.raises(BenchError):
            parse_sequences(bad)


@pytest.mark.parametrize("value, fragment", [
    ("0", "--sequences takes positive integers separated by commas (1,2,4,8), got '0'"),
    ("1,two", "got 'two'"),
])
def test_bad_sequences_are_one_line(cli, user_error, tmp_path, value, fragment):
    user_error(cli("bench", "--models", "gpt2-small", "--sequences", value, "-o", "r",
                   cwd=tmp_path), fragment)
    assert not (tmp_path / "r").exists()


def test_times_round_into_the_unit_they_are_shown_in():
    from wse_emu.apps.benchreport import fmt_bytes, fmt_seconds

    assert fmt_seconds(0.9996) == "1 s" and fmt_seconds(0.9994) == "999 ms"
    assert fmt_seconds(9.9996e-7) == "1 us" and fmt_seconds(2.5e-7) == "250 ns"
    assert fmt_bytes(999.7) == "1 KB" and fmt_bytes(12) == "12 B"

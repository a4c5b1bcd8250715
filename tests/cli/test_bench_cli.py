"""`wse-emu bench` on tiny models: the files it writes and the properties of its numbers.

Two tiny models (a GPT-2 config passed as a loose file, a Llama config passed as a folder) on
the wafer (resident weights) and on an HBM machine (weights streamed from HBM), both emulated.
The checks are what a wrong suite or a wrong emulator would break: tokens/s is 1 / time per
token, the FLOPs and weight bytes are the ones the shapes imply, the wafer reads nothing from
HBM while the GPU reads every weight, every result is above its physics floors, and a time
under a floor is flagged as an emulator bug.
"""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from wse_emu.apps.benchreport import markdown, violations
from wse_emu.apps.benchsuite import (CONTEXT_LADDER, Case, ModelFigures, critical_path,
                                 machine_json, measure, model_figures)
from wse_emu.isa.machine import load_machine

GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_layer": 2,
        "n_head": 4, "n_positions": 64, "vocab_size": 256, "activation_function": "gelu_new"}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 2048,
         "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu"}
MESH, HBM = "wse3", "h100"


def gpt2_matrix_elements(c) -> int:
    h = c["n_embd"]
    return c["n_layer"] * (3 * h * h + h * h + 4 * h * h + 4 * h * h) + c["vocab_size"] * h


def llama_matrix_elements(c) -> int:
    h, i = c["hidden_size"], c["intermediate_size"]
    hd = h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i
    return c["num_hidden_layers"] * per_layer + c["vocab_size"] * h  # untied LM head


@pytest.fixture(scope="module")
def bench(tmp_path_factory, cli):
    root = tmp_path_factory.mktemp("bench")
    (root / "gpt2-tiny.json").write_text(json.dumps(GPT2))
    (root / "llama-tiny").mkdir()
    (root / "llama-tiny" / "config.json").write_text(json.dumps(LLAMA))
    out = cli("bench", "--models", "gpt2-tiny.json,llama-tiny", "--machines", MESH,
              "--machines", HBM, "-o", "res", cwd=root)
    assert out.code == 0, out.stderr
    suite = json.loads((root / "res" / "bench.json").read_text())
    cases = {(c["model"], c["machine"]): c for c in suite["cases"]}
    return SimpleNamespace(root=root, out=out, suite=suite, cases=cases)


def test_writes_the_table_the_json_and_the_plots(bench):
    res = bench.root / "res"
    assert "Traceback" not in bench.out.stderr
    table = (res / "bench.md").read_text()
    assert table.strip() in bench.out.stdout  # what it prints is what it wrote
    for png in ["tokens_per_second.png", f"roofline-{MESH}.png", f"roofline-{HBM}.png"]:
        assert (res / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert f"wrote {res.name}/bench.md" in bench.out.stderr
    assert "[4/8]" in bench.out.stderr  # progress: a compile and a run per case
    assert bench.suite["meta"]["command"].startswith("wse-emu bench --models gpt2-tiny.json")
    assert set(bench.cases) == {(m, k) for m in ("gpt2-tiny", "llama-tiny") for k in (MESH, HBM)}


def test_every_case_runs_and_its_times_agree(bench):
    for (model, machine), c in bench.cases.items():
        f = c["figures"]
        assert f["tokens_per_second"] * f["seconds_per_token"] == pytest.approx(1.0, rel=1e-12)
        if machine == HBM:
            continue
        assert c["status"] == "ok", (model, machine, c["reason"])
        clock = load_machine(machine).clock_hz
        assert f["seconds_per_token"] == pytest.approx(f["cycles_per_token"] / clock, rel=1e-12)
        layers = 2
        assert 0 < f["seconds_per_layer"] * layers <= f["seconds_per_token"] * (1 + 1e-12)
        assert c["host"]["step_seconds"] > 0 and c["host"]["peak_rss_bytes"] > 0
    assert bench.suite["meta"]["peak_rss_bytes"] >= max(
        c["host"]["peak_rss_bytes"] for c in bench.cases.values())
    for model in ("gpt2-tiny", "llama-tiny"):  # the mesh's critical path adds up to the token
        f = bench.cases[model, MESH]["figures"]
        assert f["layer_time_measured"] and len(f["layer_seconds"]) == 2
        assert sum(f["critical_path_seconds"].values()) == pytest.approx(f["seconds_per_token"])
        assert set(f["critical_path_seconds"]) in ({"embed", "vector", "gemv", "attn", "head"},
                                                  {"embed", "layer", "head", "source"})


def test_flops_and_weight_bytes_are_counted_from_the_shapes(bench):
    for model, config, elements in (("gpt2-tiny", GPT2, gpt2_matrix_elements(GPT2)),
                                    ("llama-tiny", LLAMA, llama_matrix_elements(LLAMA))):
        heads = config.get("n_head", config.get("num_attention_heads"))
        hidden = config.get("n_embd", config.get("hidden_size"))
        c = bench.cases[model, MESH]
        seen = c["position"] + 1
        attention = 2 * 4 * heads * (hidden // heads) * seen  # 2 layers, q.k and p.v
        assert c["figures"]["flops_per_token"] == 2 * elements + attention
        for machine in (MESH, HBM):
            assert bench.cases[model, machine]["figures"]["weight_bytes_per_token"] == 2 * elements


def test_the_hbm_machine_streams_every_weight_and_stays_above_its_floors(bench):
    m = load_machine(HBM)
    for model in ("gpt2-tiny", "llama-tiny"):
        c = bench.cases[model, HBM]
        f = c["figures"]
        assert c["status"] == "ok" and c["pes"] == m.pes
        assert f["hbm_read_bytes_per_token"] >= f["weight_bytes_per_token"] > 0
        assert f["hbm_write_bytes_per_token"] > 0  # activations and the KV cache
        assert f["seconds_per_token"] >= f["weight_bytes_per_token"] / m.hbm_bandwidth
        assert 0 < f["hbm_utilisation"] <= 1
        assert [x["name"] for x in c["checks"]] == ["HBM weights", "HBM moved", "SIMD", "link"]
        assert all(x["ok"] for x in c["checks"])
        # the same position as the wafer, so both machines do the same work
        assert c["position"] == bench.cases[model, MESH]["position"]


def test_the_wafer_reads_nothing_from_hbm_and_stays_above_its_floors(bench):
    m = load_machine(MESH)
    for model in ("gpt2-tiny", "llama-tiny"):
        c = bench.cases[model, MESH]
        f = c["figures"]
        assert f["hbm_read_bytes_per_token"] == f["hbm_write_bytes_per_token"] == 0
        assert f["hbm_utilisation"] is None
        assert f["seconds_per_token"] >= f["flops_per_token"] / m.peak_flops
        assert f["cycles_per_token"] >= f["hottest_link_wavelets"] > 0
        assert 0 < f["link_utilisation_mean"] <= f["link_utilisation_max"] <= 1
        assert f["fabric_link_bytes_per_token"] >= f["fabric_bytes_sent_per_token"] > 0
        assert [x["name"] for x in c["checks"]] == ["SIMD", "link"]
    assert all(x["ok"] for c in bench.suite["cases"] for x in c["checks"])
    assert violations(bench.suite) == []


def test_the_wafer_decodes_the_last_position_its_context_holds(bench):
    mesh = bench.cases["llama-tiny", MESH]
    assert mesh["max_context"] in CONTEXT_LADDER
    assert mesh["position"] == mesh["max_context"] - 1
    # GPT-2's learned positions cap its context at n_positions
    assert bench.cases["gpt2-tiny", MESH]["max_context"] <= GPT2["n_positions"]


def test_the_table_has_a_row_a_case_with_its_floors(bench):
    table = (bench.root / "res" / "bench.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "tiny |" in line]
    assert len(rows) == 2 * 4  # results and host cost
    for c in bench.suite["cases"]:
        row = next(r for r in rows if r.startswith(f"| {c['model']} | {c['machine']} | "))
        rate = f"{c['figures']['tokens_per_second']:,.0f}"
        assert f" | {rate} | " in row and row.endswith(": ok |")
    assert "--sequences B keeps B sequences in flight" in table  # one sequence, said so
    assert "Resident weights vs HBM streaming" in table
    for model in ("gpt2-tiny", "llama-tiny"):
        ratio = (bench.cases[model, MESH]["figures"]["tokens_per_second"]
                 / bench.cases[model, HBM]["figures"]["tokens_per_second"])
        line = next(t for t in table.splitlines() if t.startswith(f"- {model}: {MESH}"))
        assert f"= {ratio:.3g}x" in line and "must stream" in line and "HBM busy" in line


def test_a_model_the_machine_cannot_hold_is_a_row_not_a_crash(cli, tmp_path):
    big = dict(GPT2, n_embd=256, n_layer=4, vocab_size=1024)  # 473 PEs; tiny has 64
    (tmp_path / "gpt2-tiny.json").write_text(json.dumps(big))
    (tmp_path / "small.json").write_text(json.dumps(GPT2))
    out = cli("bench", "--models", "gpt2-tiny.json,small.json", "--machines", "tiny", "-o",
              "r", cwd=tmp_path)
    assert out.code == 0 and "Traceback" not in out.stderr, out.stderr
    case, ok = json.loads((tmp_path / "r" / "bench.json").read_text())["cases"]
    assert case["status"] == "not compiled" and "machine 'tiny'" in case["reason"]
    assert ok["status"] == "ok"
    assert "\n" not in case["reason"]
    assert "| gpt2-tiny | tiny | 1 | - | - | not compiled [1] |" in out.stdout
    assert "[1] gpt2-tiny on tiny: max_context 16: " in out.stdout


def test_bench_where_no_case_ran_writes_nothing_and_fails(cli, tmp_path):
    big = dict(GPT2, n_embd=256, n_layer=4, vocab_size=1024)
    (tmp_path / "gpt2-tiny.json").write_text(json.dumps(big))
    out = cli("bench", "--models", "gpt2-tiny.json", "--machines", "tiny", "-o", "r",
              cwd=tmp_path)
    assert out.code == 1 and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "r").exists()
    assert "not compiled [1]" in out.stdout  # the table says why
    assert out.stderr.splitlines()[-1] == ("wse-emu: no case ran (the table says why), so "
                                           "nothing was written to r")


def test_bench_errors_name_the_users_config_not_a_temporary_folder(cli, tmp_path):
    (tmp_path / "weird.json").write_text(json.dumps(dict(GPT2, n_head=5)))  # 64 % 5 != 0
    out = cli("bench", "--models", "weird.json", "--machines", "tiny", "-o", "r",
              cwd=tmp_path)
    assert "wse-emu-bench-" not in out.stdout + out.stderr, out.stdout + out.stderr
    assert "weird.json" in out.stdout + out.stderr


def test_bench_leaves_the_peak_memory_mark_alone(monkeypatch, tmp_path):
    """Writing to /proc/self/clear_refs resets the kernel's VmHWM, which outside tools (and
    `time -v`) read as the process's peak: bench must never do it."""
    import pathlib

    from wse_emu.apps import benchsuite

    written = []
    original = pathlib.Path.write_text

    def spy(self, *a, **k):
        written.append(str(self))
        return original(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "write_text", spy)
    (tmp_path / "m.json").write_text(json.dumps(GPT2))
    benchsuite.run_suite([str(tmp_path / "m.json")], ["tiny"])
    assert not [w for w in written if "clear_refs" in w]


@pytest.mark.parametrize("args, fragment", [
    (("--models", "gpt5"), "unknown model 'gpt5': built-in models are gpt2-small"),
    (("--models", "bad.json"), "bad.json: not valid JSON"),
    (("--models", "empty"), "empty: no config.json in this folder"),
    (("--models", "gpt2-small", "--machines", "wse9"), "unknown machine 'wse9'"),
])
def test_user_errors_are_one_line(cli, user_error, tmp_path, args, fragment):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty").mkdir()
    user_error(cli("bench", *args, "-o", "r", cwd=tmp_path), fragment)
    assert not (tmp_path / "r").exists()


def test_a_time_under_a_floor_is_flagged_as_an_emulator_bug():
    m = load_machine("h100")
    figures = ModelFigures("gpt2", 2, 10**9, 10**9, ((4, 16), (4, 16)))
    case = Case("m", "h100", status="ok", max_context=16, position=3)
    # 10,000 cycles (5 us) for 2 GB of bf16 weights: far under weight bytes / HBM bandwidth
    # (600 us), above FLOPs / peak (2 us), and under the 20,000 cycles a link needs for
    # 20,000 wavelets
    result = SimpleNamespace(cycles=10_000, hbm_read_bytes=2 * 10**9, hbm_write_bytes=0,
                             link_wavelets=np.array([0, 5, 20_000]), wavelets=7, wavelet_hops=9)
    measure(case, figures, m, "bf16", result, None)
    failed = {c["name"] for c in case.checks if not c["ok"]}
    assert failed == {"HBM weights", "HBM moved", "link"}
    assert case.figures["flops_per_token"] == 2e9 + 2 * 4 * 4 * 16 * 4
    suite = {"meta": {"dtype": "bf16", "date": "d", "host": "h", "command": "", "batch": 1,
                      "batch_sweep": "b", "host_seconds": 1.0, "peak_rss_bytes": 1,
                      "machines": [machine_json(m)]},
             "cases": [case.to_json()]}
    lines = violations(suite)
    assert len(lines) == 3 and all(line.startswith("m on h100: ") for line in lines)
    assert "**VIOLATION (HBM weights, HBM moved, link): emulator bug**" in markdown(suite)


def test_the_critical_path_is_a_running_maximum_over_the_stage_chain():
    stages = [{"kind": "embed", "layer": -1}, {"kind": "gemv", "layer": 0},
              {"kind": "attn", "layer": 0}, {"kind": "vector", "layer": 1},
              {"kind": "gemv", "layer": 2}]
    stage_of = np.array([0, 0, 1, 2, 2, 3, 4])
    clock = np.array([5, 10, 30, 25, 28, 20, 60])  # stage 3 halts before stage 2: share 0
    per_layer, by_part = critical_path(SimpleNamespace(clock=clock), stage_of, stages, 2, 10.0)
    assert per_layer == [2.0, 0.0]  # (30 - 10) / 10 Hz; layer 1 adds nothing
    assert by_part == {"embed": 1.0, "gemv": 2.0, "attn": 0.0, "vector": 0.0, "head": 3.0}
    assert critical_path(SimpleNamespace(clock=clock), None, stages, 2, 10.0) == (None, None)


def test_model_figures_count_a_tied_head_once(tmp_path):
    from wse_emu.isa.compiler.pipeline import load_graph

    folder = tmp_path / "g"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GPT2))
    f = model_figures(load_graph(folder, shape_only=True))
    assert f.matrix_elements == gpt2_matrix_elements(GPT2)
    assert f.flops(0) == 2 * f.matrix_elements + 2 * 4 * 64 * 1
    assert f.params > f.matrix_elements  # the embeddings, biases and norms are weights too
    assert math.isclose(f.flops(9) - f.flops(0), 2 * 4 * 64 * 9)


def test_compiling_for_an_hbm_machine_makes_a_streaming_kernel(cli, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(GPT2))
    out = cli("compile", "m", "--machine", HBM, "--shape-only", "-o", "m.bin", cwd=tmp_path)
    assert out.code == 0, out.stderr
    assert "weights streamed from HBM" in out.stdout and "HBM:" in out.stdout
    run = cli("generate", "m.bin", "--machine", HBM, "--timing-only", "--prompt-ids", "1,2",
              "--tokens", "2", "--json", cwd=tmp_path)
    assert run.code == 0, run.stderr
    assert json.loads(run.stdout)["tokens_per_second"] > 0


def test_the_comparison_says_a_step_when_a_step_carries_several_sequences():
    """A GPU reads every weight once a step: a token at B = 1, a token of each sequence when
    batched, so the B > 1 comparison must not say "every token"."""
    from wse_emu.apps.benchreport import compare

    figures = dict(tokens_per_second=100.0, hbm_read_bytes_per_token=2e9,
                   hbm_write_bytes_per_token=0, weight_bytes_per_token=1.6e9,
                   seconds_per_token=0.01, hbm_utilisation=0.5,
                   fabric_link_bytes_per_token=1e6, link_utilisation_max=0.01)
    machines = {"wafer": dict(kind="mesh", memory_bandwidth=1e15, pes=100),
                "gpu": dict(kind="hbm", hbm_bandwidth=3e12)}
    for b, word in ((1, "token"), (4, "step")):
        cases = [dict(model="m", machine=name, status="ok", sequences=b, figures=figures)
                 for name in machines]
        (line,) = compare(cases, machines)
        assert f"from HBM every {word} " in line and f"of link traffic a {word} " in line
        assert ("every token" in line) == (b == 1)


def test_a_step_s_progress_is_drawn_on_a_terminal_only(tmp_path, monkeypatch, capsys):
    """run_suite reports the cycle a step has reached as a transient label (a Llama-3-70B step
    takes a minute and a half); bench's progress draws it on a terminal and never logs it."""
    from wse_emu.apps.benchsuite import run_suite
    from wse_emu.apps.cli import bench_progress
    from wse_emu.emulator import core

    (tmp_path / "gpt2-tiny.json").write_text(json.dumps(GPT2))
    monkeypatch.setattr(core, "PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr(core, "SLICE_SECONDS", 0.0)
    monkeypatch.setattr(core, "FIRST_BUDGET", 16)
    monkeypatch.setattr(core, "MIN_BUDGET", 16)
    calls = []
    suite = run_suite([str(tmp_path / "gpt2-tiny.json")], [MESH],
                      progress=lambda *a: calls.append(a))
    steps = [a for a in calls if len(a) == 4]
    assert steps and all(a[3] is True and "gpt2-tiny on wse3: cycle " in a[2] for a in steps)
    cycles = suite["cases"][0]["figures"]["cycles_per_token"]
    assert all(int(a[2].split("cycle ")[1].split()[0].replace(",", "")) <= cycles for a in steps)
    assert all(len(a) == 3 for a in calls if "cycle " not in a[2])  # phases: as before
    # a callback of three parameters, as before transient labels, gets only the phases
    three = []
    run_suite([str(tmp_path / "gpt2-tiny.json")], [MESH],
              progress=lambda done, total, label: three.append(label))
    assert three and not any("cycle " in label for label in three)
    show = bench_progress()  # (stderr is not a terminal here: a line a phase)
    show(1, 4, "gpt2-tiny on wse3: compiling")
    show(1, 4, "gpt2-tiny on wse3: cycle 120 of ~300 (position 15)", True)
    err = capsys.readouterr().err
    assert "compiling" in err and "cycle 120" not in err

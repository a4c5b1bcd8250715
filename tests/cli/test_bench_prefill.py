"""`wse-emu bench --prefill B`: the time to first token of every case from a prefill program
(compile --prefill B) on every machine, wafers and GPUs alike."""

import json
from types import SimpleNamespace

import pytest

from tests.cli.test_bench_curve import LLAMA

MACHINES = ("test64", "h100x2")


@pytest.fixture(scope="module")
def suite(tmp_path_factory, cli):
    root = tmp_path_factory.mktemp("prefill")
    (root / "llama").mkdir()
    (root / "llama" / "config.json").write_text(json.dumps(LLAMA))
    out = cli("bench", "--models", "llama", "--machines", ",".join(MACHINES), "--sequences",
              "1,2", "--max-context", "64", "--prefill", "4", "-o", "res", cwd=root)
    assert out.code == 0 and "Traceback" not in out.stderr, out.stderr
    data = json.loads((root / "res" / "bench.json").read_text())
    return data, (root / "res" / "bench.md").read_text()


def test_every_case_has_the_prefill_programs_first_token(suite):
    data, table = suite
    assert data["meta"]["prefill"] == 4 and "--prefill 4" in data["meta"]["command"]
    for c in data["cases"]:
        f = c["figures"]
        assert c["status"] == "ok" and f["prefill_positions"] == 4
        prompt = c["position"] + 1
        assert f["ttft_prompt_tokens"] == prompt == 64
        runs = prompt // 4
        clock = data["meta"]["machines"][MACHINES.index(c["machine"])]["clock_hz"]
        last = f["prefill_run_cycles"] / clock  # the prompt's last run
        if c["machine"] == "test64":  # a wafer-mapped run costs the same at every position
            assert f["ttft_seconds"] == pytest.approx(runs * last)
        else:  # the runs grow with their positions: the first is cheaper than the last
            assert runs * last / 2 < f["ttft_seconds"] < runs * last
        # far less than the prompt fed a token a step (a tiny model: its embedding and head
        # weigh a lot beside its 2 layers)
        assert f["ttft_seconds"] < 0.7 * prompt * f["seconds_per_token"]
        assert f["prefill_tokens_per_second"] == pytest.approx(prompt / f["ttft_seconds"])
        method = ("1 emulated of 16" if c["machine"] == "test64"
                  else "the first and the last emulated of 16")
        assert f["ttft_method"] == f"prefill in runs of 4 positions, {method}"
        floors = {x["name"]: x for x in f["ttft_floors"]}
        assert set(floors) == ({"SIMD"} if c["machine"] == "test64" else {"SIMD", "HBM weights"})
        assert all(x["ok"] and 0 < x["floor_seconds"] < f["ttft_seconds"]
                   for x in floors.values())
    lines = [ln for ln in table.splitlines() if "first token" in ln]
    assert len(lines) == 2  # once a model and machine, whatever B
    assert all("(prefill in runs of 4 positions" in ln and "; floor SIMD " in ln
               for ln in lines)
    # only the first B of a machine counts the prefill's host time
    hosts = [c["host"] for c in data["cases"]]
    assert sum("prefill_seconds" in h for h in hosts) == len(MACHINES)


def test_a_prefill_too_large_is_halved_until_it_compiles(cli, tmp_path):
    """--prefill 4096 does not fit test64 (4096 rows of masks a source PE): the largest half
    of it that compiles is used, and says so."""
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps(LLAMA))
    out = cli("bench", "--models", "llama", "--machines", "test64", "--max-context", "64",
              "--prefill", "4096", "-o", "res", cwd=tmp_path)
    assert out.code == 0, out.stderr
    (case,) = json.loads((tmp_path / "res" / "bench.json").read_text())["cases"]
    f = case["figures"]
    assert case["status"] == "ok" and f["prefill_asked"] == 4096
    B = f["prefill_positions"]
    assert 2 <= B < 4096 and B & (B - 1) == 0
    assert f["ttft_method"].startswith(f"prefill in runs of {B} positions")


def test_a_prefill_that_does_not_compile_says_why(cli, tmp_path):
    """When no prefill program compiles (here the model's config.json has gone), the case
    keeps its decode figures and its first-token time is replaced by the compiler's one line
    for the B asked (every half of it refused too)."""
    from wse_emu.apps.benchsuite import Case, _prefill_cases
    from wse_emu.isa.machine import load_machine

    calls = []

    class Tick:
        def show(self, *a, **k):
            pass

        def advance(self):
            calls.append(1)
    case = Case("m", "test64", status="ok", max_context=64, position=63, figures={
        "ttft_seconds": 1.0, "ttft_prompt_tokens": 64, "ttft_method": "fed a token a step"},
        host={"case_seconds": 1.0, "peak_rss_bytes": 1})
    spec = SimpleNamespace(folder=tmp_path / "missing", tell=lambda t: t)
    _prefill_cases(spec, [load_machine("test64")], "bf16", [case], 4, Tick(), None)
    assert calls == [1] and case.status == "ok"
    assert "ttft_seconds" not in case.figures and "ttft_method" not in case.figures
    assert case.figures["ttft_reason"].startswith("--prefill 4: ")


def test_a_first_token_under_its_floor_is_a_violation(suite):
    from wse_emu.apps.benchreport import violations
    data, _ = suite
    case = dict(data["cases"][0])
    f = dict(case["figures"])
    f["ttft_floors"] = [dict(f["ttft_floors"][0], floor_seconds=2 * f["ttft_seconds"],
                             ok=False)]
    case["figures"] = f
    (line,) = violations({"cases": [case]})
    assert "a first token in" in line and "under the prefill's SIMD floor" in line

"""`wse-emu run|generate --timing-only` on a shape-only compile, as a user runs them."""

import json

import numpy as np
import pytest

GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_layer": 2,
        "n_head": 4, "n_positions": 64, "vocab_size": 256, "activation_function": "gelu_new"}


@pytest.fixture(scope="module")
def shape_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("timing")
    (root / "m").mkdir()
    (root / "m" / "config.json").write_text(json.dumps(GPT2))
    np.save(root / "ids.npy", np.array([7], dtype=np.int32))
    return root


def test_run_and_generate_timing_only(wse, shape_bin):
    out = wse("compile", "m", "--shape-only", "--max-context", "16", "--machine", "test64",
              "-o", "m.bin", cwd=shape_bin)
    assert out.code == 0, out.stderr
    run = wse("run", "m.bin", "--machine", "test64", "--timing-only", "--json",
              "--input", "input_ids=ids.npy", cwd=shape_bin)
    assert run.code == 0, run.stderr
    d = json.loads(run.stdout)
    assert d["status"] == "halted" and d["mode"] == "timing-only" and d["cycles"] > 0
    text = wse("run", "m.bin", "--machine", "test64", "--timing-only", "--input",
               "input_ids=ids.npy", cwd=shape_bin)
    assert text.code == 0 and "halted (timing-only: no values computed)" in text.stdout
    assert f"cycles    {d['cycles']:,}" in text.stdout
    gen = wse("generate", "m.bin", "--machine", "test64", "--timing-only", "--prompt-ids", "1,2",
              "--tokens", "3", "--json", cwd=shape_bin)
    assert gen.code == 0, gen.stderr
    g = json.loads(gen.stdout)
    assert g["timing_only"] and g["generated_ids"] == [] and len(g["cycles_per_token"]) == 3
    assert g["mode"] == "timing-only" and g["decode_token"] == 2
    assert "no token can be sampled" in g["note"]
    # decode cycles grow with the position (attention over more cached positions)
    assert g["cycles_per_token"][0] <= g["cycles_per_token"][-1]
    text = wse("generate", "m.bin", "--machine", "test64", "--timing-only", "--prompt-ids", "1",
               "--tokens", "2", "--decode-token", "200", cwd=shape_bin)
    assert text.code == 0 and "timing only" in text.stdout and "tokens/s" in text.stdout
    assert "each step fed token 200" in text.stdout and "no token is sampled" in text.stdout


@pytest.mark.parametrize("extra, fragment", [
    (("--dump-dir", "out"), "--dump-dir: a --timing-only run computes no output values"),
    (("--reference",), "--reference runs functional programs only"),
])
def test_timing_only_refuses_what_it_cannot_do(wse, user_error, shape_bin, extra, fragment):
    if not (shape_bin / "m.bin").exists():
        wse("compile", "m", "--shape-only", "--max-context", "16", "--machine", "test64",
            "-o", "m.bin", cwd=shape_bin)
    out = wse("run", "m.bin", "--machine", "test64", "--timing-only", *extra,
              "--input", "input_ids=ids.npy", cwd=shape_bin)
    user_error(out, fragment)
    assert not (shape_bin / "out").exists()


def test_an_empty_input_file_is_one_clear_line(wse, shape_bin):
    """np.load raises EOFError on an empty file: that is a user error too, not 'aborted'."""
    if not (shape_bin / "m.bin").exists():
        wse("compile", "m", "--shape-only", "--max-context", "16", "--machine", "test64",
            "-o", "m.bin", cwd=shape_bin)
    empty = shape_bin / "empty.npy"
    empty.write_bytes(b"")
    out = wse("run", "m.bin", "--machine", "test64", "--timing-only", "--input",
              f"input_ids={empty}", cwd=shape_bin)
    assert out.code == 2 and "is not a .npy file" in out.stderr and "aborted" not in out.stderr


@pytest.mark.parametrize("extra, fragment", [
    (("--decode-token", "3"), "--decode-token needs --timing-only"),
    (("--timing-only", "--decode-token", "300"), "token id 300 is outside the vocabulary"),
    (("--timing-only", "--reference"), "--reference runs functional programs only"),
])
def test_generate_refuses_what_it_cannot_do(wse, user_error, shape_bin, extra, fragment):
    if not (shape_bin / "m.bin").exists():
        wse("compile", "m", "--shape-only", "--max-context", "16", "--machine", "test64",
            "-o", "m.bin", cwd=shape_bin)
    out = wse("generate", "m.bin", "--machine", "test64", "--prompt-ids", "1", "--tokens", "2",
              *extra, cwd=shape_bin)
    user_error(out, fragment)


def test_a_functional_program_runs_timing_only_in_the_same_cycles(wse, tmp_path):
    """Any program may run timing-only, not only shape-only compiles."""
    from wse_emu.isa.binfmt import write_program
    from programs.conftest import build

    w = np.random.default_rng(0).standard_normal((32, 32), dtype=np.float32)
    write_program(build("gemv", {"W": w}, M=32, K=32, P=2, Q=2), tmp_path / "g.bin")
    np.save(tmp_path / "x.npy", np.ones(32, dtype=np.float32))
    runs = [json.loads(wse("run", "g.bin", "--machine", "tiny", "--json", *flag, "--input",
                           "x=x.npy", cwd=tmp_path).stdout) for flag in ((), ("--timing-only",))]
    assert [r["mode"] for r in runs] == ["functional", "timing-only"]
    for key in ("cycles", "instructions", "pe_cycles", "fabric", "classes"):
        assert runs[0][key] == runs[1][key], key


def test_generate_s_bar_shows_the_cycle_a_step_has_reached(capsys):
    """On a terminal, generate's bar says how far the current run has come (a Llama-3-70B step
    takes minutes of host time), against the cycles the compiler predicted for a step."""
    from wse_emu.emulator.apps.cli import _step_progress
    from wse_emu.emulator.apps.progress import Bar

    bar = Bar(2, "emulated runs", True)
    _step_progress(bar, 5_000)(1_234, 99)
    err = capsys.readouterr().err
    assert "0/2 emulated runs" in err and "(run 1 at cycle 1,234 of ~5,000 predicted)" in err
    within = _step_progress(bar, 5_000)
    within(1_500, 120)
    within(1_490, 121)  # a woken PE behind the loop's clock before: the bar stays at 1,500
    assert "(run 1 at cycle 1,500 of" in capsys.readouterr().err.rsplit("\r", 1)[-1]
    bar.step()
    _step_progress(bar, 0)(77, 1)  # no prediction: the cycle alone
    err = capsys.readouterr().err
    assert "1/2 emulated runs" in err and "(run 2 at cycle 77)" in err and "predicted" not in err


def test_a_position_past_the_context_is_refused_before_the_load(cli, user_error, shape_bin,
                                                                monkeypatch):
    """generate checks the request against the compiled max_context before it loads the
    program (a full-size load takes seconds), with the same line the Generator gives."""
    from wse_emu.emulator import generate

    if not (shape_bin / "m.bin").exists():
        cli("compile", "m", "--shape-only", "--max-context", "16", "--machine", "test64",
            "-o", "m.bin", cwd=shape_bin)

    def no_load(*args, **kwargs):
        raise AssertionError("loaded the program before checking its context")
    monkeypatch.setattr(generate.Generator, "__init__", no_load)
    out = cli("generate", "m.bin", "--timing-only", "--position", "20", "--tokens", "1",
              cwd=shape_bin)
    user_error(out, "position 20 and 1 tokens need 21 cached positions, but the program was "
                    "compiled with max_context 16: start at position 15 at most")

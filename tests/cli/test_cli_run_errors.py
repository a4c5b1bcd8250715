"""`wse-emu run` refuses what cannot run, before running it: inputs missing, unknown, of the
wrong shape or unreadable; machines unknown, too small, or with too little SRAM; bad options.
Each is exit code 2 and one line that says what is wrong and what to do, and nothing is
written (no --dump-dir, --trace or --plot output)."""

import re

import numpy as np
import pytest

from wse_emu.isa.machine import PRESET_DIR

OUTPUTS = ("--dump-dir", "out", "--trace", "t.json", "--plot", "p.png")


@pytest.fixture
def folder(small_gemv, tmp_path):
    """A user's folder with the small gemv binary and a few input files."""
    (tmp_path / "g.bin").write_bytes(small_gemv["bin"].read_bytes())
    np.save(tmp_path / "x.npy", small_gemv["x"])
    np.save(tmp_path / "x2d.npy", small_gemv["x"].reshape(1, -1))
    np.save(tmp_path / "short.npy", small_gemv["x"][:-1])
    (tmp_path / "x.txt").write_text(" ".join(map(str, small_gemv["x"])))
    return tmp_path


def refused(outcome, folder, user_error, *fragments):
    line = user_error(outcome, *fragments)
    written = {"out", "t.json", "p.png"} & {p.name for p in folder.iterdir()}
    assert not written, f"refused run wrote {written}"
    return line


def test_missing_input_says_how_to_pass_it(folder, wse, user_error):
    refused(wse("run", "g.bin", *OUTPUTS, cwd=folder), folder, user_error,
            "input 'x' not given: pass --input x=FILE.npy")


@pytest.mark.parametrize("args, fragments", [
    (("--input", "x=x.npy", "--input", "z=x.npy"),
     ("--input z: the program has no input 'z' (inputs: x)",)),
    (("--input", "y=x.npy"), ("no input 'y'",)),  # y is the output, not an input
    (("--input", "x=x2d.npy"), ("input 'x' must have shape (32,), got (1, 32)",)),
    (("--input", "x=short.npy"), ("input 'x' must have shape (32,), got (31,)",)),
    (("--input", "x=missing.npy"), ("--input x", "missing.npy")),
    (("--input", "x=x.txt"), ("--input x", "x.txt", "not a .npy file")),
    (("--input", "x"), ("--input 'x' must look like NAME=VALUE",)),
    (("--input", "x=x.npy", "--input", "x=short.npy"),
     ("--input x is given twice ('x.npy' and 'short.npy')",)),
])
def test_bad_inputs(folder, cli, user_error, args, fragments):
    refused(cli("run", "g.bin", *args, *OUTPUTS, cwd=folder), folder, user_error, *fragments)


def test_input_of_strings_is_a_user_error(folder, cli, user_error):
    np.save(folder / "words.npy", np.array(["a"] * 32))
    refused(cli("run", "g.bin", "--input", "x=words.npy", *OUTPUTS, cwd=folder), folder,
            user_error, "--input x")


def test_unknown_machine_lists_the_presets(folder, wse, user_error):
    line = refused(wse("run", "g.bin", "--input", "x=x.npy", "--machine", "wse9", *OUTPUTS,
                       cwd=folder), folder, user_error, "unknown machine 'wse9'")
    for preset in ("wse2", "wse3", "tiny", "test64"):
        assert preset in line
    assert ".toml" in line


def test_program_bigger_than_the_fabric(gemv_wsa, tmp_path, wse, user_error):
    rng = np.random.default_rng(3)
    np.save(tmp_path / "W.npy", rng.standard_normal((64, 32), dtype=np.float32))
    np.save(tmp_path / "x.npy", rng.standard_normal(32, dtype=np.float32))
    asm = wse("asm", gemv_wsa, "-D", "M=64", "-D", "K=32", "-D", "P=16", "-D", "Q=8",
              "--data", "W=W.npy", "-o", "tall.bin", cwd=tmp_path)
    assert asm.code == 0, asm.stderr
    refused(wse("run", "tall.bin", "--input", "x=x.npy", "--machine", "tiny", *OUTPUTS,
                cwd=tmp_path), tmp_path, user_error,
            "program needs a 8 x 16 fabric but machine 'tiny' has 8 x 8")
    ok = wse("run", "tall.bin", "--input", "x=x.npy", "--machine", "test64", cwd=tmp_path)
    assert ok.code == 0, ok.stderr


def test_tile_too_big_for_sram_names_the_pe_and_the_overflow(gemv_wsa, tmp_path, wse,
                                                            user_error):
    # M = K = 224 on 2 x 2 PEs: a 112 x 112 fp32 tile is 50,176 bytes, past 48 KB on its own
    n, t = 224, 112
    np.save(tmp_path / "W.npy", np.ones((n, n), np.float32))
    np.save(tmp_path / "x.npy", np.ones(n, np.float32))
    asm = wse("asm", gemv_wsa, "-D", f"M={n}", "-D", f"K={n}", "-D", "P=2", "-D", "Q=2",
              "--data", "W=W.npy", "-o", "fat.bin", cwd=tmp_path)
    assert asm.code == 0, asm.stderr
    line = refused(wse("run", "fat.bin", "--input", "x=x.npy", *OUTPUTS, cwd=tmp_path),
                   tmp_path, user_error, "PE (0,0) of region 'gemv_0_0'",
                   "machine 'wse3' has 49152")
    match = re.search(r"needs (\d+) bytes of SRAM \(code (\d+), data and buffers (\d+)\).* "
                      r"over by (\d+)$", line)
    assert match, line
    need, code, data, over = map(int, match.groups())
    assert code % 8 == 0 and data == 4 * (t * t + 2 * t)  # W tile, x piece, partial sum
    assert need == code + data and over == need - 49152


def test_machine_file(folder, wse, user_error):
    text = (PRESET_DIR / "tiny.toml").read_text()
    (folder / "small.toml").write_text(text.replace('name = "tiny"', 'name = "mini"')
                                       .replace("width = 8 ", "width = 2 "))
    refused(wse("run", "g.bin", "--input", "x=x.npy", "--machine", "small.toml", *OUTPUTS,
                cwd=folder), folder, user_error,
            "program needs a 4 x 4 fabric but machine 'mini' has 2 x 8")
    (folder / "broken.toml").write_text(text.replace("clock_hz", "clock"))
    refused(wse("run", "g.bin", "--input", "x=x.npy", "--machine", "broken.toml", *OUTPUTS,
                cwd=folder), folder, user_error, "broken.toml: missing [pe] clock_hz")
    refused(wse("run", "g.bin", "--input", "x=x.npy", "--machine", "absent.toml", *OUTPUTS,
                cwd=folder), folder, user_error, "absent.toml: no such machine file")


@pytest.mark.parametrize("limit", ["0", "-5", "many"])
def test_max_cycles_must_be_a_positive_integer(folder, wse, user_error, limit):
    refused(wse("run", "g.bin", "--input", "x=x.npy", "--max-cycles", limit, *OUTPUTS,
                cwd=folder), folder, user_error, "Invalid value for '--max-cycles'",
            "(see 'wse-emu run --help')")


def test_unknown_option_is_one_line(folder, wse, user_error):
    refused(wse("run", "g.bin", "--input", "x=x.npy", "--cycles", "5", *OUTPUTS, cwd=folder),
            folder, user_error, "No such option '--cycles'", "Did you mean '--max-cycles'?",
            "(see 'wse-emu run --help')")

"""What a new user sees first: --help, --version, `wse-emu machines`; the commands that do not
run the emulator start without importing Numba; output into a closed pipe is not an error."""

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

COMMANDS = ("asm", "disasm", "info", "run", "machines", "demo")
# (name, width, height, clock GHz) as FACTS.md gives them
PRESETS = [("test64", 64, 64, 1.1), ("tiny", 8, 8, 1.1), ("wse2", 757, 996, 0.85),
           ("wse3", 762, 1172, 1.1)]
GPUS = [("a100", 108, 164, 80, 2.04), ("h100", 132, 228, 80, 3.35), ("h200", 132, 228, 141, 4.8)]

# Run one command in-process in a fresh interpreter and report what it imported.
PROBE = """\
import json, sys
from click.testing import CliRunner
from wse_emu.apps.cli import main
result = CliRunner().invoke(main, sys.argv[1:])
print(json.dumps({"code": result.exit_code, "numba": "numba" in sys.modules,
                  "core": "wse_emu.emulator.core" in sys.modules,
                  "error": repr(result.exception) if result.exception else None}))
"""


def test_help_lists_the_commands(wse, tmp_path):
    out = wse("--help", cwd=tmp_path)
    assert out.code == 0 and out.stderr == ""
    assert out.stdout.startswith("Usage: wse-emu [OPTIONS] COMMAND [ARGS]...")
    listed = out.stdout.split("Commands:")[1]
    for command in COMMANDS:
        assert f"\n  {command} " in listed
    run_help = wse("run", "-h", cwd=tmp_path)
    assert run_help.code == 0
    for option in ("--machine", "--input", "--dump-dir", "--json", "--trace", "--plot",
                   "--max-cycles", "--reference"):
        assert option in run_help.stdout


def test_version(wse, tmp_path):
    out = wse("--version", cwd=tmp_path)
    assert out.code == 0 and out.stdout.strip() == f"wse-emu, version {version('wse-emu')}"


def test_no_arguments_shows_the_help_not_an_error(wse, tmp_path):
    out = wse(cwd=tmp_path)
    assert "error" not in out.stderr
    assert "Commands:" in out.stdout + out.stderr


@pytest.mark.parametrize("args, fragment", [
    (("frobnicate",), "No such command 'frobnicate'. (see 'wse-emu --help')"),
    (("run",), "Missing argument 'BINARY'. (see 'wse-emu run --help')"),
    (("info", "a.bin", "b.bin"), "unexpected extra argument (b.bin)"),
])
def test_usage_errors_are_one_line(wse, user_error, tmp_path, args, fragment):
    user_error(wse(*args, cwd=tmp_path), fragment)


def test_machines_lists_presets_with_fabric_sizes(wse, tmp_path):
    out = wse("machines", cwd=tmp_path)
    assert out.code == 0 and out.stderr == ""
    lines = out.stdout.splitlines()
    names = [line.split()[0] for line in lines if line and not line[0].isspace()]
    assert names == sorted([p[0] for p in PRESETS] + [g[0] for g in GPUS])
    for name, w, h, ghz in PRESETS:
        [line] = [line for line in lines if line.startswith(f"{name} ")]
        assert f" {w} x {h} PEs, 48 KB SRAM/PE, {ghz:g} GHz, 24 colors" in line, line
    for name, sms, smem, gb, tbs in GPUS:
        [line] = [line for line in lines if line.startswith(f"{name} ")]
        assert f" {sms} cores, {smem} KB SRAM/core," in line, line
        assert f"HBM {gb} GB at {tbs:g} TB/s" in line, line


@pytest.fixture(scope="module")
def fast_inputs(small_gemv, tmp_path_factory):
    root = tmp_path_factory.mktemp("fast")
    (root / "bad.bin").write_bytes(small_gemv["bin"].read_bytes()[:100])
    (root / "p.wsa").write_text(".region a, 0, 0, 1, 1\n    halt\n.endregion\n")
    return root


@pytest.mark.parametrize("args, code", [
    (("--help",), 0),
    (("machines",), 0),
    (("asm", "p.wsa", "-o", "p.bin"), 0),
    (("asm", "missing.wsa", "-o", "p.bin"), 2),
    (("disasm", "SMALL", "-o", "dis"), 0),
    (("info", "SMALL"), 0),
    (("info", "bad.bin"), 2),
    (("run", "--help"), 0),
    (("run", "bad.bin"), 2),  # a damaged binary is refused before the core is loaded
], ids=lambda v: " ".join(v) if isinstance(v, tuple) else None)
def test_fast_commands_never_import_numba(fast_inputs, small_gemv, args, code):
    args = [str(small_gemv["bin"]) if a == "SMALL" else a for a in args]
    p = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=fast_inputs,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.splitlines()[-1])
    assert report["code"] == code, report
    assert not report["numba"] and not report["core"], report


@pytest.mark.parametrize("args", [("info", "SMALL"), ("run", "SMALL", "--input", "x=x.npy")])
def test_output_into_a_closed_pipe_is_not_a_user_error(small_gemv, args):
    """`wse-emu info prog.bin | head -1`: the reader went away, the user made no mistake."""
    args = [str(small_gemv["bin"]) if a == "SMALL" else a for a in args]
    p = subprocess.Popen([str(Path(sys.executable).parent / "wse-emu"), *args],
                         cwd=small_gemv["root"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # before the command can print anything
    stderr = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "error" not in stderr and "Traceback" not in stderr
    assert p.returncode != 2

"""`wse-emu asm` errors: one line `FILE:LINE:COL: message` pointing at the offending token, exit
code 2, and no program.bin written. An output that existed before is left exactly as it was
(asm writes a temporary file and renames it, so it is never half-overwritten), and no
temporary file is left behind."""

import numpy as np
import pytest

GOOD = """\
.param N = 4
.region a, 0, 0, 1, 1
    li r1, N
    halt
.endregion
"""

# (source, the line's FILE:LINE:COL, a fragment of the message); columns are 1-based
BROKEN = [
    (".region a, 0, 0, 1, 1\n    li r1, 5 +\n    halt\n.endregion\n",
     "bad.wsa:2:15", "expected a value"),
    ("; first line\n.region a, 0, 0, 1, 1\n    lii r1, 5\n    halt\n.endregion\n",
     "bad.wsa:3:5", "unknown mnemonic 'lii' (did you mean li"),
    (".region a, 0, 0, 1, 1\n    jmp nowhere\n    halt\n.endregion\n",
     "bad.wsa:2:9", "unknown label 'nowhere'"),
    (".region a, 0, 0, 1, 1\n    li r20, 1\n    halt\n.endregion\n",
     "bad.wsa:2:8", "writable integer register"),
    (".region a, 0, 0, 1, 1\n    dmem d0, f64, 0, 4\n    halt\n.endregion\n",
     "bad.wsa:2:14", "got f64"),
    (".region a, 0, 0, 1, 1\n    li r1, 1 / 0\n    halt\n.endregion\n",
     "bad.wsa:2:14", "division by zero"),
    (".region a, 0, 0, 1, 1\n    li r1, 0x1ffffffff\n    halt\n.endregion\n",
     "bad.wsa:2:12", "does not fit"),
    ("; regions\n\n.region a, 0, 0, 1, 1\n    halt\n", "bad.wsa:3:1", "never closed"),
    (GOOD + ".region b, 0, 0, 1, 1\n    halt\n.endregion\n", "bad.wsa:6:1", "overlaps region 'a'"),
]


def listing(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("source, where, fragment", BROKEN)
def test_error_points_at_file_line_col(tmp_path, cli, user_error, source, where, fragment):
    (tmp_path / "bad.wsa").write_text(source)
    line = user_error(cli("asm", "bad.wsa", "-o", "bad.bin", cwd=tmp_path), fragment)
    assert line.startswith(f"wse-emu: error: {where}: "), line
    assert listing(tmp_path) == ["bad.wsa"]


def test_failed_asm_keeps_the_old_output_whole(tmp_path, wse, user_error):
    (tmp_path / "p.wsa").write_text(GOOD)
    assert wse("asm", "p.wsa", "-o", "p.bin", cwd=tmp_path).code == 0
    before = (tmp_path / "p.bin").read_bytes()
    (tmp_path / "p.wsa").write_text(GOOD.replace("li r1, N", "li r1, N +"))
    user_error(wse("asm", "p.wsa", "-o", "p.bin", cwd=tmp_path), "p.wsa:3:15: ")
    assert (tmp_path / "p.bin").read_bytes() == before
    assert listing(tmp_path) == ["p.bin", "p.wsa"]  # no temporary file left over


def test_defines(tmp_path, cli, user_error):
    (tmp_path / "p.wsa").write_text(GOOD)

    def asm(*defines):
        return cli("asm", "p.wsa", "-o", "p.bin", *defines, cwd=tmp_path)

    user_error(asm("-D", "Q=3"), "p.wsa:1:1: -D Q=3: no .param Q in this program")
    user_error(asm("-D", "N"), "-D 'N' must look like NAME=VALUE")
    user_error(asm("-D", "N="), "-D 'N=' must look like NAME=VALUE")
    user_error(asm("-D", "N=4", "-D", "N=8"), "-D N is given twice ('4' and '8')")
    # a -D value is an expression, evaluated (and blamed) where its .param is
    user_error(asm("-D", "N=5 6"), "p.wsa:1:", "-D N=5 6: unexpected '6'")
    user_error(asm("-D", "N=nowhere"), "p.wsa:1:", "undefined name 'nowhere'")
    assert listing(tmp_path) == ["p.wsa"]
    ok = asm("-D", "N=2 * 3")
    assert ok.code == 0, ok.stderr
    assert "params: N=6" in cli("info", "p.bin", cwd=tmp_path).stdout


def test_failed_assert_names_its_line(tmp_path, cli, user_error, gemv_wsa):
    line_no = next(i for i, text in enumerate(gemv_wsa.read_text().splitlines(), 1)
                   if text.startswith(".assert M % P"))
    np.save(tmp_path / "W.npy", np.zeros((500, 512), np.float32))
    user_error(cli("asm", gemv_wsa, "-D", "M=500", "--data", "W=W.npy", "-o", "g.bin",
                   cwd=tmp_path), f"{gemv_wsa}:{line_no}:1: assertion failed: "
                                  "M must be a multiple of P")
    assert listing(tmp_path) == ["W.npy"]


def test_resident_data_problems(tmp_path, cli, user_error, gemv_wsa):
    np.save(tmp_path / "W.npy", np.ones((512, 512), np.float32))
    np.save(tmp_path / "x.npy", np.ones(512, np.float32))
    (tmp_path / "notes.txt").write_text("not an array\n")

    def asm(*data):
        return cli("asm", gemv_wsa, *data, "-o", "g.bin", cwd=tmp_path)

    user_error(asm(), "tensor 'W' has no data: pass --data W=FILE.npy")
    user_error(asm("--data", "W=x.npy"), "tensor 'W' is declared [512, 512] but its data has "
                                         "shape [512]")
    user_error(asm("--data", "W=missing.npy"), "missing.npy", "No such file")
    user_error(asm("--data", "W=notes.txt"), "notes.txt")
    user_error(asm("--data", "W=W.npy", "--data", "V=x.npy"), ":1:1: --data V: no .tensor V")
    user_error(asm("--data", "W"), "--data 'W' must look like NAME=VALUE")
    assert listing(tmp_path) == ["W.npy", "notes.txt", "x.npy"]


def test_missing_or_unreadable_source(tmp_path, cli, user_error):
    user_error(cli("asm", "nope.wsa", "-o", "p.bin", cwd=tmp_path),
               "nope.wsa:1:1: cannot read: No such file or directory")
    (tmp_path / "bin.wsa").write_bytes(b"\xff\xfe.region")
    user_error(cli("asm", "bin.wsa", "-o", "p.bin", cwd=tmp_path), "bin.wsa:1:1: cannot read")
    assert listing(tmp_path) == ["bin.wsa"]


def test_output_option_is_required(tmp_path, wse, user_error):
    (tmp_path / "p.wsa").write_text(GOOD)
    user_error(wse("asm", "p.wsa", cwd=tmp_path), "Missing option '-o'",
               "(see 'wse-emu asm --help')")
    assert listing(tmp_path) == ["p.wsa"]


def test_output_into_a_missing_folder_names_the_path_given(tmp_path, cli, user_error):
    (tmp_path / "p.wsa").write_text(GOOD)
    line = user_error(cli("asm", "p.wsa", "-o", "missing/p.bin", cwd=tmp_path),
                      "No such file or directory")
    assert "missing/p.bin" in line and ".tmp" not in line

"""A damaged program.bin (truncated, or one bit flipped in a header or a section payload) is
refused by `run`, `info` and `disasm` before anything runs: exit code 2, exactly one line on
stderr naming the file and what is wrong, no traceback, and no output file or folder written."""

import shutil
import struct

import pytest

HEADER_BYTES, SECTION_HEADER_BYTES = 16, 24
SECTION_NAMES = ("META", "REGIONS", "CODE", "ROUTES", "TENSORS", "BLOB", "DATA", "SYMBOLS", "HBM")


def sections(blob: bytes) -> list[tuple[str, int, int]]:
    """(name, offset of the section header, payload length) as docs/program-bin.md lays out."""
    out, offset = [], HEADER_BYTES
    while offset < len(blob):
        kind, _, length, _, _ = struct.unpack_from("<IIQII", blob, offset)
        out.append((SECTION_NAMES[kind - 1], offset, length))
        offset += SECTION_HEADER_BYTES + -(-length // 8) * 8
    return out


@pytest.fixture(scope="module")
def good(gemv_bar):
    blob = gemv_bar["bin"].read_bytes()
    assert [s[0] for s in sections(blob)] == list(SECTION_NAMES)
    return blob


@pytest.fixture
def folder(gemv_bar, tmp_path):
    shutil.copy(gemv_bar["root"] / "x.npy", tmp_path / "x.npy")
    return tmp_path


def run_args(name):
    return ("run", name, "--input", "x=x.npy", "--dump-dir", "out", "--trace", "t.json",
            "--plot", "p.png", "--json")


def assert_refused(outcome, folder, user_error, *fragments, present=("bad.bin", "x.npy")):
    line = user_error(outcome, *fragments)
    assert outcome.stdout == ""
    assert sorted(p.name for p in folder.iterdir()) == sorted(present), \
        "a refused binary must not leave output files behind"
    return line


def flips(blob: bytes):
    """(position, bit, where): the fixed header, every section header and payload."""
    yield 0, 0, "magic"
    yield 8, 1, "version"
    yield 10, 0, "flags"
    yield 12, 0, "section count"
    for name, offset, length in sections(blob):
        yield offset, 3, f"{name} kind"
        yield offset + 4, 0, f"{name} reserved"
        yield offset + 8, 2, f"{name} length"
        yield offset + 16, 5, f"{name} crc"
        yield offset + SECTION_HEADER_BYTES + length // 2, 7, f"{name} payload"
    name, offset, length = sections(blob)[0]
    if length % 8:
        yield offset + SECTION_HEADER_BYTES + length, 0, "META padding"


@pytest.mark.parametrize("command", ["run", "info", "disasm"])
def test_every_flipped_bit_is_refused_in_one_line(good, folder, cli, user_error, command):
    seen = set()
    for position, bit, where in flips(good):
        damaged = bytearray(good)
        damaged[position] ^= 1 << bit
        (folder / "bad.bin").write_bytes(damaged)
        args = {"run": run_args("bad.bin"), "info": ("info", "bad.bin"),
                "disasm": ("disasm", "bad.bin", "-o", "dis")}[command]
        line = assert_refused(cli(*args, cwd=folder), folder, user_error, "bad.bin")
        seen.add(line)
        if where.endswith("payload"):
            section = where.split()[0]
            assert f"section {section}" in line and "CRC32" in line, (where, line)
    assert len(seen) > 10, "each kind of damage deserves its own message"


@pytest.mark.parametrize("keep", [0, 7, HEADER_BYTES, HEADER_BYTES + 10, "half", "all but one"])
def test_truncated_binary_is_refused_with_the_offset(good, folder, cli, user_error, keep):
    n = {"half": len(good) // 2, "all but one": len(good) - 1}.get(keep, keep)
    (folder / "bad.bin").write_bytes(good[:n])
    for args in (run_args("bad.bin"), ("info", "bad.bin"), ("disasm", "bad.bin", "-o", "dis")):
        line = assert_refused(cli(*args, cwd=folder), folder, user_error, "bad.bin",
                              f"{n} bytes")
        assert "truncated" in line or "runs past the end" in line, line


def test_the_console_script_refuses_damage_the_same_way(good, folder, wse, user_error):
    """The real process: exit status 2 and one line, for a cut file and for a bad CRC."""
    (folder / "bad.bin").write_bytes(good[:len(good) - 100])
    line = assert_refused(wse(*run_args("bad.bin"), cwd=folder), folder, user_error)
    assert "section SYMBOLS" in line and "runs past the end of the file" in line
    damaged = bytearray(good)
    _, offset, length = sections(good)[2]
    damaged[offset + SECTION_HEADER_BYTES + length - 1] ^= 0x40  # last byte of the code
    (folder / "bad.bin").write_bytes(damaged)
    assert_refused(wse("info", "bad.bin", cwd=folder), folder, user_error,
                   "bad.bin: section CODE", "CRC32 mismatch")
    assert_refused(wse(*run_args("bad.bin"), cwd=folder), folder, user_error,
                   "bad.bin: section CODE", "CRC32 mismatch")


@pytest.mark.parametrize("content, fragment", [
    (b"", "truncated header"),
    (b"import numpy as np\n" * 4, "not a wse-emu program.bin"),
    (b"\x93NUMPY" + b"\0" * 64, "not a wse-emu program.bin"),
])
def test_files_that_are_not_programs(folder, cli, user_error, content, fragment):
    (folder / "bad.bin").write_bytes(content)
    assert_refused(cli(*run_args("bad.bin"), cwd=folder), folder, user_error, "bad.bin", fragment)


def test_missing_binary(folder, wse, user_error):
    assert_refused(wse(*run_args("nope.bin"), cwd=folder), folder, user_error,
                   "nope.bin", "No such file", present=["x.npy"])

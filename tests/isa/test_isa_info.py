"""wse-emu info: the summary text and the SRAM / color requirements."""

from pathlib import Path

import numpy as np

from wse_emu.isa.asm import assemble, assemble_file
from wse_emu.isa.info import REGION_ROWS, describe, program_colors, region_sram_bytes

GEMV = Path(__file__).parent / "data" / "gemv.wsa"


def _gemv(tmp_path):
    np.save(tmp_path / "W.npy", np.zeros((512, 512), dtype=np.float32))
    return assemble_file(str(GEMV), data_files={"W": str(tmp_path / "W.npy")})


def test_region_sram_bytes_counts_code_allocs_data_and_pieces(tmp_path):
    p = _gemv(tmp_path)
    # 12 instructions (96 B), then W tile 64*64*4, x 64*4, y 64*4
    assert region_sram_bytes(p, "grid") == 96 + 16384 + 256 + 256
    assert region_sram_bytes(p, p.regions[0]) == region_sram_bytes(p, "grid")
    src = """.region a, 0, 0, 1, 1
    .init 4000, f32, 1, 2, 3
    halt
.endregion
.region b, 1, 0, 1, 1
    .alloc big, 100, at=800
    nop
    halt
.endregion
"""
    two = assemble(src)
    assert region_sram_bytes(two, "a") == 4012 and region_sram_bytes(two, "b") == 900


def test_colors_count_routes_and_instruction_operands():
    src = ".route 0, 0, 1, 1, 2, rx=RAMP, tx=RAMP\n.region r, 0, 0, 1, 1\n"
    assert program_colors(assemble(src + "    halt\n.endregion\n")) == 3
    assert program_colors(assemble(src + "    dfin d0, f32, 7, 4\n    halt\n.endregion\n")) == 8


def test_describe(tmp_path):
    text = describe(_gemv(tmp_path))
    lines = text.splitlines()
    assert lines[0] == ("program 'gemv': 1 region(s), 64 PEs used, bounding box 8 x 8, "
                        "3 color(s), 11 route rule(s)")
    assert "params: M=512, K=512, P=8, Q=8, DT=f32" in text
    grid = next(line for line in lines if line.strip().startswith("grid"))
    assert grid.split() == ["grid", "(0,", "0,", "8", "x", "8)", "64", "12", "16,992"]
    w = next(line for line in lines if line.strip().startswith("W "))
    assert "(512, 512)" in w and "<f4" in w and "inline" in w and "1,048,576" in w
    assert any(line.split()[:4] == ["x", "input", "f32", "(512,)"] for line in lines)
    assert any(line.split()[:4] == ["y", "output", "f32", "(512,)"] for line in lines)


def test_describe_external_tensors_and_meta():
    src = """.tensor E, [4, 4], safetensors="m.safetensors", key="w", dtype=bf16
.meta source = "hf"
.region r, 0, 0, 1, 1
    .alloc b, 32
    .load E, b, bf16, tile=(4, 4)
    halt
.endregion
"""
    text = describe(assemble(src))
    assert "external m.safetensors:w" in text and "bf16" in text and "32" in text
    assert "meta: source='hf'" in text and "1 tensor load(s), 0 inline" in text


def test_long_metadata_is_summarised_on_one_line():
    from wse_emu.isa.info import _brief

    meta = {"dtype": "bf16", "stages": [{"name": f"s{i}"} for i in range(227)], "shape": [2, 3]}
    assert _brief(meta) == "{dtype='bf16', shape=[2, 3], stages=[227 entries]}"


def test_describe_counts_the_regions_past_its_limit():
    """A program with a region per column (32 here) lists the first REGION_ROWS, then one line
    for the rest; max_regions=None lists them all."""
    src = "".join(f".region c{i}, {i}, 0, 1, {1 + i % 3}\n    halt\n.endregion\n" for i in range(32))
    program = assemble(src)
    short, full = describe(program).splitlines(), describe(program, None).splitlines()
    names = [line.split()[0] for line in short if line.startswith("  c")]
    assert names == [f"c{i}" for i in range(REGION_ROWS)]
    rest = range(REGION_ROWS, 32)
    pes = sum(1 + i % 3 for i in rest)
    assert f"  ... {len(rest)} more region(s), {pes} PEs (--all lists every region)" in short
    assert [line.split()[0] for line in full if line.startswith("  c")] == \
        [f"c{i}" for i in range(32)]
    assert not any("more region(s)" in line for line in full)
    assert short[0] == full[0]  # the header counts all 32 either way
    total = sum(1 + i % 3 for i in range(32))
    assert short[0].startswith(f"program 'program': 32 region(s), {total} PEs used")


def test_the_cli_help_names_the_region_limit():
    """`wse-emu info --help` states the limit as a literal (the CLI does not import isa.info
    for --help): it must be REGION_ROWS."""
    from click.testing import CliRunner

    from wse_emu.apps.cli import main
    out = CliRunner().invoke(main, ["info", "--help"]).output
    assert f"first {REGION_ROWS}," in " ".join(out.split())

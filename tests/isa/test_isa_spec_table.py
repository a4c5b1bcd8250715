"""The ISA table checks itself, and docs/ISA.md is what the table says."""

import dataclasses

import pytest

from wse_emu.isa import docgen, spec


def test_table_is_consistent():
    spec.check_table()


def _mutated(index: int, **changes) -> tuple:
    table = list(spec.INSTRUCTIONS)
    table[index] = dataclasses.replace(table[index], **changes)
    return tuple(table)


def _index(mnemonic: str) -> int:
    return next(i for i, ins in enumerate(spec.INSTRUCTIONS) if ins.mnemonic == mnemonic)


@pytest.mark.parametrize("mnemonic, changes, message", [
    ("halt", {"opcode": 0x00}, "already used by 'nop'"),
    ("halt", {"opcode": 0x100}, "does not fit"),
    ("add", {"operands": (("d", "iregw", "A"), ("a", "ireg", "A"), ("b", "ireg", "C"))},
     "overlaps bits"),
    ("dmem", {"operands": (("d", "dreg", "A"), ("t", "dtype", "B"), ("addr", "u16", "IL"),
                           ("len", "imm", "I"))}, "overlaps bits"),
    ("add", {"doc": ""}, "needs a one-line doc"),
    ("add", {"operands": (("d", "iregw", "Q"), ("a", "ireg", "B"), ("b", "ireg", "C"))},
     "unknown slot"),
    ("li", {"operands": (("d", "iregw", "A"), ("v", "imm", "B"))}, "cannot sit in slot B"),
    ("add", {"operands": (("d", "iregx", "A"),)}, "unknown operand kind"),
    ("add", {"cost": "cheap"}, "unknown cost class"),
    ("vadd", {"cost": "scalar"}, "tensor cost class"),
    ("add", {"mnemonic": "Add"}, "lower-case identifier"),
    ("add", {"roles": ("reg-w", "reg-r")}, "every operand needs a role"),
    ("add", {"roles": ("reg-w", "reg-r", "read")}, "unknown role 'read'"),
    ("add", {"roles": ("reg-r", "reg-r", "reg-r")}, "iregw operand cannot have role 'reg-r'"),
    ("li", {"roles": ("reg-w", "reg-r")}, "imm operand cannot have role"),
    ("dlen", {"roles": ("dsd-w", "reg-r")}, "reach data through a descriptor"),
    ("vadd", {"roles": ("dsd-w", "dsd-w", "dsd-r")}, "at most one destination"),
])
def test_broken_tables_are_refused(mnemonic, changes, message):
    with pytest.raises(spec.SpecError, match=message):
        spec.check_table(_mutated(_index(mnemonic), **changes))


def test_duplicate_mnemonic_is_refused():
    table = spec.INSTRUCTIONS + (dataclasses.replace(spec.INSTRUCTIONS[0], opcode=0xFE),)
    with pytest.raises(spec.SpecError, match="defined twice"):
        spec.check_table(table)


def test_isa_md_is_current():
    assert docgen.ISA_MD.read_text() == docgen.render_isa_md(), \
        "docs/ISA.md is stale: run python -m wse_emu.isa.docgen"


def test_isa_md_documents_every_instruction():
    text = docgen.render_isa_md()
    assert text.splitlines()[0] == docgen.HEADER
    for ins in spec.INSTRUCTIONS:
        assert f"| 0x{ins.opcode:02x} | `{ins.cost}` |" in text, ins.mnemonic
        assert ins.doc.replace("|", "\\|") in text


def test_docgen_check_mode(tmp_path, monkeypatch):
    stale = tmp_path / "ISA.md"
    stale.write_text("old\n")
    monkeypatch.setattr(docgen, "ISA_MD", stale)
    assert docgen.main(["--check"]) == 1
    assert docgen.main([]) == 0
    assert docgen.main(["--check"]) == 0
    assert stale.read_text() == docgen.render_isa_md()


def test_roles_give_destinations_sources_and_shapes():
    by = spec.BY_MNEMONIC
    assert (by["vadd"].destination, by["vadd"].sources) == (0, (1, 2))
    assert (by["rdot"].destination, by["rdot"].sources) == (-1, (1, 2))  # writes a register
    assert (by["vfma"].destination, by["vfma"].sources) == (0, (1,))  # d is read and written
    assert (by["dmast"].destination, by["dmast"].sources) == (-1, (0,))
    assert [by[m].shape for m in ("vexp", "vsub", "vmuls", "vfill", "vfma", "rsum")] == \
        ["unary", "binary", "scalar", None, None, None]
    assert [by[m].kernel for m in ("vexp", "vsub", "vmuls", "vfill")] == \
        ["exp", "sub", "mul", None]
    for ins in spec.INSTRUCTIONS:  # every register an instruction writes is marked so
        for (_name, kind, _slot), role in zip(ins.operands, ins.roles):
            assert (kind == "iregw") == (role.startswith("reg-") and kind.startswith("ireg")
                                         and role != "reg-r"), ins.mnemonic

"""The exceptions the ISA tool chain raises; every message is one line meant for the user."""

from __future__ import annotations


class AsmError(Exception):
    """An error in assembly source: str(e) == "FILE:LINE:COL: message" (line and col 1-based)."""

    def __init__(self, message: str, file: str, line: int, col: int):
        super().__init__(f"{file}:{line}:{col}: {message}")
        self.message = message
        self.file = file
        self.line = line
        self.col = col


class FormatError(Exception):
    """A program.bin (or Program) that cannot be used; the message names section, region, offset.

    `subject` optionally names the offending part of a Program for tools that can point at its
    source: ("region", i), ("instr", i, j), ("label", i, k), ("alloc", i, k), ("route", i),
    ("tensor", i), ("data", i), ("symbol", i), ("piece", i, k), ("param", i), ("meta",).
    """

    def __init__(self, message: str, subject: tuple | None = None):
        super().__init__(message)
        self.subject = subject


class EncodingError(FormatError):
    """An instruction word that cannot be encoded or decoded."""


class BuildError(Exception):
    """A ProgramBuilder call or build() that cannot succeed.

    `loc` is the (file, line, col) the caller attached to the offending call, or None; the
    assembler turns it into an AsmError.
    """

    def __init__(self, message: str, loc: tuple[str, int, int] | None = None):
        super().__init__(f"{loc[0]}:{loc[1]}:{loc[2]}: {message}" if loc else message)
        self.message = message
        self.loc = loc

"""Shared helpers for the example programs' tests: assemble a program folder's .wsa."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wse_emu.isa.asm import assemble

HERE = Path(__file__).resolve().parent


def build(name: str, data: dict[str, np.ndarray] | None = None, **params):
    """Assemble programs/NAME/NAME.wsa with -D params and resident --data arrays."""
    source = HERE / name / f"{name}.wsa"
    defines = {k: str(v) for k, v in params.items()}
    return assemble(source.read_text(), str(source), defines, data or {})


def same_run(a, b) -> None:
    """The Numba core and the reference interpreter agree on bits and cycles."""
    ra, rb = a.result, b.result
    assert ra.outcome == rb.outcome
    assert ra.cycles == rb.cycles
    for field in ("pc", "status", "clock", "instructions", "busy", "recv_stall", "bp_stall",
                  "class_counts", "link_wavelets"):
        np.testing.assert_array_equal(getattr(ra, field), getattr(rb, field), err_msg=field)
    assert (ra.messages, ra.wavelets, ra.wavelet_hops) == (rb.messages, rb.wavelets,
                                                            rb.wavelet_hops)
    assert a.loaded.sram.tobytes() == b.loaded.sram.tobytes()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)

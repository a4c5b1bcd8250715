"""One call from a Program to numbers and cycles: load, scatter inputs, run, gather outputs.

Used by the CLI, the tests, the benchmarks and the demo, so that all of them run programs the
same way. `engine` picks the Numba core ("core", the default) or the pure-Python reference
interpreter ("reference").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wse_emu.emulator.load import Loaded, load, read_output, write_inputs
from wse_emu.isa.machine import Machine, load_machine
from wse_emu.emulator.result import RunResult
from wse_emu.isa.program import Program


@dataclass
class Execution:
    loaded: Loaded
    result: RunResult
    outputs: dict[str, np.ndarray]


def engine_run(engine: str):
    """The run function of an engine: "core" (Numba) or "reference" (pure Python)."""
    if engine == "reference":
        from wse_emu.emulator.reference import run
    elif engine == "core":
        from wse_emu.emulator.core import run
    else:
        raise ValueError(f"unknown engine {engine!r} (core, reference)")
    return run


def execute(program: Program, machine: Machine | str = "wse3",
            inputs: dict[str, np.ndarray] | None = None, base_dir: str | None = None,
            engine: str = "core", max_cycles: int | None = None, trace: bool = False,
            progress=None, timing_only: bool = False) -> Execution:
    """Load, scatter inputs, run, gather outputs. timing_only: no SRAM contents (the same
    cycles; outputs is then empty)."""
    if isinstance(machine, str):
        machine = load_machine(machine)
    loaded = load(program, machine, base_dir=base_dir, with_data=not timing_only)
    write_inputs(loaded, inputs or {})
    result = engine_run(engine)(loaded, max_cycles=max_cycles, trace=trace, progress=progress)
    outputs = {} if timing_only else {s.name: read_output(loaded, s.name)
                                      for s in program.symbols if s.kind == "output"}
    return Execution(loaded, result, outputs)

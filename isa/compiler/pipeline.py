"""The compiler pipeline: a model (HF folder or *.graph.json) -> a mesh Program and a report.

One straight function; each step is a pass with a one-line comment, and `dump` names the
passes after which the state is printed (to `dump_to`, stderr by default):

    graph      the bound layer graph (isa.graph.format_graph)
    stages     the stage chain and the flows between stages (lower)
    placement  every stage's rectangle and tiling (place)
    routes     every flow's color and the route rule count (route)
"""

from __future__ import annotations

from dataclasses import replace

import sys
from pathlib import Path

from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.compiler.codegen import Codegen
from wse_emu.isa.compiler.lower import CompileError, Plan, lower
from wse_emu.isa.compiler.pack import CompileReport, Weights, declare_symbols, pack
from wse_emu.isa.compiler.placement import DoesNotFit, Placed, place
from wse_emu.isa.compiler.routing import route
from wse_emu.isa.errors import BuildError
from wse_emu.isa.machine import Machine
from wse_emu.isa.graph import Graph, GraphError, bind_positions, format_graph, from_json, verify
from wse_emu.isa.spec import FLOAT_ALIASES

DTYPE_NAMES = FLOAT_ALIASES  # every accepted spelling -> the dtype name (isa/spec.py's table)
DUMPS = ("graph", "stages", "placement", "routes")


def model_source(source) -> Path:
    """The model a user names: an HF folder, its config.json (taken as the folder, as `bench`
    does) or a *.graph.json. CompileError for any other file (a model.safetensors, say)."""
    path = Path(source)
    if path.is_file() and path.name == "config.json":
        return path.parent
    if path.is_file() and not path.name.endswith(".json"):
        raise CompileError(f"{path}: give the model's folder (the one holding config.json and "
                           f"model.safetensors) or a *.graph.json, not this file")
    return path


def load_graph(source, shape_only: bool = False, max_context: int | None = None) -> Graph:
    """The layer graph of an HF model folder (or its config.json) or a *.graph.json file."""
    path = model_source(source)
    if path.is_dir():
        from wse_emu.isa.frontends.hf import FrontendError, load_hf
        try:
            return load_hf(path, shape_only=shape_only, max_context=max_context)
        except FrontendError as e:
            raise CompileError(str(e)) from None
    try:
        graph = from_json(path.read_text())
    except FileNotFoundError:
        raise CompileError(f"{path}: no such file or folder (expected an HF model folder or "
                           f"a *.graph.json)") from None
    except GraphError as e:
        raise CompileError(f"{path}: {e}") from None
    except (UnicodeDecodeError, IsADirectoryError):
        raise CompileError(f"{path}: not a *.graph.json (expected an HF model folder or a "
                           f"*.graph.json)") from None
    return graph


def compile_model(source, machine, dtype: str = "f32", max_context: int | None = None,
                  shape_only: bool = False, positions: int | None = None,
                  dump: tuple[str, ...] = (), dump_to=None, base_dir: str | None = None,
                  grid=None, mapping: str | None = None,
                  sequences: int = 1, prefill: bool = False) -> tuple:
    """Compile `source` for `machine` (an isa.machine.Machine: a preset, a .toml file or a
    system NAMExN of either). Returns (Program, CompileReport); CompileError (one
    line) when the model cannot be mapped or does not fit.

    positions = T, the positions one run processes: default 1 for decoders (one decode step
    a run, the KV cache kept in SRAM between runs) and max_context for encoders (bidirectional
    attention needs the whole sequence in one run). Weight tensors are referenced relative to
    `base_dir` (the folder the program.bin will be written to) when given. `grid` fixes the
    grid of a decoder's layers: a side n (n x n), "RxC" or (R, C) rows x columns (default: the
    cost model's choice).
    `mapping`: "wafer" (decode steps of GPT-2 and Llama: layers on grids, isa/compiler/wafer.py)
    or "chain" (the stage chain: encoders, several positions a run, small machines); default
    the wafer mapping where it applies and fits, else the stage chain. `sequences` = B: B
    independent sequences in flight (B KV caches a layer, a run takes one token of each: on
    the wafer mapping the layers' regions pipeline them, on an HBM target the step is
    batched, every weight read once for the B tokens). prefill=True: the B are consecutive
    positions of one sequence with one KV cache (a prefill program: a run takes B prompt
    tokens, pipelined through the layers' regions on a wafer, batched on a GPU)."""
    if not isinstance(machine, Machine):
        raise CompileError(f"machine must be an isa.machine.Machine (isa.machine.load_machine), "
                           f"got {machine!r}")
    if dtype not in DTYPE_NAMES:
        raise CompileError(f"dtype {dtype!r} is not supported (fp32, fp16, bf16)")
    dtype = DTYPE_NAMES[dtype]
    hbm_target = machine.kind == "hbm"  # weights streamed from HBM
    if isinstance(sequences, bool) or not isinstance(sequences, int) or sequences < 1:
        raise CompileError(f"sequences must be a positive integer, got {sequences!r}")
    what = f"--prefill {sequences}" if prefill else f"--sequences {sequences}"
    if sequences > 1 and (mapping == "chain" or (positions or 1) != 1):
        raise CompileError(f"{what} needs the wafer mapping of a decode step "
                           f"(one position a run)")
    if prefill and sequences < 2:
        raise CompileError(f"a prefill program takes 2 or more positions a run, got "
                           f"{sequences}")
    unknown = [d for d in dump if d not in DUMPS]
    if unknown:
        raise CompileError(f"cannot dump {unknown[0]!r} (passes: {', '.join(DUMPS)})")
    out = dump_to or sys.stderr
    graph = load_graph(source, shape_only, max_context)
    if max_context is not None and graph.config.max_context != max_context:
        raise CompileError(f"{source}: a graph.json fixes max_context "
                           f"{graph.config.max_context}; recompile the graph to change it")
    # bind: T positions a run (decode: 1, prefill feeds the prompt token by token)
    if positions is None:
        decoder = any(n.name == "logits" for n in graph.outputs)
        positions = 1 if decoder else graph.config.max_context
    if not isinstance(positions, int) or not 1 <= positions <= graph.config.max_context:
        raise CompileError(f"positions must be 1..max_context ({graph.config.max_context}), "
                           f"got {positions!r}")
    graph = bind_positions(graph, positions)
    if "graph" in dump:
        print(format_graph(graph), file=out)
    # lower: layer graph -> chain of stages and the flows between them
    plan = lower(graph)
    verify(plan.graph)
    if "stages" in dump:
        print(format_stages(plan), file=out)
    if hbm_target:
        # one kernel over every core, weights streamed from HBM (isa/compiler/hbm.py)
        from wse_emu.isa.compiler.hbm import compile_hbm, format_hbm
        name = Path(str(source)).name.replace(".graph.json", "") or "model"
        program, report = compile_hbm(plan, machine, dtype, shape_only, base_dir, name,
                                      sequences=sequences, prefill=prefill)
        if program.model is not None and program.model.shape_only != shape_only:
            program = replace(program, model=replace(program.model, shape_only=shape_only))
        if "placement" in dump:
            print(format_hbm(program, report), file=out)
        if "routes" in dump:
            print(f"{len(program.routes)} route rules (the grid barrier)", file=out)
        return program, report
    if mapping not in (None, "wafer", "chain"):
        raise CompileError(f"mapping must be 'wafer' or 'chain', got {mapping!r}")
    if mapping == "chain":
        return _stage_chain(plan, machine, dtype, shape_only, base_dir, source, dump, out)
    if positions == 1:
        # the wafer-wide decode mapping (isa/compiler/wafer.py); other graphs: the stage chain
        from wse_emu.isa.compiler.decoder import NotADecoder
        from wse_emu.isa.compiler.wafer import compile_decode
        name = Path(str(source)).name.replace(".graph.json", "") or "model"
        try:
            return compile_decode(plan, machine, dtype, shape_only, base_dir, name, dump, out,
                                  grid, sequences, prefill)
        except NotADecoder as e:
            if mapping == "wafer" or sequences > 1:
                raise CompileError(f"the wafer mapping does not apply: {e}") from None
            wafer_error = None
        except CompileError as e:  # does not fit: the stage chain may (a small machine)
            if grid is not None or mapping == "wafer" or machine.chips > 1 or sequences > 1:
                raise  # the stage chain knows no systems: a split is the wafer mapping's
            wafer_error = e
        try:
            return _stage_chain(plan, machine, dtype, shape_only, base_dir, source, dump, out)
        except CompileError:
            if wafer_error is not None:
                raise wafer_error from None
            raise
    return _stage_chain(plan, machine, dtype, shape_only, base_dir, source, dump, out)


def _stage_chain(plan, machine, dtype, shape_only, base_dir, source, dump, out):
    """The stage-chain mapping (encoders, several positions a run, small machines)."""
    # placement: a rectangle and a tiling per stage, checked against SRAM and the fabric
    placed = place_fastest(plan, machine, dtype, pad_last=shape_only)
    if "placement" in dump:
        print(format_placement(plan, placed), file=out)
    # routing: multicast trees and chains, colors allocated without conflicts
    rules, own = route(plan, placed, machine)
    if "routes" in dump:
        print(f"{len(rules)} route rules; flow colors: " +
              ", ".join(f"{f.what}={f.color}" for f in plan.flows), file=out)
    # codegen: per-stage code, buffers and weight loads through isa.builder
    pb = ProgramBuilder(Path(str(source)).name.replace(".graph.json", "") or "model")
    declare_symbols(pb, plan)
    for r in rules:
        pb.route(r.rect.x, r.rect.y, r.rect.w, r.rect.h, r.color, r.rx, r.tx)
    Codegen(pb, plan, placed, own, Weights(pb, base_dir), dtype, shape_only).run()
    # pack: symbols, tensors by reference, metadata, and the report
    try:
        return pack(pb, plan, placed, machine, dtype, pb.name, shape_only)
    except BuildError as e:
        raise CompileError(f"internal: the generated program is invalid: {e}") from None


# Cycles a PE of a gemv's reduction or gather chain adds to a token (its hop, its ramps, the
# streaming op's start, the slices it drops from the input multicast): fitted to timing-only
# runs of GPT-2 small, medium and XL on wse3, where it picks the fastest of the tile caps
# 512 .. 32768 (bench/README.md has the measurements).
CHAIN_CYCLES = 60


def place_fastest(plan: Plan, machine, dtype: str, pad_last: bool) -> list[Placed]:
    """The placement whose gemv stages are estimated fastest, over tile caps from where the
    weights would fill the whole fabric up to tiles as large as SRAM holds. Smaller tiles mean
    less `mv` time per PE but longer reduction and gather chains (more PEs a stage), so the
    estimate of a token is, summed over the gemv stages in series: tile elements / the FMAC
    width of the weight dtype, plus CHAIN_CYCLES for every PE along the stage's rows and
    columns (P + Q)."""
    weights = sum(m.out * s.in_len for s in plan.stages for m in s.matrices)
    width = machine.simd_width("fmac_f32" if dtype == "f32" else "fmac_mixed")
    cap = 256
    while cap * machine.width * machine.height < weights:
        cap *= 2
    best, best_cost = None, None
    while cap < machine.sram_bytes:
        try:
            placed = place(plan, machine, dtype, pad_last, max_tile=cap)
        except DoesNotFit:
            cap *= 2
            continue
        gemvs = [p for s, p in zip(plan.stages, placed) if s.kind == "gemv"]
        cost = sum(p.tr * p.tc / width + CHAIN_CYCLES * (p.P + p.Q) for p in gemvs)
        if best_cost is not None and cost >= best_cost:
            break  # the estimate is convex in the cap: past its minimum it only grows
        best, best_cost = placed, cost
        cap *= 2
    return best if best is not None else place(plan, machine, dtype, pad_last)


def format_stages(plan: Plan) -> str:
    lines = [f"{len(plan.stages)} stages, {len(plan.flows)} flows"]
    for s in plan.stages:
        extra = ""
        if s.kind == "gemv":
            extra = (f" {s.out_len} x {s.in_len} [{', '.join(m.weight for m in s.matrices)}]"
                     f"{' prologue ' + s.prologue if s.prologue else ''}"
                     f"{' act ' + s.activation if s.activation else ''}")
        elif s.kind == "vector":
            extra = " " + "; ".join(f"{op[1]} = {op[0]}({', '.join(op[2])})" for op in s.ops)
        lines.append(f"  #{s.id} {s.kind:<6} {s.name}{extra}")
    for f in plan.flows:
        lines.append(f"  flow {f.id}: #{f.src} -> #{f.dst}, {f.length} elements ({f.what})")
    return "\n".join(lines)


def format_placement(plan: Plan, placed: list[Placed]) -> str:
    lines = []
    for s, p in zip(plan.stages, placed):
        r = p.rect
        tile = f" tile {p.tr} x {p.tc}" if p.tr else ""
        lines.append(f"  #{s.id} {s.name:<30} at ({r.x}, {r.y}) {r.w} x {r.h}{tile} "
                     f"~{p.sram} B/PE")
    return "\n".join(lines)


__all__ = ["compile_model", "load_graph", "CompileError", "CompileReport"]

"""Packing: the program's tensors (safetensors references), symbols, metadata and report.

Weights are never copied: every WeightRef becomes a Program Tensor naming its safetensors file
(relative to the output folder when it can be) and key with its stored shape; tile maps pick
the slices. Host symbols are named as in transformers: `input_ids`, `position_ids` (inputs,
one position per run), `logits` / `last_hidden_state` (outputs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from wse_emu.isa.builder import ProgramBuilder
from wse_emu.isa.compiler.lower import CompileError, Plan
from wse_emu.isa.compiler.placement import Placed
from wse_emu.isa.graph import WeightRef
from dataclasses import replace

from wse_emu.isa.binfmt import check_program
from wse_emu.isa.errors import FormatError
from wse_emu.isa.program import ModelInfo, ModelPart, Program
from wse_emu.isa.tensors import safetensors_index

_ST_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


class Weights:
    """Program tensors for WeightRefs: one per (file, key), declared on first use."""

    def __init__(self, pb: ProgramBuilder, base_dir: str | None):
        self.pb = pb
        self.base_dir = Path(base_dir).resolve() if base_dir else None
        self.names: dict[tuple[str, str], str] = {}
        self.headers: dict[str, dict] = {}

    def tensor(self, ref: WeightRef) -> str:
        key = (ref.file, ref.key)
        if key in self.names:
            return self.names[key]
        if ref.file not in self.headers:
            self.headers[ref.file] = safetensors_index(Path(ref.file))[0]
        info = self.headers[ref.file][ref.key]
        name = f"w{len(self.names)}"
        file = ref.file
        if self.base_dir is not None:
            try:
                file = str(Path(ref.file).resolve().relative_to(self.base_dir))
            except ValueError:
                pass
        self.pb.tensor(name, file=file, key=ref.key, shape=tuple(info["shape"]),
                       dtype=_ST_DTYPES[info["dtype"]])
        self.names[key] = name
        return name


@dataclass
class CompileReport:
    """What the compiler did, for people: PEs, SRAM, colors, where each layer sits."""

    model: str
    machine: str
    dtype: str
    max_context: int
    fabric: tuple[int, int]  # the box the program uses (w, h)
    pes: int
    sram_max: int
    sram_mean: float
    colors: int
    stages: list = field(default_factory=list)  # dicts: name, kind, layer, rect, pes, sram
    target: str = "mesh"  # "mesh" (weights resident in SRAM) | "hbm" (streamed from HBM)
    hbm_bytes: int = 0  # HBM the program declares (weights, KV caches, activations)
    weight_hbm_bytes: int = 0  # of which weight matrices, read once a token
    predicted: dict = field(default_factory=dict)  # part ("embed", "layer i", "head") -> cycles
    grid: int | str = 0  # the wafer mapping's grid: side n (n x n PEs) or "RxC"; 0: stage chain
    # a model split over a system's wafers: per wafer {chip, rows, layers [first, last],
    # predicted_cycles (its layers, the embedding or the crossing into it, the head)}
    wafers: list = field(default_factory=list)
    sequences: int = 1  # independent sequences in flight (B KV caches, B tokens a step)
    prefill: bool = False  # the B are consecutive positions of one sequence (one KV cache)
    # the predicted cycles of a step of all B sequences (isa.program.pipelined_cycles)
    step_cycles: int = 0
    score_passes: int = 1  # the wafer mapping's attention scores, in passes of a few heads
    column_classes: bool = False  # the wafer mapping's heavy and light columns (no head pad)

    def layers(self) -> dict:
        """Per layer: the rectangles (x, y, w, h) of its stages."""
        out: dict[str, list] = {}
        for s in self.stages:
            out.setdefault(str(s["layer"]), []).append(s["rect"])
        return out

    def to_json(self) -> dict:
        return dict(self.__dict__, fabric=list(self.fabric))

    @property
    def grid_text(self) -> str:
        """The grid as people read it: "R x C"."""
        g = str(self.grid)
        return g.replace("x", " x ") if "x" in g else f"{g} x {g}"

    def __str__(self) -> str:
        lines = [f"{self.model}: {self.pes} PEs in a {self.fabric[0]} x {self.fabric[1]} box of "
                 f"machine '{self.machine}', {self.colors} colors, weights {self.dtype}, "
                 f"max_context {self.max_context}",
                 f"SRAM per PE: max {self.sram_max} bytes, mean {self.sram_mean:.0f} bytes"]
        if self.target == "hbm":
            lines[0] = (f"{self.model}: one kernel on all {self.pes} cores of machine "
                        f"'{self.machine}' (weights streamed from HBM), weights {self.dtype}, "
                        f"max_context {self.max_context}")
            lines.append(f"HBM: {self.hbm_bytes / 1e9:.3f} GB declared, of which weight "
                         f"matrices {self.weight_hbm_bytes / 1e9:.3f} GB (read once a token)")
            if self.sequences > 1:
                lines[-1] = lines[-1].replace("once a token", f"once a step of {self.sequences} "
                                              + ("prompt positions, one KV cache, batched"
                                                 if self.prefill else
                                                 "sequences, a KV cache each, batched"))
        if self.predicted:
            total = sum(self.predicted.values())
            if self.sequences > 1 and self.prefill:
                lines.append(f"prefill: {self.sequences} consecutive prompt positions a run "
                             f"(one KV cache, the regions pipelining them): predicted "
                             f"{self.step_cycles} cycles a run")
            elif self.sequences > 1:
                lines.append(f"sequences in flight: {self.sequences} (a KV cache each; a step "
                             f"takes one token of each, the regions pipelining them): "
                             f"predicted {self.step_cycles} cycles a step")
            lines.append(f"predicted cycles a decode step"
                         + (" of one sequence" if self.sequences > 1 else "") + f": {total} "
                         + (f"(layers on {self.grid_text} grids"
                            + (", two column classes" if self.column_classes else "")
                            + (f", the attention's scores in {self.score_passes} passes"
                               if self.score_passes > 1 else "") + ") " if self.grid else "")
                         + "; by part: " + ", ".join(f"{k} {v}"
                                                     for k, v in self.predicted.items()))
        for w in self.wafers:
            c, (lo, hi) = w["chip"], w["layers"]
            cross = self.predicted.get(f"crossing {c - 1}-{c}", 0)
            lines.append(f"wafer {c} (rows {w['rows'][0]}..{w['rows'][1] - 1}): layers {lo}..{hi}"
                         + (" and the embedding" if c == 0 else "")
                         + (" and the head" if c == len(self.wafers) - 1 else "")
                         + f", predicted {w['predicted_cycles']} cycles"
                         + (f" (of which the crossing in {cross})" if c else ""))
        lines.append(f"{'stage':<34} {'kind':<7} {'at (x, y)':<12} {'w x h':<9} {'PEs':>6} "
                     f"{'SRAM/PE':>8}")
        for s in self.stages:
            x, y, w, h = s["rect"]
            lines.append(f"{s['name'][:34]:<34} {s['kind']:<7} {f'({x}, {y})':<12} "
                         f"{f'{w} x {h}':<9} {w * h:>6} {s['sram']:>8}")
        return "\n".join(lines)


def part_name(layer: int, layers: int) -> str:
    return "embed" if layer < 0 else "head" if layer >= layers else f"layer {layer}"


def with_model(program: Program, cfg, target: str, mapping: str, machine, dtype: str,
               positions: int, parts: list, shape_only: bool = False, groups=(),
               crossings=(), sequences: int = 1, prefill: bool = False) -> Program:
    """The program with its MODEL part (isa.program.ModelInfo): parts is [(name, layer,
    [region names], predicted cycles)]; groups [(first layer, layers)] a wafer of a split
    model and crossings the predicted cycles of each boundary; checked as loads() checks it."""
    model = ModelInfo(cfg.family, target, mapping, machine.name, dtype, cfg.layers, cfg.hidden,
                      cfg.vocab, cfg.max_context, positions,
                      tuple(ModelPart(n, layer, tuple(regions), int(cycles))
                            for n, layer, regions, cycles in parts),
                      shape_only=bool(shape_only), chips=machine.chips,
                      groups=tuple((int(a), int(b)) for a, b in groups),
                      crossing_cycles=tuple(int(c) for c in crossings),
                      sequences=int(sequences), prefill=bool(prefill))
    program = replace(program, model=model)
    try:
        check_program(program)
    except FormatError as e:
        raise CompileError(f"internal: the model description is invalid: {e}") from None
    return program


def declare_symbols(pb: ProgramBuilder, plan: Plan) -> None:
    for name, shape in plan.symbols.items():
        if name in ("input_ids", "position_ids"):
            pb.input(name, "i32", shape)
        else:
            pb.output(name, "f32", shape)


def pack(pb: ProgramBuilder, plan: Plan, placed: list[Placed], machine, dtype: str,
         model: str, shape_only: bool = False) -> tuple[Program, CompileReport]:
    """Build the Program and its report."""
    cfg = plan.graph.config
    stages = [dict(name=s.name, kind=s.kind, layer=s.layer, rect=(p.rect.x, p.rect.y, p.rect.w,
                                                                  p.rect.h))
              for s, p in zip(plan.stages, placed)]
    pb.meta("compiler", {"family": cfg.family, "machine": machine.name, "dtype": dtype,
                         "max_context": cfg.max_context,
                         "vocab": cfg.vocab, "hidden": cfg.hidden, "layers": cfg.layers,
                         "stages": [dict(s, rect=list(s["rect"])) for s in stages]})
    program = pb.build()
    by_layer: dict = {}
    for r in program.regions:  # region names are "s<stage id>.<stage name>..."
        layer = plan.stages[int(r.name[1:].split(".", 1)[0])].layer
        by_layer.setdefault(layer, []).append(r.name)
    program = with_model(program, cfg, "mesh", "chain", machine, dtype, plan.T,
                         [(part_name(k, cfg.layers), k, v, 0) for k, v in sorted(by_layer.items())],
                         shape_only=shape_only)
    sram_of = dict(zip((r.name for r in program.regions), program.regions_sram_bytes()))
    worst = max(program.regions, key=lambda r: sram_of[r.name])
    if sram_of[worst.name] > machine.sram_bytes:  # placement estimates code size: check it
        raise CompileError(f"region '{worst.name}' needs {sram_of[worst.name]} bytes of SRAM "
                           f"per PE but machine '{machine.name}' has {machine.sram_bytes}: use "
                           f"fewer positions a run, a smaller max_context or 16-bit weights")
    per_pe = [(sram_of[r.name], r.rect.size) for r in program.regions]
    pes = sum(n for _, n in per_pe)
    by_stage: dict[int, int] = {}
    for r in program.regions:  # region names are "s<stage id>.<stage name>..."
        sid = int(r.name[1:].split(".", 1)[0])
        by_stage[sid] = max(by_stage.get(sid, 0), sram_of[r.name])
    for i, s in enumerate(stages):
        s["sram"] = by_stage.get(i, 0)
    box = program.bounding_box()
    report = CompileReport(
        model=model, machine=machine.name, dtype=dtype, max_context=cfg.max_context,
        fabric=(box.w, box.h), pes=pes, sram_max=max(b for b, _ in per_pe),
        sram_mean=sum(b * n for b, n in per_pe) / pes, colors=program.colors_used(),
        stages=stages)
    json.dumps(report.to_json())  # the report must stay JSON-able for the CLI's --json
    return program, report

"""The benchmark suite behind `wse-emu bench`: every model on every machine, batch-1 decode.

For each (model, machine) case the suite compiles the model from its config.json alone
(shape-only: no weights are needed, the cycles do not depend on their values), runs one decode
step in timing-only mode and derives what a person comparing machines asks for: tokens/s, time
per token and per layer, bytes moved from HBM and across the fabric per token, utilisation of
the SIMD units, of HBM and of the hottest fabric link, and the physics floors the time must
respect (a result under a floor is an emulator bug and is flagged). A case the machine cannot
hold (the compiler's DoesNotFit, a KV cache that does not fit a PE, weights larger than HBM)
is recorded with its one-line reason instead of stopping the suite.

How the figures are defined (the model's side is counted from the layer graph, not measured):
- FLOPs per token = 2 x (elements of every MATMUL and LM_HEAD weight matrix: each weight is
  one multiply-add at batch 1) + 4 x heads x head_dim x S per ATTENTION node (q.k and p.v over
  the S = position + 1 cached positions). Elementwise ops, norms, softmax and the embedding
  gather are not counted (under 0.1 % of the total at these sizes).
- Weight bytes per step = those matrix elements x the bytes of the compiled dtype: what a
  decode step must read once, for one sequence or a batch of B (the embedding gather reads one
  row a sequence, not counted).
- Floors, each a lower bound on the time per step that no correct emulation can beat:
  HBM machines: weight bytes / peak HBM bandwidth (every weight streamed once a step), and the
  HBM bytes the run reports / peak bandwidth; every machine: FLOPs / peak (the widest FMAC of
  the preset on every core of the machine) and the hottest link's wavelets / clock (a link
  carries one wavelet a cycle).
- Utilisation: SIMD = FLOPs / (peak x time); HBM = HBM bytes / (peak bandwidth x time); fabric
  = the hottest link's wavelets / cycles, and the mean over the links that carried traffic.
- Time per layer: on a mesh program (one region per stage) each layer's share of the token's
  critical path (critical_path below: measured from the halting clocks of its stages' PEs),
  averaged; the same shares give "where the time goes" by kind of stage. On an HBM program
  (one kernel over all cores, the stages in sequence) per-stage times are not visible in the
  run's statistics, so the table shows time per token / layers, marked "~".

Decode position: every machine of a model decodes the same position, the last one the
smallest context among its cases holds (KV cache full there), so each machine does the same
work. The step runs with `n_past` set to that position on an empty cache: timing never
depends on data values (docs/timing-model.md), so the cycles equal those of a sequence
prefilled up to it, without emulating the prefill.

Sequences (--sequences 1,2,4,...): every case runs at each B of the list. On the wafer mapping a
step carries one token of each of B independent sequences, pipelined through the layers'
regions; an HBM machine runs a batched step instead (every weight read once a step for the B
tokens; isa/compiler/hbm.py). A case that does not compile is refused with the compiler's
reason. tokens/s is
a sequence's (one token a step), the aggregate B times that, FLOPs and the SIMD floor count the
B tokens of the step. Every B of a model decodes the same position: the largest B is compiled
first (B KV caches need the most SRAM), and the position it sets holds for the smaller ones.

Time to first token (TTFT) of a prompt of position + 1 tokens. With --prefill B: from a
prefill program (compile --prefill B: a run takes B consecutive prompt positions into one KV
cache, pipelined through the layers' regions on a wafer, batched on a GPU) at the case's
context, B or the largest half of it that compiles for the machine (run_prefill); its figures
join every case of the model and machine. Without it, on the
wafer mapping only: position + 1 steps, each the measured step (the prompt fed a token a step;
a wafer-mapped step costs the same at every position). figures["ttft_method"] says which.

Systems (NAMExN: several wafers, a GPU node; docs/timing-model.md, "Systems"): peak FLOPs and
HBM bandwidth are the system's (every chip's); two more floors apply. "system links": the
bytes that crossed each pipe (a chip's port through a switch, every copy it sent; between two
neighbours point to point) (RunResult.pipe_wavelets x wavelet bytes) over the link's
bandwidth, the busiest pipe's; and on a GPU node "HBM per GPU": one GPU's weight
bytes (the compiler's tensor-parallel share, meta "weight_hbm_bytes") over one GPU's bandwidth.
"""

from __future__ import annotations

import inspect
import json
import math
import platform
import resource
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from wse_emu.isa.spec import FLOAT_ALIASES, FLOAT_BYTES

# Built-in model shapes (Hugging Face config.json contents). Llama-3-8B keeps its published
# shape with default RoPE (theta 500000): the front end does not implement the "llama3" RoPE
# frequency scaling, which changes neither shapes nor FLOPs.
BUILTIN_MODELS = {
    "gpt2-small": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768,
                   "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50257,
                   "activation_function": "gelu_new", "tie_word_embeddings": True},
    "gpt2-medium": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 1024,
                    "n_layer": 24, "n_head": 16, "n_positions": 1024, "vocab_size": 50257,
                    "activation_function": "gelu_new", "tie_word_embeddings": True},
    "gpt2-xl": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 1600,
                "n_layer": 48, "n_head": 25, "n_positions": 1024, "vocab_size": 50257,
                "activation_function": "gelu_new", "tie_word_embeddings": True},
    "llama-3-8b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                   "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
                   "rope_theta": 500000.0, "torch_dtype": "bfloat16",
                   "tie_word_embeddings": False, "hidden_act": "silu"},
}
# Llama-3-70B: Llama-3-8B's config (the same vocabulary, KV heads, RoPE and context) wider
BUILTIN_MODELS["llama-3-70b"] = dict(BUILTIN_MODELS["llama-3-8b"], hidden_size=8192,
                                     intermediate_size=28672, num_hidden_layers=80,
                                     num_attention_heads=64)
# Llama-3-70B is opt-in (--models llama-3-70b): it needs a system (4 wafers or more, 2 GPUs or
# more), and its compiles and steps take minutes of host time, too long for the default run
OPT_IN_MODELS = ("llama-3-70b",)
DEFAULT_MODELS = tuple(m for m in BUILTIN_MODELS if m not in OPT_IN_MODELS)
DEFAULT_MACHINES = ("wse3", "h100")
CONTEXT_LADDER = (1024, 256, 64, 32, 16)  # tried largest first when --max-context is not given
DTYPE_BYTES = {a: FLOAT_BYTES[n] for a, n in FLOAT_ALIASES.items()}  # every spelling -> bytes
TOKEN_ID = 1  # the token fed to the measured decode step (timing does not depend on it)
BATCH_NOTE = ("one sequence: the programs run one position of one sequence a run (input_ids "
              "is (1,)); --sequences B keeps B sequences in flight")


def sequences_note(sequences) -> str:
    bs = [sequences] if isinstance(sequences, int) else list(sequences)
    if bs == [1]:
        return BATCH_NOTE
    return (f"B = {', '.join(map(str, bs))} sequences in flight: a step carries one token of "
            f"each (pipelined through the regions on the wafer mapping, batched on an HBM "
            f"machine: every weight read once a step); tokens/s is a sequence's, "
            f"aggregate = B x that")


def parse_sequences(text) -> list[int]:
    """"1,2,4,8" (or an int, or a list of them) -> [1, 2, 4, 8]: distinct, ascending, >= 1."""
    items = [text] if isinstance(text, int) else (
        str(text).split(",") if isinstance(text, str) else list(text))
    out = set()
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        if not item.isdigit() or int(item) < 1:
            raise BenchError(f"--sequences takes positive integers separated by commas "
                             f"(1,2,4,8), got {item!r}")
        out.add(int(item))
    if not out:
        raise BenchError("--sequences: no value given (e.g. 1,2,4,8)")
    return sorted(out)


class BenchError(ValueError):
    """A bench request that cannot run (unknown model, unreadable config); one line."""


# ---------------------------------------------------------------------------------------------
# Models


@dataclass(frozen=True)
class ModelSpec:
    name: str
    folder: Path  # holds config.json (shape-only compiles need nothing else)
    builtin: bool
    shown: str = ""  # what the user gave (a built-in name, their config's path)

    def tell(self, text: str) -> str:
        """`text` with the suite's temporary folder replaced by what the user gave."""
        if self.shown and str(self.folder) in text:
            return text.replace(str(self.folder / "config.json"), self.shown) \
                .replace(str(self.folder), self.shown)
        return text


def model_specs(entries, workdir: Path) -> list[ModelSpec]:
    """Built-in names or HF config.json paths (a file or a folder holding one) -> ModelSpecs.

    Built-in configs and loose config files are written as `<name>/config.json` under
    `workdir`, because the front end reads a model folder."""
    specs: list[ModelSpec] = []
    for entry in entries:
        entry = str(entry).strip()
        if not entry:
            continue
        path = Path(entry)
        if entry in BUILTIN_MODELS and not path.exists():
            name, config, folder = entry, BUILTIN_MODELS[entry], None
        elif path.is_dir():
            if not (path / "config.json").is_file():
                raise BenchError(f"{path}: no config.json in this folder")
            name, config, folder = path.resolve().name, None, path
        elif path.is_file():
            config = _read_config(path)
            name = path.resolve().parent.name if path.name == "config.json" else path.stem
            folder = None
        else:
            raise BenchError(f"unknown model {entry!r}: built-in models are "
                             f"{', '.join(BUILTIN_MODELS)}, or pass an HF config.json (a file "
                             f"or a folder holding one)")
        taken = {s.name for s in specs}
        unique, k = name, 2
        while unique in taken:
            unique, k = f"{name}-{k}", k + 1
        shown = entry
        if folder is None:
            folder = Path(workdir) / unique
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "config.json").write_text(json.dumps(config, indent=1))
            shown = f"built-in {entry}" if entry in BUILTIN_MODELS else entry
        specs.append(ModelSpec(unique, folder, entry in BUILTIN_MODELS, shown))
    if not specs:
        raise BenchError("no models to benchmark")
    return specs


def _read_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BenchError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise BenchError(f"{path}: expected a JSON object (an HF config.json)")
    return config


@dataclass(frozen=True)
class ModelFigures:
    """What one decode step of a model must do, counted from its layer graph."""

    family: str
    layers: int
    params: int  # elements of every weight tensor
    matrix_elements: int  # elements of the MATMUL and LM_HEAD weight matrices (one read each)
    attention: tuple  # (n_heads, head_dim) per ATTENTION node

    def flops(self, position: int) -> float:
        """FLOPs of the decode step at `position` (it attends to position + 1 cache slots)."""
        seen = position + 1
        return 2.0 * self.matrix_elements + sum(4.0 * h * d * seen for h, d in self.attention)

    def weight_bytes(self, dtype: str) -> int:
        return self.matrix_elements * DTYPE_BYTES[dtype]


def model_figures(graph) -> ModelFigures:
    """FLOP and byte counts of a (bound or unbound) layer graph; see the module docstring."""
    from wse_emu.isa.graph import Op

    by_id = {n.id: n for n in graph.nodes}
    matrices: dict[int, int] = {}  # weight node id -> elements (a tied matrix counted once)
    attention = []
    params = 0
    for node in graph.nodes:
        if node.op is Op.WEIGHT:
            params += math.prod(node.shape)
        elif node.op in (Op.MATMUL, Op.LM_HEAD):
            w = by_id[node.inputs[1]]
            matrices[w.id] = math.prod(w.shape)
        elif node.op is Op.ATTENTION:
            attention.append((int(node.attr("n_heads")), int(node.attr("head_dim"))))
    return ModelFigures(graph.config.family, graph.config.layers, params,
                        sum(matrices.values()), tuple(attention))


# ---------------------------------------------------------------------------------------------
# Machines


def sram_read_bandwidth(machine) -> float:
    """Bytes/s at which every core's FMACs can read 16-bit resident weights: one weight per
    FMAC lane per cycle (derived; on WSE-3: 8 lanes x 2 B = 16 B a cycle, the two 64-bit SRAM
    read ports of FACTS.md)."""
    return 2.0 * machine.simd_width("fmac_f16") * machine.pes * machine.clock_hz


def is_hbm(machine) -> bool:
    return machine.kind == "hbm"


def hbm_peak(machine) -> float:
    """Peak HBM bytes/s of the whole machine: every GPU of a node has its own HBM (a preset's
    hbm_bandwidth is one chip's)."""
    return machine.hbm_bandwidth * machine.chips


# ---------------------------------------------------------------------------------------------
# One case


@dataclass
class Case:
    """One model on one machine: what was compiled, what ran, and every derived figure."""

    model: str
    machine: str
    status: str = "pending"  # "ok" | "not compiled" | "not loaded" | "run failed"
    #                                 | "run failed"
    reason: str = ""  # the one-line reason when not ok
    max_context: int | None = None
    position: int | None = None
    sequences: int = 1  # sequences in flight: a step carries one token of each
    pes: int | None = None  # cores the program occupies
    figures: dict = field(default_factory=dict)  # every number, see measure()
    checks: list = field(default_factory=list)  # (name, floor seconds, ok)
    host: dict = field(default_factory=dict)  # compile / load / step seconds, peak RSS bytes

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def violations(self) -> list[str]:
        return [c["name"] for c in self.checks if not c["ok"]]

    def to_json(self) -> dict:
        return dict(self.__dict__)


def compile_case(spec: ModelSpec, machine, dtype: str, max_context: int | None,
                 sequences: int = 1, above: int | None = None, prefill: bool = False):
    """(program, report, context) at the largest context of the ladder that compiles (only
    `max_context` when given; only contexts above position `above` when given); (None,
    reason, None) with the compiler's refusal: the last context's, or the one refusal every
    context got (then the context did not matter and the reason does not name one)."""
    from wse_emu.isa.compiler.lower import CompileError
    from wse_emu.isa.compiler.pipeline import compile_model

    ladder = (max_context,) if max_context else tuple(
        c for c in CONTEXT_LADDER if above is None or c > above)
    if not ladder:
        return None, (f"no context of {', '.join(map(str, CONTEXT_LADDER))} holds position "
                      f"{above}"), None
    refusals = []
    for ctx in ladder:
        try:
            program, report = compile_model(spec.folder, machine, dtype=dtype, max_context=ctx,
                                             shape_only=True, sequences=sequences,
                                             prefill=prefill)
            return program, report, ctx
        except CompileError as e:
            refusals.append((ctx, spec.tell(str(e))))  # a shorter context may fit
            if len(refusals) > 1 and refusals[-1][1] == refusals[0][1]:
                break  # two contexts, one refusal: it is not about the context
    if len(refusals) > 1 and refusals[-1][1] == refusals[0][1]:
        return None, refusals[-1][1], None
    ctx, why = refusals[-1]
    return None, f"max_context {ctx}: {why}", None


def stage_of_pe(program, pe_region):
    """The compiler stage of every PE, from its region's name ("s<stage id>.<name>"); None when
    the regions are not one per stage (an HBM kernel runs every stage on every core)."""
    import numpy as np

    n_stages = len(program.meta.get("compiler", {}).get("stages", []))
    ids = []
    for r in program.regions:
        head = r.name.partition(".")[0]
        if not (head[:1] == "s" and head[1:].isdigit() and int(head[1:]) < n_stages):
            return None
        ids.append(int(head[1:]))
    return np.asarray(ids, dtype=np.int64)[pe_region]


def critical_path(result, stage_of, stages: list[dict], layers: int, clock_hz: float):
    """Where a mesh program's token time goes: the stages form a chain, so each stage's share is
    how much later its last PE halts than the stage before's (a running maximum: never
    negative; the shares add up to the token's cycles). Returns (seconds per layer, seconds by
    part: embed, vector (norms, residual adds), gemv (the layers' matrix-vector products),
    attn, head (the LM head)), or (None, None) without a stage map."""
    import numpy as np

    if stage_of is None:
        return None, None
    finish = np.zeros(len(stages), dtype=np.int64)
    np.maximum.at(finish, stage_of, np.asarray(result.clock, dtype=np.int64))
    finish = np.maximum.accumulate(finish)
    share = np.diff(finish, prepend=0) / clock_hz
    per_layer = [0.0] * layers
    by_part: dict[str, float] = {}
    for s, t in zip(stages, share):
        part = "head" if s["layer"] >= layers else s["kind"]
        by_part[part] = by_part.get(part, 0.0) + float(t)
        if 0 <= s["layer"] < layers:
            per_layer[s["layer"]] += float(t)
    return per_layer, by_part


def measure(case: Case, figures: ModelFigures, machine, dtype: str, result,
            layer_s: list[float] | None = None, by_part: dict | None = None,
            gpu_weight_bytes: int | None = None) -> None:
    """case.figures and case.checks from one decode step's RunResult (module docstring);
    layer_s and by_part from critical_path when the program has one region per stage;
    gpu_weight_bytes: one GPU's weight bytes on a GPU node (its HBM floor)."""
    import numpy as np

    cycles = int(result.cycles)
    seconds = cycles / machine.clock_hz
    seqs = case.sequences
    flops = figures.flops(case.position) * seqs  # a step: one token of each sequence
    wbytes = figures.weight_bytes(dtype)
    hbm_read = int(getattr(result, "hbm_read_bytes", 0) or 0)
    hbm_write = int(getattr(result, "hbm_write_bytes", 0) or 0)
    hbm_moved = hbm_read + hbm_write
    links = np.asarray(result.link_wavelets)
    used = links[links > 0]
    hottest = int(links.max()) if links.size else 0
    peak = machine.peak_flops
    hbm = is_hbm(machine)
    hbm_bw = hbm_peak(machine)
    # the links between chips: bytes over each pipe, and the busiest pipe's floor
    pipes = np.asarray(getattr(result, "pipe_wavelets", np.zeros(0)), dtype=np.int64)
    pipe_bytes = [int(w) * machine.wavelet_bytes for w in pipes.tolist()]
    system = machine.chips > 1 and machine.link_bandwidth > 0
    # where the weights are read from: HBM (what the run moved) or resident SRAM
    memory_bytes = hbm_moved if hbm and hbm_moved else wbytes
    case.figures = {
        "cycles_per_token": cycles,
        "seconds_per_token": seconds,
        "tokens_per_second": 1.0 / seconds,  # a sequence's: one token a step
        "sequences": seqs,
        "aggregate_tokens_per_second": seqs / seconds,
        "seconds_per_layer": sum(layer_s) / len(layer_s) if layer_s else seconds / figures.layers,
        "layer_time_measured": bool(layer_s),
        "layer_seconds": layer_s,
        "critical_path_seconds": by_part,
        "params": figures.params,
        "flops_per_token": flops / seqs,
        "flops_per_step": flops,
        "weight_bytes_per_token": wbytes,
        "hbm_read_bytes_per_token": hbm_read,
        "hbm_write_bytes_per_token": hbm_write,
        "fabric_bytes_sent_per_token": int(result.wavelets) * machine.wavelet_bytes,
        "fabric_link_bytes_per_token": int(result.wavelet_hops) * machine.wavelet_bytes,
        "hottest_link_wavelets": hottest,
        "peak_flops": peak,
        "simd_utilisation": flops / (peak * seconds),
        "hbm_utilisation": hbm_moved / (hbm_bw * seconds) if hbm else None,
        "link_utilisation_max": hottest / cycles,
        "link_utilisation_mean": float(used.mean()) / cycles if used.size else 0.0,
        "arithmetic_intensity": flops / max(memory_bytes, 1),
        "memory_bandwidth": hbm_bw if hbm else sram_read_bandwidth(machine),
        "chips": machine.chips,
        "system_link_bytes_per_step": sum(pipe_bytes),
        "pipe_bytes": pipe_bytes,
        "hottest_pipe_utilisation": (max(pipe_bytes) / machine.link_bandwidth / seconds
                                     if system and pipe_bytes else None),
        "gpu_weight_bytes": gpu_weight_bytes,
    }
    floors = [("SIMD", flops / peak), ("link", hottest / machine.clock_hz)]
    if hbm:
        floors[:0] = [("HBM weights", wbytes / hbm_bw), ("HBM moved", hbm_moved / hbm_bw)]
        if machine.chips > 1 and gpu_weight_bytes:
            # every GPU streams its own share from its own HBM: the largest share bounds it
            floors.insert(2, ("HBM per GPU", gpu_weight_bytes / machine.hbm_bandwidth))
    if system:
        # a pipe moves at most link_bandwidth bytes a second (docs/timing-model.md section 11)
        floors.append(("system links", max(pipe_bytes, default=0) / machine.link_bandwidth))
    # a time equal to its floor (a saturated link) is physics, not a violation
    case.checks = [{"name": name, "floor_seconds": floor,
                    "ok": seconds >= floor or math.isclose(seconds, floor, rel_tol=1e-9)}
                   for name, floor in floors]


def run_case(case: Case, machine, dtype: str, program, position: int, figures: ModelFigures,
             tick) -> None:
    """Load `program` timing-only and run one decode step at `position` into `case`."""
    from wse_emu.apps.progress import Reached
    from wse_emu.emulator.generate import Generator
    from wse_emu.emulator.load import LoadError

    t0 = time.perf_counter()
    try:
        gen = Generator(program, machine, timing_only=True)
    except LoadError as e:
        case.status, case.reason = "not loaded", str(e)
        return
    t1 = time.perf_counter()
    case.host["load_seconds"] = t1 - t0
    step = f"decode step at position {position}"
    tick(step)
    predicted = gen.predicted_cycles()
    of = f" of ~{predicted:,}" if predicted else ""
    reached = Reached()

    def within(cycles: int, _instructions: int) -> None:
        # a Llama-3-70B step takes a minute and a half of host time: the cycle it has reached
        tick(f"cycle {reached(cycles):,}{of} (position {position})", transient=True)
    gen.on_cycles = within
    try:
        gen.reset()
        gen.n_past = position  # see the module docstring: cycles do not depend on the cache
        gen.step(TOKEN_ID)
    except LoadError as e:
        case.status, case.reason = "run failed", str(e)
        return
    case.host["step_seconds"] = time.perf_counter() - t1
    result = gen.last_result
    stages = program.meta["compiler"]["stages"]
    layer_s, by_part = critical_path(result, stage_of_pe(program, gen.loaded.pe_region), stages,
                                     figures.layers, machine.clock_hz)
    gpu_bytes = None
    if is_hbm(machine) and machine.chips > 1:
        gpu_bytes = program.meta.get("compiler", {}).get("weight_hbm_bytes")
    measure(case, figures, machine, dtype, result, layer_s, by_part, gpu_bytes)
    if program.model is not None and program.model.mapping == "wafer":
        # a prompt of position + 1 tokens: that many steps, each the measured step's cycles
        # (replaced by a prefill program's figures with --prefill B: run_prefill)
        case.figures["ttft_prompt_tokens"] = position + 1
        case.figures["ttft_seconds"] = (position + 1) * case.figures["seconds_per_token"]
        case.figures["ttft_method"] = "fed a token a step"
    predicted = predicted_cycles(program)
    if predicted:  # the compiler's cost model beside the emulated step, and per layer
        case.figures["predicted_cycles_per_token"] = predicted[0]
        case.figures["predicted_layer_seconds"] = [c / machine.clock_hz for c in predicted[1]]
    case.status = "ok"


def run_prefill(spec: ModelSpec, machine, dtype: str, context: int, position: int, most: int,
                tick) -> dict:
    """The time to first token of a prompt of position + 1 tokens with a prefill program
    (compile --prefill B) at the case's context, B the largest of most, most / 2, ... (down to
    2) that compiles for the machine (a GPU's batched step holds fewer positions than a
    wafer's pipeline): {"figures": ..., "host": ...} or {"reason": the compiler's refusal of
    `most` (or the loader's) in one line}. Timing-only, so the wafer emulates the prompt's
    last run (a wafer-mapped run costs the same at every position) and an HBM machine its
    first and last (the others their mean; emulator/generate.py,
    Generator._generate_prefill)."""
    from wse_emu.apps.progress import Reached
    from wse_emu.emulator.generate import Generator
    from wse_emu.emulator.load import LoadError

    t0 = time.perf_counter()
    B, first_refusal = most, None
    while True:
        tick(f"compiling --prefill {B}")
        program, report, _ = compile_case(spec, machine, dtype, context, B, prefill=True)
        if program is not None or B // 2 < 2:
            break
        first_refusal = first_refusal or report
        B //= 2
    host = {"prefill_compile_seconds": time.perf_counter() - t0}
    if program is None:
        return {"reason": f"--prefill {most}: {first_refusal or report}", "host": host}
    reached = Reached()

    def within(cycles: int, _instructions: int) -> None:
        tick(f"prefill run of {B}: cycle {reached(cycles):,}", transient=True)
    try:
        tick(f"prefill runs of {B} positions, a prompt of {position + 1} tokens")
        gen = Generator(program, machine, timing_only=True)
        gen.on_cycles = within
        res = gen.generate([], 1, position=position)
    except LoadError as e:
        return {"reason": f"--prefill {B}: {e}", "host": host}
    host["prefill_seconds"] = time.perf_counter() - t0 - host["prefill_compile_seconds"]
    runs, done = -(-(position + 1) // B), len(gen.prompt_runs(position + 1))
    return {"host": host, "figures": {
        "ttft_prompt_tokens": position + 1, "ttft_seconds": res.ttft_seconds[0],
        "ttft_method": (f"prefill in runs of {B} positions, "
                        + ("1 emulated" if done == 1 else "the first and the last emulated")
                        + f" of {runs}"),
        "prefill_positions": B, "prefill_asked": most,
        "prefill_run_cycles": res.cycles_per_token[0],
        "prefill_tokens_per_second": res.prefill_tokens_per_second}}


def predicted_cycles(program):
    """(cycles a decode step, [cycles of each layer]) by the compiler's cost model, from the
    program's ModelInfo (its parts and the crossings between wafers), or None without one."""
    from wse_emu.isa.program import pipelined_cycles

    m = program.model
    if m is None or not any(p.predicted_cycles for p in m.parts):
        return None
    per_layer = [0] * m.layers
    for p in m.parts:
        if 0 <= p.layer < m.layers:
            per_layer[p.layer] += p.predicted_cycles
    parts = {p.name: p.predicted_cycles for p in m.parts}
    parts.update({f"crossing {c}-{c + 1}": v for c, v in enumerate(m.crossing_cycles)})
    return pipelined_cycles(parts, m.sequences), per_layer


def run_model(spec: ModelSpec, machines, dtype: str, max_context: int | None,
              position: int | None, tick, sequences: int = 1,
              figures: ModelFigures | None = None) -> list[Case]:
    """The cases of one model at one B: compile for every machine, then decode the same
    position (`position`, or the last the smallest context among them holds)."""
    cases, compiled = [], {}
    for m in machines:
        case = Case(spec.name, m.name, sequences=sequences)
        tick.show(case, "compiling")
        t0 = time.perf_counter()
        program, report, ctx = compile_case(spec, m, dtype, max_context, sequences,
                                            above=position)
        case.host["compile_seconds"] = time.perf_counter() - t0
        case.host["peak_rss_bytes"] = peak_rss_bytes()
        if program is None:
            case.status, case.reason = "not compiled", report
        else:
            case.max_context, case.pes = ctx, report.pes
            compiled[m.name] = program
        cases.append(case)
        tick.advance()
    if figures is None:
        figures = figures_of(spec)
    if not compiled:
        for _ in cases:
            tick.advance()
        return cases
    contexts = [c.max_context for c in cases if c.max_context]
    pos = min(contexts) - 1 if position is None else position
    for m, case in zip(machines, cases):
        program = compiled.pop(m.name, None)
        if program is not None:
            case.position = pos
            if pos >= case.max_context:
                case.status = "run failed"
                case.reason = f"position {pos} is outside max_context {case.max_context}"
            else:
                tick.show(case, f"loading (max_context {case.max_context})")
                run_case(case, m, dtype, program, pos, figures,
                         lambda what, transient=False, c=case: tick.show(c, what, transient))
                del program
                case.host["peak_rss_bytes"] = max(case.host["peak_rss_bytes"], peak_rss_bytes())
        tick.advance()
    return cases


def figures_of(spec: ModelSpec) -> ModelFigures:
    from wse_emu.isa.compiler.lower import CompileError
    from wse_emu.isa.compiler.pipeline import load_graph

    try:
        return model_figures(load_graph(spec.folder, shape_only=True))
    except CompileError as e:
        raise BenchError(f"{spec.name}: {spec.tell(str(e))}") from None


def run_suite(models, machines, dtype: str = "bf16", max_context: int | None = None,
              position: int | None = None, progress=None, command: str = "",
              sequences=1, prefill: int = 0) -> dict:
    """Every model on every machine at every B: the JSON-able suite {"meta": ..., "cases":
    [...]}, the cases ordered by model, machine, B. prefill = B > 1: every case's time to
    first token from a prefill program of B positions a run (run_prefill), else from its
    step (the wafer mapping: a token a step).

    models: built-in names or HF config.json paths; machines: preset names, files or Machine
    objects (systems NAMExN too); sequences: B or a list of B. progress(done, total, label) is
    called as the cases advance (a progress bar), and, if it takes a fourth argument,
    progress(done, total, label, True) as a step goes on (its label the cycle reached, about
    every 0.5 s: a terminal's bar redraws it, a log need not print it)."""
    from wse_emu.isa.machine import load_machine

    if dtype not in DTYPE_BYTES:
        raise BenchError(f"dtype {dtype!r} is not supported (fp32, fp16, bf16)")
    machines = [load_machine(m) if isinstance(m, str) else m for m in machines]
    if not machines:
        raise BenchError("no machines to benchmark on")
    bs = parse_sequences(sequences)
    t_start = time.perf_counter()
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="wse-emu-bench-") as workdir:
        specs = model_specs(models, Path(workdir))
        # compile + run a case
        tick = _Ticker(progress, (2 * len(bs) + (1 if prefill else 0))
                       * len(specs) * len(machines))
        for spec in specs:
            figures, pos, done = figures_of(spec), position, []
            for b in reversed(bs):  # the largest B first: it sets the position (docstring)
                got = run_model(spec, machines, dtype, max_context, pos, tick, b, figures)
                if pos is None:
                    pos = next((c.position for c in got if c.position is not None), None)
                for case in got:
                    case.host["case_seconds"] = sum(v for k, v in case.host.items()
                                                    if k.endswith("_seconds"))
                done += got
            if prefill:
                _prefill_cases(spec, machines, dtype, done, prefill, tick, figures)
            order = {m.name: i for i, m in enumerate(machines)}
            cases += sorted(done, key=lambda c: (order[c.machine], c.sequences))
    return {
        "meta": {"command": command, "dtype": dtype, "date": time.strftime("%Y-%m-%d %H:%M %Z"),
                 "host": f"{platform.machine()}, {_cpus()} CPUs, Python "
                         f"{platform.python_version()}",
                 "host_seconds": time.perf_counter() - t_start,
                 "peak_rss_bytes": peak_rss_bytes(),
                 "token_id": TOKEN_ID, "batch": 1, "sequences": bs, "prefill": prefill,
                 "batch_sweep": sequences_note(bs),
                 "machines": [machine_json(m) for m in machines]},
        "cases": [c.to_json() for c in cases],
    }


def _prefill_cases(spec: ModelSpec, machines, dtype: str, cases: list, B: int, tick,
                   figures: ModelFigures) -> None:
    """run_prefill for every machine a case of `spec` ran on, at that case's context and
    position; its figures join every such case (the first token of one prompt, whatever B
    sequences the case keeps in flight), or its reason (figures "ttft_reason"). The floors
    of a prompt's first token (figures "ttft_floors"; violations() reports one it is under):
    the prompt's FLOPs / peak, and on an HBM machine every weight read once / peak HBM
    bandwidth."""
    for m in machines:
        ran = [c for c in cases if c.machine == m.name and c.ok]
        if ran:
            first = min(ran, key=lambda c: c.sequences)
            got = run_prefill(spec, m, dtype, first.max_context, first.position, B,
                              lambda what, transient=False, c=first: tick.show(c, what,
                                                                               transient))
            first.host.update(got["host"])  # (its host time counted once)
            first.host["case_seconds"] += sum(got["host"].values())
            if "figures" in got:
                f = got["figures"]
                prompt = f["ttft_prompt_tokens"]
                floors = [("SIMD", sum(figures.flops(p) for p in range(prompt)) / m.peak_flops)]
                if is_hbm(m):
                    floors.append(("HBM weights", figures.weight_bytes(dtype) / hbm_peak(m)))
                f["ttft_floors"] = [
                    {"name": name, "floor_seconds": floor,
                     "ok": f["ttft_seconds"] >= floor or math.isclose(f["ttft_seconds"], floor,
                                                                      rel_tol=1e-9)}
                    for name, floor in floors]
            for c in ran:
                if "figures" in got:
                    c.figures.update(got["figures"])
                else:
                    for k in ("ttft_seconds", "ttft_prompt_tokens", "ttft_method"):
                        c.figures.pop(k, None)
                    c.figures["ttft_reason"] = got["reason"]
                c.host["peak_rss_bytes"] = max(c.host["peak_rss_bytes"], peak_rss_bytes())
        tick.advance()


def peak_rss_bytes() -> int:
    """The process's peak resident set so far (VmHWM). Never reset (writing to clear_refs
    would): tools watching the process must see its true peak, so a case's figure is the
    peak up to the end of that case, over the cases run before it too."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _Ticker:
    """Counts the suite's phases (a compile, a run per case) for the progress callback."""

    def __init__(self, progress, total: int):
        self.progress, self.total, self.done = progress, total, 0
        # a callback of three parameters (done, total, label) is not given transient labels
        self.transient = progress is not None and _takes(progress, 4)

    def show(self, case: Case, what: str, transient: bool = False) -> None:
        if not self.progress:
            return
        label = f"{case.model} on {case.machine}: {what}"
        if not transient:
            self.progress(self.done, self.total, label)
        elif self.transient:
            self.progress(self.done, self.total, label, True)

    def advance(self) -> None:
        self.done += 1
        if self.progress:
            self.progress(self.done, self.total, "")


def _takes(fn, n: int) -> bool:
    """Whether fn can be called with n positional arguments."""
    try:
        inspect.signature(fn).bind(*range(n))
    except (TypeError, ValueError):  # (ValueError: no signature to read)
        return False
    return True


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def machine_json(m) -> dict:
    return {"name": m.name, "kind": m.kind, "pes": m.pes, "clock_hz": m.clock_hz,
            "peak_flops": m.peak_flops, "sram_bytes_per_pe": m.sram_bytes,
            "hbm_bytes": m.hbm_bytes, "hbm_bandwidth": hbm_peak(m),
            "hbm_bandwidth_per_chip": m.hbm_bandwidth, "hbm_efficiency": m.hbm_efficiency,
            "chips": m.chips, "link_bandwidth": m.link_bandwidth,
            "link_latency_cycles": m.link_latency,
            "memory_bandwidth": hbm_peak(m) if is_hbm(m) else sram_read_bandwidth(m),
            "memory": "HBM" if is_hbm(m) else "resident SRAM (FMAC read rate)"}




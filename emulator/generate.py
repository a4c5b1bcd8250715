"""The host decode loop: run a compiled model once per token, with the KV cache kept in SRAM.

A compiled decoder (isa.compiler) processes one position per run: the host writes the token
into `input_ids` and its position into `position_ids`, runs every PE from pc 0, and reads
`logits`. The runners leave SRAM as the program left it, so the K and V caches the attention
PEs appended to are there for the next run. Such a program takes the prompt token by token
(a prefill program several tokens a run: below).

Timing-only (`timing_only=True`, e.g. a `--shape-only` compile at full size): the same runs
without SRAM contents, so there are no logits to sample from: every decode step is fed a given
token id (`decode_token`, default the prompt's last) and the result reports cycles only.

Several sequences (a program compiled with `--sequences B`): a run takes one token of each of
B independent sequences (input_ids and position_ids of B values, logits B x vocab), each at
its own position with its own KV cache. Every run advances every sequence: a sequence feeds
its next prompt token, then its own greedy tokens; one that has all its tokens repeats its
last token at its last position (which rewrites that cache slot with the same values), so the
others go on. A sequence gets one token a run: its tokens/s is clock / cycles a run, the
aggregate B times that.

A prefill program (`--prefill B`): a run takes B consecutive positions of one sequence into
one KV cache. The prompt goes in runs of B, the last ending at its last token (its logits, the
program's last row, give the first generated token); every decode step after it is a whole
run, every slot fed the token. Its time to first token is the prompt's runs (timing-only from
a position: one run on the wafer mapping, whose runs cost the same at every position; the
first and the last on an HBM machine, the others their mean).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wse_emu.emulator.host_clock import HostClock
from wse_emu.emulator.load import LoadError, PageSnapshot, load, read_output, write_input
from wse_emu.isa.machine import Machine, load_machine
from wse_emu.emulator.result import RUN_HALTED
from wse_emu.isa.program import Program, pipelined_cycles


KERNEL = -2  # the "layer" of every core of an HBM-target kernel (isa/compiler/hbm.py)


def _ignore(*args) -> None:
    pass


# what the per-part "waiting for wavelets" figures (GenerateResult.per_layer) count from, for
# the reports that print them (generate, the demo)
WAITS_NOTE = ("(the waits count from the step's start: a later part has waited longer for the "
              "token to reach it)")


@dataclass
class GenerateResult:
    generated_ids: list[int]
    cycles_per_token: list[int]  # cycles of the run that produced each generated token's logits
    seconds_per_token: float  # emulated, mean
    tokens_per_second: float  # emulated
    host_seconds: float  # host time of the whole generate() call, less compile_seconds
    prefill_cycles: int  # the prompt runs before the last (whose cycles are cycles_per_token[0])
    # "embed" | "layer i" | "head" -> cycles per token summed over the part's PEs: compute =
    # busy, fabric = waiting for wavelets, stall = blocked by backpressure
    per_layer: dict = field(default_factory=dict)
    timing_only: bool = False  # no values computed: generated_ids is empty
    mode: str = "functional"  # "functional" | "timing-only"
    decode_token: int | None = None  # timing-only: the token id every decode step was fed
    note: str = ""  # what a timing-only result does not contain, in words
    start_position: int | None = None  # timing-only: the first decode step's (no prefill run)
    # the compiler's cost model beside the emulator: predicted cycles of a decode step (0: the
    # program has no prediction; several sequences: the pipelined step of all of them), and
    # per part ("embed", "layer i", "crossing c-c+1", "head") {"predicted", "emulated"}
    # cycles a step, emulated as when the part's last PE halted minus when the part before it
    # ended (the wafer mapping's parts run one after the other; with several sequences, the
    # last sequence's pass)
    predicted_cycles: int = 0
    parts: dict = field(default_factory=dict)
    sequences: int = 1  # sequences in flight (a run takes one token of each)
    ids_per_sequence: list = field(default_factory=list)  # every sequence's generated ids
    aggregate_tokens_per_second: float = 0.0  # sequences x tokens_per_second
    # time to first token of each sequence's prompt: the runs up to and including the one that
    # gives its first generated token's logits (timing-only with a position P: P + 1 runs of
    # the measured run's cycles, which a wafer-mapped step takes at every position)
    ttft_seconds: list = field(default_factory=list)
    ttft_prompt_lengths: list = field(default_factory=list)  # the prompts those are for
    # a prefill program (compile --prefill B): B positions a run, and the prompt's tokens a
    # second of host-independent emulated time (prompt tokens / ttft)
    prefill_positions: int = 0
    prefill_tokens_per_second: float = 0.0
    compile_seconds: float = 0.0  # Numba compiling the core's machine code (a kind's first run)
    load_seconds: float = 0.0  # loading the program before the runs, less compiling

    def to_json(self) -> dict:
        return dict(self.__dict__)


class Generator:
    """Greedy decoding of a compiled decoder program on the emulator."""

    def __init__(self, program: Program, machine: Machine | str = "wse3",
                 base_dir: str | None = None, engine: str = "core", timing_only: bool = False):
        self.machine = load_machine(machine) if isinstance(machine, str) else machine
        info = program.meta.get("compiler")
        outputs = {s.name for s in program.symbols if s.kind == "output"}
        if info is None or "logits" not in outputs:
            raise LoadError(f"program '{program.name}' is not a compiled decoder (it needs "
                            f"compiler metadata and a 'logits' output)")
        self.sequences = program.model.sequences if program.model is not None else 1
        shape = next(s.shape for s in program.symbols if s.name == "input_ids")
        if tuple(shape) != (self.sequences,):
            raise LoadError(f"program '{program.name}' runs {shape[0]} positions a run; the "
                            f"decode loop needs one (compile with positions=1)")
        self.program = program
        self.max_context = int(info["max_context"])
        self.layers = int(info["layers"])
        self.timing_only = timing_only
        with HostClock() as clock:
            self.loaded = load(program, self.machine, base_dir=base_dir,
                               with_data=not timing_only)
        # the load's host time (checks, route walk, state), reported beside the runs'; its
        # compiling joins the first generate()'s compile_seconds
        self.load_seconds, self._load_compile = clock.host_seconds, clock.compile_seconds
        self._initial = PageSnapshot(self.loaded.sram)  # weights, code, empty caches
        self._known = PageSnapshot(self.loaded.unknown)  # timing-only: nothing unknown yet
        from wse_emu.emulator.api import engine_run

        self._run = engine_run(engine)
        self._layer_of_pe = self._pe_layers(info)
        self._timed_parts = self._parts_in_series(program)
        # called as a run goes on, (cycle reached, instructions run), about every 0.5 s of
        # host time: a progress display inside a long step (the CLI's bar)
        self.on_cycles = None
        self.n_past = 0  # one sequence: its cached positions
        self.positions = np.zeros(self.sequences, dtype=np.int64)  # every sequence's
        self.last_result = None

    def _pe_layers(self, info) -> np.ndarray:
        if info.get("target") == "hbm":  # one kernel: every core works on every layer
            return np.full(self.loaded.pe_region.shape, KERNEL, dtype=np.int64)
        # region names are "s<stage id>.<stage name>...": map every PE to its stage's layer
        layers = [s["layer"] for s in info["stages"]]
        region_layer = np.array([layers[int(r.name[1:].split(".", 1)[0])]
                                 for r in self.program.regions], dtype=np.int64)
        return region_layer[self.loaded.pe_region]

    def _parts_in_series(self, program: Program) -> list:
        """[(part name, predicted cycles, PE indices or None)] in the order a decode step runs
        them, for programs whose parts run one after the other (the wafer mapping); a
        crossing between wafers has no PEs of its own: it ends when the next layer does."""
        m = program.model
        if m is None or m.mapping != "wafer":
            return []
        region_index = {r.name: i for i, r in enumerate(program.regions)}
        parts = sorted((p for p in m.parts if p.name != "sources"), key=lambda p: p.layer)
        crossing_into = {first: (f"crossing {c - 1}-{c}", m.crossing_cycles[c - 1])
                         for c, (first, _) in enumerate(m.groups) if c > 0}
        out = []
        for p in parts:
            if p.layer in crossing_into:
                name, cycles = crossing_into[p.layer]
                out.append((name, int(cycles), None))
            regions = np.array([region_index[r] for r in p.regions])
            pes = np.nonzero(np.isin(self.loaded.pe_region, regions))[0]
            out.append((p.name, int(p.predicted_cycles), pes))
        return out

    def _time_parts(self, totals: dict) -> None:
        """Add the last run's emulated cycles of every part (in series) to totals."""
        clock = np.asarray(self.last_result.clock).reshape(-1)
        prev, crossing = 0, None
        for name, _, pes in self._timed_parts:
            if pes is None:  # measured with the layer after it: the two end together
                crossing = name
                continue
            end = int(clock[pes].max()) if len(pes) else prev
            key = f"{crossing} + {name}" if crossing else name
            totals[key] = totals.get(key, 0) + max(end - prev, 0)
            prev, crossing = max(prev, end), None

    def reset(self) -> None:
        """Forget the sequence: SRAM back to its loaded state (empty KV caches; timing-only:
        nothing computed yet, so no word is unknown)."""
        self._initial.restore(self.loaded.sram)
        self._known.restore(self.loaded.unknown)
        self.n_past = 0
        self.positions[:] = 0

    def step_all(self, token_ids, positions) -> np.ndarray | None:
        """One run of a program of B sequences: sequence s appends token_ids[s] at
        positions[s]; the logits (B, vocab) fp32 (None when timing-only). The host keeps the
        positions (a sequence may repeat its last one: see the module docstring)."""
        B = self.sequences
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if ids.size != B or pos.size != B:
            raise LoadError(f"the program runs {B} sequences: give {B} token ids and {B} "
                            f"positions, got {ids.size} and {pos.size}")
        for s in range(B):
            if not 0 <= pos[s] < self.max_context:
                raise LoadError(f"KV cache full: sequence {s} at position {pos[s]}, "
                                f"max_context {self.max_context} (compile with a larger "
                                f"--max-context)")
            if not 0 <= ids[s] < self.vocab:
                raise LoadError(f"token id {ids[s]} is outside the vocabulary "
                                f"(0..{self.vocab - 1})")
        write_input(self.loaded, "input_ids", ids.astype(np.int32))
        write_input(self.loaded, "position_ids", pos.astype(np.int32))
        result = self._run(self.loaded, progress=self.on_cycles or _ignore)
        if result.outcome != RUN_HALTED:
            raise LoadError(f"run for positions {pos.tolist()} did not finish: "
                            f"{result.outcome_name} at cycle {result.cycles}")
        self.last_result = result
        self.positions = np.maximum(self.positions, pos + 1)
        if self.timing_only:
            return None
        return read_output(self.loaded, "logits").reshape(-1, self.vocab)

    def step(self, token_id: int) -> np.ndarray | None:
        """Append one token at the next position; its logits (vocab,) fp32 (None when
        timing-only: the cycles are in last_result). A program of several sequences: every
        sequence gets token_id at position n_past (generate() gives each its own)."""
        if self.sequences > 1:
            if self.n_past >= self.max_context:
                raise LoadError(f"KV cache full: {self.n_past} positions cached, max_context "
                                f"{self.max_context} (compile with a larger --max-context)")
            out = self.step_all([int(token_id)] * self.sequences, [self.n_past] * self.sequences)
            self.n_past += 1
            return None if out is None else out[0]
        if self.n_past >= self.max_context:
            raise LoadError(f"KV cache full: {self.n_past} positions cached, max_context "
                            f"{self.max_context} (compile with a larger --max-context)")
        if not 0 <= int(token_id) < self.vocab:
            raise LoadError(f"token id {token_id} is outside the vocabulary "
                            f"(0..{self.vocab - 1})")
        write_input(self.loaded, "input_ids", np.array([token_id], dtype=np.int32))
        write_input(self.loaded, "position_ids", np.array([self.n_past], dtype=np.int32))
        # the callback makes the core return to Python every fraction of a second, where a
        # Ctrl-C (KeyboardInterrupt) is delivered
        result = self._run(self.loaded, progress=self.on_cycles or _ignore)
        if result.outcome != RUN_HALTED:
            raise LoadError(f"run for position {self.n_past} did not finish: "
                            f"{result.outcome_name} at cycle {result.cycles}")
        self.last_result = result
        self.n_past += 1
        if self.timing_only:
            return None
        return read_output(self.loaded, "logits").reshape(-1)

    def prefill(self, ids) -> np.ndarray:
        """Start a new sequence with the prompt; the logits of its last token."""
        ids = [int(i) for i in ids]
        if not ids:
            raise LoadError("prefill needs at least one prompt token")
        self.reset()
        for tok in ids:
            logits = self.step(tok)
        return logits

    @property
    def vocab(self) -> int:
        return int(next(s.shape for s in self.program.symbols if s.name == "logits")[-1])

    def check_capacity(self, n_prompt: int, n: int, position: int | None = None) -> None:
        """LoadError before anything runs when the KV cache cannot hold the whole request
        (check_capacity, below)."""
        check_capacity(self.max_context, n_prompt, n, position)

    def generate(self, prompt_ids, n: int, decode_token: int | None = None,
                 position: int | None = None, on_step=None) -> GenerateResult:
        """The n next tokens by argmax after the prompt (the prompt not included).

        Timing-only: no logits, so no argmax: the n decode steps are each fed `decode_token`
        (default: the prompt's last token, else 0) and the result has cycles but no generated
        ids. `position` (timing-only): the first decode step runs at that position on an
        empty cache, without a prefill (timing never depends on the cached values; prompt_ids
        may then be empty). Everything is checked before the first run (ids, KV capacity).
        on_step() is called after every emulated run (a progress bar).

        A program of B sequences: prompt_ids is one prompt (every sequence starts from it) or
        B prompts; the result has every sequence's ids (ids_per_sequence; generated_ids is
        sequence 0's) and cycles_per_token the runs from the longest prompt's last on.

        host_seconds is the call's host time less Numba's compiling (compile_seconds);
        load_seconds the Generator's load of the program, before it."""
        with HostClock() as clock:
            res = self._generate(prompt_ids, n, decode_token, position, on_step)
        res.host_seconds, res.load_seconds = clock.host_seconds, self.load_seconds
        res.compile_seconds = clock.compile_seconds + self._load_compile
        self._load_compile = 0.0
        return res

    def _generate(self, prompt_ids, n: int, decode_token, position, on_step) -> GenerateResult:
        if self.program.model is not None and self.program.model.prefill:
            return self._generate_prefill(prompt_ids, n, decode_token, position, on_step)
        if self.sequences > 1:
            return self._generate_many(prompt_ids, n, decode_token, position, on_step)
        ids = [int(i) for i in prompt_ids]
        decode_token = self._checked([ids], n, decode_token, position)
        self.reset()
        tick = on_step or _ignore
        prefill_cycles, cycles, out = 0, [], []
        totals: dict[int, np.ndarray] = {}
        timed: dict[str, int] = {}
        if position is not None:  # no prefill: the first decode step at `position`
            self.n_past = int(position)
            logits = self.step(decode_token)
            tick()
        for k, tok in enumerate(ids if position is None else ()):
            logits = self.step(tok)
            tick()
            if k + 1 < len(ids):
                prefill_cycles += self.last_result.cycles
        for i in range(n):
            cycles.append(int(self.last_result.cycles))
            self._account(totals)
            if self._timed_parts:
                self._time_parts(timed)
            if self.timing_only:  # no values: every step is fed the given token
                if i + 1 < n:
                    self.step(decode_token)
                    tick()
                continue
            out.append(int(np.argmax(logits)))
            if i + 1 < n:
                logits = self.step(out[-1])
                tick()
        per_layer = self._per_layer(totals, n)
        note = ""
        if self.timing_only:
            note = (f"timing-only: no values are computed, so no token can be sampled; each of "
                    f"the {n} decode steps was fed token {decode_token}")
        if position is None:
            ttft, lengths = [(prefill_cycles + cycles[0]) / self.machine.clock_hz], [len(ids)]
        else:
            ttft, lengths = self._ttft_estimate(position, cycles[0])
        return self._result(out, cycles, prefill_cycles, per_layer, decode_token, note,
                            position, timed, n, ids_per_sequence=[out], ttft_seconds=ttft,
                            ttft_prompt_lengths=lengths)

    def _checked(self, prompts: list, n: int, decode_token, position) -> int | None:
        """What every generate() checks before its first run (the prompts' ids, the request
        against the KV cache, the timing-only options); the token a timing-only run feeds
        (default: the first prompt's last id, else 0), None for a functional one."""
        if n < 1:
            raise LoadError("generate needs n >= 1 tokens")
        if position is not None and not self.timing_only:
            raise LoadError("a start position is only given in timing-only mode (a functional "
                            "run computes the cache of every earlier position)")
        if decode_token is not None and not self.timing_only:
            raise LoadError("a decode token is only given in timing-only mode (a functional "
                            "run decodes its own greedy tokens)")
        if position is None and any(not p for p in prompts):
            raise LoadError("generate needs at least one prompt token"
                            + (" for every sequence" if len(prompts) > 1 else ""))
        if self.timing_only and decode_token is None:
            decode_token = prompts[0][-1] if prompts[0] else 0
        for tok in [t for p in prompts for t in p] + ([decode_token] if self.timing_only
                                                      else []):
            if not 0 <= tok < self.vocab:
                raise LoadError(f"token id {tok} is outside the vocabulary (0..{self.vocab - 1})")
        for p in prompts:
            self.check_capacity(len(p), n, position)
        return None if decode_token is None else int(decode_token)

    def predicted_cycles(self) -> int:
        """The compiler's predicted cycles of a run: the wafer mapping's parts in series (one
        sequence) or pipelined over the sequences (isa.program.pipelined_cycles); 0 for
        programs without a prediction."""
        return pipelined_cycles({name: c for name, c, _ in self._timed_parts}, self.sequences)

    def _parts_result(self, timed: dict, n: int) -> dict:
        predicted = {name: c for name, c, _ in self._timed_parts}
        parts = {}
        for key, total in timed.items():  # "crossing c-c+1 + layer i": both predictions
            parts[key] = {"predicted": sum(predicted[k] for k in key.split(" + ")),
                          "emulated": int(total // n)}
        return parts

    def _ttft_estimate(self, position: int, cycles: int) -> tuple[list, list]:
        """Timing-only from `position` P: a prompt of P + 1 tokens takes P + 1 runs, each the
        measured run's cycles on the wafer mapping (its step costs the same at every
        position); nothing for other mappings (their step grows with the position)."""
        m = self.program.model
        if m is None or m.mapping != "wafer":
            return [], []
        t = (position + 1) * cycles / self.machine.clock_hz
        return [t] * self.sequences, [position + 1] * self.sequences

    def _generate_many(self, prompt_ids, n: int, decode_token, position,
                       on_step) -> GenerateResult:
        """generate() for a program of B > 1 sequences (module docstring)."""
        B = self.sequences
        prompts = list(prompt_ids)
        if prompts and all(isinstance(p, (list, tuple, np.ndarray)) for p in prompts):
            prompts = [[int(i) for i in p] for p in prompts]
        else:
            prompts = [[int(i) for i in prompts]] * B
        if len(prompts) == 1:
            prompts = prompts * B
        if len(prompts) != B:
            raise LoadError(f"the program runs {B} sequences: give one prompt (used for all) "
                            f"or {B} prompts, got {len(prompts)}")
        decode_token = self._checked(prompts, n, decode_token, position)
        self.reset()
        tick = on_step or _ignore
        lengths = [1] * B if position is not None else [len(p) for p in prompts]
        first = max(lengths) - 1  # the first run every sequence decodes in
        out: list[list[int]] = [[] for _ in range(B)]
        run_cycles, totals, timed = [], {}, {}
        for t in range(first + n):
            toks, pos = [], []
            for s in range(B):
                k = min(t, lengths[s] + n - 2)  # a sequence with all its tokens repeats
                if position is not None:
                    toks.append(decode_token)
                    pos.append(position + k)
                elif k < lengths[s]:
                    toks.append(prompts[s][k])
                    pos.append(k)
                else:
                    toks.append(decode_token if self.timing_only else out[s][k - lengths[s]])
                    pos.append(k)
            logits = self.step_all(toks, pos)
            tick()
            run_cycles.append(int(self.last_result.cycles))
            if t >= first:
                self._account(totals)
                if self._timed_parts:
                    self._time_parts(timed)
            if logits is not None:
                for s in range(B):
                    if lengths[s] - 1 <= t <= lengths[s] + n - 2:
                        out[s].append(int(np.argmax(logits[s])))
        cycles = run_cycles[first:]
        clock = self.machine.clock_hz
        per_layer = self._per_layer(totals, n)
        if position is None:
            ttft = [sum(run_cycles[:lengths[s]]) / clock for s in range(B)]
            ttft_lengths = lengths
        else:
            ttft, ttft_lengths = self._ttft_estimate(position, cycles[0])
        note = ""
        if self.timing_only:
            note = (f"timing-only: no values are computed, so no token can be sampled; each of "
                    f"the {B} sequences was fed token {decode_token} at every decode step")
        return self._result(out[0] if not self.timing_only else [], cycles,
                            sum(run_cycles[:first]), per_layer, decode_token, note, position,
                            timed, n, sequences=B,
                            ids_per_sequence=out if not self.timing_only else [],
                            ttft_seconds=ttft,
                            ttft_prompt_lengths=ttft_lengths)

    def _generate_prefill(self, prompt_ids, n: int, decode_token, position,
                          on_step) -> GenerateResult:
        """generate() for a prefill program (compile --prefill B; module docstring): the
        prompt in runs of B consecutive positions, the last run's row of the prompt's last
        token giving the first generated token; then a run a token, every slot fed it."""
        B = self.sequences
        if any(isinstance(p, (list, tuple, np.ndarray)) for p in prompt_ids):
            raise LoadError(f"a prefill program runs one sequence ({B} of its positions a run): "
                            f"give one prompt")
        ids = [int(i) for i in prompt_ids]
        decode_token = self._checked([ids], n, decode_token, position)
        self.reset()
        tick = on_step or _ignore
        length = len(ids) if position is None else position + 1  # the prompt's positions
        chunks = -(-length // B)
        runs = []
        for c in self.prompt_runs(length):  # run c: positions c B .. c B + B - 1; the last ends at the prompt's
            # last token (the program's logits are its last position's), repeating earlier
            # positions (or position 0), whose cache rows it rewrites with the same values
            pos = ([c * B + j for j in range(B)] if c < chunks - 1 else
                   [max(0, length - B + j) for j in range(B)])
            toks = [decode_token if position is not None else ids[q] for q in pos]
            logits = self.step_all(toks, pos)
            tick()
            runs.append(int(self.last_result.cycles))
        row = None if logits is None else logits[-1]
        cycles, out, totals, timed = [], [], {}, {}
        for i in range(n):
            cycles.append(int(self.last_result.cycles))
            self._account(totals)
            if self._timed_parts:
                self._time_parts(timed)
            tok = decode_token
            if row is not None:
                out.append(int(np.argmax(row)))
                tok = out[-1]
            if i + 1 < n:
                logits = self.step_all([tok] * B, [length + i] * B)
                tick()
                row = None if logits is None else logits[-1]
        clock = self.machine.clock_hz
        if len(runs) == chunks:  # every run of the prompt emulated
            prefill_cycles = sum(runs[:-1])
            ttft = (prefill_cycles + runs[-1]) / clock
            how = "every run of the prompt emulated"
        elif len(runs) == 1:
            prefill_cycles = (chunks - 1) * runs[0]
            ttft = chunks * runs[0] / clock
            how = (f"{chunks} runs, each the cycles of the one emulated: a wafer-mapped run "
                   f"costs the same at every position")
        else:  # timing-only: the first and the last run; the others as their mean (a run's
            # cycles grow linearly with its positions: its attention reads every earlier one)
            prefill_cycles = (chunks * (runs[0] + runs[-1])) // 2 - runs[-1]
            ttft = chunks * (runs[0] + runs[-1]) / 2 / clock
            how = (f"{chunks} runs, the first and the last emulated and the others taken as "
                   f"their mean")
        per_layer = self._per_layer(totals, n)
        note = (f"a prefill program: the prompt of {length} tokens in runs of {B} positions "
                f"({how}); each decode step after it is a whole run, every slot fed the token")
        if self.timing_only:
            note += (f"; timing-only: no values are computed, so no token can be sampled; "
                     f"every run was fed token {decode_token}")
        return self._result(out, cycles, prefill_cycles, per_layer, decode_token, note,
                            position, timed, n, ids_per_sequence=[out], ttft_seconds=[ttft],
                            ttft_prompt_lengths=[length], prefill_positions=B,
                            prefill_tokens_per_second=length / ttft)

    def prompt_runs(self, length: int) -> list[int]:
        """A prefill program: which of the runs of a prompt of `length` positions generate()
        emulates (run c: positions c B ..). Every one, but timing-only: on the wafer mapping a
        run costs the same at every position, so the last alone; else the first and the last
        (the others taken as their mean)."""
        chunks = -(-length // self.sequences)
        wafer = self.program.model.mapping == "wafer"
        if self.timing_only and chunks > (1 if wafer else 2):
            return [chunks - 1] if wafer else [0, chunks - 1]
        return list(range(chunks))

    def _result(self, out, cycles, prefill_cycles, per_layer, decode_token, note, position,
                timed, n, **more) -> GenerateResult:
        """The GenerateResult of n decode runs of `cycles` (one sequence unless `more` says)."""
        spt = float(np.mean(cycles)) / self.machine.clock_hz
        more.setdefault("aggregate_tokens_per_second", more.get("sequences", 1) / spt)
        return GenerateResult(out, cycles, spt, 1.0 / spt, 0.0, int(prefill_cycles), per_layer,
                              self.timing_only,
                              "timing-only" if self.timing_only else "functional",
                              decode_token if self.timing_only else None, note, position,
                              predicted_cycles=self.predicted_cycles(),
                              parts=self._parts_result(timed, n), **more)

    def _per_layer(self, totals: dict, n: int) -> dict:
        """GenerateResult.per_layer: _account's totals over n runs, a run's mean."""
        return {self._layer_name(k): {"compute": int(v[0] // n), "fabric": int(v[1] // n),
                                      "stall": int(v[2] // n)}
                for k, v in sorted(totals.items())}

    def _layer_name(self, layer: int) -> str:
        if layer == KERNEL:
            return "all layers (one kernel)"
        if layer < 0:
            return "embed"
        return "head" if layer >= self.layers else f"layer {layer}"

    def _account(self, totals: dict) -> None:
        """Add the last run's busy / receive-wait / backpressure cycles to each layer's total."""
        r = self.last_result
        for layer in np.unique(self._layer_of_pe):
            pes = self._layer_of_pe == layer
            v = np.array([r.busy[pes].sum(), r.recv_stall[pes].sum(), r.bp_stall[pes].sum()])
            totals[int(layer)] = totals.get(int(layer), 0) + v


def check_capacity(max_context: int, n_prompt: int, n: int, position: int | None = None) -> None:
    """LoadError when a KV cache of max_context positions cannot hold the whole request: the
    prompt's positions and the n - 1 fed back (or, from `position`, n steps). The CLI asks
    before loading a program too (Llama-3-70B's load takes seconds)."""
    first = n_prompt if position is None else position + 1
    last = first + n - 1  # positions the cache holds after the last run
    if last > max_context:
        start = (f"a prompt of {n_prompt}" if position is None
                 else f"position {position}")
        room = max_context - first + 1  # tokens that would still fit
        if room >= 1:
            fix = f"ask for at most {room} token{'s' if room > 1 else ''}"
        elif n >= max_context:
            fix = "ask for fewer tokens"
        elif position is not None:
            fix = f"start at position {max_context - n} at most"
        else:
            fix = f"give a prompt of at most {max_context - n + 1} tokens"
        raise LoadError(f"{start} and {n} tokens need {last} cached positions, but the "
                        f"program was compiled with max_context {max_context}: "
                        f"{fix}, or compile with a larger --max-context")

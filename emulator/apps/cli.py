"""The `wse-emu` command line.

One of the applications (wse_emu.apps, the folder emulator/apps/): they compile models and
run them, so they sit above both the compiler and the emulator, and neither imports them.

Heavy modules (NumPy, Numba, the emulator core) are imported inside the commands that need
them, so `wse-emu --help`, `machines`, `asm`, `disasm` and `info` start fast and never load Numba.
Every user error is one line on stderr and exit code 2; a run that deadlocks, faults or hits
--max-cycles exits 1 with its report.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time

import click

from wse_emu.emulator.host_clock import HostClock, host_text

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


class UserError(click.ClickException):
    exit_code = EXIT_USAGE

    def show(self, file=None):
        clear_status()
        click.echo(f"wse-emu: error: {self.format_message()}", err=True)


_told = [False]  # the interrupt's line has been printed


def _say_interrupted() -> None:
    if not _told[0]:
        _told[0] = True
        clear_status()
        click.echo("wse-emu: interrupted", err=True)
    try:  # the command has unwound: from here on the process only exits, and Python's
        # finalisation would put back the default handler, which a late second Ctrl-C would
        # turn into a death by signal instead of exit code 130
        if _signalled[0]:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass


class Interrupted(click.ClickException):
    """Ctrl-C: one line, exit code 130. Outputs are written only after a run succeeds, each
    to a temporary file renamed into place, so nothing is left half-written."""
    exit_code = EXIT_INTERRUPTED

    def __init__(self):
        super().__init__("interrupted")

    def show(self, file=None):
        _say_interrupted()


_signalled = [False]  # a real SIGINT arrived: the process is on its way out


def _on_sigint(signum, frame):
    # the first Ctrl-C unwinds the command; a second one while it unwinds (a helper thread
    # joining, a temporary file being removed) ends the process at once, without a traceback
    _signalled[0] = True
    signal.signal(signal.SIGINT, _on_second_sigint)
    raise KeyboardInterrupt


def _on_second_sigint(signum, frame):
    _say_interrupted()
    os._exit(EXIT_INTERRUPTED)


_status_shown = [False]  # a progress line is on stderr (a terminal) and must be cleared


def clear_status() -> None:
    if _status_shown[0]:
        _status_shown[0] = False
        click.echo("\r" + " " * 110 + "\r", err=True, nl=False)


def show_status(line: str) -> None:
    """A progress line on stderr, overwritten by the next one (callers check for a terminal)."""
    _status_shown[0] = True
    click.echo(f"\r{line[:110]:<110}", err=True, nl=False)


def user_errors(fn):
    """Turn the project's one-line exceptions into `wse-emu: error: ...` and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from wse_emu.emulator.load import LoadError
        from wse_emu.isa.machine import MachineError
        from wse_emu.isa.compiler.lower import CompileError
        from wse_emu.isa.errors import AsmError, FormatError
        from wse_emu.isa.tensors import TensorError

        try:
            return fn(*args, **kwargs)
        except (AsmError, FormatError, LoadError, MachineError, TensorError, CompileError) as e:
            raise UserError(str(e)) from None
        except KeyboardInterrupt:
            raise Interrupted() from None
        except BrokenPipeError:
            # the reader went away (`wse-emu ... | head`): not the user's mistake; exit quietly
            # with the code the run would have had, stdout can no longer take anything
            sys.stdout = open(os.devnull, "w")
            raise
        except OSError as e:
            raise UserError(f"{e.filename or ''}: {e.strerror}".lstrip(": ")) from None

    return wrapper


def parse_pairs(pairs: tuple[str, ...], what: str) -> dict[str, str]:
    out = {}
    for p in pairs:
        name, sep, value = p.partition("=")
        if not sep or not name or not value:
            raise UserError(f"{what} {p!r} must look like NAME=VALUE")
        if name in out and out[name] != value:  # the same pair twice is harmless
            raise UserError(f"{what} {name} is given twice ({out[name]!r} and {value!r})")
        out[name] = value
    return out


def load_npy(path: str, what: str):
    import numpy as np

    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic != b"\x93NUMPY":  # a text file, a .npz, a pickle: NumPy's own message
            # would talk about pickled data
            raise UserError(f"{what}: {path} is not a .npy file ("
                            f"{'empty' if not magic else 'no NumPy header'}; write one with "
                            f"numpy.save)")
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"{what}: no such file {path}") from None
    except IsADirectoryError:
        raise UserError(f"{what}: {path} is a folder, not a .npy file") from None
    except (ValueError, OSError, EOFError) as e:  # EOFError: a cut-off file
        raise UserError(f"{what}: {path} is not a readable .npy file ({e or 'cut off'})") \
            from None


class OneLineErrors(click.Group):
    """Usage errors (a bad flag or value) as one `wse-emu: error:` line, exit code 2."""

    def main(self, *args, **kwargs):
        _told[0] = _signalled[0] = False
        try:
            previous = signal.signal(signal.SIGINT, _on_sigint)
        except ValueError:  # not the main thread (an embedding application): leave it be
            previous = None
        try:
            return self._main(*args, **kwargs)
        finally:
            # after a Ctrl-C the second-signal handler stays: a second Ctrl-C while the
            # process exits must not end it with a traceback or by the signal
            if previous is not None and not _signalled[0]:
                signal.signal(signal.SIGINT, previous)

    def _main(self, *args, **kwargs):
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.exceptions.NoArgsIsHelpError as e:
            click.echo(e.ctx.get_help())
            sys.exit(0)
        except click.UsageError as e:
            cmd = e.ctx.command_path if e.ctx else "wse-emu"
            click.echo(f"wse-emu: error: {e.format_message()} (see '{cmd} --help')", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except BrokenPipeError:
            sys.exit(1)
        except (click.Abort, KeyboardInterrupt):  # Ctrl-C outside a command's body
            _say_interrupted()
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="wse-emu")
def main():
    """wse-emu: a fast, cycle-approximate emulator of wafer-scale AI processors.

    Write a mesh program (`.wsa`), assemble it to program.bin, run it on an emulated
    wafer-scale mesh and read its numbers, cycles, stalls and congestion.
    """


@main.command()
def machines():
    """List the machine presets and their key figures, then the systems made of them."""
    from wse_emu.isa.machine import load_machine, preset_names, system_of

    names = preset_names()
    for name in names:
        m = load_machine(name)
        click.echo(f"{name:8s} {m.summary()}")
        click.echo(f"{'':8s} {m.description}")
    # the systems part is indented: the first word of every unindented line is a preset
    click.echo("")
    click.echo("  systems: any preset works as NAMExN, N of its chips stacked along y and "
               "joined by its [link] table")
    click.echo("  (e.g. --machine wse3x4, h100x8); the links of each:")
    for name in names:
        chip = load_machine(name)
        if chip.link_bandwidth <= 0:
            click.echo(f"  {name + 'xN':10s} no [link] table: not joinable")
            continue
        n = 4 if chip.kind == "mesh" else 8
        # the links' figures: the part of a system's summary after the chip's
        links = system_of(chip, n).summary().rsplit("; ", 1)[-1]
        unit = "wafers" if chip.kind == "mesh" else "GPUs"
        click.echo(f"  {chip.name + 'x' + str(n):10s} {n} {unit}, {links}")


@main.command()
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="program.bin to write")
@click.option("-D", "defines", multiple=True, metavar="NAME=VALUE", help="override a .param")
@click.option("--data", multiple=True, metavar="NAME=FILE.npy", help="bind a resident .tensor")
@user_errors
def asm(source, output, defines, data):
    """Assemble SOURCE (.wsa) into a program.bin."""
    from wse_emu.isa.asm import assemble_file
    from wse_emu.isa.binfmt import write_program

    writable(output)
    program = assemble_file(source, parse_pairs(defines, "-D"), parse_pairs(data, "--data"))
    write_with(output, lambda p: write_program(program, p))
    click.echo(f"wrote {output}: {len(program.regions)} regions, "
               f"{sum(r.rect.size for r in program.regions):,} PEs", err=True)


@main.command()
@click.argument("binary", type=click.Path(dir_okay=False))
@click.option("-o", "--outdir", default=".", type=click.Path(file_okay=False),
              help="folder for the .wsa and its data files (created if missing)")
@user_errors
def disasm(binary, outdir):
    """Disassemble BINARY into a .wsa (and .npy data files) that reassembles byte-identical."""
    from wse_emu.isa.binfmt import read_program
    from wse_emu.isa.disasm import disassemble

    program = read_program(binary)
    writable(outdir, folder=True)
    stem = os.path.splitext(os.path.basename(binary))[0]

    def write(folder: str) -> str:
        os.makedirs(folder, exist_ok=True)
        return disassemble(program, folder, stem)

    click.echo(write_with(outdir, write))


@main.command()
@click.argument("binary", type=click.Path(dir_okay=False))
@click.option("--all", "all_regions", is_flag=True,  # (24: isa.info.REGION_ROWS, not imported
              # here: isa.info costs ~0.1 s of start-up, which --help must not pay)
              help="List every region (by default the first 24, then a count of the rest).")
@click.option("--machine", "machine_name", metavar="PRESET",
              help="check the program against this machine [default: the one program.bin was "
                   "compiled for, else wse3]")
@user_errors
def info(binary, all_regions, machine_name):
    """Describe BINARY: regions, PEs, SRAM use, colors, symbols, and the machine it runs on."""
    from wse_emu.emulator.load import compiled_for, fit_problems, is_shape_only
    from wse_emu.isa.binfmt import read_program
    from wse_emu.isa.info import REGION_ROWS, describe

    program = read_program(binary)
    machine = resolve_machine(program, machine_name, binary)
    click.echo(describe(program, None if all_regions else REGION_ROWS))
    target = compiled_for(program)
    how = "compiled for it" if target else ("given by --machine" if machine_name else
                                            "the default: an assembled program names none")
    problems = fit_problems(program, machine)
    fits = "fits" if not problems else "DOES NOT FIT: " + "; ".join(problems)
    click.echo(f"machine: {machine.name} ({how}); {fits}")
    if is_shape_only(program):
        click.echo("weights: none (compiled with --shape-only): run it with --timing-only")


def writable(path: str, folder: bool = False) -> None:
    """UserError now, before any work, when `path` could not be written later. Every command
    treats missing folders alike: a file's folder must exist; a folder output (--dump-dir,
    disasm -o, bench -o) is created, inside a folder that exists."""
    import errno
    from pathlib import Path

    p = Path(path).absolute()
    if p.exists() and p.is_dir() != folder:
        raise UserError(f"{path}: is {'not ' if folder else ''}a folder")
    up = p.parent
    if not up.is_dir():
        raise UserError(f"{path}: {os.strerror(errno.ENOENT)} (its folder does not exist; "
                        f"create it first)")
    where = p if folder and p.is_dir() else up
    if not os.access(where, os.W_OK | os.X_OK):
        raise UserError(f"{path}: permission denied (cannot write in {where})")


def save_files(files: dict[str, bytes]) -> None:
    """Write every file or none: each to a temporary file beside it, then all renamed into
    place (a --dump-dir folder is created if it is missing). Errors name the user's path."""
    import tempfile
    from pathlib import Path

    temps: list[tuple[str, str]] = []
    try:
        for path, data in files.items():
            target = Path(path)
            try:
                target.parent.mkdir(exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                           suffix=".tmp")
            except OSError as e:
                raise UserError(f"{path}: {e.strerror}") from None
            temps.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes 0600; a plain open() would not
        for tmp, path in temps:
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise UserError(f"{path}: {e.strerror}") from None
    finally:
        for tmp, _ in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)


def write_with(path: str, write):
    """write(path) (a writer that writes atomically, or a folder's contents), naming the
    user's path in any error (not the writer's temporary file)."""
    try:
        return write(path)
    except OSError as e:
        raise UserError(f"{path}: {e.strerror or e}") from None


def npy_bytes(array) -> bytes:
    import io

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def chatty(as_json: bool) -> bool:
    """Notices and progress go to stderr only for a person at a terminal: never under --json
    or when stdout or stderr is redirected."""
    return not as_json and sys.stderr.isatty() and sys.stdout.isatty()


def run_progress(show: bool, max_cycles: int | None = None):
    """The progress callback of a run. It is passed even when nothing is shown: the core then
    returns to Python every fraction of a second, where Ctrl-C is delivered. With --max-cycles
    the total is known, so it draws a bar."""
    from wse_emu.apps.progress import Reached

    t0, reached = time.perf_counter(), Reached()

    def progress(cycles: int, instructions: int) -> None:
        if show:
            cycles = reached(cycles)
            dt = time.perf_counter() - t0
            bar = ""
            if max_cycles:
                filled = 24 * min(cycles, max_cycles) // max_cycles
                bar = f"[{'#' * filled}{'-' * (24 - filled)}] of --max-cycles {max_cycles:,} "
            show_status(f"  {dt:6.1f} s  cycle {cycles:,} {bar} {instructions:,} instructions")

    return progress


def numba_notice(show: bool):
    """Within the block: say so when Numba starts compiling (the first run of a kind)."""
    from wse_emu.apps.progress import compile_notice

    def write(line: str) -> None:
        clear_status()
        click.echo(line, err=True)

    return compile_notice(show, write)


def resolve_machine(program, name, binary):
    from wse_emu.emulator.load import program_machine

    return program_machine(program, name, binary)


@main.command()
@click.argument("binary", type=click.Path(dir_okay=False))
@click.option("--machine", "machine_name", metavar="PRESET",
              help="preset name or a .toml file [default: the one program.bin was compiled "
                   "for, else wse3]")
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy",
              help="scatter an input symbol before the run")
@click.option("--dump-dir", type=click.Path(file_okay=False), help="write every output as NAME.npy")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False),
              help="write a Chrome/Perfetto trace JSON")
@click.option("--trace-cap", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="most events --trace records (about 200 bytes each)")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="write a PNG heatmap of PE and link utilisation")
@click.option("--max-cycles", type=click.IntRange(min=1), help="stop a run that passes N cycles")
@click.option("--reference", is_flag=True, help="use the pure-Python reference interpreter")
@click.option("--timing-only", is_flag=True,
              help="no SRAM contents: the same cycles, for --shape-only programs at full size")
@user_errors
def run(binary, machine_name, inputs, dump_dir, as_json, trace_path, trace_cap, plot_path,
        max_cycles, reference, timing_only):
    """Run BINARY on an emulated mesh and report cycles, stalls and traffic.

    Output files (--dump-dir, --trace, --plot) are written only when the program halts."""
    from wse_emu.emulator import report
    from wse_emu.emulator.api import engine_run
    from wse_emu.emulator.load import (LoadError, base_dir_of, check_input_names,
                                       check_input_values, check_runnable, load, read_output,
                                       uses_hbm, write_inputs)
    from wse_emu.emulator.result import RUN_HALTED
    from wse_emu.isa.binfmt import read_program

    if timing_only and dump_dir:
        raise UserError("--dump-dir: a --timing-only run computes no output values")
    if timing_only and reference:
        raise UserError("--reference runs functional programs only (drop --timing-only)")
    for out, folder in ((dump_dir, True), (trace_path, False), (plot_path, False)):
        if out:  # refuse before the run, not after it
            writable(out, folder)
    given = parse_pairs(inputs, "--input")
    program = read_program(binary)
    check_runnable(program, timing_only, binary)
    machine = resolve_machine(program, machine_name, binary)
    check_input_names(program, given)
    arrays = {}
    for name, path in given.items():
        arrays[name] = load_npy(path, f"--input {name}")
        try:
            check_input_values(program, next(s for s in program.symbols if s.name == name
                                             and s.kind == "input"), arrays[name])
        except LoadError as e:
            raise UserError(f"--input {name}={path}: {e}") from None
    show = chatty(as_json)
    with numba_notice(show):  # the loader's route builder is compiled too
        try:
            with HostClock() as load_clock:
                loaded = load(program, machine, base_dir=base_dir_of(binary),
                              with_data=not timing_only)
        except LoadError as e:
            if uses_hbm(program) and not machine.hbm_bytes and "--machine" not in str(e):
                raise UserError(f"{e} (run it on an HBM preset, e.g. --machine h100)") \
                    from None
            raise
        write_inputs(loaded, arrays)
        engine = engine_run("reference" if reference else "core")
        result = engine(loaded, max_cycles=max_cycles, trace=bool(trace_path),
                        trace_cap=trace_cap, progress=run_progress(show, max_cycles))
    clear_status()
    d = report.summary(loaded, result)
    d["load_seconds"] = round(load_clock.host_seconds, 6)
    d["compile_seconds"] = round(d["compile_seconds"] + load_clock.compile_seconds, 6)
    d["mode"] = "timing-only" if timing_only else "functional"
    halted = result.outcome == RUN_HALTED
    if trace_path and halted:
        if len(result.trace) >= trace_cap:
            last = max((int(e[3]) for e in result.trace), default=0)
            d["trace_truncated"] = (f"--trace stopped at its cap of {trace_cap:,} events "
                                    f"(cycle {last:,} of {result.cycles:,}): raise it with "
                                    f"--trace-cap, or trace a smaller problem")
    if halted:  # a run that did not halt has no results: no file is written
        files = {}
        if dump_dir:
            names = sorted(s.name for s in program.symbols if s.kind == "output")
            files |= {os.path.join(dump_dir, f"{n}.npy"): npy_bytes(read_output(loaded, n))
                      for n in names}
            d["dumped"] = names
        if trace_path:
            files[trace_path], d["trace_events"] = report.trace_json(loaded, result)
        if plot_path:
            files[plot_path], note = report.utilisation_png(loaded, result)
            if note:
                d["plot_note"] = note
        save_files(files)  # all of them or none
    elif dump_dir or trace_path or plot_path:
        d["not_written"] = "no output file written"
    if as_json:
        click.echo(json.dumps(d, indent=1))
    else:
        click.echo(report.text(d))
        if "problem" in d:
            click.echo(d["problem"])
            for line in d["blocked"]:
                click.echo("  " + line)
    if not as_json:
        for key in ("trace_truncated", "plot_note"):
            if key in d:
                click.echo(f"wse-emu: note: {d[key]}", err=True)
    if "problem" in d and not as_json:
        extra = f" ({d['not_written']})" if "not_written" in d else ""
        click.echo(f"wse-emu: {d['problem']}{extra}", err=True)
    sys.exit(report.EXIT_CODES[result.outcome])


@main.command(name="compile")
@click.argument("model", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="program.bin to write")
@click.option("--machine", "machine_name", default="wse3", show_default=True)
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]),
              help="storage type of the resident weights [default: the checkpoint's (its "
                   "tensors, or config.json's torch_dtype with --shape-only), else fp32]")
@click.option("--max-context", type=click.IntRange(min=1), help="KV-cache positions to reserve")
@click.option("--shape-only", is_flag=True, help="from config.json alone, for timing-only runs")
@click.option("--dump", multiple=True, metavar="PASS",
              help="print the state after a pass: graph, stages, placement, routes")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option("--sequences", type=click.IntRange(min=1), default=1, show_default=True,
              help="independent sequences in flight (wafer mapping): a KV cache each, one "
                   "token of each a step, pipelined through the layers' regions")
@click.option("--prefill", type=click.IntRange(min=2), metavar="B",
              help="a prefill program: a run takes B consecutive prompt tokens of one "
                   "sequence (one KV cache), pipelined through the layers' regions on a wafer, "
                   "batched on a GPU")
@user_errors
def compile_cmd(model, output, machine_name, dtype, max_context, shape_only, dump, as_json,
                sequences, prefill):
    """Compile MODEL (an HF folder with config.json + model.safetensors, its config.json, or a
    *.graph.json)."""
    from wse_emu.isa.machine import load_machine
    from wse_emu.isa.binfmt import write_program
    from wse_emu.isa.compiler.pipeline import compile_model, model_source
    from wse_emu.isa.frontends.hf import checkpoint_dtype

    if prefill and sequences > 1:
        raise UserError("--prefill B and --sequences B are two kinds of program: give one")
    writable(output)
    machine = load_machine(machine_name)
    model = model_source(model)
    if dtype is None:
        dtype = checkpoint_dtype(model, shape_only) or "fp32"
    base = os.path.dirname(os.path.abspath(output))
    program, rep = compile_model(model, machine, dtype=dtype, max_context=max_context,
                                 shape_only=shape_only, dump=tuple(dump), base_dir=base,
                                 sequences=prefill or sequences, prefill=bool(prefill))
    write_with(output, lambda p: write_program(program, p))
    click.echo(json.dumps(rep.to_json(), indent=1) if as_json else str(rep))
    click.echo(f"wrote {output}", err=True)


def parse_ids(text: str, what: str) -> list[int]:
    """Comma-separated token ids, each a non-negative integer; an empty item is a mistake."""
    parts = [t.strip() for t in text.split(",")]
    if parts and parts[-1] == "" and len(parts) > 1:  # one trailing comma is harmless
        parts.pop()
    if not all(p.isdigit() for p in parts):
        bad = next(p for p in parts if not p.isdigit())
        raise UserError(f"{what} {text!r}: {bad!r} is not a token id (non-negative integers "
                        f"separated by commas)")
    return [int(p) for p in parts]


@main.command()
@click.argument("binary", type=click.Path(dir_okay=False))
@click.option("--prompt-ids", metavar="1,2,3", multiple=True,
              help="prompt token ids (required unless --timing-only --position); with several "
                   "sequences give it once (every sequence starts from that prompt) or once a "
                   "sequence, in order")
@click.option("--tokens", type=click.IntRange(min=1), default=8, show_default=True,
              help="tokens to generate (greedy)")
@click.option("--machine", "machine_name", metavar="PRESET",
              help="preset name or a .toml file [default: the one program.bin was compiled "
                   "for]")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--reference", is_flag=True, help="use the pure-Python reference interpreter")
@click.option("--timing-only", is_flag=True,
              help="no weights needed (--shape-only programs): decode-step timing, no token ids")
@click.option("--decode-token", type=click.IntRange(min=0), metavar="ID",
              help="with --timing-only: the token id every decode step is fed (no values, so "
                   "nothing to sample) [default: the last prompt id, else 0]")
@click.option("--position", type=click.IntRange(min=0), metavar="N",
              help="with --timing-only: decode from position N on an empty cache, without "
                   "emulating a prefill (timing never depends on the cached values); a prompt, "
                   "if given, is not run, its last id is the token fed")
@click.option("--sequences", type=click.IntRange(min=1), metavar="B",
              help="independent sequences in flight, each with its own KV cache and position: "
                   "the program must be compiled with `compile --sequences B` (wafer mapping) "
                   "[default: the program's]")
@user_errors
def generate(binary, prompt_ids, tokens, machine_name, as_json, reference, timing_only,
             decode_token, position, sequences):
    """Greedy generation with a compiled decoder, one emulated decode step per token."""
    from wse_emu.emulator.generate import WAITS_NOTE, Generator, check_capacity
    from wse_emu.emulator.load import base_dir_of, check_runnable
    from wse_emu.apps.progress import Bar
    from wse_emu.isa.binfmt import read_program

    prompts = [parse_ids(p, "--prompt-ids") for p in prompt_ids]
    ids = prompts[0] if prompts else []
    if position is not None and not timing_only:
        raise UserError("--position needs --timing-only (a functional run must compute the "
                        "cache of every earlier position: give the prompt instead)")
    if not ids and position is None:
        raise UserError("--prompt-ids needs at least one token id")
    if timing_only and reference:
        raise UserError("--reference runs functional programs only (drop --timing-only)")
    if decode_token is not None and not timing_only:
        raise UserError("--decode-token needs --timing-only (a functional run decodes its own "
                        "greedy tokens)")
    program = read_program(binary)
    check_runnable(program, timing_only, binary)
    compiled = program.model.sequences if program.model is not None else 1
    prefill = compiled if program.model is not None and program.model.prefill else 0
    if prefill and len(prompts) > 1:
        raise UserError(f"{binary} is a prefill program ({prefill} positions of one sequence a "
                        f"run): give --prompt-ids once")
    if sequences is not None and sequences != compiled:
        raise UserError(f"--sequences {sequences}: {binary} was compiled for {compiled} "
                        f"sequence{'s' if compiled > 1 else ''} (compile it with --sequences "
                        f"{sequences})")
    if len(prompts) > 1 and len(prompts) != compiled:
        raise UserError(f"--prompt-ids given {len(prompts)} times for {compiled} "
                        f"sequence{'s' if compiled > 1 else ''}: give it once (every sequence "
                        f"starts from it) or once a sequence")
    machine = resolve_machine(program, machine_name, binary)
    context = (program.meta.get("compiler") or {}).get("max_context")
    if context is not None:  # before the load (Llama-3-70B's takes seconds)
        for p in prompts or [[]]:
            check_capacity(int(context), len(p), tokens, position)
    show = chatty(as_json)
    with numba_notice(show):
        if show:  # (a full-size program takes seconds to load: Llama-3-70B on wse3x4 10 s)
            show_status(f"  loading {program.name} on {machine.name} ...")
        try:
            gen = Generator(program, machine, base_dir=base_dir_of(binary),
                            engine="reference" if reference else "core",
                            timing_only=timing_only)
        finally:
            clear_status()
        longest = max((len(p) for p in prompts), default=0)
        runs = longest if position is None else 1
        if prefill:  # the prompt's runs of B positions that are emulated
            runs = len(gen.prompt_runs(longest if position is None else position + 1))
        bar = Bar(runs + tokens - 1, "emulated runs", show)
        gen.on_cycles = _step_progress(bar, gen.predicted_cycles()) if show else None
        try:
            res = gen.generate(prompts if compiled > 1 and not prefill else ids, tokens,
                               decode_token=decode_token, position=position, on_step=bar.step)
        finally:
            bar.clear()
    if as_json:
        click.echo(json.dumps(res.to_json(), indent=1))
        return
    if compiled > 1 and not prefill:
        _print_sequences(res, gen, tokens, position, timing_only)
        return
    if prefill:
        click.echo(f"prefill         {res.prefill_tokens_per_second:,.0f} prompt tokens/s: "
                   f"{res.note}")
    if timing_only:
        where = (f"from position {position} (no prefill emulated)" if position is not None
                 else f"after {len(ids)} prompt position{'s' if len(ids) > 1 else ''}")
        if prefill:
            where = f"after the prompt of {res.ttft_prompt_lengths[0]} positions"
        click.echo(f"timing only     {tokens} decode steps {where} (no values are computed, so "
                   f"no token is sampled; each step fed token {res.decode_token})")
    else:
        click.echo(f"generated ids   {','.join(map(str, res.generated_ids))}")
    click.echo(f"emulated        {res.seconds_per_token * 1e6:.2f} us/token = "
               f"{res.tokens_per_second:,.0f} tokens/s on {gen.machine.name}")
    click.echo(f"cycles/token    {', '.join(f'{c:,}' for c in res.cycles_per_token)}")
    if res.predicted_cycles:
        mean = sum(res.cycles_per_token) / len(res.cycles_per_token)
        click.echo(f"predicted       {res.predicted_cycles:,} cycles/token by the compiler's cost "
                   f"model (emulated / predicted {mean / res.predicted_cycles:.2f})")
    _print_host(res)
    if res.parts:
        click.echo("per part        predicted / emulated cycles a step (emulated: when the part's "
                   "last PE halts, minus the part before)")
        for part, c in res.parts.items():
            click.echo(f"  {part:<24}  {c['predicted']:>10,} {c['emulated']:>10,}")
    _print_ttft(res)
    click.echo("per token       compute / waiting for wavelets / backpressure cycles (summed over "
               "PEs)\n                " + WAITS_NOTE)
    for part, c in res.per_layer.items():
        click.echo(f"  {part:<12}  {c['compute']:>12,} {c['fabric']:>12,} {c['stall']:>10,}")


def _step_progress(bar, predicted: int):
    """generate's progress inside a run (a step of Llama-3-70B takes minutes of host time): the
    cycle the run has reached, beside the compiler's predicted cycles of a step."""
    from wse_emu.apps.progress import Reached

    of = f" of ~{predicted:,} predicted" if predicted else ""
    reached = Reached()

    def within(cycles: int, instructions: int) -> None:
        bar.step(bar.done, f"(run {bar.done + 1} at cycle {reached(cycles, bar.done):,}{of})")
    return within


def _print_host(res) -> None:
    """generate's host time, the program's load before the runs apart."""
    load = f" (after {res.load_seconds:.2f} s loading the program)"
    click.echo(f"host            {host_text(res.host_seconds, res.compile_seconds, what=load)}")


def _print_ttft(res) -> None:
    """The time to first token of each distinct prompt length of a generate result."""
    seen = {}
    for length, t in zip(res.ttft_prompt_lengths, res.ttft_seconds):
        seen.setdefault(length, t)
    for length, t in seen.items():
        how = ("emulated" if res.start_position is None else
               f"{length} runs of the measured step's cycles")
        if res.prefill_positions:
            how = f"in runs of {res.prefill_positions} positions"
        click.echo(f"first token     {t * 1e3:.3f} ms for a prompt of {length} token"
                   f"{'s' if length > 1 else ''} ({how})")


def _print_sequences(res, gen, tokens: int, position, timing_only: bool) -> None:
    """generate's text output for a program of several sequences in flight."""
    B = res.sequences
    if timing_only:
        where = (f"from position {position} (no prefill emulated)" if position is not None
                 else "after the prompts")
        click.echo(f"timing only     {B} sequences x {tokens} decode steps {where} (no values "
                   f"are computed; every sequence fed token {res.decode_token})")
    else:
        for s, ids in enumerate(res.ids_per_sequence):
            click.echo(f"sequence {s:<6} {','.join(map(str, ids))}")
    mean = sum(res.cycles_per_token) / len(res.cycles_per_token)
    click.echo(f"emulated        {mean:,.0f} cycles a step of {B} sequences "
               f"({res.seconds_per_token * 1e6:.2f} us) on {gen.machine.name}")
    click.echo(f"tokens/s        {res.tokens_per_second:,.0f} a sequence, "
               f"{res.aggregate_tokens_per_second:,.0f} aggregate ({B} sequences, a token of "
               f"each a step)")
    if res.predicted_cycles:
        click.echo(f"predicted       {res.predicted_cycles:,} cycles a step by the compiler's cost "
                   f"model, pipelined over the sequences (emulated / predicted "
                   f"{mean / res.predicted_cycles:.2f})")
    click.echo(f"cycles/step     {', '.join(f'{c:,}' for c in res.cycles_per_token)}")
    _print_ttft(res)
    _print_host(res)


@main.command()
@click.option("--machine", "machine_name", default="wse3", show_default=True,
              help="the wafer-scale preset (mesh) to run on; the demo compares it with h100")
@user_errors
def demo(machine_name):
    """The built-in demo (see README)."""
    from wse_emu.apps.demo import run_demo

    sys.exit(run_demo(machine_name, show=chatty(False)))


def bench_progress():
    """Progress of `wse-emu bench` on stderr: a bar on a terminal, a line a phase otherwise."""
    t0, tty, last = time.perf_counter(), sys.stderr.isatty(), [""]

    def show(done: int, total: int, label: str, transient: bool = False) -> None:
        # transient: the cycle a step has reached, redrawn on a terminal, not a log line
        if (not label or transient) and not tty:
            return
        last[0] = label or last[0]  # (a transient label too: the next one replaces it)
        elapsed = time.perf_counter() - t0
        if tty:
            filled = 24 * done // max(total, 1)
            click.echo(f"\r[{'#' * filled}{'-' * (24 - filled)}] {done}/{total} {elapsed:6.0f} s "
                       f"{last[0][:70]:<70}", err=True, nl=False)
        else:
            click.echo(f"[{done}/{total}] {elapsed:6.1f} s  {label}", err=True)

    return show


def _names(values: tuple[str, ...]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


@main.command()
@click.option("--models", multiple=True, metavar="NAME|CONFIG",
              help="built-in model (gpt2-small, gpt2-medium, gpt2-xl, llama-3-8b; "
                   "llama-3-70b by name only: it needs a system such as wse3x4 or h100x8) or "
                   "an HF config.json (file or folder); repeat or separate with commas "
                   "[default: the built-in models but llama-3-70b]")
@click.option("--machines", multiple=True, metavar="PRESET",
              help="machine presets, systems (NAMExN: wse3x4, h100x8) or .toml files; repeat "
                   "or separate with commas [default: wse3,h100]")
@click.option("-o", "--outdir", default="bench-results", show_default=True,
              type=click.Path(file_okay=False), help="folder for bench.md, bench.json, PNGs")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="bf16",
              show_default=True, help="storage type of the weights")
@click.option("--max-context", type=click.IntRange(min=1),
              help="KV-cache positions [default: the largest of 1024, 256, 64, 32, 16 that fits]")
@click.option("--position", type=click.IntRange(min=0),
              help="decode position [default: the last the smallest context of a model holds]")
@click.option("--sequences", default="1", show_default=True, metavar="B[,B...]",
              help="sequences in flight, one run of every case at each B (e.g. 1,2,4,8; a KV "
                   "cache each, a token of each a step): tokens/s a sequence and aggregate, "
                   "and throughput_curve.png; a machine whose compiler cannot batch B says so")
@click.option("--prefill", type=click.IntRange(min=2), metavar="B",
              help="the time to first token from a prefill program of B prompt positions a "
                   "run (compile --prefill B; B / 2, B / 4 ... where B does not compile) on "
                   "every machine [default: on the wafer mapping, the prompt fed a token a "
                   "step; none on HBM machines]")
@user_errors
def bench(models, machines, outdir, dtype, max_context, position, sequences, prefill):
    """Decode of every model on every machine (shape-only, timing-only): one sequence, or
    --sequences B in flight.

    Writes OUTDIR/bench.md (the table), bench.json, tokens_per_second.png,
    throughput_curve.png (per-user against aggregate tokens/s) and a roofline PNG a machine;
    prints the table. Each result shows the physics floors it must respect; a result under
    one is an emulator bug (exit code 1).
    """
    from wse_emu.apps.benchreport import markdown, violations, write_outputs
    from wse_emu.apps.benchsuite import (DEFAULT_MACHINES, DEFAULT_MODELS, BenchError,
                                             parse_sequences, run_suite)

    try:
        sequences = parse_sequences(sequences)
    except BenchError as e:
        raise UserError(str(e)) from None
    models = _names(models) or list(DEFAULT_MODELS)
    machines = _names(machines) or list(DEFAULT_MACHINES)
    command = (f"wse-emu bench --models {','.join(models)} --machines {','.join(machines)} "
               f"--dtype {dtype} -o {outdir}")
    if max_context:
        command += f" --max-context {max_context}"
    if position is not None:
        command += f" --position {position}"
    if sequences != [1]:
        command += f" --sequences {','.join(map(str, sequences))}"
    if prefill:
        command += f" --prefill {prefill}"
    writable(outdir, folder=True)
    progress = bench_progress()
    try:
        with numba_notice(sys.stderr.isatty()):
            suite = run_suite(models, machines, dtype=dtype, max_context=max_context,
                              position=position, progress=progress, command=command,
                              sequences=sequences, prefill=prefill or 0)
    except BenchError as e:
        raise UserError(str(e)) from None
    finally:
        if sys.stderr.isatty():
            click.echo("\r" + " " * 110 + "\r", err=True, nl=False)
    click.echo(markdown(suite))
    if not any(c["status"] == "ok" for c in suite["cases"]):
        # empty charts would look like results: say so and write nothing
        click.echo(f"wse-emu: no case ran (the table says why), so nothing was written to "
                   f"{outdir}", err=True)
        sys.exit(1)
    files = write_with(outdir, lambda p: write_outputs(suite, p))
    click.echo(f"wrote {', '.join(str(f) for f in files)}", err=True)
    bad = violations(suite)
    for line in bad:
        click.echo(f"wse-emu: PHYSICS VIOLATION (an emulator bug): {line}", err=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

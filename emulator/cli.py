"""The `wse-emu` command line.

Heavy modules (NumPy, Numba, the emulator core) are imported inside the commands that need
them, so `wse-emu --help`, `machines`, `asm`, `disasm` and `info` start fast and never load Numba.
Every user error is one line on stderr and exit code 2; a run that deadlocks, faults or hits
--max-cycles exits 1 with its report.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

import click

EXIT_USAGE = 2


class UserError(click.ClickException):
    exit_code = EXIT_USAGE

    def show(self, file=None):
        click.echo(f"wse-emu: error: {self.format_message()}", err=True)


def user_errors(fn):
    """Turn the project's one-line exceptions into `wse-emu: error: ...` and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from wse_emu.emulator.load import LoadError
        from wse_emu.emulator.machine import MachineError
        from wse_emu.isa.compiler.lower import CompileError
        from wse_emu.isa.errors import AsmError, FormatError
        from wse_emu.isa.tensors import TensorError

        try:
            return fn(*args, **kwargs)
        except (AsmError, FormatError, LoadError, MachineError, TensorError, CompileError) as e:
            raise UserError(str(e)) from None
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
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"{what}: no such file {path}") from None
    except (ValueError, OSError, EOFError) as e:  # EOFError: an empty file
        raise UserError(f"{what}: {path} is not a .npy file ({e or 'empty'})") from None


class OneLineErrors(click.Group):
    """Usage errors (a bad flag or value) as one `wse-emu: error:` line, exit code 2."""

    def main(self, *args, **kwargs):
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
        except click.Abort:
            click.echo("wse-emu: aborted", err=True)
            sys.exit(1)


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="wse-emu")
def main():
    """wse-emu: a fast, cycle-approximate emulator of wafer-scale AI processors.

    Write a mesh program (`.wsa`), assemble it to program.bin, run it on an emulated
    wafer-scale mesh and read its numbers, cycles, stalls and congestion.
    """


@main.command()
def machines():
    """List the machine presets and their key figures."""
    from wse_emu.emulator.machine import load_machine, preset_names

    for name in preset_names():
        m = load_machine(name)
        click.echo(f"{name:8s} {m.summary()}")
        click.echo(f"{'':8s} {m.description}")


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

    program = assemble_file(source, parse_pairs(defines, "-D"), parse_pairs(data, "--data"))
    write_program(program, output)
    click.echo(f"wrote {output}: {len(program.regions)} regions, "
               f"{sum(r.rect.size for r in program.regions):,} PEs", err=True)


@main.command()
@click.argument("binary", type=click.Path(dir_okay=False))
@click.option("-o", "--outdir", default=".", type=click.Path(file_okay=False),
              help="folder for the .wsa and its data files")
@user_errors
def disasm(binary, outdir):
    """Disassemble BINARY into a .wsa (and .npy data files) that reassembles byte-identical."""
    from wse_emu.isa.binfmt import read_program
    from wse_emu.isa.disasm import disassemble

    program = read_program(binary)
    os.makedirs(outdir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(binary))[0]
    click.echo(disassemble(program, outdir, stem))


@main.command()
@click.argument("binary", type=click.Path(dir_okay=False))
@click.option("--all", "all_regions", is_flag=True,  # (24: isa.info.REGION_ROWS, not imported
              # here: isa.info costs ~0.1 s of start-up, which --help must not pay)
              help="List every region (by default the first 24, then a count of the rest).")
@user_errors
def info(binary, all_regions):
    """Describe BINARY: regions, PEs, SRAM use, colors, symbols."""
    from wse_emu.isa.binfmt import read_program
    from wse_emu.isa.info import REGION_ROWS, describe

    click.echo(describe(read_program(binary), None if all_regions else REGION_ROWS))


def progress_printer():
    """A progress callback for long runs (stderr, only when it is a terminal)."""
    if not sys.stderr.isatty():
        return None
    t0 = time.perf_counter()

    def show(cycles: int, instructions: int) -> None:
        dt = time.perf_counter() - t0
        click.echo(f"\r  {dt:6.1f} s  cycle {cycles:,}  {instructions:,} instructions",
                   err=True, nl=False)

    return show


@main.command()
@click.argument("binary", type=click.Path(dir_okay=False))
@click.option("--machine", "machine_name", default="wse3", show_default=True,
              help="preset name or a .toml file")
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy",
              help="scatter an input symbol before the run")
@click.option("--dump-dir", type=click.Path(file_okay=False), help="write every output as NAME.npy")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False),
              help="write a Chrome/Perfetto trace JSON")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="write a PNG heatmap of PE and link utilisation")
@click.option("--max-cycles", type=click.IntRange(min=1), help="stop a run that passes N cycles")
@click.option("--reference", is_flag=True, help="use the pure-Python reference interpreter")
@click.option("--timing-only", is_flag=True,
              help="no SRAM contents: the same cycles, for --shape-only programs at full size")
@user_errors
def run(binary, machine_name, inputs, dump_dir, as_json, trace_path, plot_path, max_cycles,
        reference, timing_only):
    """Run BINARY on an emulated mesh and report cycles, stalls and traffic."""
    from wse_emu.emulator import report
    from wse_emu.emulator.api import engine_run
    from wse_emu.emulator.load import base_dir_of, check_input_names, load, read_output, write_inputs
    from wse_emu.emulator.machine import load_machine
    from wse_emu.isa.binfmt import read_program
    from wse_emu.isa.fileio import check_folder

    if timing_only and dump_dir:
        raise UserError("--dump-dir: a --timing-only run computes no output values")
    if timing_only and reference:
        raise UserError("--reference runs functional programs only (drop --timing-only)")
    for out in (trace_path, plot_path):  # refuse before the run, not after it
        if out:
            check_folder(out)
    program = read_program(binary)
    machine = load_machine(machine_name)
    loaded = load(program, machine, base_dir=base_dir_of(binary), with_data=not timing_only)
    given = parse_pairs(inputs, "--input")
    check_input_names(program, given)
    write_inputs(loaded, {name: load_npy(path, f"--input {name}") for name, path in given.items()})
    engine = engine_run("reference" if reference else "core")
    result = engine(loaded, max_cycles=max_cycles, trace=bool(trace_path),
                    progress=progress_printer())
    if sys.stderr.isatty():
        click.echo("\r" + " " * 70 + "\r", err=True, nl=False)
    d = report.summary(loaded, result)
    d["mode"] = "timing-only" if timing_only else "functional"
    if dump_dir:
        import numpy as np

        os.makedirs(dump_dir, exist_ok=True)
        for s in program.symbols:
            if s.kind == "output":
                np.save(os.path.join(dump_dir, f"{s.name}.npy"), read_output(loaded, s.name))
        d["dumped"] = sorted(s.name for s in program.symbols if s.kind == "output")
    if trace_path:
        d["trace_events"] = report.write_trace(trace_path, loaded, result)
    if plot_path:
        report.plot_utilisation(plot_path, loaded, result)
    if as_json:
        click.echo(json.dumps(d, indent=1))
    else:
        click.echo(report.text(d))
        if "problem" in d:
            click.echo(d["problem"])
            for line in d["blocked"]:
                click.echo("  " + line)
    if "problem" in d and not as_json:
        click.echo(f"wse-emu: {d['problem']}", err=True)
    sys.exit(report.EXIT_CODES[result.outcome])


@main.command(name="compile")
@click.argument("model", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="program.bin to write")
@click.option("--machine", "machine_name", default="wse3", show_default=True)
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32",
              show_default=True, help="storage type of the resident weights")
@click.option("--max-context", type=click.IntRange(min=1), help="KV-cache positions to reserve")
@click.option("--shape-only", is_flag=True, help="from config.json alone, for timing-only runs")
@click.option("--dump", multiple=True, metavar="PASS",
              help="print the state after a pass: graph, stages, placement, routes")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@user_errors
def compile_cmd(model, output, machine_name, dtype, max_context, shape_only, dump, as_json):
    """Compile MODEL (an HF folder with config.json + model.safetensors, or a *.graph.json)."""
    from wse_emu.emulator.machine import load_machine
    from wse_emu.isa.binfmt import write_program
    from wse_emu.isa.compiler.pipeline import compile_model

    machine = load_machine(machine_name)
    base = os.path.dirname(os.path.abspath(output))
    program, rep = compile_model(model, machine, dtype=dtype, max_context=max_context,
                                 shape_only=shape_only, dump=tuple(dump), base_dir=base)
    write_program(program, output)
    click.echo(json.dumps(rep.to_json(), indent=1) if as_json else str(rep))
    click.echo(f"wrote {output}", err=True)


@main.command()
@click.argument("binary", type=click.Path(dir_okay=False))
@click.option("--prompt-ids", required=True, metavar="1,2,3", help="prompt token ids")
@click.option("--tokens", type=click.IntRange(min=1), default=8, show_default=True,
              help="tokens to generate (greedy)")
@click.option("--machine", "machine_name", default="wse3", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--reference", is_flag=True, help="use the pure-Python reference interpreter")
@click.option("--timing-only", is_flag=True,
              help="no weights needed (--shape-only programs): decode-step timing, no token ids")
@click.option("--decode-token", type=click.IntRange(min=0), metavar="ID",
              help="with --timing-only: the token id every decode step is fed (no values, so "
                   "nothing to sample) [default: the last prompt id]")
@user_errors
def generate(binary, prompt_ids, tokens, machine_name, as_json, reference, timing_only,
             decode_token):
    """Greedy generation with a compiled decoder, one emulated decode step per token."""
    from wse_emu.emulator.generate import Generator
    from wse_emu.emulator.load import base_dir_of
    from wse_emu.isa.binfmt import read_program

    try:
        ids = [int(t) for t in prompt_ids.split(",") if t.strip()]
    except ValueError:
        raise UserError(f"--prompt-ids {prompt_ids!r} must be integers separated by commas")
    if not ids:
        raise UserError("--prompt-ids needs at least one token id")
    if timing_only and reference:
        raise UserError("--reference runs functional programs only (drop --timing-only)")
    if decode_token is not None and not timing_only:
        raise UserError("--decode-token needs --timing-only (a functional run decodes its own "
                        "greedy tokens)")
    gen = Generator(read_program(binary), machine_name, base_dir=base_dir_of(binary),
                    engine="reference" if reference else "core", timing_only=timing_only)
    res = gen.generate(ids, tokens, decode_token=decode_token)
    if as_json:
        click.echo(json.dumps(res.to_json(), indent=1))
        return
    if timing_only:
        click.echo(f"timing only     {tokens} decode steps after {len(ids)} prompt positions "
                   f"(no values are computed, so no token is sampled; each step fed token "
                   f"{res.decode_token})")
    else:
        click.echo(f"generated ids   {','.join(map(str, res.generated_ids))}")
    click.echo(f"emulated        {res.seconds_per_token * 1e6:.2f} us/token = "
               f"{res.tokens_per_second:,.0f} tokens/s on {gen.machine.name}")
    click.echo(f"cycles/token    {', '.join(f'{c:,}' for c in res.cycles_per_token)}")
    click.echo(f"host            {res.host_seconds:.2f} s")
    click.echo("per token       compute / waiting for wavelets / backpressure cycles (summed over PEs)")
    for part, c in res.per_layer.items():
        click.echo(f"  {part:<12}  {c['compute']:>12,} {c['fabric']:>12,} {c['stall']:>10,}")


@main.command()
@click.option("--machine", "machine_name", default="wse3", show_default=True)
@user_errors
def demo(machine_name):
    """The built-in demo (see README)."""
    from wse_emu.emulator.demo import run_demo

    sys.exit(run_demo(machine_name))



def bench_progress():
    """Progress of `wse-emu bench` on stderr: a bar on a terminal, a line a phase otherwise."""
    t0, tty, last = time.perf_counter(), sys.stderr.isatty(), [""]

    def show(done: int, total: int, label: str) -> None:
        if not label and not tty:
            return
        last[0] = label or last[0]
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
              help="built-in model (gpt2-small, gpt2-medium, gpt2-xl, llama-3-8b) or an HF "
                   "config.json (file or folder); repeat or separate with commas [default: all "
                   "built-in]")
@click.option("--machines", multiple=True, metavar="PRESET",
              help="machine presets or .toml files; repeat or separate with commas "
                   "[default: wse3,h100]")
@click.option("-o", "--outdir", default="bench-results", show_default=True,
              type=click.Path(file_okay=False), help="folder for bench.md, bench.json, PNGs")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="bf16",
              show_default=True, help="storage type of the weights")
@click.option("--max-context", type=click.IntRange(min=1),
              help="KV-cache positions [default: the largest of 1024, 256, 64, 32, 16 that fits]")
@click.option("--position", type=click.IntRange(min=0),
              help="decode position [default: the last the smallest context of a model holds]")
@user_errors
def bench(models, machines, outdir, dtype, max_context, position):
    """Batch-1 decode of every model on every machine (shape-only, timing-only).

    Writes OUTDIR/bench.md (the table), bench.json, tokens_per_second.png and a roofline PNG a
    machine; prints the table. Each result shows the physics floors it must respect; a result
    under one is an emulator bug (exit code 1).
    """
    from wse_emu.emulator.benchreport import markdown, violations, write_outputs
    from wse_emu.emulator.benchsuite import DEFAULT_MACHINES, DEFAULT_MODELS, BenchError, run_suite

    models = _names(models) or list(DEFAULT_MODELS)
    machines = _names(machines) or list(DEFAULT_MACHINES)
    command = (f"wse-emu bench --models {','.join(models)} --machines {','.join(machines)} "
               f"--dtype {dtype} -o {outdir}")
    if max_context:
        command += f" --max-context {max_context}"
    if position is not None:
        command += f" --position {position}"
    progress = bench_progress()
    try:
        suite = run_suite(models, machines, dtype=dtype, max_context=max_context,
                          position=position, progress=progress, command=command)
    except BenchError as e:
        raise UserError(str(e)) from None
    finally:
        if sys.stderr.isatty():
            click.echo("\r" + " " * 110 + "\r", err=True, nl=False)
    files = write_outputs(suite, outdir)
    click.echo(markdown(suite))
    click.echo(f"wrote {', '.join(str(f) for f in files)}", err=True)
    bad = violations(suite)
    for line in bad:
        click.echo(f"wse-emu: PHYSICS VIOLATION (an emulator bug): {line}", err=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

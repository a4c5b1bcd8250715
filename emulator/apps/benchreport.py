"""The outputs of `wse-emu bench` (apps.benchsuite): the Markdown table, the comparison of
resident-weight and HBM-streaming machines, the JSON file and the PNG plots (tokens/s of every
model on every machine; per-user against aggregate tokens/s over the sequences in flight, the
throughput curve; a roofline of each machine with the models placed on it).

Everything here reads the JSON-able suite that `benchsuite.run_suite` returns, so a saved
bench.json can be re-rendered. matplotlib is imported only when a plot is drawn.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from wse_emu.apps.benchsuite import CONTEXT_LADDER


PARTS = {"vector": "norms and residual adds", "gemv": "layer matrix-vector products",
         "attn": "attention", "head": "LM head", "embed": "embedding"}


def violations(suite: dict) -> list[str]:
    """One line per physics check a case failed (each one an emulator bug)."""
    out = []
    for c in suite["cases"]:
        t = c["figures"].get("seconds_per_token")
        for check in c["checks"]:
            if not check["ok"]:
                out.append(f"{_label(c)}: {fmt_seconds(t)} a token is under "
                           f"the {check['name']} floor of {fmt_seconds(check['floor_seconds'])}")
        for check in c["figures"].get("ttft_floors", []):
            if not check["ok"]:
                out.append(f"{_label(c)}: a first token in "
                           f"{fmt_seconds(c['figures']['ttft_seconds'])} is under the prefill's "
                           f"{check['name']} floor of {fmt_seconds(check['floor_seconds'])}")
    return out


def _scaled(value, units, small: str) -> str:
    """value in the first of (unit, scale) it reaches, 3 significant digits; `small` (already
    formatted) when it is below them all; None is "-"."""
    if value is None:
        return "-"
    for unit, scale in units:
        # compared as shown: 0.9996 s is "1 s", not "1e+03 ms"
        if float(f"{value / scale:.3g}") >= 1:
            return f"{value / scale:.3g} {unit}"
    return small


def fmt_seconds(s) -> str:
    return _scaled(s, (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)), f"{s * 1e9:.3g} ns"
                   if s is not None else "")


def fmt_bytes(n) -> str:
    return _scaled(n, (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)),
                   f"{int(n)} B" if n is not None else "")


def fmt_fraction(x) -> str:
    if x is None:
        return "-"
    return f"{x * 100:.2g} %" if x < 1e-4 else f"{x * 100:.2f} %"


def _share(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 else f"{x:.1%}"


def _floors_cell(case: dict) -> str:
    parts = [f"{c['name']} {fmt_seconds(c['floor_seconds'])}" for c in case["checks"]]
    bad = [c["name"] for c in case["checks"] if not c["ok"]]
    verdict = f"**VIOLATION ({', '.join(bad)}): emulator bug**" if bad else "ok"
    return f"{', '.join(parts)}: {verdict}"


def _seqs(c: dict) -> int:
    return int(c.get("sequences", 1) or 1)


def _label(c: dict) -> str:
    """"model on machine", with B when the case ran several sequences."""
    b = _seqs(c)
    return f"{c['model']} on {c['machine']}" + (f", B = {b}" if b > 1 else "")


def _sequence_list(meta: dict) -> list[int]:
    s = meta.get("sequences", 1)
    return [s] if isinstance(s, int) else list(s)


def markdown(suite: dict) -> str:
    """The suite as Markdown: results with their physics floors, the throughput curve's table,
    comparison, host cost."""
    meta, cases = suite["meta"], suite["cases"]
    bs = _sequence_list(meta)
    flight = ("batch 1" if bs == [1] else f"B = {', '.join(map(str, bs))} sequences in flight "
              f"(tokens/s a sequence and aggregate)")
    lines = [f"Decode, {flight}, weights {meta['dtype']}, shape-only compile + timing-only run "
             f"({meta['date']}, {meta['host']})", ""]
    if meta.get("command"):
        lines += [f"Command: `{meta['command']}`", ""]
    lines += ["| model | machine | B | context | position | tokens/s a sequence | aggregate "
              "tokens/s | time/step | time/layer | HBM bytes/step | fabric bytes/step | "
              "SIMD util | HBM util | hottest link | floors (time/step must be >=) |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    notes = []
    for c in cases:
        ctx = c["max_context"] or "-"
        pos = "-" if c["position"] is None else c["position"]
        if c["status"] != "ok":
            notes.append(f"{_label(c)}: {c['reason']}")
            lines.append(f"| {c['model']} | {c['machine']} | {_seqs(c)} | {ctx} | {pos} | "
                         f"{c['status']} [{len(notes)}] | | | | | | | | | |")
            continue
        f = c["figures"]
        layer = ("" if f["layer_time_measured"] else "~") + fmt_seconds(f["seconds_per_layer"])
        hbm = f["hbm_read_bytes_per_token"] + f["hbm_write_bytes_per_token"]
        agg = f.get("aggregate_tokens_per_second", f["tokens_per_second"])
        lines.append(
            f"| {c['model']} | {c['machine']} | {_seqs(c)} | {ctx} | {pos} | "
            f"{f['tokens_per_second']:,.0f} | {agg:,.0f} | "
            f"{fmt_seconds(f['seconds_per_token'])} | {layer} | {fmt_bytes(hbm)} | "
            f"{fmt_bytes(f['fabric_link_bytes_per_token'])} | "
            f"{fmt_fraction(f['simd_utilisation'])} | {fmt_fraction(f['hbm_utilisation'])} | "
            f"{fmt_fraction(f['link_utilisation_max'])} | {_floors_cell(c)} |")
    if notes:
        lines += [""] + [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    lines += curve_table(cases)
    said = set()
    for c in cases:  # the first token's wait (a prefill program's: once a model and machine)
        f = c["figures"]
        if "prefill_positions" in f or "ttft_reason" in f:
            if (c["model"], c["machine"]) in said:
                continue
            said.add((c["model"], c["machine"]))
        if c["status"] == "ok" and "ttft_seconds" in f:
            floors = "".join(
                f"; floor {x['name']} {fmt_seconds(x['floor_seconds'])}"
                + ("" if x["ok"] else " **VIOLATION: emulator bug**")
                for x in f.get("ttft_floors", []))
            lines.append(f"- {_label(c)}: first token of a {f['ttft_prompt_tokens']}-token "
                         f"prompt {fmt_seconds(f['ttft_seconds'])} "
                         f"({f.get('ttft_method', 'fed a token a step')}{floors})")
        elif c["status"] == "ok" and "ttft_reason" in f:
            lines.append(f"- {_label(c)}: no first-token time: {f['ttft_reason']}")
    lines += ["", "Columns: B = sequences in flight (a step carries one token of each); "
              "context = the largest KV-cache length of "
              f"{', '.join(map(str, CONTEXT_LADDER))} that "
              "compiles for the machine; position = the decoded position (the same on every "
              "machine and B of a model); tokens/s a sequence = 1 / time a step, aggregate = B "
              "x that; fabric bytes = wavelet-hops x 4 B (every link a wavelet "
              "crosses); time/layer measured on mesh programs, ~ = time/step / layers on HBM "
              "programs; SIMD util = FLOPs / (peak x time); HBM util = bytes / (peak bandwidth x "
              "time); hottest link = its wavelets / cycles. Floors: HBM weights = weight bytes / "
              "peak HBM bandwidth (all GPUs), HBM moved = reported HBM bytes / that peak, HBM "
              "per GPU (a GPU node) = one GPU's weight bytes / one GPU's bandwidth, SIMD = "
              "FLOPs of the step / peak, link = hottest fabric link's wavelets / clock, system "
              "links (a system) = the bytes over the busiest pipe between two chips / the "
              "link's bandwidth.", "", f"Batch: {meta['batch_sweep']}."]
    predicted = []
    for c in cases:
        f = c["figures"] if c["status"] == "ok" else {}
        if f.get("predicted_cycles_per_token"):
            want, got = f["predicted_cycles_per_token"], f["cycles_per_token"]
            predicted.append(f"{_label(c)}: predicted {want:,} cycles, "
                             f"emulated {got:,} (emulated / predicted {got / want:.2f})")
    if predicted:
        lines += ["", "The compiler's cost model beside the emulator (cycles a token):", ""] + \
            [f"- {p}" for p in predicted]
    paths = [f"{_label(c)}: " + ", ".join(
                 f"{PARTS.get(k, k)} {_share(v / c['figures']['seconds_per_token'])}"
                 for k, v in sorted(c["figures"]["critical_path_seconds"].items(),
                                    key=lambda kv: -kv[1]))
             for c in cases if c["status"] == "ok" and c["figures"].get("critical_path_seconds")]
    if paths:
        lines += ["", "Where a mesh token's time goes (shares of the critical path, by kind of "
                  "stage):", ""] + [f"- {p}" for p in paths]
    comparison = compare(cases, {m["name"]: m for m in meta["machines"]})
    if comparison:
        lines += ["", "Resident weights vs HBM streaming:", ""] + [f"- {t}" for t in comparison]
    lines += ["", "Host cost per case (this machine):", "",
              "| model | machine | B | compile | load | decode step | case total | "
              "peak RSS so far |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for c in cases:
        h = c["host"]
        lines.append(f"| {c['model']} | {c['machine']} | {_seqs(c)} | "
                     + " | ".join(fmt_seconds(h.get(k)) for k in
                                  ("compile_seconds", "load_seconds", "step_seconds",
                                   "case_seconds"))
                     + f" | {fmt_bytes(h.get('peak_rss_bytes'))} |")
    lines += ["", f"Whole suite: {fmt_seconds(meta['host_seconds'])} of host time, peak RSS "
              f"{fmt_bytes(meta['peak_rss_bytes'])}."]
    return "\n".join(lines) + "\n"


def curve_table(cases: list[dict]) -> list[str]:
    """Markdown lines: per model and machine, tokens/s a sequence and aggregate at every B, and
    both against B = 1 (the table behind throughput_curve.png); [] when every case has B 1."""
    if all(_seqs(c) == 1 for c in cases):
        return []
    lines = ["", "Per-user against aggregate tokens/s (the throughput curve):", "",
             "| model | machine | B | tokens/s a sequence | aggregate tokens/s | a sequence vs "
             "B = 1 | aggregate vs B = 1 |", "|---|---|---:|---:|---:|---:|---:|"]
    for (model, machine), group in _curves(cases).items():
        one = next((c["figures"] for c in group if c["status"] == "ok" and _seqs(c) == 1), None)
        for c in group:
            if c["status"] != "ok":
                lines.append(f"| {model} | {machine} | {_seqs(c)} | {c['status']} | | | |")
                continue
            f = c["figures"]
            agg = f["aggregate_tokens_per_second"]
            rel = (f"{f['tokens_per_second'] / one['tokens_per_second']:.2f}x",
                   f"{agg / one['aggregate_tokens_per_second']:.2f}x") if one else ("-", "-")
            lines.append(f"| {model} | {machine} | {_seqs(c)} | {f['tokens_per_second']:,.0f} | "
                         f"{agg:,.0f} | {rel[0]} | {rel[1]} |")
    return lines


def _curves(cases: list[dict]) -> dict:
    """(model, machine) -> its cases in ascending B."""
    out: dict = {}
    for c in cases:
        out.setdefault((c["model"], c["machine"]), []).append(c)
    return {k: sorted(v, key=_seqs) for k, v in out.items()}


def compare(cases: list[dict], machines: dict) -> list[str]:
    """Per model and B, every resident-weight (mesh) result against every HBM result: the
    ratio of tokens/s and why (bytes per step, bandwidth, where each machine's time goes; a
    step is a token of each of the B sequences)."""
    out = []
    by_model: dict[tuple, list[dict]] = {}
    for c in cases:
        if c["status"] == "ok":
            by_model.setdefault((c["model"], _seqs(c)), []).append(c)
    for (model, b), done in by_model.items():
        step = "step" if b > 1 else "token"  # B > 1: a step carries a token of each sequence
        if b > 1:
            model = f"{model}, B = {b}"
        for mesh in (c for c in done if machines[c["machine"]]["kind"] != "hbm"):
            for hbm in (c for c in done if machines[c["machine"]]["kind"] == "hbm"):
                fm, fh = mesh["figures"], hbm["figures"]
                mm, mh = machines[mesh["machine"]], machines[hbm["machine"]]
                moved = fh["hbm_read_bytes_per_token"] + fh["hbm_write_bytes_per_token"]
                floor = fh["weight_bytes_per_token"] / mh["hbm_bandwidth"]
                ratio = fm["tokens_per_second"] / fh["tokens_per_second"]
                verdict = "the wafer is ahead" if ratio > 1 else "the wafer is behind"
                out.append(
                    f"{model}: {mesh['machine']} {fm['tokens_per_second']:,.0f} tokens/s vs "
                    f"{hbm['machine']} {fh['tokens_per_second']:,.0f} tokens/s = {ratio:.3g}x "
                    f"({verdict}). {hbm['machine']} must stream "
                    f"{fmt_bytes(fh['weight_bytes_per_token'])} of weights from HBM every "
                    f"{step} (the run moved {fmt_bytes(moved)}) at "
                    f"{fmt_bytes(mh['hbm_bandwidth'])}/s peak: at least {fmt_seconds(floor)} a "
                    f"{step} however fast its cores are; it took "
                    f"{fmt_seconds(fh['seconds_per_token'])} (HBM busy "
                    f"{fmt_fraction(fh['hbm_utilisation'])}; the rest is DMA latency and the "
                    f"barriers between stages). {mesh['machine']} keeps the weights resident in "
                    f"SRAM (0 B from HBM), readable at {fmt_bytes(mm['memory_bandwidth'])}/s "
                    f"over its {mm['pes']:,} PEs, and moves only activations: "
                    f"{fmt_bytes(fm['fabric_link_bytes_per_token'])} of link traffic a {step} "
                    f"(its hottest link busy {fmt_fraction(fm['link_utilisation_max'])} of the "
                    f"time); its {fmt_seconds(fm['seconds_per_token'])} is latency along the "
                    f"layer chain, not bandwidth.")
    return out


def write_outputs(suite: dict, outdir) -> list[Path]:
    """bench.md, bench.json, tokens_per_second.png, throughput_curve.png and
    roofline-<machine>.png in `outdir`."""
    from wse_emu.isa.fileio import atomic_write

    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "bench.md", out / "bench.json"]
    atomic_write(files[0], markdown(suite).encode())
    atomic_write(files[1], (json.dumps(suite, indent=1) + "\n").encode())
    files.append(out / "tokens_per_second.png")
    atomic_write(files[-1], plot_tokens_per_second(suite))
    files.append(out / "throughput_curve.png")
    atomic_write(files[-1], plot_throughput_curve(suite))
    for m in suite["meta"]["machines"]:
        files.append(out / f"roofline-{m['name']}.png")
        atomic_write(files[-1], plot_roofline(suite, m))
    return files


def _dtype_bytes(suite: dict) -> int:
    return {"fp32": 4, "f32": 4}.get(suite["meta"].get("dtype"), 2)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    _pyplot().close(fig)
    return buf.getvalue()


def plot_tokens_per_second(suite: dict) -> bytes:
    """PNG: tokens/s of every model on every machine (log scale), grouped by model, at the
    smallest B of the run (the throughput curve shows the others); a case that did not run is
    a labelled gap."""
    plt = _pyplot()
    b0 = min(_sequence_list(suite["meta"]))
    cases = [c for c in suite["cases"] if _seqs(c) == b0]
    models = list(dict.fromkeys(c["model"] for c in cases))
    machines = [m["name"] for m in suite["meta"]["machines"]]
    rates = [c["figures"]["tokens_per_second"] for c in cases if c["status"] == "ok"]
    bottom = 10 ** math.floor(math.log10(min(rates)) - 0.5) if rates else 1.0
    fig, ax = plt.subplots(figsize=(max(6.4, 0.9 * len(models) * len(machines) + 2), 4.8))
    width = 0.8 / len(machines)
    for j, name in enumerate(machines):
        for i, model in enumerate(models):
            c = next((c for c in cases if c["model"] == model and c["machine"] == name), None)
            if c is None:
                continue
            x = i + (j - (len(machines) - 1) / 2) * width
            if c["status"] == "ok":
                tps = c["figures"]["tokens_per_second"]
                ax.bar(x, tps - bottom, width, bottom=bottom, color=f"C{j}")
                # machines may hold different contexts: each bar says at what it ran
                ax.annotate(f"{tps:,.0f}\nctx {c.get('max_context')}\npos {c.get('position')}",
                            (x, tps), ha="center", va="bottom", fontsize=6)
            else:
                ax.annotate(c["status"], (x, 0.03), xycoords=ax.get_xaxis_transform(),
                            ha="center", va="bottom", fontsize=7, rotation=90, color=f"C{j}")
    ax.set_yscale("log")
    ax.set_ylim(bottom=bottom, top=max(rates) * 3 if rates else 10.0)
    ax.set_xticks(range(len(models)), models)
    ax.set_xlim(-0.5, len(models) - 0.5)
    ax.set_ylabel(f"tokens/s a sequence, log scale ({b0} in flight, emulated)"
                  if b0 > 1 else "tokens/s, log scale (batch-1 decode, emulated)")
    ax.set_title(f"Decode tokens/s, weights {suite['meta']['dtype']}; each bar: the KV "
                 f"context compiled (ctx) and the position decoded (pos)", fontsize=9)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=f"C{j}", label=n) for j, n in enumerate(machines)])
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def plot_roofline(suite: dict, machine: dict) -> bytes:
    """PNG: the machine's roofline (peak FLOP/s; memory bandwidth where its weights live) with
    every model it ran placed at (FLOPs per byte of weight traffic, achieved FLOP/s)."""
    import numpy as np

    plt = _pyplot()
    peak, bw = machine["peak_flops"], machine["memory_bandwidth"]
    done = [c for c in suite["cases"] if c["machine"] == machine["name"] and c["status"] == "ok"]
    xs = [c["figures"]["arithmetic_intensity"] for c in done]
    lo = min([0.1] + [x / 10 for x in xs])
    hi = max([10 * peak / bw] + [x * 10 for x in xs])
    ai = np.logspace(np.log10(lo), np.log10(hi), 200)
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    ax.plot(ai, np.minimum(peak, ai * bw), color="k",
            label=f"roof: {peak / 1e12:,.0f} TFLOP/s, {machine['memory']} "
                  f"{fmt_bytes(bw)}/s")
    if machine["kind"] == "hbm" and machine["hbm_efficiency"] < 1:
        ax.plot(ai, np.minimum(peak, ai * bw * machine["hbm_efficiency"]), "k--", lw=0.8,
                label=f"achievable HBM (x{machine['hbm_efficiency']:g})")
    for i, c in enumerate(done):
        f = c["figures"]
        y = f.get("flops_per_step", f["flops_per_token"]) * f["tokens_per_second"]
        b = f" B {_seqs(c)}" if _seqs(c) > 1 else ""
        ax.plot(f["arithmetic_intensity"], y, "o", color=f"C{i % 10}",
                label=f"{c['model']}{b} (ctx {c.get('max_context')}, pos {c.get('position')}): "
                      f"{y / 1e12:.3g} TFLOP/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOPs per byte of weight traffic (log scale)")
    ax.set_ylabel("FLOP/s (log scale)")
    ax.set_title(f"{machine['name']}: decode on the roofline")
    if xs and all(_seqs(c) == 1 for c in done):
        # batch 1 does one multiply-add per weight, so every model sits at the same x (2 FLOPs
        # per weight / its bytes): the chart compares heights, and says why
        ax.annotate("batch 1: one multiply-add per weight, so every model sits at\n"
                    f"x = 2 FLOPs / {_dtype_bytes(suite)} bytes a weight; only the "
                    f"heights differ", (0.02, 0.02), xycoords="axes fraction", fontsize=7)
    ax.legend(fontsize=7)
    ax.grid(which="both", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def _plain(x, _pos=None) -> str:
    """A log axis tick as the number it marks (no 10^k notation to misread)."""
    if x >= 1e6:
        return f"{x / 1e6:g}M"
    if x >= 1e3:
        return f"{x / 1e3:g}k"
    return f"{x:g}"


def plot_throughput_curve(suite: dict) -> bytes:
    """PNG: per-user tokens/s (x) against aggregate tokens/s (y), both on log scales, one line
    a model on a machine through its B = 1, 2, 4, ... points (each labelled with its B); the
    dotted guides are aggregate = B x per-user. Cases that did not run are listed below."""
    import numpy as np
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plt = _pyplot()
    curves = _curves(suite["cases"])
    fig, ax = plt.subplots(figsize=(7.6, 5.8))
    xs, ys, missing = [], [], []
    markers = "osD^v<>ph*"
    for i, ((model, machine), group) in enumerate(curves.items()):
        done = [c for c in group if c["status"] == "ok"]
        missing += [f"{machine} B={_seqs(c)} ({c['status']})" if len(curves) < 2 else
                    f"{model} on {machine} B={_seqs(c)} ({c['status']})"
                    for c in group if c["status"] != "ok"]
        if not done:
            continue
        x = [c["figures"]["tokens_per_second"] for c in done]
        y = [c["figures"]["aggregate_tokens_per_second"] for c in done]
        xs += x
        ys += y
        ax.plot(x, y, "-", marker=markers[i % len(markers)], color=f"C{i % 10}",
                label=f"{model} on {machine}")
        for c, px, py in zip(done, x, y):
            ax.annotate(f"B={_seqs(c)}", (px, py), textcoords="offset points", xytext=(5, 4),
                        fontsize=7, color=f"C{i % 10}")
    if xs:
        lo_x, hi_x = min(xs) / 2, max(xs) * 2
        lo_y, hi_y = min(ys) / 2, max(ys) * 2
        guide = np.array([lo_x, hi_x])
        for b in _sequence_list(suite["meta"]):
            ax.plot(guide, guide * b, ":", color="0.6", lw=0.8, zorder=0)
            # the guide's label where it leaves the plot on the right or at the top
            gx = min(hi_x, hi_y / b) / 1.15
            if lo_x < gx and lo_y < gx * b:
                ax.annotate(f"aggregate = {b} x per-user", (gx, gx * b), fontsize=6,
                            color="0.45", ha="right", va="bottom")
        ax.set_xlim(lo_x, hi_x)
        ax.set_ylim(lo_y, hi_y)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        # ticks at 1, 2, 5 x 10^k written out in full: a log axis read as linear misleads
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(_plain))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokens/s per user (one sequence), log scale")
    ax.set_ylabel("aggregate tokens/s (all B sequences), log scale")
    ax.set_title(f"Decode: per-user against aggregate tokens/s, B sequences in flight\n"
                 f"weights {suite['meta']['dtype']}, emulated, one timing-only step a point",
                 fontsize=9)
    if xs:
        ax.legend(fontsize=7, loc="upper left")
    ax.grid(which="major", alpha=0.3)
    if missing:
        shown = "; ".join(missing[:8]) + ("; ..." if len(missing) > 8 else "")
        fig.text(0.01, 0.01, "not run (bench.md says why): " + shown, fontsize=6, wrap=True)
    fig.tight_layout(rect=(0, 0.04 if missing else 0, 1, 1))
    return _png(fig)

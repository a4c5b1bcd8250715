"""The outputs of `wse-emu bench` (emulator.benchsuite): the Markdown table, the comparison of
resident-weight and HBM-streaming machines, the JSON file and the PNG plots (tokens/s of every
model on every machine; a roofline of each machine with the models placed on it).

Everything here reads the JSON-able suite that `benchsuite.run_suite` returns, so a saved
bench.json can be re-rendered. matplotlib is imported only when a plot is drawn.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from wse_emu.emulator.benchsuite import CONTEXT_LADDER


PARTS = {"vector": "norms and residual adds", "gemv": "layer matrix-vector products",
         "attn": "attention", "head": "LM head", "embed": "embedding"}


def violations(suite: dict) -> list[str]:
    """One line per physics check a case failed (each one an emulator bug)."""
    out = []
    for c in suite["cases"]:
        t = c["figures"].get("seconds_per_token")
        for check in c["checks"]:
            if not check["ok"]:
                out.append(f"{c['model']} on {c['machine']}: {fmt_seconds(t)} a token is under "
                           f"the {check['name']} floor of {fmt_seconds(check['floor_seconds'])}")
    return out


def _scaled(value, units, small: str) -> str:
    """value in the first of (unit, scale) it reaches, 3 significant digits; `small` (already
    formatted) when it is below them all; None is "-"."""
    if value is None:
        return "-"
    for unit, scale in units:
        if value >= scale:
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


def markdown(suite: dict) -> str:
    """The suite as Markdown: results with their physics floors, comparison, host cost."""
    meta, cases = suite["meta"], suite["cases"]
    seqs = meta.get("sequences", 1)
    flight = "batch 1" if seqs == 1 else f"{seqs} sequences in flight (tokens/s a sequence)"
    lines = [f"Decode, {flight}, weights {meta['dtype']}, shape-only compile + timing-only run "
             f"({meta['date']}, {meta['host']})", ""]
    if meta.get("command"):
        lines += [f"Command: `{meta['command']}`", ""]
    lines += ["| model | machine | context | position | tokens/s | time/token | time/layer | "
              "HBM bytes/token | fabric bytes/token | SIMD util | HBM util | hottest link | "
              "floors (time/token must be >=) |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    notes = []
    for c in cases:
        ctx = c["max_context"] or "-"
        pos = "-" if c["position"] is None else c["position"]
        if c["status"] != "ok":
            notes.append(f"{c['model']} on {c['machine']}: {c['reason']}")
            lines.append(f"| {c['model']} | {c['machine']} | {ctx} | {pos} | {c['status']} "
                         f"[{len(notes)}] | | | | | | | | |")
            continue
        f = c["figures"]
        layer = ("" if f["layer_time_measured"] else "~") + fmt_seconds(f["seconds_per_layer"])
        hbm = f["hbm_read_bytes_per_token"] + f["hbm_write_bytes_per_token"]
        lines.append(
            f"| {c['model']} | {c['machine']} | {ctx} | {pos} | {f['tokens_per_second']:,.0f} | "
            f"{fmt_seconds(f['seconds_per_token'])} | {layer} | {fmt_bytes(hbm)} | "
            f"{fmt_bytes(f['fabric_link_bytes_per_token'])} | "
            f"{fmt_fraction(f['simd_utilisation'])} | {fmt_fraction(f['hbm_utilisation'])} | "
            f"{fmt_fraction(f['link_utilisation_max'])} | {_floors_cell(c)} |")
    if notes:
        lines += [""] + [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    for c in cases:  # per-sequence against aggregate throughput, and the first token's wait
        f = c["figures"]
        if c["status"] == "ok" and "ttft_seconds" in f:
            lines.append(f"- {c['model']} on {c['machine']}: {f.get('sequences', 1)} "
                         f"sequence(s), {f['tokens_per_second']:,.0f} tokens/s a sequence, "
                         f"{f.get('aggregate_tokens_per_second', f['tokens_per_second']):,.0f} "
                         f"aggregate; first token of a {f['ttft_prompt_tokens']}-token prompt "
                         f"{fmt_seconds(f['ttft_seconds'])}")
    lines += ["", "Columns: context = the largest KV-cache length of "
              f"{', '.join(map(str, CONTEXT_LADDER))} that "
              "compiles for the machine; position = the decoded position (the same on every "
              "machine of a model); fabric bytes = wavelet-hops x 4 B (every link a wavelet "
              "crosses); time/layer measured on mesh programs, ~ = time/token / layers on HBM "
              "programs; SIMD util = FLOPs / (peak x time); HBM util = bytes / (peak bandwidth x "
              "time); hottest link = its wavelets / cycles. Floors: HBM weights = weight bytes / "
              "peak HBM bandwidth, HBM moved = reported HBM bytes / peak, SIMD = FLOPs / peak, "
              "link = hottest link's wavelets / clock.", "", f"Batch: {meta['batch_sweep']}."]
    predicted = []
    for c in cases:
        f = c["figures"] if c["status"] == "ok" else {}
        if f.get("predicted_cycles_per_token"):
            want, got = f["predicted_cycles_per_token"], f["cycles_per_token"]
            predicted.append(f"{c['model']} on {c['machine']}: predicted {want:,} cycles, "
                             f"emulated {got:,} (emulated / predicted {got / want:.2f})")
    if predicted:
        lines += ["", "The compiler's cost model beside the emulator (cycles a token):", ""] + \
            [f"- {p}" for p in predicted]
    paths = [f"{c['model']} on {c['machine']}: " + ", ".join(
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
              "| model | machine | compile | load | decode step | case total | peak RSS so far |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for c in cases:
        h = c["host"]
        lines.append(f"| {c['model']} | {c['machine']} | "
                     + " | ".join(fmt_seconds(h.get(k)) for k in
                                  ("compile_seconds", "load_seconds", "step_seconds",
                                   "case_seconds"))
                     + f" | {fmt_bytes(h.get('peak_rss_bytes'))} |")
    lines += ["", f"Whole suite: {fmt_seconds(meta['host_seconds'])} of host time, peak RSS "
              f"{fmt_bytes(meta['peak_rss_bytes'])}."]
    return "\n".join(lines) + "\n"


def compare(cases: list[dict], machines: dict) -> list[str]:
    """Per model, every resident-weight (mesh) result against every HBM result: the ratio of
    tokens/s and why (bytes per token, bandwidth, where each machine's time goes)."""
    out = []
    by_model: dict[str, list[dict]] = {}
    for c in cases:
        if c["status"] == "ok":
            by_model.setdefault(c["model"], []).append(c)
    for model, done in by_model.items():
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
                    f"token (the run moved {fmt_bytes(moved)}) at "
                    f"{fmt_bytes(mh['hbm_bandwidth'])}/s peak: at least {fmt_seconds(floor)} a "
                    f"token however fast its cores are; it took "
                    f"{fmt_seconds(fh['seconds_per_token'])} (HBM busy "
                    f"{fmt_fraction(fh['hbm_utilisation'])}; the rest is DMA latency and the "
                    f"barriers between stages). {mesh['machine']} keeps the weights resident in "
                    f"SRAM (0 B from HBM), readable at {fmt_bytes(mm['memory_bandwidth'])}/s "
                    f"over its {mm['pes']:,} PEs, and moves only activations: "
                    f"{fmt_bytes(fm['fabric_link_bytes_per_token'])} of link traffic a token "
                    f"(its hottest link busy {fmt_fraction(fm['link_utilisation_max'])} of the "
                    f"time); its {fmt_seconds(fm['seconds_per_token'])} is latency along the "
                    f"layer chain, not bandwidth.")
    return out


def write_outputs(suite: dict, outdir) -> list[Path]:
    """bench.md, bench.json, tokens_per_second.png and roofline-<machine>.png in `outdir`."""
    from wse_emu.isa.fileio import atomic_write

    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "bench.md", out / "bench.json"]
    atomic_write(files[0], markdown(suite).encode())
    atomic_write(files[1], (json.dumps(suite, indent=1) + "\n").encode())
    files.append(out / "tokens_per_second.png")
    atomic_write(files[-1], plot_tokens_per_second(suite))
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
    """PNG: tokens/s of every model on every machine (log scale), grouped by model; a case
    that did not run is a labelled gap."""
    plt = _pyplot()
    cases = suite["cases"]
    models = list(dict.fromkeys(c["model"] for c in cases))
    machines = [m["name"] for m in suite["meta"]["machines"]]
    rates = [c["figures"]["tokens_per_second"] for c in cases if c["status"] == "ok"]
    bottom = 10 ** math.floor(math.log10(min(rates)) - 0.5) if rates else 1.0
    fig, ax = plt.subplots(figsize=(max(6.4, 0.9 * len(models) * len(machines) + 2), 4.8))
    width = 0.8 / len(machines)
    for j, name in enumerate(machines):
        for i, model in enumerate(models):
            c = next(c for c in cases if c["model"] == model and c["machine"] == name)
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
    ax.set_ylabel("tokens/s (batch-1 decode, emulated)")
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
        y = f["flops_per_token"] * f["tokens_per_second"]
        ax.plot(f["arithmetic_intensity"], y, "o", color=f"C{i}",
                label=f"{c['model']} (ctx {c.get('max_context')}, pos {c.get('position')}): "
                      f"{y / 1e12:.3g} TFLOP/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOPs per byte of weight traffic")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"{machine['name']}: batch-1 decode on the roofline")
    if xs:
        # batch 1 does one multiply-add per weight, so every model sits at the same x (2 FLOPs
        # per weight / its bytes): the chart compares heights, and says why
        ax.annotate("batch 1: one multiply-add per weight, so every model sits at\n"
                    f"x = 2 FLOPs / {_dtype_bytes(suite)} bytes a weight; only the "
                    f"heights differ", (0.02, 0.02), xycoords="axes fraction", fontsize=7)
    ax.legend(fontsize=7)
    ax.grid(which="both", alpha=0.3)
    fig.tight_layout()
    return _png(fig)

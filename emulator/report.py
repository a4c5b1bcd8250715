"""Reports of a run: a JSON-able summary, a readable table, the deadlock / fault report, a
Chrome/Perfetto trace and PNG heatmaps of utilisation over the mesh."""

from __future__ import annotations

import io
import json

import numpy as np

from wse_emu.emulator.host_clock import host_text
from wse_emu.emulator.load import (N_PORTS, PIPE_TICKS, Loaded, pipe_name,
                                  pipe_ticks_per_wavelet)
from wse_emu.emulator.result import (FAULT_REASONS, LOOP_PARTS, RUN_DEADLOCK, RUN_FAULT,
                                    RUN_HALTED, RUN_MAX_CYCLES, ST_HALT, ST_WAIT_BP,
                                    ST_WAIT_RECV, STATUS_NAMES, RunResult)
from wse_emu.isa.encoding import format_instr
from wse_emu.isa.fileio import atomic_write
from wse_emu.isa.program import DIR_NAMES
from wse_emu.isa.spec import COST_CLASSES

BLOCKED_CAP = 16  # PEs listed in a deadlock report before "... and N more"


def instr_text(loaded: Loaded, pe: int, pc: int) -> str:
    region = loaded.program.regions[int(loaded.pe_region[pe])]
    if 0 <= pc < len(region.code):
        labels = {i: name for name, i in region.labels}
        return format_instr(region.code[pc], labels)
    return "<past the end of the code>"


def pe_name(loaded: Loaded, pe: int) -> str:
    return f"PE ({int(loaded.pe_x[pe])},{int(loaded.pe_y[pe])})"


def blocked_lines(loaded: Loaded, result: RunResult, cap: int = BLOCKED_CAP) -> list[str]:
    """One line per PE that did not halt: where it is and what it waits for."""
    lines = []
    waiting = [i for i in range(loaded.n_pes) if result.status[i] != ST_HALT]
    for i in waiting[:cap]:
        st, color = int(result.status[i]), int(result.wait_color[i])
        what = STATUS_NAMES.get(st, "?")
        if st == ST_WAIT_RECV:
            what = f"waiting for wavelets on color {color}"
        elif st == ST_WAIT_BP:
            what = f"blocked by backpressure: a receiver on color {color} has not consumed"
        elif result.outcome == RUN_MAX_CYCLES:
            # a PE may have run ahead of the limit through local instructions: its own clock
            # is not the run's, so say only that it had not halted by then
            what = f"still running at --max-cycles {result.cycles}"
        lines.append(f"{pe_name(loaded, i)} pc {int(result.pc[i])} "
                     f"`{instr_text(loaded, i, int(result.pc[i]))}`: {what}")
    if len(waiting) > cap:
        lines.append(f"... and {len(waiting) - cap} more PEs not halted")
    return lines


def problem_line(loaded: Loaded, result: RunResult) -> str | None:
    """The one-line headline of a run that did not halt."""
    if result.outcome == RUN_FAULT:
        i = result.fault_pe
        detail = f" ({result.fault_detail})" if result.fault_detail else ""
        return (f"fault at {pe_name(loaded, i)} pc {int(result.pc[i])} "
                f"`{instr_text(loaded, i, int(result.pc[i]))}`: "
                f"{FAULT_REASONS[result.fault_reason]}{detail}")
    if result.outcome == RUN_DEADLOCK:
        n = int(np.sum(result.status != ST_HALT))
        return f"deadlock at cycle {result.cycles}: {n} PEs blocked, none can run"
    if result.outcome == RUN_MAX_CYCLES:
        return f"stopped at --max-cycles {result.cycles}: the program had not halted"
    return None


def link_table(loaded: Loaded, result: RunResult, top: int = 5) -> list[dict]:
    lw = result.link_wavelets
    order = np.argsort(-lw, kind="stable")[:top]
    cycles = max(result.cycles, 1)
    rows = []
    for link in order:
        if lw[link] == 0:
            break
        cell, port = divmod(int(link), N_PORTS)
        y, x = divmod(cell, loaded.grid_w)
        rows.append({"x": x, "y": y, "port": DIR_NAMES[port], "wavelets": int(lw[link]),
                     "utilisation": round(float(lw[link]) / cycles, 4)})
    return rows


def summary(loaded: Loaded, result: RunResult) -> dict:
    m = loaded.machine
    cycles = int(result.cycles)
    active = int(np.sum(result.instructions > 0))
    # A run stopped by --max-cycles reports the window up to the limit: the instruction that
    # crossed it counts only up to there.
    busy = np.minimum(result.busy, cycles) if result.outcome == RUN_MAX_CYCLES else result.busy
    busy_total = int(busy.sum())
    used_links = int(np.sum(result.link_wavelets > 0))
    d = {
        "status": result.outcome_name,
        "program": loaded.program.name,
        "machine": m.name,
        "cycles": cycles,
        "seconds": cycles / m.clock_hz,
        "instructions": int(result.instructions.sum()),
        "pes": int(loaded.n_pes),
        "pes_active": active,
        "host_seconds": round(result.host_seconds, 6),
        "compile_seconds": round(result.compile_seconds, 6),
        "host_threads": result.host_threads,
        "classes": {name: int(c) for name, c in zip(COST_CLASSES, result.class_counts)},
        "pe_cycles": {
            "busy": busy_total,
            "recv_stall": int(result.recv_stall.sum()),
            "backpressure_stall": int(result.bp_stall.sum()),
            "mean_utilisation": round(busy_total / max(cycles * loaded.n_pes, 1), 4),
            "max_busy": int(busy.max()) if loaded.n_pes else 0,
        },
        "fabric": {
            "messages": int(result.messages),
            "wavelets": int(result.wavelets),
            "wavelet_hops": int(result.wavelet_hops),
            "links_used": used_links,
            "mean_link_utilisation": round(
                float(result.link_wavelets.sum()) / max(used_links * max(cycles, 1), 1), 4),
            "busiest_links": link_table(loaded, result),
        },
    }
    if m.hbm_bytes or result.hbm_read_bytes or result.hbm_write_bytes:
        d["hbm"] = hbm_summary(loaded, result)
    if m.chips > 1:
        d["system"] = system_summary(loaded, result)
    if result.loop_profile:
        d["loop_profile"] = result.loop_profile
    problem = problem_line(loaded, result)
    if problem:
        d["problem"] = problem
        d["blocked"] = blocked_lines(loaded, result)
    return d


def loop_line(lp: dict) -> str:
    """The counting build's line (WSE_EMU_COUNT=loop): the loop's parts, count and seconds."""
    if "counter" in lp:
        return "loop      counting build, but this host's cycle counter cannot be read"
    parts = ", ".join(f"{name.replace('_', ' ')} {lp[name]['count']:,} in "
                      f"{lp[name]['seconds']:.3f} s" for name in LOOP_PARTS)
    return (f"loop      {parts}; visits {lp['visits_seconds']:.3f} s in all (counting build: "
            f"{lp['counter_reads']:,} reads of the cycle counter, up to "
            f"{lp['read_seconds'] * 1e9:.1f} ns each, one a count within each part's time)")


def hbm_summary(loaded: Loaded, result: RunResult) -> dict:
    """Off-chip traffic of a run: bytes each way, the share of the peak bandwidth (all
    channels) they used over the whole run, DMA stalls and per-channel busy cycles."""
    m = loaded.machine
    moved = int(result.hbm_read_bytes) + int(result.hbm_write_bytes)
    # every GPU of a system has its own HBM and bandwidth
    peak = m.hbm_bandwidth * m.chips / m.clock_hz * max(int(result.cycles), 1)  # bytes at peak
    return {
        "read_bytes": int(result.hbm_read_bytes),
        "write_bytes": int(result.hbm_write_bytes),
        "peak_fraction": round(moved / peak, 4) if peak > 0 else 0.0,
        "dma_stall_cycles": int(np.sum(result.dma_stall)),
        "channel_busy_cycles": [int(c) for c in result.hbm_channel_busy],
    }


def system_summary(loaded: Loaded, result: RunResult) -> dict:
    """The links between the chips of a system: per pipe (a chip's port through a switch, else
    one each way between neighbouring chips) the bytes that crossed it and its busy fraction, the share of the run's cycles it
    was transferring (wavelets x its ticks per wavelet; docs/timing-model.md, "Systems")."""
    m = loaded.machine
    cycles = max(int(result.cycles), 1)
    tpw = pipe_ticks_per_wavelet(m)
    pipes = []
    for i, wavelets in enumerate(np.asarray(result.pipe_wavelets, dtype=np.int64).tolist()):
        pipes.append({"pipe": pipe_name(m, i), "bytes": wavelets * m.wavelet_bytes,
                      "busy_fraction": round(wavelets * tpw / PIPE_TICKS / cycles, 6)})
    return {"chips": m.chips, "chip": m.base, "link_bytes_per_s": m.link_bandwidth,
            "link_latency_cycles": m.link_latency, "pipes": pipes}


def text(d: dict) -> str:
    pc = d["pe_cycles"]
    fab = d["fabric"]
    # busy / cycles of a run that did not halt covers only the cycles before it stopped: a
    # deadlock's PEs may all have been busy up to the cycle where all of them block forever
    until = {"deadlock": " until the deadlock", "max-cycles": " until --max-cycles",
             "fault": " until the fault"}.get(d["status"], "")
    lines = [
        f"program   {d['program']} on {d['machine']}: {d['status']}"
        + (" (timing-only: no values computed)" if d.get("mode") == "timing-only" else ""),
        f"cycles    {d['cycles']:,}  ({d['seconds'] * 1e6:.3f} us emulated)",
        f"PEs       {d['pes']:,} ({d['pes_active']:,} active), mean utilisation{until} "
        f"{pc['mean_utilisation'] * 100:.1f}%",
        f"PE cycles busy {pc['busy']:,}, waiting for wavelets {pc['recv_stall']:,}, "
        f"backpressure {pc['backpressure_stall']:,}",
        f"instrs    {d['instructions']:,}: " + ", ".join(
            f"{k} {v:,}" for k, v in d["classes"].items() if v),
        f"fabric    {fab['messages']:,} messages, {fab['wavelets']:,} wavelets, "
        f"{fab['wavelet_hops']:,} wavelet-hops, {fab['links_used']:,} links used "
        f"(mean utilisation {fab['mean_link_utilisation'] * 100:.1f}%)",
    ]
    for row in fab["busiest_links"][:3]:
        lines.append(f"          busiest: ({row['x']},{row['y']}) {row['port']}: "
                     f"{row['wavelets']:,} wavelets, {row['utilisation'] * 100:.1f}%")
    if "hbm" in d:
        h = d["hbm"]
        lines.append(f"HBM: {h['read_bytes'] / 1e6:,.3f} MB read, {h['write_bytes'] / 1e6:,.3f} MB "
                     f"written, {h['peak_fraction'] * 100:.1f}% of peak bandwidth over the run; "
                     f"PE cycles waiting for DMA {h['dma_stall_cycles']:,}")
    if "system" in d:
        s = d["system"]
        used = [p for p in s["pipes"] if p["bytes"]]
        lines.append(f"system    {s['chips']} x {s['chip']}, links {s['link_bytes_per_s'] / 1e9:g} "
                     f"GB/s each way, {s['link_latency_cycles']:,} cycles latency; "
                     f"{len(used)} of {len(s['pipes'])} pipes used")
        for p in used:
            lines.append(f"          {p['pipe']}: {p['bytes'] / 1e6:,.6f} MB, busy "
                         f"{p['busy_fraction'] * 100:.2f}% of the run")
    if "loop_profile" in d:
        lines.append(loop_line(d["loop_profile"]))
    threads = " (tile products on a second thread)" if d["host_threads"] > 1 else ""
    load = (f" (after {d['load_seconds']:.3f} s loading the program)" if "load_seconds" in d
            else "")
    lines.append(f"host      {host_text(d['host_seconds'], d['compile_seconds'], 3, load)}"
                 f"{threads}")
    return "\n".join(lines)


def write_trace(path: str, loaded: Loaded, result: RunResult) -> int:
    """Write trace_json to `path` (atomically); the number of events."""
    data, n = trace_json(loaded, result)
    atomic_write(path, data)
    return n


def trace_json(loaded: Loaded, result: RunResult) -> tuple[bytes, int]:
    """Chrome / Perfetto trace JSON: one thread per PE, one slice per tensor-op chunk; the
    bytes and the number of events."""
    us_per_cycle = 1e6 / loaded.machine.clock_hz
    events = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": loaded.program.name}}]
    named = set()
    for pe, pc, start, end in result.trace:
        if pe not in named:
            named.add(pe)
            events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": int(pe),
                           "args": {"name": pe_name(loaded, pe)}})
        name = instr_text(loaded, pe, pc).split()[0]
        events.append({"ph": "X", "pid": 0, "tid": int(pe), "name": name,
                       "ts": start * us_per_cycle, "dur": max(end - start, 1) * us_per_cycle,
                       "args": {"pc": int(pc), "start_cycle": int(start), "end_cycle": int(end),
                                "instr": instr_text(loaded, pe, pc)}})
    doc = {"traceEvents": events, "displayTimeUnit": "ns",
           "otherData": {"machine": loaded.machine.name, "cycles": int(result.cycles)}}
    return json.dumps(doc).encode(), len(events)


def plot_utilisation(path: str, loaded: Loaded, result: RunResult) -> str | None:
    """Write utilisation_png to `path` (atomically); its note for the user, or None."""
    data, note = utilisation_png(loaded, result)
    atomic_write(path, data)
    return note


def utilisation_png(loaded: Loaded, result: RunResult) -> tuple[bytes, str | None]:
    """PNG of where the run's time went, and a note for the user (or None).

    Mesh programs: the PE busy share and the busiest outgoing link of each router over the
    mesh, both on a fixed 0-100 % scale (an auto-ranged scale would paint 98.74 % as idle
    beside 98.77 %). Programs on an HBM machine, whose cores form one row: per core the
    shares of the run busy, waiting for DMA and waiting for wavelets, and per HBM channel its
    busy share (the fabric maps say little there)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cycles = max(int(result.cycles), 1)
    title = (f"{loaded.program.name} on {loaded.machine.name}: {result.cycles:,} cycles; "
             f"shares of the whole run")
    if loaded.machine.hbm_bytes:
        fig = _plot_hbm(plt, loaded, result, cycles)
        note = None
    else:
        w, h = loaded.grid_w, loaded.grid_h
        busy = np.full((h, w), np.nan)
        busy[loaded.pe_y, loaded.pe_x] = 100.0 * result.busy / cycles
        # a link carries at most one wavelet a cycle: its share of the run, per router the
        # busiest of its four outgoing links
        links = 100.0 * result.link_wavelets.reshape(h, w, N_PORTS)[:, :, :4].max(axis=2) / cycles
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
        for ax, data, label in ((axes[0], busy, "PE busy, % of the run"),
                                (axes[1], links, "busiest outgoing link, % of cycles")):
            im = ax.imshow(data, cmap="viridis", interpolation="nearest", origin="upper",
                           vmin=0.0, vmax=100.0)
            ax.set_title(label)
            ax.set_xlabel("x (column)")
            ax.set_ylabel("y (row)")
            fig.colorbar(im, ax=ax, shrink=0.8, label="% (fixed scale 0-100)")
        note = None
        if h * w > 1 and min(h, w) == 1:
            note = "the program is one row or column of PEs: the maps are a strip"
    fig.suptitle(title)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    return png.getvalue(), note


def _plot_hbm(plt, loaded: Loaded, result: RunResult, cycles: int):
    """Bars per core (busy / waiting for DMA / waiting for wavelets) and per HBM channel."""
    n = loaded.n_pes
    order = np.lexsort((loaded.pe_x, loaded.pe_y))
    parts = [("busy", result.busy), ("waiting for DMA", result.dma_stall),
             ("waiting for wavelets", result.recv_stall)]
    fig, axes = plt.subplots(2, 1, figsize=(11, 6.4))
    bottom = np.zeros(n)
    for label, values in parts:
        share = 100.0 * np.minimum(np.asarray(values, dtype=np.float64)[order], cycles) / cycles
        axes[0].bar(np.arange(n), share, bottom=bottom, label=label, width=1.0)
        bottom += share
    axes[0].set_ylim(0, 100)
    axes[0].set_xlabel("core (in row order)")
    axes[0].set_ylabel("% of the run")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[0].set_title("each core's cycles")
    ch = np.asarray(result.hbm_channel_busy, dtype=np.float64)
    axes[1].bar(np.arange(len(ch)), 100.0 * np.minimum(ch, cycles) / cycles, width=0.8)
    axes[1].set_ylim(0, 100)
    axes[1].set_xlabel("HBM channel")
    axes[1].set_ylabel("% of the run busy")
    moved = (int(result.hbm_read_bytes) + int(result.hbm_write_bytes)) / 1e6
    axes[1].set_title(f"HBM channels: {moved:,.3f} MB moved")
    return fig


EXIT_CODES = {RUN_HALTED: 0, RUN_DEADLOCK: 1, RUN_MAX_CYCLES: 1, RUN_FAULT: 1}

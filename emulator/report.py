"""Reports of a run: a JSON-able summary, a readable table, the deadlock / fault report, a
Chrome/Perfetto trace and PNG heatmaps of utilisation over the mesh."""

from __future__ import annotations

import io
import json

import numpy as np

from wse_emu.emulator.load import N_PORTS, Loaded
from wse_emu.emulator.result import (FAULT_REASONS, RUN_DEADLOCK, RUN_FAULT, RUN_HALTED, RUN_MAX_CYCLES,
                             ST_HALT, ST_WAIT_BP, ST_WAIT_RECV, STATUS_NAMES, RunResult)
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
            what = f"still running at cycle {int(result.clock[i])}"
        lines.append(f"{pe_name(loaded, i)} pc {int(result.pc[i])} "
                     f"`{instr_text(loaded, i, int(result.pc[i]))}`: {what}")
    if len(waiting) > cap:
        lines.append(f"... and {len(waiting) - cap} more PEs not halted")
    return lines


def problem_line(loaded: Loaded, result: RunResult) -> str | None:
    """The one-line headline of a run that did not halt."""
    if result.outcome == RUN_FAULT:
        i = result.fault_pe
        return (f"fault at {pe_name(loaded, i)} pc {int(result.pc[i])} "
                f"`{instr_text(loaded, i, int(result.pc[i]))}`: {FAULT_REASONS[result.fault_reason]}")
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
    problem = problem_line(loaded, result)
    if problem:
        d["problem"] = problem
        d["blocked"] = blocked_lines(loaded, result)
    return d


def hbm_summary(loaded: Loaded, result: RunResult) -> dict:
    """Off-chip traffic of a run: bytes each way, the share of the peak bandwidth (all
    channels) they used over the whole run, DMA stalls and per-channel busy cycles."""
    m = loaded.machine
    moved = int(result.hbm_read_bytes) + int(result.hbm_write_bytes)
    peak = m.hbm_bandwidth / m.clock_hz * max(int(result.cycles), 1)  # bytes at peak
    return {
        "read_bytes": int(result.hbm_read_bytes),
        "write_bytes": int(result.hbm_write_bytes),
        "peak_fraction": round(moved / peak, 4) if peak > 0 else 0.0,
        "dma_stall_cycles": int(np.sum(result.dma_stall)),
        "channel_busy_cycles": [int(c) for c in result.hbm_channel_busy],
    }


def text(d: dict) -> str:
    pc = d["pe_cycles"]
    fab = d["fabric"]
    lines = [
        f"program   {d['program']} on {d['machine']}: {d['status']}"
        + (" (timing-only: no values computed)" if d.get("mode") == "timing-only" else ""),
        f"cycles    {d['cycles']:,}  ({d['seconds'] * 1e6:.3f} us emulated)",
        f"PEs       {d['pes']:,} ({d['pes_active']:,} active), mean utilisation "
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
    threads = " (tile products on a second thread)" if d["host_threads"] > 1 else ""
    lines.append(f"host      {d['host_seconds']:.3f} s{threads}")
    return "\n".join(lines)


def write_trace(path: str, loaded: Loaded, result: RunResult) -> int:
    """Chrome / Perfetto trace JSON: one thread per PE, one slice per tensor-op chunk."""
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
    atomic_write(path, json.dumps(doc).encode())
    return len(events)


def plot_utilisation(path: str, loaded: Loaded, result: RunResult) -> None:
    """PNG: PE busy fraction and outgoing-link utilisation over the mesh."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cycles = max(result.cycles, 1)
    w, h = loaded.grid_w, loaded.grid_h
    busy = np.full((h, w), np.nan)
    busy[loaded.pe_y, loaded.pe_x] = result.busy / cycles
    links = result.link_wavelets.reshape(h, w, N_PORTS)[:, :, :4].sum(axis=2) / cycles
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    for ax, data, title in ((axes[0], busy, "PE busy fraction"),
                            (axes[1], links, "wavelets / cycle leaving each router")):
        im = ax.imshow(data, cmap="viridis", interpolation="nearest", origin="upper")
        ax.set_title(title)
        ax.set_xlabel("x (column)")
        ax.set_ylabel("y (row)")
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(f"{loaded.program.name} on {loaded.machine.name}: {result.cycles:,} cycles")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    atomic_write(path, png.getvalue())


EXIT_CODES = {RUN_HALTED: 0, RUN_DEADLOCK: 1, RUN_MAX_CYCLES: 1, RUN_FAULT: 1}

"""Machine presets: frozen dataclasses loaded from TOML files in emulator/machines/ or a user's.

Pure Python (no NumPy, no Numba): `wse-emu machines` and `--help` import this.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from wse_emu.isa.spec import SIMD_KEYS

PRESET_DIR = Path(__file__).parent / "machines"


class MachineError(Exception):
    """A preset that cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class Machine:
    name: str
    kind: str
    description: str
    # fabric
    width: int
    height: int
    colors: int
    hop_latency: int
    ramp_latency: int
    queue_depth: int
    wavelet_bytes: int
    # PE
    sram_bytes: int
    clock_hz: float
    issue_overhead: int
    scalar_cycles: int
    special_scalar_cycles: int
    simd: tuple[tuple[str, int], ...]  # (key, elements per cycle) for every isa.spec.SIMD_KEYS
    # off-chip memory ([hbm] table; hbm_bytes 0 = none, as on the wafers)
    hbm_bytes: int = 0  # capacity
    hbm_bandwidth: float = 0.0  # peak bytes per second, all channels
    hbm_efficiency: float = 1.0  # achievable fraction of the peak (a cited preset parameter)
    hbm_latency: int = 0  # cycles from a request leaving the core to its last byte's channel slot
    hbm_channels: int = 1
    hbm_interleave: int = 256  # bytes on one channel before the next channel

    @property
    def hbm_bytes_per_cycle(self) -> float:
        """Achievable HBM bytes per core-clock cycle over all channels together."""
        return self.hbm_bandwidth * self.hbm_efficiency / self.clock_hz if self.hbm_bytes else 0.0

    def simd_width(self, key: str) -> int:
        return dict(self.simd)[key]

    @property
    def pes(self) -> int:
        return self.width * self.height

    @property
    def peak_flops(self) -> float:
        """Dense multiply-accumulate peak, FLOP/s (2 per FMAC) over every core, at the widest
        FMAC of the preset (fp16/bf16 on every preset here)."""
        return 2.0 * max(w for k, w in self.simd if k.startswith("fmac")) * self.pes * self.clock_hz

    def summary(self) -> str:
        s = dict(self.simd)
        if self.kind == "hbm":
            return (f"{self.pes} cores, {self.sram_bytes // 1024} KB SRAM/core, "
                    f"{self.clock_hz / 1e9:g} GHz, HBM {self.hbm_bytes / 1e9:g} GB at "
                    f"{self.hbm_bandwidth / 1e12:g} TB/s (x{self.hbm_efficiency:g} achievable), "
                    f"{self.peak_flops / 1e12:.0f} TF/s fp16")
        return (f"{self.width} x {self.height} PEs, {self.sram_bytes // 1024} KB SRAM/PE, "
                f"{self.clock_hz / 1e9:g} GHz, {self.colors} colors, "
                f"fp16 FMAC x{s['fmac_f16']}, fp32 FMAC x{s['fmac_f32']}")


_FIELDS = {
    "fabric": ("width", "height", "colors", "hop_latency", "ramp_latency", "queue_depth",
               "wavelet_bytes"),
    "pe": ("sram_bytes", "clock_hz", "issue_overhead", "scalar_cycles", "special_scalar_cycles"),
}


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def load_machine(name_or_path: str) -> Machine:
    """A preset by name (`wse3`) or a TOML file path; MachineError with one line otherwise."""
    path = Path(name_or_path)
    if not (name_or_path.endswith(".toml") or path.is_file()):
        path = PRESET_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            raise MachineError(f"unknown machine {name_or_path!r}: presets are "
                               f"{', '.join(preset_names())}, or pass a .toml file")
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise MachineError(f"{path}: no such machine file") from None
    except tomllib.TOMLDecodeError as e:
        raise MachineError(f"{path}: not valid TOML: {e}") from None
    return machine_from_dict(doc, str(path))


def machine_from_dict(doc: dict, where: str = "<machine>") -> Machine:
    kind = doc.get("kind", "mesh")
    if kind not in ("mesh", "hbm"):
        raise MachineError(f"{where}: machine kind {kind!r} is not supported ('mesh' or 'hbm')")
    values: dict = {"name": doc.get("name", Path(where).stem), "kind": kind,
                    "description": doc.get("description", "")}
    for table, keys in _FIELDS.items():
        section = doc.get(table, {})
        for key in keys:
            if key not in section:
                raise MachineError(f"{where}: missing [{table}] {key}")
            value = section[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise MachineError(f"{where}: [{table}] {key} must be a non-negative number")
            values[key] = float(value) if key == "clock_hz" else int(value)
    simd = doc.get("simd", {})
    missing = [k for k in SIMD_KEYS if k not in simd]
    if missing:
        raise MachineError(f"{where}: missing [simd] {', '.join(missing)}")
    for k in SIMD_KEYS:
        if not isinstance(simd[k], int) or simd[k] < 1:
            raise MachineError(f"{where}: [simd] {k} must be a positive integer")
    values["simd"] = tuple((k, int(simd[k])) for k in SIMD_KEYS)
    hbm = doc.get("hbm")
    if kind == "hbm" and hbm is None:
        raise MachineError(f"{where}: a machine of kind 'hbm' needs an [hbm] table")
    if hbm is not None:
        values.update(_hbm_fields(hbm, where, values["clock_hz"]))
    for key in ("width", "height", "colors", "sram_bytes", "queue_depth"):
        if values[key] < 1:
            raise MachineError(f"{where}: {key} must be at least 1")
    if values["clock_hz"] <= 0:
        raise MachineError(f"{where}: clock_hz must be positive")
    return Machine(**values)


_HBM_KEYS = ("capacity_bytes", "bandwidth_bytes_per_s", "efficiency", "latency_ns", "channels",
             "interleave_bytes")


def _hbm_fields(hbm: dict, where: str, clock_hz: float) -> dict:
    for key in _HBM_KEYS:
        if key not in hbm:
            raise MachineError(f"{where}: missing [hbm] {key}")
        value = hbm[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise MachineError(f"{where}: [hbm] {key} must be a positive number")
    if hbm["efficiency"] > 1:
        raise MachineError(f"{where}: [hbm] efficiency is a fraction of peak, at most 1")
    for key in ("capacity_bytes", "channels", "interleave_bytes"):
        if not isinstance(hbm[key], int) and not float(hbm[key]).is_integer():
            raise MachineError(f"{where}: [hbm] {key} must be an integer")
    return {"hbm_bytes": int(hbm["capacity_bytes"]),
            "hbm_bandwidth": float(hbm["bandwidth_bytes_per_s"]),
            "hbm_efficiency": float(hbm["efficiency"]),
            "hbm_latency": max(1, round(hbm["latency_ns"] * 1e-9 * clock_hz)),
            "hbm_channels": int(hbm["channels"]),
            "hbm_interleave": int(hbm["interleave_bytes"])}

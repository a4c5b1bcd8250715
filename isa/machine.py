"""The machine description shared by the compiler and the emulator: frozen dataclasses loaded
from TOML presets in isa/machines/ or a user's file.

A *system* is N identical chips (wafers, or GPUs) and the links between them, named NAMExN
(`wse3x4`, `h100x8`, `my.tomlx2`): the chip's preset with its `[link]` table, N times. The
chips are stacked along y: chip c holds fabric rows [c * chip_height, (c + 1) * chip_height),
so `width x height` is the whole system's fabric and a route that crosses a row boundary
between two chips uses the system's link between them (docs/timing-model.md, "Systems").

Pure Python (no NumPy, no Numba): `wse-emu machines` and `--help` import this.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
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
    # a system of `chips` identical chips stacked along y ([link] table of the chip's preset):
    # height = chips * chip_height; every chip has its own HBM (hbm_bytes each)
    chips: int = 1
    link_bandwidth: float = 0.0  # bytes per second each way between two chips (all links)
    link_latency: int = 0  # cycles from a wavelet entering the link to leaving it
    links: int = 1  # physical links making up that bandwidth (documentation; timing uses the sum)
    link_switch: bool = False  # chips meet through a switch (NVSwitch, Ethernet) vs. point to point
    base: str = ""  # the chip preset's name for a system ("wse3" for "wse3x4"), else the name

    @property
    def chip_height(self) -> int:
        """Fabric rows of one chip (the whole height on a single chip)."""
        return self.height // self.chips

    def chip_of(self, y: int) -> int:
        """The chip that holds fabric row y."""
        return y // self.chip_height

    @property
    def link_bytes_per_cycle(self) -> float:
        """Bytes per core-clock cycle one way between two chips (0: no [link] table)."""
        return self.link_bandwidth / self.clock_hz

    @property
    def chip(self) -> "Machine":
        """One chip of a system (the machine itself when it is one chip)."""
        if self.chips == 1:
            return self
        return replace(self, name=self.base, chips=1, height=self.chip_height, base=self.base)

    @property
    def hbm_bytes_per_cycle(self) -> float:
        """Achievable HBM bytes per core-clock cycle over all channels together."""
        return self.hbm_bandwidth * self.hbm_efficiency / self.clock_hz if self.hbm_bytes else 0.0

    def simd_width(self, key: str) -> int:
        return dict(self.simd)[key]

    @property
    def pes(self) -> int:
        """PEs (cores) of the whole system."""
        return self.width * self.height

    @property
    def peak_flops(self) -> float:
        """Dense multiply-accumulate peak, FLOP/s (2 per FMAC) over every core, at the widest
        FMAC of the preset (fp16/bf16 on every preset here)."""
        return 2.0 * max(w for k, w in self.simd if k.startswith("fmac")) * self.pes * self.clock_hz

    def summary(self) -> str:
        if self.chips > 1:
            link = (f"links {self.link_bandwidth / 1e9:g} GB/s each way, "
                    f"{self.link_latency / self.clock_hz * 1e6:g} us"
                    f"{' through a switch' if self.link_switch else ''}")
            return f"{self.chips} x {self.base} ({self.chip.summary()}); {link}"
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


MAX_CHIPS = 64
_SYSTEM = re.compile(r"^(.+?)x([0-9]+)$")


def load_machine(name_or_path: str) -> Machine:
    """A preset by name (`wse3`), a TOML file path, or a system of N of either (`wse3x4`,
    `my.tomlx2`); MachineError with one line otherwise."""
    match = _SYSTEM.match(name_or_path)
    if match and not Path(name_or_path).is_file() and \
            not (PRESET_DIR / f"{name_or_path}.toml").is_file():
        base, n = match.group(1), int(match.group(2))
        try:
            chip = load_chip(base)
        except MachineError as e:
            inner = _SYSTEM.match(base)
            if inner is not None and _loads(base):  # wse3x4x2: a system of systems
                total = int(inner.group(2)) * n
                say = (f"a system of {total} {inner.group(1)} chips is {inner.group(1)}x{total}"
                       if total <= MAX_CHIPS else f"a system has at most {MAX_CHIPS} chips")
                raise MachineError(f"{name_or_path}: {base} is already a system; {say}") from None
            raise MachineError(f"{name_or_path}: a system of {base!r}, but {e}") from None
        return system_of(chip, n, name_or_path)
    return load_chip(name_or_path)


def _loads(name: str) -> bool:
    try:
        load_machine(name)
    except MachineError:
        return False
    return True


def system_of(chip: Machine, n: int, name: str | None = None) -> Machine:
    """A system of n copies of the one-chip machine `chip` and the links of its [link] table."""
    label = name or f"{chip.name}x{n}"
    if chip.chips != 1:
        raise MachineError(f"{label}: {chip.name} is already a system")
    if not 1 <= n <= MAX_CHIPS:
        raise MachineError(f"{label}: a system has 1 to {MAX_CHIPS} chips, not {n}")
    if n > 1 and chip.link_bandwidth <= 0:
        raise MachineError(f"{label}: machine {chip.name} has no [link] table (bandwidth, "
                           f"latency) to join {n} chips with")
    return replace(chip, name=label, chips=n, height=chip.height * n, base=chip.name)


def load_chip(name_or_path: str) -> Machine:
    """One chip: a preset by name or a TOML file path."""
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
    link = doc.get("link")
    if link is not None:
        values.update(_link_fields(link, where, values["clock_hz"]))
    values["base"] = values["name"]
    return Machine(**values)


_LINK_KEYS = ("bandwidth_bytes_per_s", "latency_ns", "links", "switch")


def _link_fields(link: dict, where: str, clock_hz: float) -> dict:
    """The [link] table: how two chips of a system are joined."""
    for key in _LINK_KEYS:
        if key not in link:
            raise MachineError(f"{where}: missing [link] {key}")
    if not isinstance(link["switch"], bool):
        raise MachineError(f"{where}: [link] switch must be true or false")
    for key in ("bandwidth_bytes_per_s", "latency_ns", "links"):
        value = link[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise MachineError(f"{where}: [link] {key} must be a positive number")
    if not float(link["links"]).is_integer():
        raise MachineError(f"{where}: [link] links must be an integer")
    return {"link_bandwidth": float(link["bandwidth_bytes_per_s"]),
            "link_latency": max(1, round(link["latency_ns"] * 1e-9 * clock_hz)),
            "links": int(link["links"]), "link_switch": link["switch"]}


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

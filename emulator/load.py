"""Program + machine -> the struct-of-arrays state both interpreters run on.

Everything is checked here, before anything runs: the program must fit the machine's fabric,
colors, SRAM and HBM, and every route tree must be well formed. A problem raises LoadError
with one line naming what and where (exit code 2 in the CLI).

State is allocated for the PEs the program uses only: an 8 x 8 program on a full wse3 preset
costs what 64 PEs cost. SRAM is one flat uint8 array holding every PE's SRAM one after another,
each as large as its own region's footprint (rounded up to 8; `sram_base` / `sram_len`), with
float32 / uint16 views for the kernels: a 390k-PE GPT-2-XL needs the ~10 KB its mean PE
declares, not the ~38 KB of its largest region. In timing-only mode (`with_data=False`) only
PEs whose code loads or stores scalars get any (see `load`). HBM is one flat uint8 array of
the program's HBM footprint (`Loaded.hbm`), filled from its HBM inits (empty in timing-only
mode). A timing-only SRAM holds little but code, so it and its unknown-word map take host
memory only for the 4 KB pages written (`host_zeros`).

Host memory a PE is budgeted (tests/emulator/test_host_memory.py): the route tables are
built once, by the walk, in the int32 form the Numba core runs on (`Loaded.tree_of`,
`Loaded.tree`), which every run shares; the integer registers' initial values are built when
a run asks (`Loaded.ireg_init`).
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wse_emu.emulator.result import PIPE_TICKS
from wse_emu.isa.machine import Machine
from wse_emu.isa.encoding import decode_fields
from wse_emu.isa.program import (DIR_N, DIR_NAMES, DIR_RAMP, DIR_S, HbmInit, HbmPiece, Program,
                                 Rect, TileMap)
from wse_emu.isa.spec import BY_MNEMONIC, DTYPE_BYTES, DTYPE_NAMES, INSTR_BYTES, N_IREG_SLOTS, SPECIAL_IREGS
from wse_emu.isa.tensors import TensorError, as_2d, tensor_array

N_PORTS = 5  # links per router: N, E, S, W neighbours, and RAMP down to its own PE

# Columns of Loaded.tree_of and Loaded.tree (load_routes; the core's T_* and E_* are the same),
# and the destination that marks a link into system pipe k: TREE_PIPE0 - k
TREE_START, TREE_COUNT, TREE_NDEST = range(3)
TREE_LINK, TREE_PARENT, TREE_DEST = range(3)
TREE_PIPE0 = -2


def entry_pipe(dest: int) -> int:
    """The system pipe of a tree entry whose destination is `dest` (Loaded.tree), else -1."""
    return TREE_PIPE0 - dest if dest <= TREE_PIPE0 else -1


OP_DMEM = BY_MNEMONIC["dmem"].opcode
OP_DFOUT = BY_MNEMONIC["dfout"].opcode
OP_DFIN = BY_MNEMONIC["dfin"].opcode


class LoadError(Exception):
    """The program cannot run on this machine; the message is one line."""


@dataclass
class Loaded:
    machine: Machine
    program: Program
    n_pes: int
    pe_x: np.ndarray  # int32 (n_pes,) absolute column
    pe_y: np.ndarray  # int32 (n_pes,) absolute row
    pe_region: np.ndarray  # int32 (n_pes,)
    pe_code_start: np.ndarray  # int32 (n_pes,) first instruction of its region in the code arrays
    pe_code_len: np.ndarray  # int32 (n_pes,)
    code_op: np.ndarray  # int32 (n_instr,) all regions' decoded code, concatenated
    code_a: np.ndarray
    code_b: np.ndarray
    code_c: np.ndarray
    code_imm: np.ndarray  # int64: slot I, sign-extended
    code_il: np.ndarray  # int64: slot IL, unsigned
    code_ih: np.ndarray  # int64: slot IH, signed
    pe_stride: int  # the largest SRAM footprint of any region, rounded up to 8
    sram: np.ndarray  # uint8: the SRAM of every PE that has one, at sram_base[p]
    grid_w: int  # fabric box the program touches (from (0, 0)); link ids = cell * 5 + port
    grid_h: int
    pe_of_cell: np.ndarray  # int32 (grid_h * grid_w,) PE index of a cell, -1 where no code runs
    # The route trees (load_routes.build_trees), as the core runs on them (int32, shared, not
    # copied): tree_of, a row per (PE, color) slot pe * colors + color: its tree's first entry
    # (-1: none), entries and RAMP deliveries; tree, a row per entry: the link it reserves, the
    # entry whose router it leaves from (-1: the source router), and its destination: the PE of
    # a RAMP delivery, -1 for a link to the next router, TREE_PIPE0 - k for a link into system
    # pipe k (link_pipes). Column views by name: tree_start ... tree_dest, tree_pipe.
    tree_of: np.ndarray  # int32 (n_pes * colors, 3)
    tree: np.ndarray  # int32 (n_entries, 3)
    # int32, sorted: the (PE, color) input queues some tree delivers to (what a run can write)
    queue_slots: np.ndarray
    base_dir: str | None  # folder external tensors are relative to
    # int64 (n_pes,): byte offset of every PE's SRAM in `sram` (-1: none), and its size, the
    # footprint of the PE's region rounded up to 8, which is also the limit every address
    # check of the PE uses (in both modes, so faults are the same). Functional: every PE, in
    # order. Timing-only: only PEs whose region has scalar memory instructions (lw/sw/flw/fsw)
    # keep their SRAM (host inputs such as token ids and positions drive their control flow);
    # tensor ops, fabric transfers and DMA move no data, so no other PE needs any.
    sram_base: np.ndarray = None
    sram_len: np.ndarray = None
    timing_only: bool = False
    # Timing-only: one byte per 4-byte word of `sram`, 1 where the word holds a value computed
    # from data (which the run does not know): a tensor op, receive or DMA wrote it. Scalar
    # loads of such a word are refused (core: F_TIMING_DATA). It lives here, with the SRAM,
    # because it outlives a run as the SRAM does (a decode step's KV cache). Empty otherwise.
    unknown: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint8))
    # HBM contents, program.hbm_bytes bytes filled from the program's HBM inits (functional);
    # empty in timing-only mode, where DMA moves no data. On a system of chips with HBM each
    # chip's part is kept compacted: GPU c's bytes [c * hbm_bytes, c * hbm_bytes + hbm_stride)
    # at host offset c * hbm_stride (hbm_offset), so a node of 80 GB GPUs holding a small
    # model takes host memory for what its programs use, not chips x 80 GB.
    hbm: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint8))
    hbm_stride: int = 0  # host bytes a chip (0: one flat HBM, host offset = address)

    def hbm_offset(self, addr: int, nbytes: int = 0) -> int:
        """Host offset in `hbm` of HBM address `addr` (its nbytes stay in one chip's part)."""
        if not self.hbm_stride:
            return addr
        chip, rest = divmod(addr, self.machine.hbm_bytes)
        if rest + nbytes > self.hbm_stride:
            raise LoadError(f"HBM bytes {addr:#x}..{addr + nbytes - 1:#x} lie outside the "
                            f"buffers the program declares on chip {chip}")
        return chip * self.hbm_stride + rest

    @property
    def colors(self) -> int:
        return self.machine.colors

    @property
    def ireg_init(self) -> np.ndarray:
        """int64 (n_pes, N_IREG_SLOTS): the integer registers as a run starts them, zeros and
        the read-only specials. Built on demand (a run keeps its own copy): 176 bytes a PE that
        a loaded program need not hold."""
        return initial_iregs(self.program, self.pe_region, self.pe_x, self.pe_y)

    @property
    def tree_start(self) -> np.ndarray:
        """int32 (n_pes * colors,) first entry of the (PE, color) slot's tree, -1: none."""
        return self.tree_of[:, TREE_START]

    @property
    def tree_count(self) -> np.ndarray:
        """int32 (n_pes * colors,) entries of the slot's tree."""
        return self.tree_of[:, TREE_COUNT]

    @property
    def tree_link(self) -> np.ndarray:
        """int32 (n_entries,) the link an entry reserves (cell * 5 + port)."""
        return self.tree[:, TREE_LINK]

    @property
    def tree_parent(self) -> np.ndarray:
        """int32 (n_entries,) the entry whose router the link leaves from, -1: the source's."""
        return self.tree[:, TREE_PARENT]

    @property
    def tree_dest(self) -> np.ndarray:
        """int32 (n_entries,) the PE of a RAMP delivery, else negative (see `tree`)."""
        return self.tree[:, TREE_DEST]

    @property
    def tree_pipe(self) -> np.ndarray:
        """int32 (n_entries,) the system pipe an entry's link crosses into, else -1 (a new
        array: per entry, decode tree_dest as `entry_pipe` does)."""
        dest = self.tree_dest
        return np.where(dest <= TREE_PIPE0, TREE_PIPE0 - dest, -1).astype(np.int32)

    @property
    def n_links(self) -> int:
        return self.grid_w * self.grid_h * N_PORTS

    @property
    def n_pipes(self) -> int:
        """System pipes (n_pipes_of): a port a chip through a switch, else one each way
        between two neighbouring chips (0 on one chip)."""
        return n_pipes_of(self.machine)

    def pe_sram(self, p: int) -> np.ndarray:
        """PE p's SRAM bytes (a view; empty for a PE without SRAM in timing-only mode)."""
        base = int(self.sram_base[p])
        return self.sram[base:base + int(self.sram_len[p])] if base >= 0 else self.sram[:0]

    def sram_view(self) -> "SramView":
        """PE-indexed view of the SRAM: view[p] is PE p's bytes, view[p, a:b] a slice of them."""
        return SramView(self)

    def region_sram(self, ri: int) -> np.ndarray | None:
        """(PEs of region ri, footprint rounded up to 8) view of their SRAM, rows in the
        region's PE order (a region's PEs are consecutive, and so is their SRAM); None when
        they have none (timing-only mode)."""
        p0, base, stride = _region_rows(self, ri)
        if base < 0:
            return None
        size = self.program.regions[ri].rect.size
        return self.sram[base:base + size * stride].reshape(size, stride)

    def pe_index(self, x: int, y: int) -> int:
        if 0 <= x < self.grid_w and 0 <= y < self.grid_h:
            return int(self.pe_of_cell[y * self.grid_w + x])
        return -1


PAGE = 4096  # bytes: the unit of host memory the snapshot keeps or skips


class PageSnapshot:
    """A byte array's contents to put back later (Loaded.sram, Loaded.unknown), kept as its
    nonzero 4 KB pages only.

    A timing-only SRAM is mostly never written: PEs with scalar memory keep their region's
    whole footprint (a full-size embedding region is a gigabyte) but hold little in it, and
    pages nobody wrote take no host memory. A plain copy, and restoring one, would map every
    page; this keeps and rewrites only pages that hold something (functional: about all)."""

    def __init__(self, data: np.ndarray):
        body, tail = self._split(data)
        self.pages = np.flatnonzero(body.any(axis=1))
        self.saved = body[self.pages].copy()
        self.tail = tail.copy()

    @staticmethod
    def _split(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(whole pages as rows of uint64, the bytes after the last whole page)."""
        n = data.size // PAGE
        return data[:n * PAGE].view(np.uint64).reshape(n, PAGE // 8), data[n * PAGE:]

    def restore(self, data: np.ndarray) -> None:
        """Put the contents back into `data` (the array snapshotted, or one like it)."""
        body, tail = self._split(data)
        written = np.flatnonzero(body.any(axis=1))
        body[np.setdiff1d(written, self.pages, assume_unique=True)] = 0
        body[self.pages] = self.saved
        tail[:] = self.tail


class SramView:
    """Loaded.sram indexed by PE: view[p] is PE p's SRAM, view[p, a:b] bytes a..b-1 of it."""

    def __init__(self, loaded: Loaded):
        self._loaded = loaded

    def __getitem__(self, key):
        p, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        mem = self._loaded.pe_sram(int(p))
        return mem[rest] if rest else mem


def load(program: Program, machine: Machine, base_dir: str | None = None,
         with_data: bool = True) -> Loaded:
    """Check `program` against `machine` and build the initial state (data initialised)."""
    try:
        return _load(program, machine, base_dir, with_data)
    except LoadError as e:
        # a compiled model records its machine: say so when it is loaded on another one
        target = compiled_for(program)
        if target and target != machine.name and "compiled for" not in str(e):
            raise LoadError(f"{e} (the program was compiled for machine '{target}': pass "
                            f"--machine {target})") from None
        if uses_hbm(program) and not getattr(machine, "hbm_bytes", 0) and "HBM" not in str(e):
            raise LoadError(f"{e} (the program uses HBM, which machine '{machine.name}' does "
                            f"not have: run it on an HBM preset, e.g. --machine h100)") from None
        raise


DEFAULT_MACHINE = "wse3"


def compiled_for(program: Program) -> str | None:
    """The machine a compiled model was compiled for (None: an assembled program)."""
    info = program.meta.get("compiler")
    target = info.get("machine") if isinstance(info, dict) else None
    return target if isinstance(target, str) and target else None


def uses_hbm(program: Program) -> bool:
    """Whether the program reads or writes HBM (it then needs an HBM machine)."""
    if program.hbm_bytes or program.hbm_inits or program.hbm_pieces:
        return True
    dma = {BY_MNEMONIC[m].opcode for m in ("dmald", "dmast") if m in BY_MNEMONIC}
    return any((int(w) & 0xFF) in dma for r in program.regions for w in r.code) if dma else False


def program_machine(program: Program, name: str | None, what: str = "the program") -> Machine:
    """The machine to run `program` on: `name` (a preset or a .toml file) when given, else the
    one it was compiled for, else DEFAULT_MACHINE. A compiled program given another machine
    explicitly is refused: its placement, SRAM budget and figures belong to its own."""
    from wse_emu.isa.machine import MachineError, load_machine

    target = compiled_for(program)
    if name is None:
        if target is None:
            return load_machine(DEFAULT_MACHINE)
        try:
            return load_machine(target)
        except MachineError:
            raise LoadError(f"{what} was compiled for machine '{target}', which is not a "
                            f"preset: pass --machine with its .toml file") from None
    machine = load_machine(name)
    if target is not None and machine.name != target:
        raise LoadError(f"{what} was compiled for machine '{target}', not '{machine.name}': "
                        f"drop --machine, or recompile with --machine {machine.name}")
    return machine


def fit_problems(program: Program, m: Machine) -> list[str]:
    """What of the program does not fit machine `m` (fabric, colors, SRAM, HBM), in words;
    empty when it fits. The cheap checks of `load`, for describing a program."""
    from wse_emu.isa.binfmt import requirements

    need = requirements(program)
    out = []
    if need["width"] > m.width or need["height"] > m.height:
        out.append(f"needs a {need['width']} x {need['height']} fabric, the machine has "
                   f"{m.width} x {m.height}")
    if need["colors"] > m.colors:
        out.append(f"uses {need['colors']} colors, the machine has {m.colors}")
    if need["sram_bytes"] > m.sram_bytes:
        out.append(f"a PE needs {need['sram_bytes']:,} bytes of SRAM, the machine's have "
                   f"{m.sram_bytes:,}")
    have = getattr(m, "hbm_bytes", 0) * getattr(m, "chips", 1)  # every GPU its own
    if need["hbm_bytes"] > have:
        out.append(f"needs {need['hbm_bytes']:,} bytes of HBM, the machine has "
                   f"{f'{have:,}' if have else 'none'}")
    return out


def is_shape_only(program: Program) -> bool:
    """A compiled model built from config.json alone (`compile --shape-only`): it has no
    weights, so only a timing-only run means anything."""
    info = program.meta.get("compiler")
    if not isinstance(info, dict):
        return False
    if "shape_only" in info:
        return bool(info["shape_only"])
    # weights are tensors stored by reference to the checkpoint (small tables such as the
    # default positions are inline): none, and no HBM init, means a shape-only compile
    return not any(t.data is None for t in program.tensors) and not program.hbm_inits


def check_runnable(program: Program, timing_only: bool, what: str = "the program") -> None:
    """LoadError before a functional run of a program that has no weights to compute with."""
    if not timing_only and is_shape_only(program):
        raise LoadError(f"{what} was compiled with --shape-only (no weights): its values would "
                        f"be zeros; run it with --timing-only for its cycles")


def _load(program: Program, machine: Machine, base_dir: str | None,
          with_data: bool) -> Loaded:
    box = program.bounding_box()
    m = machine
    if box.w > m.width or box.h > m.height:
        raise LoadError(f"program needs a {box.w} x {box.h} fabric but machine '{m.name}' has "
                        f"{m.width} x {m.height}")
    footprint = region_footprints(program)
    _check_regions(program, m, footprint)
    _check_hbm_capacity(program, m)
    fields = _decode_regions(program)
    _check_code(program, m, fields)
    _check_dma(program, m, fields)

    # PEs region by region, each region's row by row (Rect.cells order)
    regions = program.regions
    sizes = np.array([r.rect.size for r in regions], dtype=np.int64)
    n = int(sizes.sum())
    pe_region = np.repeat(np.arange(len(regions), dtype=np.int32), sizes)
    local = np.arange(n, dtype=np.int64) - np.concatenate([[0], np.cumsum(sizes)[:-1]])[pe_region]
    rx, ry, rw, _ = _rect_columns(program)
    pe_x = (rx[pe_region] + local % rw[pe_region]).astype(np.int32)
    pe_y = (ry[pe_region] + local // rw[pe_region]).astype(np.int32)
    code_lens = np.array([len(r.code) for r in regions], dtype=np.int32)
    starts = np.concatenate([[0], np.cumsum(code_lens)]).astype(np.int32)
    pe_code_start = starts[pe_region]
    pe_code_len = code_lens[pe_region]
    cat = {k: np.concatenate([np.asarray(f[k], dtype=np.int64) for f in fields] or
                             [np.zeros(0, np.int64)]) for k in ("op", "a", "b", "c", "imm", "il", "ih")}

    pe_of_cell = np.full(box.w * box.h, -1, dtype=np.int32)
    pe_of_cell[pe_y * box.w + pe_x] = np.arange(n, dtype=np.int32)

    # SRAM: each PE its region's footprint (8-byte aligned blocks), PE after PE. Timing-only:
    # only regions with scalar loads or stores, whose values the run must know.
    stride = int(_round8(footprint).max(initial=8))
    if with_data:
        keeps = np.ones(len(regions), dtype=bool)
    else:
        keeps = np.array([_has_scalar_memory(f) for f in fields], dtype=bool)
    block = np.where(keeps, _round8(footprint) * sizes, 0)
    region_base = np.where(keeps, np.cumsum(block) - block, -1)
    sram_base = np.where(keeps[pe_region],
                         region_base[pe_region] + local * _round8(footprint)[pe_region], -1)
    sram_bytes = max(8, int(block.sum()))
    # timing-only SRAM is mostly never written (see host_zeros)
    sram = np.zeros(sram_bytes, dtype=np.uint8) if with_data else host_zeros(sram_bytes)

    trees = _build_trees(program, m, box, pe_of_cell, pe_x, pe_y)
    loaded = Loaded(
        machine=m, program=program, n_pes=n, pe_x=pe_x, pe_y=pe_y, pe_region=pe_region,
        pe_code_start=pe_code_start, pe_code_len=pe_code_len,
        code_op=cat["op"].astype(np.int32), code_a=cat["a"].astype(np.int32),
        code_b=cat["b"].astype(np.int32), code_c=cat["c"].astype(np.int32),
        code_imm=cat["imm"], code_il=cat["il"], code_ih=cat["ih"], pe_stride=stride,
        sram=sram, grid_w=box.w, grid_h=box.h,
        pe_of_cell=pe_of_cell, base_dir=base_dir, sram_base=sram_base.astype(np.int64),
        sram_len=footprint[pe_region].astype(np.int64), timing_only=not with_data,
        unknown=np.zeros(0, np.uint8) if with_data else host_zeros(sram.size // 4),
        hbm=np.zeros(_hbm_host_bytes(program, m) if with_data else 0, np.uint8),
        hbm_stride=_hbm_stride(program, m) if with_data else 0, **trees)
    _init_data(loaded)
    _init_hbm(loaded)
    return loaded


# Arrays of at least this many bytes that host_zeros maps page by page
SPARSE_MIN = 1 << 22


def host_zeros(nbytes: int) -> np.ndarray:
    """A zero-filled uint8 array of which only the 4 KB pages written take host memory.

    NumPy asks the kernel for 2 MB pages for arrays of 4 MB or more (madvise), so that a byte
    written every 37 KB (the code of every PE of an embedding region, in a timing-only SRAM
    that holds little else) maps all of it: 1.3 GB of a Llama-3-8B step's host memory. Large
    arrays are anonymous private maps without huge pages instead (reads of pages never written
    take no memory either); small ones are np.zeros."""
    if nbytes < SPARSE_MIN:
        return np.zeros(nbytes, dtype=np.uint8)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # (even where huge pages are the default)
        pages.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(pages, dtype=np.uint8)


def _rect_columns(program: Program) -> tuple[np.ndarray, ...]:
    """int64 x, y, w, h of every region's rect (one zero row for a program without any)."""
    return tuple(np.array([getattr(r.rect, k) for r in program.regions] or [0], dtype=np.int64)
                 for k in ("x", "y", "w", "h"))


def initial_iregs(program: Program, pe_region: np.ndarray, pe_x: np.ndarray,
                  pe_y: np.ndarray) -> np.ndarray:
    """int64 (n_pes, N_IREG_SLOTS) integer registers of every PE as a run starts them: zeros,
    and the read-only specials (X, Y in the region, its W, H, and GX, GY on the fabric)."""
    rx, ry, rw, rh = _rect_columns(program)
    ireg = np.zeros((len(pe_region), N_IREG_SLOTS), dtype=np.int64)
    ireg[:, SPECIAL_IREGS["X"]] = pe_x - rx[pe_region]
    ireg[:, SPECIAL_IREGS["Y"]] = pe_y - ry[pe_region]
    ireg[:, SPECIAL_IREGS["W"]] = rw[pe_region]
    ireg[:, SPECIAL_IREGS["H"]] = rh[pe_region]
    ireg[:, SPECIAL_IREGS["GX"]] = pe_x
    ireg[:, SPECIAL_IREGS["GY"]] = pe_y
    return ireg


_SCALAR_MEMORY = {BY_MNEMONIC[m].opcode for m in ("lw", "sw", "flw", "fsw")}


def _has_scalar_memory(fields) -> bool:
    """Whether code reads or writes SRAM with scalar instructions (which timing-only mode
    must serve real bytes: tensor ops, fabric operations and DMA it does not)."""
    return any(int(op) in _SCALAR_MEMORY for op in fields["op"])


def _round8(nbytes: np.ndarray) -> np.ndarray:
    return (nbytes + 7) // 8 * 8


def region_footprints(program: Program) -> np.ndarray:
    """int64 Program.region_sram_bytes of every region (code, allocs, data and symbol pieces)."""
    return np.array(program.regions_sram_bytes(), dtype=np.int64)


def _decode_regions(program: Program) -> list[dict]:
    """decode_fields of every region's code, once per distinct code (layers share theirs)."""
    seen: dict[bytes, dict] = {}
    out = []
    for r in program.regions:
        key = np.asarray(r.code, dtype=np.uint64).tobytes()
        if key not in seen:
            seen[key] = decode_fields(r.code)
        out.append(seen[key])
    return out


# ---------------------------------------------------------------------------------------------
# checks


def _check_regions(program: Program, m: Machine, footprint: np.ndarray) -> None:
    for r, need in zip(program.regions, footprint.tolist()):
        if need > m.sram_bytes:
            code = len(r.code) * INSTR_BYTES
            raise LoadError(
                f"PE ({r.rect.x},{r.rect.y}) of region '{r.name}' needs {need} bytes of SRAM "
                f"(code {code}, data and buffers {need - code}) but machine '{m.name}' has "
                f"{m.sram_bytes}: over by {need - m.sram_bytes}")
    for rule in program.routes:
        if rule.color >= m.colors:
            raise LoadError(f"route at ({rule.rect.x},{rule.rect.y}) uses color {rule.color} but "
                            f"machine '{m.name}' has colors 0-{m.colors - 1}")


def _check_hbm_capacity(program: Program, m: Machine) -> None:
    need, have = program.hbm_bytes, getattr(m, "hbm_bytes", 0) * getattr(m, "chips", 1)
    if need > have:
        def size(n: int) -> str:
            return f"{n / 1e9:.2f} GB" if n >= 10**7 else f"{n:,} bytes"
        each = f" ({m.chips} x {size(m.hbm_bytes)})" if have and m.chips > 1 else ""
        raise LoadError(f"program needs {size(need)} of HBM; machine {m.name} has "
                        f"{size(have) + each if have else 'no HBM'}")


def _check_code(program: Program, m: Machine, fields: list[dict]) -> None:
    for r, f in zip(program.regions, fields):
        for i, op in enumerate(f["op"]):
            where = f"region '{r.name}' instruction {i}"
            if op in (OP_DFIN, OP_DFOUT) and f["c"][i] >= m.colors:
                raise LoadError(f"{where}: color {f['c'][i]} but machine '{m.name}' has colors "
                                f"0-{m.colors - 1}")
            if op == OP_DMEM:
                addr, length, dt = f["il"][i], f["ih"][i], f["b"][i]
                end = addr + length * DTYPE_BYTES.get(dt, 4)
                if end > m.sram_bytes:
                    raise LoadError(f"{where}: descriptor at address {addr} of {length} "
                                    f"{DTYPE_NAMES.get(dt, '?')} ends at byte {end}, outside "
                                    f"the {m.sram_bytes}-byte SRAM")


_DMA_OPS = {BY_MNEMONIC[m].opcode: m for m in ("dmald", "dmast", "dmawait")}


def _check_dma(program: Program, m: Machine, fields: list[dict]) -> None:
    """A program with DMA instructions needs a machine with HBM: refused up front, not at the
    first transfer."""
    if getattr(m, "hbm_bytes", 0):
        return
    for r, f in zip(program.regions, fields):
        hits = np.flatnonzero(np.isin(np.asarray(f["op"]), list(_DMA_OPS)))
        if hits.size:
            i = int(hits[0])
            raise LoadError(f"program uses DMA ({_DMA_OPS[int(f['op'][i])]} at region "
                            f"'{r.name}' pc {i}) but machine {m.name} has no HBM")


# ---------------------------------------------------------------------------------------------
# routes


def _paint_routes(program: Program, box: Rect, colors: int) -> tuple[np.ndarray, np.ndarray]:
    rx = np.zeros((colors, box.h, box.w), dtype=np.int8)
    tx = np.zeros((colors, box.h, box.w), dtype=np.int8)
    for rule in program.routes:
        r = rule.rect
        rx[rule.color, r.y:r.y + r.h, r.x:r.x + r.w] = rule.rx
        tx[rule.color, r.y:r.y + r.h, r.x:r.x + r.w] = rule.tx
    return rx, tx


def _build_trees(program, m, box, pe_of_cell, pe_x, pe_y) -> dict:
    """The route tree of every (PE, color) whose route accepts RAMP: the PE may send there.
    Sending on a color without one is a fault at run time (SPMD code may hold sends a PE never
    reaches). The walk is emulator.load_routes.build_trees; a malformed tree is a LoadError."""
    from wse_emu.emulator import load_routes as lr

    colors = m.colors
    rx, tx = _paint_routes(program, box, colors)
    senders = np.nonzero((rx[:, pe_y, pe_x] & (1 << DIR_RAMP)).T)  # (pe indices, colors)
    tree_of, tree, mark, err = lr.build_trees(
        rx, tx, pe_of_cell, senders[0].astype(np.int64), senders[1].astype(np.int64),
        pe_x.astype(np.int64), pe_y.astype(np.int64), colors, m.width, m.height,
        m.chip_height if m.chips > 1 else 0)
    del rx, tx, senders
    code, color, x0, y0, x, y, port = (int(v) for v in err)
    src = f"color {color} from PE ({x0},{y0})"
    if code == lr.ERR_NOWHERE:
        raise LoadError(f"{src} is dropped at ({x},{y}): its route forwards nowhere")
    if code == lr.ERR_NO_CODE:
        raise LoadError(f"{src} delivers to ({x},{y}), which runs no code")
    if code == lr.ERR_OFF_FABRIC:
        raise LoadError(f"route for color {color} at ({x},{y}) sends {DIR_NAMES[port]} off the "
                        f"fabric (machine '{m.name}' is {m.width} x {m.height})")
    if code == lr.ERR_NOT_ACCEPTED:
        raise LoadError(f"{src} is dropped at ({x},{y}): its route for color {color} does not "
                        f"accept wavelets from {DIR_NAMES[port]}")
    if code == lr.ERR_LOOP:
        raise LoadError(f"{src} loops: ({x},{y}) is reached twice")
    if m.chips > 1 and m.link_switch and tree.shape[0]:
        # through a switch the walk's point-to-point marks become the sender's port, with its
        # copies, and relays (link_pipes defines them; this works on the crossings only: a
        # large system has 10^8 entries and 10^3 crossings)
        slots = np.flatnonzero(tree_of[:, TREE_START] >= 0)
        crossing = tree[:, TREE_DEST] <= TREE_PIPE0

        def sender_rows(entries):  # the row of each entry's tree's source (trees in slot order)
            k = np.searchsorted(tree_of[slots, TREE_START], entries, side="right") - 1
            return pe_y[slots[k] // colors]
        at, pipes = switch_pipes(m, crossing, tree[:, TREE_PARENT], sender_rows)
        tree[at, TREE_DEST] = TREE_PIPE0 - pipes
    return dict(tree_of=tree_of, tree=tree,
                queue_slots=np.flatnonzero(mark).astype(np.int32))


# ---------------------------------------------------------------------------------------------
# systems: the links between chips (docs/timing-model.md, "Systems: links between chips")


# through a switch, a crossing that starts d copies of a message through the sender's port has
# tree_pipe = port + PIPE_COPY * (d - 1) (docs/timing-model.md, "Systems: links between chips")
PIPE_COPY = 1 << 20
# through a switch, a system link beyond the first of its path (the switch delivers the copy
# the port already carried): tree_pipe = PIPE_RELAY, timed as no link at all (a hop's latency)
PIPE_RELAY = 1 << 30


def n_pipes_of(m: Machine) -> int:
    """System pipes: through a switch (link_switch), one port a chip, shared by all it sends;
    point to point, one each way between two neighbouring chips; 0 on one chip."""
    if m.chips == 1:
        return 0
    return m.chips if m.link_switch else 2 * (m.chips - 1)


def link_pipes(m: Machine, grid_w: int, links: np.ndarray,
               sender_rows: np.ndarray | None = None,
               parents: np.ndarray | None = None) -> np.ndarray:
    """int32 per route entry (its fabric link id, cell * 5 + port): the system pipe it
    crosses into, -1 for an ordinary link. Chip c holds rows [c * chip_height, (c + 1) *
    chip_height); the S link of c's last row and the N link of c + 1's first row cross.

    Point to point: the S crossing out of chip c is pipe 2c (c -> c + 1), the N crossing out
    of chip c + 1 is pipe 2c + 1 (c + 1 -> c). Through a switch (link_switch) a message sent
    from chip s (sender_rows: each entry's sender row; parents: the entries' tree_parent)
    leaves by s's port, pipe s: the first crossing of a path is that port, carrying a copy for
    every crossing of the route beyond it (PIPE_COPY); those later crossings, which the switch
    delivers directly, are PIPE_RELAY: no pipe, no second latency, and no reservation of the
    fabric link, which the line of chips has and the switch does not. The route walk marks
    point-to-point crossings itself (load_routes.crossing_pipe, Loaded.tree_pipe); this is
    their vectorised definition, and _build_trees rewrites them through a switch."""
    links = np.asarray(links, dtype=np.int64)
    out = np.full(links.shape, -1, dtype=np.int32)
    if m.chips == 1 or not links.size:
        return out
    ch = m.chip_height
    cell, port = links // N_PORTS, links % N_PORTS
    y = cell // grid_w
    south = (port == DIR_S) & ((y + 1) % ch == 0) & (y + 1 < m.height)
    north = (port == DIR_N) & (y % ch == 0) & (y > 0)
    if not m.link_switch:
        out[south] = 2 * (y[south] // ch)
        out[north] = 2 * (y[north] // ch - 1) + 1
        return out
    if sender_rows is None or parents is None or len(sender_rows) != len(links):
        raise ValueError("a switched system's pipes need every entry's sender row and parent")
    rows = np.asarray(sender_rows, dtype=np.int64)
    at, pipes = switch_pipes(m, south | north, parents, lambda entries: rows[entries])
    out[at] = pipes
    return out


def switch_pipes(m: Machine, crosses: np.ndarray, parents: np.ndarray,
                 sender_rows) -> tuple[np.ndarray, np.ndarray]:
    """Through a switch: (the crossing entries, their pipes) of link_pipes, given which
    entries cross (bool per entry), the entries' tree_parent and sender_rows(entries), the
    sender row of each given entry."""
    from wse_emu.emulator.load_routes import first_crossings

    crosses = np.asarray(crosses, dtype=np.bool_)
    at = np.flatnonzero(crosses)
    # the parents as they are (a system's 10^8 int32 entries, a strided column): converting
    # them to int64 first cost Llama-3-70B's wse3x4 load 1.4 s for a walk of 10^3 paths
    owner = first_crossings(at, crosses, np.asarray(parents))
    # a first crossing carries a copy for every crossing of its subtree, itself included
    copies = np.bincount(np.searchsorted(at, owner), minlength=at.size)
    pipes = np.full(at.shape, PIPE_RELAY, dtype=np.int32)
    first = owner == at
    pipes[first] = (sender_rows(at[first]) // m.chip_height
                    + PIPE_COPY * (copies[first] - 1))
    return at, pipes


def pipe_ticks_per_wavelet(m: Machine) -> int:
    """Ticks (1/PIPE_TICKS cycle) a system pipe is busy per wavelet: wavelet_bytes over the
    link's bytes per cycle, rounded up (0 on one chip)."""
    if m.chips == 1:
        return 0
    return max(1, math.ceil(m.wavelet_bytes * PIPE_TICKS / m.link_bytes_per_cycle))


def hbm_chip_detail(loaded: Loaded, p: int, addr: int, nbytes: int) -> str:
    """Which GPU owns the HBM a DMA of PE p reached outside its own GPU's (a system of GPUs:
    GPU c owns bytes [c * hbm_bytes, (c + 1) * hbm_bytes))."""
    m = loaded.machine
    hb = m.hbm_bytes
    chip = int(loaded.pe_y[p]) // m.chip_height
    lo, hi = chip * hb, (chip + 1) * hb
    bad = addr if not lo <= addr < hi else hi
    return (f"its {nbytes} bytes at HBM address {addr:#x} reach byte {bad:#x}, which GPU "
            f"{bad // hb} owns; this SM is on GPU {chip} (bytes {lo:#x}..{hi - 1:#x})")


def pipe_name(m: Machine, pipe: int) -> str:
    """'chip 0 -> 1' (or 'GPU 0 -> 1') for pipe index `pipe`; 'GPU 3 -> switch' for a port."""
    unit = "GPU" if m.kind == "hbm" else "chip"
    if m.link_switch:
        return f"{unit} {pipe} -> switch"
    b, up = divmod(pipe, 2)
    return f"{unit} {b + 1} -> {b}" if up else f"{unit} {b} -> {b + 1}"


# ---------------------------------------------------------------------------------------------
# data and symbols


def _storage_bytes(values: np.ndarray, tag: str, dtype: int) -> np.ndarray:
    """Values (any source dtype) -> raw storage bytes of `dtype`, last axis = elements."""
    from wse_emu.kernels.convert import bf16_to_f32_array, f32_to_bf16_array

    name = DTYPE_NAMES[dtype]
    if tag == "bf16":
        if name == "bf16":
            return np.ascontiguousarray(values, dtype=np.uint16).view(np.uint8)
        values = bf16_to_f32_array(values)
    if name == "i32":
        out = np.ascontiguousarray(values, dtype=np.int32)
    elif name == "f32":
        out = np.ascontiguousarray(values, dtype=np.float32)
    elif name == "f16":
        out = np.ascontiguousarray(np.asarray(values, dtype=np.float32).astype(np.float16))
    else:
        out = f32_to_bf16_array(np.ascontiguousarray(values, dtype=np.float32))
    return out.view(np.uint8)


def _tile_pes(loaded: Loaded, tm: TileMap) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pe indices, tile row indices, tile col indices) of every PE of the tile map's rect."""
    ys, xs = np.mgrid[tm.rect.y:tm.rect.y + tm.rect.h, tm.rect.x:tm.rect.x + tm.rect.w]
    xs, ys = xs.ravel(), ys.ravel()
    pes = loaded.pe_of_cell[ys * loaded.grid_w + xs] if loaded.grid_w else np.zeros(0, np.int32)
    if (pes < 0).any():
        k = int(np.argmax(pes < 0))
        raise LoadError(f"data or symbol at ({xs[k]},{ys[k]}) lies on a PE that runs no code")
    rx, ry = xs - tm.rect.x, ys - tm.rect.y
    ti = tm.row0 + ry * tm.row_dy + rx * tm.row_dx
    tj = tm.col0 + ry * tm.col_dy + rx * tm.col_dx
    return pes, ti, tj


def _tiles(t2: np.ndarray, tm: TileMap, ti, tj, what: str) -> np.ndarray:
    """(n_pes, tile elements) of the 2-D tensor in the map's order, zero-padded at the edges."""
    tr, tc = tm.tile
    rows = -(-t2.shape[0] // tr)
    cols = -(-t2.shape[1] // tc)
    if ti.size and (ti.min() < 0 or tj.min() < 0 or ti.max() >= rows or tj.max() >= cols):
        raise LoadError(f"{what}: tile map reaches tile ({int(ti.max())},{int(tj.max())}) of a "
                        f"{rows} x {cols} grid of {tr} x {tc} tiles")
    if rows * tr != t2.shape[0] or cols * tc != t2.shape[1]:
        padded = np.zeros((rows * tr, cols * tc), dtype=t2.dtype)
        padded[:t2.shape[0], :t2.shape[1]] = t2
        t2 = padded
    grid = t2.reshape(rows, tr, cols, tc)
    tiles = grid[ti, :, tj, :]  # (n, tr, tc)
    if tm.order == "F":
        tiles = tiles.transpose(0, 2, 1)
    return tiles.reshape(len(ti), tr * tc)


def _region_rows(loaded: Loaded, ri: int) -> tuple[int, int, int]:
    """(first PE, byte offset of its SRAM or -1, bytes a PE) of region ri, whose PEs are
    consecutive and whose SRAM is one block of equal rows."""
    # (ri in pe_region's own dtype: with a Python int NumPy casts the whole array first, 1.6 ms
    # a call on Llama-3-70B's 3.4 M PEs, 4.5 s of its load)
    p0 = int(np.searchsorted(loaded.pe_region, loaded.pe_region.dtype.type(ri)))
    return p0, int(loaded.sram_base[p0]), int(_round8(loaded.sram_len[p0]))


def _by_region(loaded: Loaded, pes: np.ndarray):
    """(selection of pes, their rows in the region's block, SRAM block, unknown-words block)
    for every region of `pes` whose PEs have SRAM."""
    regions = loaded.pe_region[pes]
    for ri in np.unique(regions):
        p0, base, stride = _region_rows(loaded, int(ri))
        if base < 0:
            continue
        size = loaded.program.regions[int(ri)].rect.size
        sel = regions == ri
        rows = pes[sel] - p0
        if rows.size == size and rows[0] == 0 and rows[-1] == size - 1 and \
                (rows.size < 3 or (np.diff(rows) == 1).all()):
            rows = slice(None)  # the whole region in order: a slice, not a gather
        block = loaded.sram[base:base + size * stride].reshape(size, stride)
        unknown = None
        if loaded.unknown.size:
            unknown = loaded.unknown[base // 4:(base + size * stride) // 4].reshape(size, -1)
        yield sel, rows, block, unknown


def _scatter_bytes(loaded: Loaded, pes: np.ndarray, addr: int, raw: np.ndarray) -> None:
    """Write bytes at `addr` of the SRAM of PEs `pes` (those that have SRAM): raw is one row
    for all or a row per PE. Host-written words hold known values (timing-only mode)."""
    nbytes = raw.shape[-1]
    for sel, rows, block, unknown in _by_region(loaded, pes):
        block[rows, addr:addr + nbytes] = raw[sel] if raw.ndim == 2 else raw
        words = slice(-(-addr // 4), (addr + nbytes) // 4)
        # (zeros written to words that are zero already would map their pages for nothing)
        if unknown is not None and unknown[rows, words].any():
            unknown[rows, words] = 0


def _gather_bytes(loaded: Loaded, pes: np.ndarray, addr: int, nbytes: int) -> np.ndarray:
    """(len(pes), nbytes) bytes at `addr` of the SRAM of PEs `pes` (which must have SRAM)."""
    out = np.zeros((len(pes), nbytes), dtype=np.uint8)
    for sel, rows, block, _ in _by_region(loaded, pes):
        out[sel] = block[rows, addr:addr + nbytes]
    return out


def _write_tiles(loaded: Loaded, tm: TileMap, values: np.ndarray, tag: str, what: str) -> None:
    pes, ti, tj = _tile_pes(loaded, tm)
    keep = loaded.sram_base[pes] >= 0
    if not keep.any():
        return
    if not keep.all():  # timing-only: convert only the tiles of PEs that keep SRAM
        pes, ti, tj = pes[keep], ti[keep], tj[keep]
    raw = _storage_bytes(_tiles(as_2d(values), tm, ti, tj, what), tag, tm.dtype)
    _scatter_bytes(loaded, pes, tm.addr, raw)


def _init_data(loaded: Loaded) -> None:
    for r, start in zip(loaded.program.regions, _region_starts(loaded)):
        code = np.asarray(r.code, dtype=np.uint64).view(np.uint8)
        _scatter_bytes(loaded, np.arange(start, start + r.rect.size), 0, code)
    tensors = {t.name: t for t in loaded.program.tensors}
    for d in loaded.program.data:
        if d.tensor is None:
            pes, _, _ = _tile_pes(loaded, d.tilemap)
            _scatter_bytes(loaded, pes, d.tilemap.addr, np.frombuffer(d.inline, dtype=np.uint8))
            continue
        if loaded.timing_only:
            pes, _, _ = _tile_pes(loaded, d.tilemap)
            if (loaded.sram_base[pes] < 0).all():
                continue  # no PE that keeps SRAM needs this tensor: do not even read it
        values, tag = _tensor_values(tensors[d.tensor], loaded.base_dir)
        _write_tiles(loaded, d.tilemap, values, tag, f"tensor '{d.tensor}'")


def _tensor_values(t, base_dir):
    """tensor_array, with a weights file that changed since the compile (cut short, say: NumPy's
    memory map then fails) as one LoadError line."""
    try:
        return tensor_array(t, base_dir)
    except TensorError as e:
        raise LoadError(str(e)) from None
    except (ValueError, OSError) as e:
        where = t.file or t.name
        raise LoadError(f"{where}: cannot read tensor '{t.key or t.name}' ({e}): the file is "
                        f"shorter or other than when the program was compiled") from None


HBM_CHUNK = 1 << 24  # elements converted at a time when filling HBM (bounds temporary memory)


def hbm_matrix(values: np.ndarray, init: HbmInit) -> np.ndarray:
    """The stored matrix S of an HBM init: the tensor's 2-D view, transposed, row-sliced
    (views only, so a memory-mapped tensor is read only where S is)."""
    s = as_2d(values)
    if init.transpose:
        s = s.T
    if init.rows is not None:
        s = s[init.rows[0]:init.rows[1]]
    return s


def _fill_hbm(hbm: np.ndarray, init: HbmInit, values: np.ndarray, tag: str,
              offset_of=lambda addr, nbytes: addr) -> None:
    """Write S as HbmInit describes: row tiles one after another, each in init.order.

    Vectorised over chunks of about HBM_CHUNK elements: whole tiles when a tile is smaller
    (row-major S is simply its rows in order), else column blocks of one column-major tile.
    """
    s = hbm_matrix(values, init)
    r, c = s.shape
    size = DTYPE_BYTES[init.dtype]

    def put(addr: int, block: np.ndarray) -> None:
        raw = _storage_bytes(block.reshape(-1), tag, init.dtype)
        offset = offset_of(addr, raw.size)
        hbm[offset:offset + raw.size] = raw
    if init.order == "C":
        step = max(1, HBM_CHUNK // c)
        for r0 in range(0, r, step):
            put(init.addr + r0 * c * size, s[r0:r0 + step])
        return
    tr = init.tile_rows or r
    if tr * c <= HBM_CHUNK:
        step = max(1, HBM_CHUNK // (tr * c)) * tr  # rows of whole tiles per chunk
        for r0 in range(0, r, step):
            block = s[r0:r0 + step]
            tiles = block.reshape(block.shape[0] // tr, tr, c).transpose(0, 2, 1)
            put(init.addr + r0 * c * size, tiles)
        return
    step = max(1, HBM_CHUNK // tr)  # columns of one tile per chunk
    for r0 in range(0, r, tr):
        for c0 in range(0, c, step):
            put(init.addr + (r0 * c + c0 * tr) * size, s[r0:r0 + tr, c0:c0 + step].T)


def _hbm_stride(program: Program, m: Machine) -> int:
    """Host bytes a chip of a system with HBM: the furthest any declared buffer reaches into
    its chip (buffers never straddle two chips: a DMA could not reach across), 0 for one chip."""
    hb = getattr(m, "hbm_bytes", 0)
    if getattr(m, "chips", 1) <= 1 or not hb or not program.hbm_allocs:
        return 0
    reach = max(a.addr + a.nbytes - (a.addr // hb) * hb for a in program.hbm_allocs)
    return -(-min(reach, hb) // 8) * 8


def _hbm_host_bytes(program: Program, m: Machine) -> int:
    stride = _hbm_stride(program, m)
    return program.hbm_bytes if not stride else stride * m.chips


def _init_hbm(loaded: Loaded) -> None:
    """Fill Loaded.hbm from the program's HBM inits (functional mode only)."""
    if not loaded.hbm.size:
        return
    tensors = {t.name: t for t in loaded.program.tensors}
    for init in loaded.program.hbm_inits:
        values, tag = _tensor_values(tensors[init.tensor], loaded.base_dir)
        _fill_hbm(loaded.hbm, init, values, tag, loaded.hbm_offset)


def hbm_piece(program: Program, name: str) -> HbmPiece | None:
    """The HBM piece of symbol `name`, None when the symbol lives in SRAM."""
    return next((p for p in program.hbm_pieces if p.symbol == name), None)


def _region_starts(loaded: Loaded) -> list[int]:
    sizes = [r.rect.size for r in loaded.program.regions]
    return list(np.cumsum([0] + sizes[:-1]))


_HOST_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": np.float32, "i32": np.int32}


def symbol(loaded: Loaded, name: str, kind: str):
    for s in loaded.program.symbols:
        if s.name == name and s.kind == kind:
            return s
    names = [s.name for s in loaded.program.symbols if s.kind == kind]
    raise LoadError(f"program has no {kind} {name!r} ({kind}s: {', '.join(names) or 'none'})")


def write_input(loaded: Loaded, name: str, values: np.ndarray) -> None:
    """Scatter a host array into every piece of input symbol `name`."""
    s = symbol(loaded, name, "input")
    values = check_input_values(loaded.program, s, np.asarray(values))
    tag = "<i4" if s.dtype == "i32" else "<f4"
    for piece in s.pieces:
        _write_tiles(loaded, piece, values, tag, f"input '{name}'")
    hp = hbm_piece(loaded.program, name)
    if hp is not None and loaded.hbm.size:
        raw = _storage_bytes(values.reshape(-1), tag, hp.dtype)
        at = loaded.hbm_offset(hp.addr, raw.size)
        loaded.hbm[at:at + raw.size] = raw


# host dtypes an input of each storage dtype takes: the same kind, never narrowed or widened
# silently (a bool mask, int64 counts or float16 values given for an f32 input are mistakes
# more often than not); integer ids of any width are checked against the int32 range
_ACCEPTED = {"f32": ("float32",), "bf16": ("float32",), "f16": ("float16", "float32"),
             "i32": ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}


def check_input_values(program: Program, s, values: np.ndarray) -> np.ndarray:
    """The values of input symbol `s` as the host array to scatter (int32 or float32), or
    LoadError naming the input: wrong dtype, wrong shape, a token id past the vocabulary, a
    position past the KV cache."""
    name = s.name
    if tuple(values.shape) != tuple(s.shape):
        raise LoadError(f"input {name!r} must have shape {tuple(s.shape)}, got {values.shape}")
    if values.dtype.name not in _ACCEPTED[s.dtype]:
        hint = " (token ids and positions are integers)" if s.dtype == "i32" else \
            f" (convert it with .astype(np.{_ACCEPTED[s.dtype][0]}))"
        raise LoadError(f"input {name!r} is {s.dtype}, but the values given are "
                        f"{values.dtype.name}{hint}")
    if s.dtype != "i32":
        return values.astype(np.float32)
    info = program.meta.get("compiler")
    limits = {}
    if isinstance(info, dict):
        limits = {"input_ids": ("token id", info.get("vocab"), "the vocabulary"),
                  "position_ids": ("position", info.get("max_context"), "the KV cache")}
    what, n, of = limits.get(name, ("value", None, None))
    lo, hi = (0, int(n) - 1) if isinstance(n, int) else (-2**31, 2**31 - 1)
    if values.size and (int(values.min()) < lo or int(values.max()) > hi):
        bad = int(values.min()) if int(values.min()) < lo else int(values.max())
        raise LoadError(f"input {name!r}: {what} {bad} is outside {of or 'int32'} "
                        f"({lo}..{hi})")
    return values.astype(np.int32)


def check_input_names(program: Program, names) -> None:
    """LoadError for a name that is not an input symbol of the program."""
    declared = sorted(s.name for s in program.symbols if s.kind == "input")
    for name in names:
        if name not in declared:
            raise LoadError(f"--input {name}: the program has no input {name!r} "
                            f"(inputs: {', '.join(declared) or 'none'})")


def write_inputs(loaded: Loaded, given: dict[str, np.ndarray]) -> None:
    """Scatter every input symbol: the given arrays, `position_ids` defaulting to 0 .. T-1 (as
    in transformers); any other input left out is an error, not silent zeros."""
    check_input_names(loaded.program, given)
    for s in (s for s in loaded.program.symbols if s.kind == "input"):
        if s.name in given:
            write_input(loaded, s.name, given[s.name])
        elif s.name == "position_ids":
            n = int(np.prod(s.shape))
            write_input(loaded, s.name, np.arange(n, dtype=np.int32).reshape(s.shape))
        else:
            raise LoadError(f"input {s.name!r} not given: pass --input {s.name}=FILE.npy")


def read_output(loaded: Loaded, name: str) -> np.ndarray:
    """Gather output symbol `name` from SRAM into a host array of its shape and dtype."""
    from wse_emu.kernels.convert import bf16_to_f32_array

    s = symbol(loaded, name, "output")
    if loaded.timing_only:
        raise LoadError(f"output {name!r}: a timing-only run computes no values (run "
                        f"functionally to read outputs)")
    hp = hbm_piece(loaded.program, name)
    if hp is not None:
        return _read_hbm_piece(loaded, s, hp)
    shape2 = as_2d(np.zeros(s.shape, dtype=np.int8)).shape
    out = np.zeros(shape2, dtype=_HOST_DTYPES[s.dtype])
    for tm in s.pieces:
        pes, ti, tj = _tile_pes(loaded, tm)
        _, first = np.unique(np.stack([ti, tj], axis=1), axis=0, return_index=True)
        tr, tc = tm.tile
        nbytes = tr * tc * DTYPE_BYTES[tm.dtype]
        raw = _gather_bytes(loaded, pes[first], tm.addr, nbytes)
        name_dt = DTYPE_NAMES[tm.dtype]
        if name_dt == "bf16":
            vals = bf16_to_f32_array(raw.view(np.uint16))
        else:
            vals = raw.view({"f32": np.float32, "f16": np.float16, "i32": np.int32}[name_dt])
        vals = vals.reshape(len(first), tr, tc) if tm.order == "C" else \
            vals.reshape(len(first), tc, tr).transpose(0, 2, 1)
        for v, i, j in zip(vals, ti[first], tj[first]):
            r0, c0 = i * tr, j * tc
            r1, c1 = min(r0 + tr, shape2[0]), min(c0 + tc, shape2[1])
            out[r0:r1, c0:c1] = v[:r1 - r0, :c1 - c0]
    return out.reshape(s.shape)


def _read_hbm_piece(loaded: Loaded, s, hp: HbmPiece) -> np.ndarray:
    """Output symbol s from its HBM piece: row-major, contiguous, in the piece's dtype."""
    from wse_emu.kernels.convert import bf16_to_f32_array

    n = int(np.prod(s.shape))
    name_dt = DTYPE_NAMES[hp.dtype]
    at = loaded.hbm_offset(hp.addr, n * DTYPE_BYTES[hp.dtype])
    raw = loaded.hbm[at:at + n * DTYPE_BYTES[hp.dtype]]
    if name_dt == "bf16":
        vals = bf16_to_f32_array(raw.view(np.uint16))
    else:
        vals = raw.view({"f32": np.float32, "f16": np.float16, "i32": np.int32}[name_dt])
    return vals.astype(_HOST_DTYPES[s.dtype]).reshape(s.shape)


def base_dir_of(path: str | None) -> str | None:
    return str(Path(path).resolve().parent) if path else None

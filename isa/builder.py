"""ProgramBuilder: the Python API that makes Programs (the assembler and the compiler use it).

    pb = ProgramBuilder("scale")
    pb.route(0, 0, 4, 1, color=0, rx="W|RAMP", tx="E|RAMP")
    rb = pb.region("row", 0, 0, 4, 1)
    buf = rb.alloc("buf", 64 * 4)
    rb.dmem("d0", "f32", buf, 64)      # one method per instruction of isa/spec.py
    rb.halt()
    program = pb.build()

Alloc addresses come after the code, so they are only known at build(): `alloc` returns an
`Addr`, which supports integer arithmetic and may be used wherever an integer operand or data
address is expected. HBM buffers (`pb.hbm_alloc`) are placed from address 0 in call order, so
their addresses are plain integers at once; `pb.hbm_init` puts tensor data in them and
`pb.hbm_piece` keeps a whole input or output there. Every method takes an optional `loc` =
(file, line, col) that errors raised for that call (now or at build()) carry; the assembler
passes its source positions.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import keyword
import operator
from collections.abc import Sequence

import numpy as np

from wse_emu.isa.encoding import REGISTERS, FBits, encode, float_bits, kind_text, operand_field
from wse_emu.isa.errors import BuildError, EncodingError, FormatError
from wse_emu.isa.expr import PLAIN_NAME, RESERVED
from wse_emu.isa.program import (DIR_BITS, Alloc, DataInit, HbmAlloc, HbmInit, HbmPiece, Program, Rect,
                         Region, RouteRule, Symbol, Tensor, TileMap)
from wse_emu.isa.program_checks import check_program
from wse_emu.isa.spec import (BY_MNEMONIC, DTYPE_BYTES, DTYPE_NAMES, DTYPES, INSTRUCTIONS,
                               STORAGE_DTYPES, SYMBOL_DTYPES, TENSOR_DTYPES, TENSOR_ITEMSIZE)

Loc = tuple[str, int, int]



class Addr:
    """An integer known only at build() (an alloc address, or integer arithmetic on one)."""

    __slots__ = ("_resolve", "text")

    def __init__(self, resolve, text: str):
        self._resolve = resolve
        self.text = text

    def resolve(self) -> int:
        return self._resolve()

    def __repr__(self) -> str:
        return f"Addr({self.text})"


def _addr_op(symbol: str, fn, reflected: bool):
    def method(self, other):
        if isinstance(other, np.integer):
            other = int(other)
        if isinstance(other, bool) or not isinstance(other, (int, Addr)):
            return NotImplemented
        left, right = (other, self) if reflected else (self, other)
        text = f"({_text(left)} {symbol} {_text(right)})"
        return Addr(lambda: fn(_value(left), _value(right)), text)
    return method


def _text(v) -> str:
    return v.text if isinstance(v, Addr) else str(v)


def _value(v) -> int:
    return v.resolve() if isinstance(v, Addr) else v


for _name, _sym, _fn in (("add", "+", operator.add), ("sub", "-", operator.sub),
                         ("mul", "*", operator.mul), ("floordiv", "/", operator.floordiv),
                         ("mod", "%", operator.mod), ("lshift", "<<", operator.lshift),
                         ("rshift", ">>", operator.rshift), ("and", "&", operator.and_),
                         ("or", "|", operator.or_), ("xor", "^", operator.xor)):
    setattr(Addr, f"__{_name}__", _addr_op(_sym, _fn, False))
    setattr(Addr, f"__r{_name}__", _addr_op(_sym, _fn, True))
Addr.__neg__ = lambda self: Addr(lambda: -self.resolve(), f"-{self.text}")
Addr.__pos__ = lambda self: self
Addr.__invert__ = lambda self: Addr(lambda: ~self.resolve(), f"~{self.text}")


# ---------------------------------------------------------------------------------------------
# Small conversions shared with the assembler.


def dtype_code(value, what: str = "dtype") -> int:
    """An SRAM dtype code from a name ('f32') or a code; BuildError otherwise."""
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    if isinstance(value, int) and not isinstance(value, bool) and value in DTYPE_NAMES:
        return value
    raise BuildError(f"{what} must be one of {', '.join(DTYPES)}, got {value!r}")


def storage_code(value, what: str = "dtype") -> int:
    """An SRAM storage dtype code (what tile maps hold, i32 included) from a name or a code."""
    if isinstance(value, str) and value in STORAGE_DTYPES:
        return STORAGE_DTYPES[value]
    if isinstance(value, int) and not isinstance(value, bool) and value in DTYPE_NAMES:
        return value
    raise BuildError(f"{what} must be one of {', '.join(STORAGE_DTYPES)}, got {value!r}")


def port_mask(value, what: str) -> int:
    """A router port mask from 'W', 'E|RAMP', ['N', 'S'] or an integer mask."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < 1 << len(DIR_BITS):
            raise BuildError(f"{what} mask {value} is outside 0..{(1 << len(DIR_BITS)) - 1}")
        return value
    names = value.split("|") if isinstance(value, str) else list(value)
    mask = 0
    for name in names:
        name = name.strip()
        if name not in DIR_BITS:
            raise BuildError(f"{what}: unknown port {name!r} (ports: {' '.join(DIR_BITS)})")
        mask |= DIR_BITS[name]
    return mask


def _int_min(value, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise BuildError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise BuildError(f"{what} must be an integer, got {value!r}")
    return int(value)


def _shape(shape, what: str) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    dims = tuple(shape)
    if not dims:
        raise BuildError(f"{what}: a shape needs at least one dimension")
    return tuple(_int_min(d, f"{what}: dimension {i}") for i, d in enumerate(dims))


def _affine(value, what: str) -> tuple[int, int, int]:
    """(c0, c_dy, c_dx) from an int (constant) or a 3-tuple."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value), 0, 0)
    coeffs = tuple(value)
    if len(coeffs) != 3:
        raise BuildError(f"{what} must be an int or (start, step_y, step_x), got {value!r}")
    return tuple(_int(c, what) for c in coeffs)


def _bf16_bits(x32: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits with round-to-nearest-even (NaN stays a quiet NaN)."""
    bits = x32.view("<u4").astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    quiet = ((bits >> 16) | 0x40).astype("<u2")
    return np.where(np.isnan(x32), quiet, rounded)


def tensor_from_array(name: str, array, dtype: str | None = None) -> Tensor:
    """A Tensor with inline C-order bytes from a NumPy array.

    Accepted: float32, float16 and int32 (any integer array whose values fit int32); float64
    is first converted to float32. `dtype` ('f32', 'f16', 'bf16', 'i32' or the Tensor dtype
    strings) converts floats with round-to-nearest-even; a uint16 array with dtype='bf16' is
    taken as raw bf16 bits.
    """
    arr = np.asarray(array)
    kind = arr.dtype.kind
    if dtype is not None and dtype not in TENSOR_DTYPES:
        dtype = {v: k for k, v in TENSOR_DTYPES.items()}.get(dtype, dtype)
    if dtype is not None and dtype not in TENSOR_DTYPES:
        raise BuildError(f"tensor {name!r}: dtype must be one of {', '.join(TENSOR_DTYPES)}, "
                         f"got {dtype!r}")
    if arr.dtype == np.uint16 and dtype == "bf16":
        return Tensor(name, "bf16", tuple(arr.shape), arr.astype("<u2").tobytes(order="C"))
    if kind == "f" and arr.dtype.itemsize in (2, 4, 8):
        if arr.dtype.itemsize == 8:
            arr = arr.astype(np.float32)
        target = dtype or ("f16" if arr.dtype.itemsize == 2 else "f32")
        if target == "i32":
            raise BuildError(f"tensor {name!r}: a float array cannot become i32")
        if target == "bf16":
            data = _bf16_bits(arr.astype(np.float32)).tobytes(order="C")
        else:
            data = arr.astype(TENSOR_DTYPES[target]).tobytes(order="C")
        return Tensor(name, TENSOR_DTYPES[target], tuple(arr.shape), data)
    # uint16 is how bf16 bits travel in .npy files: refuse to guess it is meant as integers
    if kind in "iu" and (dtype == "i32" or (dtype is None and arr.dtype != np.uint16)):
        if arr.size and (arr.min() < -(1 << 31) or arr.max() >= 1 << 31):
            raise BuildError(f"tensor {name!r}: integer values do not fit int32")
        return Tensor(name, "<i4", tuple(arr.shape), arr.astype("<i4").tobytes(order="C"))
    hint = " (uint16 arrays need dtype='bf16')" if arr.dtype == np.uint16 else ""
    raise BuildError(f"tensor {name!r}: arrays of {arr.dtype} cannot be stored as "
                     f"{dtype or 'a tensor'}: use float32, float16 or int32{hint}")


# ---------------------------------------------------------------------------------------------


class RegionBuilder:
    """Code, allocs and data of one region; made by ProgramBuilder.region()."""

    def __init__(self, name: str, rect: Rect):
        self.name = name
        self.rect = rect
        self._code: list[tuple] = []  # (Instr, values, loc, operand locs)
        self._labels: dict[str, tuple[int, Loc | None]] = {}
        self._allocs: list[tuple[str, int, int, int | None, Loc | None]] = []
        self._alloc_addrs: list[int] | None = None
        self._data: list[tuple[DataInit, Addr | int, Loc | None]] = []
        self._pieces: list[tuple[str, TileMap, Addr | int, Loc | None]] = []

    @property
    def pc(self) -> int:
        """The index the next instruction will get."""
        return len(self._code)

    def label(self, name: str, loc: Loc | None = None) -> None:
        if not isinstance(name, str) or not name or any(ch.isspace() for ch in name):
            raise BuildError(f"region {self.name!r}: label {name!r} must be a non-empty name "
                             "without spaces", loc)
        if name in self._labels:
            raise BuildError(f"region {self.name!r}: duplicate label {name!r}", loc)
        self._labels[name] = (len(self._code), loc)

    def alloc(self, name: str, nbytes: int, align: int = 8, at: int | None = None,
              loc: Loc | None = None) -> Addr:
        """Reserve nbytes of SRAM after the code (or at `at`); returns its address."""
        where = f"region {self.name!r}: alloc {name!r}"
        if not isinstance(name, str) or not name:
            raise BuildError(f"region {self.name!r}: alloc name must be a non-empty string", loc)
        if any(a[0] == name for a in self._allocs):
            raise BuildError(f"{where} is defined twice", loc)
        try:
            nbytes = _int_min(nbytes, f"{where}: size", 0)
            align = _int_min(align, f"{where}: alignment")
            if align & (align - 1):
                raise BuildError(f"{where}: alignment {align} is not a power of two")
            if at is not None:
                at = _int_min(at, f"{where}: address", 0)
        except BuildError as e:
            raise BuildError(e.message, loc) from None
        index = len(self._allocs)
        self._allocs.append((name, nbytes, align, at, loc))
        return Addr(lambda: self._alloc_address(index), name)

    def _alloc_address(self, index: int) -> int:
        if self._alloc_addrs is None:
            raise BuildError(f"region {self.name!r}: the address of alloc "
                             f"{self._allocs[index][0]!r} is known only at build()")
        return self._alloc_addrs[index]

    def _place_allocs(self) -> None:
        cursor = len(self._code) * 8
        addrs = []
        for _name, nbytes, align, at, _loc in self._allocs:
            addr = at if at is not None else -(-cursor // align) * align
            addrs.append(addr)
            cursor = max(cursor, addr + nbytes)
        self._alloc_addrs = addrs

    def _rect(self, rect, loc: Loc | None) -> Rect:
        """An absolute Rect from a region-relative (x, y, w, h); None = the whole region."""
        if rect is None:
            return self.rect
        try:
            x, y, w, h = (_int(v, "rect") for v in rect)
        except (TypeError, ValueError, BuildError):
            raise BuildError(f"rect must be (x, y, w, h) integers, got {rect!r}", loc) from None
        if x < 0 or y < 0 or w < 1 or h < 1 or x + w > self.rect.w or y + h > self.rect.h:
            raise BuildError(f"rect ({x}, {y}, {w}, {h}) is not inside region {self.name!r} "
                             f"({self.rect.w} x {self.rect.h})", loc)
        return Rect(self.rect.x + x, self.rect.y + y, w, h)

    def _tilemap(self, addr, dtype, tile, row, col, order, rect, loc) -> tuple[TileMap, object]:
        try:
            code = storage_code(dtype)
            tile = tuple(tile)
            if len(tile) != 2:
                raise BuildError(f"tile must be (rows, cols), got {tile!r}")
            tile = (_int_min(tile[0], "tile rows"), _int_min(tile[1], "tile cols"))
            r0, rdy, rdx = _affine(row, "row")
            c0, cdy, cdx = _affine(col, "col")
            if order not in ("F", "C"):
                raise BuildError(f"order must be 'F' or 'C', got {order!r}")
            if not isinstance(addr, Addr):
                addr = _int_min(addr, "address", 0)
        except BuildError as e:
            raise BuildError(e.message, loc) from None
        tm = TileMap(self._rect(rect, loc), 0, code, tile, r0, rdy, rdx, c0, cdy, cdx, order)
        return tm, addr

    def load(self, tensor: str, addr, dtype, tile, row=0, col=0, order: str = "F", rect=None,
             loc: Loc | None = None) -> None:
        """Put tile (row, col) of `tensor` at addr on every PE of rect (region-relative).

        row / col are an int or (start, step_y, step_x): PE (rx, ry) of rect, relative to the
        rect's corner, holds tile (row0 + ry * row_dy + rx * row_dx, col0 + ry * col_dy +
        rx * col_dx), as in isa.program.TileMap; order 'F' = column-major (what mv reads).
        """
        if not isinstance(tensor, str):
            raise BuildError(f"load: tensor must be a tensor name, got {tensor!r}", loc)
        tm, addr = self._tilemap(addr, dtype, tile, row, col, order, rect, loc)
        self._data.append((DataInit(tm, tensor=tensor), addr, loc))

    def init(self, addr, dtype, values: Sequence, rect=None, loc: Loc | None = None) -> None:
        """Put the given values at addr on every PE of rect: floats (or FBits for exact bits)
        for f32/f16/bf16, integers for i32."""
        try:
            code = storage_code(dtype)
            fmt = DTYPE_NAMES[code]
            if not isinstance(addr, Addr):
                addr = _int_min(addr, "address", 0)
            values = list(values.tolist() if isinstance(values, np.ndarray) else values)
            if not values:
                raise BuildError("init needs at least one value")
            width = DTYPE_BYTES[code]
            data = bytearray()
            for i, v in enumerate(values):
                data += _element_bits(v, fmt, i).to_bytes(width, "little")
        except BuildError as e:
            raise BuildError(e.message, loc) from None
        tm = TileMap(self._rect(rect, loc), 0, code, (len(values), 1))
        self._data.append((DataInit(tm, inline=bytes(data)), addr, loc))

    def piece(self, symbol: str, addr, dtype, tile, row=0, col=0, order: str = "C", rect=None,
              loc: Loc | None = None) -> None:
        """One piece of input/output `symbol`: its tiles as in load(), at addr on rect's PEs."""
        if not isinstance(symbol, str):
            raise BuildError(f"piece: symbol must be a symbol name, got {symbol!r}", loc)
        tm, addr = self._tilemap(addr, dtype, tile, row, col, order, rect, loc)
        self._pieces.append((symbol, tm, addr, loc))

    def emit(self, mnemonic: str, *operands, loc: Loc | None = None,
             operand_locs: Sequence[Loc | None] | None = None) -> None:
        """Append one instruction; operands in the order of its isa/spec.py row.

        Registers as numbers or names ('r3', 'X', 'f1', 'd0'), dtypes as names or codes, labels
        as strings (forward references allowed), integers or Addr, floats or FBits for fimm.
        """
        ins = BY_MNEMONIC.get(mnemonic)
        if ins is None:
            raise BuildError(f"unknown mnemonic {mnemonic!r}", loc)
        if len(operands) != len(ins.operands):
            names = ", ".join(op[0] for op in ins.operands)
            raise BuildError(f"{mnemonic} takes {len(ins.operands)} operands ({names}), "
                             f"got {len(operands)}", loc)
        locs = list(operand_locs) if operand_locs is not None else [loc] * len(operands)
        values = []
        for i, ((name, kind, _slot), value) in enumerate(zip(ins.operands, operands)):
            value = self._operand(ins, name, kind, value, locs[i] or loc)
            if not isinstance(value, (Addr, str)):
                try:
                    operand_field(ins, i, value)
                except EncodingError as e:
                    raise BuildError(str(e), locs[i] or loc) from None
            values.append(value)
        self._code.append((ins, values, loc, locs))

    def _operand(self, ins, name, kind, value, loc):
        where = f"{ins.mnemonic}: operand {name!r}"
        if isinstance(value, np.integer):
            value = int(value)
        if kind in ("ireg", "iregw", "freg", "dreg") and isinstance(value, str):
            reg = REGISTERS.get(value)
            want = {"ireg": "i", "iregw": "i", "freg": "f", "dreg": "d"}[kind]
            if reg is None or reg[0] != want:
                raise BuildError(f"{where} must be {kind_text(kind)}, got {value!r}", loc)
            return reg[1]
        if kind == "dtype":
            try:
                return dtype_code(value, where)
            except BuildError as e:
                raise BuildError(e.message, loc) from None
        if kind == "target" and isinstance(value, str):
            return value
        if kind == "fimm" and isinstance(value, (float, np.floating)):
            return float(value)
        if isinstance(value, str):
            raise BuildError(f"{where}: unexpected name {value!r}", loc)
        return value

    def _resolve_code(self) -> tuple[int, ...]:
        words = []
        for ins, values, loc, locs in self._code:
            resolved = {}
            for i, ((name, kind, _slot), value) in enumerate(zip(ins.operands, values)):
                where = locs[i] or loc
                if isinstance(value, str):
                    if value not in self._labels:
                        raise BuildError(f"region {self.name!r}: unknown label {value!r}", where)
                    value = self._labels[value][0]
                else:
                    value = _resolve(value, where)
                try:
                    operand_field(ins, i, value)
                except EncodingError as e:
                    raise BuildError(str(e), where) from None
                resolved[name] = value
            words.append(encode(ins.mnemonic, resolved))
        return tuple(words)


def _element_bits(v, fmt: str, index: int) -> int:
    if fmt == "i32":
        return _int32_bits(v, index)
    width = 32 if fmt == "f32" else 16
    if isinstance(v, FBits):
        if not 0 <= v.bits < 1 << width:
            raise BuildError(f"value {index}: fbits({v.bits:#x}) does not fit {width} bits")
        return v.bits
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise BuildError(f"value {index} must be a number, got {v!r}")
    try:
        return float_bits(float(v) if isinstance(v, np.floating) else int(v)
                          if isinstance(v, np.integer) else v, fmt)
    except (ValueError, OverflowError):
        raise BuildError(f"value {index} ({v!r}) is out of range for {fmt}") from None


def _int32_bits(v, index: int) -> int:
    """Two's-complement bits of an int32 value; a float (even 3.0) is refused, not truncated."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise BuildError(f"value {index} must be an integer for i32, got {v!r}")
    v = int(v)
    if not -(1 << 31) <= v < 1 << 31:
        raise BuildError(f"value {index} ({v}) is out of range for i32")
    return v & 0xFFFFFFFF


def _make_instr_method(ins):
    def method(self, *operands, loc=None, operand_locs=None):
        self.emit(ins.mnemonic, *operands, loc=loc, operand_locs=operand_locs)
    method.__name__ = ins.mnemonic + "_" if keyword.iskeyword(ins.mnemonic) else ins.mnemonic
    syntax = ", ".join(op[0] for op in ins.operands)
    method.__doc__ = f"{ins.mnemonic} {syntax}: {ins.doc}"
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
    params += [inspect.Parameter(op[0], inspect.Parameter.POSITIONAL_ONLY)
               for op in ins.operands]
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None)
               for k in ("loc", "operand_locs")]
    method.__signature__ = inspect.Signature(params)
    return method


for _ins in INSTRUCTIONS:
    _method = _make_instr_method(_ins)
    if hasattr(RegionBuilder, _method.__name__):
        raise RuntimeError(f"mnemonic {_ins.mnemonic!r} clashes with "
                           f"RegionBuilder.{_method.__name__}")
    setattr(RegionBuilder, _method.__name__, _method)


# ---------------------------------------------------------------------------------------------


class ProgramBuilder:
    """Collects a program's parts in call order; build() validates and returns the Program."""

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise BuildError("a program needs a non-empty name")
        self.name = name
        self._params: list[tuple[str, int | str, Loc | None]] = []
        self._meta: dict = {}
        self._meta_loc: Loc | None = None
        self._tensors: list[tuple[Tensor, Loc | None]] = []
        self._symbols: list[tuple[str, str, str, tuple[int, ...], Loc | None]] = []
        self._routes: list[tuple[RouteRule, Loc | None]] = []
        self._regions: list[tuple[RegionBuilder, Loc | None]] = []
        self._hbm_allocs: list[tuple[HbmAlloc, Loc | None]] = []
        self._hbm_cursor = 0  # the end of the highest HBM buffer so far
        self._hbm_inits: list[tuple[HbmInit, Loc | None]] = []
        self._hbm_pieces: list[tuple[HbmPiece, Loc | None]] = []

    def param(self, name: str, value: int | str, loc: Loc | None = None) -> None:
        """Record a resolved parameter (Program.params), for people and `wse-emu info`."""
        if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name) or name in RESERVED:
            raise BuildError(f"parameter name {name!r} must be an identifier that is not a "
                             "register, dtype, function or keyword", loc)
        if any(p[0] == name for p in self._params):
            raise BuildError(f"duplicate parameter {name!r}", loc)
        if isinstance(value, np.integer):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, (int, str)) \
                or (isinstance(value, str) and value not in SYMBOL_DTYPES):
            raise BuildError(f"parameter {name!r} must be an integer or a dtype name "
                             f"({', '.join(SYMBOL_DTYPES)}), got {value!r}", loc)
        self._params.append((name, value, loc))

    def meta(self, key: str, value, loc: Loc | None = None) -> None:
        """Free-form metadata (any JSON value), kept in program.bin."""
        if not isinstance(key, str) or not key:
            raise BuildError(f"meta key must be a non-empty string, got {key!r}", loc)
        if key in self._meta:
            raise BuildError(f"duplicate meta key {key!r}", loc)
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise BuildError(f"meta {key!r} is not a JSON value: {e}", loc) from None
        self._meta[key] = value
        self._meta_loc = self._meta_loc or loc

    def tensor(self, name: str, array=None, shape=None, file: str | None = None,
               key: str | None = None, dtype: str | None = None,
               loc: Loc | None = None) -> str:
        """A resident tensor: inline from `array`, or a safetensors reference (file, key, dtype).

        Returns the name, for load(). `key` defaults to the name.
        """
        if not isinstance(name, str) or not name:
            raise BuildError(f"tensor name must be a non-empty string, got {name!r}", loc)
        try:
            if array is not None and file is None:
                tensor = tensor_from_array(name, array, dtype)
                if shape is not None and _shape(shape, f"tensor {name!r}") != tensor.shape:
                    raise BuildError(f"tensor {name!r}: the array has shape {tensor.shape}, "
                                     f"declared {tuple(shape)}")
            elif file is not None and array is None:
                if shape is None or dtype is None:
                    raise BuildError(f"tensor {name!r}: a file reference needs shape and dtype")
                tdtype = TENSOR_DTYPES.get(dtype, dtype)
                if tdtype not in TENSOR_ITEMSIZE:
                    raise BuildError(f"tensor {name!r}: dtype must be one of "
                                     f"{', '.join(TENSOR_DTYPES)}, got {dtype!r}")
                if not isinstance(file, str) or not file:
                    raise BuildError(f"tensor {name!r}: file must be a non-empty path")
                tensor = Tensor(name, tdtype, _shape(shape, f"tensor {name!r}"),
                                file=file, key=name if key is None else key)
            else:
                raise BuildError(f"tensor {name!r} has no data: give an array or file= "
                                 "(not both)")
        except BuildError as e:
            raise BuildError(e.message, loc) from None
        self._tensors.append((tensor, loc))
        return name

    def _symbol(self, kind: str, name: str, dtype: str, shape, loc: Loc | None) -> str:
        if dtype not in SYMBOL_DTYPES:
            raise BuildError(f"{kind} {name!r}: dtype must be one of {', '.join(SYMBOL_DTYPES)}, "
                             f"got {dtype!r}", loc)
        try:
            dims = _shape(shape, f"{kind} {name!r}")
        except BuildError as e:
            raise BuildError(e.message, loc) from None
        self._symbols.append((name, kind, dtype, dims, loc))
        return name

    def input(self, name: str, dtype: str, shape, loc: Loc | None = None) -> str:
        """A host input; its layout comes from RegionBuilder.piece() calls."""
        return self._symbol("input", name, dtype, shape, loc)

    def output(self, name: str, dtype: str, shape, loc: Loc | None = None) -> str:
        """A host output; its layout comes from RegionBuilder.piece() calls."""
        return self._symbol("output", name, dtype, shape, loc)

    def route(self, x: int, y: int, w: int, h: int, color: int, rx, tx,
              loc: Loc | None = None) -> None:
        """Every PE of the absolute rect accepts `color` from rx and forwards it to tx.

        rx / tx: 'W', 'E|RAMP', a list of port names or a mask over isa.program.DIR_BITS.
        """
        try:
            rect = Rect(_int(x, "route x"), _int(y, "route y"), _int(w, "route w"),
                        _int(h, "route h"))
            rule = RouteRule(rect, _int(color, "route color"), port_mask(rx, "rx"),
                             port_mask(tx, "tx"))
        except BuildError as e:
            raise BuildError(e.message, loc) from None
        self._routes.append((rule, loc))

    def region(self, name: str, x: int, y: int, w: int, h: int,
               loc: Loc | None = None) -> RegionBuilder:
        """A rectangle of PEs (absolute coordinates) that all run the code given to it."""
        try:
            rect = Rect(_int(x, "region x"), _int(y, "region y"), _int(w, "region w"),
                        _int(h, "region h"))
        except BuildError as e:
            raise BuildError(e.message, loc) from None
        rb = RegionBuilder(name, rect)
        self._regions.append((rb, loc))
        return rb

    # -- HBM ----------------------------------------------------------------------------------

    def hbm_alloc(self, name: str, nbytes: int, align: int = 64, at: int | None = None,
                  loc: Loc | None = None) -> int:
        """Reserve nbytes of HBM and return the buffer's byte address.

        Buffers are placed one after another from address 0, each at the next multiple of
        `align` (a power of two); `at` gives an explicit address instead, and later buffers
        continue after the highest end so far. Program.hbm_bytes is the end of the highest.
        """
        if not isinstance(name, str) or not name:
            raise BuildError(f"HBM buffer name must be a non-empty string, got {name!r}", loc)
        where = f"HBM buffer {name!r}"
        if any(a.name == name for a, _ in self._hbm_allocs):
            raise BuildError(f"{where} is defined twice", loc)
        try:
            nbytes = _int_min(nbytes, f"{where}: size", 0)
            align = _int_min(align, f"{where}: alignment")
            if align & (align - 1):
                raise BuildError(f"{where}: alignment {align} is not a power of two")
            if at is not None:
                at = _int_min(at, f"{where}: address", 0)
        except BuildError as e:
            raise BuildError(e.message, loc) from None
        addr = at if at is not None else -(-self._hbm_cursor // align) * align
        self._hbm_cursor = max(self._hbm_cursor, addr + nbytes)
        self._hbm_allocs.append((HbmAlloc(name, addr, nbytes), loc))
        return addr

    def hbm_init(self, tensor: str, addr: int, dtype, tile_rows: int = 0, order: str = "F",
                 transpose: bool = False, rows=None, loc: Loc | None = None) -> None:
        """Write tensor data into HBM at addr before the run (isa.program.HbmInit).

        The tensor's 2-D view S, transposed when `transpose`, cut to rows (r0, r1) when `rows`
        is given, is split into row tiles of `tile_rows` rows (0 = all rows), written one after
        another, each column-major ('F', what mv reads) or row-major ('C'), in `dtype`. Its
        bytes must lie inside one hbm_alloc buffer.
        """
        try:
            if not isinstance(tensor, str) or not tensor:
                raise BuildError(f"hbm_init: tensor must be a tensor name, got {tensor!r}")
            what = f"hbm_init of tensor {tensor!r}"
            addr = _int_min(addr, f"{what}: address", 0)
            code = storage_code(dtype, f"{what}: dtype")
            tile_rows = _int_min(tile_rows, f"{what}: tile_rows", 0)
            if order not in ("F", "C"):
                raise BuildError(f"{what}: order must be 'F' or 'C', got {order!r}")
            if not isinstance(transpose, (bool, np.bool_)):
                raise BuildError(f"{what}: transpose must be True or False, got {transpose!r}")
            if rows is not None:
                try:
                    r0, r1 = rows
                except (TypeError, ValueError):
                    raise BuildError(f"{what}: rows must be (start, end), got {rows!r}") from None
                r0 = _int_min(r0, f"{what}: rows start", 0)
                r1 = _int_min(r1, f"{what}: rows end", 0)
                if r1 <= r0:
                    raise BuildError(f"{what}: rows ({r0}, {r1}) is empty (end must be after "
                                     "start)")
                rows = (r0, r1)
        except BuildError as e:
            raise BuildError(e.message, loc) from None
        init = HbmInit(tensor, addr, code, tile_rows, order, bool(transpose), rows)
        self._hbm_inits.append((init, loc))

    def hbm_piece(self, symbol: str, addr: int, dtype, loc: Loc | None = None) -> None:
        """Keep input/output `symbol` in HBM: all of it, row-major, contiguous from addr, in
        storage dtype `dtype` (the symbol then has no SRAM pieces)."""
        try:
            if not isinstance(symbol, str) or not symbol:
                raise BuildError(f"hbm_piece: symbol must be a symbol name, got {symbol!r}")
            what = f"hbm_piece of {symbol!r}"
            piece = HbmPiece(symbol, _int_min(addr, f"{what}: address", 0),
                             storage_code(dtype, f"{what}: dtype"))
        except BuildError as e:
            raise BuildError(e.message, loc) from None
        self._hbm_pieces.append((piece, loc))

    # -----------------------------------------------------------------------------------------

    def build(self) -> Program:
        """The validated Program (BuildError naming the first problem and its loc)."""
        regions, data, data_locs = [], [], []
        pieces: dict[str, list[tuple[TileMap, Loc | None]]] = {s[0]: [] for s in self._symbols}
        for rb, _loc in self._regions:
            rb._place_allocs()
            code = rb._resolve_code()
            allocs = tuple(Alloc(a[0], addr, a[1]) for a, addr in zip(rb._allocs, rb._alloc_addrs))
            labels = tuple(sorted(((n, v[0]) for n, v in rb._labels.items()),
                                  key=lambda item: (item[1], item[0])))
            regions.append(Region(rb.name, rb.rect, code, allocs, labels))
            for init, addr, loc in rb._data:
                data.append(DataInit(_with_addr(init.tilemap, addr, loc), init.tensor, init.inline))
                data_locs.append(loc)
            for symbol, tm, addr, loc in rb._pieces:
                if symbol not in pieces:
                    raise BuildError(f"region {rb.name!r}: piece of undeclared symbol {symbol!r} "
                                     "(declare it with input/output first)", loc)
                pieces[symbol].append((_with_addr(tm, addr, loc), loc))
        symbols = tuple(Symbol(name, kind, dtype, shape, tuple(p[0] for p in pieces[name]))
                        for name, kind, dtype, shape, _loc in self._symbols)
        program = Program(
            name=self.name, regions=tuple(regions), routes=tuple(r for r, _ in self._routes),
            tensors=tuple(t for t, _ in self._tensors), data=tuple(data), symbols=symbols,
            params=tuple((n, v) for n, v, _ in self._params), meta=dict(self._meta),
            hbm_allocs=tuple(a for a, _ in self._hbm_allocs),
            hbm_inits=tuple(i for i, _ in self._hbm_inits),
            hbm_pieces=tuple(p for p, _ in self._hbm_pieces))
        try:
            check_program(program)
        except FormatError as e:
            raise BuildError(str(e), self._loc_of(e.subject, data_locs, pieces)) from None
        return program

    def _loc_of(self, subject, data_locs, pieces) -> Loc | None:
        if not subject:
            return None
        kind, *idx = subject
        if kind in ("region", "instr", "label", "alloc"):
            rb, loc = self._regions[idx[0]]
            if kind == "instr":
                return rb._code[idx[1]][2] or loc
            if kind == "label":
                ordered = sorted(rb._labels.items(), key=lambda item: (item[1][0], item[0]))
                return ordered[idx[1]][1][1] or loc
            if kind == "alloc":
                return rb._allocs[idx[1]][4] or loc
            return loc
        if kind == "route":
            return self._routes[idx[0]][1]
        if kind == "tensor":
            return self._tensors[idx[0]][1]
        if kind == "data":
            return data_locs[idx[0]]
        if kind == "symbol":
            return self._symbols[idx[0]][4]
        if kind == "piece":
            return pieces[self._symbols[idx[0]][0]][idx[1]][1]
        if kind == "param":
            return self._params[idx[0]][2]
        if kind == "hbm_alloc":
            return self._hbm_allocs[idx[0]][1]
        if kind == "hbm_init":
            return self._hbm_inits[idx[0]][1]
        if kind == "hbm_piece":
            return self._hbm_pieces[idx[0]][1]
        return self._meta_loc


def _resolve(value, loc: Loc | None) -> int:
    """The int behind an operand or address that may be an Addr."""
    if not isinstance(value, Addr):
        return value
    try:
        return value.resolve()
    except (ZeroDivisionError, ValueError) as e:
        raise BuildError(f"cannot compute {value.text}: {e}", loc) from None


def _with_addr(tm: TileMap, addr, loc: Loc | None) -> TileMap:
    value = _resolve(addr, loc)
    if value < 0:
        raise BuildError(f"address {value} is negative", loc)
    return dataclasses.replace(tm, addr=value)

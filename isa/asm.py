"""The assembler: .wsa text -> Program, through isa.builder (the language: docs/assembly.md).

Three steps: every line is tokenized and split into a statement (labels, a directive or
mnemonic, comma-separated arguments parsed as expressions); statements are nested into blocks
(.if, .rep, .region); the blocks are executed, calling ProgramBuilder / RegionBuilder. Every
error is an AsmError "FILE:LINE:COL: message" pointing at the offending token.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wse_emu.isa.builder import Addr, ProgramBuilder, RegionBuilder
from wse_emu.isa.collectives import FORMS, CollectiveError, LineCollective
from wse_emu.isa.encoding import REGISTERS, FBits, kind_text
from wse_emu.isa.errors import AsmError, BuildError
from wse_emu.isa.expr import (CONSTANTS, RESERVED, ExprError, Node, Token, evaluate, first_col, parse,
                      split_comment, tokenize, truth)
from wse_emu.isa.program import DIR_BITS, Program
from wse_emu.isa.spec import BY_MNEMONIC, DTYPES, N_IREGS, STORAGE_DTYPES, SYMBOL_DTYPES

BLOCK_OPEN = {".if": ".endif", ".rep": ".endrep", ".region": ".endregion"}
DIRECTIVES = (".param", ".set", ".assert", ".if", ".elif", ".else", ".endif", ".rep", ".endrep",
              ".meta", ".program", ".tensor", ".input", ".output", ".route", ".region",
              ".endregion", ".alloc", ".label", ".load", ".init", ".piece", ".hbm", ".hbminit",
              ".hbmpiece", ".collective", ".collect")
_TEMPLATE = re.compile(r"\{([^{}]*)\}")
MAX_REP = 1_000_000  # a guard against typos like `.rep i = 0, 1 << 40`, not a design limit
_META_RE = re.compile(r'\s*\.meta\b\s*(?:([A-Za-z_]\w*)|("(?:[^"\\]|\\.)*"))\s*=(.*)$')


@dataclass
class _Arg:
    key: str | None  # keyword arguments: key=value
    col: int  # column of the argument (of the key for keyword arguments)
    node: Node


@dataclass
class _Stmt:
    line: int
    labels: list[Token]
    head: Token | None
    args: list[_Arg]
    meta: tuple[str, object] | None = None  # .meta key and decoded JSON value


@dataclass
class _Block:
    stmt: _Stmt  # the opening directive (or the statement itself for kind "stmt")
    kind: str  # "stmt" | ".if" | ".rep" | ".region"
    body: list = field(default_factory=list)
    branches: list = field(default_factory=list)  # .if: [(condition stmt, body)], else: None


# ---------------------------------------------------------------------------------------------
# Lines -> statements -> blocks


def _split_args(tokens: list[Token], end_col: int) -> list[_Arg]:
    groups: list[list[Token]] = [[]]
    depth = 0
    commas = []
    for tok in tokens:
        if tok.kind == "op" and tok.text in "([":
            depth += 1
        elif tok.kind == "op" and tok.text in ")]":
            depth -= 1
        if tok.kind == "op" and tok.text == "," and depth == 0:
            groups.append([])
            commas.append(tok.col)
        else:
            groups[-1].append(tok)
    if groups == [[]]:
        return []
    args = []
    for i, group in enumerate(groups):
        stop = commas[i] if i < len(commas) else end_col
        if not group:
            raise ExprError("missing argument", stop)
        if len(group) >= 2 and group[0].kind == "name" and group[1].kind == "op" \
                and group[1].text == "=":
            if group[0].text == "rows":
                args.append(_Arg("rows", group[0].col, _range(group[2:], stop)))
                continue
            args.append(_Arg(group[0].text, group[0].col, parse(group[2:], stop)))
        else:
            args.append(_Arg(None, group[0].col, parse(group, stop)))
    return args


def _range(tokens: list[Token], end_col: int) -> Node:
    """`A:B` (the rows= of .hbminit) as a "range" node of two expressions; without a ':' the
    value is parsed as usual (and .hbminit refuses it)."""
    depth = 0
    for k, tok in enumerate(tokens):
        if tok.kind == "op" and tok.text in "([":
            depth += 1
        elif tok.kind == "op" and tok.text in ")]":
            depth -= 1
        elif tok.kind == "op" and tok.text == ":" and depth == 0:
            if not tokens[:k]:
                raise ExprError("expected a value before ':'", tok.col)
            return Node("range", tokens[0].col,
                        args=(parse(tokens[:k], tok.col), parse(tokens[k + 1:], end_col)))
    return parse(tokens, end_col)


def _statement(line: str, lineno: int) -> _Stmt | None:
    code = split_comment(line)
    m = _META_RE.match(code)
    if m:
        try:
            key = m.group(1) or json.loads(m.group(2))
        except json.JSONDecodeError:
            raise ExprError(f"bad escape in string {m.group(2)}", m.start(2) + 1) from None
        try:
            value = json.loads(m.group(3))
        except json.JSONDecodeError as e:
            raise ExprError(f".meta value is not JSON: {e.msg}", m.start(3) + 1 + e.pos) from None
        head = Token("directive", ".meta", code.index(".meta") + 1)
        return _Stmt(lineno, [], head, [], (key, value))
    tokens = tokenize(code)
    labels = []
    while len(tokens) >= 2 and tokens[0].kind == "name" and tokens[1].kind == "op" \
            and tokens[1].text == ":":
        labels.append(tokens[0])
        tokens = tokens[2:]
    if not tokens:
        return _Stmt(lineno, labels, None, []) if labels else None
    head = tokens[0]
    if head.kind not in ("directive", "name"):
        raise ExprError(f"expected a directive or a mnemonic, got {head.text!r}", head.col)
    return _Stmt(lineno, labels, head, _split_args(tokens[1:], len(code.rstrip()) + 1))


def _blocks(stmts: list[_Stmt], file: str) -> list[_Block]:
    root: list[_Block] = []
    stack: list[tuple[_Block, list]] = []  # open block and the body being filled

    def err(stmt: _Stmt, message: str):
        raise AsmError(message, file, stmt.line, stmt.head.col if stmt.head else 1)

    for stmt in stmts:
        body = stack[-1][1] if stack else root
        d = stmt.head.text if stmt.head is not None and stmt.head.kind == "directive" else None
        if stmt.labels and d in (*BLOCK_OPEN, *BLOCK_OPEN.values(), ".elif", ".else"):
            # `end: .endregion` labels the end of the region: the label stays in this body
            body.append(_Block(_Stmt(stmt.line, stmt.labels, None, []), "stmt"))
        if d in BLOCK_OPEN:
            if d == ".region" and any(b.kind == ".region" for b, _ in stack):
                err(stmt, ".region inside a .region (close the first with .endregion)")
            block = _Block(stmt, d)
            if d == ".if":
                block.branches.append((stmt, block.body))
            body.append(block)
            stack.append((block, block.body))
        elif d in (".elif", ".else"):
            if not stack or stack[-1][0].kind != ".if":
                err(stmt, f"{d} without .if")
            block = stack[-1][0]
            if block.branches[-1][0] is None:
                err(stmt, f"{d} after .else")
            new_body: list = []
            block.branches.append((stmt if d == ".elif" else None, new_body))
            stack[-1] = (block, new_body)
        elif d in (".endif", ".endrep", ".endregion"):
            opener = next(k for k, v in BLOCK_OPEN.items() if v == d)
            if not stack or stack[-1][0].kind != opener:
                inside = ""
                if stack:
                    open_kind = stack[-1][0].kind
                    inside = f" (inside {open_kind}, which needs {BLOCK_OPEN[open_kind]})"
                err(stmt, f"{d} without {opener}{inside}")
            stack.pop()
        else:
            body.append(_Block(stmt, "stmt"))
    if stack:
        block = stack[-1][0]
        err(block.stmt, f"{block.kind} is never closed with {BLOCK_OPEN[block.kind]}")
    return root


# ---------------------------------------------------------------------------------------------
# Execution


class _Assembler:
    def __init__(self, file: str, defines, data, data_paths, base_dir):
        self.file = file
        self.defines = dict(defines or {})
        self.used_defines: set[str] = set()
        self.data = dict(data or {})
        self.data_paths = dict(data_paths or {})
        self.base_dir = Path(base_dir) if base_dir else Path.cwd()
        name = Path(file).stem if not file.startswith("<") else "program"
        self.pb = ProgramBuilder(name or "program")
        self.named_program = False
        self.params: dict[str, object] = {}
        self.sets: dict[str, object] = {}
        self.reps: dict[str, int] = {}
        self.region: RegionBuilder | None = None
        self.allocs: dict[str, Addr] = {}
        self.hbm: dict[str, int] = {}  # HBM buffer addresses (program-wide, unlike allocs)
        self.coords: tuple[int, int] | None = None
        self.collectives: dict[str, LineCollective] = {}
        self.line = 0

    # -- errors and evaluation ----------------------------------------------------------------

    def loc(self, col: int) -> tuple[str, int, int]:
        return (self.file, self.line, col)

    def fail(self, message: str, col: int):
        raise AsmError(message, self.file, self.line, col)

    def expand(self, name: str, col: int) -> str:
        """A name with its {EXPR} parts replaced by their integer values (`done_{i}`)."""
        if "{" not in name:
            return name

        def value(m: re.Match) -> str:
            inner_col = col + m.start(1)
            try:
                v = evaluate(parse(tokenize(m.group(1)), len(m.group(1)) + 1), self.lookup)
            except ExprError as e:
                raise ExprError(e.message, inner_col + e.col - 1) from None
            if isinstance(v, bool) or not isinstance(v, int):
                raise ExprError(f"{{...}} in a name must be an integer, got {v!r}", inner_col)
            return str(v)
        try:
            return _TEMPLATE.sub(value, name)
        except ExprError as e:
            self.fail(e.message, e.col)

    def lookup(self, name: str, col: int):
        name = self.expand(name, col)
        for scope in (self.reps, self.sets, self.params, self.allocs, self.hbm):
            if name in scope:
                return scope[name]
        if name in ("rx", "ry"):
            if self.coords is None:
                raise ExprError("rx and ry can only be used in row= and col=", col)
            return self.coords[0] if name == "rx" else self.coords[1]
        if name in REGISTERS:
            raise ExprError(f"register {name} cannot be used in an expression", col)
        known = [*self.reps, *self.sets, *self.params, *self.allocs, *self.hbm]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ExprError(f"undefined name {name!r}{hint}", col)

    def condition(self, node: Node) -> bool:
        try:
            return truth(self.value(node), first_col(node))
        except ExprError as e:
            self.fail(e.message, e.col)

    def value(self, node: Node, floats: bool = False):
        try:
            return evaluate(node, self.lookup, floats)
        except ExprError as e:
            self.fail(e.message, e.col)

    def int_value(self, node: Node, what: str, addr: bool = False, minimum: int | None = None):
        v = self.value(node)
        if isinstance(v, Addr) and addr:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            shown = "an alloc address" if isinstance(v, Addr) else repr(v)
            self.fail(f"{what} must be an integer, got {shown}", first_col(node))
        if minimum is not None and v < minimum:
            self.fail(f"{what} must be at least {minimum}, got {v}", first_col(node))
        return v

    def dtype_value(self, node: Node, allowed, what: str = "dtype") -> str:
        if node.kind == "name" and not self.is_value_name(self.expand(node.value, node.col)):
            self.fail(f"{what} must be one of {', '.join(allowed)}, got {node.value}", node.col)
        v = self.value(node)
        if not isinstance(v, str) or v not in allowed:
            self.fail(f"{what} must be one of {', '.join(allowed)}, got {v!r}", first_col(node))
        return v

    def name_value(self, node: Node, what: str) -> str:
        if node.kind == "name":
            return self.expand(node.value, node.col)
        if node.kind == "str" and node.value:
            return node.value
        self.fail(f"{what} must be a name or a string", first_col(node))

    def tuple_value(self, node: Node, size: int, what: str, minimum: int | None = None):
        if node.kind != "tuple" or len(node.args) != size:
            self.fail(f"{what} must be a tuple of {size} integers like "
                      f"({', '.join('n' * size)})", first_col(node))
        return tuple(self.int_value(a, what, minimum=minimum) for a in node.args)

    def build_call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BuildError as e:
            loc = e.loc or self.loc(1)
            raise AsmError(e.message, loc[0], loc[1], loc[2]) from None

    def check_new_name(self, name: str, col: int, what: str, redefinable: bool = False) -> None:
        if name in RESERVED:
            self.fail(f"{name!r} is reserved (a register, dtype, function or keyword) and "
                      f"cannot name a {what}", col)
        for scope, kind in ((self.params, "a parameter"), (self.sets, "a .set constant"),
                            (self.reps, "a .rep variable"), (self.allocs, "an alloc"),
                            (self.hbm, "an HBM buffer")):
            if name in scope and not (redefinable and scope is self.sets):
                self.fail(f"duplicate name {name!r}: already {kind}", col)

    def args(self, stmt: _Stmt, positional: list[str], optional: tuple[str, ...] = (),
             keywords: tuple[str, ...] = (), required_keywords: tuple[str, ...] = ()):
        """Arguments by name; positional ones in order, then the keyword ones."""
        got: dict[str, _Arg] = {}
        for a in stmt.args:
            if a.key is None:
                continue
            if a.key not in keywords:
                allowed = f" (allowed: {', '.join(k + '=' for k in keywords)})" if keywords \
                    else " (to compare, use ==)" if "condition" in positional else ""
                self.fail(f"{stmt.head.text} has no argument {a.key}={allowed}", a.col)
            if a.key in got:
                self.fail(f"{a.key}= given twice", a.col)
            got[a.key] = a
        pos = [a for a in stmt.args if a.key is None]
        names = positional + list(optional)
        if len(pos) < len(positional) or len(pos) > len(names):
            want = ", ".join(positional + [f"[{o}]" for o in optional])
            col = pos[len(names)].col if len(pos) > len(names) else stmt.head.col
            self.fail(f"{stmt.head.text} takes {want}, got {len(pos)} argument(s)", col)
        got.update(zip(names, pos))
        for k in required_keywords:
            if k not in got:
                self.fail(f"{stmt.head.text} needs {k}=", stmt.head.col)
        return got

    def single_assignment(self, stmt: _Stmt) -> _Arg:
        if len(stmt.args) != 1 or stmt.args[0].key is None:
            self.fail(f"expected {stmt.head.text} NAME = VALUE", stmt.head.col)
        a = stmt.args[0]
        return _Arg(self.expand(a.key, a.col), a.col, a.node)

    # -- blocks -------------------------------------------------------------------------------

    def run(self, blocks: list[_Block]) -> None:
        for block in blocks:
            self.line = block.stmt.line
            if block.kind == "stmt":
                self.statement(block.stmt)
            elif block.kind == ".if":
                self.run_if(block)
            elif block.kind == ".rep":
                self.run_rep(block)
            else:
                self.run_region(block)

    def run_if(self, block: _Block) -> None:
        for cond, body in block.branches:
            self.line = (cond or block.stmt).line
            if cond is not None:
                arg = self.args(cond, ["condition"])["condition"]
                self.line = cond.line
                if not self.condition(arg.node):
                    continue
            self.run(body)
            return

    def run_rep(self, block: _Block) -> None:
        stmt = block.stmt
        if len(stmt.args) != 2 or stmt.args[0].key is None or stmt.args[1].key is not None:
            self.fail("expected .rep NAME = START, END", stmt.head.col)
        var = stmt.args[0]
        self.check_new_name(var.key, var.col, ".rep variable")
        start = self.int_value(var.node, ".rep start")
        end = self.int_value(stmt.args[1].node, ".rep end")
        if end - start > MAX_REP:
            self.fail(f".rep of {end - start} iterations (more than {MAX_REP:,}): "
                      "is the range right?", stmt.head.col)
        for i in range(start, end):
            self.reps[var.key] = i
            self.run(block.body)
        self.reps.pop(var.key, None)

    def run_region(self, block: _Block) -> None:
        stmt = block.stmt
        a = self.args(stmt, ["name", "x", "y", "w", "h"])
        name = self.name_value(a["name"].node, "region name")
        x, y = (self.int_value(a[k].node, f"region {k}", minimum=0) for k in ("x", "y"))
        w, h = (self.int_value(a[k].node, f"region {k}", minimum=1) for k in ("w", "h"))
        self.region = self.build_call(self.pb.region, name, x, y, w, h,
                                      loc=self.loc(stmt.head.col))
        try:
            self.run(block.body)
        finally:
            self.region = None
            self.allocs = {}

    # -- statements ---------------------------------------------------------------------------

    def statement(self, stmt: _Stmt) -> None:
        for tok in stmt.labels:
            self.need_region(tok, "a label")
            self.build_call(self.region.label, self.expand(tok.text, tok.col),
                            loc=self.loc(tok.col))
        head = stmt.head
        if head is None:
            return
        if head.kind == "name":
            self.instruction(stmt)
            return
        handler = getattr(self, "d_" + head.text[1:], None)
        if handler is None or head.text not in DIRECTIVES:
            close = difflib.get_close_matches(head.text, DIRECTIVES, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            self.fail(f"unknown directive {head.text!r}{hint}", head.col)
        handler(stmt)

    def need_region(self, tok: Token, what: str) -> None:
        if self.region is None:
            self.fail(f"{what} must be inside .region ... .endregion", tok.col)

    def no_region(self, stmt: _Stmt) -> None:
        if self.region is not None:
            self.fail(f"{stmt.head.text} is not allowed inside a .region", stmt.head.col)

    def instruction(self, stmt: _Stmt) -> None:
        head = stmt.head
        ins = BY_MNEMONIC.get(head.text)
        if ins is None:
            close = difflib.get_close_matches(head.text, BY_MNEMONIC, n=3)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            self.fail(f"unknown mnemonic {head.text!r}{hint}", head.col)
        self.need_region(head, f"instruction {head.text!r}")
        for a in stmt.args:
            if a.key is not None:
                self.fail(f"{head.text} takes no keyword arguments", a.col)
        if len(stmt.args) != len(ins.operands):
            names = ", ".join(op[0] for op in ins.operands) or "none"
            col = stmt.args[len(ins.operands)].col if len(stmt.args) > len(ins.operands) \
                else head.col
            self.fail(f"{head.text} takes {len(ins.operands)} operand(s) ({names}), "
                      f"got {len(stmt.args)}", col)
        values = [self.operand(ins.mnemonic, op, a.node) for op, a in zip(ins.operands, stmt.args)]
        self.build_call(self.region.emit, ins.mnemonic, *values, loc=self.loc(head.col),
                        operand_locs=[self.loc(a.col) for a in stmt.args])

    def operand(self, mnemonic: str, op: tuple[str, str, str], node: Node):
        name, kind, _slot = op
        what = f"{mnemonic} operand {name!r}"
        if kind in ("ireg", "iregw", "freg", "dreg"):
            cls = {"ireg": "i", "iregw": "i", "freg": "f", "dreg": "d"}[kind]
            name = self.expand(node.value, node.col) if node.kind == "name" else None
            reg = REGISTERS.get(name)
            if reg is None or reg[0] != cls:
                shown = name if node.kind == "name" else "an expression"
                self.fail(f"{what} must be {kind_text(kind)}, got {shown}", first_col(node))
            if kind == "iregw" and reg[1] >= N_IREGS:
                self.fail(f"{what} must be {kind_text(kind)}: {name} is read-only",
                          first_col(node))
            return reg[1]
        if kind == "dtype":
            return self.dtype_value(node, tuple(DTYPES), what)
        if kind == "target":
            if node.kind == "str":
                return node.value
            if node.kind == "name":
                label = self.expand(node.value, node.col)
                if not self.is_value_name(label):
                    return label
            return self.int_value(node, what)
        if kind == "fimm":
            v = self.value(node, floats=True)
            if isinstance(v, FBits) or isinstance(v, float):
                return v
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 1 << 128:
                return float(v)
            self.fail(f"{what} must be an fp32 value, got {v!r}"[:200], first_col(node))
        return self.int_value(node, what, addr=True)

    def is_value_name(self, name: str) -> bool:
        return any(name in s for s in (self.reps, self.sets, self.params, self.allocs, self.hbm)) \
            or name in CONSTANTS

    # -- directives ---------------------------------------------------------------------------

    def d_program(self, stmt: _Stmt) -> None:
        self.no_region(stmt)
        a = self.args(stmt, ["name"])["name"]
        if self.named_program:
            self.fail("the program is already named", stmt.head.col)
        self.pb.name = self.name_value(a.node, "program name")
        self.named_program = True

    def d_param(self, stmt: _Stmt) -> None:
        a = self.single_assignment(stmt)
        if a.key in self.params:
            self.fail(f"duplicate parameter {a.key!r}", a.col)
        self.check_new_name(a.key, a.col, "parameter")
        node = a.node
        if a.key in self.defines:
            self.used_defines.add(a.key)
            text = self.defines[a.key]
            try:
                node = parse(tokenize(text), len(text) + 1)
                value = evaluate(node, self.lookup)
            except ExprError as e:
                self.fail(f"-D {a.key}={text}: {e.message}", a.col)
        else:
            value = self.value(node)
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            prefix = f"-D {a.key}={self.defines[a.key]}: " if a.key in self.defines else ""
            self.fail(f"{prefix}parameter {a.key!r} must be an integer or a dtype name, "
                      f"got {value!r}", a.col)
        self.params[a.key] = value
        self.build_call(self.pb.param, a.key, value, loc=self.loc(a.col))

    def d_set(self, stmt: _Stmt) -> None:
        a = self.single_assignment(stmt)
        self.check_new_name(a.key, a.col, ".set constant", redefinable=True)
        value = self.value(a.node)
        if isinstance(value, FBits):
            self.fail("fbits() can only be a whole float operand", first_col(a.node))
        self.sets[a.key] = value

    def d_assert(self, stmt: _Stmt) -> None:
        a = self.args(stmt, ["condition"], ("message",))
        if not self.condition(a["condition"].node):
            message = "assertion failed"
            if "message" in a:
                if a["message"].node.kind != "str":
                    self.fail(".assert message must be a string", a["message"].col)
                message += f": {a['message'].node.value}"
            self.fail(message, stmt.head.col)

    def d_meta(self, stmt: _Stmt) -> None:
        if stmt.meta is None:
            self.fail("expected .meta KEY = JSON-VALUE on a line of its own", stmt.head.col)
        key, value = stmt.meta
        self.build_call(self.pb.meta, key, value, loc=self.loc(stmt.head.col))

    def d_tensor(self, stmt: _Stmt) -> None:
        self.no_region(stmt)
        a = self.args(stmt, ["name", "shape"], keywords=("file", "safetensors", "key", "dtype"))
        name = self.name_value(a["name"].node, "tensor name")
        shape = self.shape_value(a["shape"].node)
        strings = {}
        for k in ("file", "safetensors", "key"):
            if k in a:
                if a[k].node.kind != "str" or not a[k].node.value:
                    self.fail(f"{k}= must be a non-empty string", first_col(a[k].node))
                strings[k] = a[k].node.value
        dtype = self.dtype_value(a["dtype"].node, SYMBOL_DTYPES) \
            if "dtype" in a else None
        loc = self.loc(a["name"].col)
        if "safetensors" in strings:
            if "file" in strings:
                self.fail("give file= or safetensors=, not both", a["file"].col)
            if dtype is None:
                self.fail(f"external tensor {name!r} needs dtype= (f32, f16, bf16 or i32)",
                          stmt.head.col)
            self.build_call(self.pb.tensor, name, shape=shape, file=strings["safetensors"],
                            key=strings.get("key"), dtype=dtype, loc=loc)
            return
        if "key" in strings:
            self.fail("key= goes with safetensors=", a["key"].col)
        array = self.tensor_array(name, strings.get("file"), a)
        if tuple(array.shape) != shape:
            self.fail(f"tensor {name!r} is declared {list(shape)} but its data has shape "
                      f"{list(array.shape)}", a["shape"].col)
        self.build_call(self.pb.tensor, name, array, dtype=dtype, loc=loc)

    def tensor_array(self, name: str, file: str | None, a: dict) -> np.ndarray:
        if name in self.data:
            return np.asarray(self.data.pop(name))
        path, col = None, a["name"].col
        if name in self.data_paths:
            path = Path(self.data_paths.pop(name))
            where = f"--data {name}={path}"
        elif file is not None:
            path, col = self.base_dir / file, a["file"].col
            where = f"tensor file {file!r}"
        if path is None:
            self.fail(f"tensor {name!r} has no data: pass --data {name}=FILE.npy", col)
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            self.fail(f"cannot read {where}: {getattr(e, 'strerror', None) or e}", col)
        if not isinstance(array, np.ndarray):
            self.fail(f"cannot read {where}: not a .npy array (an .npz archive?)", col)
        return array

    def shape_value(self, node: Node) -> tuple[int, ...]:
        if node.kind != "list" or not node.args:
            self.fail("a shape must be a list like [R, C]", first_col(node))
        return tuple(self.int_value(d, "shape dimension", minimum=1) for d in node.args)

    def symbol(self, stmt: _Stmt, kind: str) -> None:
        self.no_region(stmt)
        a = self.args(stmt, ["name", "dtype", "shape"])
        name = self.name_value(a["name"].node, f"{kind} name")
        dtype = self.dtype_value(a["dtype"].node, SYMBOL_DTYPES)
        fn = self.pb.input if kind == "input" else self.pb.output
        self.build_call(fn, name, dtype, self.shape_value(a["shape"].node),
                        loc=self.loc(a["name"].col))

    def d_input(self, stmt: _Stmt) -> None:
        self.symbol(stmt, "input")

    def d_output(self, stmt: _Stmt) -> None:
        self.symbol(stmt, "output")

    def d_route(self, stmt: _Stmt) -> None:
        self.no_region(stmt)
        a = self.args(stmt, ["x", "y", "w", "h", "color"], keywords=("rx", "tx"),
                      required_keywords=("rx", "tx"))
        x, y = (self.int_value(a[k].node, f"route {k}", minimum=0) for k in ("x", "y"))
        w, h = (self.int_value(a[k].node, f"route {k}", minimum=1) for k in ("w", "h"))
        color = self.int_value(a["color"].node, "route color", minimum=0)
        rx, tx = (self.ports(a[k].node) for k in ("rx", "tx"))
        self.build_call(self.pb.route, x, y, w, h, color, rx, tx, loc=self.loc(stmt.head.col))

    def ports(self, node: Node) -> int:
        def mask(n: Node):
            if n.kind == "name" and n.value in DIR_BITS:
                return DIR_BITS[n.value]
            if n.kind == "binary" and n.value == "|":
                left, right = mask(n.args[0]), mask(n.args[1])
                return None if left is None or right is None else left | right
            return None
        m = mask(node)
        return m if m is not None else self.int_value(node, "port mask", minimum=0)

    def d_collective(self, stmt: _Stmt) -> None:
        """.collective NAME, KIND, X, Y, W, H, axis=row|column, n=N, colors=(c0, ...)
        [, form=chain|two_phase|tree|fastest] [, root=P] [, group=G]: a line collective
        (isa.collectives) over every line of the rectangle; adds its routes and defines
        NAME_root (the root's position along a line) and NAME_len (PEs a line)."""
        self.no_region(stmt)
        a = self.args(stmt, ["name", "kind", "x", "y", "w", "h"],
                      keywords=("axis", "n", "colors", "form", "root", "group"),
                      required_keywords=("axis", "n", "colors"))
        name = self.name_value(a["name"].node, "collective name")
        if name in self.collectives:
            self.fail(f"collective {name!r} is defined twice", a["name"].col)
        for suffix in ("root", "len"):
            self.check_new_name(f"{name}_{suffix}", a["name"].col, "collective")
        kind = self.name_value(a["kind"].node, "collective kind")
        x, y = (self.int_value(a[k].node, f"collective {k}", minimum=0) for k in ("x", "y"))
        w, h = (self.int_value(a[k].node, f"collective {k}", minimum=1) for k in ("w", "h"))
        axis = self.name_value(a["axis"].node, "collective axis")
        n = self.int_value(a["n"].node, "collective n", minimum=1)
        node = a["colors"].node
        items = node.args if node.kind == "tuple" else [node]
        colors = [self.int_value(c, "collective color", minimum=0) for c in items]
        form = "fastest"
        if "form" in a:
            fnode = a["form"].node
            if fnode.kind == "name" and fnode.value in (*FORMS, "fastest"):
                form = fnode.value
            else:  # an expression: 0 fastest, 1 chain, 2 two_phase, 3 tree
                code = self.int_value(fnode, "collective form", minimum=0)
                if code > len(FORMS):
                    self.fail(f"collective form must be chain, two_phase, tree, fastest or "
                              f"0..{len(FORMS)}, got {code}", first_col(fnode))
                form = ("fastest", *FORMS)[code]
        root = self.int_value(a["root"].node, "collective root", minimum=0) \
            if "root" in a else None
        group = self.int_value(a["group"].node, "collective group", minimum=1) \
            if "group" in a else None
        try:
            coll = LineCollective(kind, (x, y, w, h), axis, n, colors, form, root, group)
        except CollectiveError as e:
            self.fail(str(e), stmt.head.col)
        self.build_call(coll.add_routes, self.pb, loc=self.loc(stmt.head.col))
        self.collectives[name] = coll
        self.sets[f"{name}_root"] = coll.root
        self.sets[f"{name}_len"] = coll.length

    def d_collect(self, stmt: _Stmt) -> None:
        """.collect NAME, SRC, DST: the code of collective NAME for this region's PEs."""
        self.need_region(stmt.head, ".collect")
        a = self.args(stmt, ["name", "src", "dst"])
        name = self.name_value(a["name"].node, "collective name")
        coll = self.collectives.get(name)
        if coll is None:
            self.fail(f"undefined collective {name!r} (declare it with .collective first)",
                      a["name"].col)
        src = self.int_value(a["src"].node, ".collect source", addr=True)
        dst = self.int_value(a["dst"].node, ".collect destination", addr=True)
        label = f"{name}_{self.region.pc}"
        try:
            self.build_call(coll.emit, self.region, src, dst, label=label,
                            loc=self.loc(stmt.head.col))
        except CollectiveError as e:
            self.fail(str(e), stmt.head.col)

    def d_alloc(self, stmt: _Stmt) -> None:
        self.need_region(stmt.head, ".alloc")
        a = self.args(stmt, ["name", "bytes"], ("align",), keywords=("at",))
        name_node = a["name"].node
        name = self.name_value(name_node, "alloc name")
        if name_node.kind == "name":
            self.check_new_name(name, a["name"].col, "alloc")
        nbytes = self.int_value(a["bytes"].node, "alloc size", minimum=0)
        align = self.int_value(a["align"].node, "alloc alignment", minimum=1) \
            if "align" in a else 8
        at = self.int_value(a["at"].node, "alloc address", minimum=0) if "at" in a else None
        addr = self.build_call(self.region.alloc, name, nbytes, align, at,
                               loc=self.loc(a["name"].col))
        if name_node.kind == "name":
            self.allocs[name] = addr

    def d_label(self, stmt: _Stmt) -> None:
        self.need_region(stmt.head, ".label")
        a = self.args(stmt, ["name"])["name"]
        self.build_call(self.region.label, self.name_value(a.node, "label"), loc=self.loc(a.col))

    def affine(self, node: Node, rect: tuple[int, int, int, int], what: str):
        """(c0, c_dy, c_dx) of an affine expression in rx, ry, relative to the rect's corner."""
        x0, y0 = rect[0], rect[1]

        def at(dx: int, dy: int) -> int:
            self.coords = (x0 + dx, y0 + dy)
            try:
                return self.int_value(node, what)
            finally:
                self.coords = None
        c0 = at(0, 0)
        cdx, cdy = at(1, 0) - c0, at(0, 1) - c0
        if at(1, 1) != c0 + cdx + cdy or at(2, 3) != c0 + 2 * cdx + 3 * cdy:
            self.fail(f"{what} must be affine in rx and ry (like a + b*rx + c*ry)", first_col(node))
        return (c0, cdy, cdx)

    def tile_args(self, stmt: _Stmt, first: str, default_order: str):
        a = self.args(stmt, [first, "addr", "dtype"], keywords=("tile", "row", "col", "order",
                                                                  "rect"),
                      required_keywords=("tile",))
        rect = self.tuple_value(a["rect"].node, 4, "rect") if "rect" in a else None
        full = rect or (0, 0, self.region.rect.w, self.region.rect.h)
        order = default_order
        if "order" in a:
            node = a["order"].node
            if node.kind != "name" or node.value not in ("F", "C"):
                self.fail("order must be F (column-major) or C (row-major)", first_col(node))
            order = node.value
        return dict(
            addr=self.int_value(a["addr"].node, "address", addr=True),
            dtype=self.dtype_value(a["dtype"].node, tuple(STORAGE_DTYPES)),
            tile=self.tuple_value(a["tile"].node, 2, "tile", minimum=1),
            row=self.affine(a["row"].node, full, "row=") if "row" in a else 0,
            col=self.affine(a["col"].node, full, "col=") if "col" in a else 0,
            order=order, rect=rect, loc=self.loc(stmt.head.col)), a

    def d_load(self, stmt: _Stmt) -> None:
        self.need_region(stmt.head, ".load")
        kw, a = self.tile_args(stmt, "tensor", "F")
        tensor = self.name_value(a["tensor"].node, "tensor name")
        self.build_call(self.region.load, tensor, **kw)

    def d_piece(self, stmt: _Stmt) -> None:
        self.need_region(stmt.head, ".piece")
        kw, a = self.tile_args(stmt, "symbol", "C")
        symbol = self.name_value(a["symbol"].node, "symbol name")
        self.build_call(self.region.piece, symbol, **kw)

    def d_init(self, stmt: _Stmt) -> None:
        self.need_region(stmt.head, ".init")
        pos = [x for x in stmt.args if x.key is None]
        if len(pos) < 3:
            self.fail(".init takes ADDR, DTYPE, VALUE, ...", stmt.head.col)
        for x in stmt.args:
            if x.key is not None and x.key != "rect":
                self.fail(f".init has no argument {x.key}= (allowed: rect=)", x.col)
        rects = [x for x in stmt.args if x.key == "rect"]
        if len(rects) > 1:
            self.fail("rect= given twice", rects[1].col)
        rect = self.tuple_value(rects[0].node, 4, "rect") if rects else None
        addr = self.int_value(pos[0].node, "address", addr=True)
        dtype = self.dtype_value(pos[1].node, tuple(STORAGE_DTYPES))
        values = []
        for x in pos[2:]:
            v = self.value(x.node, floats=True)
            if isinstance(v, bool) or not isinstance(v, (int, float, FBits)):
                self.fail(f".init values must be numbers, got {v!r}", x.col)
            values.append(v)
        self.build_call(self.region.init, addr, dtype, values, rect=rect,
                        loc=self.loc(stmt.head.col))

    # -- HBM ----------------------------------------------------------------------------------

    def d_hbm(self, stmt: _Stmt) -> None:
        self.no_region(stmt)
        a = self.args(stmt, ["name", "bytes"], keywords=("align", "at"))
        name_node = a["name"].node
        name = self.name_value(name_node, "HBM buffer name")
        if name_node.kind == "name":
            self.check_new_name(name, a["name"].col, "HBM buffer")
        nbytes = self.int_value(a["bytes"].node, "HBM buffer size", minimum=0)
        align = self.int_value(a["align"].node, "HBM buffer alignment", minimum=1) \
            if "align" in a else 64
        at = self.int_value(a["at"].node, "HBM buffer address", minimum=0) if "at" in a \
            else None
        addr = self.build_call(self.pb.hbm_alloc, name, nbytes, align, at,
                               loc=self.loc(a["name"].col))
        if name_node.kind == "name":
            self.hbm[name] = addr

    def d_hbminit(self, stmt: _Stmt) -> None:
        self.no_region(stmt)
        flags = [x for x in stmt.args[3:] if x.key is None and x.node.kind == "name"
                 and x.node.value == "transpose"]
        if len(flags) > 1:
            self.fail("transpose given twice", flags[1].col)
        stmt = _Stmt(stmt.line, stmt.labels, stmt.head,
                     [x for x in stmt.args if not any(x is f for f in flags)])
        a = self.args(stmt, ["tensor", "addr", "dtype"], keywords=("tile_rows", "order", "rows"))
        tensor = self.name_value(a["tensor"].node, "tensor name")
        addr = self.int_value(a["addr"].node, "HBM address", minimum=0)
        dtype = self.dtype_value(a["dtype"].node, tuple(STORAGE_DTYPES))
        tile_rows = self.int_value(a["tile_rows"].node, "tile_rows", minimum=0) \
            if "tile_rows" in a else 0
        order = "F"
        if "order" in a:
            node = a["order"].node
            if node.kind != "name" or node.value not in ("F", "C"):
                self.fail("order must be F (column-major) or C (row-major)", first_col(node))
            order = node.value
        rows = None
        if "rows" in a:
            if a["rows"].node.kind != "range":
                self.fail("rows= must be START:END", first_col(a["rows"].node))
            start, end = a["rows"].node.args
            rows = (self.int_value(start, "rows start", minimum=0),
                    self.int_value(end, "rows end", minimum=0))
        self.build_call(self.pb.hbm_init, tensor, addr, dtype, tile_rows, order, bool(flags),
                        rows, loc=self.loc(stmt.head.col))

    def d_hbmpiece(self, stmt: _Stmt) -> None:
        self.no_region(stmt)
        a = self.args(stmt, ["symbol", "addr", "dtype"])
        symbol = self.name_value(a["symbol"].node, "symbol name")
        addr = self.int_value(a["addr"].node, "HBM address", minimum=0)
        dtype = self.dtype_value(a["dtype"].node, tuple(STORAGE_DTYPES))
        self.build_call(self.pb.hbm_piece, symbol, addr, dtype, loc=self.loc(stmt.head.col))


def _assemble(text: str, filename: str, defines, data, data_paths, base_dir) -> Program:
    stmts = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        try:
            stmt = _statement(line, lineno)
        except ExprError as e:
            raise AsmError(e.message, filename, lineno, e.col) from None
        if stmt is not None:
            stmts.append(stmt)
    asm = _Assembler(filename, defines, data, data_paths, base_dir)
    asm.run(_blocks(stmts, filename))
    unused = [k for k in asm.defines if k not in asm.used_defines]
    if unused:
        raise AsmError(f"-D {unused[0]}={asm.defines[unused[0]]}: no .param {unused[0]} in this "
                       "program", filename, 1, 1)
    leftover = sorted([*asm.data, *asm.data_paths])
    if leftover:
        raise AsmError(f"--data {leftover[0]}: no .tensor {leftover[0]} in this program",
                       filename, 1, 1)
    try:
        return asm.pb.build()
    except BuildError as e:
        loc = e.loc or (filename, 1, 1)
        raise AsmError(e.message, *loc) from None


def assemble(text: str, filename: str = "<string>", defines: dict[str, str] | None = None,
             data: dict[str, np.ndarray] | None = None, base_dir: str | None = None) -> Program:
    """The Program of .wsa source text; AsmError "FILE:LINE:COL: message" on any problem.

    defines: -D NAME=VALUE overrides of .param values (VALUE an expression or a dtype name);
    data: arrays for .tensor declarations without file=; base_dir: where file= paths are
    looked up (default: the current directory).
    """
    return _assemble(text, filename, defines, data, None, base_dir)


def assemble_file(path: str, defines: dict[str, str] | None = None,
                  data_files: dict[str, str] | None = None) -> Program:
    """assemble() of a .wsa file; data_files maps tensor names to .npy paths (--data)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or e
        raise AsmError(f"cannot read: {reason}", str(path), 1, 1) from None
    return _assemble(text, str(path), defines, None, data_files, str(Path(path).parent))

"""The expression language of .wsa files: a tokenizer, a small Pratt parser and a safe evaluator.

Values are ints, floats, dtype names (str), `FBits` (from `fbits(0x...)`) and opaque deferred
values (alloc addresses, resolved at build time) that support integer arithmetic only.
Integer `/` is floor division and `%` its modulo (Python semantics); with a float operand
`/` is true division. Comparisons and `and`/`or`/`not` (also `&&`, `||`, `!`) give 1 or 0.
Nothing is ever passed to eval(): the parser builds `Node`s and `evaluate` walks them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from wse_emu.isa.spec import SYMBOL_DTYPES

from wse_emu.isa.encoding import REGISTERS, FBits


class ExprError(Exception):
    """A problem at column `col` (1-based) of the line being read."""

    def __init__(self, message: str, col: int):
        super().__init__(message)
        self.message = message
        self.col = col


# ---------------------------------------------------------------------------------------------
# Tokens.


@dataclass(frozen=True)
class Token:
    kind: str  # "name" | "int" | "float" | "str" | "op" | "directive"
    text: str  # a name may hold {EXPR} parts that the assembler fills in (`loop_{i}`)
    col: int  # 1-based column of the first character
    value: object = None


_TOKEN_RE = re.compile(r"""
    (?P<space>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<badstr>")
  | (?P<hex>0[xX][0-9a-fA-F]+|0[bB][01]+|0[oO][0-7]+)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<directive>\.[A-Za-z_]\w*)
  | (?P<name>[A-Za-z_]\w*(?:\{[^{}]*\}\w*)*)
  | (?P<op><<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^~!<>()\[\],=:])
""", re.VERBOSE)


def split_comment(line: str) -> str:
    """The line without its comment (';' or '#' outside a string literal)."""
    in_string = escaped = False
    for i, ch in enumerate(line):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in ";#":
            return line[:i]
    return line


def tokenize(code: str) -> list[Token]:
    """Tokens of one line of code (comment already removed); ExprError on a bad character."""
    tokens: list[Token] = []
    pos = 0
    while pos < len(code):
        m = _TOKEN_RE.match(code, pos)
        col = pos + 1
        if m is None:
            raise ExprError(f"unexpected character {code[pos]!r}", col)
        kind, text = m.lastgroup, m.group()
        pos = m.end()
        if kind == "space":
            continue
        if kind in ("hex", "num") and pos < len(code) and (code[pos].isalnum() or code[pos] == "_"):
            raise ExprError(f"malformed number {text + code[pos]!r}", col)
        if kind == "badstr":
            raise ExprError("unterminated string", col)
        if kind == "str":
            try:
                tokens.append(Token("str", text, col, json.loads(text)))
            except json.JSONDecodeError:
                raise ExprError(f"bad escape in string {text}", col) from None
        elif kind == "hex":
            tokens.append(Token("int", text, col, int(text, 0)))
        elif kind == "num":
            is_float = any(ch in text for ch in ".eE")
            tokens.append(Token("float" if is_float else "int", text, col,
                                float(text) if is_float else int(text)))
        else:
            tokens.append(Token(kind, text, col))
    return tokens


# ---------------------------------------------------------------------------------------------
# Parser.


@dataclass(frozen=True)
class Node:
    kind: str  # num | name | str | unary | binary | and | or | not | call | tuple | list
    col: int
    value: object = None  # the number, name, string or operator
    args: tuple = ()


_BINARY = {
    "||": 1, "or": 1, "&&": 2, "and": 2,
    "==": 4, "!=": 4, "<": 4, "<=": 4, ">": 4, ">=": 4,
    "|": 5, "^": 6, "&": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10,
}
_NOT_PREC = 3
_UNARY_PREC = 11
_END = Token("op", "end of line", 0)


class _Parser:
    def __init__(self, tokens: list[Token], end_col: int):
        self.tokens = tokens
        self.pos = 0
        self.end_col = end_col

    def peek(self) -> Token:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else _END

    def next(self) -> Token:
        tok = self.peek()
        self.pos += 1
        return tok

    def fail(self, message: str, tok: Token):
        raise ExprError(message, tok.col or self.end_col)

    def expression(self, min_prec: int = 1) -> Node:
        tok = self.peek()
        if (tok.kind == "name" and tok.text == "not") or (tok.kind == "op" and tok.text == "!"):
            self.next()
            left = Node("not", tok.col, args=(self.expression(_NOT_PREC),))
        else:
            left = self.unary()
        while True:
            tok = self.peek()
            op = tok.text if tok.kind in ("op", "name") else None
            prec = _BINARY.get(op) if op else None
            if prec is None or prec < min_prec:
                return left
            self.next()
            right = self.expression(prec + 1)
            if op in ("||", "or"):
                left = Node("or", tok.col, args=(left, right))
            elif op in ("&&", "and"):
                left = Node("and", tok.col, args=(left, right))
            else:
                left = Node("binary", tok.col, op, (left, right))

    def unary(self) -> Node:
        tok = self.peek()
        if tok.kind == "op" and tok.text in ("-", "+", "~"):
            self.next()
            return Node("unary", tok.col, tok.text, (self.unary(),))
        return self.primary()

    def primary(self) -> Node:
        tok = self.next()
        if tok.kind in ("int", "float"):
            return Node("num", tok.col, tok.value)
        if tok.kind == "str":
            return Node("str", tok.col, tok.value)
        if tok.kind == "name" and tok.text not in _BINARY and tok.text != "not":
            if self.peek().kind == "op" and self.peek().text == "(":
                self.next()
                return Node("call", tok.col, tok.text, self.items(")")[0])
            return Node("name", tok.col, tok.text)
        if tok.kind == "op" and tok.text == "(":
            items, trailing_comma = self.items(")")
            if len(items) == 1 and not trailing_comma:
                return items[0]
            return Node("tuple", tok.col, args=items)
        if tok.kind == "op" and tok.text == "[":
            return Node("list", tok.col, args=self.items("]")[0])
        self.fail(f"expected a value, got {tok.text!r}", tok)

    def items(self, close: str) -> tuple[tuple[Node, ...], bool]:
        """Comma-separated expressions up to `close`, and whether a comma came last."""
        items = []
        trailing_comma = False
        while not (self.peek().kind == "op" and self.peek().text == close):
            items.append(self.expression())
            trailing_comma = False
            if self.peek().kind == "op" and self.peek().text == ",":
                self.next()
                trailing_comma = True
            elif not (self.peek().kind == "op" and self.peek().text == close):
                self.fail(f"expected ',' or {close!r}, got {self.peek().text!r}", self.peek())
        self.next()
        return tuple(items), trailing_comma


def first_col(node: Node) -> int:
    """Column of the first token of node (binary nodes carry their operator's column)."""
    while node.kind in ("binary", "and", "or"):
        node = node.args[0]
    return node.col


def parse(tokens: list[Token], end_col: int = 1) -> Node:
    """One expression from the whole token list; `end_col` locates 'unexpected end' errors."""
    if not tokens:
        raise ExprError("expected a value", end_col)
    parser = _Parser(tokens, end_col)
    node = parser.expression()
    if parser.pos < len(tokens):
        parser.fail(f"unexpected {parser.peek().text!r}", parser.peek())
    return node


# ---------------------------------------------------------------------------------------------
# Evaluator.

DTYPE_WORDS = SYMBOL_DTYPES  # dtype names are values in expressions
CONSTANTS = {"inf": math.inf, "nan": math.nan, **{d: d for d in DTYPE_WORDS}}
FUNCTIONS = ("min", "max", "abs", "fbits")
KEYWORDS = ("and", "or", "not")
# Names no parameter, constant, loop variable or alloc may take.
RESERVED = frozenset(REGISTERS) | set(CONSTANTS) | set(FUNCTIONS) | set(KEYWORDS) | {"rx", "ry"}
PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_SHIFT = 256  # keeps `1 << huge` from exhausting memory; no slot is wider than 64 bits


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _describe(v) -> str:
    if isinstance(v, str):
        return f"dtype {v!r}"
    if isinstance(v, FBits):
        return "fbits()"
    return "an alloc address (known only after the code is complete)"


def _arith(op: str, a, b, col: int, floats: bool = False):
    for v in (a, b):
        if isinstance(v, (str, FBits)):
            raise ExprError(f"cannot use {_describe(v)} in arithmetic", col)
    if isinstance(a, float) or isinstance(b, float) or (floats and op == "/"):
        for v in (a, b):
            if not _is_number(v):
                raise ExprError(f"cannot mix {_describe(v)} with a float", col)
        if op in "&|^" or op in ("<<", ">>"):
            raise ExprError(f"operator {op!r} needs integers", col)
    try:
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            if floats or isinstance(a, float) or isinstance(b, float):
                return float(a) / float(b)
            return a // b
        if op == "%":
            return a % b
        if op in ("<<", ">>"):
            if isinstance(b, int) and not 0 <= b <= MAX_SHIFT:
                raise ExprError(f"shift amount {b} is outside 0..{MAX_SHIFT}", col)
            return a << b if op == "<<" else a >> b
        if op == "&":
            return a & b
        if op == "|":
            return a | b
        return a ^ b
    except ZeroDivisionError:
        raise ExprError("division by zero", col) from None
    except OverflowError:
        raise ExprError("integer too large for a float", col) from None
    except TypeError:
        raise ExprError(f"operator {op!r} cannot combine these values", col) from None


def _compare(op: str, a, b, col: int) -> int:
    if isinstance(a, str) or isinstance(b, str):
        if op not in ("==", "!=") or not (isinstance(a, str) and isinstance(b, str)):
            raise ExprError("dtype names can only be compared to dtype names, with == or !=", col)
    else:
        for v in (a, b):
            if not _is_number(v):
                raise ExprError(f"cannot compare {_describe(v)}", col)
    result = {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b,
              ">=": a >= b}[op]
    return int(result)


def truth(v, col: int) -> bool:
    if not _is_number(v):
        raise ExprError(f"{_describe(v)} is not a condition", col)
    return v != 0


def evaluate(node: Node, lookup: Callable[[str, int], object], floats: bool = False):
    """The value of node; `lookup(name, col)` resolves names that are not built in.

    With `floats` (fp32 operands and .init values) `/` is true division even between integers,
    so that `1/64` means 0.015625 there.
    """
    kind = node.kind
    if kind == "num":
        return node.value
    if kind == "name":
        if node.value in CONSTANTS:
            return CONSTANTS[node.value]
        return lookup(node.value, node.col)
    if kind == "unary":
        v = evaluate(node.args[0], lookup, floats)
        if node.value == "+":
            return _arith("+", 0, v, node.col)
        if node.value == "-":
            if isinstance(v, float):
                return -v
            return _arith("-", 0, v, node.col)
        if isinstance(v, (float, str, FBits)):
            raise ExprError("operator '~' needs an integer", node.col)
        return ~v
    if kind == "binary":
        a = evaluate(node.args[0], lookup, floats)
        b = evaluate(node.args[1], lookup, floats)
        if node.value in ("==", "!=", "<", "<=", ">", ">="):
            return _compare(node.value, a, b, node.col)
        return _arith(node.value, a, b, node.col, floats)
    if kind == "and":
        return int(truth(evaluate(node.args[0], lookup, floats), node.args[0].col)
                   and truth(evaluate(node.args[1], lookup, floats), node.args[1].col))
    if kind == "or":
        return int(truth(evaluate(node.args[0], lookup, floats), node.args[0].col)
                   or truth(evaluate(node.args[1], lookup, floats), node.args[1].col))
    if kind == "not":
        return int(not truth(evaluate(node.args[0], lookup, floats), node.args[0].col))
    if kind == "call":
        return _call(node, [evaluate(a, lookup, floats) for a in node.args])
    if kind == "str":
        raise ExprError("a string is not allowed here", node.col)
    raise ExprError("a list or tuple is not allowed here", node.col)


def _call(node: Node, args: list):
    name = node.value
    if name not in FUNCTIONS:
        raise ExprError(f"unknown function {name!r} (functions: {', '.join(FUNCTIONS)})",
                        node.col)
    for v in args:
        if not _is_number(v):
            raise ExprError(f"{name}() cannot take {_describe(v)}", node.col)
    if name == "abs":
        if len(args) != 1:
            raise ExprError("abs() takes one argument", node.col)
        return abs(args[0])
    if name == "fbits":
        if len(args) != 1 or not isinstance(args[0], int) or args[0] < 0:
            raise ExprError("fbits() takes one non-negative integer (the storage bits)", node.col)
        return FBits(args[0])
    if not args:
        raise ExprError(f"{name}() needs at least one argument", node.col)
    return min(args) if name == "min" else max(args)

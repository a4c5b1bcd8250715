"""Line collectives: broadcast, reduce and allreduce along every row (or column) of a rectangle.

A *line* is one row (axis="row": the PEs of a row, position p = x - rect.x) or one column
(axis="column": p = y - rect.y) of a rectangle of PEs; a rectangle of h rows is h lines that run
the same collective at once, side by side, on disjoint links. Every PE holds a block of `n`
fp32 values (`n` wavelets) at SRAM address `src`; the result goes to `dst` (which may equal
`src`):

- ``broadcast``: the root's `src` goes to `dst` on every PE of its line;
- ``reduce``: the elementwise sum of the line's blocks goes to the root's `dst` (on the other
  PEs `dst` is scratch: its contents afterwards are unspecified);
- ``allreduce``: the sum goes to `dst` on every PE of the line (reduce, then a broadcast back).

Forms (docs/collectives.md has a picture and the cost formula of each):

- ``chain``: each PE adds its block to the stream from its outer neighbour and forwards it, the
  two halves of the line flowing toward the root;
- ``two_phase``: each half of the line is cut into groups of `group` PEs; inside a group a chain
  flows outward to the group's far end (its group root), and the group roots form a chain
  toward the line's root on colors that the other PEs only pass through (a hop costs 1 cycle,
  a relay 1 + 2 ramps + a hop);
- ``tree``: each half is the far end of a whole binomial tree (a PE adds its children's
  blocks, then sends its sum to its parent), store-and-forward, one color per level.

`root` is the position along the line of the broadcast's source or of the PE that gets the
reduce; with root=None a broadcast uses the middle ((length - 1) // 2) and a reduce or
allreduce the middle or the last PE, whichever its formula prefers (`best_layout`). A
broadcast is the same multicast flood in every form (one injection, 1 cycle a hop: nothing
relays faster).

Using it (the compiler and `.collective` in .wsa programs do exactly this)::

    from wse_emu.isa.builder import ProgramBuilder
    from wse_emu.isa.collectives import allreduce, split

    pb = ProgramBuilder("rows")
    ar = allreduce((0, 0, 16, 4), axis="row", n=64, colors=(1, 2, 3, 4, 5), form="two_phase")
    ar.add_routes(pb)                      # the route rules of every line
    for i, (rect, roles) in enumerate(split(ar.rect, ar)):
        rb = pb.region(f"r{i}", rect.x, rect.y, rect.w, rect.h)  # one region per role strip
        buf = rb.alloc("buf", 64 * 4)
        ...                                # the caller's code: compute the partial into buf
        ar.emit(rb, src=buf, dst=buf)      # the collective's code for these PEs
        ...                                # the caller's code after it: buf holds the sum
        rb.halt()

A segment of a line is a collective on a narrower rectangle; collectives on disjoint
rectangles may use the same colors (routes belong to PEs).

`emit` works for any region inside the collective's rectangle: when the region spans PEs of
different roles it emits each role's code once and a short branch on the position (GX or GY),
which costs a few scalar cycles. `split(rect, *collectives)` cuts a rectangle into the
sub-rectangles on which every given collective has a single role (so a caller that runs a row
collective and a column collective on the same PEs gets regions that need no dispatch).

Costs: `cost(kind, form, length, n, costs)` is the formula of each form, from the rules of
docs/timing-model.md (hop latency, ramp latency, issue overhead, scalar cycles), in cycles from
the moment every PE of the line starts the collective's code until the last one is done;
`fastest(kind, length, n, costs)` picks the form with the lowest formula (a two_phase
collective picks its group sizes with `best_group`), `best_layout` the form and the root.
`Costs.of(machine)` reads the numbers from a machine preset. This module imports neither
Numba nor the emulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wse_emu.isa.program import Rect

KINDS = ("broadcast", "reduce", "allreduce")
FORMS = ("chain", "two_phase", "tree")
AXES = ("row", "column")


class CollectiveError(ValueError):
    """A collective that cannot be built as asked; the message is one line."""


@dataclass(frozen=True)
class Costs:
    """The timing parameters the formulas use (docs/timing-model.md)."""
    hop: int = 1        # hop_latency: cycles per router hop
    ramp: int = 2       # ramp_latency: cycles between a router and its PE
    issue: int = 3      # issue_overhead: cycles to start a tensor op
    scalar: int = 1     # scalar_cycles: one scalar instruction
    move: int = 2       # simd move_f32: fp32 elements a cycle of a local copy
    queue: int = 14     # queue_depth: wavelets an input queue holds per color

    @classmethod
    def of(cls, machine) -> "Costs":
        """The costs of a machine preset (isa.machine.Machine or anything with the same
        four fields)."""
        return cls(int(machine.hop_latency), int(machine.ramp_latency),
                   int(machine.issue_overhead), int(machine.scalar_cycles),
                   int(machine.simd_width("move_f32")), int(machine.queue_depth))


# ---------------------------------------------------------------------------------------------
# The per-position plan: which ops a PE runs and how its router forwards each color.

# An operand: "src" / "dst" (SRAM blocks) or ("in", color) / ("out", color) (fabric).
# An op: ("add", dst, a, b) or ("mov", dst, a).


@dataclass
class _Pos:
    ops: list = field(default_factory=list)
    routes: dict = field(default_factory=dict)  # color -> (rx set, tx set)

    def route(self, color: int, rx: str, tx: str) -> None:
        r, t = self.routes.setdefault(color, (set(), set()))
        r.add(rx)
        t.add(tx)


def default_root(length: int) -> int:
    """The middle of the line: the root of a broadcast unless told, and the first root the
    other kinds consider (see best_layout)."""
    return (length - 1) // 2


def root_candidates(length: int) -> tuple[int, ...]:
    """The roots best_layout weighs, the first winning a tie: the last PE (twice the
    distance, one block to add) and the middle (half the distance, but the root adds two
    blocks, one a half)."""
    return tuple(sorted({default_root(length), length - 1}, reverse=True))


def best_group(side: int, n: int, costs: Costs, left: bool = False) -> int:
    """The group size with the lowest two-phase cost for one side of `side` PEs."""
    if side <= 1:
        return 1
    best = min(range(1, side + 1),
               key=lambda g: (_two_phase_side(side, g, n, costs, left)[1], g))
    return best


def colors_needed(kind: str, form: str, length: int, root: int | None = None) -> int:
    """How many colors a collective of this kind and form uses on a line of `length` PEs."""
    _check_kind_form(kind, form)
    if root is None:
        if kind == "broadcast":
            root = default_root(length)
        else:
            return max(colors_needed(kind, form, length, r) for r in root_candidates(length))
    a_left, a_right = root, length - 1 - root
    bcast = 1 if kind in ("broadcast", "allreduce") and length > 1 else 0
    if kind == "broadcast" or length == 1:
        return bcast
    if form == "chain":
        return 2 + bcast
    if form == "two_phase":
        return 4 + bcast
    return max(a_left, a_right).bit_length() + bcast


def _check_kind_form(kind: str, form: str) -> None:
    if kind not in KINDS:
        raise CollectiveError(f"collective kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if form not in FORMS:
        raise CollectiveError(f"collective form must be one of {', '.join(FORMS)}, got {form!r}")


def _plan(kind: str, form: str, length: int, root: int, groups: tuple[int, int],
          colors: tuple[int, ...], dirs: tuple[str, str]) -> list[_Pos]:
    """The ops and routes of every position of one line.

    dirs = (port toward larger positions, port toward smaller ones), e.g. ("E", "W").
    """
    up, down = dirs
    pos = [_Pos() for _ in range(length)]
    sides = []  # (sign, side length, port toward the root, port away from it, side index)
    if root > 0:
        sides.append((-1, root, up, down, 0))
    if root < length - 1:
        sides.append((+1, length - 1 - root, down, up, 1))
    at = lambda s, q: root + s * q  # noqa: E731  position of the PE at distance q on side s

    root_ops = pos[root].ops
    reduces = kind in ("reduce", "allreduce") and length > 1
    if reduces and form in ("chain", "two_phase"):
        if form == "chain":
            c1, c2 = (), colors[0:2]
        else:
            c1, c2 = colors[0:2], colors[2:4]
        incoming = []
        # both halves end on c2[base]; with base = (root - 1) % 2 a chain's link from
        # position p to p + 1 has color c2[p % 2], whatever the root
        base = (root - 1) % 2
        for s, a, to, away, side in sides:
            g = 1 if form == "chain" else min(groups[side], a)
            ngroups = -(-a // g)
            g0 = a - (ngroups - 1) * g  # the group next to the root takes the remainder
            for k in range(ngroups):
                lo = 1 if k == 0 else g0 + (k - 1) * g + 1
                hi = g0 + k * g
                for q in range(lo, hi + 1):
                    p = pos[at(s, q)]
                    if q < hi:  # phase 1: send outward to q + 1
                        cout = c1[q % 2]
                        p.route(cout, "RAMP", away)
                        pos[at(s, q + 1)].route(cout, to, "RAMP")
                    if q > lo and q < hi:
                        p.ops.append(("add", ("out", c1[q % 2]), ("in", c1[(q - 1) % 2]), "src"))
                    elif q == lo and q < hi:
                        p.ops.append(("mov", ("out", c1[q % 2]), "src"))
                # the group root (q = hi) sends toward the line's root on c2, through the
                # routers of its group, to the previous group's root (or the line's root,
                # which takes both halves on c2[base], in the order they were sent)
                cp = c2[(k + base) % 2]
                pos[at(s, hi)].route(cp, "RAMP", to)
                for q in range(lo, hi):
                    pos[at(s, q)].route(cp, away, to)
                pos[at(s, lo - 1)].route(cp, away, "RAMP")
                gr = pos[at(s, hi)]
                part = "src"
                if hi > lo:
                    if k == ngroups - 1:
                        part = ("in", c1[(hi - 1) % 2])
                    else:
                        gr.ops.append(("add", "dst", ("in", c1[(hi - 1) % 2]), "src"))
                        part = "dst"
                if k == ngroups - 1:
                    if part == "src":
                        gr.ops.append(("mov", ("out", cp), "src"))
                    else:
                        gr.ops.append(("add", ("out", cp), part, "src"))
                else:
                    gr.ops.append(("add", ("out", cp), part, ("in", c2[(k + 1 + base) % 2])))
            incoming.append(c2[base])
        acc = "src"
        for c in incoming:  # whichever half's block was sent first
            root_ops.append(("add", "dst", ("in", c), acc))
            acc = "dst"
    elif reduces:  # tree
        levels = colors_needed("reduce", "tree", length, root)
        tc = colors[:levels]
        for s, a, to, away, side in sides:
            parent, level = _tree_shape(a)
            for q in range(1, a + 1):
                c, p = tc[level[q]], parent[q]
                pos[at(s, q)].route(c, "RAMP", to)
                for m in range(p + 1, q):
                    pos[at(s, m)].route(c, away, to)
                pos[at(s, p)].route(c, away, "RAMP")
            # each PE adds its children's blocks, nearest (earliest) first, then sends its sum
            kids = _kids(parent)
            for q in range(1, a + 1):
                acc = "src"
                for child in kids[q]:
                    pos[at(s, q)].ops.append(("add", "dst", ("in", tc[level[child]]), acc))
                    acc = "dst"
                pos[at(s, q)].ops.append(("mov", ("out", tc[level[q]]), acc))
        acc = "src"  # the root: each level's blocks from both halves, in the order sent
        first = [(level[q], side) for s, a, to, away, side in sides
                 for parent, level in [_tree_shape(a)] for q in _kids(parent)[0]]
        for lv, _side in sorted(first):
            root_ops.append(("add", "dst", ("in", tc[lv]), acc))
            acc = "dst"
    if kind == "broadcast" or (kind == "allreduce" and length > 1):
        _flood(pos, root, sides, colors[-1] if length > 1 else None, kind, at)
    elif kind == "reduce" and length == 1:
        root_ops.append(("mov", "dst", "src"))
    if kind == "allreduce" and length == 1:
        root_ops.append(("mov", "dst", "src"))
    return pos


def _flood(pos, root, sides, color, kind, at) -> None:
    """The broadcast from the root to every PE of the line: one multicast on `color`."""
    value = "src" if kind == "broadcast" else "dst"
    if color is None:  # a line of one PE
        if kind == "broadcast":
            pos[root].ops.append(("mov", "dst", "src"))
        return
    for s, a, to, away, side in sides:
        pos[root].route(color, "RAMP", away)
        for q in range(1, a + 1):
            p = pos[at(s, q)]
            p.route(color, to, "RAMP")
            if q < a:
                p.route(color, to, away)
            p.ops.append(("mov", "dst", ("in", color)))
    pos[root].ops.append(("mov", ("out", color), value))
    if kind == "broadcast":
        pos[root].ops.append(("mov", "dst", "src"))  # a no-op copy when dst is src


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Role:
    """A strip of the collective's rectangle whose PEs all run the same code."""
    rect: Rect          # absolute fabric rectangle
    first: int          # its first position along the line (0-based)
    count: int          # positions it covers
    name: str           # "root", "chain", "group-root", "tree-3", "leaf", ...
    code: tuple         # the ops (see _Pos); equal codes = equal instructions


class LineCollective:
    """One collective on every line of a rectangle; made by broadcast(), reduce(), allreduce().

    Attributes: kind, form, axis, rect (a Rect, absolute), n (wavelets a block), length (PEs a
    line), root (its position), group (two_phase group sizes of the left and right halves),
    colors (the colors it uses, in order), roles (tuple of Role, in position order).
    """

    def __init__(self, kind: str, rect, axis: str, n: int, colors, form: str = "fastest",
                 root: int | None = None, group: int | None = None,
                 costs: Costs | None = None):
        if kind not in KINDS:
            raise CollectiveError(f"collective kind must be one of {', '.join(KINDS)}, "
                                  f"got {kind!r}")
        if form not in (*FORMS, "fastest"):
            raise CollectiveError(f"collective form must be one of {', '.join(FORMS)}, "
                                  f"fastest, got {form!r}")
        if axis not in AXES:
            raise CollectiveError(f"collective axis must be 'row' or 'column', got {axis!r}")
        self.rect = rect if isinstance(rect, Rect) else Rect(*(int(v) for v in rect))
        if self.rect.w < 1 or self.rect.h < 1 or self.rect.x < 0 or self.rect.y < 0:
            raise CollectiveError(f"collective rectangle {tuple(self.rect.__dict__.values())} "
                                  "is empty or off the fabric")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 65535:
            raise CollectiveError(f"collective block length must be 1..65535 wavelets, got {n!r}")
        self.kind, self.axis, self.n = kind, axis, n
        self.length = self.rect.w if axis == "row" else self.rect.h
        self.costs = costs or Costs()
        colors = tuple(int(c) for c in colors)
        if root is None and kind != "broadcast":
            if form != "fastest" and group is None:
                _check_kind_form(kind, form)
            form, root = best_layout(kind, self.length, n, self.costs,
                                     None if form == "fastest" else form, len(colors))
        self.root = default_root(self.length) if root is None else int(root)
        if not 0 <= self.root < self.length:
            raise CollectiveError(f"collective root {self.root} is outside the line "
                                  f"(0..{self.length - 1})")
        if form == "fastest":
            form, _ = fastest(kind, self.length, n, self.costs, root=self.root,
                              max_colors=len(colors))
        _check_kind_form(kind, form)
        self.form = form
        a_left, a_right = self.root, self.length - 1 - self.root
        if group is not None:
            if form != "two_phase":
                raise CollectiveError(f"group= applies to the two_phase form, not {form}")
            pair = (group, group) if isinstance(group, int) else tuple(group)
            if len(pair) != 2 or any(isinstance(g, bool) or not isinstance(g, int) or g < 1
                                     for g in pair):
                raise CollectiveError(f"collective group must be an integer >= 1 or a (left, "
                                      f"right) pair of them, got {group!r}")
            self.group = pair
        elif form == "two_phase":
            self.group = (best_group(a_left, n, self.costs, True),
                          best_group(a_right, n, self.costs))
        else:
            self.group = (1, 1)
        need = colors_needed(kind, form, self.length, self.root)
        if len(colors) < need:
            raise CollectiveError(f"a {form} {kind} over {self.length} PEs needs {need} colors, "
                                  f"got {len(colors)}")
        if len(set(colors[:need])) != need:
            raise CollectiveError(f"collective colors must be distinct, got {colors[:need]}")
        self.colors = colors[:need]
        dirs = ("E", "W") if axis == "row" else ("S", "N")
        self._pos = _plan(kind, form, self.length, self.root, self.group, self.colors, dirs)
        self.roles = self._roles()

    # -- geometry -----------------------------------------------------------------------------

    def strip(self, first: int, count: int) -> Rect:
        """The absolute rectangle of positions first..first+count-1 of every line."""
        r = self.rect
        if self.axis == "row":
            return Rect(r.x + first, r.y, count, r.h)
        return Rect(r.x, r.y + first, r.w, count)

    def position(self, x: int, y: int) -> int:
        return x - self.rect.x if self.axis == "row" else y - self.rect.y

    def _name(self, p: int) -> str:
        if p == self.root:
            return "root"
        ops = self._pos[p].ops
        sends = any(isinstance(o[1], tuple) and o[1][0] == "out" for o in ops)
        recvs = sum(1 for o in ops for a in o[2:] if isinstance(a, tuple))
        if not sends:
            return "leaf"
        return "head" if recvs == 0 else "relay" if recvs == 1 else "merge"

    def _roles(self) -> tuple[Role, ...]:
        roles, p = [], 0
        while p < self.length:
            code = tuple(self._pos[p].ops)
            q = p + 1
            while q < self.length and q != self.root and p != self.root \
                    and tuple(self._pos[q].ops) == code:
                q += 1
            roles.append(Role(self.strip(p, q - p), p, q - p, self._name(p), code))
            p = q
        return tuple(roles)

    def role_at(self, x: int, y: int) -> Role:
        p = self.position(x, y)
        for role in self.roles:
            if role.first <= p < role.first + role.count:
                return role
        raise CollectiveError(f"PE ({x}, {y}) is not in the collective's rectangle")

    # -- routes -------------------------------------------------------------------------------

    def route_rules(self) -> list[tuple[int, int, int, int, int, str, str]]:
        """(x, y, w, h, color, rx, tx) rules for ProgramBuilder.route, merged into strips."""
        rules = []
        for color in self.colors:
            p = 0
            while p < self.length:
                rt = self._pos[p].routes.get(color)
                q = p + 1
                while q < self.length and self._pos[q].routes.get(color) == rt:
                    q += 1
                if rt is not None:
                    r = self.strip(p, q - p)
                    rules.append((r.x, r.y, r.w, r.h, color, "|".join(sorted(rt[0])),
                                  "|".join(sorted(rt[1]))))
                p = q
        return rules

    def add_routes(self, pb, loc=None) -> None:
        """Add the route rules of every line to a ProgramBuilder."""
        for x, y, w, h, color, rx, tx in self.route_rules():
            pb.route(x, y, w, h, color, rx, tx, loc=loc)

    # -- code ---------------------------------------------------------------------------------

    def emit(self, rb, src, dst, dregs=("d12", "d13", "d14", "d15"), rregs=("r14", "r15"),
             label: str | None = None, loc=None) -> None:
        """Append the collective's code for the PEs of region `rb` (inside self.rect).

        src / dst: SRAM byte addresses (ints or builder Addrs) of the n-wavelet fp32 blocks.
        dregs: four descriptor registers the code may overwrite; rregs: two integer registers
        it may overwrite when the region spans several roles (the dispatch). label: a prefix
        for the dispatch labels (unique in the region; default from the collective's colors).
        """
        r = rb.rect
        inside = (self.rect.x <= r.x and r.x + r.w <= self.rect.x + self.rect.w
                  and self.rect.y <= r.y and r.y + r.h <= self.rect.y + self.rect.h)
        if not inside:
            raise CollectiveError(f"region {rb.name!r} is not inside the collective's rectangle "
                                  f"({self.rect.x}, {self.rect.y}, {self.rect.w}, {self.rect.h})")
        if self.axis == "row":
            lo, hi = r.x - self.rect.x, r.x - self.rect.x + r.w
        else:
            lo, hi = r.y - self.rect.y, r.y - self.rect.y + r.h
        parts = [(max(lo, ro.first), min(hi, ro.first + ro.count), ro) for ro in self.roles
                 if ro.first < hi and ro.first + ro.count > lo]
        if len({ro.code for _a, _b, ro in parts}) == 1:  # one code for all: no branch
            self._emit_code(rb, parts[0][2].code, src, dst, dregs, loc, rregs[1])
            return
        tag = label or f"coll_{self.kind}_{'_'.join(map(str, self.colors))}"
        pr, kr = rregs
        origin = self.rect.x if self.axis == "row" else self.rect.y
        rb.addi(pr, "GX" if self.axis == "row" else "GY", -origin, loc=loc)
        codes: dict[tuple, str] = {}
        for _a, _b, ro in parts:
            codes.setdefault(ro.code, f"{tag}_c{len(codes)}")

        def tree(items, name):
            if len(items) == 1:
                rb.jmp(codes[items[0][2].code], loc=loc)
                return
            mid = len(items) // 2
            rb.li(kr, items[mid][0], loc=loc)
            rb.bge(pr, kr, f"{name}r", loc=loc)
            tree(items[:mid], name + "l")
            rb.label(f"{name}r", loc=loc)
            tree(items[mid:], name + "r")
        tree(parts, f"{tag}_t")
        for code, name in codes.items():
            rb.label(name, loc=loc)
            self._emit_code(rb, code, src, dst, dregs, loc, kr)
            rb.jmp(f"{tag}_end", loc=loc)
        rb.label(f"{tag}_end", loc=loc)

    def _emit_code(self, rb, code, src, dst, dregs, loc, scratch: str) -> None:
        """A role's code. A block at an address dmem cannot hold (16 bits: a GPU core's SRAM
        is larger) is reached with daddr from the scratch register set to 0."""
        ds, dd, di, do = dregs
        n = self.n

        def desc(d, addr):
            if isinstance(addr, int) and addr > 0xFFFF:
                rb.dmem(d, "f32", 0, n, loc=loc)
                rb.li(scratch, 0, loc=loc)
                rb.daddr(d, scratch, addr, loc=loc)
            else:
                rb.dmem(d, "f32", addr, n, loc=loc)
        if src is dst or (isinstance(src, int) and isinstance(dst, int) and src == dst):
            # in place: "dst" is "src", and a copy between them is nothing
            code = tuple(tuple("src" if a == "dst" else a for a in op) for op in code)
            code = tuple(op for op in code if not (op[0] == "mov" and op[1] == op[2]))
        ready = set()
        for op in code:
            for a in op[1:]:  # SRAM descriptors just before their first use, so that a
                if isinstance(a, str) and a not in ready:  # sender starts 2 cycles in
                    desc(ds if a == "src" else dd, src if a == "src" else dst)
                    ready.add(a)
            regs = []
            for a in op[1:]:
                if a == "src":
                    regs.append(ds)
                elif a == "dst":
                    regs.append(dd)
                elif a[0] == "in":
                    rb.dfin(di, "f32", a[1], n, loc=loc)
                    regs.append(di)
                else:
                    rb.dfout(do, "f32", a[1], n, loc=loc)
                    regs.append(do)
            if op[0] == "add":
                rb.vadd(*regs, loc=loc)
            else:
                rb.vmov(*regs, loc=loc)

    # -- cost ---------------------------------------------------------------------------------

    def cost(self, costs: Costs | None = None) -> int:
        """The formula's cycles for this collective (see cost())."""
        return cost(self.kind, self.form, self.length, self.n, costs or self.costs,
                    root=self.root, group=self.group)


def broadcast(rect, axis: str, n: int, colors, root: int | None = None, form: str = "chain",
              costs: Costs | None = None) -> LineCollective:
    """The root's block to every PE of each line (one multicast flood; `form` changes nothing)."""
    return LineCollective("broadcast", rect, axis, n, colors, form, root, None, costs)


def reduce(rect, axis: str, n: int, colors, form: str = "fastest", root: int | None = None,
           group: int | None = None, costs: Costs | None = None) -> LineCollective:
    """The sum of each line's blocks into the root's dst."""
    return LineCollective("reduce", rect, axis, n, colors, form, root, group, costs)


def allreduce(rect, axis: str, n: int, colors, form: str = "fastest", root: int | None = None,
              group: int | None = None, costs: Costs | None = None) -> LineCollective:
    """The sum of each line's blocks into dst on every PE of the line."""
    return LineCollective("allreduce", rect, axis, n, colors, form, root, group, costs)


def split(rect, *collectives: LineCollective) -> list[tuple[Rect, tuple[Role, ...]]]:
    """Cut `rect` into rectangles on which each collective has one role.

    Returns [(Rect, (role of collective 0, role of collective 1, ...))], row-major. Every
    collective's rectangle must contain `rect`'s PEs that it covers; a collective that does
    not cover a sub-rectangle gets None there.
    """
    rect = rect if isinstance(rect, Rect) else Rect(*rect)
    xs, ys = {rect.x, rect.x + rect.w}, {rect.y, rect.y + rect.h}
    for c in collectives:
        cr = c.rect
        xs.update((cr.x, cr.x + cr.w))
        ys.update((cr.y, cr.y + cr.h))
        for ro in c.roles:
            xs.update((ro.rect.x, ro.rect.x + ro.rect.w))
            ys.update((ro.rect.y, ro.rect.y + ro.rect.h))
    xs = sorted(v for v in xs if rect.x <= v <= rect.x + rect.w)
    ys = sorted(v for v in ys if rect.y <= v <= rect.y + rect.h)
    out = []
    for y0, y1 in zip(ys, ys[1:]):
        for x0, x1 in zip(xs, xs[1:]):
            roles = tuple(c.role_at(x0, y0) if c.rect.contains(x0, y0) else None
                          for c in collectives)
            out.append((Rect(x0, y0, x1 - x0, y1 - y0), roles))
    return out


# ---------------------------------------------------------------------------------------------
# Cost formulas (docs/collectives.md derives each from docs/timing-model.md).


def _rho(d: int, c: Costs) -> int:
    """From a streaming op's start to its first wavelet's arrival d hops away: the op injects
    one cycle after it starts, then a ramp up, d hops, a ramp down."""
    return 1 + 2 * c.ramp + d * c.hop


def _two_phase_side(a: int, g: int, n: int, c: Costs, left: bool = False) -> tuple[int, int]:
    """(issue, arrival) of one side of `a` PEs in groups of `g` (g = 1 is the chain), counted
    from the start of every PE's code: `arrival` is when the first wavelet of the side's
    block reaches the root, `issue` the clock at which its last sender executed the send.
    Messages take a shared link or ramp, and their place in the root's queue, in the order
    their sends execute (docs/timing-model.md, sections 5 and 7); a streaming relay executes
    as soon as its input is queued, long before its first wavelet is in, so a chain issues
    at once, while a group root issues only after its own group's block is added. `left`:
    the half whose positions (and, in row-major regions, PE indices) grow toward the root,
    which decides the order of sends that execute in the same cycle."""
    o, s = c.issue, c.scalar
    g = min(g, a)
    head = 2 * s + o                      # dmem src, dfout, then the head's op starts
    ngroups = -(-a // g)
    g0 = a - (ngroups - 1) * g            # the group next to the root takes the remainder

    def ready(size: int) -> int:
        """When a group root (not the farthest) can start its phase-2 op: its op1 (group
        stream + own block) ends n cycles after the stream's head arrives, then dfin,
        dfout and the issue overhead; a group of one has nothing to add first."""
        if size == 1:
            return 3 * s + o
        return head + (size - 1) * _rho(1, c) + n + 2 * s + o

    t = head + (g - 1) * _rho(1, c) if ngroups > 1 else head + (a - 1) * _rho(1, c)
    issue = 3 * s
    for k in range(ngroups - 2, -1, -1):
        size = g if k else g0
        r = ready(size)
        if k == ngroups - 2 and size > 1 and g > 1 and left:
            # the farthest group root streams its block on as soon as its input is queued,
            # in the same scheduler cycle as this group's last relay; on the left half it
            # comes first in PE order, so its block takes this group root's ramp first and
            # the group's own stream follows it
            r = max(head + (size - 1) * _rho(1, c), t + _rho(g, c) + n) + n + 2 * s + o
        t = max(r, t + _rho(g, c))
        if size > 1:
            issue = max(issue, r - o)
    return issue, t + _rho(g0, c)


def _tree_shape(a: int) -> tuple[list[int], list[int]]:
    """(parent, level) of each PE q = 1..a of a half (index 0 unused; q = 0 is the root).

    The half is the far end of a whole binomial tree of 2^L - 1 PEs (L = a.bit_length()):
    PE q is tree node u = q + off, off = 2^L - 1 - a, which sends at level lowbit(u) to node
    u - lowbit(u); a PE whose parent would be one of the `off` missing nodes next to the root
    sends to the root itself. So every PE has all its children (none sends before the
    traffic beneath it has passed, which a tree cut short at the far end would), and the
    root's children have distinct levels, nearer ones lower."""
    off = (1 << a.bit_length()) - 1 - a
    parent, level = [0] * (a + 1), [0] * (a + 1)
    for q in range(1, a + 1):
        u = q + off
        low = u & -u
        level[q] = low.bit_length() - 1
        parent[q] = max(u - low - off, 0)
    return parent, level


def _kids(parent: list[int]) -> list[list[int]]:
    """For each q, the PEs that send to it, nearest (lowest level, earliest) first."""
    kids = [[] for _ in parent]
    for k in range(1, len(parent)):
        kids[parent[k]].append(k)
    return kids


def _tree_side(a: int, n: int, c: Costs) -> list[tuple[int, int, int]]:
    """(level, issue, arrival) of each block the root gets from one half of `a` PEs: the
    clock at which its sender executes the send, and when its first wavelet is in."""
    o, s = c.issue, c.scalar
    parent, level = _tree_shape(a)
    kids = _kids(parent)
    send = [0] * (a + 1)
    for q in range(a, 0, -1):
        end = None
        for child in kids[q]:  # dmem src, dmem dst, dfin before the first; dfin before others
            head = send[child] + _rho(child - q, c)
            end = max((3 * s + o) if end is None else end + s + o, head) + n
        send[q] = (2 * s + o) if end is None else end + s + o  # (dmem src,) dfout, issue
    return [(level[q], send[q] - o, send[q] + _rho(q, c)) for q in kids[0]]


def cost(kind: str, form: str, length: int, n: int, costs: Costs | None = None,
         root: int | None = None, group: tuple[int, int] | int | None = None) -> int:
    """Cycles of a collective on a line of `length` PEs with blocks of `n` wavelets.

    Counted from the moment every PE starts the collective's code to the last PE's last
    instruction (a `halt` after it included). `group` (two_phase) is one size for both
    halves, a (left, right) pair, or None for the best.
    """
    _check_kind_form(kind, form)
    c = costs or Costs()
    o, s = c.issue, c.scalar
    root = default_root(length) if root is None else root
    a_left, a_right = root, length - 1 - root
    if length == 1:
        return 2 * s + o + n + s
    if kind == "broadcast":
        start = 2 * s + o                 # dmem src, dfout, issue
        flood = start + _rho(max(a_left, a_right), c) + n
        # the root then copies its block to its own dst (nothing when dst is src), once its
        # send is released: the farthest PE has taken all but a queue of it (backpressure)
        resume = max(start + n, flood - c.queue) if n > c.queue else start + n
        return max(flood + s, resume + s + o + -(-n // c.move) + s)  # dmem dst, copy, halt
    if form == "tree":
        # by level; in a level, in the order the sends execute (left first on a tie)
        got = sorted((lv, issue, side, arr) for side, a in enumerate((a_left, a_right))
                     for lv, issue, arr in _tree_side(a, n, c))
        arrivals = []
        for *_k, arr in got:  # one ramp: each block's head after the previous one's tail
            arrivals.append(arr if not arrivals else max(arr, arrivals[-1] + n))
    else:
        if group is None:
            g = (best_group(a_left, n, c, True), best_group(a_right, n, c)) \
                if form == "two_phase" \
                else (1, 1)
        elif isinstance(group, int):
            g = (group, group)
        else:
            g = tuple(group)
        if form == "chain":
            g = (1, 1)
        # (issue, side, arrival): the root takes the halves in the order their last sends
        # execute (the left half first on a tie: its PEs come first in the scheduler's order)
        sends = sorted(_two_phase_side(a, gg, n, c, i == 0) + (i,) for i, (a, gg)
                       in enumerate(((a_left, g[0]), (a_right, g[1]))) if a)
        # both halves come down the root's ramp, one wavelet a cycle: the block sent second
        # starts after the first one's last wavelet
        sends = [(iss, side, arr) for iss, arr, side in sends]
        sends.sort()
        arrivals = [sends[0][2]] + ([max(sends[1][2], sends[0][2] + n)] if len(sends) > 1
                                    else [])
    # the root adds the incoming blocks one op each, in arrival order
    end = None
    for i, head in enumerate(arrivals):
        setup = 3 * s if end is None else end + s
        end = max(setup + o, head) + n
    if kind == "reduce":
        return end + s
    # the broadcast back: dfout, issue, the flood to the farthest PE, its last wavelet
    return end + s + o + _rho(max(a_left, a_right), c) + n + s


def best_layout(kind: str, length: int, n: int, costs: Costs | None = None,
                form: str | None = None, max_colors: int | None = None) -> tuple[str, int]:
    """(form, root) with the lowest formula cost over root_candidates(length) (and over the
    forms, unless `form` is given), the last PE on a tie: what a collective made with
    root=None uses."""
    c = costs or Costs()
    best = None
    for root in root_candidates(length):
        try:
            f = form or fastest(kind, length, n, c, root, max_colors)[0]
        except CollectiveError:
            continue
        if form is None and max_colors is not None \
                and colors_needed(kind, f, length, root) > max_colors:
            continue
        t = cost(kind, f, length, n, c, root)
        if best is None or t < best[0]:
            best = (t, f, root)
    if best is None:
        raise CollectiveError(f"no {form or ''} {kind} form fits in {max_colors} colors"
                              .replace("  ", " "))
    return best[1], best[2]


def fastest(kind: str, length: int, n: int, costs: Costs | None = None,
            root: int | None = None, max_colors: int | None = None) -> tuple[str, None]:
    """(form, None): the form with the lowest formula cost for this root (default: the
    middle); a two_phase collective picks the best group size of each half itself. Forms
    that need more than max_colors colors are skipped."""
    c = costs or Costs()
    root = default_root(length) if root is None else root
    best = None
    for form in FORMS:
        if max_colors is not None and colors_needed(kind, form, length, root) > max_colors:
            continue
        t = cost(kind, form, length, n, c, root)
        if best is None or t < best[0]:
            best = (t, form, None)
    if best is None:
        raise CollectiveError(f"no {kind} form fits in {max_colors} colors")
    return best[1], best[2]


__all__ = ["AXES", "FORMS", "KINDS", "CollectiveError", "Costs", "LineCollective", "Role",
           "allreduce", "best_group", "best_layout", "broadcast", "colors_needed", "cost",
           "default_root", "fastest", "reduce", "root_candidates", "split"]

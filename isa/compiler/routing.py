"""Routing: static routes and colors for every flow between stages and inside them.

Patterns (docs/compiler.md has the pictures):
- a flow between stages leaves its producer's exit PE, goes vertically to the consumer's rows,
  then horizontally to its edge (Y-then-X), and spreads over the consumer's rectangle as a
  multicast tree: along the entry column (the "spine"), then along every row away from it;
  every PE of the rectangle takes a copy (one injection reaches them all);
- partial sums stream east along rows, and results stream north up a column, on two colors
  that alternate from link to link (a PE cannot receive and send on one color).

Colors are allocated greedily: a flow gets the lowest color that no route already uses at any
router it touches, so stages far apart reuse colors. Route rules are rectangles: per-router
masks are run-length merged along rows, then identical rows are merged.
"""

from __future__ import annotations

import numpy as np

from wse_emu.isa.compiler.lower import CompileError, Plan
from wse_emu.isa.compiler.placement import Placed
from wse_emu.isa.program import DIR_BITS, Rect, RouteRule

N, E, S, W, RAMP = (DIR_BITS[k] for k in ("N", "E", "S", "W", "RAMP"))
TOWARD = {N: S, S: N, E: W, W: E}  # the port a wavelet enters by after leaving through one


def exit_cell(p: Placed) -> tuple[int, int]:
    """The PE that sends a stage's result: top of the last column."""
    return p.rect.x + p.rect.w - 1, p.rect.y


class _Cells:
    """Per-router (rx, tx) masks of one color's routes, in insertion order."""

    def __init__(self):
        self.xs, self.ys, self.rx, self.tx = [], [], [], []

    def add(self, xs, ys, rx, tx) -> None:
        xs, ys = np.atleast_1d(np.asarray(xs)), np.atleast_1d(np.asarray(ys))
        n = np.broadcast(xs, ys).size
        self.xs.append(np.broadcast_to(xs, n))
        self.ys.append(np.broadcast_to(ys, n))
        self.rx.append(np.broadcast_to(np.asarray(rx), n))
        self.tx.append(np.broadcast_to(np.asarray(tx), n))

    def arrays(self):
        cat = lambda v: np.concatenate(v).astype(np.int64) if v else np.zeros(0, np.int64)  # noqa
        return cat(self.xs), cat(self.ys), cat(self.rx), cat(self.tx)


def _rules(cells: _Cells, color: int) -> list[RouteRule]:
    xs, ys, rx, tx = cells.arrays()
    if xs.size == 0:
        return []
    order = np.lexsort((xs, ys))
    xs, ys, rx, tx = xs[order], ys[order], rx[order], tx[order]
    brk = np.ones(xs.size, bool)
    brk[1:] = (ys[1:] != ys[:-1]) | (xs[1:] != xs[:-1] + 1) | (rx[1:] != rx[:-1]) | \
        (tx[1:] != tx[:-1])
    starts = np.nonzero(brk)[0]
    ends = np.append(starts[1:], xs.size) - 1
    runs = list(zip(xs[starts], xs[ends], ys[starts], rx[starts], tx[starts]))
    open_runs: dict[tuple, list] = {}  # (x0, x1, rx, tx) -> [y0, y1]
    rules = []
    for x0, x1, y, r, t in runs:
        key = (int(x0), int(x1), int(r), int(t))
        cur = open_runs.get(key)
        if cur is not None and cur[1] == y - 1:
            cur[1] = int(y)
            continue
        if cur is not None:
            rules.append((key, cur))
        open_runs[key] = [int(y), int(y)]
    rules += list(open_runs.items())
    return [RouteRule(Rect(k[0], y0, k[1] - k[0] + 1, y1 - y0 + 1), color, k[2], k[3])
            for k, (y0, y1) in rules]


class _Colors:
    def __init__(self, colors: int, w: int, h: int):
        self.used = np.zeros((colors, h, w), dtype=bool)

    def take(self, cells: _Cells, what: str) -> int:
        xs, ys, _, _ = cells.arrays()
        busy = self.used[:, ys, xs].any(axis=1)
        free = np.nonzero(~busy)[0]
        if free.size == 0:
            raise CompileError(f"routing: no free color for {what} (all {len(busy)} colors are "
                               f"in use on its path)")
        c = int(free[0])
        self.used[c, ys, xs] = True
        return c


def _path_and_tree(src: tuple[int, int], r: Rect) -> _Cells:
    """Cells of a flow from PE src into every PE of rect r (module docstring)."""
    cells = _Cells()
    sx, sy = src
    inside_cols = r.x <= sx < r.x + r.w
    if not inside_cols:
        ey = min(max(sy, r.y), r.y + r.h - 1)
        ex, step = (r.x, E) if sx < r.x else (r.x + r.w - 1, W)
        vy = ey  # the row of the Y-then-X path's corner
    else:
        ex = sx
        ey, step = (r.y, S) if sy < r.y else (r.y + r.h - 1, N)
        vy = ey - (1 if step == S else -1)  # stop just outside the rect
    path = [(sx, sy)]
    while path[-1][1] != vy:  # vertical leg
        x, y = path[-1]
        path.append((x, y + (1 if vy > y else -1)))
    if not inside_cols:  # horizontal leg, up to the cell before the rect's edge
        stop = ex - 1 if step == E else ex + 1
        while path[-1][0] != stop:
            x, y = path[-1]
            path.append((x + (1 if stop > x else -1), y))
    hops = path[1:] + [(ex, ey)]
    prev = RAMP
    for (x, y), (nx, ny) in zip(path, hops):
        d = E if nx > x else W if nx < x else S if ny > y else N
        cells.add(x, y, prev, d)
        prev = TOWARD[d]
    # the tree over r, entered at (ex, ey) from port `prev`
    xs, ys = np.meshgrid(np.arange(r.x, r.x + r.w), np.arange(r.y, r.y + r.h))
    xs, ys = xs.ravel(), ys.ravel()
    rx = np.zeros(xs.size, np.int64)
    tx = np.full(xs.size, RAMP, np.int64)
    if step in (E, W):  # spine = column ex, rows leave it horizontally
        spine = xs == ex
        away = E if step == E else W
        rx[spine & (ys < ey)] = S
        rx[spine & (ys > ey)] = N
        tx[spine & (ys < ey) & (ys > r.y)] |= N
        tx[spine & (ys > ey) & (ys < r.y + r.h - 1)] |= S
        at = spine & (ys == ey)
        tx[at] |= (N if ey > r.y else 0) | (S if ey < r.y + r.h - 1 else 0)
        rx[~spine] = TOWARD[away]
        edge = r.x + r.w - 1 if away == E else r.x
        tx[xs != edge] |= away
    else:  # spine = row ey, columns leave it vertically
        spine = ys == ey
        away = S if step == S else N
        rx[spine & (xs < ex)] = E
        rx[spine & (xs > ex)] = W
        tx[spine & (xs < ex) & (xs > r.x)] |= W
        tx[spine & (xs > ex) & (xs < r.x + r.w - 1)] |= E
        at = spine & (xs == ex)
        tx[at] |= (W if ex > r.x else 0) | (E if ex < r.x + r.w - 1 else 0)
        rx[~spine] = TOWARD[away]
        edge = r.y + r.h - 1 if away == S else r.y
        tx[ys != edge] |= away
    rx[(xs == ex) & (ys == ey)] = prev
    cells.add(xs, ys, rx, tx)
    return cells


def _chain(r: Rect, direction: int) -> tuple[_Cells, _Cells]:
    """Two alternating colors for a chain along rows (E) or up columns (N) of rect r."""
    pair = (_Cells(), _Cells())
    if direction == E:
        for q in range(r.w - 1):
            x = r.x + q
            pair[q % 2].add(x, np.arange(r.y, r.y + r.h), RAMP, E)
            pair[q % 2].add(x + 1, np.arange(r.y, r.y + r.h), W, RAMP)
    else:
        for p in range(1, r.h):
            y = r.y + p
            pair[p % 2].add(np.arange(r.x, r.x + r.w), y, RAMP, N)
            pair[p % 2].add(np.arange(r.x, r.x + r.w), y - 1, S, RAMP)
    return pair


def route(plan: Plan, placed: list[Placed], machine) -> tuple[list[RouteRule], dict]:
    """Route rules for the whole program; sets every flow's color and returns the stages' own
    colors: {stage id: {"east": (c0, c1), "north": (c0, c1)}} (the alternating chain pairs)."""
    w = max(p.rect.x + p.rect.w for p in placed)
    h = max(p.rect.y + p.rect.h for p in placed)
    colors = _Colors(machine.colors, w, h)
    rules: list[RouteRule] = []
    own: dict[int, dict] = {}

    def pair(key, cells, what, sid):
        got = []
        for c in cells:
            if c.xs:
                color = colors.take(c, f"{what} of stage '{plan.stages[sid].name}'")
                rules.extend(_rules(c, color))
                got.append(color)
            else:  # no PE sends on it: code that names it is never reached
                got.append(0)
        own.setdefault(sid, {})[key] = tuple(got)

    for s, p in zip(plan.stages, placed):
        r = p.rect
        if s.kind == "gemv":
            pair("east", _chain(r, E), "partial sums", s.id)
            pair("north", _chain(Rect(r.x + r.w - 1, r.y, 1, r.h), N), "result gather", s.id)
        elif s.kind == "attn":
            pair("north", _chain(r, N), "head gather", s.id)
        elif s.kind == "embed":
            pair("north", _chain(r, N), "row gather", s.id)
            pair("east", _chain(Rect(r.x, r.y, r.w, 1), E), "column gather", s.id)
    for f in plan.flows:
        src = exit_cell(placed[f.src])
        cells = _path_and_tree(src, placed[f.dst].rect)
        f.color = colors.take(cells, f"flow '{f.what}' from '{plan.stages[f.src].name}' to "
                                     f"'{plan.stages[f.dst].name}'")
        rules.extend(_rules(cells, f.color))
    return rules, own

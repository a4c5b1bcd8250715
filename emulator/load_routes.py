"""Route trees for the loader (load._build_trees): one breadth-first walk per (PE, color) that
may send, jitted because a full-size model has a million of them (seconds in Python).

For every sender the walk starts at its router and follows the color's `tx` bits: an entry per
link it reserves, in breadth-first order (each router's ports in N, E, S, W, RAMP order), with
the entry it leaves from (-1 at the source router) and, for RAMP, the PE it delivers to. The
first malformed tree (in sender order, then walk order) stops the walk and is described by an
error record that load.py turns into its one-line LoadError. A well-formed tree always reaches
a PE: every router forwards somewhere and no cell is reached twice, so its leaves are RAMPs.

The walk writes the tables the Numba core runs on, in their final form (int32, no copies
later): `tree_of`, a (PE, color) row per slot (first entry or -1, entries, RAMP deliveries),
`tree`, a row per entry (link, parent entry, destination: the PE of a RAMP delivery, -1 for a
link to the next router, PIPE0 - pipe for a link that crosses into a system pipe between two
chips), and a mark per input-queue slot that some tree delivers to.
"""

import numpy as np
from numba import njit

from wse_emu.isa.program import DIR_N, DIR_NAMES, DIR_RAMP, DIR_S, DIR_STEP, OPPOSITE as _OPPOSITE

# error codes (ERR_NONE: every tree is well formed)
ERR_NONE, ERR_NOWHERE, ERR_NO_CODE, ERR_OFF_FABRIC, ERR_NOT_ACCEPTED, ERR_LOOP = range(6)
N_PORTS = len(DIR_NAMES)
RAMP = DIR_RAMP
STEP_X = np.array([DIR_STEP[d][0] for d in range(RAMP)], dtype=np.int64)
STEP_Y = np.array([DIR_STEP[d][1] for d in range(RAMP)], dtype=np.int64)
OPPOSITE = np.array([_OPPOSITE[d] for d in range(RAMP)], dtype=np.int64)

# columns of tree_of (a row per (PE, color) slot) and of tree (a row per entry); the core's
# T_* and E_* (core_state) are the same
SLOT_START, SLOT_COUNT, SLOT_NDEST = range(3)
ENTRY_LINK, ENTRY_PARENT, ENTRY_DEST = range(3)
PIPE0 = -2  # ENTRY_DEST of a link into system pipe k: PIPE0 - k


@njit(cache=True)
def _grow_rows(a, need):
    if need <= a.shape[0]:
        return a
    out = np.empty((max(need, 2 * a.shape[0]), a.shape[1]), dtype=a.dtype)
    out[:a.shape[0]] = a
    return out


@njit(cache=True)
def crossing_pipe(y, port, chip_h, fabric_h):
    """The system pipe a link from row y through `port` crosses into, -1 for one that stays on
    its chip. Chip c holds rows [c * chip_h, (c + 1) * chip_h); the S link of c's last row is
    pipe 2c (c -> c + 1), the N link of chip c + 1's first row is pipe 2c + 1 (c + 1 -> c)."""
    if chip_h <= 0 or chip_h >= fabric_h:
        return -1
    if port == DIR_S and (y + 1) % chip_h == 0 and y + 1 < fabric_h:
        return 2 * (y // chip_h)
    if port == DIR_N and y % chip_h == 0 and y > 0:
        return 2 * (y // chip_h - 1) + 1
    return -1


@njit(cache=True)
def build_trees(rx, tx, pe_of_cell, sender_pe, sender_color, pe_x, pe_y, colors, fabric_w,
                fabric_h, chip_h):
    """(tree_of, tree, queue_mark, err) for the senders, in order (see the module docstring;
    chip_h: fabric rows a chip of a system, 0 on one chip).

    rx, tx: (colors, box_h, box_w) int8 port masks; queue_mark: bool per (PE, color) input
    queue, True where a tree delivers; err: int64 [code, color, x0, y0, x, y, port] (x, y:
    where it went wrong; port: the direction involved)."""
    box_h, box_w = rx.shape[1], rx.shape[2]
    n = pe_x.shape[0]
    tree_of = np.zeros((n * colors, 3), dtype=np.int32)
    tree_of[:, SLOT_START] = -1
    mark = np.zeros(n * colors, dtype=np.bool_)
    tree = np.empty((max(16, 4 * sender_pe.shape[0]), 3), dtype=np.int32)
    err = np.zeros(7, dtype=np.int64)
    seen = np.full(box_w * box_h, -1, dtype=np.int64)  # cell -> last tree that reached it
    fx = np.empty(box_w * box_h + 1, dtype=np.int64)  # frontier: a cell is reached once a tree
    fy = np.empty(box_w * box_h + 1, dtype=np.int64)
    fvia = np.empty(box_w * box_h + 1, dtype=np.int64)
    top = 0
    for s in range(sender_pe.shape[0]):
        pe, color = sender_pe[s], sender_color[s]
        slot = pe * colors + color
        x0, y0 = pe_x[pe], pe_y[pe]
        err[1], err[2], err[3] = color, x0, y0
        first = top
        ndest = 0
        tree_of[slot, SLOT_START] = first
        seen[y0 * box_w + x0] = s
        head, tail = 0, 1
        fx[0], fy[0], fvia[0] = x0, y0, -1
        while head < tail:
            x, y, via = fx[head], fy[head], fvia[head]
            head += 1
            out = tx[color, y, x]
            if out == 0:
                err[0], err[4], err[5] = ERR_NOWHERE, x, y
                return tree_of, tree[:top], mark, err
            for port in range(N_PORTS):
                if not (out >> port) & 1:
                    continue
                cell = y * box_w + x
                if top == tree.shape[0]:
                    tree = _grow_rows(tree, top + 1)
                tree[top, ENTRY_LINK] = cell * N_PORTS + port
                tree[top, ENTRY_PARENT] = via
                if port == RAMP:
                    target = pe_of_cell[cell]
                    if target < 0:
                        err[0], err[4], err[5] = ERR_NO_CODE, x, y
                        return tree_of, tree[:top], mark, err
                    tree[top, ENTRY_DEST] = target
                    mark[target * colors + color] = True
                    ndest += 1
                    top += 1
                    continue
                pipe = crossing_pipe(y, port, chip_h, fabric_h)
                tree[top, ENTRY_DEST] = -1 if pipe < 0 else PIPE0 - pipe
                top += 1
                nx, ny = x + STEP_X[port], y + STEP_Y[port]
                if not (0 <= nx < fabric_w and 0 <= ny < fabric_h):
                    err[0], err[4], err[5], err[6] = ERR_OFF_FABRIC, x, y, port
                    return tree_of, tree[:top], mark, err
                came_from = OPPOSITE[port]
                if not (nx < box_w and ny < box_h and (rx[color, ny, nx] >> came_from) & 1):
                    err[0], err[4], err[5], err[6] = ERR_NOT_ACCEPTED, nx, ny, came_from
                    return tree_of, tree[:top], mark, err
                if seen[ny * box_w + nx] == s:
                    err[0], err[4], err[5] = ERR_LOOP, nx, ny
                    return tree_of, tree[:top], mark, err
                seen[ny * box_w + nx] = s
                fx[tail], fy[tail], fvia[tail] = nx, ny, top - 1
                tail += 1
        tree_of[slot, SLOT_COUNT] = top - first
        tree_of[slot, SLOT_NDEST] = ndest
    # the rows written, a view: the buffer's spare rows were never written, so they hold no
    # memory (the allocator maps large buffers lazily), and a copy of Llama-3-70B's 109.8 M
    # entries cost 2-4 s of its load
    return tree_of, tree[:top], mark, err


@njit(cache=True)
def first_crossings(at, crosses, parent):
    """Through a switch (emulator/load.py link_pipes): for each crossing entry at[i], the first
    crossing of its path (the one nearest its source router, maybe itself): the entry whose
    port carries its copy of the message, the switch relaying it beyond. A walk up the parents
    from the crossings only (tree_parent: global indices, -1 at a source router), so a large
    system's 10^8 entries cost nothing but their few crossings' paths."""
    owner = np.empty(at.shape[0], dtype=np.int64)
    for i in range(at.shape[0]):
        top = at[i]
        u = parent[top]
        while u >= 0:
            if crosses[u]:
                top = u
            u = parent[u]
        owner[i] = top
    return owner

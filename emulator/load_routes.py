"""Route trees for the loader (load._build_trees): one breadth-first walk per (PE, color) that
may send, jitted because a full-size model has a million of them (seconds in Python).

For every sender the walk starts at its router and follows the color's `tx` bits: an entry per
link it reserves, in breadth-first order (each router's ports in N, E, S, W, RAMP order), with
the entry it leaves from (-1 at the source router) and, for RAMP, the PE it delivers to. The
first malformed tree (in sender order, then walk order) stops the walk and is described by an
error record that load.py turns into its one-line LoadError. A well-formed tree always reaches
a PE: every router forwards somewhere and no cell is reached twice, so its leaves are RAMPs.
"""

import numpy as np
from numba import njit

from wse_emu.isa.program import DIR_NAMES, DIR_RAMP, DIR_STEP, OPPOSITE as _OPPOSITE

# error codes (ERR_NONE: every tree is well formed)
ERR_NONE, ERR_NOWHERE, ERR_NO_CODE, ERR_OFF_FABRIC, ERR_NOT_ACCEPTED, ERR_LOOP = range(6)
N_PORTS = len(DIR_NAMES)
RAMP = DIR_RAMP
STEP_X = np.array([DIR_STEP[d][0] for d in range(RAMP)], dtype=np.int64)
STEP_Y = np.array([DIR_STEP[d][1] for d in range(RAMP)], dtype=np.int64)
OPPOSITE = np.array([_OPPOSITE[d] for d in range(RAMP)], dtype=np.int64)


@njit(cache=True)
def _grow(a, need):
    if need <= a.shape[0]:
        return a
    out = np.empty(max(need, 2 * a.shape[0]), dtype=a.dtype)
    out[:a.shape[0]] = a
    return out


@njit(cache=True)
def build_trees(rx, tx, pe_of_cell, sender_pe, sender_color, pe_x, pe_y, colors, fabric_w,
                fabric_h):
    """(tree_start, tree_count, link, parent, dest, err) for the senders, in order.

    rx, tx: (colors, box_h, box_w) int8 port masks; err: int64 [code, color, x0, y0, x, y, port]
    (x, y: where it went wrong; port: the direction involved)."""
    box_h, box_w = rx.shape[1], rx.shape[2]
    n = pe_x.shape[0]
    tree_start = np.full(n * colors, -1, dtype=np.int32)
    tree_count = np.zeros(n * colors, dtype=np.int32)
    cap = max(16, 4 * sender_pe.shape[0])
    link = np.empty(cap, dtype=np.int32)
    parent = np.empty(cap, dtype=np.int32)
    dest = np.empty(cap, dtype=np.int32)
    err = np.zeros(7, dtype=np.int64)
    seen = np.full(box_w * box_h, -1, dtype=np.int64)  # cell -> last tree that reached it
    fx = np.empty(box_w * box_h + 1, dtype=np.int64)  # frontier: a cell is reached once a tree
    fy = np.empty(box_w * box_h + 1, dtype=np.int64)
    fvia = np.empty(box_w * box_h + 1, dtype=np.int64)
    top = 0
    for s in range(sender_pe.shape[0]):
        pe, color = sender_pe[s], sender_color[s]
        x0, y0 = pe_x[pe], pe_y[pe]
        err[1], err[2], err[3] = color, x0, y0
        first = top
        tree_start[pe * colors + color] = first
        seen[y0 * box_w + x0] = s
        head, tail = 0, 1
        fx[0], fy[0], fvia[0] = x0, y0, -1
        while head < tail:
            x, y, via = fx[head], fy[head], fvia[head]
            head += 1
            out = tx[color, y, x]
            if out == 0:
                err[0], err[4], err[5] = ERR_NOWHERE, x, y
                return tree_start, tree_count, link[:top], parent[:top], dest[:top], err
            for port in range(N_PORTS):
                if not (out >> port) & 1:
                    continue
                cell = y * box_w + x
                if top == link.shape[0]:
                    link, parent, dest = _grow(link, top + 1), _grow(parent, top + 1), \
                        _grow(dest, top + 1)
                link[top] = cell * N_PORTS + port
                parent[top] = via
                if port == RAMP:
                    target = pe_of_cell[cell]
                    if target < 0:
                        err[0], err[4], err[5] = ERR_NO_CODE, x, y
                        return tree_start, tree_count, link[:top], parent[:top], dest[:top], err
                    dest[top] = target
                    top += 1
                    continue
                dest[top] = -1
                top += 1
                nx, ny = x + STEP_X[port], y + STEP_Y[port]
                if not (0 <= nx < fabric_w and 0 <= ny < fabric_h):
                    err[0], err[4], err[5], err[6] = ERR_OFF_FABRIC, x, y, port
                    return tree_start, tree_count, link[:top], parent[:top], dest[:top], err
                came_from = OPPOSITE[port]
                if not (nx < box_w and ny < box_h and (rx[color, ny, nx] >> came_from) & 1):
                    err[0], err[4], err[5], err[6] = ERR_NOT_ACCEPTED, nx, ny, came_from
                    return tree_start, tree_count, link[:top], parent[:top], dest[:top], err
                if seen[ny * box_w + nx] == s:
                    err[0], err[4], err[5] = ERR_LOOP, nx, ny
                    return tree_start, tree_count, link[:top], parent[:top], dest[:top], err
                seen[ny * box_w + nx] = s
                fx[tail], fy[tail], fvia[tail] = nx, ny, top - 1
                tail += 1
        tree_count[pe * colors + color] = top - first
    return tree_start, tree_count, link[:top], parent[:top], dest[:top], err


@njit(cache=True)
def switch_copies(crosses, parent):
    """Through a switch (emulator/load.py link_pipes): per route entry, 0 where its link is
    not a crossing or is a crossing beyond an earlier one of its path (the switch relays that
    copy, no port of its own), else the crossings of the subtree from it on (itself included):
    the copies of the message that leave by the sender's port there. Parents precede their
    children (breadth-first entries, global indices, -1 at a source router)."""
    n = crosses.shape[0]
    owner = np.full(n, -1, dtype=np.int64)  # the first crossing on the entry's path
    copies = np.zeros(n, dtype=np.int64)
    for e in range(n):
        up = owner[parent[e]] if parent[e] >= 0 else -1
        if up >= 0:
            owner[e] = up
            if crosses[e]:
                copies[up] += 1
        elif crosses[e]:
            owner[e] = e
            copies[e] += 1
    return copies

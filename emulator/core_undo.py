"""The undo log of the Numba core: the original contents of every SRAM byte a PE writes, so
that a run can be put back and replayed in strict order (core.py explains when).

Each PE's written span only grows, and what a write adds to it is logged once, before it is
written: at most the bytes written, appended in order, which costs far less than keeping a
mirror of the whole SRAM (whose scattered lines miss the cache on every first write).
Executors do not call it: every SRAM write goes through core_sram, which logs.
"""

from numba import njit

from wse_emu.emulator.core_fabric import need
from wse_emu.emulator.core_state import (K_UNDO_N, K_UNDO_TOP, MP_UNDO, NEED_UNDO, P_HULL_HI, P_HULL_LO,
                                 P_SRAM0, U_LEN, U_OFF, U_START)


@njit(cache=True, inline="always")
def undo_fits(p, lo, hi, pe, undo, undo_data, counters):
    """Whether the log has room for PE p writing bytes [lo, hi); if not, ask to grow it.

    The log takes what the write adds to the PE's written hull, which can be much more than
    hi - lo when the write lies away from the hull (the gap between them is logged too)."""
    h_lo, h_hi = pe[p, P_HULL_LO], pe[p, P_HULL_HI]
    if h_lo < h_hi:
        added = (max(h_hi, hi) - min(h_lo, lo)) - (h_hi - h_lo)
    else:
        added = hi - lo
    words = (added + 1) // 2 + 1
    if counters[K_UNDO_N] + 2 <= undo.shape[0] and \
            counters[K_UNDO_TOP] + words <= undo_data.shape[0]:
        return True
    need(counters, NEED_UNDO, words)
    return False


@njit(cache=True)
def _log(a, b, sram_u16, undo, undo_data, counters):
    """Append SRAM uint16 words [a, b) to the log."""
    if a >= b:
        return
    n, top = counters[K_UNDO_N], counters[K_UNDO_TOP]
    undo[n, U_START] = a
    undo[n, U_LEN] = b - a
    undo[n, U_OFF] = top
    src, dst = sram_u16[a:b], undo_data[top:top + b - a]
    for i in range(b - a):  # an element loop over slices: vector copies (slice assignment
        dst[i] = src[i]     # compiles to a generic strided loop, a 16-bit word at a time)
    counters[K_UNDO_N] = n + 1
    counters[K_UNDO_TOP] = top + b - a


@njit(cache=True)
def _widen_hull(p, lo, hi, pe, sram_u16, undo, undo_data, counters):
    base = pe[p, P_SRAM0] // 2
    h_lo, h_hi = pe[p, P_HULL_LO], pe[p, P_HULL_HI]
    if h_lo == h_hi:  # empty
        h_lo = h_hi = lo
    _log(base + lo // 2, base + h_lo // 2, sram_u16, undo, undo_data, counters)
    _log(base + h_hi // 2, base + hi // 2, sram_u16, undo, undo_data, counters)
    pe[p, P_HULL_LO] = min(h_lo, lo)
    pe[p, P_HULL_HI] = max(h_hi, hi)


@njit(cache=True, inline="always")
def note_write(p, lo, hi, pe, sram_u16, undo, undo_data, counters, mp):
    """PE p is about to write bytes [lo, hi) of its SRAM (writes are 2-byte aligned); the
    caller has checked undo_fits."""
    if mp[MP_UNDO] == 0 or lo >= hi:
        return
    if pe[p, P_HULL_LO] < pe[p, P_HULL_HI] and pe[p, P_HULL_LO] <= lo and hi <= pe[p, P_HULL_HI]:
        return
    _widen_hull(p, lo, hi, pe, sram_u16, undo, undo_data, counters)


@njit(cache=True)
def restore_sram(sram_u16, undo, undo_data, counters):
    """Put back the original contents of everything the run wrote."""
    for i in range(counters[K_UNDO_N]):
        a, n, off = undo[i, U_START], undo[i, U_LEN], undo[i, U_OFF]
        sram_u16[a:a + n] = undo_data[off:off + n]

"""The undo log of the Numba core: the original contents of every SRAM byte a PE writes, so
that a run can be put back and replayed in strict order (core.py explains when).

Each PE's written span only grows, and what a write adds to it is logged once, before it is
written: at most the bytes written, appended in order, which costs far less than keeping a
mirror of the whole SRAM (whose scattered lines miss the cache on every first write).
A tile product computed on the helper thread (core_jobs) has its entries made at issue and
their data copied by its job (note_write_later, copy_entries).
"""

from numba import njit

from emulator.core_fabric import need
from emulator.core_state import (K_UNDO_N, K_UNDO_TOP, MP_UNDO, NEED_UNDO, P_HULL_HI, P_HULL_LO,
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


@njit(cache=True, inline="always")
def _reserve(a, b, undo, counters):
    """A log entry for SRAM uint16 words [a, b), its data to be copied (copy_entries)."""
    if a >= b:
        return
    n, top = counters[K_UNDO_N], counters[K_UNDO_TOP]
    undo[n, U_START] = a
    undo[n, U_LEN] = b - a
    undo[n, U_OFF] = top
    counters[K_UNDO_N] = n + 1
    counters[K_UNDO_TOP] = top + b - a


@njit(cache=True)
def copy_entries(first, end, sram_u16, undo, undo_data):
    """Copy the SRAM words of log entries first .. end - 1 into the log's data."""
    for e in range(first, end):
        a, n, top = undo[e, U_START], undo[e, U_LEN], undo[e, U_OFF]
        src, dst = sram_u16[a:a + n], undo_data[top:top + n]
        for i in range(n):  # an element loop over slices: vector copies (slice assignment
            dst[i] = src[i]  # compiles to a generic strided loop, a 16-bit word at a time)


@njit(cache=True)
def _widen_hull(p, lo, hi, pe, undo, counters):
    """Log entries for what bytes [lo, hi) add to PE p's written hull; widen it."""
    base = pe[p, P_SRAM0] // 2
    h_lo, h_hi = pe[p, P_HULL_LO], pe[p, P_HULL_HI]
    if h_lo == h_hi:  # empty
        h_lo = h_hi = lo
    _reserve(base + lo // 2, base + h_lo // 2, undo, counters)
    _reserve(base + h_hi // 2, base + hi // 2, undo, counters)
    pe[p, P_HULL_LO] = min(h_lo, lo)
    pe[p, P_HULL_HI] = max(h_hi, hi)


@njit(cache=True, inline="always")
def _covered(p, lo, hi, pe, mp):
    return mp[MP_UNDO] == 0 or lo >= hi or (
        pe[p, P_HULL_LO] < pe[p, P_HULL_HI] and pe[p, P_HULL_LO] <= lo and
        hi <= pe[p, P_HULL_HI])


@njit(cache=True, inline="always")
def note_write(p, lo, hi, pe, sram_u16, undo, undo_data, counters, mp):
    """PE p is about to write bytes [lo, hi) of its SRAM (writes are 2-byte aligned); the
    caller has checked undo_fits."""
    if _covered(p, lo, hi, pe, mp):
        return
    first = counters[K_UNDO_N]
    _widen_hull(p, lo, hi, pe, undo, counters)
    copy_entries(first, counters[K_UNDO_N], sram_u16, undo, undo_data)


@njit(cache=True, inline="always")
def note_write_later(p, lo, hi, pe, undo, counters, mp):
    """As note_write, but only the log's entries are made: (first entry, how many), whose data
    whoever writes [lo, hi) copies first (copy_entries; a helper thread's product). Nothing
    else writes those bytes before it: only PE p writes its SRAM, after its product."""
    first = counters[K_UNDO_N]
    if _covered(p, lo, hi, pe, mp):
        return first, 0
    _widen_hull(p, lo, hi, pe, undo, counters)
    return first, counters[K_UNDO_N] - first


@njit(cache=True)
def restore_sram(sram_u16, undo, undo_data, counters):
    """Put back the original contents of everything the run wrote."""
    for i in range(counters[K_UNDO_N]):
        a, n, off = undo[i, U_START], undo[i, U_LEN], undo[i, U_OFF]
        sram_u16[a:a + n] = undo_data[off:off + n]

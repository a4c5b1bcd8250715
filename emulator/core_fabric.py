"""The fabric of the Numba core: the scheduler's heap, input queues, messages and link
reservations (docs/timing-model.md sections 5 to 7).

A message's payload (uint32 wavelets) lives once in a shared pool, however many PEs a multicast
reaches; each destination gets a delivery record (head and tail arrival, wavelets consumed)
appended to its (PE, color) queue, a singly linked list in delivery order. Records come from
free lists (else from never-used rows), payloads from a bump allocator that is compacted in
place when it reaches the end; when a pool is really full the loop asks the driver to enlarge
it (core_state.State.grow) and retries, so the hot path never allocates.
"""

import numpy as np
from numba import njit

from wse_emu.emulator.core_state import (
    DL_BP, DL_CONSUMED, DL_HEAD, DL_LEN, DL_MSG, DL_NEXT, DL_TAIL, E_DEST, E_LINK, E_PARENT,
    E_PIPE0,
    K_DL_HEAD, K_DL_NFREE, K_DL_USED, K_HOPS, K_MESSAGES, K_MSG_HEAD, K_MSG_NFREE, K_MSG_USED,
    K_NEED, K_NEED_AMOUNT, K_POOL_TOP, K_QUEUED, K_WAVELETS, L_FREE, L_WAVELETS, MP_COLORS,
    MP_HOP, MP_PIPE_BASE, MP_PIPE_LAT, MP_PIPE_TPW, MP_QDEPTH, MP_RAMP, MP_TIMING,
    M_BP_PENDING, M_BP_RELEASE, M_LEN, M_NEXT, M_OFF,
    M_REFS, M_SENDER, NEED_POOL, NEED_RECORDS, P_BPSTALL, P_CLOCK, P_STATUS, P_WAIT, Q_FIRST,
    Q_LAST, Q_QUEUED, T_COUNT, T_NDEST, T_START, X_GROW)
from wse_emu.emulator.result import PIPE_TICKS, ST_RUN, ST_WAIT_BP, ST_WAIT_RECV
from wse_emu.emulator.load import PIPE_COPY, PIPE_RELAY
from wse_emu.kernels.access import f32_to_wavelets, wavelets_to_f32
from wse_emu.kernels.prefetch import prefetch

# ---------------------------------------------------------------------------------------------
# The scheduler's min-heap of runnable PEs: int64 keys clock << pe_bits | PE, all distinct.

HEAP_PREFETCH_MIN = 1 << 15  # keys (256 KB): smaller heaps stay in the core's own caches


@njit(cache=True, inline="always")
def heap_push(heap, size, key):
    """Insert a key; returns the new size."""
    i = size
    while i > 0:
        up = (i - 1) >> 2
        if heap[up] < key:
            break
        heap[i] = heap[up]
        i = up
    heap[i] = key
    return size + 1


@njit(cache=True, inline="always")
def heap_replace_top(heap, size, key):
    """Replace the root by `key` and restore the heap (sift down). The heap is 4-ary: half the
    depth of a binary one, and a node's children share a cache line."""
    i = 0
    while True:
        first = 4 * i + 1
        best = first
        # the next level's candidates, the children of these four (16 keys), load while
        # these are compared: on a large mesh the lower levels are not in the near caches
        # (a smaller heap is, and there the hints only cost)
        below = 4 * first + 1
        if size > HEAP_PREFETCH_MIN and below < size:
            prefetch(heap, below)
            prefetch(heap, min(below + 15, size - 1))
        if first + 3 < size:
            # all four children: the smallest by selects (no loop, no data-dependent branch,
            # which mispredicted on every other compare); the first of equals, as below
            lo = heap[first]
            v = heap[first + 1]
            if v < lo:
                best, lo = first + 1, v
            v = heap[first + 2]
            if v < lo:
                best, lo = first + 2, v
            v = heap[first + 3]
            if v < lo:
                best, lo = first + 3, v
        elif first < size:
            lo = heap[first]
            for child in range(first + 1, size):
                if heap[child] < lo:
                    best, lo = child, heap[child]
        else:
            break
        if lo > key:
            break
        heap[i] = lo
        i = best
    heap[i] = key


@njit(cache=True, inline="always")
def heap_pop_top(heap, size):
    """Remove the root; returns the new size."""
    size -= 1
    if size > 0:
        heap_replace_top(heap, size, heap[size])
    return size


@njit(cache=True, inline="always")
def still_first(heap, size, key):
    """Whether `key`, standing in for the root, is still before every other key."""
    for child in range(1, min(5, size)):
        if heap[child] < key:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Input queues.


@njit(cache=True, inline="always")
def _arrival(dl, d, j):
    """Arrival cycle of wavelet j of delivery d: linear between head and tail."""
    n = dl[d, DL_LEN]
    if n == 1:
        return dl[d, DL_HEAD]
    return dl[d, DL_HEAD] + (j * (dl[d, DL_TAIL] - dl[d, DL_HEAD])) // (n - 1)


@njit(cache=True, inline="always")
def queue_arrival(queue, dl, slot, i):
    """Arrival cycle of the i-th unconsumed wavelet of a queue (i < queued)."""
    d = queue[slot, Q_FIRST]
    while True:
        left = dl[d, DL_LEN] - dl[d, DL_CONSUMED]
        if i < left:
            return _arrival(dl, d, dl[d, DL_CONSUMED] + i)
        i -= left
        d = dl[d, DL_NEXT]


@njit(cache=True, inline="always")
def queue_read(queue, dl, msg, payload, slot, k, dtype, out):
    """out[0:k] = the next k queued wavelets as fp32, decoded as `dtype` (the receiver's)."""
    d = queue[slot, Q_FIRST]
    got = 0
    while got < k:
        take = min(k - got, dl[d, DL_LEN] - dl[d, DL_CONSUMED])
        off = msg[dl[d, DL_MSG], M_OFF] + dl[d, DL_CONSUMED]
        wavelets_to_f32(payload, off, take, dtype, out[got:])
        got += take
        d = dl[d, DL_NEXT]


@njit(cache=True)
def _release(msg, m, when, pe, qdepth, wake, nwake):
    """A backpressured delivery of message m was consumed at `when`; after the last one the
    sender resumes, the last `qdepth` wavelets having waited in the queue, not in the sender."""
    if when > msg[m, M_BP_RELEASE]:
        msg[m, M_BP_RELEASE] = when
    msg[m, M_BP_PENDING] -= 1
    if msg[m, M_BP_PENDING] == 0:
        s = msg[m, M_SENDER]
        resume = max(pe[s, P_CLOCK], msg[m, M_BP_RELEASE] - qdepth)
        pe[s, P_BPSTALL] += resume - pe[s, P_CLOCK]
        pe[s, P_CLOCK] = resume
        pe[s, P_STATUS] = ST_RUN
        pe[s, P_WAIT] = -1
        wake[nwake] = s
        nwake += 1
    return nwake


@njit(cache=True, inline="always")
def queue_consume(queue, dl, msg, counters, slot, k, when, pe, qdepth, wake, nwake):
    """Consume k wavelets of a queue at cycle `when`, freeing finished deliveries and messages
    and releasing backpressured senders; returns the new number of PEs to wake."""
    queue[slot, Q_QUEUED] -= k
    counters[K_QUEUED] -= k
    while k > 0:
        d = queue[slot, Q_FIRST]
        take = min(k, dl[d, DL_LEN] - dl[d, DL_CONSUMED])
        dl[d, DL_CONSUMED] += take
        k -= take
        if dl[d, DL_CONSUMED] < dl[d, DL_LEN]:
            break
        queue[slot, Q_FIRST] = dl[d, DL_NEXT]
        m = dl[d, DL_MSG]
        if dl[d, DL_BP]:
            nwake = _release(msg, m, when, pe, qdepth, wake, nwake)
        dl[d, DL_NEXT] = counters[K_DL_HEAD]
        counters[K_DL_HEAD] = d
        counters[K_DL_NFREE] += 1
        msg[m, M_REFS] -= 1
        if msg[m, M_REFS] == 0:
            msg[m, M_NEXT] = counters[K_MSG_HEAD]
            counters[K_MSG_HEAD] = m
            counters[K_MSG_NFREE] += 1
    return nwake


# ---------------------------------------------------------------------------------------------
# Sending.


@njit(cache=True)
def need(counters, kind, amount):
    """Ask the driver to grow something; the instruction is retried after it has."""
    counters[K_NEED] = kind
    counters[K_NEED_AMOUNT] = amount
    return X_GROW


@njit(cache=True, inline="always")
def send_fits(slot, k, tree_of, dl, msg, payload, counters):
    """Whether a message of k wavelets on this (PE, color) tree fits the pools (compacting the
    payload pool if need be); if not, the request for the driver is left in the counters."""
    ndest = tree_of[slot, T_NDEST]
    if counters[K_MSG_NFREE] + msg.shape[0] - counters[K_MSG_USED] < 1 or \
            counters[K_DL_NFREE] + dl.shape[0] - counters[K_DL_USED] < ndest:
        need(counters, NEED_RECORDS, ndest)
        return False
    if counters[K_POOL_TOP] + k > payload.shape[0]:
        compact_pool(msg, payload, counters)
        # enlarge unless that freed at least half, so compaction stays rare
        if 2 * (counters[K_POOL_TOP] + k) > payload.shape[0]:
            need(counters, NEED_POOL, 2 * (counters[K_POOL_TOP] + k))
            return False
    return True


@njit(cache=True, inline="always")
def _take(table, next_col, counters, head, nfree, used):
    """A record from the free list, else a fresh one."""
    r = counters[head]
    if counters[nfree] > 0:
        counters[head] = table[r, next_col]
        counters[nfree] -= 1
        return r
    r = counters[used]
    counters[used] += 1
    return r


@njit(cache=True)
def cross_pipe(link, row, s_h, s_t, k, mp):
    """A message of k wavelets whose head and tail pass the fabric link into a system pipe
    at cycles s_h and s_t crosses the pipe (link row `row`, free time in ticks): it starts when
    its head is there and the pipe is free, occupies the pipe k * ticks-per-wavelet, and
    leaves link_latency later. Returns the cycles its head and tail leave the pipe
    (docs/timing-model.md, "Systems: links between chips")."""
    p_start = max(s_h * PIPE_TICKS, link[row, L_FREE])
    p_end = p_start + k * mp[MP_PIPE_TPW]
    link[row, L_FREE] = p_end
    link[row, L_WAVELETS] += k
    c_h = (p_start + PIPE_TICKS - 1) // PIPE_TICKS
    c_t = max(s_t, max(c_h, (p_end + PIPE_TICKS - 1) // PIPE_TICKS - 1))
    return c_h + mp[MP_PIPE_LAT], c_t + mp[MP_PIPE_LAT]


@njit(cache=True, inline="always")
def send(p, color, dtype, vals, k, start, end, mp, sched, fab, nwake):
    """Send k wavelets from PE p on `color`, produced between cycles start and end: reserve
    every link of the route tree (one injection for a multicast), deliver to every RAMP leaf,
    and block p on backpressure if a queue overflows. Returns the new number of PEs to wake.
    Timing-only mode: the message has no payload (nothing reads one; the pool stays empty)."""
    pe, counters, wake = sched.pe, sched.counters, sched.wake
    tree_of, tree, tree_tmp, queue, link = fab.tree_of, fab.tree, fab.tree_tmp, fab.queue, fab.link
    dl, msg, payload = fab.dl, fab.msg, fab.payload
    colors = mp[MP_COLORS]
    ramp = mp[MP_RAMP]
    hop = mp[MP_HOP]
    qdepth = mp[MP_QDEPTH]
    m = _take(msg, M_NEXT, counters, K_MSG_HEAD, K_MSG_NFREE, K_MSG_USED)
    off = counters[K_POOL_TOP]
    if mp[MP_TIMING] == 0:
        counters[K_POOL_TOP] += k
        f32_to_wavelets(vals, k, dtype, payload, off)
    msg[m, M_OFF] = off
    msg[m, M_LEN] = k
    msg[m, M_SENDER] = p
    msg[m, M_BP_PENDING] = 0
    msg[m, M_BP_RELEASE] = 0
    msg[m, M_REFS] = 0
    counters[K_MESSAGES] += 1
    counters[K_WAVELETS] += k
    first = tree_of[p * colors + color, T_START]
    root_head = start + 1 + ramp
    root_tail = end + ramp
    for e in range(first, first + tree_of[p * colors + color, T_COUNT]):
        parent = tree[e, E_PARENT]
        if parent < 0:
            h, t = root_head, root_tail
        else:
            h, t = tree_tmp[parent - first, 0], tree_tmp[parent - first, 1]
        lk = tree[e, E_LINK]
        dest = tree[e, E_DEST]
        if dest == E_PIPE0 - PIPE_RELAY:  # the switch relays it: no link of the line of chips
            s_h, s_t = h, max(t, h + k - 1)
        else:
            s_h = max(h, link[lk, L_FREE])
            s_t = max(t, s_h + k - 1)
            link[lk, L_FREE] = s_t + 1
        link[lk, L_WAVELETS] += k
        counters[K_HOPS] += k
        if dest < 0:
            if dest <= E_PIPE0 and dest != E_PIPE0 - PIPE_RELAY:  # a system link: the chips'
                pipe = E_PIPE0 - dest  # pipe as well (through a switch, the sender's port)
                s_h, s_t = cross_pipe(link, mp[MP_PIPE_BASE] + pipe % PIPE_COPY, s_h, s_t,
                                      k * (1 + pipe // PIPE_COPY), mp)
            tree_tmp[e - first, 0] = s_h + hop
            tree_tmp[e - first, 1] = s_t + hop
            continue
        d = _take(dl, DL_NEXT, counters, K_DL_HEAD, K_DL_NFREE, K_DL_USED)
        dl[d, DL_MSG] = m
        dl[d, DL_HEAD] = s_h + ramp
        dl[d, DL_TAIL] = s_t + ramp
        dl[d, DL_CONSUMED] = 0
        dl[d, DL_NEXT] = -1
        dl[d, DL_LEN] = k
        dl[d, DL_BP] = 0
        msg[m, M_REFS] += 1
        slot = dest * colors + color
        if queue[slot, Q_QUEUED] > 0:
            dl[queue[slot, Q_LAST], DL_NEXT] = d
        else:
            queue[slot, Q_FIRST] = d
        queue[slot, Q_LAST] = d
        queue[slot, Q_QUEUED] += k
        counters[K_QUEUED] += k
        if queue[slot, Q_QUEUED] > qdepth:
            dl[d, DL_BP] = 1
            msg[m, M_BP_PENDING] += 1
        if pe[dest, P_STATUS] == ST_WAIT_RECV and pe[dest, P_WAIT] == color:
            pe[dest, P_STATUS] = ST_RUN
            pe[dest, P_WAIT] = -1
            wake[nwake] = dest
            nwake += 1
    if msg[m, M_BP_PENDING] > 0:
        pe[p, P_STATUS] = ST_WAIT_BP
        pe[p, P_WAIT] = color
    return nwake


@njit(cache=True)
def compact_pool(msg, payload, counters):
    """Move the payloads of live messages, in offset order, down to the front of the pool."""
    used = counters[K_MSG_USED]
    live = np.empty(used, dtype=np.int64)
    n = 0
    for m in range(used):
        if msg[m, M_REFS] > 0:
            live[n] = m
            n += 1
    offsets = np.empty(n, dtype=np.int64)
    for i in range(n):
        offsets[i] = msg[live[i], M_OFF]
    top = 0
    for i in np.argsort(offsets):
        m = live[i]
        off = msg[m, M_OFF]
        for j in range(msg[m, M_LEN]):  # ascending: safe although ranges may overlap
            payload[top + j] = payload[off + j]
        msg[m, M_OFF] = top
        top += msg[m, M_LEN]
    counters[K_POOL_TOP] = top

"""Line allreduces for the decode mapping: every line of a grid (its columns, its rows, or
segments of its rows) sums (or maxes) a block of fp32 values and ends with the result on every
PE of the line.

Form: two chains toward a root in the middle of the line (position m = (L - 1) // 2), then a
multicast back from the root. Each PE of a chain adds its block to the stream from its outer
neighbour and forwards it (a streaming op: it forwards as soon as the first wavelet is in), so
a line of L PEs costs about n + (L / 2) * (hop + 2 ramps + issue + setup) to reduce and
n + L / 2 hops to broadcast back: half of a chain to one end.

Colors (5 per line kind): two alternating colors for the chain from position 0 up to the root
(`lo`), two for the chain from position L - 1 down to it (`hi`), one for the broadcast. A PE
cannot receive and send one color, hence the alternation by position parity.

Code is SPMD: a region may span a whole grid; the PE's position along the line lives in a
register (computed once at the region's start), and each allreduce branches on it to one of
seven short variants (left end, left relay even/odd, root, right relay even/odd, right end).
The same structure as `isa.collectives` (chain form, root in the middle) but with run-time
dispatch on a position register, so that code size does not grow with the line length.
"""

from __future__ import annotations

from dataclasses import dataclass

ZR = "r15"  # always zero
SCRATCH = "r11"  # the dispatch's compare register


@dataclass(frozen=True)
class LineKind:
    """One kind of line of a grid: axis "column" (the PEs of a column, position = row),
    "row" (position = column), with segments of `length` PEs. `pos_reg` holds the position."""

    axis: str
    length: int
    colors: tuple  # (lo0, lo1, hi0, hi1, bcast)
    pos_reg: str
    flags: tuple = ()  # (root, left, end, odd) registers set by setup_flags, or () to compare

    @property
    def root(self) -> int:
        return (self.length - 1) // 2


def setup_flags(rb, line: LineKind) -> None:
    """Once at a region's start: the line's role flags from its position register, so that
    each allreduce dispatches with one branch a flag (root, left side, end, odd)."""
    if not line.flags or line.length == 1:
        return
    root, left, end, odd = line.flags
    rp, m, L = line.pos_reg, line.root, line.length
    rb.li(SCRATCH, m)
    rb.slt(left, rp, SCRATCH)
    rb.slt(root, SCRATCH, rp)  # right side, for now
    rb.add(root, root, left)
    rb.li(SCRATCH, 1)
    rb.sub(root, SCRATCH, root)  # neither side
    rb.slt(end, rp, SCRATCH)  # position 0
    rb.li(SCRATCH, L - 2)
    rb.slt(SCRATCH, SCRATCH, rp)  # position L - 1
    rb.add(end, end, SCRATCH)
    rb.andi(odd, rp, 1)


def allreduce(rb, labels, line: LineKind, buf, n: int, op: str = "add",
              broadcast: bool = True) -> None:
    """The line's allreduce of the n fp32 values at SRAM address buf, in place. With
    broadcast=False only the root (position line.root) ends with the result (a reduce)."""
    L = line.length
    if L == 1 or n == 0:
        return
    m = line.root
    lo, hi, bc = line.colors[0:2], line.colors[2:4], line.colors[4]
    vop = rb.vadd if op == "add" else rb.vmax
    rp = line.pos_reg
    left, root, done, recv = (labels("ar_left"), labels("ar_root"), labels("ar_done"),
                              labels("ar_recv"))
    rb.dmem("d13", "f32", buf, n)
    flags = line.flags
    if flags:
        rb.bne(flags[0], ZR, root)
        if m > 0:
            rb.bne(flags[1], ZR, left)
    else:
        rb.li(SCRATCH, m)
        if m > 0:
            rb.blt(rp, SCRATCH, left)
        rb.beq(rp, SCRATCH, root)

    def relay(cin, cout):
        rb.dfin("d14", "f32", cin, n)
        rb.dfout("d15", "f32", cout, n)
        vop("d15", "d14", "d13")

    def end(cout):
        rb.dfout("d15", "f32", cout, n)
        rb.vmov("d15", "d13")

    def by_parity(even, odd):
        odd_l, joined = labels("ar_odd"), labels("ar_par")
        if flags:
            rb.bne(flags[3], ZR, odd_l)
        else:
            rb.andi(SCRATCH, rp, 1)
            rb.bne(SCRATCH, ZR, odd_l)
        even()
        rb.jmp(joined)
        rb.label(odd_l)
        odd()
        rb.label(joined)

    # the right side (m < q <= L - 1) sends toward the root: q sends on hi[q % 2]
    right_end = labels("ar_rend")
    if flags:
        rb.bne(flags[2], ZR, right_end)
    else:
        rb.li(SCRATCH, L - 1)
        rb.beq(rp, SCRATCH, right_end)
    by_parity(lambda: relay(hi[1], hi[0]), lambda: relay(hi[0], hi[1]))
    rb.jmp(recv)
    rb.label(right_end)
    end(hi[(L - 1) % 2])
    rb.jmp(recv)
    if m > 0:  # the left side (0 <= q < m): q sends on lo[q % 2]
        rb.label(left)
        left_end = labels("ar_lend")
        if flags:
            rb.bne(flags[2], ZR, left_end)
        else:
            rb.beq(rp, ZR, left_end)
        by_parity(lambda: relay(lo[1], lo[0]), lambda: relay(lo[0], lo[1]))
        rb.jmp(recv)
        rb.label(left_end)
        end(lo[0])
        rb.jmp(recv)
    rb.label(root)
    if m > 0:
        rb.dfin("d14", "f32", lo[(m - 1) % 2], n)
        vop("d13", "d14", "d13")
    rb.dfin("d14", "f32", hi[(m + 1) % 2], n)
    vop("d13", "d14", "d13")
    if broadcast:
        rb.dfout("d15", "f32", bc, n)
        rb.vmov("d15", "d13")
    rb.jmp(done)
    rb.label(recv)
    if broadcast:
        rb.dfin("d14", "f32", bc, n)
        rb.vmov("d13", "d14")
    rb.label(done)


def routes(add, line: LineKind, x0: int, y0: int, w: int, h: int, broadcast: bool = True):
    """Route rules of every line of kind `line` in the grid rectangle (x0, y0, w, h), through
    add(x, y, w, h, color, rx, tx). Row lines of segments shorter than the grid's width are
    segments side by side."""
    L, m = line.length, line.root
    lo, hi, bc = line.colors[0:2], line.colors[2:4], line.colors[4]
    if line.axis == "column":
        plus, minus = "S", "N"
        strips = [[(x0, y0 + q, w, 1)] for q in range(L)]
    else:
        plus, minus = "E", "W"
        strips = [[(x0 + k * L + q, y0, 1, h) for k in range(w // L)] for q in range(L)]
    if L == 1:
        return
    for q in range(L):
        rules = []
        if q < m:
            rules.append((lo[q % 2], "RAMP", plus))
        if 1 <= q <= m:
            rules.append((lo[(q - 1) % 2], minus, "RAMP"))
        if q > m:
            rules.append((hi[q % 2], "RAMP", minus))
        if m <= q < L - 1:
            rules.append((hi[(q + 1) % 2], plus, "RAMP"))
        if broadcast:
            if q == m:
                tx = "|".join(([minus] if m > 0 else []) + [plus])
                rules.append((bc, "RAMP", tx))
            elif q < m:
                rules.append((bc, plus, "RAMP" + (f"|{minus}" if q > 0 else "")))
            else:
                rules.append((bc, minus, "RAMP" + (f"|{plus}" if q < L - 1 else "")))
        for rect in strips[q]:
            for color, rx, tx in rules:
                add(*rect, color, rx, tx)


def cycles(machine, L: int, n: int, broadcast: bool = True) -> int:
    """Cycles of one allreduce on a line of L PEs with n-wavelet blocks, from the moment every
    PE starts it until the last PE has the result. Every relay has issued its op before the
    stream reaches it, so the stream's head advances by one injection, two ramps and a hop a
    PE (the issue overhead is hidden); the root adds the two streams one after the other
    (n cycles each: one wavelet a cycle), then floods the sum back over the longer side."""
    if L == 1 or n == 0:
        return 0
    hop, ramp, issue, sc = (machine.hop_latency, machine.ramp_latency, machine.issue_overhead,
                            machine.scalar_cycles)
    m = (L - 1) // 2
    side = max(m, L - 1 - m)
    t = 6 * sc + issue + side * (1 + 2 * ramp + hop) + n  # the far side's stream at the root
    t += sc + issue + n  # the root's second add
    if broadcast:
        t += 2 * sc + issue + 1 + 2 * ramp + side * hop + n + 2 * sc
    return t

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

Two-phase form (LineKind.group = G > 0): on each side, chains inside groups of G PEs toward
each group's root, then a chain over the group roots on colors the PEs between only pass
through; the same five colors read as (intra0, intra1, inter0, inter1, bcast). Each PE's role
(`role`) is computed once at the region's start (`setup_roles`) into a register, and every
allreduce branches on its bits. `cycles(..., group=G)` prices it; `best_group` picks G.

Shared routines (`Shared`): the ISA has no call or indirect jump, so where a region makes
several allreduces of one (line, op, broadcast) kind and one copy takes fewer instructions
than the copies inline (`pays`), the region holds one routine for the kind after its halt. A
call points d13 at the block, sets SELECT (r1) to the site's index among the kind's calls and
LENGTH (r2) to the block length, and jumps; the routine (the same code, with a `dlen` from
LENGTH after every dfin and dfout) ends with a chain of `beq` on SELECT back to the sites.
SELECT and LENGTH are the regions' temporaries, which no caller keeps across an allreduce;
the routine touches no other register than the dispatch's (SCRATCH, the role or flag
registers, the position register). `call_cycles` prices a call.
"""

from __future__ import annotations

from dataclasses import dataclass

ZR = "r15"  # always zero
SCRATCH = "r11"  # the dispatch's compare register
# a shared routine's return selector and block length: the regions' temporaries, which no
# code keeps across an allreduce
SELECT, LENGTH = "r1", "r2"


@dataclass(frozen=True)
class LineKind:
    """One kind of line of a grid: axis "column" (the PEs of a column, position = row),
    "row" (position = column), with segments of `length` PEs. `pos_reg` holds the position."""

    axis: str
    length: int
    colors: tuple  # (lo0, lo1, hi0, hi1, bcast); two-phase: (intra0, intra1, inter0, inter1, bcast)
    pos_reg: str
    flags: tuple = ()  # (root, left, end, odd) registers set by setup_flags, or () to compare
    group: int = 0  # two-phase: PEs a group (0: the chain form)
    role_reg: str = ""  # two-phase: the register holding the PE's role (setup_roles)

    @property
    def root(self) -> int:
        return (self.length - 1) // 2


# ---------------------------------------------------------------------------------------------
# the two-phase form: on each side of the root, chains inside groups of G PEs toward the
# group's root (its PE nearest the line's root), then a chain over the group roots on colors
# the other PEs pass through (a hop a PE instead of a relay's two ramps and injection)

def side_of(line: LineKind, q: int) -> tuple[int, int, int]:
    """(distance t from the root, color offset: 0 left / 1 right, PEs on that side)."""
    m, L = line.root, line.length
    return (m - q, 0, m) if q < m else (q - m, 1, L - 1 - m)


def role(line: LineKind, q: int) -> int:
    """The role code of position q in a two-phase line: 0 the root; 1 + p an intra-group relay
    sending on intra color p; 3 + p a chain end sending on intra color p; a group root
    16 | has_intra | (intra color it receives) << 1 | has_inter << 2 | (inter color it sends)
    << 3 (it receives inter on the other)."""
    if q == line.root:
        return 0
    t, off, side = side_of(line, q)
    G = line.group
    j, u = (t - 1) // G, (t - 1) % G
    size = min(G, side - j * G)
    groups = -(-side // G)
    if u > 0:
        return (3 if u == size - 1 else 1) + (t + off) % 2
    return 16 | (size > 1) | ((t + 1 + off) % 2) << 1 | (j < groups - 1) << 2 | \
        ((j + off) % 2) << 3


def setup_roles(rb, line: LineKind, rect_of=None) -> None:
    """Once at a region's start: the PE's role (role()) into line.role_reg, computed from its
    position register by scalar code (no data word: a timing-only run then keeps no SRAM for
    the region). Temporaries r0, r1, r2, r9, r10, r11. rect_of: unused (the code is SPMD)."""
    if not line.group or line.length == 1:
        return
    q, R, m, L, G = line.pos_reg, line.role_reg, line.root, line.length, line.group
    tag = f"role_{line.axis}_{line.colors[0]}"
    right, done, groot, keep = (f"{tag}_right", f"{tag}_done", f"{tag}_groot", f"{tag}_keep")
    t, side, off, j, u, p = "r2", "r9", "r11", "r0", "r1", "r10"
    rb.li("r1", m)
    rb.sub(t, q, "r1")  # right of the root: t = q - m, offset 1
    rb.li(side, L - 1 - m)
    rb.li(off, 1)
    rb.bge(q, "r1", right)
    rb.sub(t, "r1", q)  # left: t = m - q, offset 0
    rb.li(side, m)
    rb.li(off, 0)
    rb.label(right)
    rb.li(R, 0)
    rb.beq(t, ZR, done)  # the root
    rb.addi(u, t, -1)
    rb.li(p, G)
    rb.div(j, u, p)  # group j = (t - 1) // G
    rb.rem(u, u, p)  # place in the group u = (t - 1) % G
    rb.add(p, t, off)
    rb.andi(p, p, 1)  # the intra color this PE sends on
    rb.beq(u, ZR, groot)
    rb.li(R, G)  # size - 1 = min(G, side - j G) - 1 into side
    rb.mul(R, j, R)
    rb.sub(side, side, R)
    rb.li(R, G)
    rb.blt(side, R, keep)
    rb.addi(side, R, 0)
    rb.label(keep)
    rb.addi(side, side, -1)
    rb.addi(R, p, 1)  # an intra relay: 1 + p
    rb.bne(u, side, done)
    rb.addi(R, p, 3)  # the chain's end: 3 + p
    rb.jmp(done)
    rb.label(groot)  # 16 | size > 1 | (1 - p) << 1 | has_inter << 2 | ((j + off) & 1) << 3
    rb.li(u, 1)
    rb.sub(u, u, p)
    rb.muli(u, u, 2)
    rb.addi(R, u, 16)
    rb.li(u, G)
    rb.mul(u, j, u)
    rb.sub(u, side, u)  # side - j G
    if G > 1:
        rb.li(p, 1)
        rb.slt(p, p, u)
        rb.add(R, R, p)
    rb.addi(u, side, -1)
    rb.li(p, G)
    rb.div(u, u, p)  # the last group's index
    rb.slt(u, j, u)
    rb.muli(u, u, 4)
    rb.add(R, R, u)
    rb.add(u, j, off)
    rb.andi(u, u, 1)
    rb.muli(u, u, 8)
    rb.add(R, R, u)
    rb.label(done)


def _fabric(rb, n):
    """dfin and dfout of n wavelets: n an int, or a register (a shared routine's block
    length, LENGTH) that `dlen` sets after each."""
    if isinstance(n, int):
        return (lambda d, c: rb.dfin(d, "f32", c, n)), (lambda d, c: rb.dfout(d, "f32", c, n))

    def fin(d, c):
        rb.dfin(d, "f32", c, 0)
        rb.dlen(d, n)

    def fout(d, c):
        rb.dfout(d, "f32", c, 0)
        rb.dlen(d, n)
    return fin, fout


def _links(rb, fin, fout, vop):
    """The two moves of a PE inside a line: relay(cin, cout) adds its block d13 to what
    arrives on cin and sends the sum on cout, as it arrives; send(cout) sends d13 (a line's
    end)."""
    def relay(cin, cout):
        fin("d14", cin)
        fout("d15", cout)
        vop("d15", "d14", "d13")

    def send(cout):
        fout("d15", cout)
        rb.vmov("d15", "d13")
    return relay, send


def _root_and_receive(rb, fin, fout, vop, ins: list, bc: int, broadcast: bool, root, recv,
                      done) -> None:
    """The tail both forms share. At label root: add the partial sums arriving on the colors
    `ins` into d13, then multicast the result on bc (a reduce, broadcast=False, keeps it). At
    label recv: every other PE takes the multicast into d13. Both end at label done."""
    rb.label(root)
    for color in ins:
        fin("d14", color)
        vop("d13", "d14", "d13")
    if broadcast:
        fout("d15", bc)
        rb.vmov("d15", "d13")
    rb.jmp(done)
    rb.label(recv)
    if broadcast:
        fin("d14", bc)
        rb.vmov("d13", "d14")
    rb.label(done)


def _two_phase(rb, labels, line: LineKind, n, vop, broadcast: bool) -> None:
    """The two-phase allreduce's code (role): d13 holds the block (n wavelets: an int, or the
    register that holds it)."""
    A, C, bc = line.colors[0:2], line.colors[2:4], line.colors[4]
    R, S = line.role_reg, SCRATCH
    groot, root, end, recv, done = (labels("tp_groot"), labels("tp_root"), labels("tp_end"),
                                    labels("tp_recv"), labels("tp_done"))
    fin, fout = _fabric(rb, n)
    relay, send = _links(rb, fin, fout, vop)

    def on_bit(bit, if_set, if_clear):
        other, joined = labels("tp_bit"), labels("tp_join")
        rb.andi(S, R, bit)
        rb.bne(S, ZR, other)
        if_clear()
        rb.jmp(joined)
        rb.label(other)
        if_set()
        rb.label(joined)

    rb.li(S, 16)
    rb.bge(R, S, groot)
    rb.beq(R, ZR, root)
    rb.li(S, 3)
    rb.bge(R, S, end)
    on_bit(2, lambda: relay(A[0], A[1]), lambda: relay(A[1], A[0]))  # role 1 or 2
    rb.jmp(recv)
    rb.label(end)  # role 3 or 4: bit 0 of role - 3
    rb.addi(S, R, -3)
    odd_end, joined = labels("tp_endodd"), labels("tp_endj")
    rb.bne(S, ZR, odd_end)
    send(A[0])
    rb.jmp(joined)
    rb.label(odd_end)
    send(A[1])
    rb.label(joined)
    rb.jmp(recv)
    rb.label(groot)

    def intra_in(color):
        fin("d14", color)
        vop("d13", "d14", "d13")
    no_intra = labels("tp_nointra")
    rb.andi(S, R, 1)
    rb.beq(S, ZR, no_intra)
    on_bit(2, lambda: intra_in(A[1]), lambda: intra_in(A[0]))
    rb.label(no_intra)
    on_bit(4, lambda: on_bit(8, lambda: relay(C[0], C[1]), lambda: relay(C[1], C[0])),
           lambda: on_bit(8, lambda: send(C[1]), lambda: send(C[0])))
    rb.jmp(recv)
    _root_and_receive(rb, fin, fout, vop, ([C[0]] if line.root > 0 else []) + [C[1]], bc,
                      broadcast, root, recv, done)


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
    if line.length == 1 or n == 0:
        return
    rb.dmem("d13", "f32", buf, n)
    _body(rb, labels, line, n, op, broadcast)


def _body(rb, labels, line: LineKind, n, op: str, broadcast: bool) -> None:
    """The allreduce of the block d13 holds: n wavelets, an int or (a shared routine) the
    register holding it."""
    L = line.length
    m = line.root
    lo, hi, bc = line.colors[0:2], line.colors[2:4], line.colors[4]
    vop = rb.vadd if op == "add" else rb.vmax
    rp = line.pos_reg
    if line.group:
        _two_phase(rb, labels, line, n, vop, broadcast)
        return
    left, root, done, recv = (labels("ar_left"), labels("ar_root"), labels("ar_done"),
                              labels("ar_recv"))
    fin, fout = _fabric(rb, n)
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

    relay, end = _links(rb, fin, fout, vop)

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
    _root_and_receive(rb, fin, fout, vop, ([lo[(m - 1) % 2]] if m > 0 else []) + [hi[(m + 1) % 2]],
                      bc, broadcast, root, recv, done)


# ---------------------------------------------------------------------------------------------
# shared routines: one copy of each (line, op, broadcast) allreduce in a region's code

class InstrCount:
    """A RegionBuilder stand-in that counts the instructions emitted."""

    def __init__(self):
        self.n = 0

    def label(self, name) -> None:
        pass

    def __getattr__(self, name):
        def emit(*a, **k):
            self.n += 1
        return emit


def body_size(line: LineKind, op: str, broadcast: bool, shared: bool) -> int:
    """Instructions of an allreduce's code after its dmem: inline, or the shared routine's
    (with a dlen after every dfin and dfout, without the return chain)."""
    rb = InstrCount()
    _body(rb, lambda stem: stem, line, LENGTH if shared else 1, op, broadcast)
    return rb.n


def pays(line: LineKind, op: str, broadcast: bool, sites: int) -> bool:
    """Whether one shared routine for `sites` call sites takes fewer instructions than the
    code inline at each: a call is the dmem, two li and a jmp, the routine adds its dlens and
    a return chain of 2 (sites - 1) instructions."""
    if sites < 2 or line.length == 1:
        return False
    inline = sites * (1 + body_size(line, op, broadcast, False))
    return sites * CALL + body_size(line, op, broadcast, True) + 2 * (sites - 1) < inline


CALL = 4  # a call's instructions: dmem d13, li SELECT, li LENGTH, jmp


def call_cycles(machine, line: LineKind, broadcast: bool, index: int, sites: int) -> int:
    """Cycles a call of a shared routine adds to the allreduce (call site `index` of
    `sites`): the call's two li and jmp, the dlens on the path the result waits for (the
    root's receives and its broadcast; in the two-phase form also the far end's send, which
    the chain form's longer dispatch hides) and the return chain to the site."""
    sc = machine.scalar_cycles
    back = 2 * index + 1 if index < sites - 1 else 2 * sites - 2
    waits = (2 if line.root > 0 else 1) + (1 if broadcast else 0) + (1 if line.group else 0)
    return sc * (3 + waits + back)


class Shared:
    """The shared allreduces of one region. `sites` maps (line, op, broadcast) to the call
    sites the region's code has (a dry run counts them); those where sharing pays (`pays`)
    become one routine each, emitted by `routines` after the region's halt, and every call
    site sets SELECT to its index, LENGTH to its block length and jumps there; the routine
    ends with a chain of beq on SELECT back to the sites. The others stay inline."""

    def __init__(self, sites: dict):
        self.sites = dict(sites)
        self.shared = {key for key, k in self.sites.items() if pays(*key, k)}
        self.returns: dict = {key: [] for key in self.shared}  # key -> return labels
        self.entry: dict = {}

    def allreduce(self, rb, labels, line: LineKind, buf, n: int, op: str = "add",
                  broadcast: bool = True) -> None:
        """allreduce(), as a call of the shared routine when its kind has one."""
        key = (line, op, broadcast)
        if key not in self.shared or line.length == 1 or n == 0:
            allreduce(rb, labels, line, buf, n, op, broadcast)
            return
        if key not in self.entry:
            self.entry[key] = labels(f"ar_{line.axis}_{op}")
        back = labels("ar_back")
        rb.dmem("d13", "f32", buf, n)
        rb.li(SELECT, len(self.returns[key]))
        rb.li(LENGTH, n)
        rb.jmp(self.entry[key])
        rb.label(back)
        self.returns[key].append(back)

    def routines(self, rb, labels) -> None:
        """The shared routines, each ending with its return chain (after the region's halt:
        only the calls reach them)."""
        for key, entry in self.entry.items():
            line, op, broadcast = key
            rb.label(entry)
            _body(rb, labels, line, LENGTH, op, broadcast)
            rets = self.returns[key]
            for k, back in enumerate(rets[:-1]):
                if k:
                    rb.addi(SELECT, SELECT, -1)
                rb.beq(SELECT, ZR, back)
            rb.jmp(rets[-1])


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
        if line.group:
            rules = _two_phase_rules(line, q, plus, minus)
            if broadcast:
                rules += _bcast_rule(line, q, plus, minus)
            for rect in strips[q]:
                for color, rx, tx in rules:
                    add(*rect, color, rx, tx)
            continue
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


def _bcast_rule(line: LineKind, q: int, plus: str, minus: str) -> list:
    m, L, bc = line.root, line.length, line.colors[4]
    if q == m:
        return [(bc, "RAMP", "|".join(([minus] if m > 0 else []) + [plus]))]
    if q < m:
        return [(bc, plus, "RAMP" + (f"|{minus}" if q > 0 else ""))]
    return [(bc, minus, "RAMP" + (f"|{plus}" if q < L - 1 else ""))]


def _two_phase_rules(line: LineKind, q: int, plus: str, minus: str) -> list:
    """Route rules (color, rx, tx) of position q of a two-phase line (role)."""
    A, C = line.colors[0:2], line.colors[2:4]
    m = line.root
    if q == m:
        return ([(C[0], minus, "RAMP")] if m > 0 else []) + [(C[1], plus, "RAMP")]
    t, off, side = side_of(line, q)
    toward, outward = (plus, minus) if q < m else (minus, plus)
    G = line.group
    j, u = (t - 1) // G, (t - 1) % G
    size = min(G, side - j * G)
    has_inter = j < -(-side // G) - 1
    rules = []
    if u > 0:  # sends its chain's stream toward the group root
        rules.append((A[(t + off) % 2], "RAMP", toward))
    if u < size - 1:  # receives the chain from further out
        rules.append((A[(t + 1 + off) % 2], outward, "RAMP"))
    if u == 0:
        rules.append((C[(j + off) % 2], "RAMP", toward))
        if has_inter:
            rules.append((C[(j + 1 + off) % 2], outward, "RAMP"))
    elif has_inter:  # the next group root's stream passes through
        rules.append((C[(j + 1 + off) % 2], outward, toward))
    return rules


def best_group(machine, L: int, n: int) -> int:
    """The group size G with the fewest cycles for a line of L PEs and n-wavelet blocks; 0
    when the chain form is faster."""
    best, form = cycles(machine, L, n), 0
    side = L - 1 - (L - 1) // 2
    for G in range(1, side + 1):
        c = cycles(machine, L, n, group=G)
        if c < best:
            best, form = c, G
    return form


def cycles(machine, L: int, n: int, broadcast: bool = True, group: int = 0) -> int:
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
    if group:
        return _two_phase_cycles(machine, side, n, broadcast, group)
    t = 6 * sc + issue + side * (1 + 2 * ramp + hop) + n  # the far side's stream at the root
    t += sc + issue + n  # the root's second add
    if broadcast:
        t += 2 * sc + issue + 1 + 2 * ramp + side * hop + n + 2 * sc
    return t


def _two_phase_cycles(machine, side: int, n: int, broadcast: bool, G: int) -> int:
    """The two-phase form (role): the farthest group's chain reaches its root after G - 1
    relays, which adds it (n cycles) and starts the chain over the group roots: a relay at
    every group root, a hop at every PE between; the root adds both sides' streams and floods
    the sum back over the longer side."""
    hop, ramp, issue, sc = (machine.hop_latency, machine.ramp_latency, machine.issue_overhead,
                            machine.scalar_cycles)
    J = -(-side // G)
    intra = (G - 1) * (1 + 2 * ramp + hop) + n if G > 1 else 0  # the group roots' sums
    t = 8 * sc + issue + intra
    # the chain over the group roots: its stream reaches the root after a relay a group and a
    # hop a PE; measured, it also waits about one block behind the group roots' own adds
    t += 8 * sc + issue + J * (1 + 2 * ramp) + ((J - 1) * G + 1) * hop + (2 if G > 1 else 1) * n
    t += sc + issue + n  # the root's second add
    if broadcast:
        t += 2 * sc + issue + 1 + 2 * ramp + side * hop + n + 2 * sc
    return t

"""What the host applications tell a person at a terminal while they wait: that Numba is
compiling (the first run of a kind takes up to a minute, later ones load the cache), and how far
a long command has come.

Nothing here prints unless asked to (`show`): the CLI shows these only on a terminal and never
under --json, so scripts and pipes see exactly the command's output.
"""

from __future__ import annotations

import contextlib
import sys
import time

NOTICE = ("wse-emu: note: Numba is compiling the emulator's machine code for this kind of run "
          "(up to a minute; cached for the next runs)")


@contextlib.contextmanager
def compile_notice(show: bool, write=None):
    """Within the block, the first time Numba starts compiling a function (not when it loads
    one from its cache), write NOTICE once: a person then knows why nothing moves."""
    if not show:
        yield
        return
    from numba.core import event

    write = write or (lambda line: (sys.stderr.write(line + "\n"), sys.stderr.flush()))
    told = [False]

    class Notice(event.Listener):
        def on_start(self, ev):
            if not told[0]:
                told[0] = True
                write(NOTICE)

        def on_end(self, ev):
            pass

    with event.install_listener("numba:compile", Notice()):
        yield


class Bar:
    """A one-line progress bar on stderr for a known number of steps (`show` False: silent)."""

    def __init__(self, total: int, what: str, show: bool, width: int = 24):
        self.total, self.what, self.show, self.width = max(total, 1), what, show, width
        self.t0 = time.perf_counter()
        self.done = 0
        self.drawn = False

    def step(self, done: int | None = None, detail: str = "") -> None:
        self.done = self.done + 1 if done is None else done
        if not self.show:
            return
        filled = self.width * min(self.done, self.total) // self.total
        line = (f"\r[{'#' * filled}{'-' * (self.width - filled)}] {self.done}/{self.total} "
                f"{self.what} {time.perf_counter() - self.t0:6.1f} s {detail}")
        sys.stderr.write(f"{line[:110]:<110}")
        sys.stderr.flush()
        self.drawn = True

    def clear(self) -> None:
        if self.drawn:
            sys.stderr.write("\r" + " " * 110 + "\r")
            sys.stderr.flush()
            self.drawn = False


class Reached:
    """The cycle a run's progress display shows: the highest the core has reported in this run.
    The core reports the loop's earliest clock, which steps back a little when a PE is woken
    behind it; a display should not. `run` tells runs apart (a new one starts again at 0)."""

    def __init__(self):
        self.run, self.cycles = None, 0

    def __call__(self, cycles: int, run: int = 0) -> int:
        if run != self.run:
            self.run, self.cycles = run, 0
        self.cycles = max(self.cycles, cycles)
        return self.cycles

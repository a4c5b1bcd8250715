"""Host time without Numba's compiling. The first run of a kind compiles the core's machine
code (a minute or more, cached for the next runs); that is not the emulator's speed, so runs
and `generate` report it apart (`compile_seconds`) from their `host_seconds`.

    with HostClock() as clock:
        ...                      # the work measured
    clock.host_seconds, clock.compile_seconds
"""

from __future__ import annotations

import time


class HostClock:
    """Elapsed host time of the block, less what Numba spent compiling in it (loading a
    cached function is not compiling: it stays in host_seconds)."""

    def __enter__(self) -> "HostClock":
        from numba.core import event  # here: the CLI imports this module to print, fast

        self._jit = event.TimingListener()  # counts the outermost compile of nested ones
        self._listening = event.install_listener("numba:compile", self._jit)
        self._listening.__enter__()
        self._t0 = time.perf_counter()
        self._t1 = None
        return self

    def __exit__(self, *exc) -> None:
        self._t1 = time.perf_counter()
        self._listening.__exit__(*exc)

    @property
    def compile_seconds(self) -> float:
        return self._jit.duration if self._jit.done else 0.0

    @property
    def host_seconds(self) -> float:
        end = time.perf_counter() if self._t1 is None else self._t1
        return max(end - self._t0 - self.compile_seconds, 0.0)


def host_text(host_seconds: float, compile_seconds: float, digits: int = 2,
              what: str = "") -> str:
    """The host time as the CLI prints it (`what` after the seconds), with Numba's compiling
    beside it when there was any (0.05 s or more)."""
    text = f"{host_seconds:.{digits}f} s{what}"
    if compile_seconds >= 0.05:
        text += (f" (and {compile_seconds:.1f} s compiling the emulator's machine code: the "
                 f"first run of this kind; cached for the next runs)")
    return text

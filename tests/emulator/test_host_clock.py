"""Host time is reported without Numba's compiling: the first run of a kind compiles the core's
machine code for a minute or more, which says nothing of the emulator's speed."""

import time

from numba import njit

from wse_emu.emulator.host_clock import HostClock, host_text


def test_compiling_is_counted_apart_from_the_host_time():
    @njit  # a fresh function, no cache: its first call compiles
    def plus_one(x):
        return x + 1

    t0 = time.perf_counter()
    with HostClock() as first:
        assert plus_one(1) == 2
        time.sleep(0.05)
    elapsed = time.perf_counter() - t0
    with HostClock() as second:
        assert plus_one(2) == 3
        time.sleep(0.05)
    assert first.compile_seconds > 0
    assert second.compile_seconds == 0
    assert 0.05 <= second.host_seconds < 0.05 + 1.0
    # the sleep is host time; the compiling is not
    assert 0.05 <= first.host_seconds <= elapsed - first.compile_seconds
    assert first.host_seconds + first.compile_seconds <= elapsed


def test_the_printed_host_time_names_the_compiling_only_when_there_was_some():
    assert host_text(1.5, 0.0) == "1.50 s"
    assert host_text(0.123456, 0.01, 3) == "0.123 s"
    text = host_text(0.06, 66.25, what=" for 12 tokens")
    assert text.startswith("0.06 s for 12 tokens (and 66.2 s compiling")
    assert "cached for the next runs" in text

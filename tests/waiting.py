"""Waiting in tests without depending on an idle machine.

A test waits for an event or a condition -- a line a process prints, a port
that accepts, a counter that moves, a process that exits -- never for a
fixed stretch of wall-clock time.  A wait for a process or a server has a limit, so a hang
fails instead of blocking the run, but the limit is only a safety net: it is
`deadline(seconds)`, the seconds given (at least five times what the wait
takes on an idle machine) times $LEVER_TEST_TIME_SCALE (default
DEFAULT_SCALE), so a loaded or slow machine (both cores busy, qemu, a
sanitizer build) can raise every limit at once.

Tests assert on behaviour, not on speed: how fast something runs is for the
benchmarks (bench/), and a bound on elapsed time appears in a test only
where it separates two behaviours by a wide margin (a timeout that fired
against one that did not), never as a measure of speed.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, TypeVar

DEFAULT_SCALE = 3.0

IGNORING_STOP_SIGNALS = [sys.executable, "-c",
                         "import os, signal, sys\n"
                         "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                         "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"]
"""A prefix that runs the rest of a Python command line with SIGINT and SIGTERM
ignored (kept across exec), as a background job of a script starts (issue 46)."""
T = TypeVar("T")


def time_scale() -> float:
    """$LEVER_TEST_TIME_SCALE (a number >= 1; default DEFAULT_SCALE)."""
    raw = os.environ.get("LEVER_TEST_TIME_SCALE", "")
    try:
        return max(1.0, float(raw)) if raw.strip() else DEFAULT_SCALE
    except ValueError:
        raise ValueError(f"LEVER_TEST_TIME_SCALE must be a number, got {raw!r}") from None


def deadline(seconds: float) -> float:
    """The safety-net limit, in seconds, of a wait that takes well under `seconds` when idle."""
    return seconds * time_scale()


def wait_until(condition: Callable[[], T], seconds: float, what: str, interval: float = 0.01) -> T:
    """The first true value of `condition()`, polled every `interval` s; an
    AssertionError naming `what` after `deadline(seconds)`."""
    limit = deadline(seconds)
    stop = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > stop:
            raise AssertionError(f"{what}: not within {limit:g} s")
        time.sleep(interval)


def read_line(stream, seconds: float, what: str, process: subprocess.Popen | None = None) -> str:
    """The next line of a process's pipe (`stream`, as its own readline gives
    it): waits for the line, not for the clock; an AssertionError naming
    `what` after `deadline(seconds)`, or as soon as `process` has ended
    without printing it."""
    box: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: box.put(stream.readline()), daemon=True).start()
    limit = deadline(seconds)
    stop = time.monotonic() + limit
    while True:
        try:
            return box.get(timeout=max(0.0, min(stop - time.monotonic(), 0.5)))
        except queue.Empty:
            pass
        if process is not None and process.poll() is not None:
            try:
                return box.get(timeout=deadline(5))     # what it printed before exiting
            except queue.Empty:
                raise AssertionError(f"{what}: the process ended (exit {process.returncode}) "
                                     f"without a line") from None
        if time.monotonic() > stop:
            raise AssertionError(f"{what}: no line within {limit:g} s")


def wait_exit(process: subprocess.Popen, seconds: float, what: str = "the process") -> int:
    """`process`'s exit status, once it has exited; an AssertionError after `deadline(seconds)`."""
    try:
        return process.wait(timeout=deadline(seconds))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} did not exit within {deadline(seconds):g} s") from None


def accepts(host: str, port: int) -> bool:
    """True when a TCP connection to host:port is accepted now."""
    try:
        socket.create_connection((host, port), timeout=deadline(5)).close()
        return True
    except OSError:
        return False

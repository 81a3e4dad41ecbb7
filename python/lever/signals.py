"""Stopping Lever's commands with SIGINT (Ctrl-C) and SIGTERM, whatever
signal dispositions the process inherited.

A job that a non-interactive shell starts in the background (`cmd &` in a
script) starts with SIGINT and SIGQUIT ignored, and Python then installs no
KeyboardInterrupt handler: such a process would ignore Ctrl-C's signal for
good, and a parent may have ignored or blocked SIGTERM too.  `lever`
therefore installs its own handlers (`stop_handlers`): both signals raise
`Stopped`, a KeyboardInterrupt that carries the signal, so a long command
ends as Ctrl-C ends it, with exit status 128 + the signal's number.  While
a server serves, an event loop's handlers (`StopSignals`) replace these and
start the one bounded drain (lever.http.shutdown); `wait_for_stop_signal`
waits for one the same way (`python -m lever.remote.netem`).

The event loop's handlers wake the loop through a file descriptor, which
works whichever thread the kernel delivers the signal to: a thread started
by a library at import (a BLAS pool) may take a process-directed signal,
and blocking the signals plus sigwait() then loses it when the process
inherited it ignored.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """Raised by the handlers of `stop_handlers` for the signal `signum`."""

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum


def signal_name(signum: int) -> str:
    """"SIGINT" for signal.SIGINT (or its number)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The exit status of a command ended by `interrupt`: 128 + its signal (130 for a plain Ctrl-C)."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


def unblock_stop_signals() -> None:
    """Unblock SIGINT and SIGTERM in the calling thread (a parent may have blocked them)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _raise_stopped(signum: int, frame) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def stop_handlers():
    """Within the block, SIGINT and SIGTERM raise `Stopped` (and are unblocked),
    whatever was inherited; the previous handlers are put back after it.
    Off the main thread (where Python cannot set handlers) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in STOP_SIGNALS}
    unblock_stop_signals()
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


class StopSignals:
    """SIGINT and SIGTERM as an event loop sees them: the first one sets
    `first` (and `name`), any later one `again`.  Installed on `loop` (in the
    main thread) at construction, the previous handlers kept for `remove`;
    `installed` is False where the loop cannot have signal handlers (another
    thread, no POSIX signals)."""

    def __init__(self, loop):
        import asyncio
        self.loop = loop
        self.first, self.again = asyncio.Event(), asyncio.Event()
        self.name: str | None = None
        self.previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        try:
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self._received, sig)
        except (ValueError, RuntimeError, NotImplementedError):
            self.installed = False
        else:
            self.installed = True
            unblock_stop_signals()

    def _received(self, signum: int) -> None:
        if self.name is None:
            self.name = signal_name(signum)
            self.first.set()
        else:
            self.again.set()

    def remove(self) -> None:
        """Give SIGINT and SIGTERM back to the handlers they had before the loop's."""
        if self.installed:
            for sig, handler in self.previous.items():
                self.loop.remove_signal_handler(sig)
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def wait_for_stop_signal() -> str:
    """Block the main thread until SIGINT or SIGTERM comes; returns its name.
    Where an event loop cannot handle signals, waits for KeyboardInterrupt."""
    import asyncio

    async def wait() -> str | None:
        signals = StopSignals(asyncio.get_running_loop())
        if not signals.installed:
            return None
        try:
            await signals.first.wait()
        finally:
            signals.remove()
        return signals.name

    name = asyncio.run(wait())
    if name is not None:
        return name
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt as e:
        return str(e) or "SIGINT"

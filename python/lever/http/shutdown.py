"""Stopping Lever's aiohttp servers (`lever serve`, `lever serve-verifier`):
SIGINT and SIGTERM start one bounded drain, whatever dispositions the
process inherited (the handlers are the event loop's, installed explicitly).

The drain (`drain`):

1. the listening socket closes and every new request gets a 503
   (`shutting_down`, the connection closed after it); the guard's
   `draining` is set;
2. the requests that run (a streamed completion included) get up to
   `drain_s` seconds (`--drain-seconds`) to finish;
3. those still running then -- or at once on a second signal -- are
   cancelled (`cancel_work`: `lever serve` stops its generations, whose
   streams end with an error chunk and `data: [DONE]`) and get
   FINAL_GRACE_S seconds more to send that last answer;
4. the runner's cleanup closes what is left: aiohttp waits for a handler
   still running up to its shutdown timeout (FINAL_GRACE_S), cancels it,
   and waits for that up to FINAL_GRACE_S again.

So the process exits at most about drain_s + 3 * FINAL_GRACE_S seconds
after the first signal, plus, for `lever serve-verifier`, the end of a
target pass running on its compute thread (one pass, not interrupted).
Each step is logged on one line.
"""

from __future__ import annotations

import asyncio

from ..signals import StopSignals

DEFAULT_DRAIN_S = 10.0      # seconds running requests get to finish after SIGINT or SIGTERM
FINAL_GRACE_S = 1.0         # seconds cancelled requests get to send their last answer
POLL_S = 0.05               # seconds between looks at the running requests


async def wait_idle(guard, seconds: float, interrupt: asyncio.Event | None = None) -> bool:
    """True once no request handler runs (`guard.busy()` is 0); False after
    `seconds` seconds, or as soon as `interrupt` is set, with some running."""
    loop = asyncio.get_running_loop()
    stop = loop.time() + seconds
    while guard.busy():
        if loop.time() >= stop or (interrupt is not None and interrupt.is_set()):
            return False
        await asyncio.sleep(POLL_S)
    return True


async def drain(runner, guard, signals: StopSignals, drain_s: float, cancel_work, log) -> None:
    """The drain after the first stop signal (steps 1 to 3 of the module doc)."""
    guard.draining = True
    for site in list(runner.sites):
        await site.stop()
    running = guard.busy()
    log(f"{signals.name}: shutting down: new requests get 503; {running} running request(s) get up to "
        f"{drain_s:g} s to finish (--drain-seconds; a second signal cancels them now)")
    if await wait_idle(guard, drain_s, signals.again):
        log(f"stopped ({'every running request finished' if running else 'no request was running'})")
        return
    why = "a second signal" if signals.again.is_set() else f"{drain_s:g} s passed"
    log(f"{why}: cancelling {guard.busy()} running request(s)")
    cancel_work()
    finished = await wait_idle(guard, FINAL_GRACE_S)
    log("stopped" + ("" if finished else f" ({guard.busy()} request(s) closed without a last answer)"))


def serve_until_stopped(start_site, guard, cancel_work, log, drain_s: float = DEFAULT_DRAIN_S,
                        on_ready=None) -> None:
    """Run `start_site()` (a coroutine function returning (runner, bound
    port)) until SIGINT or SIGTERM, then drain (`drain`) and clean up.
    guard: the site's ConnectionGuard; cancel_work(): stops the running
    requests at the drain's end; log(line): the server's log;
    on_ready(port): called once it listens."""
    async def main() -> None:
        runner, bound = await start_site()
        signals = StopSignals(asyncio.get_running_loop())
        try:
            if on_ready is not None:
                on_ready(bound)
            await signals.first.wait()
            await drain(runner, guard, signals, drain_s, cancel_work, log)
        finally:
            await runner.cleanup()
            signals.remove()

    asyncio.run(main())


__all__ = ["DEFAULT_DRAIN_S", "FINAL_GRACE_S", "drain", "serve_until_stopped"]

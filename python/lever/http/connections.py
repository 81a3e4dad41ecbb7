"""Connection-level limits of Lever's aiohttp servers (`lever serve-verifier`,
`lever serve`), below aiohttp.

aiohttp starts a request handler only once a request's headers are parsed
and has no deadline for receiving them, so a client that opens connections
and sends its headers a byte at a time would hold them (and their memory)
for as long as it likes.  `ConnectionGuard` wraps aiohttp's protocol
factory and:

- closes a connection whose request headers are not complete
  `header_timeout_s` seconds after the request's first byte (or after the
  connection opened, for one that sends nothing);
- refuses a connection beyond `max_connections` open ones, or beyond
  `max_per_ip` from one address, with a 503 and a close.

Idle keep-alive connections between requests are aiohttp's keep-alive
timeout's business; the body deadline is the request handler's
(lever.remote.server, lever.serve.app), which then tells the guard whether
the body was read (`body_read`).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

IDLE, HEADERS, REQUEST = "idle", "headers", "request"

BUSY_BODY = json.dumps({"v": 1, "error": {"code": "too_many_connections",
                                          "message": "this server holds its limit of open connections; retry later"}},
                       separators=(",", ":")).encode()
"""The JSON body of the 503 below: the edge-cloud protocol's error body
(lever.remote.protocol, version 1), which `lever serve` sends too
(tests/remote/test_server_hardening.py checks that the two agree)."""


def busy_response() -> bytes:
    """The raw 503 sent to a connection over the limits, before closing it."""
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Retry-After: 1\r\nContent-Length: " + str(len(BUSY_BODY)).encode() + b"\r\n\r\n" + BUSY_BODY)


class ConnectionGuard:
    """The protocol factory handed to `loop.create_server`: wraps each protocol
    that `factory` makes in a `GuardedProtocol`.

    header_timeout_s: seconds; max_connections / max_per_ip: connection counts;
    on_refused() and on_timeout() are called (on the event loop) for each
    connection refused at the limits or cut off for slow headers."""

    def __init__(self, factory, header_timeout_s: float, max_connections: int, max_per_ip: int,
                 on_refused=lambda: None, on_timeout=lambda: None):
        self.factory = factory
        self.header_timeout_s = header_timeout_s
        self.max_connections, self.max_per_ip = max_connections, max_per_ip
        self.on_refused, self.on_timeout = on_refused, on_timeout
        self.open: dict[object, GuardedProtocol] = {}      # transport -> its guard
        self.per_ip: Counter = Counter()

    def __call__(self) -> "GuardedProtocol":
        return GuardedProtocol(self, self.factory())

    def watch(self, transport) -> "GuardedProtocol | None":
        """The guard of the connection on `transport` (None if not one of ours)."""
        return self.open.get(transport)

    def admit(self, ip: str) -> bool:
        return len(self.open) < self.max_connections and self.per_ip[ip] < self.max_per_ip


class GuardedProtocol(asyncio.Protocol):
    """One connection: the inner (aiohttp) protocol plus a header deadline.

    States: HEADERS (bytes of a request arrived, or the connection is new, and
    its headers are not parsed yet; a timer runs), REQUEST (the handler runs:
    no timer), IDLE (between requests)."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self.guard, self.inner = guard, inner
        self.transport = None
        self.ip = ""
        self.refused = False
        self.state = IDLE
        self.body_done = True
        self.next_started: float | None = None     # loop time the next request's first byte came, mid-request
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol, forwarded to the inner protocol ------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.ip = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if not self.guard.admit(self.ip):
            self.refused = True
            self.guard.on_refused()
            transport.write(busy_response())
            transport.close()
            return
        self.guard.open[transport] = self
        self.guard.per_ip[self.ip] += 1
        self._arm(self.guard.header_timeout_s)
        self.state = HEADERS
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.state == IDLE:
            self.state = HEADERS
            self._arm(self.guard.header_timeout_s)
        elif self.state == REQUEST and self.body_done and self.next_started is None:
            self.next_started = asyncio.get_running_loop().time()     # a pipelined next request
        self.inner.data_received(data)

    def eof_received(self):
        return None if self.refused else self.inner.eof_received()

    def connection_lost(self, exc) -> None:
        self._cancel()
        if self.refused:
            return
        if self.guard.open.pop(self.transport, None) is not None:
            self.guard.per_ip[self.ip] -= 1
            if self.guard.per_ip[self.ip] <= 0:
                del self.guard.per_ip[self.ip]
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self.refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.inner.resume_writing()

    # -- told by the request handler ------------------------------------------------------

    def request_started(self, has_body: bool) -> None:
        """The headers of a request are parsed: its handler runs."""
        self._cancel()
        self.state, self.body_done, self.next_started = REQUEST, not has_body, None

    def body_read(self) -> None:
        self.body_done = True

    def request_finished(self) -> None:
        """The handler is done; bytes of a next request that came meanwhile start its header deadline."""
        self.state = IDLE
        if self.next_started is not None:
            spent = asyncio.get_running_loop().time() - self.next_started
            self.state, self.next_started = HEADERS, None
            self._arm(max(0.0, self.guard.header_timeout_s - spent))

    # -- the deadline ---------------------------------------------------------------------

    def _arm(self, seconds: float) -> None:
        self._cancel()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.state == HEADERS and self.transport is not None and not self.transport.is_closing():
            self.guard.on_timeout()
            self.transport.abort()          # not close(): a TLS close would wait for the slow peer

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
- holds at most `max_connections` open connections, at most `max_per_ip`
  from one address.  A connection beyond them is screened: its request line
  is read (under the same header deadline) and a GET or HEAD of one of the
  `open_paths` (the health and metrics endpoints) is served all the same,
  on a connection closed after that one answer; any other request gets a
  503 and a close.  At most `max_connections` connections are screened or
  served that way at once; beyond that a connection gets the 503 unread.

An idle keep-alive connection between requests is closed by aiohttp after
its keep-alive timeout (the servers' `keepalive_timeout_s`), so idle
connections hold their place under the limits for that long at most.  The
body deadline is the request handler's (lever.remote.server,
lever.serve.app), which then tells the guard whether the body was read
(`body_read`).  `busy()` counts the connections whose request handler runs,
for the shutdown's drain (shutdown.py), which sets `draining`.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

IDLE, HEADERS, REQUEST, SCREENING = "idle", "headers", "request", "screening"
REQUEST_LINE_BYTES = 8192        # a screened connection's request line must end within this many bytes
OPEN_METHODS = (b"GET", b"HEAD")

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


def request_path(line: bytes) -> tuple[bytes, str] | None:
    """(method, path without its query) of an HTTP request line such as
    b"GET /health?x=1 HTTP/1.1", or None for a line that is not one."""
    parts = line.strip().split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        return None
    target = parts[1].split(b"?", 1)[0]
    try:
        return parts[0], target.decode("ascii")
    except UnicodeDecodeError:
        return None


class ConnectionGuard:
    """The protocol factory handed to `loop.create_server`: wraps each protocol
    that `factory` makes in a `GuardedProtocol`.

    header_timeout_s: seconds; max_connections / max_per_ip: connection counts;
    open_paths: the paths served beyond the limits (GET or HEAD);
    keepalive_timeout_s: seconds an idle keep-alive connection is kept (aiohttp
    closes it: start_guarded_site hands it on); on_refused() and on_timeout()
    are called (on the event loop) for each connection refused at the limits
    or cut off for slow headers."""

    def __init__(self, factory, header_timeout_s: float, max_connections: int, max_per_ip: int,
                 on_refused=lambda: None, on_timeout=lambda: None, open_paths: tuple[str, ...] = (),
                 keepalive_timeout_s: float = 5.0):
        self.factory = factory
        self.header_timeout_s, self.keepalive_timeout_s = header_timeout_s, keepalive_timeout_s
        self.max_connections, self.max_per_ip = max_connections, max_per_ip
        self.open_paths = open_paths
        self.on_refused, self.on_timeout = on_refused, on_timeout
        self.open: dict[object, GuardedProtocol] = {}      # transport -> its guard, counted by the limits
        self.extra: dict[object, GuardedProtocol] = {}     # transport -> its guard, beyond the limits (screened)
        self.per_ip: Counter = Counter()
        self.draining = False                              # set once the server shuts down (shutdown.py)

    def __call__(self) -> "GuardedProtocol":
        return GuardedProtocol(self, self.factory())

    def watch(self, transport) -> "GuardedProtocol | None":
        """The guard of the connection on `transport` (None if not one of ours)."""
        return self.open.get(transport) or self.extra.get(transport)

    def admit(self, ip: str) -> bool:
        return len(self.open) < self.max_connections and self.per_ip[ip] < self.max_per_ip

    def busy(self) -> int:
        """Connections whose request handler runs now (a streamed answer included)."""
        return sum(1 for conn in (*self.open.values(), *self.extra.values()) if conn.state == REQUEST)

    def is_open(self, method: bytes, path: str) -> bool:
        """True for a request served beyond the limits: GET or HEAD of an open path."""
        return method in OPEN_METHODS and path in self.open_paths


class GuardedProtocol(asyncio.Protocol):
    """One connection: the inner (aiohttp) protocol plus a header deadline.

    States: SCREENING (over the limits: its request line is awaited, the
    inner protocol not started yet), HEADERS (bytes of a request arrived, or
    the connection is new, and its headers are not parsed yet; a timer
    runs), REQUEST (the handler runs: no timer), IDLE (between requests).
    `beyond`: served beyond the limits (one answer, then closed)."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self.guard, self.inner = guard, inner
        self.transport = None
        self.ip = ""
        self.refused = self.started = self.beyond = False
        self.state = IDLE
        self.body_done = True
        self.next_started: float | None = None     # loop time the next request's first byte came, mid-request
        self.pending = bytearray()                 # what a screened connection sent so far
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol, forwarded to the inner protocol ------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.ip = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if self.guard.admit(self.ip):
            self.guard.open[transport] = self
            self.guard.per_ip[self.ip] += 1
            self._arm(self.guard.header_timeout_s)
            self._start()
        elif self.guard.open_paths and len(self.guard.extra) < self.guard.max_connections:
            self.guard.extra[transport] = self
            self.state = SCREENING
            self._arm(self.guard.header_timeout_s)
        else:
            self._refuse()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.state == SCREENING:
            self._screen(data)
            return
        if self.state == IDLE:
            self.state = HEADERS
            self._arm(self.guard.header_timeout_s)
        elif self.state == REQUEST and self.body_done and self.next_started is None:
            self.next_started = asyncio.get_running_loop().time()     # a pipelined next request
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self.started else None

    def connection_lost(self, exc) -> None:
        self._cancel()
        if self.guard.open.pop(self.transport, None) is not None:
            self.guard.per_ip[self.ip] -= 1
            if self.guard.per_ip[self.ip] <= 0:
                del self.guard.per_ip[self.ip]
        self.guard.extra.pop(self.transport, None)
        if self.started:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.started:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.started:
            self.inner.resume_writing()

    # -- admission ------------------------------------------------------------------------

    def _start(self) -> None:
        """Hand the connection to the inner protocol."""
        self.state, self.started = HEADERS, True
        self.inner.connection_made(self.transport)

    def _screen(self, data: bytes) -> None:
        """A connection over the limits: serve it once its request line names an
        open path (what it sent so far goes to the inner protocol), else refuse it."""
        self.pending += data
        line, found, _ = bytes(self.pending).partition(b"\n")
        if not found:
            if len(self.pending) > REQUEST_LINE_BYTES:
                self._refuse()
            return
        parsed = request_path(line)
        if parsed is None or not self.guard.is_open(*parsed):
            self._refuse()
            return
        sent, self.pending = bytes(self.pending), bytearray()
        self.beyond = True
        self._start()                               # the header deadline keeps running
        self.inner.data_received(sent)

    def _refuse(self) -> None:
        """Answer 503 and close, without the inner protocol."""
        self._cancel()
        self.refused = True
        self.guard.extra.pop(self.transport, None)
        self.guard.on_refused()
        self.transport.write(busy_response())
        self.transport.close()

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
        if self.state in (HEADERS, SCREENING) and self.transport is not None and not self.transport.is_closing():
            self.guard.on_timeout()
            self.transport.abort()          # not close(): a TLS close would wait for the slow peer

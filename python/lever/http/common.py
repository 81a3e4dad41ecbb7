"""HTTP pieces shared by Lever's aiohttp servers (`lever serve-verifier`,
`lever serve`): the bearer-token check, bounded reading of a request body,
the middleware that authenticates and maps failures to JSON answers, a TCP
site whose connections pass the ConnectionGuard (`start_guarded_site`), and a
site on a background thread (`SiteThread`); serving in the foreground until
SIGINT or SIGTERM, with its drain, is shutdown.py's.

Both raise `HttpError` (error.py: an HTTP status, a short machine code, a message);
each server maps it to its own error body.  Sizes are bytes, times seconds.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl
import threading
import traceback

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .address import base_url
from .connections import ConnectionGuard
from .error import HttpError
from .logs import OneLineLog
from .shutdown import FINAL_GRACE_S

BODY_CHUNK_BYTES = 1 << 16          # bytes read from the body per step


def check_bearer(header: str | None, token: str | None) -> None:
    """Check an Authorization header against the server's `token` (None: no
    authentication).  The scheme is case-insensitive (RFC 7235: "bearer"
    works as "Bearer").  401 without a usable token (none, or bytes that are
    not printable ASCII -- no valid token has them), 403 with a wrong one.
    Compared in constant time, as bytes."""
    if token is None:
        return
    scheme, _, rest = (header or "").strip().partition(" ")
    presented = rest.strip() if scheme.lower() == "bearer" else ""
    if not presented or not presented.isascii() or not presented.isprintable():
        raise HttpError(401, "unauthorized", "this server needs 'Authorization: Bearer <token>' (printable ASCII)")
    if not hmac.compare_digest(presented.encode("ascii"), token.encode("ascii")):
        raise HttpError(403, "forbidden", "the bearer token is not valid for this server")


async def read_body(request: web.Request, limit_bytes: int, timeout_s: float) -> bytes:
    """The request's body, at most `limit_bytes` bytes: one announced larger
    (Content-Length) is refused before any of it is read, a chunked one as
    soon as it passes the limit (413); one not received within `timeout_s`
    seconds is a 408; a broken or cut-off body a 400."""
    if request.content_length is not None and request.content_length > limit_bytes:
        raise HttpError(413, "body_too_large", f"a body of {request.content_length} bytes is over the "
                                               f"limit of {limit_bytes} bytes")

    async def read() -> bytes:
        raw = bytearray()
        try:
            async for chunk in request.content.iter_chunked(BODY_CHUNK_BYTES):
                raw += chunk
                if len(raw) > limit_bytes:
                    raise HttpError(413, "body_too_large", f"the body is over the limit of {limit_bytes} bytes")
        except HttpProcessingError as e:            # a broken chunked encoding, a short body
            raise HttpError(400, "malformed", f"the body is malformed ({type(e).__name__})") from None
        except ConnectionError:
            raise HttpError(400, "incomplete_body", "the client went away mid-body") from None
        return bytes(raw)

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise HttpError(408, "body_timeout", f"the body did not arrive within {timeout_s:g} s") from None


def guard_middleware(connections, token: str | None, open_paths: tuple[str, ...], error_response, log):
    """An aiohttp middleware doing what every request of a Lever server
    needs: the ConnectionGuard's bookkeeping (`connections`, see
    connections.py), the bearer check (`check_bearer`; paths in `open_paths`
    need no token), a 503 (`shutting_down`) for every request once the
    server drains (shutdown.py), and every failure as a JSON answer built by
    `error_response(HttpError)`: an HttpError as it is, aiohttp's own 4xx
    (unknown path, wrong method) with its status, anything else a 500 that
    is `log`ged once (one line).  The connection is closed after the answer
    while draining, and after a request served beyond the connection limits."""

    async def answer(request: web.Request, handler) -> web.StreamResponse:
        try:
            if connections.draining:
                raise HttpError(503, "shutting_down", "the server is shutting down; retry later")
            if request.path not in open_paths:
                check_bearer(request.headers.get("Authorization"), token)
            return await handler(request)
        except HttpError as e:
            return error_response(e)
        except web.HTTPException as e:           # unknown path, wrong method
            if e.status < 400:
                raise
            return error_response(HttpError(e.status, e.reason.lower().replace(" ", "_"),
                                            f"{request.method} {request.path}: {e.reason}"))
        except Exception as e:  # noqa: BLE001 -- a bug: answered and logged, the server goes on
            where = traceback.extract_tb(e.__traceback__)[-1]
            log(f"internal error in {request.method} {request.path}: {type(e).__name__}: {e} "
                f"(at {where.filename}:{where.lineno})")
            return error_response(HttpError(500, "internal", f"the server failed ({type(e).__name__})"))

    @web.middleware
    async def guard(request: web.Request, handler):
        conn = connections.watch(request.transport)
        if conn is not None:
            conn.request_started(has_body=request.can_read_body)
        try:
            resp = await answer(request, handler)
        finally:
            if conn is not None:
                conn.request_finished()
        if connections.draining or (conn is not None and conn.beyond):
            resp.force_close()
        return resp

    return guard


def error_headers(resp: web.Response, status: int) -> web.Response:
    """What an error answer with `status` needs beside its body: a 401 names
    the auth scheme, a 429 says when to retry, a 408 or 413 closes the
    connection (the rest of the body is never read)."""
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="lever"'
    if status == 429:
        resp.headers["Retry-After"] = "1"
    if status in (408, 413):
        resp.force_close()
    return resp


def client_gone(request: web.Request) -> bool:
    """True if the client of `request` has closed its connection."""
    transport = request.transport
    return transport is None or transport.is_closing()


def http_logger(name: str, log) -> logging.Logger:
    """aiohttp's logger for one server: its lines go to `log` (one line each), not to the root logger."""
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.addHandler(OneLineLog(log))
    return logger


class GuardedSite(web.TCPSite):
    """A TCP site whose connections pass through the server's ConnectionGuard."""

    def __init__(self, runner: web.AppRunner, guard: ConnectionGuard, host: str, port: int,
                 ssl_context: ssl.SSLContext | None, handshake_timeout_s: float):
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self.guard, self.handshake_timeout_s = guard, handshake_timeout_s

    async def start(self) -> None:
        self._runner._reg_site(self)
        self.guard.factory = self._runner.server
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.guard, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            ssl_handshake_timeout=self.handshake_timeout_s if self._ssl_context is not None else None)
        self.bound_port = self._server.sockets[0].getsockname()[1]


async def start_guarded_site(app: web.Application, connections: ConnectionGuard, header_timeout_s: float,
                             host: str, port: int, ssl_context: ssl.SSLContext | None, access_log_class,
                             access_log, logger: logging.Logger) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port (0: any free port) through the ConnectionGuard
    `connections`, over TLS when `ssl_context` is given; `access_log_class` /
    `access_log` count the answers.  An idle keep-alive connection is closed
    after `connections.keepalive_timeout_s` seconds; at cleanup, handlers
    still running are cancelled after FINAL_GRACE_S seconds (the drain before
    it is shutdown.py's).  Returns the runner and the bound port."""
    runner = web.AppRunner(app, access_log_class=access_log_class, access_log=access_log, logger=logger,
                           lingering_time=0, keepalive_timeout=connections.keepalive_timeout_s,
                           handler_cancellation=True, shutdown_timeout=FINAL_GRACE_S)
    await runner.setup()
    site = GuardedSite(runner, connections, host, port, ssl_context, header_timeout_s)
    await site.start()
    return runner, site.bound_port


class SiteThread:
    """An aiohttp site on a background thread with its own event loop (tests,
    benchmarks, notebooks).  `start_site(host, port)` is a coroutine function
    that starts the site and returns (runner, bound port); port 0 picks a
    free one.  Use as a context manager or start()/stop()."""

    def __init__(self, start_site, host: str = "127.0.0.1", port: int = 0, scheme: str = "http"):
        self.start_site, self.host, self.port, self.scheme = start_site, host, port, scheme
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return base_url(self.scheme, self.host, self.port)

    def start(self) -> "SiteThread":
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                runner, self.port = loop.run_until_complete(self.start_site(self.host, self.port))
            except BaseException as e:  # noqa: BLE001 -- reported to the starting thread
                self._error = e
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="lever-http-site", daemon=True)
        self._thread.start()
        ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def __enter__(self) -> "SiteThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

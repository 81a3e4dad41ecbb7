"""Running the `lever serve` application: on a guarded TCP site (the
verifier server's connection limits), until SIGINT or SIGTERM and its
drain (lever.http.shutdown) or on a background thread (`serve_thread`, for
tests and notebooks)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from ..http.common import SiteThread, start_guarded_site
from ..http.shutdown import DEFAULT_DRAIN_S, serve_until_stopped
from .app import OpenAIServer


class EndpointCounter(AbstractAccessLogger):
    """aiohttp's access log, used to count every answer by endpoint and
    status (aiohttp's own 400s for malformed HTTP included).  `logger` is
    the server's HttpCounters."""

    def log(self, request, response, time: float) -> None:
        self.logger.count(request.path if request is not None else "other", response.status)


async def start_site(server: OpenAIServer, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve `server` on host:port (0: any free port); returns the runner and the port."""
    return await start_guarded_site(server.app(), server.connections, server.limits.header_timeout_s, host, port,
                                    None, EndpointCounter, server.http, server.http_log)


def serve_forever(server: OpenAIServer, host: str, port: int, on_ready=None,
                  drain_s: float = DEFAULT_DRAIN_S) -> None:
    """Serve until SIGINT or SIGTERM, then drain for at most `drain_s` seconds
    (lever.http.shutdown); on_ready(port) once listening."""
    serve_until_stopped(lambda: start_site(server, host, port), server.connections, server.cancel_work, server.log,
                        drain_s, on_ready)


def serve_thread(server: OpenAIServer, host: str = "127.0.0.1", port: int = 0) -> SiteThread:
    """`server` on a background thread: `with serve_thread(server) as s: ... s.url`."""
    return SiteThread(lambda h, p: start_site(server, h, p), host, port)

"""`HttpError`: a request refused with an HTTP status, a short machine code
and a message.  Its own module (no aiohttp) so that the edge-cloud wire
protocol (lever.remote.protocol), which the edge client imports too, can
build on it; the servers' shared HTTP pieces live in common.py."""

from __future__ import annotations


class HttpError(Exception):
    """A request refused with HTTP `status`, a short machine `code` and a
    human `message`; `param` names the request field at fault (or None)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param

"""Adapters from aiohttp's own logs to a server's counters and log, shared by
Lever's aiohttp servers (`lever serve-verifier`, `lever serve`): the access
log counting every answer's status (`StatusCounter`), and aiohttp's server
log as one line per event (`OneLineLog`)."""

from __future__ import annotations

import logging

from aiohttp.abc import AbstractAccessLogger

LOG_CHARS = 300             # characters of one logged line about a client's malformed HTTP


class StatusCounter(AbstractAccessLogger):
    """aiohttp's access log, used to count every answer's status, aiohttp's own
    (malformed HTTP: 400) included.  `logger` is the server's counters
    (lever.remote.metrics.Metrics: anything with `count(status)`)."""

    def log(self, request, response, time: float) -> None:
        self.logger.count(response.status)


class OneLineLog(logging.Handler):
    """aiohttp's server log (malformed HTTP, dropped connections) as one line
    per record, without tracebacks, through the server's `log`."""

    def __init__(self, say):
        super().__init__(logging.WARNING)
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        line = record.getMessage() + (f" ({type(exc).__name__}: {exc})" if exc else "")
        self.say("http: " + " ".join(line.split())[:LOG_CHARS])

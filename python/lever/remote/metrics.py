"""The verifier server's counters (/v1/metrics).  The adapters that feed
aiohttp's own access and error logs into them (every answer's status
counted, aiohttp's log one line per event) are lever.http.logs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Metrics:
    """Server counters since start. Seconds are seconds, bytes are body bytes."""

    started: float = field(default_factory=time.monotonic)
    sessions_opened: int = 0
    sessions_closed: int = 0
    sessions_expired: int = 0
    sessions_failed: int = 0
    sessions_abandoned: int = 0        # opens given up because their client went away
    prefill_tokens: int = 0
    rounds: int = 0                    # target passes over trees (= target calls)
    replayed: int = 0                  # retried rounds answered from the stored answer
    tree_tokens: int = 0               # tokens scored in rounds (roots included)
    emitted_tokens: int = 0            # tokens committed by rounds
    compute_s: float = 0.0             # target passes, prefills included
    bytes_in: int = 0
    bytes_out: int = 0
    statuses: dict = field(default_factory=dict)  # HTTP status -> answers sent with it
    connections_refused: int = 0       # over the connection limits (answered 503, counted there too)
    connections_timed_out: int = 0     # cut off for headers not complete in time

    def count(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def to_json(self, active: int) -> dict:
        return {
            "uptime_s": round(time.monotonic() - self.started, 3),
            "sessions": {"active": active, "opened": self.sessions_opened, "closed": self.sessions_closed,
                         "expired": self.sessions_expired, "failed": self.sessions_failed,
                         "abandoned": self.sessions_abandoned},
            "target_calls": self.rounds, "replayed_rounds": self.replayed,
            "prefill_tokens": self.prefill_tokens, "tree_tokens": self.tree_tokens,
            "emitted_tokens": self.emitted_tokens,
            "tokens_per_call": round(self.emitted_tokens / self.rounds, 4) if self.rounds else None,
            "compute_s": round(self.compute_s, 4), "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "errors": {str(k): v for k, v in sorted(self.statuses.items()) if k >= 400},
            "connections": {"refused": self.connections_refused, "timed_out": self.connections_timed_out},
        }

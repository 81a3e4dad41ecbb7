"""The counters of `lever serve` and their Prometheus text exposition
(/metrics, format version 0.0.4).

HTTP counters are written on the event loop only, engine counters on the
engine thread only (one writer each); the gauges are read from the queue
when /metrics is asked.  Tokens are tokens, bytes are bytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
KNOWN_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")


@dataclass
class EngineCounters:
    """What the engine did, summed over requests (cancelled ones included)."""

    prompt_tokens: int = 0
    tokens_generated: int = 0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    bytes_read: int = 0
    stop_strings: int = 0             # generations ended by a stop string
    prefill_tokens: int = 0           # prompt tokens run by prefill chunks (target and draft model; a
                                      # stopped prefill counts the chunks it ran)
    prefill_timeouts: int = 0         # generations stopped by --max-prefill-seconds

    def add(self, prompt_tokens: int, new_tokens: int, stats) -> None:
        """Count one run; `stats` is its lever.engine.SpecStats (None: not started)."""
        self.prompt_tokens += prompt_tokens
        self.tokens_generated += new_tokens
        if stats is not None:
            self.target_passes += stats.iterations
            self.drafted += stats.draft_nodes
            self.accepted += stats.accepted
            self.bytes_read += stats.bytes_read


@dataclass
class HttpCounters:
    """Answers by (endpoint, status); an unknown path counts as "other"."""

    requests: Counter = field(default_factory=Counter)
    connections_refused: int = 0
    connections_timed_out: int = 0

    def count(self, path: str, status: int) -> None:
        self.requests[(path if path in KNOWN_PATHS else "other", status)] += 1


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _metric(lines: list[str], name: str, kind: str, help_text: str, samples) -> None:
    """One metric family: HELP, TYPE and its samples [(labels dict, value)]."""
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        label_text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
        lines.append(f"{name}{{{label_text}}} {value}" if label_text else f"{name} {value}")


def exposition(http: HttpCounters, engine: EngineCounters, queue, uptime_s: float) -> str:
    """The Prometheus text of every counter; `queue` is the GenerationQueue."""
    lines: list[str] = []
    m = lambda *a: _metric(lines, *a)      # noqa: E731
    m("lever_serve_requests_total", "counter", "HTTP answers by endpoint and status",
      [({"endpoint": p, "status": s}, n) for (p, s), n in sorted(http.requests.items())])
    m("lever_serve_queue_depth", "gauge", "requests waiting for the engine", [({}, queue.depth)])
    m("lever_serve_queue_limit", "gauge", "requests that may wait (--max-queue)", [({}, queue.max_waiting)])
    m("lever_serve_active_generations", "gauge", "generations running on the engine (0 or 1)",
      [({}, queue.active)])
    m("lever_serve_cancelled_generations_total", "counter",
      "generations whose client went away: stage=running stopped mid-run, stage=queued dropped before it ran",
      [({"stage": "running"}, queue.cancelled), ({"stage": "queued"}, queue.dropped)])
    m("lever_serve_completed_generations_total", "counter", "generations that ran to their end",
      [({}, queue.completed)])
    m("lever_serve_failed_generations_total", "counter", "generations that failed inside the engine",
      [({}, queue.failed)])
    m("lever_serve_sessions_freed_total", "counter",
      "engine runs ended (completed, stopped or failed) whose KV cache and draft state were released",
      [({}, queue.freed)])
    m("lever_serve_stop_string_finishes_total", "counter", "generations ended by one of their stop strings",
      [({}, engine.stop_strings)])
    m("lever_serve_prompt_tokens_total", "counter", "prompt tokens prefilled", [({}, engine.prompt_tokens)])
    m("lever_serve_prefill_chunk_tokens_total", "counter",
      "prompt tokens run by prefill chunks, target and draft model (a stopped prefill counts the chunks it ran)",
      [({}, engine.prefill_tokens)])
    m("lever_serve_prefill_timeouts_total", "counter", "generations stopped by --max-prefill-seconds",
      [({}, engine.prefill_timeouts)])
    m("lever_serve_tokens_generated_total", "counter", "tokens generated", [({}, engine.tokens_generated)])
    m("lever_serve_target_passes_total", "counter", "target passes (verifications)", [({}, engine.target_passes)])
    m("lever_serve_drafted_tokens_total", "counter", "draft tokens sent to the target", [({}, engine.drafted)])
    m("lever_serve_accepted_tokens_total", "counter", "draft tokens the target accepted", [({}, engine.accepted)])
    m("lever_serve_flash_bytes_read_total", "counter", "bytes a flash-resident target read (0 in DRAM)",
      [({}, engine.bytes_read)])
    m("lever_serve_connections_refused_total", "counter", "connections over the connection limits (503)",
      [({}, http.connections_refused)])
    m("lever_serve_connections_timed_out_total", "counter", "connections cut off for slow request headers",
      [({}, http.connections_timed_out)])
    m("lever_serve_uptime_seconds", "gauge", "seconds since the server started", [({}, round(uptime_s, 3))])
    return "\n".join(lines) + "\n"

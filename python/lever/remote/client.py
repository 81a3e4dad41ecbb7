"""The edge side of edge-cloud mode: `RemoteVerifier` sends each drafted tree
to a verifier server (protocol.py) and returns the server's verdict, with
the interface of `lever.verify.target_pass.TargetVerifier`, so the same
speculative loop (`lever.engine.run_speculative`) drives both.

Faults it absorbs:
- a lost request or answer, a refused, reset or timed-out connection, a
  408, 429, 502, 503 or 504: retried with exponential backoff; a retried
  round carries the same round number, so the server replays its stored
  answer instead of committing twice;
- an unknown session (the server restarted, or the session expired), a 500
  (the server closed the session) or another refusal of a round: a new
  session is opened from the committed tokens (the prompt plus everything
  accepted so far) with the same seed, and the round is sent again; sampled
  draws depend on (seed, position), not on sessions, so the output is what
  it would have been.
The client always ends: one call (an open, or a round with its rebuilds)
retries for at most `retry_deadline_s` seconds from its first failure, each
exchange bounded by what is left of it (the first by `timeout_s`), so a
call ends within timeout_s + retry_deadline_s.  Past the deadline it raises
`VerifierUnreachableError` ("did not answer") or, if the server kept
answering 429, `VerifierBusyError` ("server busy"); the same refusal again
after a rebuild (a permanent error), 401/403 and a refused /v1/info raise
`RemoteVerifierError` naming the status and the server's message.  The
loop keeps what it generated; there is no fallback to the draft's own tokens.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import secrets
import ssl
import time
import urllib.parse

import numpy as np

from ..errors import LeverError
from ..sampling import SamplingParams, resolve_seed
from ..tree import TokenTree
from ..verify.target_pass import Verdict
from .protocol import VERSION
from .tls import client_context

RETRYABLE = {408, 429, 502, 503, 504}      # the server is busy or a proxy failed: the same request again
AT_ONCE = {401, 403}                       # the token: a rebuild cannot help
CLOSE_TIMEOUT_S = 2.0                      # seconds a best-effort DELETE of the session may take
MIN_EXCHANGE_S = 0.05                      # the shortest socket timeout given to an exchange
MESSAGE_CHARS = 300                        # characters of a server message quoted in an error


class RemoteVerifierError(LeverError):
    """The verifier refused a request (`status`, `code` from the server) or broke the protocol."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code
        self.server_message = message


class VerifierUnreachableError(RemoteVerifierError):
    """The verifier did not answer within the retry deadline."""


class VerifierBusyError(RemoteVerifierError):
    """The verifier kept answering 429 (too many sessions) until the retry deadline."""


class RetryBudget:
    """The retry deadline of one call: `seconds` from its first failure
    (monotonic clock); unlimited until then."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.deadline: float | None = None

    def start(self) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + self.seconds

    def left(self) -> float:
        """Seconds left (inf before the first failure)."""
        return math.inf if self.deadline is None else self.deadline - time.monotonic()


def one_line(text: str) -> str:
    """A server's message as one line of at most MESSAGE_CHARS characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + "..."


class RemoteVerifier:
    """A verifier server seen as a `TargetVerifier`.

    url: http(s)://host:port of `lever serve-verifier`; token: its bearer token;
    params: sampling settings (the server applies them); timeout_s: seconds
    one HTTP exchange may take; retry_deadline_s: seconds to keep retrying one
    call (a request, or a round with its rebuilds) after its first failure;
    backoff_s / max_backoff_s: first and largest pause between retries
    (seconds, doubling); cost: a lever.remote.cost.RemoteCost that learns from
    every round (mode lever); tls_ca: a PEM file of the certificates to trust
    for an https URL (default: the system's), e.g. a self-signed server's."""

    def __init__(self, url: str, params: SamplingParams = SamplingParams(), token: str | None = None,
                 timeout_s: float = 120.0, retry_deadline_s: float = 30.0, backoff_s: float = 0.05,
                 max_backoff_s: float = 2.0, cost=None, tls_ca: str | None = None):
        self.url = url
        self.params, self.token = params, token
        self.timeout_s, self.retry_deadline_s = timeout_s, retry_deadline_s
        self.seed = resolve_seed(params)
        self.session: str | None = None
        self.round = 0
        self.committed: list[int] = []
        self.stats = ClientStats()
        self.http = JsonHttp(url, self.stats, token=token, timeout_s=timeout_s, retry_deadline_s=retry_deadline_s,
                             backoff_s=backoff_s, max_backoff_s=max_backoff_s, tls_ca=tls_ca,
                             envelope={"v": VERSION})
        self.cost = cost
        self.info = self._request("GET", "/v1/info")

    # -- what the loop needs -----------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return int(self.info["vocab_size"])

    @property
    def max_context(self) -> int:
        return int(self.info["max_context"])

    def io_busy_s(self) -> None:
        """The server's flash reads are not visible here: the share of drafting
        hidden under I/O is unknown (None) in edge-cloud mode."""
        return None

    @property
    def max_tree_nodes(self) -> int:
        """Nodes per tree the server accepts, root included."""
        return int(self.info["limits"]["max_tree_nodes"])

    def ping_s(self, count: int = 3) -> float:
        """Median seconds of `count` health-check round trips (the network's share of a round)."""
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            self._request("GET", "/v1/health")
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def check_tokenizer(self, fingerprint: str | None) -> None:
        """Refuse a draft whose tokenizer gives ids other meanings than the target's."""
        theirs = self.info.get("tokenizer")
        if fingerprint and theirs and fingerprint != theirs:
            raise LeverError(f"the draft's tokenizer ({fingerprint}) differs from the verifier's target's "
                             f"({theirs}); the two models must share a vocabulary")

    def start(self, prompt_ids: list[int]) -> None:
        """Open a session on the server; its prefill of the prompt is one target call."""
        self.close()
        self.committed = [int(t) for t in prompt_ids]
        self._open()

    def verify(self, tree: TokenTree, draft_probs=None) -> Verdict:
        """Have the server verify `tree` and commit its answer.  draft_probs is
        ignored: the protocol is token-only (greedy or the position-keyed draws)."""
        if self.session is None:
            raise LeverError("RemoteVerifier.verify before start")
        if len(tree) > self.max_tree_nodes:
            raise LeverError(f"a tree of {len(tree)} nodes is over the verifier's cap of {self.max_tree_nodes}")
        tokens, parents = tree.tokens().tolist(), tree.parents().tolist()
        t0 = time.perf_counter()
        budget, failed = RetryBudget(self.retry_deadline_s), None
        while True:
            path = f"/v1/sessions/{self.session}/rounds"
            try:
                answer = self._request("POST", path, {"round": self.round, "tokens": tokens, "parents": parents},
                                       budget)
                break
            except (VerifierUnreachableError, VerifierBusyError):
                raise
            except RemoteVerifierError as e:
                if e.status is None or e.status in AT_ONCE:
                    raise
                if failed == (e.status, e.code):
                    raise RemoteVerifierError(f"the verifier refused POST {path} again after reopening the "
                                              f"session: {e.status} {e.code}: {e.server_message}",
                                              status=e.status, code=e.code) from None
                failed = (e.status, e.code)
                budget.start()                    # rebuilds count against the same deadline
                if budget.left() <= 0:
                    raise RemoteVerifierError(f"the verifier kept refusing POST {path} for {self.retry_deadline_s:g} "
                                              f"s (last: {e.status} {e.code}: {e.server_message})",
                                              status=e.status, code=e.code) from None
                self.stats.rebuilds += 1          # the server lost or closed the session: rebuild it, send again
                self._open(budget)
        elapsed = time.perf_counter() - t0
        accepted, next_token = self._check_answer(tree, answer)
        self.committed += [tree.token(j) for j in accepted] + [next_token]
        self.round += 1
        s = self.stats
        s.rounds += 1
        s.tree_tokens += len(tree)
        s.round_trip_s.append(elapsed)
        s.server_s.append(float(answer.get("server_s", 0.0)))
        if self.cost is not None:
            self.cost.observe(len(tree), elapsed, s.server_s[-1])
        return Verdict(accepted, next_token, verify_s=elapsed)

    def close(self) -> None:
        """Close the session on the server (best effort: it expires anyway)."""
        sid, self.session = self.session, None
        if sid is not None:
            self.http.close_quietly("DELETE", f"/v1/sessions/{sid}")

    # -- sessions ------------------------------------------------------------------------

    def _open(self, budget: RetryBudget | None = None) -> None:
        """Open a session holding the committed tokens.  A 500 is tried once
        more (a new open); the same again is a permanent error."""
        p = self.params
        sampling = {} if p.greedy else {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k}
        budget = budget or RetryBudget(self.retry_deadline_s)
        for attempt in (1, 2):
            try:
                answer = self._request("POST", "/v1/sessions", {"prompt": self.committed, "sampling": sampling,
                                                                "seed": self.seed, "open_id": secrets.token_hex(8)},
                                       budget)
                break
            except RemoteVerifierError as e:
                if e.status != 500 or attempt == 2:
                    raise
                budget.start()
        if not isinstance(answer.get("session"), str):
            raise RemoteVerifierError(f"the verifier's answer to an open is malformed: {one_line(answer)}")
        self.session, self.round = answer["session"], 0
        self.stats.sessions += 1
        self.stats.prefill_tokens += len(self.committed)

    def _check_answer(self, tree: TokenTree, answer: dict) -> tuple[list[int], int]:
        accepted, next_token = answer.get("accepted"), answer.get("next")
        if not isinstance(accepted, list) or type(next_token) is not int or not 0 <= next_token < self.vocab_size:
            raise RemoteVerifierError(f"the verifier's answer is malformed: {answer!r}")
        node = 0
        for j in accepted:
            if type(j) is not int or not 0 < j < len(tree) or tree.parent(j) != node:
                raise RemoteVerifierError(f"the verifier accepted {accepted}, which is not a path of the tree")
            node = j
        return accepted, next_token

    def _request(self, method: str, path: str, body: dict | None = None, budget: RetryBudget | None = None) -> dict:
        return self.http.request(method, path, body, budget)


class JsonHttp:
    """JSON over HTTP(S) to one server, with the retries, deadlines and byte
    accounting described above; shared by the protocol client and the vLLM
    adapter (lever.remote.vllm_verifier).

    stats: a ClientStats whose retries and bytes this object counts;
    envelope: fields added to every JSON body (the protocol version);
    other arguments as RemoteVerifier's."""

    def __init__(self, url: str, stats: "ClientStats", token: str | None = None, timeout_s: float = 120.0,
                 retry_deadline_s: float = 30.0, backoff_s: float = 0.05, max_backoff_s: float = 2.0,
                 tls_ca: str | None = None, envelope: dict | None = None):
        parsed = urllib.parse.urlsplit(url)
        try:
            port = parsed.port                  # ValueError: not a number, or beyond 65535
        except ValueError:
            port = 0
        if parsed.scheme not in ("http", "https") or not parsed.hostname or port == 0:
            raise LeverError(f"--remote {url!r}: expected http://HOST:PORT or https://HOST:PORT "
                             f"(a port from 1 to 65535)")
        if tls_ca is not None and parsed.scheme != "https":
            raise LeverError(f"--tls-ca {tls_ca}: the verifier URL {url} is not https://")
        self.url, self.stats, self.token = url, stats, token
        self._https = parsed.scheme == "https"
        self._tls = client_context(tls_ca) if self._https else None
        self._host, self._port = parsed.hostname, port or (443 if self._https else 80)
        self.timeout_s, self.retry_deadline_s = timeout_s, retry_deadline_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.envelope = dict(envelope or {})
        self._conn: http.client.HTTPConnection | None = None

    def close_quietly(self, method: str, path: str) -> None:
        """A best-effort request of at most CLOSE_TIMEOUT_S seconds (a DELETE); failures are ignored."""
        try:
            self.exchange(method, path, None, min(self.timeout_s, CLOSE_TIMEOUT_S))
        except (OSError, http.client.HTTPException):
            self.drop_connection()

    def request(self, method: str, path: str, body: dict | None = None, budget: RetryBudget | None = None) -> dict:
        """One request, retried on transport failures and RETRYABLE statuses
        until `budget` (default: a fresh one of retry_deadline_s) runs out."""
        budget = budget or RetryBudget(self.retry_deadline_s)
        pause, attempts, last, busy = self.backoff_s, 0, "", False
        while True:
            attempts += 1
            try:
                status, answer = self.exchange(method, path, body, min(self.timeout_s,
                                                                       max(budget.left(), MIN_EXCHANGE_S)))
            except ssl.SSLCertVerificationError as e:
                self.drop_connection()
                raise RemoteVerifierError(f"the verifier at {self.url} has a TLS certificate this client does not "
                                          f"trust ({e.verify_message or e}); pass the CA file that signed it "
                                          f"(--tls-ca)") from None
            except (OSError, http.client.HTTPException) as e:
                self.drop_connection()
                last, busy = (f"{type(e).__name__}: {e}" if str(e) else type(e).__name__), False
            else:
                if status < 400:
                    if not isinstance(answer, dict):
                        raise RemoteVerifierError(f"the verifier's answer to {method} {path} is not a JSON object")
                    return answer
                error = answer.get("error", answer) if isinstance(answer, dict) else {}   # lever / OpenAI-style
                error = error if isinstance(error, dict) else {}
                message = one_line(error.get("message", f"HTTP {status}"))
                code = error.get("code") if isinstance(error.get("code"), str) else None
                if status not in RETRYABLE:
                    e = RemoteVerifierError(f"the verifier refused {method} {path}: {status} {code}: {message}",
                                            status=status, code=code)
                    e.server_message = message
                    raise e
                last, busy = f"HTTP {status} {code}: {message}", status == 429
            budget.start()
            if budget.left() < pause:
                if busy:
                    raise VerifierBusyError(f"server busy: the verifier at {self.url} answered {last} to {method} "
                                            f"{path} for {self.retry_deadline_s:g} s ({attempts} attempts)",
                                            status=429, code="too_many_sessions")
                raise VerifierUnreachableError(
                    f"the verifier at {self.url} did not answer {method} {path} within "
                    f"{self.retry_deadline_s:g} s ({attempts} attempts; last: {last})")
            self.stats.retries += 1
            time.sleep(pause * random.uniform(0.5, 1.0))
            pause = min(pause * 2, self.max_backoff_s)

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout_s,
                                                         context=self._tls)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
        self._conn.timeout = timeout_s
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout_s)
        return self._conn

    def drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def exchange(self, method: str, path: str, body: dict | None, timeout_s: float) -> tuple[int, dict]:
        """One HTTP exchange of at most `timeout_s` seconds per socket
        operation: (status, JSON answer).  Counts bytes both ways."""
        payload = b"" if body is None else json.dumps({**self.envelope, **body}, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(payload))}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = self._connection(timeout_s)
        conn.request(method, path, body=payload or None, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        s = self.stats
        s.bytes_up += len(f"{method} {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n\r\n") + len(payload) + \
            sum(len(k) + len(v) + 4 for k, v in headers.items())
        s.bytes_down += len(f"HTTP/1.1 {resp.status} {resp.reason}\r\n\r\n") + len(raw) + \
            sum(len(k) + len(v) + 4 for k, v in resp.getheaders())
        if resp.getheader("Connection", "").lower() == "close":
            self.drop_connection()
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"error": {"message": raw[:200].decode(errors="replace")}}
        return resp.status, answer



class ClientStats:
    """What one client sent and got. Seconds are seconds; bytes include HTTP headers."""

    def __init__(self):
        self.sessions = 0              # sessions opened (1 + rebuilds)
        self.prefill_tokens = 0
        self.rounds = 0                # target calls over trees
        self.tree_tokens = 0           # tokens sent in trees (roots included)
        self.retries = 0
        self.rebuilds = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.round_trip_s: list[float] = []
        self.server_s: list[float] = []

    def to_json(self, new_tokens: int) -> dict:
        rt, sv = self.round_trip_s, self.server_s
        net = [a - b for a, b in zip(rt, sv)]
        return {
            "target_calls": self.rounds,
            "target_calls_per_token": round(self.rounds / new_tokens, 4) if new_tokens else None,
            "tokens_per_call": round(new_tokens / self.rounds, 3) if self.rounds else None,
            "sessions": self.sessions, "rebuilds": self.rebuilds, "retries": self.retries,
            "prefill_tokens": self.prefill_tokens, "tree_tokens": self.tree_tokens,
            "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
            "bytes_per_token": round((self.bytes_up + self.bytes_down) / new_tokens, 1) if new_tokens else None,
            "round_trip_ms": _summary(rt), "server_ms": _summary(sv), "network_ms": _summary(net),
        }


def _summary(values: list[float]) -> dict | None:
    if not values:
        return None
    a = np.asarray(values) * 1e3
    return {"mean": round(float(a.mean()), 3), "p50": round(float(np.percentile(a, 50)), 3),
            "p90": round(float(np.percentile(a, 90)), 3), "max": round(float(a.max()), 3)}


__all__ = ["ClientStats", "JsonHttp", "RemoteVerifier", "RemoteVerifierError", "VerifierBusyError", "VerifierUnreachableError"]

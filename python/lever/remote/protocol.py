"""The edge-cloud verification protocol, version 1 (JSON over HTTP).

Token-only: the edge sends token ids and parent indices, the server answers
with tree node indices and one token.  No draft distributions travel, and
the acceptance rule (greedy walk, or the position-keyed draws of
lever.sampling.sample_at with the session seed) runs on the server, so the
output is exactly the target's -- the very text of plain sampling with
that seed.

Every body is a JSON object carrying ``"v": 1``.  Paths are under ``/v1``:

=======  =========================  ==============================================
method   path                       body -> answer
=======  =========================  ==============================================
GET      /v1/health                 -> {"status": "ok", "v": 1}  (no token needed)
GET      /v1/info                   -> model, vocab_size, max_context, limits,
                                       verify_cost {"n": [...], "s": [...]} (seconds
                                       of one target pass over n tree tokens)
POST     /v1/sessions               {"prompt": [ids], "sampling": {"temperature",
                                    "top_p", "top_k"}, "seed": int, "open_id": str}
                                    -> 201 {"session": id, "round": 0, "seed": int,
                                    "position": p, "server_s": s, "replayed": false}
POST     /v1/sessions/{id}/rounds   {"round": r, "tokens": [ids], "parents": [ints]}
                                    -> {"round": r, "accepted": [nodes], "next": id,
                                    "position": p, "server_s": s, "calls": n,
                                    "replayed": bool}
DELETE   /v1/sessions/{id}          -> {"closed": id, "rounds": n}
GET      /v1/metrics                -> counters (see metrics.Metrics)
=======  =========================  ==============================================

Semantics: the prompt's last token is the session's *root*; a round's tree
has that root at node 0 (``parents[0] == -1``) and every other node's parent
before it.  The answer's ``accepted`` are tree nodes (root excluded, root to
leaf) and ``next`` the target's token after them, the new root; ``position``
is then the new root's position (tokens committed before it), ``server_s``
the seconds the server spent on the round and ``calls`` the session's target
calls so far.

Opening is idempotent too: an open carrying the ``open_id`` of a session
that has not verified a round yet returns that session (200, ``"replayed":
true``) instead of making a second one, so a lost answer to an open leaves
no orphan.  Rounds are numbered 0, 1, 2, ... per session.  Re-sending the last answered
round with the same tree returns the stored answer (``"replayed": true``) and
commits nothing; any other round number, or the last one with a different
tree, is a 409.  Errors are ``{"v": 1, "error": {"code": str, "message": str}}``
with status 400 (malformed; code ``invalid_text`` for a string -- a field name
too -- that is not valid Unicode, the message naming it), 401 (no token), 403 (wrong token), 404 (unknown
or expired session), 409 (round conflict), 413 (body too large), 422 (ids
outside the vocabulary, bad parents, tree over the cap, context over the
limit, bad sampling settings), 408 (a body not received in time), 429 (too
many sessions), 503 (too many connections).  A 500 is a server bug: it is
answered with the same JSON error body and counted in /v1/metrics.  (A
request that is not even valid HTTP gets the HTTP library's plain-text 400.)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from ..http.error import HttpError
from ..http.json_body import invalid_text, parse_json, shown_path
from ..sampling import SamplingParams

VERSION = 1
MAX_ROUND = (1 << 63) - 1
SHOWN_CHARS = 60            # characters of a refused value quoted back in an error message


@dataclass(frozen=True)
class Limits:
    """Server limits. Tokens are token counts, seconds are seconds, bytes are bytes."""

    max_sessions: int = 16
    max_session_tokens: int = 4096     # prompt + generated + a tree, per session
    max_tree_nodes: int = 256          # root included
    idle_ttl_s: float = 600.0          # a session unused this long is closed
    max_body_bytes: int = 1 << 20
    prefill_chunk: int = 128           # prompt tokens per prefill job; other sessions' rounds run between jobs
    header_timeout_s: float = 10.0     # a connection must complete a request's headers this soon after its first byte
    body_timeout_s: float = 30.0       # ... and its body this soon after its headers
    max_connections: int = 256         # open connections at most, all clients together
    max_connections_per_ip: int = 64   # open connections at most from one address
    keepalive_timeout_s: float = 5.0   # an idle keep-alive connection is closed after this long

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_session_tokens", "max_tree_nodes", "max_body_bytes", "prefill_chunk",
                     "max_connections", "max_connections_per_ip"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("idle_ttl_s", "header_timeout_s", "body_timeout_s", "keepalive_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")

    def to_json(self) -> dict:
        return dict(self.__dict__)


class ProtocolError(HttpError):
    """A request the server refuses: HTTP `status`, a short machine `code`, a message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(status, code, message)

    def body(self) -> dict:
        return {"v": VERSION, "error": {"code": self.code, "message": self.message}}


@dataclass(frozen=True)
class OpenRequest:
    prompt: list[int]
    params: SamplingParams
    seed: int | None
    open_id: str | None = None


@dataclass(frozen=True)
class RoundRequest:
    round: int
    tokens: list[int]
    parents: list[int]

    def digest(self) -> str:
        """Identifies the tree of a round (a retry must send the same one)."""
        return hashlib.sha256(json.dumps([self.tokens, self.parents]).encode()).hexdigest()


def show(value) -> str:
    """A client's value, quoted in an error message: its repr, cut to SHOWN_CHARS characters."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10 ** SHOWN_CHARS else "<a huge integer>"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def encode(obj: dict) -> bytes:
    return json.dumps({"v": VERSION, **obj}, separators=(",", ":")).encode()


def decode(raw: bytes) -> dict:
    """A request body: a JSON object of protocol version 1 whose strings (field
    names too) are valid Unicode text, else a 400 (for text, naming the field:
    lever.http.json_body)."""
    try:
        body = parse_json(raw)
    except (ValueError, RecursionError) as e:     # UnicodeDecodeError is a ValueError; RecursionError: absurd nesting
        raise ProtocolError(400, "malformed", f"the body is not JSON ({type(e).__name__}: {e})"[:300]) from None
    if not isinstance(body, dict):
        raise ProtocolError(400, "malformed", "the body must be a JSON object")
    invalid = invalid_text(body)
    if invalid is not None:
        path, reason = invalid
        raise ProtocolError(400, "invalid_text", f"{shown_path(path)}: {reason}")
    if body.get("v") != VERSION:
        raise ProtocolError(400, "version", f"unsupported protocol version {show(body.get('v'))} "
                                            f"(this server speaks {VERSION})")
    return body


def _int_list(body: dict, name: str) -> list[int]:
    value = body.get(name)
    if not isinstance(value, list) or not all(type(x) is int for x in value):
        raise ProtocolError(400, "malformed", f"{name!r} must be a list of integers")
    return value


def _check_vocab(tokens: list[int], vocab_size: int, what: str) -> None:
    for i, t in enumerate(tokens):
        if not 0 <= t < vocab_size:
            raise ProtocolError(422, "token_out_of_vocabulary",
                                f"{what}[{i}] = {show(t)} is outside the vocabulary (0..{vocab_size - 1})")


def _number(sampling: dict, name: str, default: float) -> float:
    """A sampling setting as a float; anything that is not a finite JSON number is a 422
    (the ranges themselves are SamplingParams's)."""
    value = sampling.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(422, "bad_sampling", f"{name} must be a number, got {show(value)}")
    try:
        value = float(value)                     # an integer too large for a float: OverflowError
    except OverflowError:
        raise ProtocolError(422, "bad_sampling", f"{name} = {show(value)} is out of range") from None
    if not math.isfinite(value):
        raise ProtocolError(422, "bad_sampling", f"{name} must be finite, got {value!r}")
    return value


def parse_open(body: dict, vocab_size: int, limits: Limits, max_context: int) -> OpenRequest:
    prompt = _int_list(body, "prompt")
    if not prompt:
        raise ProtocolError(422, "empty_prompt", "the prompt is empty (0 tokens)")
    _check_vocab(prompt, vocab_size, "prompt")
    cap = min(limits.max_session_tokens, max_context)
    if len(prompt) + 1 > cap:
        raise ProtocolError(422, "context_limit", f"a prompt of {len(prompt)} tokens leaves no room in a session "
                                                  f"of at most {cap} tokens")
    sampling = body.get("sampling", {})
    if not isinstance(sampling, dict) or set(sampling) - {"temperature", "top_p", "top_k"}:
        raise ProtocolError(400, "malformed", "'sampling' must be an object with temperature, top_p, top_k")
    try:
        params = SamplingParams(_number(sampling, "temperature", 0.0), _number(sampling, "top_p", 1.0),
                                sampling.get("top_k", 0))
    except (TypeError, ValueError) as e:
        raise ProtocolError(422, "bad_sampling", str(e)[:200]) from None
    seed = body.get("seed")
    if seed is not None:
        try:
            SamplingParams(seed=seed)                 # the seed range is SamplingParams's
        except ValueError:
            raise ProtocolError(422, "bad_seed", f"seed must be an integer in 0..2**63-1, got {show(seed)}") from None
    open_id = body.get("open_id")
    if open_id is not None and (not isinstance(open_id, str) or not 0 < len(open_id) <= 64):
        raise ProtocolError(400, "malformed", "'open_id' must be a string of 1 to 64 characters")
    return OpenRequest(prompt, params, seed, open_id)


def parse_round(body: dict, vocab_size: int, limits: Limits) -> RoundRequest:
    number = body.get("round")
    if type(number) is not int or not 0 <= number <= MAX_ROUND:
        raise ProtocolError(400, "malformed", f"'round' must be an integer in 0..2**63-1, got {show(number)}")
    tokens, parents = _int_list(body, "tokens"), _int_list(body, "parents")
    if len(tokens) != len(parents):
        raise ProtocolError(400, "malformed", f"{len(tokens)} tokens but {len(parents)} parents")
    if not tokens:
        raise ProtocolError(422, "empty_tree", "the tree is empty (it needs at least its root)")
    if len(tokens) > limits.max_tree_nodes:
        raise ProtocolError(422, "tree_too_large", f"a tree of {len(tokens)} nodes is over this server's cap of "
                                                   f"{limits.max_tree_nodes} (root included)")
    _check_vocab(tokens, vocab_size, "tokens")
    if parents[0] != -1:
        raise ProtocolError(422, "bad_parents", f"node 0 is the root: its parent must be -1, got {show(parents[0])}")
    for i in range(1, len(parents)):
        if not 0 <= parents[i] < i:
            raise ProtocolError(422, "bad_parents", f"node {i}: parent {show(parents[i])} is not before it")
    return RoundRequest(number, tokens, parents)

"""Fuzzing the verifier server's protocol (issues 12 and 35: 2,000 requests, no 5xx).

A seeded mutation fuzzer sends requests -- opens, rounds and closes with
fields (and field names) replaced by hostile values, text that is not
Unicode (unpaired surrogate escapes, raw encoded surrogates, overlong and
invalid UTF-8) and NUL characters, raw numbers JSON cannot round-trip
(1e400, NaN, 400-digit integers), truncated or corrupted bodies, odd
methods, paths, content types and tokens (any header bytes) -- and a
property-based test (hypothesis) sends arbitrary JSON as sampling settings,
prompts and trees.  Every answer must be a 2xx or a 4xx with a JSON error,
nothing may hang, nothing may be logged as an internal error, the process's
resident memory must stay flat, and afterwards a greedy session gives
exactly the tokens of the plain autoregressive loop (`lever generate`'s).
Loopback only; each request has a 10 s socket timeout (a safety net, tests/waiting.py).

The default run sends FUZZ_REQUESTS (300; $LEVER_FUZZ_REQUESTS sets it);
the full-size run, 2,000 (or $LEVER_FUZZ_REQUESTS if larger), is marked slow.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import random
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lever.autoregressive import generate_tokens
from lever.remote.protocol import Limits
from lever.remote.server import ServerThread, VerifierServer
from test_remote import TOKEN, Raw
from waiting import deadline

FUZZ_REQUESTS = int(os.environ.get("LEVER_FUZZ_REQUESTS", "300"))
FULL_REQUESTS = max(2000, FUZZ_REQUESTS)
VOCAB = 20
BAD_TEXT = ["\ud800", "a\udfffb", "\udc80", "x\ud83d", "\udfff\ud800", "\x00", "a\x00b", "\ud83d\ude00"]
"""Strings json.dumps writes as escapes: unpaired surrogates, NULs (valid), and a valid pair."""
BAD_BYTES = [b"\xed\xa0\x80", b"a\xed\xbf\xbfb", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xf4\x90\x80\x80",
             b"\xff", b"\xfe\xff", b"\x80", b"ab\xc3", b"\x00", b"\\u0000", b"\xef\xbb\xbf"]
"""Raw string contents that are not UTF-8 (encoded surrogates, overlong forms, code points past U+10FFFF,
stray bytes, a cut sequence), a raw NUL (not JSON), an escaped NUL and a stray byte-order mark."""
BYTES = "@@BYTES@@"
NASTY = [None, True, False, 0, -1, 1, 7, 19, 20, 2 ** 31, 2 ** 63, 2 ** 64, -(2 ** 63), 10 ** 30, 1.5, -0.0, 1e308,
         -1e308, 5e-324, "", "x", "1", "0.5", "\u00e9" * 8, "\x00", [], {}, [[]], {"a": 1}, [1] * 300,
         list(range(-3, 30)), [-1], [0.5], ["1"], [None], [True], *BAD_TEXT, BYTES, BYTES, [BYTES], {BAD_TEXT[0]: 1}]
RAW_NUMBERS = ["1e400", "-1e400", "1e-400", "NaN", "Infinity", "-Infinity", "1" + "0" * 400, "-" + "9" * 300,
               "1E+999", "0.0000000000000000000000001"]
PLACEHOLDER = "@@RAW@@"
TOKENS = [TOKEN.encode(), b"", b"wrong", b"\xff\xfe\xfd", "t\u00f6ken".encode(), TOKEN.encode() + b"\x80",
          b"\x01\x02", b"a" * 4000, TOKEN.encode().upper(), b" " + TOKEN.encode()]


@pytest.fixture(scope="module")
def fuzz_server(tiny_pair):
    lines: list[str] = []
    limits = Limits(max_sessions=4, max_session_tokens=64, max_tree_nodes=8, idle_ttl_s=60, max_body_bytes=8192,
                    prefill_chunk=8)
    server = VerifierServer(tiny_pair[0], "tiny", limits, token=TOKEN, log=lines.append)
    with ServerThread(server) as running:
        yield running, lines


def greedy_tokens(raw: Raw, prompt: list[int], rounds: int = 8) -> list[int]:
    """The tokens a greedy session commits over `rounds` one-node rounds."""
    sid = raw.open(prompt)
    root, out = prompt[-1], []
    for r in range(rounds):
        status, body, _ = raw.round(sid, r, [root], [-1])
        assert status == 200, body
        root = body["next"]
        out.append(root)
    assert raw("DELETE", f"/v1/sessions/{sid}")[0] == 200
    return out


# -- the mutation fuzzer ------------------------------------------------------------------------

def random_value(rng: random.Random):
    """A hostile value (a copy: mutations must not change NASTY) or the raw-number placeholder."""
    return copy.deepcopy(rng.choice(NASTY)) if rng.random() < 0.8 else PLACEHOLDER


def valid_open(rng: random.Random) -> dict:
    body = {"prompt": [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))]}
    if rng.random() < 0.5:
        body["sampling"] = {"temperature": rng.choice([0, 0.001, 0.7, 1.0, 100.0]),
                            "top_p": rng.choice([1e-6, 0.5, 0.95, 1]), "top_k": rng.choice([0, 1, 5, 50])}
    if rng.random() < 0.5:
        body["seed"] = rng.randrange(2 ** 63)
    if rng.random() < 0.3:
        body["open_id"] = f"fz{rng.randrange(50)}" if rng.random() < 0.8 else rng.choice(BAD_TEXT + [BYTES])
    return body


def valid_round(rng: random.Random, root: int) -> dict:
    n = rng.randint(1, 8)
    tokens = [root] + [rng.randrange(VOCAB) for _ in range(n - 1)]
    parents = [-1] + [rng.randrange(i) for i in range(1, n)]
    return {"round": rng.randint(0, 3), "tokens": tokens, "parents": parents}


def mutate(body: dict, rng: random.Random) -> dict:
    """Replace, drop or add a field, maybe one level down."""
    body = json.loads(json.dumps(body))
    for _ in range(rng.randint(0, 3)):
        target = body
        if isinstance(body.get("sampling"), dict) and rng.random() < 0.4:
            target = body["sampling"]
        keys = list(target) + ["v", "extra", "open_id", rng.choice(BAD_TEXT)]
        key = rng.choice(keys)
        choice = rng.random()
        if choice < 0.6:
            target[key] = random_value(rng)
        elif choice < 0.8:
            target.pop(key, None)
        elif isinstance(target.get(key), list) and target[key]:
            target[key][rng.randrange(len(target[key]))] = random_value(rng)
    return body


def with_raw_values(text: str, rng: random.Random) -> bytes:
    """JSON text as bytes, with raw numbers and raw string bytes (RAW_NUMBERS,
    BAD_BYTES) in place of the placeholders random_value put there."""
    while f'"{PLACEHOLDER}"' in text:
        text = text.replace(f'"{PLACEHOLDER}"', rng.choice(RAW_NUMBERS), 1)
    data = text.encode()
    while BYTES.encode() in data:
        data = data.replace(BYTES.encode(), rng.choice(BAD_BYTES), 1)
    return data


def damaged(data: bytes, roll: float, rng: random.Random, edges: tuple[float, float, float, float]) -> bytes | None:
    """`data` cut short, with a byte changed, replaced by deep nesting or by
    noise, as `roll` falls below each of `edges` in turn; None above them."""
    cut, flip, nest, noise = edges
    if roll < cut:
        return data[:rng.randrange(len(data) + 1)]
    if roll < flip:
        i = rng.randrange(len(data))
        return data[:i] + bytes([rng.randrange(256)]) + data[i + 1:]
    if roll < nest:
        return b"[" * rng.randint(100, 5000) + b"]" * rng.randint(0, 10)
    if roll < noise:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
    return None


def serialize(body: dict, rng: random.Random) -> bytes:
    """JSON text with a raw number in place of the placeholder, sometimes corrupted."""
    data = with_raw_values(json.dumps({"v": 1, **body} if "v" not in body or rng.random() < 0.5 else body), rng)
    roll = rng.random()
    bad = damaged(data, roll, rng, (0.05, 0.10, 0.12, 0.14))
    if bad is not None:
        return bad
    if roll < 0.15:
        return b'{"v": 1, "prompt": [' + b"1," * 5000 + b"1]}"          # over the body limit
    return data


class KeepAliveClient:
    """Requests over one keep-alive connection to 127.0.0.1:`port`, reopened
    when the server closes it; `timeout_s`: one exchange's safety net (scaled)."""

    def __init__(self, port: int, timeout_s: float):
        self.port, self.timeout_s = port, timeout_s
        self.conn: http.client.HTTPConnection | None = None
        self.failures: list[tuple] = []
        self.statuses: Counter = Counter()
        self.codes: Counter = Counter()               # the error codes answered

    def exchange(self, method: str, path: str, payload: bytes | None, headers: dict) -> tuple[int, bytes] | None:
        """(status, body) of one request, its status counted; None when there is
        nothing more to check: no answer or a 5xx (both failures), or a HEAD."""
        shown = payload[:200] if payload else None
        try:
            status, data = self.send(method, path, payload, headers)
        except (OSError, http.client.HTTPException) as e:
            self.failures.append((method, path, shown, "no answer", repr(e)))
            return None
        self.statuses[status] += 1
        if status >= 500:
            self.failures.append((method, path, shown, status, data[:300]))
            return None
        return None if method == "HEAD" else (status, data)

    def json_answer(self, method: str, path: str, payload: bytes | None, status: int, data: bytes):
        """(whether the answer is well formed, its JSON value or None): an error
        status must come with a JSON error object (its code is counted), except
        aiohttp's plain-text 400 for what is not even HTTP."""
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            answer = None
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
            self.codes[answer["error"].get("code")] += 1
        if status >= 400 and not (isinstance(answer, dict) and "error" in answer) and \
                not (status == 400 and answer is None):
            self.failures.append((method, path, payload[:200] if payload else None, status, "no JSON error",
                                  data[:300]))
            return False, answer
        return True, answer

    def send(self, method: str, path: str, payload: bytes | None, headers: dict) -> tuple[int, bytes]:
        for attempt in (1, 2):                   # a keep-alive connection the server closed: once more
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=deadline(self.timeout_s))
            try:
                self.conn.request(method, path, body=payload, headers=headers)
                resp = self.conn.getresponse()
                data = resp.read()
                if resp.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return resp.status, data
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


class Fuzzer(KeepAliveClient):
    def __init__(self, port: int, seed: int):
        super().__init__(port, timeout_s=10)
        self.rng = random.Random(seed)
        self.sessions: dict[str, int | None] = {}     # sid -> its root (as far as we know)
        self.rounds: dict[str, int] = {}              # sid -> its next round number

    def headers(self) -> dict:
        rng = self.rng
        h = {}
        roll = rng.random()
        if roll < 0.85:
            h["Authorization"] = b"Bearer " + TOKEN.encode()
        elif roll < 0.97:
            h["Authorization"] = rng.choice([b"Bearer ", b"bearer ", b"Basic ", b""]) + rng.choice(TOKENS)
        if rng.random() < 0.1:
            h["Content-Type"] = rng.choice([b"text/plain", b"application/json; charset=\xff", b"", b"x" * 500])
        if rng.random() < 0.05:
            h["X-Junk"] = bytes(rng.randrange(32, 256) for _ in range(rng.randint(0, 300)))
        return h

    def one(self) -> None:
        rng = self.rng
        roll = rng.random()
        sid = rng.choice(list(self.sessions)) if self.sessions and rng.random() < 0.8 else \
            rng.choice(["nope", "..%2F..", "a" * 300, "%00", "%C3%A9%ff"])
        if roll < 0.35:
            method, path = "POST", "/v1/sessions"
            body = valid_open(rng)
        elif roll < 0.80:
            method, path = "POST", f"/v1/sessions/{sid}/rounds"
            root = self.sessions.get(sid)
            body = valid_round(rng, root if root is not None else rng.randrange(VOCAB))
            body["round"] = self.rounds.get(sid, 0) if rng.random() < 0.7 else body["round"]
        elif roll < 0.90:
            method, path, body = "DELETE", f"/v1/sessions/{sid}", None
        else:
            method = rng.choice(["GET", "PUT", "PATCH", "OPTIONS", "HEAD", "POST", "DELETE"])
            path = rng.choice(["/", "/v1", "/v1/info", "/v1/metrics", "/v1/health", "/v1/sessions/", "/v2/sessions",
                               "/v1/sessions/x/rounds/y", "/v1/sessions?x=%ff", "/" + "a" * 2000])
            body = valid_open(rng) if rng.random() < 0.5 else None
        if body is not None and rng.random() < 0.6:
            body = mutate(body, rng)
        payload = serialize(body, rng) if body is not None else None
        answered = self.exchange(method, path, payload, self.headers())
        if answered is None:
            return
        status, data = answered
        ok, answer = self.json_answer(method, path, payload, status, data)
        if not ok:
            return
        if status in (200, 201) and path == "/v1/sessions" and method == "POST":
            self.sessions[answer["session"]] = json.loads(payload)["prompt"][-1]
        elif status == 200 and path.endswith("/rounds"):
            self.sessions[sid], self.rounds[sid] = answer["next"], answer["round"] + 1
        elif status in (200, 404) and method == "DELETE":
            self.sessions.pop(sid, None)
        if len(self.sessions) >= 4 and rng.random() < 0.5:    # free a slot now and then
            victim = rng.choice(list(self.sessions))
            self.send("DELETE", f"/v1/sessions/{victim}", None, {"Authorization": f"Bearer {TOKEN}"})
            self.sessions.pop(victim, None)


def drive(fuzzer, n_requests: int) -> tuple[float, int, float, float]:
    """Send `n_requests` of `fuzzer`'s requests: (seconds, the warm-up requests,
    RSS MB after them, RSS MB at the end); the first tenth warms caches and
    pools before RSS is read."""
    warm = max(1, n_requests // 10)
    t0 = time.monotonic()
    for _ in range(warm):
        fuzzer.one()
    rss_before = rss_mb()
    for _ in range(n_requests - warm):
        fuzzer.one()
    return time.monotonic() - t0, warm, rss_before, rss_mb()


def rss_mb() -> float:
    """This process's resident memory (the server runs in it), MB; 0 where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:
        return 0.0


def fuzz(fuzz_server, tiny_pair, n_requests: int, max_growth_mb: float) -> None:
    running, lines = fuzz_server
    raw = Raw(running.url, TOKEN)
    prompt = [3, 1, 4, 1, 5]
    reference = generate_tokens(tiny_pair[0], prompt, 8).token_ids      # the plain loop: `lever generate`'s tokens
    assert greedy_tokens(raw, prompt) == reference
    fuzzer = Fuzzer(running.port, seed=12)
    elapsed, warm, rss_before, rss_after = drive(fuzzer, n_requests)
    for sid in list(running.server.sessions):          # the fuzzer's sessions, some it lost track of
        raw("DELETE", f"/v1/sessions/{sid}")
    rss_after = rss_mb()
    print(f"{n_requests} fuzzed requests in {elapsed:.1f} s; statuses {sorted(fuzzer.statuses.items())}; "
          f"{fuzzer.codes['invalid_text']} invalid_text; RSS {rss_before:.1f} MB after {warm} requests, "
          f"{rss_after:.1f} MB at the end")
    assert not fuzzer.failures, fuzzer.failures[:5]
    assert sum(fuzzer.statuses.values()) == n_requests
    explored = {200, 201, 400, 401, 403, 404, 409, 422} if n_requests >= 1000 else {200, 201, 400, 404, 422}
    assert explored <= set(fuzzer.statuses), fuzzer.statuses
    assert fuzzer.codes["invalid_text"] > 0, fuzzer.codes                # bodies that are not Unicode were sent
    assert not [line for line in lines if "internal error" in line or "Traceback" in line], lines[:5]
    metrics = raw("GET", "/v1/metrics")[1]
    assert not [code for code in metrics["statuses"] if code.startswith("5")], metrics["statuses"]
    assert rss_after - rss_before < max_growth_mb, (rss_before, rss_after)
    # alive and exact: the plain loop's greedy tokens after the storm
    assert greedy_tokens(raw, prompt) == reference


def test_fuzzed_requests_get_no_5xx(fuzz_server, tiny_pair):
    fuzz(fuzz_server, tiny_pair, FUZZ_REQUESTS, max_growth_mb=64)


@pytest.mark.slow
def test_two_thousand_fuzzed_requests_get_no_5xx_and_rss_stays_flat(fuzz_server, tiny_pair):
    fuzz(fuzz_server, tiny_pair, FULL_REQUESTS, max_growth_mb=32)


@pytest.mark.parametrize("payload, field", [
    (b'{"v": 1, "prompt": [1, 2], "open_id": "\\ud800"}', "open_id"),
    (b'{"v": 1, "prompt": [1, 2], "open_id": "a\\udfffb"}', "open_id"),
    (b'{"v": 1, "prompt": [1, 2], "open_id": "\xed\xa0\x80"}', "open_id"),
    (b'{"v": 1, "prompt": [1, 2], "open_id": "\xc0\xaf"}', "open_id"),
    (b'{"v": 1, "prompt": [1, 2], "sampling": {"\\udc00": 1}}', "sampling"),
    (b'{"v": 1, "prompt": [1, 2], "x": ["ok", "\xff"]}', "x[1]"),
])
def test_text_that_is_not_unicode_is_a_400_naming_its_field(fuzz_server, payload, field):
    running, lines = fuzz_server
    status, answer, _ = Raw(running.url, TOKEN)("POST", "/v1/sessions", raw=payload)
    assert status == 400, answer
    message = answer["error"]["message"]
    assert answer["error"]["code"] == "invalid_text"
    assert message.startswith(f"{field}: ") and "is not valid Unicode text" in message and "\n" not in message


def test_an_escaped_nul_is_text(fuzz_server):
    running, _ = fuzz_server
    raw = Raw(running.url, TOKEN)
    status, answer, _ = raw("POST", "/v1/sessions", {"prompt": [1, 2], "open_id": "a\x00b"})
    assert status == 201, answer
    assert raw("DELETE", f"/v1/sessions/{answer['session']}")[0] == 200


# -- property-based: arbitrary JSON where the protocol expects numbers and lists ----------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 30), max_value=10 ** 30) |
    st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=20)


def check_answer(raw: Raw, method: str, path: str, body: dict) -> int:
    payload = json.dumps({"v": 1, **body}, allow_nan=True).encode()
    status, answer, _ = raw(method, path, raw=payload)
    assert status < 500, (path, body, answer)
    assert status < 400 or "error" in answer
    return status


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(temperature=JSON_VALUES, top_p=JSON_VALUES, top_k=JSON_VALUES, seed=JSON_VALUES, prompt=JSON_VALUES)
def test_any_json_in_an_open_is_not_a_5xx(fuzz_server, temperature, top_p, top_k, seed, prompt):
    running, lines = fuzz_server
    raw = Raw(running.url, TOKEN)
    body = {"prompt": prompt if isinstance(prompt, list) else [1, 2], "seed": seed,
            "sampling": {"temperature": temperature, "top_p": top_p, "top_k": top_k}}
    check_answer(raw, "POST", "/v1/sessions", body)
    for s in list(running.server.sessions):            # keep the slots free
        raw("DELETE", f"/v1/sessions/{s}")


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(number=JSON_VALUES, tokens=JSON_VALUES, parents=JSON_VALUES)
def test_any_json_in_a_round_is_not_a_5xx(fuzz_server, number, tokens, parents):
    running, lines = fuzz_server
    raw = Raw(running.url, TOKEN)
    if not running.server.sessions:
        raw.open([1, 2])
    sid = next(iter(running.server.sessions))
    check_answer(raw, "POST", f"/v1/sessions/{sid}/rounds", {"round": number, "tokens": tokens, "parents": parents})
    assert not [line for line in lines if "internal error" in line]

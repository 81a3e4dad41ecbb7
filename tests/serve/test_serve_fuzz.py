"""Fuzzing `lever serve` (issue 35's bar: 5,000 requests, no 5xx).

A seeded mutation fuzzer sends chat and completion requests whose fields
(and field names, message parts, stop lists) are replaced by hostile values:
text that is not Unicode -- unpaired surrogate escapes ("\\ud800",
"a\\udfffb"), raw encoded surrogates (ED A0 80), overlong and invalid UTF-8
(C0 AF, FF) -- NUL characters, wrong types, raw numbers JSON cannot
round-trip, truncated or corrupted bodies, odd methods, paths, content types
and tokens.  Every answer must be a 2xx or a 4xx with OpenAI's JSON error
(a stream may not carry an error either), nothing may be logged as an
internal error or a traceback, the process's resident memory must stay flat,
and afterwards a greedy chat completion is token-identical to `lever
generate`.  SmolLM2-135M behind a bearer token, --max-tokens 4, loopback.

The default run sends FUZZ_REQUESTS (300; $LEVER_FUZZ_REQUESTS sets it);
the full-size run, 5,000 (or $LEVER_FUZZ_REQUESTS if larger), is marked slow.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import random

import pytest

pytest.importorskip("aiohttp")

from lever.cli import build_parser  # noqa: E402
from lever.commands.serve import build_server  # noqa: E402
from lever.serve.site import serve_thread  # noqa: E402
from test_server_fuzz import (BAD_TEXT, BYTES, PLACEHOLDER, KeepAliveClient, damaged, drive,  # noqa: E402
                              with_raw_values)
from test_serve import NAME, TOKEN, lever_generate  # noqa: E402
from waiting import deadline  # noqa: E402

FUZZ_REQUESTS = int(os.environ.get("LEVER_FUZZ_REQUESTS", "300"))
FULL_REQUESTS = max(5000, FUZZ_REQUESTS)
MAX_TOKENS = 4
NASTY = [None, True, False, 0, -1, 1, 2, 3, 4, 5, 2 ** 31, 2 ** 63, 2 ** 64, -(2 ** 63), 1.5, -0.0, 1e308, 5e-324,
         "", "x", "hi", "user", "system", "text", NAME, "gpt-4o", "\u00e9" * 8, "\U0001F600", "\x00", [], {}, [[]],
         {"a": 1}, {"type": "text", "text": "hi"}, [{"type": "text", "text": "\ud800"}], ["a", "b"], [1, 2, 3],
         [-1], ["\x00"], *BAD_TEXT, BYTES, BYTES, BYTES, [BYTES], {BAD_TEXT[0]: 1}, {"include_usage": True}]
PATHS = ["/", "/v1", "/v1/models", "/health", "/metrics", "/v1/chat/completions/x", "/v2/completions",
         "/v1/completions?x=%ff", "/v1/chat/completions%ED%A0%80", "/" + "a" * 2000]
TOKENS = [TOKEN.encode(), b"", b"wrong", b"\xff\xfe", "t\u00f6ken".encode(), TOKEN.encode() + b"\x80", b"\xed\xa0\x80"]


@pytest.fixture(scope="module")
def fuzz_site(smollm2_path, lever_cache, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("serve-fuzz") / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    lines: list[str] = []
    args = build_parser().parse_args(["serve", "--model", str(smollm2_path), "--model-name", NAME,
                                      "--cache-dir", str(lever_cache), "--token-file", str(token_file),
                                      "--max-tokens", str(MAX_TOKENS), "--max-body-bytes", "16384",
                                      "--max-queue", "4"])
    server, _ = build_server(args, say=lines.append)
    site = serve_thread(server).start()
    yield server, site, lines
    site.stop()


def random_value(rng: random.Random):
    return copy.deepcopy(rng.choice(NASTY)) if rng.random() < 0.85 else PLACEHOLDER


def text(rng: random.Random) -> str:
    return rng.choice(["hi", "Name a colour.", "2+2=", "a\x00b", "\u00e9t\u00e9", "\U0001F600 ok", "x" * 40])


def valid_chat(rng: random.Random) -> dict:
    messages = []
    for i in range(rng.randint(1, 3)):
        content = text(rng) if rng.random() < 0.7 else [{"type": "text", "text": text(rng)}
                                                          for _ in range(rng.randint(1, 2))]
        messages.append({"role": rng.choice(["system", "user", "assistant"]) if i else "user", "content": content})
    return {"model": NAME, "messages": messages, **common(rng)}


def valid_completion(rng: random.Random) -> dict:
    prompt = text(rng) if rng.random() < 0.7 else [rng.randrange(49152) for _ in range(rng.randint(1, 8))]
    return {"model": NAME, "prompt": prompt, **common(rng)}


def common(rng: random.Random) -> dict:
    body = {}
    if rng.random() < 0.7:
        body["max_tokens"] = rng.randint(1, MAX_TOKENS)
    if rng.random() < 0.4:
        body["temperature"] = rng.choice([0, 0.7, 1.0])
        body["top_p"] = rng.choice([0.5, 0.95, 1])
        body["top_k"] = rng.choice([0, 5, 50])
        body["seed"] = rng.randrange(1 << 32)
    if rng.random() < 0.3:
        body["stop"] = rng.choice(["\n", ["a", "b"], "the", ["\x00"]])
    if rng.random() < 0.3:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    if rng.random() < 0.2:
        body["return_token_ids"] = True
    if rng.random() < 0.1:
        body["user"] = "fuzzer"
    return body


def containers(body: dict) -> list:
    """The objects and lists inside `body` a mutation may change (the body itself included)."""
    out, stack = [], [body]
    while stack:
        item = stack.pop()
        out.append(item)
        children = item.values() if isinstance(item, dict) else item
        stack.extend(c for c in children if isinstance(c, (dict, list)))
    return out


def mutate(body: dict, rng: random.Random) -> dict:
    """Replace, drop or add a field or a list item, at any depth."""
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        target = rng.choice(containers(body))
        if isinstance(target, dict):
            key = rng.choice(list(target) + ["extra", "messages", "prompt", "stop", "user", rng.choice(BAD_TEXT)])
            if rng.random() < 0.8:
                target[key] = random_value(rng)
            else:
                target.pop(key, None)
        elif target and rng.random() < 0.8:
            target[rng.randrange(len(target))] = random_value(rng)
        else:
            target.append(random_value(rng))
    return body


def serialize(body: dict, rng: random.Random) -> bytes:
    """JSON with raw numbers and raw string bytes in place of the placeholders, sometimes corrupted."""
    data = with_raw_values(json.dumps(body), rng)
    roll = rng.random()
    bad = damaged(data, roll, rng, (0.04, 0.08, 0.10, 0.11))
    if bad is not None:
        return bad
    if 0.11 <= roll < 0.12:
        return b'{"prompt": "' + b"a" * 20000 + b'"}'            # over the body limit
    if 0.12 <= roll < 0.13:
        return "\ufeff".encode() + data                         # a byte-order mark
    if 0.13 <= roll < 0.14:
        return json.dumps(body).encode("utf-16")                 # JSON may come as UTF-16
    return data


class Fuzzer(KeepAliveClient):
    def __init__(self, port: int, seed: int):
        super().__init__(port, timeout_s=60)
        self.rng = random.Random(seed)

    def headers(self) -> dict:
        rng = self.rng
        h = {"Content-Type": "application/json"}
        roll = rng.random()
        if roll < 0.9:
            h["Authorization"] = b"Bearer " + TOKEN.encode()
        elif roll < 0.98:
            h["Authorization"] = rng.choice([b"Bearer ", b"bearer ", b"Basic ", b""]) + rng.choice(TOKENS)
        if rng.random() < 0.05:
            h["Content-Type"] = rng.choice([b"text/plain", b"application/json; charset=\xff", b"", b"x" * 500])
        return h

    def one(self) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.5:
            method, path, body = "POST", "/v1/chat/completions", valid_chat(rng)
        elif roll < 0.9:
            method, path, body = "POST", "/v1/completions", valid_completion(rng)
        else:
            method = rng.choice(["GET", "PUT", "DELETE", "OPTIONS", "HEAD", "POST"])
            path = rng.choice(PATHS)
            body = valid_chat(rng) if rng.random() < 0.5 else None
        if body is not None and rng.random() < 0.75:
            body = mutate(body, rng)
        payload = serialize(body, rng) if body is not None else None
        answered = self.exchange(method, path, payload, self.headers())
        if answered is None:
            return
        status, data = answered
        if data.startswith(b"data: "):                       # a stream: no event may be an error
            errors = [e for e in data.split(b"\n\n") if e.startswith(b"data: {") and b'"error"' in e]
            self.failures += [(method, path, payload and payload[:200], status, "an error in the stream", e[:300])
                              for e in errors]
            return
        self.json_answer(method, path, payload, status, data)


def chat_ids(port: int, prompt: str, n: int) -> list[int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline(120))
    body = {"model": NAME, "messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0,
            "return_token_ids": True}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    resp = conn.getresponse()
    answer = json.loads(resp.read())
    conn.close()
    assert resp.status == 200, answer
    return answer["choices"][0]["token_ids"]


def fuzz(fuzz_site, smollm2_path, lever_cache, n_requests: int, max_growth_mb: float) -> None:
    server, site, lines = fuzz_site
    prompt = "Name three colours."
    reference = lever_generate(smollm2_path, lever_cache, prompt, MAX_TOKENS)["token_ids"]
    assert chat_ids(site.port, prompt, MAX_TOKENS) == reference
    fuzzer = Fuzzer(site.port, seed=35)
    elapsed, warm, rss_before, rss_after = drive(fuzzer, n_requests)
    print(f"{n_requests} fuzzed requests to lever serve in {elapsed:.1f} s; statuses "
          f"{sorted(fuzzer.statuses.items())}; {fuzzer.codes['invalid_text']} invalid_text; "
          f"RSS {rss_before:.1f} MB after {warm} requests, "
          f"{rss_after:.1f} MB at the end")
    assert not fuzzer.failures, fuzzer.failures[:5]
    assert sum(fuzzer.statuses.values()) == n_requests
    assert {200, 400, 401, 422} <= set(fuzzer.statuses), fuzzer.statuses          # it explored
    assert fuzzer.codes["invalid_text"] > 0, fuzzer.codes                          # text that is not Unicode was sent
    assert not [line for line in lines if "internal error" in line or "Traceback" in line
                or "failed" in line], lines[:5]
    assert not [key for key in server.http.requests if key[1] >= 500], server.http.requests   # /metrics's count too
    assert rss_after - rss_before < max_growth_mb, (rss_before, rss_after)
    assert chat_ids(site.port, prompt, MAX_TOKENS) == reference                   # alive and exact


def test_fuzzed_requests_to_lever_serve_get_no_5xx(fuzz_site, smollm2_path, lever_cache):
    fuzz(fuzz_site, smollm2_path, lever_cache, FUZZ_REQUESTS, max_growth_mb=64)


@pytest.mark.slow
def test_five_thousand_fuzzed_requests_get_no_5xx_and_rss_stays_flat(fuzz_site, smollm2_path, lever_cache):
    fuzz(fuzz_site, smollm2_path, lever_cache, FULL_REQUESTS, max_growth_mb=32)


@pytest.mark.parametrize("path, payload, field", [
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}', "messages[0].content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}', "messages[0].content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\xc0\xaf"}]}]}',
     "messages[0].content[0].text"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "stop": ["a", "\\udc00"]}', "stop[1]"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "model": "\xff"}', "model"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "user": "\xe0\x80\xaf"}', "user"),
    ("/v1/completions", b'{"prompt": "\\ud800"}', "prompt"),
    ("/v1/completions", b'{"prompt": ["a\\udfffb"]}', "prompt[0]"),
    ("/v1/completions", b'{"prompt": "\xed\xa0\x80"}', "prompt"),
    ("/v1/completions", b'{"prompt": "x", "\\ud800": 1}', "(the body)"),
])
def test_text_that_is_not_unicode_is_a_400_naming_its_field(fuzz_site, path, payload, field):
    server, site, lines = fuzz_site
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=deadline(60))
    conn.request("POST", path, body=payload, headers={"Authorization": f"Bearer {TOKEN}"})
    resp = conn.getresponse()
    answer = json.loads(resp.read())
    conn.close()
    assert resp.status == 400, answer
    err = answer["error"]
    assert (err["code"], err["param"], err["type"]) == ("invalid_text", field, "invalid_request_error")
    assert err["message"].startswith(f"{field}: is not valid Unicode text") or \
        err["message"].startswith(f"{field}: has a field name that is not valid Unicode text"), err["message"]


def test_nul_characters_are_text(fuzz_site):
    server, site, lines = fuzz_site
    assert chat_ids(site.port, "a\x00b", 2)

"""`lever serve` through the official `openai` client, as a user runs it:
greedy output token-identical to `lever generate`, streaming, cancellation
on disconnect, the FIFO queue under load, 429, bad requests, /metrics.

Servers are built from `lever serve` command lines and run in-process on
a free port (lever.serve.site.serve_thread)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")

from lever.cli import build_parser  # noqa: E402
from lever.commands.serve import build_server  # noqa: E402
from lever.serve.site import serve_thread  # noqa: E402
from waiting import deadline, read_line, wait_exit, wait_until  # noqa: E402

NAME = "smollm2-135m"
TOKEN = "serve-test-token-0123456789abcdef"
COUNTING = "Count: 1, 2, 3, 4,"          # a prompt SmolLM2 continues for hundreds of tokens


def start(smollm2_path, lever_cache, *extra):
    args = build_parser().parse_args(["serve", "--model", str(smollm2_path), "--model-name", NAME,
                                      "--cache-dir", str(lever_cache), *extra])
    server, _ = build_server(args)
    return server, serve_thread(server).start()


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def ar_server(smollm2_path, lever_cache, token_file):
    """The target alone (mode ar), behind a bearer token."""
    server, site = start(smollm2_path, lever_cache, "--token-file", str(token_file), "--max-tokens", "2048")
    yield server, site
    site.stop()


@pytest.fixture(scope="module")
def tree_server(smollm2_path, lever_cache):
    """Speculative: the model drafts for itself in mode tree (its top path is always accepted)."""
    server, site = start(smollm2_path, lever_cache, "--draft", str(smollm2_path), "--mode", "tree",
                         "--tree-budget", "8", "--tree-depth", "4")
    yield server, site
    site.stop()


def client(site, token=TOKEN, **kw) -> "openai.OpenAI":
    return openai.OpenAI(base_url=site.url + "/v1", api_key=token, max_retries=0, timeout=deadline(60), **kw)


def lever_generate(smollm2_path, lever_cache, prompt: str, max_new: int, *extra) -> dict:
    """`lever generate --json`: what the server must reproduce."""
    out = subprocess.run([sys.executable, "-m", "lever.cli", "generate", "--model", str(smollm2_path),
                          "--cache-dir", str(lever_cache), "--prompt", prompt, "--max-new-tokens", str(max_new),
                          "--json", *extra], capture_output=True, text=True, timeout=deadline(120))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def metrics(site) -> dict[str, float]:
    """/metrics as {'name{labels}': value}."""
    req = urllib.request.Request(site.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    text = urllib.request.urlopen(req, timeout=deadline(10)).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def wait_for(predicate, timeout_s: float = 20.0, what: str = "the condition"):
    """The first true value of predicate() (a safety net of waiting.deadline(timeout_s) s)."""
    return wait_until(predicate, timeout_s, f"waiting for {what}", interval=0.02)


def chat_stream(c, messages, max_tokens, **kw):
    """A streamed chat completion: (text, token ids, finish_reason, the final chunk's speculative, usage)."""
    text, ids, finish, spec, usage = "", [], None, None, None
    for ch in c.chat.completions.create(model=NAME, messages=messages, max_tokens=max_tokens, temperature=0,
                                        stream=True, stream_options={"include_usage": True},
                                        extra_body={"return_token_ids": True}, **kw):
        extra = ch.model_extra or {}
        if ch.choices:
            choice = ch.choices[0]
            text += choice.delta.content or ""
            ids += (choice.model_extra or {}).get("token_ids", [])
            finish = choice.finish_reason or finish
            spec = extra.get("speculative", spec)
        if ch.usage is not None:
            usage = ch.usage
    return text, ids, finish, spec, usage


# -- (1) token-identical to `lever generate` --------------------------------------------

@pytest.mark.parametrize("which", ["ar", "tree"])
def test_chat_is_token_identical_to_lever_generate(which, ar_server, tree_server, smollm2_path, lever_cache):
    server, site = ar_server if which == "ar" else tree_server
    extra = [] if which == "ar" else ["--draft", str(smollm2_path), "--mode", "tree", "--tree-budget", "8",
                                      "--tree-depth", "4"]
    prompt, n = "Name three colours.", 24
    ref = lever_generate(smollm2_path, lever_cache, prompt, n, *extra)
    c = client(site)
    whole = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": prompt}], max_tokens=n,
                                      temperature=0, extra_body={"return_token_ids": True})
    choice = whole.choices[0]
    assert choice.model_extra["token_ids"] == ref["token_ids"]
    assert choice.message.content == ref["text"]
    assert whole.usage.prompt_tokens == ref["prompt_tokens"] and whole.usage.completion_tokens == len(ref["token_ids"])
    assert choice.finish_reason == ("stop" if ref["stop_reason"] == "eos" else "length")
    spec = whole.model_extra["speculative"]
    assert spec["mode"] == which and spec["target"] == "dram" and spec["bytes_read_per_token"] is None
    if which == "ar":
        assert spec["target_passes"] == len(ref["token_ids"]) and spec["drafted"] == 0
    else:                                   # the same trees as `lever generate`'s, and most drafts accepted
        rs = ref["speculative"]
        assert (spec["target_passes"], spec["drafted"], spec["accepted"]) == \
            (rs["target_passes"], rs["draft_tokens"], rs["accepted_draft_tokens"])
        assert spec["target_passes"] < len(ref["token_ids"]) and spec["mean_accepted_length"] > 1
    text, ids, finish, spec_s, usage = chat_stream(c, [{"role": "user", "content": prompt}], n)
    assert ids == ref["token_ids"] and text == ref["text"]
    assert finish == choice.finish_reason and spec_s == spec
    assert usage.completion_tokens == len(ids) and usage.prompt_tokens == ref["prompt_tokens"]


# -- (2) /v1/completions ---------------------------------------------------------------

def test_completions_streamed_and_not(ar_server, smollm2_path, lever_cache):
    server, site = ar_server
    c = client(site)
    ref = lever_generate(smollm2_path, lever_cache, COUNTING, 12, "--no-chat")
    whole = c.completions.create(model=NAME, prompt=COUNTING, max_tokens=12, temperature=0,
                                 extra_body={"return_token_ids": True})
    assert whole.choices[0].text == ref["text"] and whole.choices[0].finish_reason == "length"
    assert whole.choices[0].model_extra["token_ids"] == ref["token_ids"]
    prompt_ids = server.generator.loaded.tokenizer.encode(COUNTING)
    by_ids = c.completions.create(model=NAME, prompt=prompt_ids, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == ref["text"]
    pieces, finish, spec = [], None, None
    for ch in c.completions.create(model=NAME, prompt=COUNTING, max_tokens=12, temperature=0, stream=True):
        pieces.append(ch.choices[0].text)
        finish = ch.choices[0].finish_reason or finish
        spec = (ch.model_extra or {}).get("speculative", spec)
    assert "".join(pieces) == ref["text"] and len([p for p in pieces if p]) > 3
    assert finish == "length" and spec["target_passes"] == 12


def test_a_stop_string_ends_the_text_before_it(ar_server):
    server, site = ar_server
    c = client(site)
    full = c.completions.create(model=NAME, prompt=COUNTING, max_tokens=12, temperature=0).choices[0].text
    assert " 7," in full
    cut = c.completions.create(model=NAME, prompt=COUNTING, max_tokens=12, temperature=0, stop=[" 7,"])
    assert cut.choices[0].text == full[:full.index(" 7,")] and cut.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=NAME, prompt=COUNTING, max_tokens=12, temperature=0, stop=" 7,", stream=True))
    assert streamed == cut.choices[0].text


def test_sampling_with_a_seed_is_lever_generate_s_sampling(ar_server):
    server, site = ar_server
    c = client(site)
    kw = dict(model=NAME, prompt=COUNTING, max_tokens=10, temperature=0.9, top_p=0.95, seed=7,
              extra_body={"top_k": 40, "return_token_ids": True})
    first, again = c.completions.create(**kw), c.completions.create(**kw)
    ids = first.choices[0].model_extra["token_ids"]
    assert again.choices[0].model_extra["token_ids"] == ids and first.model_extra["speculative"]["seed"] == 7
    loaded = server.generator.loaded
    ref = loaded.generate(COUNTING, max_new_tokens=10, temperature=0.9, top_p=0.95, top_k=40, seed=7, chat=False)
    assert ref.token_ids == ids and ref.text == first.choices[0].text


def test_a_flash_target_in_mode_chain_reports_its_reads(ar_server, smollm2_path, lever_cache, tmp_path):
    """A target streamed from a store under about half its size in DRAM, prompt-lookup drafts in chains:
    the same tokens as the target alone, and the flash bytes read per token reported."""
    from lever.store.convert import convert
    from test_lever_mode import half_budget
    store = convert(str(smollm2_path), tmp_path / "store", progress=False)
    server, site = start(smollm2_path, lever_cache, "--target-store", str(store), "--dram-budget",
                         str(half_budget(store)), "--model-name", NAME, "--draft", "ngram", "--mode", "chain", "--max-tokens", "512")
    try:
        kw = dict(model=NAME, prompt=COUNTING, max_tokens=16, temperature=0, extra_body={"return_token_ids": True})
        flash = client(site).completions.create(**kw)
        resident = client(ar_server[1]).completions.create(**kw)
    finally:
        site.stop()
    assert flash.choices[0].model_extra["token_ids"] == resident.choices[0].model_extra["token_ids"]
    spec = flash.model_extra["speculative"]
    assert spec["mode"] == "chain" and spec["draft"] == "ngram" and spec["target"] == "flash"
    assert spec["bytes_read_per_token"] > 0 and spec["accepted"] > 0
    assert spec["target_passes"] < 16


# -- (3) cancellation ------------------------------------------------------------------

def test_a_disconnect_mid_stream_stops_the_engine_and_frees_the_session(ar_server):
    server, site = ar_server
    before = metrics(site)
    c = client(site)
    stream = c.completions.create(model=NAME, prompt=COUNTING, max_tokens=2000, temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 4:
            break
    stream.close()
    after = wait_for(lambda: (m := metrics(site))['lever_serve_cancelled_generations_total{stage="running"}']
                     > before['lever_serve_cancelled_generations_total{stage="running"}'] and
                     m["lever_serve_active_generations"] == 0 and m, what="the cancellation")
    generated = after["lever_serve_tokens_generated_total"] - before["lever_serve_tokens_generated_total"]
    assert 5 <= generated < 500, generated            # stopped early, far from max_tokens
    assert after["lever_serve_sessions_freed_total"] == before["lever_serve_sessions_freed_total"] + 1
    # the engine is free: the next request is answered at once
    assert c.completions.create(model=NAME, prompt="Hi", max_tokens=2, temperature=0).usage.completion_tokens == 2


def raw_post(site, path: str, body: dict) -> socket.socket:
    """Send a request on a raw socket (to disconnect without reading the answer)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection((site.host, site.port))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def test_a_disconnect_drops_a_queued_request_and_stops_a_running_one(ar_server):
    server, site = ar_server
    before = metrics(site)
    long_request = {"model": NAME, "prompt": COUNTING, "max_tokens": 2000, "temperature": 0}
    running = raw_post(site, "/v1/completions", long_request)             # not streamed
    wait_for(lambda: metrics(site)["lever_serve_active_generations"] == 1, what="the first request to run")
    queued = raw_post(site, "/v1/completions", long_request)
    wait_for(lambda: metrics(site)["lever_serve_queue_depth"] == 1, what="the second request to queue")
    queued.close()
    wait_for(lambda: metrics(site)["lever_serve_queue_depth"] == 0, what="the queued request to leave")
    running.close()
    after = wait_for(lambda: (m := metrics(site))["lever_serve_active_generations"] == 0 and m, what="the stop")
    key = 'lever_serve_cancelled_generations_total{stage="%s"}'
    assert after[key % "queued"] == before[key % "queued"] + 1
    assert after[key % "running"] == before[key % "running"] + 1
    assert after["lever_serve_tokens_generated_total"] - before["lever_serve_tokens_generated_total"] < 1000


# -- (4) many requests at once ---------------------------------------------------------

def test_sixteen_concurrent_requests_each_get_their_solo_answer(ar_server):
    server, site = ar_server
    c = client(site)
    prompts = [f"{i} plus {i} is" for i in range(16)]          # short prompts: a quick prefill each

    def ask(i: int) -> list[int]:
        kw = dict(model=NAME, prompt=prompts[i], max_tokens=6, temperature=0, extra_body={"return_token_ids": True})
        if i % 2:
            return [t for ch in c.completions.create(stream=True, **kw) for t in ch.choices[0].model_extra["token_ids"]]
        return c.completions.create(**kw).choices[0].model_extra["token_ids"]

    solo = [ask(i) for i in range(16)]
    before = metrics(site)
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, range(16)))
    after = metrics(site)
    assert together == solo and all(len(ids) > 0 for ids in solo)
    assert len({tuple(s) for s in solo}) > 1                 # the prompts do give different answers
    key = 'lever_serve_requests_total{endpoint="/v1/completions",status="200"}'
    assert after[key] - before[key] == 16
    assert after["lever_serve_completed_generations_total"] - before["lever_serve_completed_generations_total"] == 16


# -- (5) a full queue ------------------------------------------------------------------

def test_a_full_queue_is_a_429(smollm2_path, lever_cache):
    server, site = start(smollm2_path, lever_cache, "--max-queue", "1")
    try:
        c = client(site, token="unused")
        stream = c.completions.create(model=NAME, prompt=COUNTING, max_tokens=2000, temperature=0, stream=True)
        next(iter(stream))                                              # running
        waiting = ThreadPoolExecutor(1).submit(c.completions.create, model=NAME, prompt="Hi", max_tokens=3,
                                               temperature=0)
        wait_for(lambda: server.queue.depth == 1, what="a waiting request")
        with pytest.raises(openai.RateLimitError) as e:
            c.completions.create(model=NAME, prompt="Hi", max_tokens=3, temperature=0)
        assert e.value.body["code"] == "queue_full" and e.value.response.headers["Retry-After"] == "1"
        stream.close()
        assert waiting.result(timeout=deadline(60)).usage.completion_tokens == 3     # the queued one is still answered
    finally:
        site.stop()


# -- (6) bad requests ------------------------------------------------------------------

def post_raw(site, path: str, data: bytes, token: str | None = TOKEN) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(site.url + path, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=deadline(30)) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("body, status, code, param", [
    (b"{not json", 400, "invalid_json", None),
    (b"[1, 2]", 400, "invalid_json", None),
    (json.dumps({"model": NAME, "messages": "hi"}).encode(), 400, "invalid_type", "messages"),
    (json.dumps({"model": NAME, "messages": []}).encode(), 422, "empty_messages", "messages"),
    (json.dumps({"model": NAME, "messages": [{"role": "robot", "content": "x"}]}).encode(), 400, "invalid_value",
     "messages[0].role"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": 5}]}).encode(), 400, "invalid_type",
     "messages[0].content"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "n": 2}).encode(), 400,
     "unsupported_value", "n"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}).encode(), 400,
     "invalid_type", "max_tokens"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).encode(), 422,
     "invalid_value", "max_tokens"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "temperature": -1}).encode(), 422,
     "invalid_value", "temperature"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "tools": []}).encode(), 400,
     "unknown_parameter", "tools"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "stream_options": {}}).encode(),
     400, "invalid_value", "stream_options"),
    (json.dumps({"model": ["gpt-4o"], "messages": [{"role": "user", "content": "x"}]}).encode(), 400,
     "invalid_type", "model"),
])
def test_a_bad_chat_request_gets_an_openai_error(ar_server, body, status, code, param):
    server, site = ar_server
    got, answer = post_raw(site, "/v1/chat/completions", body)
    assert got == status, answer
    err = answer["error"]
    assert err["code"] == code and err["param"] == param and err["type"]
    assert (param or "JSON") in err["message"], err["message"]          # the message names what is wrong


def test_bad_completion_prompts_and_context(ar_server):
    server, site = ar_server
    vocab = server.generator.loaded.config.vocab_size
    for body, status, code in [({"prompt": ""}, 422, "empty_prompt"), ({"prompt": [vocab]}, 422, "invalid_value"),
                               ({"prompt": ["a", "b"]}, 400, "invalid_type"), ({"max_tokens": 3}, 400,
                                                                                "missing_required_parameter"),
                               ({"prompt": "x", "echo": True}, 400, "unsupported_value")]:
        got, answer = post_raw(site, "/v1/completions", json.dumps(body).encode())
        assert (got, answer["error"]["code"]) == (status, code), (body, answer)
    c = client(site)
    with pytest.raises(openai.UnprocessableEntityError, match="context"):
        c.completions.create(model=NAME, prompt=[1] * (server.generator.context - 10), max_tokens=20)
    with pytest.raises(openai.UnprocessableEntityError, match="max_tokens"):
        c.completions.create(model=NAME, prompt="x", max_tokens=4096)          # over --max-tokens 2048
    with pytest.raises(openai.BadRequestError, match="n = 1"):
        c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], n=2)


def test_a_model_the_server_does_not_host_is_served_by_its_own_with_one_warning(ar_server, monkeypatch):
    """As llama-server: `"model": "gpt-4o"` gets the served model's answer (the response names the
    served model), and the log one line per requested name, naming both models."""
    server, site = ar_server
    lines: list[str] = []
    monkeypatch.setattr(server, "log", lines.append)
    monkeypatch.setattr(server, "other_models", set())
    c = client(site)
    ref = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                    temperature=0)
    assert lines == []
    for name in ("gpt-4o", "gpt-4o", "llama\nfake log line"):
        reply = c.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                          temperature=0)
        assert reply.model == NAME and reply.choices[0].message.content == ref.choices[0].message.content
    text = c.completions.create(model="gpt-4o", prompt="Hi", max_tokens=2)
    assert text.model == NAME
    assert len(lines) == 2, lines                                     # once per name, the completion's too
    assert "'gpt-4o'" in lines[0] and repr(NAME) in lines[0] and "does not host" in lines[0]
    assert "\n" not in lines[1] and "\\n" in lines[1]                   # a name cannot forge a log line


def test_the_other_model_warnings_are_bounded(ar_server, monkeypatch):
    """A client sending ever new names grows neither the log nor the set of names without end."""
    from lever.serve import openai_schema as schema
    from lever.serve.app import MAX_LOGGED_MODEL_NAMES
    server, _ = ar_server
    lines: list[str] = []
    monkeypatch.setattr(server, "log", lines.append)
    monkeypatch.setattr(server, "other_models", set())
    for i in range(MAX_LOGGED_MODEL_NAMES + 50):
        server._note_other_model(schema.parse_completion({"model": f"m{i}", "prompt": "x"}, server.served))
    assert len(lines) == MAX_LOGGED_MODEL_NAMES + 1 and "without logging each" in lines[-1]
    assert len(server.other_models) == MAX_LOGGED_MODEL_NAMES + 1


def test_authentication(ar_server):
    server, site = ar_server
    with pytest.raises(openai.AuthenticationError):                       # 401
        client(site, token="x", default_headers={"Authorization": "Basic eDp5"}).models.list()   # not a bearer token
    with pytest.raises(openai.PermissionDeniedError):                     # 403
        client(site, token="wrong-token-wrong-token").models.list()
    assert post_raw(site, "/v1/completions", b'{"prompt": "x"}', token=None)[0] == 401
    with urllib.request.urlopen(site.url + "/health", timeout=deadline(10)) as r:   # no token needed
        assert json.loads(r.read())["status"] == "ok"


def test_an_oversized_or_slow_body_is_refused(smollm2_path, lever_cache):
    server, site = start(smollm2_path, lever_cache, "--max-body-bytes", "1000", "--body-timeout", "0.3")
    try:
        status, answer = post_raw(site, "/v1/completions", json.dumps({"prompt": "x" * 2000}).encode())
        assert status == 413 and answer["error"]["code"] == "body_too_large"
        with socket.create_connection((site.host, site.port), timeout=deadline(10)) as sock:   # 10 of 100 bytes
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
            answer = sock.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 408") and "body_timeout" in answer
    finally:
        site.stop()


def test_an_engine_failure_is_a_500_whole_or_in_the_stream(ar_server, monkeypatch):
    server, site = ar_server
    from lever.errors import LeverError

    def broken(params):
        raise LeverError("the flash store went away")
    monkeypatch.setattr(server.generator, "spec_for", broken)
    c = client(site)
    with pytest.raises(openai.InternalServerError, match="flash store went away"):
        c.completions.create(model=NAME, prompt="Hi", max_tokens=2)
    with pytest.raises(openai.APIError, match="flash store went away"):
        for _ in c.completions.create(model=NAME, prompt="Hi", max_tokens=2, stream=True):
            pass
    assert metrics(site)["lever_serve_failed_generations_total"] >= 2


# -- (7) /v1/models, /health, /metrics -------------------------------------------------

METRIC_LINE = re.compile(r'^[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?[0-9.e+]+$')


def test_models_health_and_metrics_format(ar_server):
    server, site = ar_server
    c = client(site)
    assert [m.id for m in c.models.list()] == [NAME]
    c.completions.create(model=NAME, prompt="Hi", max_tokens=2, temperature=0)
    req = urllib.request.Request(site.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=deadline(10)) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    families = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:]
            assert kind in ("counter", "gauge")
            families.add(name)
        elif not line.startswith("# HELP "):
            assert METRIC_LINE.match(line), line
            assert line.split("{")[0].split(" ")[0] in families, line
    m = metrics(site)
    assert m['lever_serve_requests_total{endpoint="/v1/completions",status="200"}'] >= 1
    assert m['lever_serve_requests_total{endpoint="/v1/models",status="200"}'] >= 1
    assert m["lever_serve_tokens_generated_total"] >= 2 and m["lever_serve_target_passes_total"] >= 2
    for name in ("queue_depth", "active_generations", "sessions_freed_total", "drafted_tokens_total",
                 "accepted_tokens_total"):
        assert f"lever_serve_{name}" in m


# -- the command line ------------------------------------------------------------------

def test_the_command_prints_its_url_and_serves(smollm2_path, lever_cache, tmp_path):
    """Waited for by the URL line it prints; its log goes to a file (a pipe nobody reads could fill)."""
    with open(tmp_path / "stderr.txt", "w+") as log:
        proc = subprocess.Popen([sys.executable, "-m", "lever.cli", "serve", "--model", str(smollm2_path),
                                 "--cache-dir", str(lever_cache), "--port", "0"],
                                stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            url = read_line(proc.stdout, 120, "lever serve's URL", proc).strip()
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", url), (url, (tmp_path / "stderr.txt").read_text())
            with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=deadline(10)) as r:
                assert json.loads(r.read())["model"] == str(smollm2_path)
        finally:
            proc.terminate()
            wait_exit(proc, 30, "lever serve after SIGTERM")
            proc.stdout.close()


@pytest.mark.parametrize("argv, message", [
    (["--host", "0.0.0.0"], "without authentication"),
    (["--mode", "chain"], "needs --draft"),
    (["--memory-limit", "1MB"], "memory"),
])
def test_the_command_refuses_what_it_cannot_serve(argv, message, smollm2_path, lever_cache):
    from lever.cli import main
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["serve", "--model", str(smollm2_path), "--cache-dir", str(lever_cache), *argv]) == 2
    assert message in err.getvalue(), err.getvalue()


def test_a_memory_limit_is_planned(smollm2_path, lever_cache):
    args = build_parser().parse_args(["serve", "--model", str(smollm2_path), "--cache-dir", str(lever_cache),
                                      "--memory-limit", "64GB"])
    server, memory = build_server(args)
    server.queue.close()
    assert memory is not None and memory.limit_bytes == 64 * 10**9


def test_context_bounds_what_a_request_may_use(smollm2_path, lever_cache):
    """--context N: a request's prompt, completion and a whole tree fit N KV rows."""
    base = ["serve", "--model", str(smollm2_path), "--cache-dir", str(lever_cache)]
    args = build_parser().parse_args(base + ["--context", "300"])
    server, _ = build_server(args)
    server.queue.close()
    assert server.generator.context == 300
    args = build_parser().parse_args(base + ["--context", "300", "--draft", str(smollm2_path), "--mode", "chain",
                                             "--draft-len", "4"])
    server, _ = build_server(args)
    server.queue.close()
    assert server.generator.context == 300 - 5                        # a chain of 4: 5 rows per pass
    plain, _ = build_server(build_parser().parse_args(base))
    plain.queue.close()
    assert plain.generator.context == plain.generator.loaded.config.max_context


@pytest.mark.slow
def test_mode_lever_is_token_identical_to_lever_generate(smollm2_path, lever_cache):
    """Mode lever (a device profile is measured on first use, then cached): greedy chat output equal to
    `lever generate --mode lever`'s, and a sampled request gets its own policy."""
    extra = ["--draft", str(smollm2_path), "--mode", "lever", "--lever-max-nodes", "16", "--lever-max-depth", "4"]
    ref = lever_generate(smollm2_path, lever_cache, "Name three colours.", 16, *extra)
    server, site = start(smollm2_path, lever_cache, *extra)
    try:
        c = client(site)
        text, ids, finish, spec, usage = chat_stream(c, [{"role": "user", "content": "Name three colours."}], 16)
        assert ids == ref["token_ids"] and text == ref["text"]
        # (drafted may be 0: on a self-draft the policy can judge that drafting does not pay)
        assert spec["mode"] == "lever" and spec["target_passes"] <= len(ids)
        c.completions.create(model=NAME, prompt=COUNTING, max_tokens=4, temperature=0.7, seed=1)
        assert len(server.generator.spec_for.policies) == 2          # greedy and T=0.7 calibrate apart
    finally:
        site.stop()

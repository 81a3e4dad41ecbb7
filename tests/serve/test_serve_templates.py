"""`lever serve` renders chat templates off the event loop under a budget
(lever.model.chat_template): a hostile template in the model file is a 400
naming the template, and /health and /v1/completions answer throughout."""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("openai")
pytest.importorskip("aiohttp")

from hostile_templates import HOSTILE, hostile_gguf  # noqa: E402
from test_serve import NAME, start, wait_for  # noqa: E402
from waiting import deadline  # noqa: E402

CHAT = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def call(site, path: str, body: dict | None = None) -> tuple[int, dict, float]:
    """(status, JSON answer, seconds taken) of a GET (body None) or POST."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(site.url + path, data=data, headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=deadline(60)) as r:
            return r.status, json.loads(r.read()), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), time.monotonic() - t0


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_chat_template_is_a_400_while_the_server_answers(name, smollm2_path, lever_cache):
    path = hostile_gguf(smollm2_path, name)
    server, site = start(path, lever_cache)
    try:
        chat = ThreadPoolExecutor(1).submit(call, site, "/v1/chat/completions", CHAT)
        during = checks = 0
        while not checks or not chat.done():    # /health answers at once, however long the render runs
            rendering = server.chats_parsing
            status, health, seconds = call(site, "/health")
            assert status == 200 and health["status"] == "ok" and seconds < deadline(1), seconds
            during, checks = during + rendering, checks + 1
        if name == "nested_range_loop":         # 5 s of rendering: the engine serves completions meanwhile
            assert during > 0
        status, body, _ = chat.result()
        error = body["error"]
        assert status == 400 and error["code"] == "chat_template" and error["param"] == "messages"
        assert error["message"].startswith(f"messages: the chat template of {path} ")
        assert HOSTILE[name][1] in error["message"]
        status, answer, _ = call(site, "/v1/completions", {"model": NAME, "prompt": "Hi", "max_tokens": 2})
        assert status == 200 and answer["usage"]["completion_tokens"] == 2
    finally:
        site.stop()


def test_completions_are_served_while_a_template_renders(smollm2_path, lever_cache):
    server, site = start(hostile_gguf(smollm2_path, "nested_range_loop"), lever_cache)
    try:
        chat = ThreadPoolExecutor(1).submit(call, site, "/v1/chat/completions", CHAT)
        wait_for(lambda: server.chats_parsing == 1, 30, "a chat template rendering")
        status, answer, _ = call(site, "/v1/completions", {"model": NAME, "prompt": "Hi", "max_tokens": 2})
        assert status == 200 and answer["usage"]["completion_tokens"] == 2
        assert server.chats_parsing == 1 and not chat.done()      # still rendering (its budget is 5 s)
        assert chat.result(timeout=deadline(30))[0] == 400
    finally:
        site.stop()


def test_chats_waiting_for_their_template_are_bounded(smollm2_path, lever_cache):
    """Two renders at once and --max-queue waiting: one more chat is a 429."""
    server, site = start(hostile_gguf(smollm2_path, "nested_range_loop"), lever_cache, "--max-queue", "1")
    try:
        pool = ThreadPoolExecutor(3)
        chats = [pool.submit(call, site, "/v1/chat/completions", CHAT) for _ in range(3)]
        wait_for(lambda: server.chats_parsing == 3, 30, "three chats at their template")
        status, body, _ = call(site, "/v1/chat/completions", CHAT)
        assert status == 429 and body["error"]["code"] == "queue_full"
        assert [c.result(timeout=deadline(60))[0] for c in chats] == [400] * 3
    finally:
        site.stop()

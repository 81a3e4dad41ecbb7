"""Batched verifier benchmark: target passes and aggregate tokens/s of 1, 4 and 8
concurrent clients against `lever serve-verifier`, batching off and on, side by side.

    python bench/bench_batched_verifier.py [--target qwen2.5-coder-0.5b] [--clients 1 4 8] \
        [--new-tokens 48] [--draft-len 3] [--window-ms 5] [--repeats 1] [--out bench/results]
    python bench/bench_batched_verifier.py --quick          # smollm2-135m, 24 tokens
    python bench/bench_batched_verifier.py --replot bench/results/bench_batched_verifier.json

Two verifier servers run the target as subprocesses on this machine (only one
is busy at a time): "one-at-a-time" (--batch-window-ms 0: every round its own
target pass, as before batching) and "batched" (--batch-window-ms W: rounds of
different sessions arriving within W ms, or while a pass runs, share one
pass).  Clients are threads of this process, each a `RemoteVerifier` driven
by `lever.engine.run_speculative` with the prompt-lookup drafter
(`lever.draft.ngram.NgramDrafter`, no model: drafting costs next to nothing,
so the clients do not take the cores from the server) growing a chain of at
most --draft-len tokens per round; greedy; no stop tokens, so every client
generates exactly --new-tokens tokens.  Client i decodes prompt i of the v1
set (chat template of the target).

First, every prompt is generated alone (1 client, one-at-a-time): the solo
reference.  Then for each client count (outer loop) and repeat, both modes
run in turn (interleaved, so machine noise hits both alike).  Every session's
tokens are compared with its solo run; mismatches are printed loudly.

Every client opens its session (prefill: one pass per chunk, never batched)
and waits until all have; then all decode at once.  Per (clients, mode): new
tokens, decode seconds (from the moment every prefill was done to the last
token) and aggregate decode tokens/s (all clients' tokens / decode seconds),
wall seconds and tokens/s with the prefills included, rounds (target calls
asked by the clients), target passes the server ran for them, mean trees per
pass, mean accepted length (tokens per round), and batched / one-at-a-time
ratios of passes and tokens/s.  Server counters are taken after the prefills.

Outputs (in --out): bench_batched_verifier.json (settings, machine, rows,
aggregates; rewritten after each client count, "complete": true at the end)
and bench_batched_verifier.png (passes and tokens/s by client count and mode).
Progress goes to stderr; the tables and the summary to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_remote import free_port, server_metrics, stop_server  # noqa: E402

MODES = ("one-at-a-time", "batched")
SERVER_START_TIMEOUT_S = 600.0
SERVER_MAX_TREE_NODES = 16           # trees are chains of a few tokens; keeps the server's cost grid short
MODE_COLOURS = {"one-at-a-time": "tab:gray", "batched": "tab:red"}


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- servers ---------------------------------------------------------------------------------

def start_server(target: str, port: int, window_ms: float, max_trees: int, max_sessions: int) -> subprocess.Popen:
    """`lever serve-verifier` for `target` on 127.0.0.1:port with batch window `window_ms`
    (0: off); returns once it says it is serving.  Its stderr is echoed with a prefix."""
    cmd = [sys.executable, "-m", "lever.cli", "serve-verifier", "--model", target, "--port", str(port),
           "--max-tree-nodes", str(SERVER_MAX_TREE_NODES), "--max-sessions", str(max_sessions),
           "--batch-window-ms", f"{window_ms:g}", "--max-batch-trees", str(max_trees)]
    say(f"# starting: {' '.join(cmd[1:])}")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=1)
    serving = threading.Event()
    tag = f"[server w={window_ms:g}ms]"

    def echo() -> None:
        for line in proc.stderr:
            say(f"  {tag} {line.rstrip()}")
            if "serving" in line:
                serving.set()

    threading.Thread(target=echo, daemon=True).start()
    t0 = time.monotonic()
    while not serving.wait(0.5):
        if proc.poll() is not None:
            raise RuntimeError(f"the verifier server exited with status {proc.returncode} before serving")
        if time.monotonic() - t0 > SERVER_START_TIMEOUT_S:
            stop_server(proc)
            raise RuntimeError(f"the verifier server did not start within {SERVER_START_TIMEOUT_S:.0f} s")
    return proc


# -- clients ---------------------------------------------------------------------------------

class AfterPrefill:
    """A RemoteVerifier whose `start` (the session's open and prefill) waits at
    `barrier` once done, so that every client starts decoding at once; the
    rest is the wrapped verifier's."""

    def __init__(self, verifier, barrier: threading.Barrier):
        self.verifier, self.barrier = verifier, barrier

    def start(self, prompt_ids) -> None:
        self.verifier.start(prompt_ids)
        self.barrier.wait()

    def __getattr__(self, name):
        return getattr(self.verifier, name)


def one_client(url: str, prompt_ids: list[int], new_tokens: int, draft_len: int, barrier) -> dict:
    """Greedy speculative decoding of `prompt_ids` through the server at `url`;
    decoding starts when every client's prefill is done (`barrier`)."""
    from lever.draft.ngram import NgramDrafter
    from lever.engine import SpecConfig, run_speculative
    from lever.remote.client import RemoteVerifier
    from lever.sampling import SamplingParams

    verifier = RemoteVerifier(url, SamplingParams(), retry_deadline_s=60.0)
    try:
        result, stats = run_speculative(AfterPrefill(verifier, barrier), NgramDrafter(), prompt_ids, new_tokens,
                                        SamplingParams(), SpecConfig(mode="chain", draft_len=draft_len))
        end = time.perf_counter()
    finally:
        verifier.close()
    return {"token_ids": list(result.token_ids), "rounds": stats.iterations, "accepted": stats.accepted,
            "draft_nodes": stats.draft_nodes, "prefill_s": result.prefill_s, "decode_s": result.decode_s,
            "end": end}


def run_clients(port: int, prompts: list[list[int]], args) -> dict:
    """len(prompts) clients at once (prefills first, then all decode together): their
    rows, wall seconds (open to last token), decode seconds (from the moment every
    prefill was done to the last token) and the server's counter deltas."""
    url = f"http://127.0.0.1:{port}"
    rows: list = [None] * len(prompts)
    errors: list = []
    decode_from: list = []
    marks: dict = {}

    def all_prefilled() -> None:
        decode_from.append(time.perf_counter())
        marks["before"] = server_metrics(port)             # the prefills' counters are left out

    barrier = threading.Barrier(len(prompts), action=all_prefilled)

    def work(i: int) -> None:
        try:
            rows[i] = one_client(url, prompts[i], args.new_tokens, args.draft_len, barrier)
        except Exception as e:  # noqa: BLE001 -- reported, counted
            errors.append(f"client {i}: {type(e).__name__}: {e}")
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    before, after = marks.get("before") or server_metrics(port), server_metrics(port)
    ends = [r["end"] for r in rows if r is not None]
    decode_s = max(ends) - decode_from[0] if ends and decode_from else float("nan")
    delta = {k: after[k] - before[k] for k in ("target_calls", "target_passes", "batched_rounds", "emitted_tokens",
                                              "tree_tokens", "replayed_rounds")}
    return {"rows": rows, "errors": errors, "wall_s": wall, "decode_s": decode_s, "server": delta}


def aggregate(run: dict) -> dict:
    ok = [r for r in run["rows"] if r is not None]
    tokens = sum(len(r["token_ids"]) for r in ok)
    s = run["server"]
    return {"clients": len(run["rows"]), "errors": len(run["errors"]), "new_tokens": tokens,
            "wall_s": round(run["wall_s"], 3), "wall_tokens_per_s": round(tokens / run["wall_s"], 3),
            "decode_s": round(run["decode_s"], 3), "tokens_per_s": round(tokens / run["decode_s"], 3),
            "rounds": s["target_calls"], "target_passes": s["target_passes"],
            "trees_per_pass": round(s["target_calls"] / s["target_passes"], 3) if s["target_passes"] else None,
            "batched_rounds": s["batched_rounds"], "replayed_rounds": s["replayed_rounds"],
            "mean_accepted_length": round(s["emitted_tokens"] / s["target_calls"], 3) if s["target_calls"] else None,
            "tree_tokens_per_round": round(s["tree_tokens"] / s["target_calls"], 3) if s["target_calls"] else None}


def merge(aggs: list[dict]) -> dict:
    """Sums over repeats, ratios recomputed."""
    keys = ("new_tokens", "wall_s", "decode_s", "rounds", "target_passes", "batched_rounds", "replayed_rounds",
            "errors")
    m = {k: round(sum(a[k] for a in aggs), 3) for k in keys}
    m["clients"] = aggs[0]["clients"]
    m["repeats"] = len(aggs)
    m["tokens_per_s"] = round(m["new_tokens"] / m["decode_s"], 3)
    m["wall_tokens_per_s"] = round(m["new_tokens"] / m["wall_s"], 3)
    m["trees_per_pass"] = round(m["rounds"] / m["target_passes"], 3) if m["target_passes"] else None
    acc = [a["mean_accepted_length"] * a["rounds"] for a in aggs if a["mean_accepted_length"]]
    m["mean_accepted_length"] = round(sum(acc) / m["rounds"], 3) if m["rounds"] else None
    tt = [a["tree_tokens_per_round"] * a["rounds"] for a in aggs if a["tree_tokens_per_round"]]
    m["tree_tokens_per_round"] = round(sum(tt) / m["rounds"], 3) if m["rounds"] else None
    return m


def line(clients: int, mode: str, a: dict, ref: dict | None) -> str:
    ratios = ""
    if ref is not None and mode == "batched":
        a["passes_ratio"] = round(a["target_passes"] / ref["target_passes"], 3) if ref["target_passes"] else None
        a["tokens_per_s_ratio"] = round(a["tokens_per_s"] / ref["tokens_per_s"], 3)
        a["wall_tokens_per_s_ratio"] = round(a["wall_tokens_per_s"] / ref["wall_tokens_per_s"], 3)
        ratios = (f"  passes x{a['passes_ratio']:.2f}  tok/s x{a['tokens_per_s_ratio']:.2f} "
                  f"(with prefill x{a['wall_tokens_per_s_ratio']:.2f})")
    mism = f"  !! {a['mismatches']} MISMATCHED SESSIONS" if a.get("mismatches") else ""
    errs = f"  !! {a['errors']} FAILED CLIENTS" if a.get("errors") else ""
    return (f"clients {clients:2d}  {mode:<14} tokens {a['new_tokens']:5d}  decode {a['decode_s']:6.2f} s "
            f"{a['tokens_per_s']:7.2f} tok/s  (wall {a['wall_s']:6.2f} s {a['wall_tokens_per_s']:6.2f} tok/s)  "
            f"rounds {a['rounds']:4d}  passes {a['target_passes']:4d}  "
            f"trees/pass {a['trees_per_pass'] or 0:4.2f}  accepted len {a['mean_accepted_length'] or 0:4.2f}"
            f"{ratios}{mism}{errs}")


# -- plot ------------------------------------------------------------------------------------

def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["settings"]
    counts = [str(c) for c in s["clients"] if str(c) in result["aggregates"]]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    panels = [("target_passes", "target passes (all clients)", "target passes"),
              ("tokens_per_s", "aggregate decode tokens/s (all clients)", "aggregate decode tokens/s")]
    width = 0.38
    for ax, (key, ylabel, title) in zip(axes, panels):
        for k, mode in enumerate(MODES):
            xs = [j + (k - 0.5) * width for j in range(len(counts))]
            ys = [result["aggregates"][c][mode][key] for c in counts]
            bars = ax.bar(xs, ys, width, label=mode, color=MODE_COLOURS[mode])
            ax.bar_label(bars, [f"{y:.1f}" if isinstance(y, float) else str(y) for y in ys], fontsize=7, padding=1)
        ax.set_xticks(range(len(counts)), [f"{c} client{'s' if c != '1' else ''}" for c in counts])
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.margins(y=0.12)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"batched verifier: target {s['target']}, prompt-lookup chains of <= {s['draft_len']}, "
                 f"{s['new_tokens']} tokens per client, window {s['window_ms']:g} ms, greedy "
                 f"({result['machine'].get('cpu_count', '?')} CPUs)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- main ------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None,
                    help="the servers' model (default qwen2.5-coder-0.5b; --quick: smollm2-135m)")
    ap.add_argument("--quick", action="store_true", help="smollm2-135m, 24 tokens per client")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8], help="client counts (default 1 4 8)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per client (default 48; --quick 24)")
    ap.add_argument("--draft-len", type=int, default=3, help="prompt-lookup chain length at most (default 3)")
    ap.add_argument("--window-ms", type=float, default=5.0, help="the batched server's window (default 5)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per (clients, mode), interleaved (default 1)")
    ap.add_argument("--out", default=None, help="output folder (default bench/results)")
    ap.add_argument("--replot", default=None, metavar="JSON", help="only redraw the PNG from a saved JSON")
    args = ap.parse_args()
    if args.replot:
        src = Path(args.replot)
        dest = Path(args.out) if args.out else src.parent
        dest.mkdir(parents=True, exist_ok=True)
        plot(json.loads(src.read_text()), dest / "bench_batched_verifier.png")
        print(f"# wrote {dest / 'bench_batched_verifier.png'}")
        return 0
    target = args.target or ("smollm2-135m" if args.quick else "qwen2.5-coder-0.5b")
    args.new_tokens = args.new_tokens or (24 if args.quick else 48)
    if min(args.clients) < 1 or args.new_tokens < 1 or args.draft_len < 1 or args.repeats < 1 or args.window_ms <= 0:
        ap.error("client counts, --new-tokens, --draft-len and --repeats must be >= 1, --window-ms > 0")

    from lever.api import load
    from lever.bench_prompts import load_prompts
    from lever.commands.bench_report import machine_info

    n_prompts = max(args.clients)
    texts = load_prompts("v1", limit=n_prompts)
    if len(texts) < n_prompts:
        ap.error(f"the v1 prompt set has {len(texts)} prompts, fewer than {n_prompts} clients")
    say(f"# tokenizing {n_prompts} prompts with {target}'s tokenizer")
    tok_model = load(target, progress=False)
    prompts = [tok_model.prompt_ids(p["text"]) for p in texts]
    del tok_model
    out = Path(args.out) if args.out else Path(__file__).parent / "results"
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "bench_batched_verifier.json", out / "bench_batched_verifier.png"
    result = {"benchmark": "bench_batched_verifier", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "complete": False,
              "settings": {"target": target, "clients": args.clients, "new_tokens": args.new_tokens,
                           "draft": "prompt lookup (lever.draft.ngram.NgramDrafter), chain",
                           "draft_len": args.draft_len, "window_ms": args.window_ms, "repeats": args.repeats,
                           "max_batch_trees": n_prompts, "prompt_set": "v1",
                           "prompt_ids": [p["id"] for p in texts], "prompt_tokens": [len(p) for p in prompts],
                           "greedy": True, "stop_tokens": None},
              "machine": machine_info(), "solo": {}, "runs": [], "aggregates": {}, "mismatches": []}
    servers = {}
    t_start = time.perf_counter()
    try:
        ports = {mode: free_port() for mode in MODES}
        for mode in MODES:
            servers[mode] = start_server(target, ports[mode], 0 if mode == "one-at-a-time" else args.window_ms,
                                         n_prompts, max_sessions=n_prompts + 2)
        say(f"# solo reference: {n_prompts} prompts one by one, one-at-a-time server")
        solo = []
        for i, p in enumerate(prompts):
            run = run_clients(ports["one-at-a-time"], [p], args)
            if run["errors"]:
                raise RuntimeError(f"solo run of prompt {i} failed: {run['errors']}")
            solo.append(run["rows"][0]["token_ids"])
            say(f"#   prompt {i} ({len(p)} tokens): {run['wall_s']:.1f} s, {run['server']['target_calls']} rounds")
        result["solo"] = {texts[i]["id"]: ids for i, ids in enumerate(solo)}
        for c in args.clients:
            per_mode: dict = {mode: [] for mode in MODES}
            for rep in range(args.repeats):
                for mode in MODES:
                    say(f"# {c} clients, {mode}, repeat {rep + 1}/{args.repeats}")
                    run = run_clients(ports[mode], prompts[:c], args)
                    bad = [i for i, r in enumerate(run["rows"]) if r is None or r["token_ids"] != solo[i]]
                    for i in bad:
                        msg = (f"!! MISMATCH: {c} clients, {mode}, client {i} (prompt {texts[i]['id']}) differs "
                               f"from its solo run")
                        print(msg, flush=True)
                        result["mismatches"].append(msg)
                    for e in run["errors"]:
                        print(f"!! CLIENT FAILED: {c} clients, {mode}: {e}", flush=True)
                    agg = aggregate(run)
                    agg["mismatches"] = len(bad)
                    per_mode[mode].append(agg)
                    result["runs"].append({"clients": c, "mode": mode, "repeat": rep, **agg,
                                           "per_client": [{k: v for k, v in (r or {}).items() if k != "token_ids"}
                                                          for r in run["rows"]]})
                    say(f"#   {line(c, mode, agg, None)}")
            merged = {mode: {**merge(aggs), "mismatches": sum(a["mismatches"] for a in aggs)}
                      for mode, aggs in per_mode.items()}
            result["aggregates"][str(c)] = merged
            print()
            for mode in MODES:
                print(line(c, mode, merged[mode], merged["one-at-a-time"]), flush=True)
            json_path.write_text(json.dumps(result, indent=1))
        result["server_metrics"] = {mode: server_metrics(ports[mode]) for mode in MODES}
    finally:
        for proc in servers.values():
            stop_server(proc)
    result["complete"] = True
    result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    json_path.write_text(json.dumps(result, indent=1))
    plot(result, png_path)
    print(f"\n# batched verifier: target {target}, {args.new_tokens} tokens per client, prompt-lookup chains of <= "
          f"{args.draft_len}, window {args.window_ms:g} ms, {args.repeats} repeat(s); {result['elapsed_s']:.0f} s")
    for c in args.clients:
        b = result["aggregates"][str(c)]["batched"]
        print(f"# {c} clients: batched/one-at-a-time target passes x{b.get('passes_ratio', 0):.2f}, "
              f"aggregate decode tokens/s x{b.get('tokens_per_s_ratio', 0):.2f} (prefill included: "
              f"x{b.get('wall_tokens_per_s_ratio', 0):.2f}), trees per pass {b['trees_per_pass']}")
    if result["mismatches"]:
        print(f"!! NOT EXACT: {len(result['mismatches'])} sessions differ from their solo runs")
    else:
        print("# every session's output equals its solo run")
    print(f"# wrote {json_path} and {png_path}")
    return 1 if result["mismatches"] else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

"""Edge-cloud benchmark: target calls and tokens/s of remote verification over an emulated link.

    python bench/bench_remote.py --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
        --prompts 10 --new-tokens 64 --rtt-ms 0 20 80 --modes ar chain:4 tree:32 lever \
        [--loss 0] [--out bench/results]
    python bench/bench_remote.py --replot bench/results/bench_remote.json

The target runs in a `lever serve-verifier` subprocess on this machine; the
draft runs in this process (lever.edge.RemoteTarget).  Every request goes
through a loopback proxy (lever.remote.netem.LinkProxy) that adds the given
round-trip time (milliseconds) and drops messages with probability --loss, so
the link behaves like a network between an edge device and a cloud server.

For each RTT (outer loop) and each prompt, every mode generates (greedily,
or sampled with --temperature and --sampling-seed), modes interleaved per
prompt so that machine noise hits all of them alike:

  ar        target-only remote decoding: one target call per token
  chain:K   K drafted tokens per call
  tree:N    a static tree of N draft nodes (topk 4, depth 8) per call
  lever     trees sized by expected tokens/s, with the measured round trip
            plus the server's pass as the verification cost (lever:N caps
            the tree at N draft nodes)

Exactness: for every prompt, every mode's tokens must equal mode ar's at the
same RTT (target-only remote decoding; sampling is keyed by position, so
this holds for sampled runs of one seed too); mismatches are counted,
printed loudly and recorded, but the run goes on.

Per (RTT, mode), over all prompts: new tokens, target calls, calls per token,
the reduction in target calls against ar (percent), decode tokens/s (tokens /
decode seconds, prefill excluded), tokens per call, draft nodes per call,
bytes up+down per token (HTTP headers included), mean round trip and server
milliseconds per call, retries, session rebuilds, mismatches.

Outputs (in --out): bench_remote.json (settings, machine, server info, the
per-(RTT, mode) aggregates, the per-prompt raw numbers; rewritten after every
RTT, "complete": true at the end) and bench_remote.png (target calls per
token and tokens/s by mode, grouped by RTT).  --replot JSON redraws the PNG
from a saved JSON without running anything (into --out if given, else next
to the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, is_dataclass
from pathlib import Path

DEFAULT_MODES = ["ar", "chain:4", "tree:32", "lever"]
SERVER_MAX_TREE_NODES = 256          # the verifier's limit per tree, root included
SERVER_START_TIMEOUT_S = 600.0
WARMUP_TOKENS = 2
MODE_COLOURS = {"ar": "tab:gray", "lever": "tab:red"}
OTHER_COLOURS = ["tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:cyan", "tab:olive", "tab:brown",
                 "tab:pink"]


# -- the verifier server -----------------------------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(target: str, port: int, timeout_s: float = SERVER_START_TIMEOUT_S) -> subprocess.Popen:
    """Start `lever serve-verifier` for `target` on 127.0.0.1:port and wait (up to
    timeout_s seconds) until it says it is serving.  Its stderr is echoed with a
    '[server]' prefix for as long as it runs."""
    cmd = [sys.executable, "-m", "lever.cli", "serve-verifier", "--model", target, "--port", str(port),
           "--max-tree-nodes", str(SERVER_MAX_TREE_NODES)]
    print(f"# starting the verifier: {' '.join(cmd[1:])}", flush=True)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=1)
    serving = threading.Event()

    def echo() -> None:
        for line in proc.stderr:
            print(f"  [server] {line.rstrip()}", flush=True)
            if "serving" in line:
                serving.set()

    echoing = threading.Thread(target=echo, name="server-stderr", daemon=True)
    echoing.start()
    t0 = time.monotonic()
    while not serving.wait(0.5):
        if proc.poll() is not None:
            echoing.join(timeout=5)             # its last words first
            raise RuntimeError(f"the verifier server exited with status {proc.returncode} before serving "
                               f"(see its [server] lines above)")
        if time.monotonic() - t0 > timeout_s:
            stop_server(proc)
            raise RuntimeError(f"the verifier server did not start serving within {timeout_s:.0f} s")
    print(f"# verifier serving on 127.0.0.1:{port} after {time.monotonic() - t0:.0f} s", flush=True)
    return proc


def stop_server(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def server_metrics(port: int) -> dict | None:
    """The server's own counters (GET /v1/metrics, directly, not through the proxy)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/metrics", timeout=10) as r:
            return json.loads(r.read())
    except (OSError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


# -- modes ---------------------------------------------------------------------------------

def remote_target_args(mode_text: str) -> tuple[str, dict]:
    """(label, RemoteTarget keyword arguments) of a mode spec: ar, chain:K, tree:N
    (topk 4, depth 8), tree:N:TOPK:DEPTH, lever or lever:N (at most N draft nodes);
    lever@MS counts each target call as MS extra milliseconds (call_cost_s)."""
    from lever.commands.bench import parse_mode
    from lever.errors import LeverError
    call_ms = 0.0
    if "@" in mode_text:
        mode_text, _, ms = mode_text.partition("@")
        try:
            call_ms = float(ms)
        except ValueError:
            raise LeverError(f"bad call cost in mode lever@{ms!r}: expected milliseconds") from None
    m = parse_mode(mode_text)
    if m.spec is None:                                   # lever
        label = f"{m.label}@{call_ms:g}" if call_ms else m.label
        return label, {"mode": "lever", "max_nodes": m.lever_nodes, "call_cost_s": call_ms / 1e3}
    if call_ms:
        raise LeverError(f"a call cost (@MS) applies to mode lever only, not {mode_text!r}")
    if m.spec.mode == "chain":
        return m.label, {"mode": "chain", "draft_len": m.spec.draft_len}
    if m.spec.mode == "tree":
        return m.label, {"mode": "tree", "tree": m.spec.tree}
    return m.label, {"mode": "ar"}


def parse_mode_list(texts: list[str]) -> dict[str, dict]:
    """{label: RemoteTarget kwargs} in the order given, duplicates dropped, ar first (the reference)."""
    modes = {}
    for text in texts:
        for piece in text.replace(",", " ").split():
            label, kwargs = remote_target_args(piece)
            modes.setdefault(label, kwargs)
    modes.pop("ar", None)
    return {"ar": {"mode": "ar"}, **modes}


# -- one generation ------------------------------------------------------------------------

def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where a and b differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def measure(remote, prompt: dict, new_tokens: int, sampling: dict) -> dict:
    """One generation (greedy, or sampled with `sampling`: temperature and
    seed); its raw numbers (seconds, milliseconds, bytes)."""
    from lever.errors import LeverError
    try:
        c = remote.generate(prompt["text"], max_new_tokens=new_tokens, **sampling)
    except LeverError as e:
        return {"error": f"{type(e).__name__}: {e}", "remote": getattr(e, "remote", None), "token_ids": None}
    r, spec = c.remote, c.spec
    n = len(c.token_ids)
    rt, sv, net = r.get("round_trip_ms") or {}, r.get("server_ms") or {}, r.get("network_ms") or {}
    row = {"new_tokens": n, "stop_reason": c.result.stop_reason, "decode_s": round(c.result.decode_s, 5),
           "prefill_s": round(c.result.prefill_s, 5),
           "tokens_per_s": round(n / c.result.decode_s, 3) if c.result.decode_s else None,
           "target_calls": r["target_calls"], "target_calls_per_token": r["target_calls_per_token"],
           "tokens_per_call": r["tokens_per_call"],
           "accepted_draft_tokens": spec.accepted if spec is not None else 0,
           "draft_nodes": spec.draft_nodes if spec is not None else 0,
           "iterations": spec.iterations if spec is not None else r["target_calls"],
           "draft_s": round(spec.draft_s, 5) if spec is not None else 0.0,
           "verify_s": round(spec.verify_s, 5) if spec is not None else None,
           "mean_accepted_length": round(spec.mean_accepted_length, 4) if spec is not None else None,
           "bytes_up": r["bytes_up"], "bytes_down": r["bytes_down"], "bytes_per_token": r["bytes_per_token"],
           "round_trip_ms_mean": rt.get("mean"), "round_trip_ms_p90": rt.get("p90"),
           "server_ms_mean": sv.get("mean"), "network_ms_mean": net.get("mean"),
           "retries": r["retries"], "rebuilds": r["rebuilds"], "sessions": r.get("sessions"),
           "token_ids": list(c.token_ids)}
    if "cost" in r:
        row["lever_cost"] = r["cost"]
    return row


def progress_line(rtt_ms: float, i: int, total: int, prompt: dict, mode: str, row: dict) -> str:
    head = f"rtt {rtt_ms:g} ms  prompt {i + 1}/{total} {prompt.get('category', ''):<5} {mode:<10}"
    if row.get("error"):
        return f"{head} ERROR {row['error']}"
    check = {None: "", True: "  exact", False: f"  MISMATCH at token {row.get('first_difference')}"}
    return (f"{head}{row['new_tokens']:4d} tok {row['target_calls']:4d} calls {row['tokens_per_call'] or 0:5.2f} tok/call "
            f"{row['tokens_per_s'] or 0:7.2f} tok/s  rt {row['round_trip_ms_mean'] or 0:7.1f} ms"
            f"{check[row.get('exact')]}")


# -- aggregates ----------------------------------------------------------------------------

def aggregate(rows: list[dict]) -> dict:
    """Totals and means over the prompts of one (RTT, mode); failed generations are left out
    (and counted).  Means per call are weighted by each prompt's target calls."""
    ok = [r for r in rows if not r.get("error")]
    tokens = sum(r["new_tokens"] for r in ok)
    calls = sum(r["target_calls"] for r in ok)
    decode_s = sum(r["decode_s"] for r in ok)
    iterations = sum(r["iterations"] for r in ok)
    moved = sum(r["bytes_up"] + r["bytes_down"] for r in ok)

    def per_call(key: str) -> float | None:
        pairs = [(r[key], r["target_calls"]) for r in ok if r.get(key) is not None and r["target_calls"]]
        weight = sum(w for _, w in pairs)
        return round(sum(v * w for v, w in pairs) / weight, 3) if weight else None

    return {"prompts": len(ok), "errors": len(rows) - len(ok), "new_tokens": tokens, "target_calls": calls,
            "target_calls_per_token": round(calls / tokens, 4) if tokens else None,
            "decode_s": round(decode_s, 4), "draft_s": round(sum(r["draft_s"] for r in ok), 4),
            "verify_s": round(sum(r["verify_s"] or 0.0 for r in ok), 4), "tokens_per_s": round(tokens / decode_s, 3) if decode_s else None,
            "tokens_per_call": round(tokens / calls, 3) if calls else None,
            "mean_accepted_length": round((sum(r["accepted_draft_tokens"] for r in ok) + iterations) / iterations,
                                          3) if iterations else None,
            "draft_nodes_per_call": round(sum(r["draft_nodes"] for r in ok) / iterations, 2) if iterations else 0.0,
            "bytes_up": sum(r["bytes_up"] for r in ok), "bytes_down": sum(r["bytes_down"] for r in ok),
            "bytes_per_token": round(moved / tokens, 1) if tokens else None,
            "round_trip_ms_mean": per_call("round_trip_ms_mean"), "server_ms_mean": per_call("server_ms_mean"),
            "network_ms_mean": per_call("network_ms_mean"),
            "retries": sum(r["retries"] for r in ok), "rebuilds": sum(r["rebuilds"] for r in ok),
            "mismatches": sum(1 for r in rows if r.get("exact") is False)}


def add_relative(aggs: dict[str, dict]) -> None:
    """Each mode against ar at the same RTT: fewer target calls (percent) and the tokens/s ratio."""
    ar = aggs.get("ar", {})
    for a in aggs.values():
        calls, ar_calls = a.get("target_calls_per_token"), ar.get("target_calls_per_token")
        a["fewer_calls_than_ar_pct"] = round(100 * (1 - calls / ar_calls), 2) if calls and ar_calls else None
        tps, ar_tps = a.get("tokens_per_s"), ar.get("tokens_per_s")
        a["tokens_per_s_vs_ar"] = round(tps / ar_tps, 3) if tps and ar_tps else None


def print_table(rtt_ms: float, aggs: dict[str, dict]) -> None:
    head = (f"{'mode':<11}{'tokens':>7}{'calls':>7}{'calls/tok':>10}{'fewer':>8}{'tok/s':>8}{'vs ar':>7}"
            f"{'tok/call':>9}{'nodes':>7}{'B/tok':>8}{'rt ms':>8}{'srv ms':>8}{'retry':>6}{'rebuild':>8}"
            f"  mismatches")
    print(f"\n## rtt {rtt_ms:g} ms")
    print(head)
    print("-" * len(head))

    def f(v, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    for mode, a in aggs.items():
        fewer = "(ref)" if mode == "ar" else f(a["fewer_calls_than_ar_pct"], ".1f") + "%"
        mism = "(reference)" if mode == "ar" else (f"{a['mismatches']}  <-- NOT EXACT" if a["mismatches"] else "0")
        if a["errors"]:
            mism += f"  ({a['errors']} failed generations)"
        print(f"{mode:<11}{a['new_tokens']:>7}{a['target_calls']:>7}{f(a['target_calls_per_token'], '.3f'):>10}"
              f"{fewer:>8}{f(a['tokens_per_s'], '.2f'):>8}{f(a['tokens_per_s_vs_ar'], '.2f'):>6}x"
              f"{f(a['tokens_per_call'], '.2f'):>9}{f(a['draft_nodes_per_call'], '.1f'):>7}"
              f"{f(a['bytes_per_token'], '.0f'):>8}{f(a['round_trip_ms_mean'], '.1f'):>8}"
              f"{f(a['server_ms_mean'], '.1f'):>8}{a['retries']:>6}{a['rebuilds']:>8}  {mism}")


def headline(rtt_ms: float, aggs: dict[str, dict]) -> str:
    """'# rtt 20 ms: lever 0.231 calls/token (76.9% fewer than target-only), 2.41x target-only tokens/s'
    (for lever if it ran, else the fastest other mode), plus the fastest fixed mode."""
    spec = {m: a for m, a in aggs.items() if m != "ar" and a.get("tokens_per_s")}
    if not spec:
        return f"# rtt {rtt_ms:g} ms: only target-only decoding ran"
    levers = [m for m in spec if m.startswith("lever")]
    fixed = [m for m in spec if not m.startswith("lever")]
    main = levers[0] if levers else max(spec, key=lambda m: spec[m]["tokens_per_s"])
    a = spec[main]
    line = (f"# rtt {rtt_ms:g} ms: {main} {a['target_calls_per_token']:.3f} calls/token "
            f"({a['fewer_calls_than_ar_pct']:.1f}% fewer than target-only), "
            f"{a['tokens_per_s_vs_ar']:.2f}x target-only tokens/s")
    if levers and fixed:
        best = max(fixed, key=lambda m: spec[m]["tokens_per_s"])
        line += (f"; best fixed {best} {spec[best]['tokens_per_s_vs_ar']:.2f}x "
                 f"(lever {a['tokens_per_s'] / spec[best]['tokens_per_s']:.2f}x of it)")
    mism = sum(x["mismatches"] for x in aggs.values())
    if mism:
        line += f"  !! {mism} MISMATCHED OUTPUTS"
    return line


# -- plot ----------------------------------------------------------------------------------

def plot(result: dict, path: Path) -> None:
    """Two panels: target calls per token and tokens/s, bars per mode grouped by RTT."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["settings"]
    rtts = [str(r) for r in s["rtts_ms"] if str(r) in result["aggregates"]]
    modes = s["modes"]
    others = iter(OTHER_COLOURS * 4)
    colours = {m: MODE_COLOURS.get(m) or ("tab:brown" if m.startswith("lever") else next(others)) for m in modes}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / len(modes)
    panels = [("target_calls_per_token", "target calls per generated token", "target calls per token", ".2f"),
              ("tokens_per_s", "decode tokens/s (tokens per second)", "tokens/s", ".1f")]
    for ax, (key, ylabel, title, fmt) in zip(axes, panels):
        for i, mode in enumerate(modes):
            xs = [j + (i - len(modes) / 2) * width + width / 2 for j in range(len(rtts))]
            ys = [(result["aggregates"][r].get(mode) or {}).get(key) or 0.0 for r in rtts]
            bars = ax.bar(xs, ys, width, label=mode, color=colours[mode])
            ax.bar_label(bars, [format(y, fmt) for y in ys], fontsize=6, padding=1)
        ax.set_xticks(range(len(rtts)), [f"{r} ms" for r in rtts])
        ax.set_xlabel("emulated round-trip time (ms)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} by mode and RTT", fontsize=9)
        ax.margins(y=0.12)
    axes[0].legend(fontsize=8)
    loss = f", loss {s['loss']:g}" if s.get("loss") else ""
    fig.suptitle(f"edge-cloud: target {s['target']} (server), draft {s['draft']} (edge); "
                 f"{s['prompts']} prompts x {s['new_tokens']} tokens, {sampling_words(s.get('sampling'))}{loss}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- the run -------------------------------------------------------------------------------

def sampling_words(sampling) -> str:
    """'greedy', or 'temperature T, seed S'."""
    if not isinstance(sampling, dict) or not sampling:
        return "greedy"
    return f"temperature {sampling['temperature']:g}, seed {sampling['seed']}"


def sampling_of(args) -> dict:
    """The sampling keyword arguments of every generation ({} when greedy)."""
    return {"temperature": args.temperature, "seed": args.sampling_seed} if args.temperature > 0 else {}


def run_rtt(rtt_ms: float, args, server_port: int, draft, modes: dict[str, dict], prompts: list[dict],
            rows: list[dict], ar_reference: dict) -> tuple[dict, dict, dict]:
    """All prompts x modes over one emulated link. Appends per-prompt rows; returns the
    per-mode aggregates, the proxy's counters and the server info seen through it."""
    from lever.edge import RemoteTarget
    from lever.remote.netem import LinkProxy

    with LinkProxy("127.0.0.1", server_port, rtt_s=rtt_ms / 1000.0, loss=args.loss, seed=args.seed) as proxy:
        print(f"\n# rtt {rtt_ms:g} ms, loss {args.loss:g}: proxy {proxy.url} -> 127.0.0.1:{server_port}", flush=True)
        remotes = {mode: RemoteTarget(proxy.url, draft=draft, progress=False, **kw) for mode, kw in modes.items()}
        for mode, remote in remotes.items():            # warm-up: mode lever measures its draft here
            t0 = time.perf_counter()
            remote.generate(prompts[0]["text"], max_new_tokens=WARMUP_TOKENS)
            print(f"# warm-up {mode}: {time.perf_counter() - t0:.1f} s", flush=True)
        by_mode: dict[str, list[dict]] = {mode: [] for mode in modes}
        for i, prompt in enumerate(prompts):
            ref = None
            for mode, remote in remotes.items():
                row = {"rtt_ms": rtt_ms, "mode": mode, "prompt": prompt["id"],
                       "category": prompt.get("category"),
                       **measure(remote, prompt, args.new_tokens, sampling_of(args))}
                ids = row["token_ids"]
                if mode == "ar":
                    ref = ids
                    if ids is not None:
                        first = ar_reference.setdefault(prompt["id"], ids)
                        row["same_as_ar_at_first_rtt"] = first == ids
                elif ids is not None and ref is not None:
                    diff = first_difference(ids, ref)
                    row["exact"], row["first_difference"] = diff is None, diff
                print(progress_line(rtt_ms, i, len(prompts), prompt, mode, row), flush=True)
                if row.get("exact") is False:
                    print(f"!! MISMATCH: rtt {rtt_ms:g} ms, prompt {prompt['id']}, mode {mode} differs from ar "
                          f"at token {row['first_difference']}", flush=True)
                if row.get("same_as_ar_at_first_rtt") is False:
                    print(f"!! ar at rtt {rtt_ms:g} ms differs from ar at the first rtt on prompt {prompt['id']}",
                          flush=True)
                rows.append(row)
                by_mode[mode].append(row)
        link = proxy.stats()
        info = next(iter(remotes.values())).info
    aggs = {mode: aggregate(mode_rows) for mode, mode_rows in by_mode.items()}
    add_relative(aggs)
    return aggs, link, info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b", help="the server's model (default qwen2.5-coder-1.5b)")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="the edge's draft model (default qwen2.5-coder-0.5b)")
    ap.add_argument("--prompts", type=int, default=10, help="first N prompts of the v1 set (default 10)")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens per generation at most (default 64)")
    ap.add_argument("--rtt-ms", type=float, nargs="+", default=[0, 20, 80],
                    help="emulated round-trip times in milliseconds (default 0 20 80)")
    ap.add_argument("--loss", type=float, default=0.0, help="probability of losing a message, 0 <= loss < 1")
    ap.add_argument("--seed", type=int, default=0, help="seed of the proxy's loss draws (default 0)")
    ap.add_argument("--modes", nargs="+", default=DEFAULT_MODES,
                    help="ar | chain:K | tree:N[:TOPK:DEPTH] | lever[:N] (ar is always run: the reference)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0 = greedy (default); else every mode samples with --sampling-seed, and since sampling "
                         "is keyed by position its text must still equal ar's")
    ap.add_argument("--sampling-seed", type=int, default=5, help="the sampling seed of every run (default 5)")
    ap.add_argument("--out", default=None, help="output folder (default bench/results; with --replot: the JSON's)")
    ap.add_argument("--replot", default=None, metavar="JSON", help="only redraw the PNG from a saved bench_remote.json")
    args = ap.parse_args()

    if args.replot:
        src = Path(args.replot)
        out = Path(args.out) if args.out else src.parent
        out.mkdir(parents=True, exist_ok=True)
        plot(json.loads(src.read_text()), out / "bench_remote.png")
        print(f"# wrote {out / 'bench_remote.png'}")
        return 0

    from lever.api import load
    from lever.bench_prompts import load_prompts
    from lever.commands.bench import machine_info

    if not 0 <= args.loss < 1:
        ap.error(f"--loss must be in [0, 1), got {args.loss}")
    if any(r < 0 for r in args.rtt_ms):
        ap.error("--rtt-ms values must be >= 0")
    modes = parse_mode_list(args.modes)
    prompts = load_prompts("v1", limit=args.prompts)
    out = Path(args.out) if args.out else Path(__file__).parent / "results"
    out.mkdir(parents=True, exist_ok=True)
    rtts = [int(r) if float(r).is_integer() else r for r in args.rtt_ms]
    result = {"benchmark": "bench_remote", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "complete": False,
              "settings": {"target": args.target, "draft": args.draft, "prompt_set": "v1", "prompts": len(prompts),
                           "prompt_ids": [p["id"] for p in prompts], "new_tokens": args.new_tokens,
                           "rtts_ms": rtts, "loss": args.loss, "loss_seed": args.seed, "modes": list(modes),
                           "mode_args": {m: {k: (asdict(v) if is_dataclass(v) else v) for k, v in kw.items()}
                                         for m, kw in modes.items()},
                           "sampling": sampling_of(args) or "greedy", "chat": True, "warmup_tokens": WARMUP_TOKENS,
                           "server_max_tree_nodes": SERVER_MAX_TREE_NODES},
              "machine": machine_info(), "aggregates": {}, "links": {}, "headlines": [], "per_prompt": []}
    json_path = out / "bench_remote.json"

    port = free_port()
    server = None
    t_start = time.perf_counter()
    try:
        server = start_server(args.target, port)
        draft = load(args.draft)
        ar_reference: dict = {}
        for rtt in rtts:
            t0 = time.perf_counter()
            aggs, link, info = run_rtt(rtt, args, port, draft, modes, prompts, result["per_prompt"], ar_reference)
            result["server_info"] = info
            result["aggregates"][str(rtt)] = aggs
            result["links"][str(rtt)] = link
            print_table(rtt, aggs)
            line = headline(rtt, aggs)
            result["headlines"].append(line)
            print(line)
            print(f"# rtt {rtt:g} ms took {time.perf_counter() - t0:.0f} s", flush=True)
            json_path.write_text(json.dumps(result, indent=1))
        result["server_metrics"] = server_metrics(port)
    finally:
        stop_server(server)
    result["complete"] = True
    result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    mismatches = {f"{r} ms {m}": a["mismatches"] for r, aggs in result["aggregates"].items()
                  for m, a in aggs.items() if a["mismatches"]}
    result["mismatches"] = mismatches
    json_path.write_text(json.dumps(result, indent=1))
    plot(result, out / "bench_remote.png")
    print(f"\n# edge-cloud: target {args.target}, draft {args.draft}; {len(prompts)} prompts x {args.new_tokens} "
          f"tokens, {sampling_words(sampling_of(args))}, loss {args.loss:g}; {result['elapsed_s']:.0f} s")
    for line in result["headlines"]:
        print(line)
    if mismatches:
        print(f"!! NOT EXACT: outputs differing from target-only decoding: {mismatches}")
    print(f"# wrote {json_path} and {out / 'bench_remote.png'}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

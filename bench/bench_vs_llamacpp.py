"""Lever against llama.cpp under one memory cap, side by side, as a phone runs an app.

For every cap and every prompt, in turn:
  lever      `lever generate --target-store STORE --draft DRAFT --mode lever
             --memory-limit CAP --json` (the whole process planned into the cap)
  llama.cpp  `llama-speculative -m TARGET.gguf -md DRAFT.gguf` (greedy)
each in its own memory cgroup of CAP bytes (RAM + page cache, no swap,
page cache dropped before the run: lever/memory/cgroup.py, needs root).
Both decode greedily the same chat-formatted prompt; tokens/s is decoding
only (prefill excluded) as each tool reports it.

`--plain` adds in-memory plain decoding without a cap: `lever generate
--model M --mode ar` against `llama-simple -m M`, for the target and the
draft GGUF (the decode-speed bar of the native engine).

Prints one line per run and a summary per cap (median tokens/s of each
engine, their ratio, peak memory, major faults, OOM kills); writes JSON and
a PNG.  llama.cpp comes from bench/bench_llamacpp.py (`--build` there).

    python bench/bench_vs_llamacpp.py --target-store stores/qwen-1.5b --caps 868MB 1300MB \
        --prompts 4 --new-tokens 64 [--plain] [--llama-extra --no-repack]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_llamacpp as llamacpp                       # noqa: E402  (the llama.cpp side: build, argv, parsing)

from lever.bench_prompts import load_prompts            # noqa: E402
from lever.errors import LeverError                     # noqa: E402
from lever.extras import install_hint                   # noqa: E402
from lever.gguf.registry import resolve_model          # noqa: E402
from lever.memory import cgroup                         # noqa: E402
from lever.values import parse_size                     # noqa: E402


def lever_cmd(args, prompt_file: Path, cap: int | None, model: str | None = None) -> list[str]:
    """argv of one Lever run: speculative from the store under `cap`, or plain on an in-memory `model`."""
    cmd = [sys.executable, "-m", "lever.cli", "generate", "--prompt-file", str(prompt_file), "--json",
           "--max-new-tokens", str(args.new_tokens), "--temperature", "0"]
    if model is not None:          # plain decoding of the raw prompt, as llama-simple gets it
        return cmd + ["--model", model, "--mode", "ar", "--no-chat"]
    return cmd + ["--target-store", str(args.target_store), "--draft", args.draft, "--mode", "lever",
                  "--memory-limit", str(cap)]


def lever_figures(r: cgroup.RunResult) -> dict:
    """tokens/s, tokens, accepted length and the process's own memory figures from the JSON line."""
    try:
        out = json.loads(r.stdout_tail.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    spec = out.get("speculative") or {}
    mem = out.get("memory") or {}
    return {"tokens_per_s": out["timing"]["decode_tokens_per_s"], "decoded_tokens": out["new_tokens"],
            "mean_accepted_length": spec.get("mean_accepted_length"), "token_ids": out["token_ids"],
            "planned_store_budget_bytes": (mem.get("plan") or {}).get("store_budget_bytes"),
            "self_peak_rss_bytes": mem.get("peak_rss_bytes")}


def run_one(engine: str, cmd: list[str], cap: int | None, timeout_s: float) -> dict:
    tail = 1 << 20                              # bytes of output kept: Lever's JSON line holds every token id
    r = (cgroup.run_capped(cmd, cap, timeout_s=timeout_s, tail_bytes=tail) if cap
         else cgroup.run_uncapped(cmd, timeout_s=timeout_s, tail_bytes=tail))
    figures = lever_figures(r) if engine.startswith("lever") else llamacpp.parse_timings(r.stdout_tail + "\n" + r.stderr_tail)
    last = [x for x in r.stderr_tail.splitlines() if x.strip()]
    return {"engine": engine, "rc": r.rc, "oom_killed": r.oom_killed, "timed_out": r.timed_out,
            "peak_bytes": r.peak_bytes, "peak_rss_bytes": r.peak_rss_bytes, "major_faults": r.major_faults,
            "wall_s": round(r.wall_s, 3),
            "ok": r.rc == 0 and "tokens_per_s" in figures, "error": None if r.rc == 0 else (last[-1] if last else ""),
            **figures}


def line(cap: int | None, prompt_id: str, row: dict) -> str:
    speed = f"{row['tokens_per_s']:7.2f} tok/s" if row.get("tokens_per_s") is not None else "      - tok/s"
    acc = f" acc.len {row['mean_accepted_length']:.2f}" if row.get("mean_accepted_length") else ""
    state = "OOM-KILLED" if row["oom_killed"] else ("ok" if row["ok"] else f"FAILED rc {row['rc']}: {row['error']}")
    where = f"cap {cap / 1e6:,.0f} MB" if cap else "no cap"
    return (f"{where:<14} {row['engine']:<16} {prompt_id:<22} {speed}{acc}  peak {row['peak_bytes'] / 1e6:7,.0f} MB (RSS {row['peak_rss_bytes'] / 1e6:5,.0f})  "
            f"majflt {row['major_faults']:7d}  {state}")


def side_by_side(label: str, runs: list, cap: int | None, timeout_s: float, extra: dict) -> tuple[list, dict]:
    """Run [(prompt id, [(engine, argv), ...])] prompt by prompt, the engines in
    turn (machine noise spreads over all); print each run and the summary."""
    rows = []
    for prompt_id, pair in runs:
        for engine, cmd in pair:
            row = {"cap_bytes": cap, "prompt_id": prompt_id, **extra, **run_one(engine, cmd, cap, timeout_s)}
            print(line(cap, prompt_id, row), flush=True)
            rows.append(row)
    engines = tuple(engine for engine, _ in runs[0][1])
    s = summary(label, rows, engines)
    print_summary(s, engines)
    return rows, s


def median_tps(rows: list[dict]) -> float | None:
    ok = [r["tokens_per_s"] for r in rows if r["ok"]]
    return statistics.median(ok) if ok else None


def summary(label: str, rows: list[dict], engines: tuple[str, ...]) -> dict:
    """Per engine: median tokens/s, max peak, total major faults, OOM kills; the
    ratio of the first engine (Lever) to the fastest of the others."""
    out = {"label": label}
    for e in engines:
        sel = [r for r in rows if r["engine"] == e]
        out[e] = {"median_tokens_per_s": median_tps(sel), "runs": len(sel), "ok": sum(r["ok"] for r in sel),
                  "oom_kills": sum(r["oom_killed"] for r in sel), "max_peak_bytes": max(r["peak_bytes"] for r in sel),
                  "max_peak_rss_bytes": max(r["peak_rss_bytes"] for r in sel),
                  "major_faults": sum(r["major_faults"] for r in sel)}
    a = out[engines[0]]["median_tokens_per_s"]
    b = max((out[e]["median_tokens_per_s"] or 0 for e in engines[1:]), default=0)
    out["ratio"] = round(a / b, 3) if a and b else None
    return out


def print_summary(s: dict, engines: tuple[str, ...]) -> None:
    parts = []
    for e in engines:
        x = s[e]
        tps = f"{x['median_tokens_per_s']:.2f}" if x["median_tokens_per_s"] else "-"
        parts.append(f"{e} {tps} tok/s (ok {x['ok']}/{x['runs']}, OOM {x['oom_kills']}, peak "
                     f"{x['max_peak_bytes'] / 1e6:,.0f} MB, RSS {x['max_peak_rss_bytes'] / 1e6:,.0f} MB, "
                     f"majflt {x['major_faults']})")
    ratio = f"{s['ratio']:.2f}x" if s["ratio"] else "n/a"
    rest = engines[1] if len(engines) == 2 else f"the fastest of {', '.join(engines[1:])}"
    print(f"# {s['label']}: " + "; ".join(parts) + f"; {engines[0]} / {rest} = {ratio}", flush=True)


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sums = report["summaries"]
    fig, ax = plt.subplots(figsize=(8, 4))
    colors, labelled = {}, set()
    for k, s in enumerate(sums):
        engines = [e for e in s if e not in ("label", "ratio")]
        width = 0.8 / len(engines)
        for j, e in enumerate(engines):
            kind = "lever" if e.startswith("lever") else e.replace(" plain", "")
            color = colors.setdefault(kind, f"C{len(colors)}")
            v = s[e]["median_tokens_per_s"] or 0
            x = k + (j - (len(engines) - 1) / 2) * width
            ax.bar(x, v, width, color=color, label=kind if kind not in labelled else None)
            labelled.add(kind)
            note = "OOM" if not v and s[e]["oom_kills"] else f"{v:.1f}"
            ax.text(x, v, note, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(sums)), [s["label"].replace(", ", "\n").replace(".gguf", "") for s in sums], fontsize=8)
    ax.set_ylabel("decode tokens/s (median over prompts)")
    ax.set_title("Lever vs llama.cpp, same GGUF pair, same memory cap")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target-store", type=Path, required=True, help="the target's flash store (lever convert)")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b", help="the target's GGUF (name or path) for llama.cpp")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model (name or path), both engines")
    ap.add_argument("--caps", nargs="+", default=["868MB", "1300MB"], help="memory caps (cgroup limits)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-set", default="v1")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--plain", action="store_true", help="also plain decoding in memory, no cap, per model")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    ap.add_argument("--draft-max", type=int, default=8, help="llama.cpp draft tokens per step")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--llamacpp-dir", type=Path, default=llamacpp.DEFAULT_CACHE)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--no-repack-too", action="store_true",
                    help="under each cap also run llama-speculative with --no-repack (weights used in place from "
                         "the file mapping instead of repacked into anonymous memory); Lever is compared with the "
                         "faster of the two")
    ap.add_argument("--llama-extra", nargs=argparse.REMAINDER, default=[],
                    help="further llama-speculative arguments (e.g. --llama-extra --no-mmap)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--name", default="vs_llamacpp")
    args = ap.parse_args(argv)

    bins = llamacpp.binaries(args.llamacpp_dir / "build")
    needed = ["llama-speculative"] + (["llama-simple"] if args.plain else [])
    missing = [t for t in needed if bins[t] is None]
    if missing:
        raise LeverError(f"llama.cpp binaries absent: {', '.join(missing)} under {args.llamacpp_dir}/build/bin "
                         f"(build them: python bench/bench_llamacpp.py --build --cache-dir {args.llamacpp_dir})")
    caps = [parse_size(c) for c in args.caps]
    ctl = cgroup.find_controller()            # a clear error now (root, controller), not after the first run
    target, draft = resolve_model(args.target), resolve_model(args.draft)
    prompts = load_prompts(args.prompt_set, None, args.prompts)
    texts = llamacpp.formatted_prompts(target, prompts, chat=True)
    # llama.cpp's argv builder takes the bench_llamacpp option names
    ll = argparse.Namespace(new_tokens=args.new_tokens, context=args.context, draft_max=args.draft_max,
                            threads=args.threads, extra=args.llama_extra, plain=args.plain)
    print(f"# lever vs llama.cpp: target {args.target_store} / {target.name}, draft {draft.name}; "
          f"{len(prompts)} prompts, {args.new_tokens} new tokens, greedy; cgroup v{ctl.version}, page cache "
          f"dropped before every run; llama.cpp {llamacpp.SDIST_VERSION} "
          f"{' '.join(args.llama_extra) or '(default flags)'}", flush=True)
    rows, summaries = [], []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lever-vs-llamacpp-") as tmp:
        raw_files, chat_files = [], []
        for p, text in zip(prompts, texts):
            stem = p["id"].replace("/", "_")
            raw_files.append(Path(tmp) / f"{stem}.raw.txt")
            raw_files[-1].write_text(p["text"], encoding="utf-8")
            chat_files.append(Path(tmp) / f"{stem}.chat.txt")
            chat_files[-1].write_text(text, encoding="utf-8")
        for cap in caps:
            runs = []
            for p, raw, chat in zip(prompts, raw_files, chat_files):
                spec = llamacpp.commands(bins, target, draft, chat, ll)["speculative"]
                engines = [("lever", lever_cmd(args, raw, cap)), ("llama.cpp", spec)]
                if args.no_repack_too:
                    engines.append(("llama.cpp no-repack", spec + ["--no-repack"]))
                runs.append((p["id"], engines))
            cap_rows, s = side_by_side(f"cap {cap / 1e6:,.0f} MB", runs, cap, args.timeout, {})
            rows += cap_rows
            summaries.append(s)
        if args.plain:
            for model in (target, draft):
                runs = [(p["id"], [("lever ar", lever_cmd(args, raw, None, model=str(model))),
                                   ("llama.cpp plain", llamacpp.commands(bins, model, draft, raw, ll)["plain"])])
                        for p, raw in zip(prompts, raw_files)]
                plain_rows, s = side_by_side(f"in memory, {model.name}", runs, None, args.timeout,
                                             {"model": model.name})
                rows += plain_rows
                summaries.append(s)
    report = {"benchmark": "lever vs llama.cpp", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "target_store": str(args.target_store), "target_gguf": str(target), "draft_gguf": str(draft),
              "caps_bytes": caps, "prompts": [p["id"] for p in prompts], "new_tokens": args.new_tokens,
              "llamacpp": {"sdist": llamacpp.SDIST_VERSION, "threads": args.threads, "draft_max": args.draft_max,
                           "extra": args.llama_extra, "no_repack_too": args.no_repack_too},
              "cgroup_version": ctl.version, "bench_s": round(time.perf_counter() - t0, 1),
              "summaries": summaries, "runs": [{k: v for k, v in r.items() if k != "token_ids"} for r in rows]}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.json"
    path.write_text(json.dumps(report, indent=1))
    wrote = [str(path)]
    try:
        plot(report, args.out / f"{args.name}.png")
        wrote.append(str(args.out / f"{args.name}.png"))
    except ImportError:
        print(f"# PNG skipped: matplotlib is not installed ({install_hint('plot')})", flush=True)
    print(f"# wrote {' and '.join(wrote)}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LeverError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)

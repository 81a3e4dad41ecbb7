"""Adaptivity: the same prompts under four memory / flash settings, fixed trees vs lever.

    python bench/adaptivity.py --store STORE_DIR --target-model qwen2.5-coder-1.5b \
        --draft qwen2.5-coder-0.5b [--prompts 5 --new-tokens 32] [--out bench/results]

Settings (one `lever bench` process each, modes interleaved per prompt):

  a  all streamed     the smallest DRAM budget the store accepts (no layer pinned)
  b  half pinned      the smallest budget that pins half of the layers
  c  resident         the target's GGUF fully in DRAM (no flash at all)
  d  throttled        setting b with the flash reader capped at --read-limit

For each setting it reports the measured I/O share of a target-only pass
(stall / pass time in ar mode), the best fixed chain and tree, lever's
tokens/s and its mean tree size. The tree lever grows should rise with the
I/O share and shrink without it; lever should beat the best fixed tree in
each setting. Writes adaptivity.json and adaptivity.png (tokens/s per mode
per setting; lever's tree size against the I/O share).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lever.errors import DramBudgetError
from lever.store.manifest import StoreManifest
from lever.store.residency import plan_residency

MODES = ["ar", "chain:4", "chain:6", "tree:16", "tree:32", "tree:64", "lever"]


def budget_for(manifest: StoreManifest, pinned_layers: int, kv_tokens: int) -> int:
    """The smallest DRAM budget (bytes, 1 MB steps) whose plan pins at least
    `pinned_layers` decoder layers (0: the smallest the store accepts)."""
    lo, hi = 1_000_000, 4 * manifest.weights_bytes + 2_000_000_000

    def ok(b: int) -> bool:
        try:
            return plan_residency(manifest, b, kv_tokens=kv_tokens).pinned_layers >= pinned_layers
        except DramBudgetError:
            return False

    while hi - lo > 1_000_000:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def run_bench(name: str, target_args: list[str], args, out: Path) -> dict:
    cmd = [sys.executable, "-m", "lever.cli", "bench", *target_args, "--draft", args.draft,
           "--modes", *MODES, "--prompts", str(args.prompts), "--max-new-tokens", str(args.new_tokens),
           "--out", str(out), "--name", f"adaptivity_{name}", "--no-progress"]
    if args.drop_caches:
        cmd.append("--drop-caches")
    print(f"## setting {name}: {' '.join(cmd[3:])}", flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"## setting {name} took {time.perf_counter() - t0:.0f} s", flush=True)
    return json.loads((out / f"adaptivity_{name}.json").read_text())


def summarise(name: str, label: str, r: dict) -> dict:
    modes = r["modes"]
    ar = modes["ar"]
    split = ar["time_split_s"]
    verify = split["verify_compute"] + split["io_stall"]
    trees = {k: v for k, v in modes.items() if k.startswith("tree")}
    chains = {k: v for k, v in modes.items() if k.startswith("chain")}
    best_tree = max(trees.values(), key=lambda a: a["tokens_per_s"])
    best_chain = max(chains.values(), key=lambda a: a["tokens_per_s"])
    lever = modes["lever"]
    return {"setting": name, "label": label, "io_share": split["io_stall"] / verify if verify else 0.0,
            "ar_tokens_per_s": ar["tokens_per_s"],
            "best_chain": best_chain["mode"], "best_chain_tokens_per_s": best_chain["tokens_per_s"],
            "best_tree": best_tree["mode"], "best_tree_tokens_per_s": best_tree["tokens_per_s"],
            "lever_tokens_per_s": lever["tokens_per_s"], "lever_mean_tree": lever["mean_tree_size"],
            "lever_accepted_length": lever["mean_accepted_length"],
            "lever_vs_best_tree": lever["tokens_per_s"] / best_tree["tokens_per_s"],
            "lever_vs_best_chain": lever["tokens_per_s"] / best_chain["tokens_per_s"],
            "lever_vs_ar": lever["tokens_per_s"] / ar["tokens_per_s"],
            "mismatches": {k: v.get("mismatches") for k, v in modes.items()},
            "tokens_per_s": {k: v["tokens_per_s"] for k, v in modes.items()},
            "lever": lever.get("lever")}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / len(MODES)
    others = iter(["tab:gray", "tab:blue", "tab:cyan", "tab:orange", "tab:olive", "tab:brown", "tab:purple"])
    for i, mode in enumerate(MODES):
        xs = [j + (i - len(MODES) / 2) * width + width / 2 for j in range(len(rows))]
        color = "tab:red" if mode == "lever" else next(others)
        ax1.bar(xs, [r["tokens_per_s"][mode] for r in rows], width, label=mode, color=color)
    ax1.set_xticks(range(len(rows)), [f"{r['setting']}: {r['label']}" for r in rows], fontsize=8)
    ax1.set_ylabel("decode tokens/s")
    ax1.legend(fontsize=7, ncol=2)
    ax1.set_title("tokens/s per mode and setting", fontsize=9)
    order = sorted(rows, key=lambda r: r["io_share"])
    ax2.plot([100 * r["io_share"] for r in order], [r["lever_mean_tree"] for r in order], "o-", color="tab:red")
    for r in order:
        ax2.annotate(r["setting"], (100 * r["io_share"], r["lever_mean_tree"]), xytext=(4, 4),
                     textcoords="offset points")
    ax2.set_xlabel("I/O share of a target-only pass (%)")
    ax2.set_ylabel("lever: mean draft nodes per tree")
    ax2.set_title("lever's tree size follows the I/O share", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="flash store of the target (lever convert)")
    ap.add_argument("--target-model", required=True, help="the same target as a GGUF / registered name (setting c)")
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--read-limit", default="400MB/s", help="setting d's flash read cap (default 400MB/s)")
    ap.add_argument("--settings", default="abcd", help="which settings to run (default abcd)")
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--replot", action="store_true", help="only redraw adaptivity.png from adaptivity.json in --out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        plot(json.loads((out / "adaptivity.json").read_text())["settings"], out / "adaptivity.png")
        return
    manifest = StoreManifest.load(args.store)
    kv = 1024                          # a bench's KV rows: prompts + new tokens + a 255-node tree, rounded up
    half = manifest.config.n_layers // 2
    b_all, b_half = budget_for(manifest, 0, kv), budget_for(manifest, half, kv)
    settings = {
        "a": ("all streamed", ["--target-store", args.store, "--dram-budget", str(b_all)]),
        "b": (f"{half} layers pinned", ["--target-store", args.store, "--dram-budget", str(b_half)]),
        "c": ("resident", ["--model", args.target_model]),
        "d": (f"half pinned, {args.read_limit}", ["--target-store", args.store, "--dram-budget", str(b_half),
                                                 "--read-limit", args.read_limit]),
    }
    rows = []
    for name in args.settings:
        label, target_args = settings[name]
        rows.append(summarise(name, label, run_bench(name, target_args, args, out)))
    print(f"# adaptivity: {args.prompts} prompts x {args.new_tokens} tokens, greedy, draft {args.draft}; "
          f"budgets a {b_all / 1e6:.0f} MB, b/d {b_half / 1e6:.0f} MB")
    head = (f"{'setting':<28}{'I/O share':>10}{'ar':>8}{'best chain':>18}{'best tree':>18}{'lever':>8}"
            f"{'tree':>7}{'acc.len':>8}{'vs tree':>9}{'vs chain':>9}{'vs ar':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['setting'] + ' ' + r['label']:<28}{100 * r['io_share']:9.0f}%{r['ar_tokens_per_s']:8.2f}"
              f"{r['best_chain']:>10}{r['best_chain_tokens_per_s']:8.2f}{r['best_tree']:>10}"
              f"{r['best_tree_tokens_per_s']:8.2f}{r['lever_tokens_per_s']:8.2f}{r['lever_mean_tree']:7.1f}"
              f"{r['lever_accepted_length']:8.2f}{r['lever_vs_best_tree']:8.2f}x{r['lever_vs_best_chain']:8.2f}x"
              f"{r['lever_vs_ar']:6.2f}x")
    (out / "adaptivity.json").write_text(json.dumps({"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                                     "modes": MODES, "prompts": args.prompts,
                                                     "new_tokens": args.new_tokens, "settings": rows}, indent=1))
    plot(rows, out / "adaptivity.png")
    print(f"# wrote {out / 'adaptivity.json'} and {out / 'adaptivity.png'}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

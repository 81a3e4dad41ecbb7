"""Verified rows per second against llama.cpp's `llama-bench`, in memory, side by side.

For each model (default: the 1.5B target and the 0.5B draft), in one run:

- Lever: the model loaded into DRAM as `lever generate` loads it (weights
  repacked where this CPU's kernels use repacked weights); for each n a
  verify pass of n new rows from an empty cache -- the decoder and the head's
  argmax for every row, as the target verifies a tree -- timed over --reps
  passes (median); rows/s = n / seconds. Also a prefill pass of the same n
  rows whose head runs for the last row only, as llama-bench's pp does (the
  like-for-like figure: a verify pass pays the head for every row, which
  with a large vocabulary -- Gemma 3's 262,144 -- is most of its cost).
  One-row decoding: --tg tokens, one forward pass each (argmax head), tokens/s.
- llama.cpp: `llama-bench -m GGUF -t THREADS -p n -n 0 -r REPS -o json` on the
  same GGUF file (pp: a batch of n prompt tokens from an empty context, logits
  of the last row only) and `-p 0 -n TG` (tg: one-token decoding).
The two alternate n by n, over --rounds rounds, and each figure is the median
over rounds: this machine's speed drifts by tens of percent from minute to
minute, and interleaving makes a slow spell hit both engines alike.

Both use --threads threads (Lever's native pool, llama.cpp's -t). Prints one
line per (model, n) with both engines and their ratio, writes JSON and a PNG
of rows/s against n for both engines and both models.

    python bench/rows_vs_llamacpp.py [--models qwen2.5-coder-1.5b qwen2.5-coder-0.5b]
        [--n 1 4 8 16 32 64] [--tg 128] [--threads 2] [--reps 3] [--rounds 3] [--out bench/results]

llama-bench comes from `python bench/bench_llamacpp.py --build`. Run on a quiet
machine: another job on the cores cuts llama.cpp's batched speed by 3-10x.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_llamacpp as llamacpp  # noqa: E402  (where llama.cpp is built)
from lever import _native  # noqa: E402
from lever.cost.identity import machine_identity  # noqa: E402
from lever.gguf.registry import resolve_model  # noqa: E402
from lever.model.native_loader import load_gguf_native  # noqa: E402


class LeverRows:
    """The model at `path` loaded into DRAM as `lever generate` loads it
    (weights repacked where this CPU's kernels use repacked weights)."""

    def __init__(self, path: Path, dtype: str, max_n: int, tg: int):
        self.decoder, _ = load_gguf_native(path, dtype=dtype)
        entries = self.decoder.weights.layouts[0].entries
        self.repacked = any(t != _native.base_type(t) for _, _, t, _ in entries)
        self.tokens = np.random.default_rng(0).integers(100, 20000, size=max(max_n, tg), dtype=np.int64)
        self.capacity = max(max_n, tg) + 8

    def verify(self, n: int, reps: int, last_row_only: bool = False) -> float:
        """rows/s of a verify pass of n rows from an empty cache (decoder + argmax
        head for every row, or for the last row only: a prefill pass), the
        median of `reps` passes after one warm-up."""
        times = []
        mask = np.tril(np.ones((n, n), dtype=bool))
        rows = np.array([n - 1], dtype=np.int64) if last_row_only else None
        for _ in range(reps + 1):
            cache = self.decoder.new_cache(self.capacity)
            t0 = time.perf_counter()
            self.decoder.forward(self.tokens[:n], np.arange(n, dtype=np.int64), mask, cache, logits_rows=rows,
                                 head="argmax")
            times.append(time.perf_counter() - t0)
        return n / float(np.median(times[1:]))

    def decode(self, tg: int) -> float:
        """tokens/s of one-row greedy decoding of `tg` tokens (one pass each)."""
        cache = self.decoder.new_cache(self.capacity)
        token = self.tokens[:1]
        t0 = time.perf_counter()
        for i in range(tg):
            mask = np.ones((1, cache.length + 1), dtype=bool)
            out = self.decoder.forward(token, np.array([i], dtype=np.int64), mask, cache, head="argmax")
            token = np.asarray(out, dtype=np.int64).reshape(1)
        return tg / (time.perf_counter() - t0)


def llama_bench(binary: Path, path: Path, threads: int, reps: int, n_prompt: int, n_gen: int) -> tuple[float, list]:
    """(rows or tokens per second, argv) of one llama-bench test: pp n_prompt
    (n_gen 0) or tg n_gen (n_prompt 0), its average over `reps` repetitions."""
    argv = [str(binary), "-m", str(path), "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen),
            "-r", str(reps), "-o", "json"]
    rows = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)
    wanted = [r for r in rows if int(r["n_prompt"]) == n_prompt and int(r["n_gen"]) == n_gen]
    return float(wanted[0]["avg_ts"]), argv


def measure_model(name: str, binary: Path, args) -> dict:
    """Both engines on one model, interleaved n by n, over --rounds rounds
    (medians), so that a slow spell of the machine hits both alike."""
    path = Path(resolve_model(name))
    lever = LeverRows(path, args.dtype, max(args.n), args.tg)
    runs = {"lever": {n: [] for n in args.n}, "lever_prefill": {n: [] for n in args.n},
            "llamacpp": {n: [] for n in args.n},
            "lever_tg": [], "llamacpp_tg": []}
    argvs = []
    for rnd in range(args.rounds):
        for n in args.n:
            runs["lever"][n].append(lever.verify(n, args.reps))
            runs["lever_prefill"][n].append(lever.verify(n, args.reps, last_row_only=True))
            rate, argv = llama_bench(binary, path, args.threads, args.reps, n, 0)
            runs["llamacpp"][n].append(rate)
            argvs.append(argv)
            print(f"  round {rnd + 1} n={n:3d}  lever {runs['lever'][n][-1]:8.2f} (prefill "
                  f"{runs['lever_prefill'][n][-1]:8.2f})  llama.cpp {rate:8.2f} rows/s", file=sys.stderr, flush=True)
        runs["lever_tg"].append(lever.decode(args.tg))
        rate, argv = llama_bench(binary, path, args.threads, args.reps, 0, args.tg)
        runs["llamacpp_tg"].append(rate)
        argvs.append(argv)
        print(f"  round {rnd + 1} tg{args.tg}  lever {runs['lever_tg'][-1]:8.2f}  llama.cpp {rate:8.2f} tokens/s",
              file=sys.stderr, flush=True)
    med = lambda v: float(np.median(v))  # noqa: E731
    return {"gguf": str(path), "repacked": lever.repacked, "runs": runs, "llama_bench_argv": argvs[:2],
            "lever": {"verify": {n: med(runs["lever"][n]) for n in args.n},
                      "prefill": {n: med(runs["lever_prefill"][n]) for n in args.n}, "tg": med(runs["lever_tg"])},
            "llamacpp": {"pp": {n: med(runs["llamacpp"][n]) for n in args.n}, "tg": med(runs["llamacpp_tg"])}}


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = report["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    for ax, (name, m) in zip(axes[0], models.items()):
        ns = sorted(int(n) for n in m["lever"]["verify"])
        ax.plot(ns, [m["lever"]["verify"][n] for n in ns], "o-", label="Lever verify pass")
        if "prefill" in m["lever"]:
            ax.plot(ns, [m["lever"]["prefill"][n] for n in ns], "^-", label="Lever prefill (head: last row)")
        ax.plot(ns, [m["llamacpp"]["pp"].get(n) for n in ns], "s--", label="llama.cpp pp (llama-bench)")
        ax.axhline(m["lever"]["tg"], color="C0", lw=0.8, ls=":", label="Lever one-row decode")
        ax.axhline(m["llamacpp"]["tg"], color="C1", lw=0.8, ls=":", label="llama.cpp tg")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("rows per pass (n)")
        ax.set_ylabel("rows / s")
        ax.set_title(f"{name}, {report['threads']} threads, in memory")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(report["host"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    ap.add_argument("--tg", type=int, default=128, help="tokens of one-row decoding")
    ap.add_argument("--threads", type=int, default=2, help="Lever's pool and llama.cpp's -t")
    ap.add_argument("--reps", type=int, default=3, help="passes per measurement (llama-bench -r)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--llamacpp-dir", type=Path, default=llamacpp.DEFAULT_CACHE)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--name", default="rows_vs_llamacpp")
    args = ap.parse_args(argv)
    if min(args.n) < 1 or min(args.tg, args.threads, args.reps, args.rounds) < 1:
        ap.error("--n, --tg, --threads, --reps and --rounds must be positive")
    binary = llamacpp.binaries(args.llamacpp_dir / "build").get("llama-bench")
    if binary is None:
        print(f"error: no llama-bench under {args.llamacpp_dir / 'build'} "
              f"(build it with: python bench/bench_llamacpp.py --build)", file=sys.stderr)
        return 2
    _native.set_num_threads(args.threads)
    info = machine_identity()
    host = f"{info['cpu']}, {info['logical_cpus']} cpus, isas {'/'.join(_native.available_isas())}"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    report = {"tool": "rows_vs_llamacpp", "commit": commit, "threads": args.threads, "n": args.n,
              "tg": args.tg, "reps": args.reps, "rounds": args.rounds, "dtype": args.dtype,
              "kernel_isa": _native.kernel_isa(), "machine": info, "host": host,
              "argv": sys.argv, "models": {}}
    print(f"uptime: {os.getloadavg()}  kernel isa: {_native.kernel_isa()}  threads: {args.threads}")
    for name in args.models:
        print(f"{name}:", file=sys.stderr, flush=True)
        m = report["models"][name] = measure_model(name, binary, args)
        lever, llama = m["lever"], m["llamacpp"]
        for n in args.n:
            a, b, c = lever["verify"][n], llama["pp"][n], lever["prefill"][n]
            print(f"{name:20s} n={n:3d}  lever verify {a:8.2f} rows/s  llama.cpp pp {b:8.2f} rows/s  {a / b:5.2f}x"
                  f"   (lever prefill, head on the last row as pp: {c:8.2f} rows/s  {c / b:5.2f}x)")
        print(f"{name:20s} tg{args.tg}  lever {lever['tg']:8.2f} tok/s   llama.cpp {llama['tg']:8.2f} tok/s   "
              f"{lever['tg'] / llama['tg']:5.2f}x")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path = args.out / f"{args.name}-{stamp}.json"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    png_path = json_path.with_suffix(".png")
    plot(report, png_path)
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A new user's first run against their second: what measuring the device costs.

    python bench/first_run.py --target-store STORE --draft qwen2.5-coder-0.5b \
        --memory-limit 868MB --max-new-tokens 128 --out DIR [--full]

Runs the same `lever generate --json` twice in a fresh cache directory (the
registered models are linked in, as after `pip install`; tokenizers and
profiles start empty): the first run measures the device for mode lever,
the second finds the cached profile.  With --full, a third, separate cache
directory measures the profile in full (`--reprofile`: every tree size,
whole streamed passes), the way first runs did before the quick estimate.

Prints and writes (first_run.json) per run: wall seconds, decode tokens/s,
mean accepted length, the profile's own seconds and flash bytes (from its
stderr line) against one pass's bytes (the store's weights.bin), and the
ratios the bars ask for: first wall / warm wall (<= 1.5), first tokens/s /
warm tokens/s (>= 0.9), profile bytes / 5 passes (<= 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path



def cache_root() -> Path:
    return Path(os.environ.get("LEVER_CACHE_DIR") or Path.home() / ".cache" / "lever")


def fresh_cache(parent: Path, name: str) -> Path:
    """A cache directory holding only a link to the installed models."""
    d = parent / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / "models").symlink_to(cache_root() / "models")
    return d


def generate(args, cache: Path, extra: list[str]) -> dict:
    """One `lever generate --json` run: its wall seconds, tokens/s, accepted length and profile line."""
    cmd = ["lever", "generate", "--target-store", args.target_store, "--draft", args.draft,
           "--memory-limit", args.memory_limit, "--prompt", args.prompt, "--max-new-tokens",
           str(args.max_new_tokens), "--cache-dir", str(cache), "--json", *extra]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"first_run: `{' '.join(cmd)}` failed: {done.stderr.strip().splitlines()[-1:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    spec = out.get("speculative") or {}
    profile = measured_profile(cache, since=t0)
    return {"wall_s": round(wall, 3), "tokens_per_s": out["timing"]["tokens_per_s"],
            "new_tokens": len(out["token_ids"]), "accepted_length": spec.get("mean_accepted_length"),
            "profile_quick": profile.get("quick"), "profile_s": profile.get("measure_s"),
            "profile_read_bytes": profile.get("read_bytes"),
            "profile_lines": [line for line in done.stderr.splitlines() if "measured" in line],
            "token_ids": out["token_ids"]}


def measured_profile(cache: Path, since: float) -> dict:
    """The device profile a run wrote into `cache` (its seconds, bytes read, quick or full); {} if none."""
    for path in sorted((cache / "profiles").glob("*.json")):
        if path.name.startswith("calibration"):
            continue
        profile = json.loads(path.read_text())
        if "read_bytes" in profile and path.stat().st_mtime >= time.time() - (time.perf_counter() - since):
            return profile
    return {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target-store", required=True)
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--memory-limit", default="868MB")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompt", default="Write a Python function that checks whether a number is prime.")
    ap.add_argument("--full", action="store_true", help="also time a first run that measures the profile in full")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="lever-first-run-"))
    pass_bytes = (Path(args.target_store) / "weights.bin").stat().st_size
    try:
        cache = fresh_cache(scratch, "quick")
        runs = {"first": generate(args, cache, []), "warm": generate(args, cache, [])}
        if args.full:
            runs["full_first"] = generate(args, fresh_cache(scratch, "full"), ["--reprofile"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    first, warm = runs["first"], runs["warm"]
    report = {"command": " ".join(sys.argv), "pass_bytes": pass_bytes, "runs": runs,
              "first_over_warm_wall": round(first["wall_s"] / warm["wall_s"], 3),
              "first_over_warm_tokens_per_s": round(first["tokens_per_s"] / warm["tokens_per_s"], 3),
              "profile_bytes_over_5_passes": (round(first["profile_read_bytes"] / (5 * pass_bytes), 4)
                                              if first["profile_read_bytes"] else None),
              "same_tokens": first["token_ids"] == warm["token_ids"]}
    for name, r in runs.items():
        print(f"{name:10s} wall {r['wall_s']:7.2f} s  {r['tokens_per_s']:6.2f} tok/s  accepted "
              f"{r['accepted_length']}  profile measured: "
              + (f"{r['profile_s']:.1f} s, {r['profile_read_bytes'] / 1e9:.2f} GB read"
                 f"{' (quick)' if r['profile_quick'] else ' (full)'}" if r["profile_s"] is not None else "no (cached)"))
    print(f"first/warm wall {report['first_over_warm_wall']} (bar <= 1.5), first/warm tok/s "
          f"{report['first_over_warm_tokens_per_s']} (bar >= 0.9), profile bytes / 5 passes "
          f"{report['profile_bytes_over_5_passes']} (bar <= 1), same tokens {report['same_tokens']}")
    (out / "first_run.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rebuild the acceptance calibration shipped with Lever (`python/lever/data/calibration/`).

For a registered draft/target pair this runs lever's own speculative engine
(mode lever) over the calibration prompt set `lever/data/calibration_prompts_v1.json`
(30 prompts written for Lever: code, math, prose -- disjoint from the
benchmark set prompts_v1.json), records every trial (a child of an accepted
tree node: its draft probability q, depth, rank, and whether the target
accepted it), replays the trials through a cold `AcceptanceCalibration`
(prompt by prompt, iteration by iteration, as a user's run would) and writes
the result as `<draft>__<target>__<sampling>.json`, keyed by the SHA-256 of
the two GGUFs (lever.mode_lever.shipped_calibration finds it by those).

The trees are grown by the gain-cost policy with the calibration frozen at
the raw draft probability (a cold start: trees by draft path probability)
and a fixed synthetic cost (verify 40 ms + 0.5 ms per node, draft 10 ms +
0.1 ms per node) that makes trees of tens of nodes, so trials cover low q,
deep and low-rank nodes, not only what one machine's profile would draft.

    python bench/build_calibration.py                    # greedy and T=0.7, 30 prompts
    python bench/build_calibration.py --sampling greedy --limit 4 --max-new-tokens 32
    python bench/build_calibration.py --from-trials      # rebuild the tables from recorded trials
    python bench/build_calibration.py --prompts bench --limit 3 --trace tests/data/calibration_trace.npz

Recorded trials go to bench/results/calibration/ (not committed; --from-trials
reads them back, e.g. after a change of the calibration rule or layout).  --trace
writes the trials of one setting as a per-iteration trace instead of a
table (the recorded trace of tests/draft/test_calibration.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from lever.api import load, make_drafter
from lever.bench_prompts import load_prompts
from lever.draft.calibration import AcceptanceCalibration
from lever.draft.gain_cost import CostCurves, GainCostPolicy
from lever.engine import SpecConfig
from lever.files import file_sha256
from lever.gguf.registry import find_model
from lever.mode_lever import sampling_key, shipped_table_name, SHIPPED_FORMAT
from lever.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "python" / "lever" / "data" / "calibration"
TRIALS_DIR = ROOT / "bench" / "results" / "calibration"
SAMPLINGS = {"greedy": dict(temperature=0.0), "t0.7": dict(temperature=0.7, seed=1234)}
COST = CostCurves.linear(verify_fixed_s=0.04, verify_per_token_s=0.0005, draft_fixed_s=0.01,
                         draft_per_node_s=0.0001)
MAX_NODES, MAX_DEPTH, TOPK = 64, 10, 4


class TrialRecorder(AcceptanceCalibration):
    """A calibration that stays cold (estimates = q) and records every trial it is shown."""

    def __init__(self):
        super().__init__()
        self.trials: list[tuple[np.ndarray, ...]] = []
        self.iteration = 0

    def update(self, q, depth, rank, accepted) -> None:
        q = np.asarray(q, dtype=np.float64).ravel()
        self.trials.append((q, np.asarray(depth).ravel(), np.asarray(rank).ravel(),
                            np.asarray(accepted, dtype=bool).ravel(), np.full(q.size, self.iteration)))
        self.iteration += 1


def model_sha256(name: str) -> str:
    """The registry's SHA-256 of a registered model, else the file's own."""
    entry = find_model(name)
    if entry is not None:
        return entry.sha256
    return file_sha256(name)


def record(target, drafter, prompts: list[dict], sampling: str, max_new_tokens: int) -> dict:
    """Run every prompt; the trials as arrays (q, depth, rank, accepted, iteration, prompt)."""
    recorder = TrialRecorder()
    policy = GainCostPolicy(COST, recorder, max_nodes=MAX_NODES, max_depth=MAX_DEPTH, topk=TOPK, adapt=False)
    prompt_of = []
    tokens = 0
    t0 = time.perf_counter()
    with tqdm(prompts, desc=f"recording trials ({sampling})", unit="prompt") as bar:
        for i, p in enumerate(bar):
            n_before = len(recorder.trials)
            out = target.generate(p["text"], max_new_tokens=max_new_tokens, drafter=drafter,
                                  spec=SpecConfig("lever", policy=policy), **SAMPLINGS[sampling])
            tokens += len(out.token_ids)
            prompt_of += [np.full(t[0].size, i) for t in recorder.trials[n_before:]]
            bar.set_postfix(iterations=recorder.iteration, tokens=tokens)
    cols = list(zip(*recorder.trials))
    names = ("q", "depth", "rank", "accepted", "iteration")
    out = {n: np.concatenate(c) for n, c in zip(names, cols)}
    out["prompt"] = np.concatenate(prompt_of)
    print(f"{sampling}: {len(prompts)} prompts, {tokens} tokens, {recorder.iteration} iterations, "
          f"{out['q'].size} trials in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


def replay(trials: dict, cal: AcceptanceCalibration | None = None) -> AcceptanceCalibration:
    """Teach `cal` (else a cold calibration) the trials, one iteration at a time."""
    cal = cal or AcceptanceCalibration()
    it = trials["iteration"]
    bounds = np.flatnonzero(np.diff(it)) + 1
    for idx in np.split(np.arange(it.size), bounds):
        cal.update(trials["q"][idx], trials["depth"][idx], trials["rank"][idx], trials["accepted"][idx])
    return cal


def held_out_ece(trials: dict) -> dict:
    """Fit on the even prompts, then replay the odd ones through that table as a
    shipped start (`as_prior`): the ECE a user on unseen prompts would see."""
    even = trials["prompt"] % 2 == 0
    fit = replay({k: v[even] for k, v in trials.items()})
    from lever.mode_lever import SHIPPED_MAX_TRIALS
    return replay({k: v[~even] for k, v in trials.items()}, fit.as_prior(SHIPPED_MAX_TRIALS)).calibration_error()


def build_table(trials: dict, sampling: str, draft: str, target: str, prompts_label: str) -> Path:
    cal = replay(trials)
    online = cal.calibration_error()
    held = held_out_ece(trials)
    info = {"format": SHIPPED_FORMAT, "draft": draft, "target": target,
            "draft_sha256": model_sha256(draft), "target_sha256": model_sha256(target),
            "sampling": sampling_key(SamplingParams(**{k: v for k, v in SAMPLINGS[sampling].items()
                                                               if k != "seed"})),
            "built_by": "bench/build_calibration.py", "prompts": prompts_label,
            "trials": int(trials["q"].size), "iterations": int(np.unique(trials["iteration"]).size),
            "ece_online": online, "ece_held_out": held,
            "calibration": cal.to_json()}
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / shipped_table_name(draft, target, sampling)
    path.write_text(json.dumps(info, separators=(",", ":")) + "\n")
    print(f"{path.relative_to(ROOT)}: {info['trials']} trials; online ECE calibrated "
          f"{online['ece_calibrated']:.4f} vs raw q {online['ece_draft_prob']:.4f}; held-out (odd prompts "
          f"from a table of the even ones) {held['ece_calibrated']:.4f} vs {held['ece_draft_prob']:.4f}")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--sampling", choices=[*SAMPLINGS, "both"], default="both")
    ap.add_argument("--prompts", choices=["calibration", "bench"], default="calibration",
                    help="calibration: lever/data/calibration_prompts_v1.json (tables); bench: prompts_v1 (--trace only)")
    ap.add_argument("--limit", type=int, default=None, help="first N prompts only")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--from-trials", action="store_true", help="rebuild tables from bench/results/calibration/")
    ap.add_argument("--trace", type=Path, help="write the trials as a test trace (.npz) instead of a table")
    args = ap.parse_args(argv)
    if args.prompts == "bench" and not args.trace:
        ap.error("tables are learnt from the calibration prompts only (--prompts bench needs --trace)")
    if args.trace and args.sampling == "both":
        ap.error("--trace writes one setting's trace: choose --sampling greedy or t0.7")
    settings = list(SAMPLINGS) if args.sampling == "both" else [args.sampling]
    if args.prompts == "calibration":
        prompts = json.loads((ROOT / "python" / "lever" / "data" / "calibration_prompts_v1.json").read_text())["prompts"]
        label = "lever/data/calibration_prompts_v1.json"
    else:
        prompts, label = load_prompts("v1"), "lever/data/prompts_v1.json"
    prompts = prompts[:args.limit] if args.limit else prompts
    label += f" ({len(prompts)} prompts, {args.max_new_tokens} new tokens each)"
    target = drafter = None
    for sampling in settings:
        stem = f"{shipped_table_name(args.draft, args.target, sampling)[:-5]}.npz"
        saved = TRIALS_DIR / stem
        if args.from_trials:
            trials = dict(np.load(saved))
            label = str(trials.pop("label", label))
        else:
            if target is None:
                target = load(args.target)
                drafter = make_drafter(args.draft)
            trials = record(target, drafter, prompts, sampling, args.max_new_tokens)
            if args.trace is None:
                TRIALS_DIR.mkdir(parents=True, exist_ok=True)
                np.savez_compressed(saved, label=np.array(label), **trials)
        if args.trace is not None:
            args.trace.parent.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(args.trace, q=trials["q"].astype(np.float32), depth=trials["depth"].astype(np.int8),
                                rank=trials["rank"].astype(np.int8), accepted=trials["accepted"],
                                iteration=trials["iteration"].astype(np.int32), label=np.array(
                                    f"{args.draft} -> {args.target}, {sampling}, {label}"))
            print(f"{args.trace}: {trials['q'].size} trials", file=sys.stderr)
        else:
            build_table(trials, sampling, args.draft, args.target, label)
    return 0


if __name__ == "__main__":
    sys.exit(main())

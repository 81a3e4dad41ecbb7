"""How fast could any tree policy be on this machine?  A ceiling from a `lever bench` JSON.

    python bench/ceiling.py BENCH_JSON [--out DIR]

Every speculative mode pays, per iteration (one target pass):

  C  CPU seconds: drafting + the target's compute + acceptance.  Draft and
     target share one thread pool on every core, so their seconds add (mode
     lever+ahead, which runs them side by side, measured slower than lever).
  F  flash seconds: the bytes the pass streams / the fastest read rate the
     run showed: the raw read rate the bench measured for the store
     (config.raw_read_bytes_per_s) or, where faster, a mode's bytes per
     iteration over its wall seconds (so no mode is measured above its bound).

and emits A tokens (the mean accepted length, counting the target's own).
Even with every flash byte hidden under compute and no stall at all, a mode
cannot beat A / max(F, C) tokens per second: its *bound*.

The bound of one measured mode says what better overlap alone could give it.
For policies not measured, the script takes the lower convex hull of the
measured (A, C) points of every mode (ar is the empty tree; chains, static
trees, lever): a policy whose CPU cost per accepted length lies on that hull, with
perfect overlap, reaches the *ceiling* max over the hull of A / max(F, C(A)).
It is not a proof -- a policy could sit below the hull -- but beating it
needs more accepted tokens per CPU second than every policy measured,
lever's adaptive trees included.

Prints each mode's measured and bound tokens/s, the ceiling, and what it
means for the issue-14 bars (lever >= 1.5x the best chain, >= 1.3x the best
static tree, in the same run): the ceiling against the best measured chain
and tree (generous: only the hypothetical policy gets perfect overlap) and
against their own bounds (like for like).  Writes ceiling.json and
ceiling.png (C against A, the hull, the flash line and the lines the bars
need).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reader_queue_depth import save_plot  # noqa: E402


@dataclass(frozen=True)
class ModeCost:
    """One mode's per-iteration figures: its totals over the prompts, divided by its target passes."""

    mode: str
    kind: str                 # "ar", "chain", "tree" (static) or "lever"
    accepted: float           # A: tokens kept per iteration (target passes)
    cpu_s: float              # C: draft + target compute + acceptance, seconds per iteration
    stall_s: float            # seconds per iteration waiting on flash
    iteration_s: float        # measured wall seconds per iteration
    bytes_per_pass: float     # bytes read from flash per iteration

    @property
    def tokens_per_s(self) -> float:
        return self.accepted / self.iteration_s


def mode_kind(mode: str) -> str:
    """'ar', 'chain', 'tree' or 'lever' for a bench mode name ('chain:8', 'lever+ahead')."""
    head = mode.split(":")[0].split("+")[0]
    if head not in ("ar", "chain", "tree", "lever"):
        raise ValueError(f"unknown bench mode {mode!r}")
    return head


def mode_costs(bench: dict) -> list[ModeCost]:
    """Per-mode figures from a `lever bench` JSON document: its per-mode totals
    ("modes": generated tokens, target passes, decode seconds, bytes read and
    the time split, summed over the prompts) divided by the target passes."""
    out = []
    for mode, t in bench["modes"].items():
        n = t["target_passes"]
        if not n:
            continue
        split = t["time_split_s"]
        cpu = split["draft"] + split["verify_compute"] + split["accept"]
        out.append(ModeCost(mode, mode_kind(mode), t["generated_tokens"] / n, cpu / n, split["io_stall"] / n,
                            t["decode_s"] / n, (t["bytes_read"] or 0) / n))
    if not out:
        raise ValueError("the bench JSON has no run with a target pass")
    return out


def bound(accepted: float, cpu_s: float, flash_s: float) -> float:
    """Tokens per second with flash fully hidden under compute (or compute under flash)."""
    return accepted / max(flash_s, cpu_s)


def lower_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The lower convex hull of (A, C) points, by increasing A, keeping only the
    part where C rises with A (a point with more tokens for less CPU ends it)."""
    pts = sorted(set(points))
    hull: list[tuple[float, float]] = []
    for p in pts:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) <= 0:   # hull[-1] on or above the chord
                hull.pop()
            else:
                break
        hull.append(p)
    # from the cheapest point on, drop vertices that a later one dominates
    start = min(range(len(hull)), key=lambda i: (hull[i][1], -hull[i][0]))
    return hull[start:]


def ceiling(hull: list[tuple[float, float]], flash_s: float) -> tuple[float, float, float]:
    """max over the hull of A / max(F, C(A)): (tokens/s, A, C) where it peaks.
    On a segment the ratio is monotone except at the kink C(A) = F, so the
    vertices and the crossings are the only candidates."""
    candidates = list(hull)
    for (a1, c1), (a2, c2) in zip(hull, hull[1:]):
        if c1 < flash_s < c2:
            a = a1 + (a2 - a1) * (flash_s - c1) / (c2 - c1)
            candidates.append((a, flash_s))
    best = max(candidates, key=lambda p: bound(p[0], p[1], flash_s))
    return bound(best[0], best[1], flash_s), best[0], best[1]


def analyse(bench: dict) -> dict:
    """The ceiling document: modes, flash seconds per pass, hull, ceiling, ratios."""
    costs = mode_costs(bench)
    raw = bench["config"]["raw_read_bytes_per_s"]
    if not raw:
        raise ValueError("the bench JSON has no raw read rate (config.raw_read_bytes_per_s): was the target streamed?")
    rate = max([raw] + [m.bytes_per_pass / m.iteration_s for m in costs])
    per_pass = bench["target"]["residency"]["streamed_bytes_per_pass"]
    flash_s = per_pass / rate
    hull = lower_hull([(m.accepted, m.cpu_s) for m in costs])
    top, top_a, top_c = ceiling(hull, flash_s)

    def best(kind: str) -> ModeCost | None:
        of_kind = [m for m in costs if m.kind == kind]
        return max(of_kind, key=lambda m: m.tokens_per_s) if of_kind else None

    bars = {}
    for kind, need in (("chain", 1.5), ("tree", 1.3)):
        b = best(kind)
        if b is None:
            continue
        own_bound = max(bound(m.accepted, m.cpu_s, flash_s) for m in costs if m.kind == kind)
        bars[kind] = {"best_mode": b.mode, "measured_tokens_per_s": b.tokens_per_s,
                      "bar_ratio": need, "bar_tokens_per_s": need * b.tokens_per_s,
                      "ceiling_over_measured": top / b.tokens_per_s,
                      "bound_of_kind": own_bound, "ceiling_over_bound_of_kind": top / own_bound}
    lever = best("lever")
    return {
        "source": {"created": bench.get("created"), "raw_read_bytes_per_s": raw, "read_bytes_per_s": rate,
                   "streamed_bytes_per_pass": per_pass},
        "flash_s_per_pass": flash_s,
        "modes": [{**asdict(m), "tokens_per_s": m.tokens_per_s,
                   "bound_tokens_per_s": bound(m.accepted, m.cpu_s, flash_s)} for m in costs],
        "hull": [{"accepted": a, "cpu_s": c} for a, c in hull],
        "ceiling": {"tokens_per_s": top, "accepted": top_a, "cpu_s": top_c},
        "lever": None if lever is None else {"mode": lever.mode, "tokens_per_s": lever.tokens_per_s},
        "bars": bars,
    }


def print_report(doc: dict) -> None:
    f = doc["flash_s_per_pass"]
    src = doc["source"]
    print(f"# flash per pass: {src['streamed_bytes_per_pass'] / 1e6:.0f} MB at "
          f"{src['read_bytes_per_s'] / 2**30:.2f} GiB/s = {f * 1e3:.0f} ms (raw read "
          f"{src['raw_read_bytes_per_s'] / 2**30:.2f} GiB/s)")
    print(f"{'mode':<14}{'A tok':>7}{'CPU ms':>8}{'stall ms':>9}{'iter ms':>9}{'tok/s':>8}{'bound':>8}"
          f"{'CPU ms/tok':>11}")
    for m in doc["modes"]:
        print(f"{m['mode']:<14}{m['accepted']:>7.2f}{m['cpu_s'] * 1e3:>8.0f}{m['stall_s'] * 1e3:>9.0f}"
              f"{m['iteration_s'] * 1e3:>9.0f}{m['tokens_per_s']:>8.2f}{m['bound_tokens_per_s']:>8.2f}"
              f"{m['cpu_s'] * 1e3 / m['accepted']:>11.1f}")
    c = doc["ceiling"]
    print(f"# ceiling (hull of the measured trees, perfect overlap): {c['tokens_per_s']:.2f} tok/s "
          f"at A {c['accepted']:.2f}, CPU {c['cpu_s'] * 1e3:.0f} ms")
    if doc["lever"]:
        print(f"# {doc['lever']['mode']} measured {doc['lever']['tokens_per_s']:.2f} tok/s")
    for kind, b in doc["bars"].items():
        print(f"# bar {b['bar_ratio']}x the best {kind} ({b['best_mode']} {b['measured_tokens_per_s']:.2f}) needs "
              f"{b['bar_tokens_per_s']:.2f} tok/s; ceiling / measured {b['ceiling_over_measured']:.2f}x, "
              f"ceiling / the {kind}s' own bound ({b['bound_of_kind']:.2f}) {b['ceiling_over_bound_of_kind']:.2f}x")


def plot(doc: dict, path: Path) -> None:
    """CPU ms per iteration against accepted length: modes, hull, flash line, bar lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {"chain": "tab:blue", "tree": "tab:orange", "lever": "tab:green", "ar": "tab:gray"}
    for m in doc["modes"]:
        ax.scatter(m["accepted"], m["cpu_s"] * 1e3, color=colours[m["kind"]], zorder=3)
        ax.annotate(m["mode"], (m["accepted"], m["cpu_s"] * 1e3), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    hull = doc["hull"]
    ax.plot([h["accepted"] for h in hull], [h["cpu_s"] * 1e3 for h in hull], color="black", lw=1,
            label="lower hull of the measured trees")
    amax = max(m["accepted"] for m in doc["modes"]) * 1.05
    ax.axhline(doc["flash_s_per_pass"] * 1e3, color="tab:red", ls=":", label="flash ms per pass")
    for kind, b in doc["bars"].items():
        # a mode reaches tps when C <= A / tps (below the dashed line) and F <= A / tps (right of the dotted one)
        tps = b["bar_tokens_per_s"]
        line, = ax.plot([0, amax], [0, amax / tps * 1e3], ls="--", lw=1,
                        label=f"{b['bar_ratio']}x best {kind} = {tps:.1f} tok/s: below the dashed line, "
                              f"right of the dotted one")
        ax.axvline(doc["flash_s_per_pass"] * tps, ls=":", lw=1, color=line.get_color())
    ax.set_xlim(0, amax)
    ax.set_ylim(0, max(m["cpu_s"] for m in doc["modes"]) * 1e3 * 1.1)
    ax.set_xlabel("accepted tokens per target pass (A)")
    ax.set_ylabel("CPU ms per iteration (draft + target compute)")
    ax.legend(fontsize=7, loc="upper left")
    save_plot(fig, ax, f"ceiling {doc['ceiling']['tokens_per_s']:.1f} tok/s with perfect overlap", path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bench_json", type=Path, help="bench.json written by `lever bench --out DIR`")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args(argv)
    try:
        doc = analyse(json.loads(args.bench_json.read_text()))
    except (OSError, ValueError, KeyError) as e:
        print(f"ceiling: cannot read {args.bench_json}: {e}", file=sys.stderr)
        return 2
    print_report(doc)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ceiling.json").write_text(json.dumps(doc, indent=1))
    plot(doc, args.out / "ceiling.png")
    print(f"# wrote {args.out / 'ceiling.json'} and {args.out / 'ceiling.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

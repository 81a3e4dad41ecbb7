"""`lever bench` charts (PNG, needs matplotlib): tokens/s per mode, and for
`--memory-cap` also each mode's peak memory against the cap."""

from __future__ import annotations

from pathlib import Path

from ..plotting import pyplot
from .bench_modes import LEVER


def _agg():
    return pyplot("lever bench's chart")


def mode_colors(names: list[str]) -> list[str]:
    """ar gray, chain blue, lever red, tree orange."""
    return ["tab:gray" if n == "ar" else "tab:blue" if n.startswith("chain") else
            "tab:red" if n.startswith(LEVER) else "tab:orange" for n in names]


def plot(r: dict, path: Path) -> None:
    """Bars of decode tokens/s per mode (labelled with the mean accepted length),
    ar and the resident reference as lines."""
    plt = _agg()
    aggs = list(r["modes"].values())
    names = [a["mode"] for a in aggs]
    tps = [a["tokens_per_s"] for a in aggs]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(names) + 2), 4.5))
    bars = ax.bar(names, tps, color=mode_colors(names))
    for b, a in zip(bars, aggs):
        ax.annotate(f"L={a['mean_accepted_length']:.2f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    if "ar" in r["modes"]:
        ar = r["modes"]["ar"]["tokens_per_s"]
        ax.axhline(ar, color="black", ls="--", lw=1, label=f"ar {ar:.2f} tok/s")
    top = max(tps)
    res = r.get("resident")
    if res is not None and not res.get("same_as_ar"):
        ax.axhline(res["tokens_per_s"], color="tab:green", ls=":", lw=1.5,
                   label=f"resident ar {res['tokens_per_s']:.2f} tok/s")
        top = max(top, res["tokens_per_s"])
    ax.set_ylim(0, top * 1.25 if top > 0 else 1)
    ax.set_ylabel("decode tokens/s")
    c = r["config"]
    budget = f", budget {c['dram_budget_bytes'] / 1e6:,.0f} MB" if c["dram_budget_bytes"] else " (in memory)"
    ax.set_title(f"{Path(c['target']).name}{budget}; draft {c['draft']}\n{c['prompts']} prompts ({c['prompt_set']}), "
                 f"{c['new_tokens']} tokens, T={c['temperature']:g}; L = mean accepted length", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_capped(r: dict, path: Path) -> None:
    """Two panels per mode under --memory-cap: decode tokens/s (0 for a failed
    child) and the cgroup's peak memory (MB), with the cap drawn as a line."""
    plt = _agg()
    rows = r["results"]
    names = [x["mode"] for x in rows]
    tps = [x["tokens_per_s"] or 0.0 for x in rows]
    peaks = [x["cgroup"]["peak_bytes"] / 1e6 for x in rows]
    cap = r["cap_bytes"] / 1e6
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(names) + 4), 4.5))
    ax1.bar(names, tps, color=mode_colors(names))
    ax1.set_ylabel("decode tokens/s")
    ax1.set_ylim(0, max(tps) * 1.25 if max(tps) > 0 else 1)
    bars = ax2.bar(names, peaks, color=["tab:purple" if x["ok"] else "tab:red" for x in rows])
    for b, x in zip(bars, rows):
        if not x["ok"]:
            ax2.annotate("OOM" if x["cgroup"]["oom_killed"] else "failed",
                         (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8,
                         xytext=(0, 2), textcoords="offset points")
    ax2.axhline(cap, color="black", ls="--", lw=1, label=f"cap {cap:,.0f} MB")
    ax2.set_ylabel("peak memory of the cgroup, MB (RAM + page cache)")
    ax2.set_ylim(0, max(peaks + [cap]) * 1.2)
    ax2.legend(fontsize=8, loc="best")
    fig.suptitle(f"{Path(r['config']['target']).name} under a {cap:,.0f} MB memory cap (cgroup v{r['cgroup_version']}); "
                 f"one process per mode", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

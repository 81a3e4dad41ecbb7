"""A PNG of the probes' held-out sweeps: recall of match nodes and precision of
pruning (the share of pruned nodes that were rejected) against the logit
threshold, one line per layer's probe and the draft-only baseline, and the
trade-off of rejected nodes pruned against recall."""

from __future__ import annotations

import os

import numpy as np

from ..plotting import pyplot


def plot_probe_report(report: dict, path: str | os.PathLike, title: str = "") -> None:
    """Write the three panels to `path` (PNG, matplotlib's Agg backend) from
    `lever.probe.evaluate.evaluate`'s report (its "sweeps")."""
    plt = pyplot("the probe report's chart")

    fig, (ax_r, ax_p, ax_t) = plt.subplots(1, 3, figsize=(14, 4.2))
    for name, s in report["sweeps"].items():
        t = _arr(s["threshold"])
        finite = np.isfinite(t)                 # the first threshold (none) has no place on the axis
        style = "--" if report["scorers"][name]["layer"] is None else "-"
        ax_r.plot(t[finite], _arr(s["recall"])[finite], style, label=name)
        ax_p.plot(t[finite], _arr(s["precision"])[finite], style, label=name)
        ax_t.plot(_arr(s["recall"]), _arr(s["pruned"]), style, label=name)
    ax_r.set(xlabel="logit threshold", ylabel="recall of match nodes", title="recall (held out)")
    ax_p.set(xlabel="logit threshold", ylabel="rejected share of pruned nodes", title="precision of pruning")
    ax_t.set(xlabel="recall of match nodes", ylabel="rejected nodes pruned", title="trade-off", xlim=(0.8, 1.0))
    for r in (0.99, 0.95, 0.90):
        ax_t.axvline(r, color="grey", linestyle=":", linewidth=0.8)
    for ax in (ax_r, ax_p, ax_t):
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _arr(values) -> np.ndarray:
    """float64 array, None as nan (the report's JSON form); a None threshold is -inf."""
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)

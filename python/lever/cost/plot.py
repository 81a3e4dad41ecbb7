"""A PNG of a cost model: target pass seconds vs tree size (with the flash
floor and pure compute) and draft forward seconds vs frontier size."""

from __future__ import annotations

import os

import numpy as np

from ..plotting import pyplot
from .cost_model import CostModel


def plot_cost_model(model: CostModel, path: str | os.PathLike, title: str = "") -> None:
    """Write the two panels to `path` (PNG, matplotlib's Agg backend); times in ms."""
    plt = pyplot("lever profile --plot")

    p = model.profile
    n_max = max(p.n_grid)
    n = np.arange(1, n_max + 1)
    fig, (ax_t, ax_d) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax_t.plot(n, model.verify_s(n_max) * 1e3, label="predicted pass (ring simulation)")
    ax_t.plot(n, model.compute_s(n_max) * 1e3, "--", label="compute only")
    if model.io_floor_s > 0:
        ax_t.axhline(model.io_floor_s * 1e3, color="grey", linestyle=":",
                     label=f"flash floor ({p.io_bytes_per_pass / 1e6:,.0f} MB/pass)")
    measured = np.sum([s.compute_s for s in p.stages], axis=0) + np.asarray(p.embed_s)
    ax_t.plot(p.n_grid, measured * model.verify_factor * 1e3, "o", markersize=3, label="measured compute")
    ax_t.set(xlabel="tree tokens per target pass (n)", ylabel="ms", title="target pass", xscale="log")
    ax_t.legend(fontsize=8)
    f_max = max(p.draft_grid)
    ax_d.plot(np.arange(1, f_max + 1), model.draft_s(f_max) * 1e3, label="predicted")
    ax_d.plot(p.draft_grid, np.asarray(p.draft_s) * model.draft_factor * 1e3, "o", markersize=3,
              label="measured")
    ax_d.set(xlabel="frontier nodes per draft forward (f)", ylabel="ms", title="draft forward")
    ax_d.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

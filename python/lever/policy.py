"""Setting up mode lever for a target and a draft model: the device profile
(cached, measured on first use), the cost model built from it, and the
acceptance calibration persisted next to the profiles.

    policy = lever_policy(target, drafter, target_id=..., ...)
    spec = SpecConfig("lever", policy=policy)
    ... speculative_generate(..., spec=spec) ...
    save_calibration(policy)      # what this run learnt, for the next one

The calibration file is keyed by what acceptance depends on: the two models,
the dtype and kernels (the logits' rounding) and the sampling settings
(greedy and sampled acceptance differ); the machine and the DRAM budget play
no part, so one calibration serves every profile of the pair.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from .cost.cost_model import CostModel
from .cost.identity import model_identity
from .cost.profile import load_or_measure, profile_key
from .draft.calibration import AcceptanceCalibration
from .draft.gain_cost import GainCostPolicy
from .errors import LeverError
from .sampling import SamplingParams

DEFAULT_MAX_NODES, DEFAULT_MAX_DEPTH, DEFAULT_TOPK = 255, 12, 4


def lever_policy(target, drafter, *, target_id, kernels: str = "native", reader: str = "auto",
                 read_limit_bytes_per_s: float = 0.0, dtype="bfloat16",
                 params: SamplingParams = SamplingParams(), cache_dir=None, max_nodes: int = DEFAULT_MAX_NODES,
                 max_depth: int = DEFAULT_MAX_DEPTH, topk: int = DEFAULT_TOPK, force_profile: bool = False,
                 progress: bool = True) -> GainCostPolicy:
    """The gain-cost policy for `target` (a model of the numpy protocol, see
    lever.model.loading, or a StreamedDecoder, loaded from `target_id`) drafted
    by `drafter` (a ModelDrafter)."""
    draft_path = getattr(drafter, "path", None)
    if draft_path is None or not hasattr(drafter, "expand"):
        raise LeverError("mode lever needs a draft model (--draft NAME); prompt lookup ('ngram') has no "
                         "draft probabilities to calibrate")
    key = profile_key(target, drafter.model, target_id=target_id, draft_id=draft_path, kernels=kernels,
                      reader_backend=reader, read_limit_bytes_per_s=read_limit_bytes_per_s,
                      dtype=dtype)
    profile = load_or_measure(target, drafter.model, key, cache_dir=cache_dir, force=force_profile,
                              progress=progress)
    path = calibration_path(target_id, draft_path, kernels, dtype, params, cache_dir)
    policy = GainCostPolicy(CostModel(profile), load_calibration(path), max_nodes=max_nodes,
                            max_depth=max_depth, topk=topk)
    policy.calibration_path = path
    return policy


def calibration_path(target_id, draft_id, kernels: str, dtype, params: SamplingParams,
                     cache_dir=None) -> Path:
    """The calibration file of a model pair (target_id: a store directory or a
    model file; model_identity tells them apart) and sampling setting."""
    from .api import cache_root
    key = {"target": model_identity(target_id), "draft": model_identity(draft_id), "kernels": kernels, "dtype": str(dtype),
           "sampling": "greedy" if params.greedy else
           {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root(cache_dir) / "profiles" / f"calibration-{digest}.json"


def load_calibration(path: Path) -> AcceptanceCalibration:
    """The persisted calibration, or the prior if there is none; a corrupt file
    is reported on stderr and replaced by the prior (it is rewritten after the run)."""
    if not path.is_file():
        return AcceptanceCalibration()
    try:
        return AcceptanceCalibration.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"lever: warning: ignoring the calibration {path} ({e}); starting from the prior",
              file=sys.stderr, flush=True)
        return AcceptanceCalibration()


def save_calibration(policy: GainCostPolicy) -> Path | None:
    """Write what the policy's calibration learnt (atomically) to its file."""
    path = getattr(policy, "calibration_path", None)
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(policy.calibration.to_json()))
    os.replace(tmp, path)
    return path

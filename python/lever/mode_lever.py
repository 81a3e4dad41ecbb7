"""Setting up mode lever (the gain-cost tree policy) for a target and a draft
model: the device profile (cached; on first use a quick estimate of a few
seconds, lever.cost.quick, unless a full measurement is cached, which
`--reprofile` and `lever profile` make), the cost model built from it, and
the acceptance calibration persisted next to the profiles.

    policy = lever_policy(target, drafter, config, decode, target_id=..., context_tokens=...)
    spec = decode.spec(policy=policy)
    ... speculative_generate(..., spec=spec) ...
    save_calibration(policy)      # what this run learnt, for the next one

The calibration file is keyed by what acceptance depends on: the two models,
the dtype and kernels (the logits' rounding) and the sampling settings
(greedy and sampled acceptance differ); the machine and the DRAM budget play
no part, so one calibration serves every profile of the pair.

A user without a calibration file starts from the table shipped for the
pair in lever/data/calibration/ (learnt offline by bench/build_calibration.py
from prompts disjoint from the benchmark set), found by the SHA-256 of the
two GGUFs and the sampling setting, its counts capped to SHIPPED_MAX_TRIALS
per cell so that the user's own trials refine it; without one, from the raw
draft probability (lever.draft.calibration).  What the run learns is saved to
the user's file, never to the shipped table.  A corrupt or stale file (user
or shipped) is never used: a warning, and the next start in that order.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import re
import sys
from pathlib import Path

from .atomic_write import save_cache_file
from .config import DecodeConfig, RunConfig
from .cost import ring_depth
from .cost.cost_model import CostModel
from .cost.identity import model_identity
from .cost.profile import load_or_estimate, load_or_measure, profile_key
from .cost.timing import printer
from .draft.calibration import AcceptanceCalibration
from .draft.gain_cost import GainCostPolicy
from .draft.model_drafter import ModelDrafter
from .errors import LeverError
from .files import file_sha256
from .gguf import registry
from .model.streamed_decoder import StreamedDecoder
from .sampling import SamplingParams
from .shapes import LeverLimits
from .store.manifest import MANIFEST, StoreManifest
from .values import cache_root, dtype_name

SHIPPED_FORMAT = "lever-calibration-table/1"
SHIPPED_MAX_TRIALS = 200.0     # a shipped table weighs at most this many trials per cell (and q bin)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def lever_policy(target, drafter, config: RunConfig, decode: DecodeConfig, *, target_id,
                 params: SamplingParams | None = None, max_nodes: int | None = None, first: bool = True,
                 tune_ring: bool | None = None, pruning=None, npu_profile=None,
                 context_tokens: int = 2048) -> GainCostPolicy:
    """The gain-cost policy for `target` (a model of the numpy protocol, see
    lever.model.loading, or a StreamedDecoder, loaded from `target_id`) drafted
    by `drafter` (a ModelDrafter), as `config` runs it (kernels, dtype, the
    flash reader, the cache root, progress) and `decode` decodes: its tree
    limits (`DecodeConfig.lever_limits`; `max_nodes` overrides its max_nodes), the
    calibration of `params` (default: decode's sampling), a full re-measuring
    of the profile with decode.reprofile.  first: False for another policy of
    the same run (another sampling setting): no re-measuring, no ring
    tuning, no progress.  tune_ring (default: a streamed target with
    --prefetch-depth auto, on the first policy): the read ring depth is
    chosen from the profile (lever.cost.ring_depth), which may re-plan the
    target's pinned extents under the same budget.
    pruning: the survival forecast of early-exit pruning (lever.probe.choice.prune_forecast).
    npu_profile: a device's measured bucket times (lever.npu.npu_profile.NpuProfile,
    `--npu-profile`): the cost model comes from them (at the context bucket of
    `context_tokens`, the run's prompt + new tokens) instead of a profile
    measured here, which only fills in what the file leaves out; the ring
    depth is then not tuned.  `policy.npu_profile` says what was used.  On
    fixed shapes (a static backend's profile) max_nodes is capped so that a
    tree with its root fits the largest row bucket."""
    streamed = config.target.streamed
    kernels, dtype, reader, cache_dir = config.target.kernels, config.target.dtype, config.reader.backend, \
        config.cache_dir
    read_limit_bytes_per_s = config.reader.read_limit if streamed else 0.0
    params = params if params is not None else decode.sampling
    limits = decode.lever_limits
    max_nodes = max_nodes if max_nodes is not None else limits.max_nodes
    force_profile, progress = decode.reprofile and first, config.progress and first
    tune_ring = (streamed and config.reader.auto_depth and first) if tune_ring is None else tune_ring
    draft_path = drafter.path if isinstance(drafter, ModelDrafter) else None
    if draft_path is None:
        raise LeverError("mode lever needs a draft model (--draft NAME); prompt lookup ('ngram') has no "
                         "draft probabilities to calibrate")
    def key_of(model):
        return profile_key(model, drafter.model, target_id=target_id, draft_id=draft_path, kernels=kernels,
                           reader_backend=reader, read_limit_bytes_per_s=read_limit_bytes_per_s, dtype=dtype)

    def measured():
        if force_profile:               # --reprofile: the full measurement, which later runs then prefer
            return load_or_measure(target, drafter.model, key_of(target), cache_dir=cache_dir, force=True,
                                   progress=progress)
        return load_or_estimate(target, drafter.model, key_of(target), cache_dir=cache_dir, progress=progress)

    npu_info = None
    if npu_profile is not None:
        profile, npu_info = npu_profile.device_profile(target, context_tokens, host=measured, say=printer(progress))
        printer(progress)(f"profile: from --npu-profile {npu_profile.path} ({npu_profile.device}), context bucket "
                          f"{npu_info['context']} ({npu_info['context_rule']})")
    else:
        profile = measured()
        if tune_ring and isinstance(target, StreamedDecoder) and target.plan.streamed:
            profile = ring_depth.tune_ring(target, profile, key_of, cache_dir, printer(progress))
    path = calibration_path(target_id, draft_path, kernels, dtype, params, cache_dir)

    def start():          # no file of the user's yet: the shipped table of the pair, if any
        return shipped_calibration(model_sha256(draft_path, cache_dir), model_sha256(target_id, cache_dir), params)

    if profile.fixed_shapes:        # a tree past the largest bucket would run as several bucket passes
        max_nodes = min(max_nodes, int(max(profile.n_grid)) - 1)
    policy = calibrated_policy(CostModel(profile), path, start=start, max_nodes=max_nodes,
                               max_depth=limits.max_depth, topk=limits.topk, pruning=pruning)
    policy.npu_profile = npu_info
    return policy


def calibrated_policy(cost, path: Path, *, start=None, max_nodes: int = LeverLimits.max_nodes,
                      max_depth: int = LeverLimits.max_depth, topk: int = LeverLimits.topk,
                      pruning=None) -> GainCostPolicy:
    """The gain-cost policy over `cost` (a CostModel, or lever.remote.cost.RemoteCost)
    with the acceptance calibration persisted at `path` (`load_calibration`,
    `start()` when there is none yet), which `save_calibration` writes back."""
    policy = GainCostPolicy(cost, load_calibration(path, start), max_nodes=max_nodes, max_depth=max_depth,
                            topk=topk, pruning=pruning)
    policy.calibration_path = path
    return policy


def calibration_path(target_id, draft_id, kernels: str, dtype, params: SamplingParams,
                     cache_dir=None) -> Path:
    """The calibration file of a model pair (target_id: a store directory or a
    model file; model_identity tells them apart) and sampling setting."""
    key = {"target": model_identity(target_id), "draft": model_identity(draft_id), "kernels": kernels,
           "dtype": dtype_name(dtype), "sampling": sampling_key(params)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root(cache_dir) / "profiles" / f"calibration-{digest}.json"


def sampling_key(params: SamplingParams):
    """What acceptance depends on in the sampling settings: "greedy", or the
    temperature, top_p and top_k (the seed plays no part)."""
    if params.greedy:
        return "greedy"
    return {"temperature": float(params.temperature), "top_p": float(params.top_p), "top_k": int(params.top_k)}


def load_calibration(path: Path, start=None) -> AcceptanceCalibration:
    """The persisted calibration; if there is none (or it is corrupt or of
    another layout: reported on stderr, then rewritten after the run), what
    `start()` returns (lever_policy: the shipped table), else a cold start."""
    cal = None
    if path.is_file():
        try:
            cal = AcceptanceCalibration.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            _warn(f"ignoring the calibration {path} ({e}); starting afresh")
    if cal is None and start is not None:
        cal = start()
    return cal or AcceptanceCalibration()


def shipped_table_name(draft: str, target: str, sampling: str) -> str:
    """File name of a shipped table: `<draft>__<target>__<sampling>.json`
    (registry names; sampling "greedy" or e.g. "t0.7")."""
    return f"{Path(draft).stem if Path(draft).suffix == '.gguf' else draft}__" \
           f"{Path(target).stem if Path(target).suffix == '.gguf' else target}__{sampling}.json"


def shipped_tables_dir():
    """The shipped tables (a Traversable inside the installed package)."""
    return importlib.resources.files("lever").joinpath("data", "calibration")


def shipped_calibration(draft_sha256: str | None, target_sha256: str | None, params: SamplingParams,
                        tables_dir=None) -> AcceptanceCalibration | None:
    """The shipped calibration of a model pair (the GGUFs' SHA-256) and sampling
    setting, as a start for a user (`as_prior(SHIPPED_MAX_TRIALS)`), or None.
    A table that cannot be read or is of another layout is skipped with a warning."""
    if not draft_sha256 or not target_sha256:
        return None
    tables_dir = shipped_tables_dir() if tables_dir is None else tables_dir
    if not tables_dir.is_dir():
        return None
    want = {"format": SHIPPED_FORMAT, "draft_sha256": draft_sha256, "target_sha256": target_sha256,
            "sampling": sampling_key(params)}
    for entry in sorted(tables_dir.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        try:
            data = json.loads(entry.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or any(data.get(k) != v for k, v in want.items()):
                continue
            return AcceptanceCalibration.from_json(data["calibration"]).as_prior(SHIPPED_MAX_TRIALS)
        except (OSError, ValueError, KeyError, TypeError) as e:
            _warn(f"ignoring the shipped calibration {entry.name} ({e})")
    return None


def model_sha256(model_path, cache_dir=None) -> str | None:
    """SHA-256 of the GGUF a model is (a file) or was converted from (a flash
    store whose manifest's `source` records it: its `sha256`, else the source
    GGUF if it is still there).  A file the size of a registered model is
    matched by the registry's verification record (else hashed, on each call); any
    other model has no shipped table: None."""
    from .gguf.assemble import is_verified          # tqdm: imported only when a file is matched

    p = Path(model_path)
    if p.is_dir() and (p / MANIFEST).is_file():
        try:
            source = StoreManifest.load(p).source
        except (OSError, ValueError, LeverError):
            return None
        sha = str(source.get("sha256", "")).lower()
        if _SHA256.fullmatch(sha):
            return sha
        src = source.get("path")
        return model_sha256(src, cache_dir) if isinstance(src, str) and Path(src).is_file() else None
    if not p.is_file():
        return None
    size = p.stat().st_size
    entries = [e for e in registry.KNOWN_MODELS.values() if e.size == size]
    if not entries:
        return None
    dest = registry.models_dir(cache_root(cache_dir))
    for e in entries:
        if is_verified(e, p, dest):
            return e.sha256
    return file_sha256(p)


def _warn(message: str) -> None:
    print(f"lever: warning: {message}", file=sys.stderr, flush=True)


CALIBRATION_UNSAVED = "what this run learnt about acceptance is not kept for the next one"


def save_calibration(policy: GainCostPolicy) -> Path | None:
    """Write what the policy's calibration learnt (atomically) to its file; the
    path, or None if the policy has none or the cache cannot take it (then one
    warning line names the file: the run and its answer go on)."""
    path = getattr(policy, "calibration_path", None)
    if path is None:
        return None
    saved = save_cache_file(path, json.dumps(policy.calibration.to_json()), CALIBRATION_UNSAVED)
    return path if saved else None

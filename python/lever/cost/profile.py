"""The on-device profile (`lever profile`): measured, cached, keyed.

    key = profile_key(target, draft_model, target_id=..., draft_id=..., kernels="native",
                      reader_backend="auto", read_limit_bytes_per_s=0.0,
                      dtype="bfloat16")
    profile = load_or_measure(target, draft_model, key)       # cached under <cache>/profiles/
    model = CostModel(profile)                                # lever.cost.cost_model

Mode lever does not wait for this measurement on a first run: `load_or_estimate`
takes a cached full profile if there is one, else a quick estimate made in
seconds (lever.cost.quick: a few reads per extent size and one layer's
forwards per layer layout; `quick` in the profile and its key), which the
run's real passes then correct (lever.cost.drift).

A profile is valid only for exactly what it was measured with: the models
(a store's manifest checksum, a GGUF's size and mtime), the storage format,
the kernels and thread counts, the flash reader and its read limit, the DRAM
budget and the extents it pins, the dtype, the machine, and the measurement
grid; on a static-shape backend (`--backend cpu-static|qnn`, lever.npu) also
the backend, its row and context buckets, the SoC and the onnxruntime / QNN
versions, so a cpu-static profile never serves a native run.  There the
grid is the row buckets and the cost a step function (`fixed_shapes`); a
qnn profile on a non-ARM host is marked `simulated` (the HTP simulator's
timings, not an NPU's).  All of that is the key; the cache file is named by its hash, so any
change means another file and a new measurement.  A cached file whose key
differs, that is corrupt, or of another version is never used: it is
re-measured with a warning on stderr (so a profile of format version 1,
medians of 2 runs without spread or validation, is measured again).
The file holds the raw per-point medians and their spread; the fitted
curves are computed when a CostModel is built (lever.cost.fit).

Units: seconds, bytes, bytes per second; `n` counts tree tokens per target pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from .. import _native
from ..atomic_write import save_cache_file
from ..errors import ProfileError
from ..values import cache_root, dtype_name
from . import measure as _measure
from . import quick as _quick
from .backend import static_identity, static_layers
from .device_profile import DEFAULT_DRAFT_GRID, DEFAULT_N_GRID, VERSION, DeviceProfile, Stage
from .identity import machine_identity, model_identity, store_identity

DEFAULT_CONTEXT_TOKENS = 128      # context tokens before each timed tree (measure_profile's default)
# Grids of the full profiles a run takes instead of a quick estimate: mode
# lever's own (`--reprofile`) and `lever profile`'s default (--max-n 256)
FULL_N_GRIDS = (DEFAULT_N_GRID, (*DEFAULT_N_GRID, 256))

__all__ = ["DeviceProfile", "Stage", "DEFAULT_N_GRID", "DEFAULT_DRAFT_GRID", "VERSION", "profile_key",
           "profile_path", "measure_profile", "load_or_measure", "cached_profile", "save_profile",
           "measure_defaults", "load_or_estimate", "quick_key"]


def measure_profile(target, draft_model, key: dict, n_grid=DEFAULT_N_GRID, draft_grid=DEFAULT_DRAFT_GRID,
                    context_tokens: int = 128, repeats: int = _measure.DEFAULT_REPEATS,
                    progress: bool = True) -> DeviceProfile:
    """Measure a profile now (no cache); see `lever.cost.measure.measure_profile`."""
    return _measure.measure_profile(target, draft_model, key, n_grid=n_grid, draft_grid=draft_grid,
                                    context_tokens=context_tokens, repeats=repeats, progress=progress)


def _torch_threads(kernels: str) -> int | None:
    """torch's intra-op threads on the torch reference (kernels "torch", which
    has loaded torch), else None: the native decoder never uses torch."""
    torch = sys.modules.get("torch") if kernels == "torch" else None
    return torch.get_num_threads() if torch is not None else None


def profile_key(target, draft_model, *, target_id, draft_id, kernels: str, reader_backend: str,
                read_limit_bytes_per_s: float, dtype) -> dict:
    """Everything a profile of (`target`, `draft_model`) depends on, as JSON data.

    target_id / draft_id: the models' paths on disk (a store directory, a
    GGUF file, a checkpoint directory).  kernels: "native" or "torch".
    reader_backend: as requested ("auto", "io_uring", "pread").  The draft
    enters as its file and the bytes its weights hold as loaded (a head
    re-quantised at load, `--draft-head q4_0`, is another draft).
    read_limit_bytes_per_s: the flash read cap (0 = none).  The reader's
    queue depth (chunk reads in flight) is read off the target.  A streamed
    target's memory enters as its residency (the pinned extents and the
    prefetch depth), not as the budget that produced it: budgets that pin the
    same layers share a profile.  For an in-memory target the reader, read
    limit and residency play no part and are recorded as None.
    """
    if kernels not in ("native", "torch"):
        raise ProfileError(f"kernels must be 'native' or 'torch', got {kernels!r}")
    streamed = hasattr(target, "plan")
    backend = {"kernels": kernels, "isa": _native.kernel_isa(), "native_threads": _native.get_num_threads(),
               "torch_threads": _torch_threads(kernels)}
    if streamed:
        r = target.reader.stats()
        backend.update(reader=reader_backend, reader_in_use=r["backend"], direct=bool(r["direct"]),
                       read_queue_depth=int(r["queue_depth"]), read_huge_pages=bool(r["huge_page_bytes"]),
                       read_limit_bytes_per_s=float(read_limit_bytes_per_s))
        memory = {"pinned": sorted(e.name for e in target.plan.pinned),
                  "prefetch_depth": target.plan.prefetch_depth}
        target_identity = store_identity(target.store_dir)
    else:
        backend.update(reader=None, read_limit_bytes_per_s=None)
        memory = {"pinned": None, "prefetch_depth": 0}
        target_identity = model_identity(target_id)
    layers = static_layers(target)
    if layers is not None:          # a static-shape backend (lever.npu): its buckets, SoC and versions
        backend["static"] = static_identity(layers)
    draft = {**model_identity(draft_id), "resident_weight_bytes": draft_model.resident_weight_bytes}
    key = {"target": target_identity, "draft": draft, "backend": backend,
           "memory": memory, "dtype": dtype_name(dtype), "machine": machine_identity()}
    return json.loads(json.dumps(key))          # plain JSON types, as read back from a file


def measure_defaults(target) -> dict:
    """Measurement settings a target's backend implies: on a static-shape backend the
    n grid is its row buckets (compute is a step function over them) and the
    context is at most 128 tokens, below the largest context bucket by the
    largest tree the measurement runs; {} on the native backend."""
    layers = static_layers(target)
    if layers is None:
        return {}
    rows = [int(r) for r in layers.planner.rows]
    room = int(layers.planner.max_context) - max(rows[-1], _measure.OVERHEAD_NODES)
    if room < 1:
        raise ProfileError(f"the largest context bucket ({layers.planner.max_context} tokens) leaves no room to "
                           f"measure a {max(rows[-1], _measure.OVERHEAD_NODES)}-token tree after a context: "
                           f"add a larger context bucket (--contexts)")
    return {"n_grid": rows, "context_tokens": min(DEFAULT_CONTEXT_TOKENS, room)}


def digest(key: dict) -> str:
    """16 hex digits of the SHA-256 of `key` as canonical JSON."""
    return _digest(key)


def _digest(key: dict) -> str:
    canonical = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def profile_path(key: dict, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache file of a profile with this (full) key: <cache>/profiles/<hash>.json."""
    return cache_root(cache_dir) / "profiles" / f"{_digest(key)}.json"


def full_key(key: dict, **measure_kwargs) -> dict:
    """`key` plus the measurement settings (grids, context, repeats): what a cached file must match."""
    return {**json.loads(json.dumps(key)), "measure": _measure.measure_settings(**measure_kwargs)}


def quick_key(key: dict, **settings) -> dict:
    """`key` plus a quick profile's settings ({"quick": true, grids, context,
    repeats}, lever.cost.quick): never the key of a full measurement."""
    return {**json.loads(json.dumps(key)), "measure": _quick.quick_settings(**settings)}


def _read_cached(path: Path, key: dict) -> DeviceProfile | None:
    """The profile stored at `path` if it is intact and has exactly `key`; else None
    (with a warning on stderr when a file was there but unusable)."""
    if not path.is_file():
        return None
    try:
        profile = DeviceProfile.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, ProfileError) as e:
        _warn(f"ignoring the cached profile {path} ({e}); measuring again")
        return None
    if profile.key != key:
        _warn(f"ignoring the cached profile {path}: it was measured for another configuration; measuring again")
        return None
    return profile


def _warn(line: str) -> None:
    print(f"lever: warning: {line}", file=sys.stderr, flush=True)


UNSAVED = "the device is measured again on the next run"


def _write(path: Path, profile: DeviceProfile) -> bool:
    """Write the profile atomically (lever.atomic_write); True if saved.  A cache
    that cannot take it (full, read-only, ...) costs one warning line, not the run."""
    return save_cache_file(path, json.dumps(profile.to_json(), indent=1), UNSAVED)


def cached_profile(key: dict, cache_dir: str | os.PathLike | None = None) -> DeviceProfile | None:
    """The cached profile with exactly this full key (measurement settings
    included, see `full_key`), or None (a bad file is warned about)."""
    return _read_cached(profile_path(key, cache_dir), key)


def save_profile(profile: DeviceProfile, cache_dir: str | os.PathLike | None = None) -> DeviceProfile:
    """Write `profile` (its key already holds the measurement settings) to the cache
    (a warning, not an error, if it cannot be saved); returns it."""
    _write(profile_path(profile.key, cache_dir), profile)
    return profile


def load_or_measure(target, draft_model, key: dict, cache_dir: str | os.PathLike | None = None,
                    force: bool = False, progress: bool = True, **measure_kwargs) -> DeviceProfile:
    """The cached profile for `key` (+ the measurement settings in `measure_kwargs`:
    n_grid, draft_grid, context_tokens, repeats), else a new measurement,
    saved to `profile_path(profile.key, cache_dir)`.  force: always measure.
    On a static-shape backend n_grid and context_tokens default to
    `measure_defaults(target)` (the row buckets)."""
    measure_kwargs = {**measure_defaults(target), **measure_kwargs}
    key = full_key(key, **measure_kwargs)
    path = profile_path(key, cache_dir)
    if not force:
        cached = _read_cached(path, key)
        if cached is not None:
            if progress:
                print(f"profile: using the cached profile {path}", file=sys.stderr, flush=True)
            return cached
    profile = _measure.measure_profile(target, draft_model, key, progress=progress, **measure_kwargs)
    saved = _write(path, profile)
    if progress:
        print(f"profile: measured in {profile.measure_s:.1f} s" + (f", saved to {path}" if saved else ""),
              file=sys.stderr, flush=True)
    return profile


def load_or_estimate(target, draft_model, key: dict, cache_dir: str | os.PathLike | None = None,
                     progress: bool = True) -> DeviceProfile:
    """The profile mode lever runs with when nobody asked for a measurement:
    a cached full profile of the default settings with either grid of
    FULL_N_GRIDS (`lever profile`, `--reprofile`), else a cached quick
    profile, else a quick estimate made now (lever.cost.quick: seconds
    instead of a minute) and cached under `quick_key`.  A target whose layers
    cannot run one at a time here (a static-shape backend, the torch kernels)
    is measured in full (`load_or_measure`)."""
    if not _quick.quick_supported(target) or measure_defaults(target):
        return load_or_measure(target, draft_model, key, cache_dir=cache_dir, progress=progress)
    for k in [full_key(key, n_grid=grid) for grid in FULL_N_GRIDS] + [quick_key(key)]:
        cached = _read_cached(profile_path(k, cache_dir), k)
        if cached is not None:
            if progress:
                print(f"profile: using the cached profile {profile_path(k, cache_dir)}"
                      + (" (a quick estimate)" if cached.quick else ""), file=sys.stderr, flush=True)
            return cached
    k = quick_key(key)
    profile = _quick.estimate_profile(target, draft_model, k, progress=progress)
    path = profile_path(k, cache_dir)
    saved = _write(path, profile)
    if progress:
        print(f"profile: measured this device in {profile.measure_s:.1f} s (a quick estimate, "
              f"{_quick.describe(profile, target)}; corrected by the real passes as they run; "
              f"`lever profile` measures in full)" + (f", saved to {path}" if saved else ""),
              file=sys.stderr, flush=True)
    return profile

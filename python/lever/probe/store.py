"""A trained early-exit probe on disk, keyed by the target it was trained for.

    probe = load_probe(probe_key_for(target, target_id), cache_dir)   # None: run without probes
    keep = probe.logits(features) >= probe.threshold

The file is JSON, <cache>/probes/probe-<key[:16]>.json beside the profiles
(lever.cost.profile), with a format version and a SHA-256 of its own
content.  The key is the target's identity: a flash store's
`manifest_sha256`, else the SHA-256 of the model file (see `probe_key_for`).
A file that is corrupt, of another format version or for another target is
never used: one warning line on stderr and None (run without probes).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..atomic_write import write_atomic
from ..cost.identity import model_identity
from ..errors import LeverError
from ..mode_lever import model_sha256
from ..store.manifest import StoreManifest
from ..store.manifest_json import CHECKSUM_FIELD
from ..values import cache_root
from .features import FEATURES, N_FEATURES

PROBE_FORMAT = "lever-probe"
PROBE_VERSION = 1
CHECKSUM = "sha256"
RETRAIN = "re-run `lever probe train`"


class ProbeError(LeverError):
    """A probe file that cannot be used (corrupt, another version, another target)."""


@dataclass
class ProbeModel:
    """A logistic probe over FEATURES at the output of decoder layer `layer` (0-based).

    weights: float64 [1 + len(FEATURES)], intercept first, in the raw feature
    space (any standardisation folded in): logit = w[0] + sum_f w[1+f] x_f.
    threshold: keep a node iff its logit >= threshold.  key: the target's
    identity (see `probe_key_for`); target: its name, for people.
    recall: the held-out recall of accepted-able nodes (label match) at the
    threshold.  metrics: what training measured (JSON data)."""

    layer: int
    weights: np.ndarray
    threshold: float
    key: str
    target: str = ""
    recall: float = float("nan")
    metrics: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.weights = np.asarray(self.weights, dtype=np.float64).reshape(-1)
        if self.weights.shape != (N_FEATURES + 1,):
            raise ProbeError(f"a probe has {N_FEATURES + 1} weights, got {self.weights.shape[0]}")
        if not np.all(np.isfinite(self.weights)) or not np.isfinite(self.threshold):
            raise ProbeError("a probe's weights and threshold must be finite")
        if int(self.layer) < 0:
            raise ProbeError(f"a probe's layer must be >= 0, got {self.layer}")
        self.layer, self.threshold = int(self.layer), float(self.threshold)

    @property
    def auto(self) -> bool:
        """Whether `--probes auto` runs this probe: training found it ahead of running
        without probes on held-out prompts (metrics["auto"], set by `lever probe train`)."""
        return bool(self.metrics.get("auto", False))

    def logits(self, features: np.ndarray) -> np.ndarray:
        """float64 [m]: the logit of each row of features (float [m, len(FEATURES)])."""
        x = np.asarray(features, dtype=np.float64).reshape(-1, N_FEATURES)
        return self.weights[0] + x @ self.weights[1:]

    def keep(self, features: np.ndarray) -> np.ndarray:
        """bool [m]: the nodes (rows) the probe keeps, by themselves (subtrees aside)."""
        return self.logits(features) >= self.threshold

    def to_json(self) -> dict:
        d = {"format": PROBE_FORMAT, "version": PROBE_VERSION, "key": self.key, "target": self.target,
             "layer": self.layer, "features": list(FEATURES), "weights": [float(w) for w in self.weights],
             "threshold": self.threshold, "recall": _plain(self.recall), "metrics": _plain(self.metrics)}
        d[CHECKSUM] = _checksum(d)
        return d

    @classmethod
    def from_json(cls, d) -> "ProbeModel":
        """ProbeError for another format or version, a bad checksum or bad fields."""
        if not isinstance(d, dict) or d.get("format") != PROBE_FORMAT:
            raise ProbeError("not a Lever probe file")
        if d.get("version") != PROBE_VERSION:
            raise ProbeError(f"probe format version {d.get('version')!r}, this Lever reads {PROBE_VERSION}")
        if d.get(CHECKSUM) != _checksum(d):
            raise ProbeError("its checksum does not match its content (edited or damaged)")
        if d.get("features") != list(FEATURES):
            raise ProbeError(f"features {d.get('features')!r}, this Lever computes {list(FEATURES)}")
        try:
            recall = d.get("recall")
            return cls(layer=int(d["layer"]), weights=np.asarray(d["weights"], dtype=np.float64),
                       threshold=float(d["threshold"]), key=str(d["key"]), target=str(d.get("target", "")),
                       recall=float("nan") if recall is None else float(recall), metrics=dict(d.get("metrics", {})))
        except (KeyError, TypeError, ValueError) as e:
            raise ProbeError(f"bad field ({e})") from None


def _plain(x):
    """JSON data: numpy scalars and arrays as Python numbers and lists, NaN/inf as None."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_plain(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    return x


def _checksum(d: dict) -> str:
    body = {k: v for k, v in d.items() if k != CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def probe_path(key: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """<cache>/probes/probe-<key[:16]>.json (the cache root of lever.values.cache_root)."""
    if not key:
        raise ProbeError("a probe needs the target's key")
    return cache_root(cache_dir) / "probes" / f"probe-{key[:16]}.json"


def save_probe(probe: ProbeModel, cache_dir: str | os.PathLike | None = None, path: Path | None = None) -> Path:
    """Write `probe` atomically (lever.atomic_write) to `path` (default probe_path);
    returns the path.  The probe is what `lever probe train` was asked for, so a
    file that cannot be written is an error (SaveError, naming it), not a warning."""
    path = Path(path) if path is not None else probe_path(probe.key, cache_dir)
    return write_atomic(path, json.dumps(probe.to_json(), indent=1))


def read_probe(path: str | os.PathLike) -> ProbeModel:
    """The probe in `path`; ProbeError (naming the file) if it cannot be used."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ProbeError(f"{path}: cannot read it ({e})") from None
    except ValueError as e:
        raise ProbeError(f"{path}: not JSON ({e})") from None
    try:
        return ProbeModel.from_json(data)
    except ProbeError as e:
        raise ProbeError(f"{path}: {e}") from None


def load_probe(key: str, cache_dir: str | os.PathLike | None = None) -> ProbeModel | None:
    """The probe trained for the target with `key`, or None: silently when there
    is none; with one warning line on stderr when the file is corrupt, of
    another version or for another target."""
    path = probe_path(key, cache_dir)
    if not path.exists():
        return None
    try:
        probe = read_probe(path)
    except ProbeError as e:
        _warn(f"ignoring the probe {e}; running without probes; {RETRAIN}")
        return None
    if probe.key != key:
        _warn(f"ignoring the probe {path}: it was trained for another target (or another version of it); "
              f"running without probes; {RETRAIN}")
        return None
    return probe


def _warn(line: str) -> None:
    print(f"lever: warning: {' '.join(line.split())}", file=sys.stderr, flush=True)


def probe_key_for(target, target_id: str | os.PathLike | None = None) -> str:
    """The identity a probe of `target` is keyed by: a flash store's (a
    StreamedDecoder's) `manifest_sha256`; else the SHA-256 of the model file it
    was loaded from (`target_id`: a GGUF path; the registry's record for a
    registered model), else a digest of `target_id`'s identity (path, sizes,
    mtimes of a checkpoint directory)."""
    manifest = getattr(target, "manifest", None)
    if manifest is not None:
        return str(manifest.to_json()[CHECKSUM_FIELD])
    if target_id is None:
        raise ProbeError("a probe of an in-memory target needs the model's path (target_id) to key it")
    p = Path(target_id)
    if p.is_dir() and (p / "manifest.json").is_file():       # a store loaded in memory by path
        return str(StoreManifest.load(p).to_json()[CHECKSUM_FIELD])
    sha = model_sha256(p) if p.is_file() else None
    if sha:
        return sha
    ident = json.dumps(model_identity(p), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(ident.encode()).hexdigest()

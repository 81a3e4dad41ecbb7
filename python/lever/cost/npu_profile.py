"""Measured per-bucket layer times from a real device: `--npu-profile FILE`.

The simulated HTP of an x86-64 host computes the right numbers at no
phone's speed, so the tree policy of a phone run wants the phone's own
figures.  An *npu profile* is a JSON file of them, measured on the device
(e.g. with a QNN profiling run of each bucket's context binary); with it,
`lever generate | bench | profile --npu-profile FILE` size the lever
trees by those figures instead of a profile measured here.

Schema ``lever-npu-profile/1`` (seconds; rows = tree tokens of one pass,
root included; context = cached tokens of a bucket):

    {
      "schema": "lever-npu-profile/1",          required, exactly this
      "device": "Galaxy S24 (SM8650)",          required, free text
      "soc_model": "57",                        required, the QNN SoC model id (a string)
      "layers": 30,                             required, the target's decoder layers
      "buckets": [                              required: one entry per (rows, context), a full grid
        {"rows": 1, "context": 512, "layer_s": 0.0009},
        {"rows": 8, "context": 512, "layer_s": 0.0012},
        ...
      ],
      "embed_s": {"1": 2e-05, "8": 3e-05, ...},  optional, per row bucket: the embedding lookup
      "head_s": {"1": 0.004, "8": 0.006, ...},   optional, per row bucket: final norm + output head
      "draft_s": {"1": 0.006, "2": 0.007, ...},  optional, per draft frontier nodes f: one draft forward
      "iteration_overhead_s": 0.0004,           optional, host work per iteration
      "flash_bytes_per_s": 2.1e9,               optional, the device's flash read rate (a streamed target)
      "measured": "2026-01-31T10:00:00Z",       optional, free text
      "notes": "..."                            optional, free text
    }

`layer_s` is the seconds of one decoder layer's bucket run (every layer of
a model runs the same graph, so one figure serves all of them).  Every
number must be finite and positive (a time of 0 is refused: nothing runs
in no time), rows and contexts positive integers, each (rows, context)
once, and the entries a full grid: every row bucket at every context.  A
field not listed above is refused (a misspelt optional field would
otherwise be silently ignored).  Every error is one line naming the file
and the field (``buckets[3].layer_s``).

From the file `NpuProfile.device_profile` builds a `DeviceProfile` with
``fixed_shapes`` true: its grid is the row buckets, every layer stage's
compute is `layer_s` at one context bucket -- the smallest context bucket
that holds the run's context (prompt + new tokens, the bucket the run
ends in), else the largest there is (the run's context exceeds them all)
-- so the pass cost is the step function of the buckets and the gain-cost
grower ends trees on bucket edges.  What the file leaves out (embedding,
head, draft curve, iteration overhead; a streamed target's flash reads
without ``flash_bytes_per_s``) comes from the profile measured on this
host for the same run (`lever profile`; cached), interpolated at the row
buckets -- a file that has them all needs no measurement here.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ProfileError
from .cost_model import interpolate
from .device_profile import DeviceProfile
from .measure import pass_stages

SCHEMA = "lever-npu-profile/1"
REQUIRED = ("schema", "device", "soc_model", "layers", "buckets")
OPTIONAL = ("embed_s", "head_s", "draft_s", "iteration_overhead_s", "flash_bytes_per_s", "measured", "notes")
MAX_BYTES = 16 << 20            # a profile file larger than this is not one


class NpuProfileError(ProfileError):
    """An npu profile file that cannot be read or fails the schema (one line)."""


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _seconds(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


@dataclass(frozen=True)
class NpuProfile:
    """A validated npu profile (see the module doc); times in seconds."""

    path: str
    sha256: str
    device: str
    soc_model: str
    layers: int
    rows: tuple[int, ...]                      # row buckets, increasing
    contexts: tuple[int, ...]                  # context buckets, increasing
    layer_s: dict                              # (rows, context) -> seconds of one layer
    embed_s: dict | None = None                # rows -> seconds
    head_s: dict | None = None                 # rows -> seconds
    draft_s: dict | None = None                # frontier nodes -> seconds
    iteration_overhead_s: float | None = None
    flash_bytes_per_s: float | None = None
    measured: str = ""

    def context_for(self, tokens: int) -> tuple[int, str]:
        """(the context bucket whose layer times price a run reaching `tokens`
        context tokens, a phrase saying why): the smallest bucket >= tokens,
        else the largest."""
        fits = [c for c in self.contexts if c >= tokens]
        if fits:
            return fits[0], f"the smallest context bucket holding the run's {tokens} tokens"
        return self.contexts[-1], (f"the largest context bucket (the run's {tokens} tokens exceed every "
                                   f"bucket of the profile)")

    def layer_curve(self, context: int) -> list[float]:
        """Seconds of one layer at each row bucket, at context bucket `context`."""
        return [self.layer_s[(r, context)] for r in self.rows]

    def missing(self, streamed: bool) -> list[str]:
        """The parts this file leaves to a profile measured on this host."""
        out = [name for name in ("embed_s", "head_s", "draft_s", "iteration_overhead_s")
               if getattr(self, name) is None]
        if streamed and self.flash_bytes_per_s is None:
            out.append("flash_bytes_per_s")
        return out

    def check_target(self, target) -> None:
        """NpuProfileError unless the file fits `target`: its layer count and, on
        a static-shape backend, its row buckets and SoC (qnn)."""
        n_layers = target.config.n_layers
        if self.layers != n_layers:
            raise NpuProfileError(f"--npu-profile {self.path}: field 'layers' is {self.layers}, the target has "
                                  f"{n_layers} decoder layers (a profile of another model?)")
        layers = getattr(target, "layers", None)
        if not getattr(layers, "fixed_shapes", False):
            return
        compiled = tuple(layers.planner.rows)
        if compiled != self.rows:
            raise NpuProfileError(f"--npu-profile {self.path}: its row buckets {','.join(map(str, self.rows))} "
                                  f"differ from this run's --buckets {','.join(map(str, compiled))}; run with "
                                  f"--buckets {','.join(map(str, self.rows))}")
        soc = getattr(getattr(layers.graphs, "target", None), "soc_model", None)
        if soc is not None and soc != self.soc_model:
            raise NpuProfileError(f"--npu-profile {self.path}: field 'soc_model' is {self.soc_model!r}, this run "
                                  f"prepares graphs for SoC {soc!r} (--soc)")

    def device_profile(self, target, context_tokens: int, host=None, say=None):
        """(a DeviceProfile with fixed_shapes for `target` from this file, a JSON
        summary of what came from where).  context_tokens: the run's context
        (prompt + new tokens).  host(): the profile measured on this host for
        the run (called only when the file leaves parts out, see `missing`).
        say(line): progress lines."""
        self.check_target(target)
        streamed = hasattr(target, "plan")
        context, why = self.context_for(int(context_tokens))
        missing = self.missing(streamed)
        base = None
        if missing:
            if say:
                say(f"npu profile: {', '.join(missing)} not in {self.path}: taken from this host's profile")
            base = host() if host is not None else None
            if base is None:
                raise NpuProfileError(f"--npu-profile {self.path}: lacks {', '.join(missing)} and no profile of "
                                      f"this host was given to fill them in")
        rows = np.asarray(self.rows, dtype=np.float64)

        def from_host(values) -> list[float]:
            return [float(x) for x in interpolate(base.n_grid, values, rows, base.fixed_shapes, base.pass_spread)]

        layer = self.layer_curve(context)
        times = {f"layer.{i}": list(layer) for i in range(self.layers)}
        times["embed"] = ([self.embed_s[r] for r in self.rows] if self.embed_s is not None
                          else from_host(base.embed_s))
        if self.head_s is not None:
            times["head"] = [self.head_s[r] for r in self.rows]
        else:
            heads = [s for s in base.stages if s.kind == "head"]
            times["head"] = list(np.sum([from_host(s.compute_s) for s in heads], axis=0))
        io: dict[str, tuple[float, int]] = {}
        if streamed:
            if self.flash_bytes_per_s is not None:
                io = {e.name: (e.length / self.flash_bytes_per_s, e.length) for e in target.plan.streamed}
            else:
                io = {s.name: (s.io_s, s.io_bytes) for s in base.stages if s.streamed}
        stages = pass_stages(target, times, io, len(self.rows))
        if self.draft_s is not None:
            draft_grid = sorted(self.draft_s)
            draft_s = [self.draft_s[f] for f in draft_grid]
        else:
            draft_grid, draft_s = list(base.draft_grid), list(base.draft_s)
        overhead = self.iteration_overhead_s if self.iteration_overhead_s is not None else base.iteration_overhead_s
        info = {"file": self.path, "sha256": self.sha256, "device": self.device, "soc_model": self.soc_model,
                "context": context, "context_rule": why, "run_context_tokens": int(context_tokens),
                "from_host": missing}
        key = {"npu_profile": {k: info[k] for k in ("file", "sha256", "device", "soc_model", "context")},
               "host": base.key if base is not None else None}
        p = DeviceProfile(key=key, n_grid=list(self.rows), stages=stages, embed_s=times["embed"],
                          draft_grid=draft_grid, draft_s=draft_s, iteration_overhead_s=float(overhead),
                          prefetch_depth=target.plan.prefetch_depth if streamed else 0, fixed_shapes=True,
                          created=self.measured, backend="npu-profile", simulated=False)
        p.validate()
        return p, info


def load_npu_profile(path) -> NpuProfile:
    """The validated npu profile at `path`; NpuProfileError (one line naming the
    file and the field) if it cannot be read or breaks the schema."""
    p = Path(path)
    where = f"--npu-profile {p}"
    try:
        raw = p.read_bytes()[:MAX_BYTES + 1]
    except OSError as e:
        raise NpuProfileError(f"{where}: cannot be read ({e.strerror or e})") from None
    if len(raw) > MAX_BYTES:
        raise NpuProfileError(f"{where}: larger than {MAX_BYTES >> 20} MiB, not an npu profile")
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise NpuProfileError(f"{where}: not JSON ({' '.join(str(e).split())})") from None
    return parse_npu_profile(doc, str(p), hashlib.sha256(raw).hexdigest())


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def parse_npu_profile(doc, path: str = "<npu profile>", sha256: str = "") -> NpuProfile:
    """Validate a parsed npu profile document (see the module doc)."""
    def bad(field: str, what: str, got=None):
        shown = "" if got is None else f", got {json.dumps(got)[:60]}"
        return NpuProfileError(f"--npu-profile {path}: field {field!r} {what}{shown}")

    if not isinstance(doc, dict):
        raise NpuProfileError(f"--npu-profile {path}: the file must hold a JSON object, got {type(doc).__name__}")
    for name in REQUIRED:
        if name not in doc:
            raise bad(name, "is missing")
    unknown = sorted(set(doc) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise bad(unknown[0], f"is not in schema {SCHEMA} (known fields: {', '.join(REQUIRED + OPTIONAL)})")
    if doc["schema"] != SCHEMA:
        raise bad("schema", f"must be {SCHEMA!r}", doc["schema"])
    for name in ("device", "soc_model"):
        if not isinstance(doc[name], str) or not doc[name].strip():
            raise bad(name, "must be a non-empty string", doc[name])
    for name in ("measured", "notes"):
        if name in doc and not isinstance(doc[name], str):
            raise bad(name, "must be a string", doc[name])
    if not _is_int(doc["layers"]) or doc["layers"] < 1:
        raise bad("layers", "must be a positive integer", doc["layers"])
    buckets = doc["buckets"]
    if not isinstance(buckets, list) or not buckets:
        raise bad("buckets", "must be a non-empty list of {rows, context, layer_s} objects", buckets)
    layer_s: dict[tuple[int, int], float] = {}
    for i, b in enumerate(buckets):
        field = f"buckets[{i}]"
        if not isinstance(b, dict):
            raise bad(field, "must be an object {rows, context, layer_s}", b)
        extra = sorted(set(b) - {"rows", "context", "layer_s"})
        if extra:
            raise bad(f"{field}.{extra[0]}", "is not a bucket field (rows, context, layer_s)")
        for name in ("rows", "context"):
            if name not in b:
                raise bad(f"{field}.{name}", "is missing")
            if not _is_int(b[name]) or b[name] < 1:
                raise bad(f"{field}.{name}", "must be a positive integer", b[name])
        if "layer_s" not in b:
            raise bad(f"{field}.layer_s", "is missing")
        if not _seconds(b["layer_s"]):
            raise bad(f"{field}.layer_s", "must be a positive finite number of seconds", b["layer_s"])
        key = (b["rows"], b["context"])
        if key in layer_s:
            raise bad(field, f"repeats bucket rows {key[0]} context {key[1]}")
        layer_s[key] = float(b["layer_s"])
    rows = tuple(sorted({r for r, _ in layer_s}))
    contexts = tuple(sorted({c for _, c in layer_s}))
    for r in rows:
        for c in contexts:
            if (r, c) not in layer_s:
                raise bad("buckets", f"lacks rows {r} at context {c}: give every row bucket at every context")
    per_rows = {}
    for name in ("embed_s", "head_s"):
        if name in doc:
            per_rows[name] = _seconds_map(doc[name], name, bad, "row bucket")
            have = set(per_rows[name])
            if have != set(rows):
                extra, lack = sorted(have - set(rows)), sorted(set(rows) - have)
                raise bad(name, (f"lacks row bucket {lack[0]}" if lack else f"names {extra[0]}, not a row bucket")
                          + f" (row buckets: {','.join(map(str, rows))})")
    draft = _seconds_map(doc["draft_s"], "draft_s", bad, "draft frontier size") if "draft_s" in doc else None
    scalars = {}
    for name in ("iteration_overhead_s", "flash_bytes_per_s"):
        if name in doc:
            if not _seconds(doc[name]):
                raise bad(name, "must be a positive finite number", doc[name])
            scalars[name] = float(doc[name])
    return NpuProfile(path=path, sha256=sha256, device=doc["device"].strip(), soc_model=doc["soc_model"].strip(),
                      layers=doc["layers"], rows=rows, contexts=contexts, layer_s=layer_s,
                      embed_s=per_rows.get("embed_s"), head_s=per_rows.get("head_s"), draft_s=draft,
                      measured=doc.get("measured", ""), **scalars)


def _seconds_map(value, name: str, bad, what: str) -> dict[int, float]:
    """{"8": seconds, ...} as {8: seconds}: keys positive integers (as JSON strings), values seconds."""
    if not isinstance(value, dict) or not value:
        raise bad(name, f"must be a non-empty object mapping each {what} (as a string, e.g. \"8\") to seconds",
                  value)
    out = {}
    for k, v in value.items():
        if not (isinstance(k, str) and k.isdigit() and int(k) >= 1):
            raise bad(f"{name}.{k}", f"is not a {what} (a positive integer as a string)")
        if not _seconds(v):
            raise bad(f"{name}.{k}", "must be a positive finite number of seconds", v)
        out[int(k)] = float(v)
    return out

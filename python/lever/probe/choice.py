"""`--probes on|off|auto`: whether a run prunes its target passes early, and with what.

- off: never.
- on: with the probe trained for this target (`lever probe train`); an error
  when there is none, or when the target is not the native decoder in this
  process (the torch reference and remote verifiers have no layer hook).
- auto: as on when the probe file exists and its training found it worth
  running (`ProbeModel.auto`: ahead of the draft-probability baseline and
  faster under the cost model on held-out traces); otherwise off, silently.

With a cost model at hand (mode lever's), a pass is scored only when the
model predicts it at least MIN_SAVING faster pruned at the probe's expected
survival (`pruning_pays`): with the reads of an I/O-bound pass hiding its
compute, pruning would only lose the pruned nodes' acceptance.
"""

from __future__ import annotations

from ..cost.pruning import PrunedCostModel, PruneForecast
from ..errors import LeverError
from ..model.native_decoder import NativeDecoder
from .prune import ProbePruner
from .store import load_probe, probe_key_for

PROBE_CHOICES = ("on", "off", "auto")
MIN_SAVING = 0.02         # share of a pass's seconds pruning must save before a pass is scored
NO_PROBE = "run `lever probe record` and `lever probe train` for it first"


def probe_pruner(target, choice: str, target_id=None, cache_dir=None) -> ProbePruner | None:
    """The pass hook that prunes `target`'s passes under `choice` (see module doc), or None."""
    if choice not in PROBE_CHOICES:
        raise LeverError(f"--probes must be one of {', '.join(PROBE_CHOICES)}, got {choice!r}")
    if choice == "off":
        return None
    if not isinstance(target, NativeDecoder):
        if choice == "on":
            raise LeverError("--probes on needs the native decoder (--kernels native) in this process")
        return None
    probe = load_probe(probe_key_for(target, target_id), cache_dir)
    if probe is None:
        if choice == "on":
            raise LeverError(f"--probes on: no probe is trained for this target; {NO_PROBE}")
        return None
    if choice == "auto" and not probe.auto:
        return None
    return ProbePruner(probe, target)


def probe_forecast(pruner: ProbePruner | None):
    """The gain-cost policy's survival forecast of `pruner`'s passes (None without one),
    starting from the share of draft nodes that survived on the probe's held-out traces."""
    if pruner is None:
        return None
    return PruneForecast(pruner.stats, pruner.probe.layer, float(pruner.probe.metrics.get("survive", 1.0)))


def pruning_pays(cost, pruner: ProbePruner, max_n: int = 256):
    """`pays(n)` for `pruner` under `cost` (a lever.cost.cost_model.CostModel): True
    when a pass over n tree tokens pruned at the probe's held-out survival is
    predicted at least MIN_SAVING faster than the whole pass."""
    survive = float(pruner.probe.metrics.get("survive", 1.0))
    whole = cost.verify_s(max_n)
    pruned = PrunedCostModel(cost, pruner.probe.layer, survive).verify_s(max_n)
    pays = pruned <= (1.0 - MIN_SAVING) * whole
    return lambda n: bool(pays[min(n, max_n) - 1])

"""Choosing the read ring's depth of a streamed target from its measured profile.

The DRAM budget is fixed, so a deeper ring costs pinned extents: each extra
read buffer (the size of the largest streamed extent) un-pins about one
layer, whose read is then added to every pass.  In exchange the reader has
more room to read ahead while the target does not need it -- while the
pinned tail computes and while the draft grows the next tree -- so that
fewer reads are waited for.  Which side wins depends on measured read and
compute seconds, so the choice is made here, after profiling, by the ring
simulation of lever.cost.cost_model (`simulate_passes` with an idle gap of
the draft's seconds between passes).

For every depth 2..MAX_PREFETCH_DEPTH the residency plan of the same budget
is made (lever.store.residency.plan_residency), each streamed extent's read
is priced at the profile's measured flash bandwidth (bytes / seconds over
its streamed extents), stage compute is the profile's fit, and one
iteration of a typical lever tree is predicted: TYPICAL_TREE_TOKENS tokens
verified after a draft of TYPICAL_DRAFT_FORWARDS forwards over 2 nodes
each.  The fastest depth is taken when it beats the current plan by more
than MIN_GAIN; otherwise the plan stays.  A profile for the new plan is
derived from the measured one (same compute; reads at the measured
bandwidth) instead of measuring again.

Units: seconds, bytes, bytes per second; n counts tree tokens of a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import DramBudgetError
from ..store.residency import MAX_PREFETCH_DEPTH, ResidencyPlan, plan_residency
from ..values import dtype_bytes
from .cost_model import CostModel, simulate_passes
from .device_profile import DeviceProfile, Stage
from .profile import cached_profile, digest, save_profile

MIN_DEPTH = 2
TYPICAL_TREE_TOKENS = 8          # root + 7 draft nodes
TYPICAL_DRAFT_FORWARDS = 4       # draft forwards per iteration, 2 nodes each
MIN_GAIN = 0.03                  # a new depth must predict an iteration at least 3 % shorter


@dataclass(frozen=True)
class DepthChoice:
    """The chosen ring depth and the predicted iteration seconds per depth."""

    depth: int
    current: int
    predicted_s: dict[int, float]
    pinned_layers: dict[int, int]

    @property
    def changed(self) -> bool:
        return self.depth != self.current

    def rule(self) -> str:
        """One line for the plan's `prefetch_depth_rule`."""
        now, was = self.predicted_s[self.depth], self.predicted_s[self.current]
        if not self.changed:
            return (f"profile: {self.current} slots kept ({was * 1e3:.0f} ms per iteration predicted; no depth "
                    f"from {min(self.predicted_s)} to {max(self.predicted_s)} is {MIN_GAIN:.0%} faster)")
        return (f"profile: {self.depth} slots predict {now * 1e3:.0f} ms per iteration against "
                f"{was * 1e3:.0f} ms with {self.current} ({self.pinned_layers[self.depth]} layers pinned "
                f"instead of {self.pinned_layers[self.current]})")


def flash_bandwidth(profile: DeviceProfile) -> float:
    """Bytes per second of the profile's streamed reads; 0.0 when nothing streams."""
    seconds = sum(s.io_s for s in profile.stages if s.streamed)
    return sum(s.io_bytes for s in profile.stages if s.streamed) / seconds if seconds > 0 else 0.0


@dataclass(frozen=True)
class TypicalIteration:
    """What the choice predicts for every depth, computed once from the profile:
    stage compute seconds of a pass over n tokens (pass order), the embedding's
    seconds, and the draft's seconds before the pass (the reader's idle gap)."""

    n: int
    compute_s: list
    embed_s: float
    gap_s: float

    @classmethod
    def of(cls, profile: DeviceProfile, n: int = TYPICAL_TREE_TOKENS) -> "TypicalIteration":
        model = CostModel(profile)
        compute = model.stage_compute_s(np.array([float(n)]))
        embed = float(model.compute_s(n)[n - 1]) - float(np.sum([c[0] for c in compute]))
        gap = TYPICAL_DRAFT_FORWARDS * float(model.draft_s(2)[1])
        return cls(n, compute, max(0.0, embed), gap)


def predict_iteration_s(profile: DeviceProfile, work: TypicalIteration, plan: ResidencyPlan,
                        bandwidth: float) -> float:
    """Seconds of `work`'s iteration (draft gap + pass) if the target ran under
    `plan`, every read at `bandwidth` bytes per second."""
    streamed = {e.name: e.length for e in plan.streamed}
    io = [streamed.get(s.name, 0) / bandwidth for s in profile.stages]
    flags = [s.name in streamed for s in profile.stages]
    ring = simulate_passes(io, work.compute_s, flags, plan.prefetch_depth, gap_s=work.gap_s)
    return float(ring[0]) + work.embed_s


def choose_depth(profile: DeviceProfile, plan: ResidencyPlan, manifest, dtype_bytes: int,
                 kv_tokens: int) -> DepthChoice:
    """The ring depth for the budget of `plan` (module doc); `plan` is the current one."""
    bandwidth = flash_bandwidth(profile)
    current = plan.prefetch_depth
    predicted, pinned = {}, {}
    if bandwidth > 0:
        work = TypicalIteration.of(profile)
        for depth in range(MIN_DEPTH, MAX_PREFETCH_DEPTH + 1):
            try:
                candidate = plan_residency(manifest, plan.budget, dtype_bytes, kv_tokens, depth,
                                           kv_pass_rows=plan.kv_pass_rows)
            except DramBudgetError:     # the budget cannot hold this many buffers
                break
            predicted[depth] = predict_iteration_s(profile, work, candidate, bandwidth)
            pinned[depth] = candidate.pinned_layers
        if current not in predicted:
            predicted[current] = predict_iteration_s(profile, work, plan, bandwidth)
    if current not in predicted:
        predicted[current] = 0.0
    pinned.setdefault(current, plan.pinned_layers)
    best = min(predicted, key=lambda d: (predicted[d], d))
    if predicted[best] > (1.0 - MIN_GAIN) * predicted[current]:
        best = current
    return DepthChoice(best, current, dict(sorted(predicted.items())), dict(sorted(pinned.items())))


def derive_profile(profile: DeviceProfile, plan: ResidencyPlan, key: dict) -> DeviceProfile:
    """`profile` as if measured under `plan` (key: the profile key of that plan):
    compute as measured, reads of the streamed extents at the measured bandwidth."""
    bandwidth = flash_bandwidth(profile)
    streamed = {e.name: e.length for e in plan.streamed}
    stages = [Stage(s.name, s.kind, streamed[s.name] / bandwidth if s.name in streamed else 0.0,
                    streamed.get(s.name, 0), list(s.compute_s)) for s in profile.stages]
    return replace(profile, key=key, stages=stages, prefetch_depth=plan.prefetch_depth,
                   created=f"{profile.created} (derived for a ring of {plan.prefetch_depth})")


def tune_ring(target, profile: DeviceProfile, profile_key_of, cache_dir=None, say=None) -> DeviceProfile:
    """Re-plan the streamed `target` (a StreamedDecoder) with the ring depth
    `choose_depth` picks from `profile`, and return the profile of the plan it
    runs with: `profile` itself when the depth stays, else a measured profile
    of the new plan if one is cached, else one derived from `profile` (cached
    under the new plan's key plus `derived_from`, the digest of `profile`'s
    key and measurement time, so it is never taken for a measurement and a
    new measurement of the source makes a new one).
    profile_key_of(target): the profile key of the target's current plan
    (lever.cost.profile.profile_key with the run's settings)."""
    choice = choose_depth(profile, target.plan, target.manifest, dtype_bytes(target.dtype), target.kv_tokens)
    if not choice.changed:
        target.plan.depth_rule = f"{target.plan.depth_rule}; {choice.rule()}"
        return profile
    target.replan(choice.depth)
    target.plan.depth_rule = choice.rule()
    if say:
        say(f"profile: read ring {choice.current} -> {choice.depth} slots ({choice.rule()})")
    plain = {**profile_key_of(target), "measure": profile.key["measure"]}
    measured = cached_profile(plain, cache_dir)
    if measured is not None:
        return measured
    key = {**plain, "derived_from": digest({"key": profile.key, "created": profile.created})}
    return cached_profile(key, cache_dir) or save_profile(derive_profile(profile, target.plan, key), cache_dir)

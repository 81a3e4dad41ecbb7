"""The speculative configuration of each request of `lever serve`.

Modes ar, chain and tree use one fixed lever.engine.SpecConfig.  Mode
lever's gain-cost policy is calibrated per sampling setting (its acceptance
statistics differ; lever.mode_lever.calibration_path keys the file by it), and
each request brings its own setting: `LeverSpecs` keeps one policy per
setting, made on first use by `make_policy(params)` (the device profile is
measured once and cached, so only the first policy pays for it).
`lever.serve.generation` saves a policy's calibration after every run, as
`lever generate` does after its one.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Callable

from ..engine import SpecConfig
from ..mode_lever import sampling_key
from ..sampling import SamplingParams


def fixed_specs(spec: SpecConfig) -> Callable[[SamplingParams], SpecConfig]:
    """Modes ar, chain, tree: the same SpecConfig whatever the sampling."""
    return lambda params: spec


class LeverSpecs:
    """SpecConfigs of mode lever: `base` (any mode) with mode lever and the
    policy of the request's sampling setting."""

    def __init__(self, make_policy: Callable[[SamplingParams], object], base: SpecConfig):
        self.make_policy, self.base = make_policy, base
        self.policies: dict[str, object] = {}

    def __call__(self, params: SamplingParams) -> SpecConfig:
        key = json.dumps(sampling_key(params), sort_keys=True)     # what a calibration depends on (not the seed)
        if key not in self.policies:
            self.policies[key] = self.make_policy(params)
        return replace(self.base, mode="lever", policy=self.policies[key])

"""The verification cost of a remote verifier, for the gain-cost policy.

A round over an n-node tree costs network time plus the server's pass:

    verify_s(n) = network_s + server_curve(n) + server_extra_s + call_cost_s

- `server_curve` is the curve the server measured at start-up and publishes
  in /v1/info (seconds of one target pass over n tree tokens);
- `network_s` starts from health-check round trips and then follows each
  round's round-trip time minus the server time it reports;
- `server_extra_s` follows the reported server time minus the curve's value
  (per-round host work, a longer context, load).  It is additive, not a
  factor: most rounds are small, and scaling the whole curve by what small
  rounds show would inflate the cost of every extra tree token with it.

`call_cost_s` is not time: it is what the user says one target call is
worth in seconds of waiting (server work costs money); with it the policy
trades some speed for fewer, larger rounds.  0 by default: pure speed.

The draft curve (seconds of one draft forward over f nodes) is measured on
this device.  Every update bumps `revision`; the policy re-reads the curves
when it changes.  Seconds throughout.
"""

from __future__ import annotations

import numpy as np

from ..cost.cost_model import interpolate

LEARNING_RATE = 0.2            # weight of the newest observation


class RemoteCost:
    def __init__(self, server_curve: dict, draft_grid: list[int], draft_s: list[float], network_s: float,
                 overhead_s: float = 0.0, call_cost_s: float = 0.0):
        if not call_cost_s >= 0:
            raise ValueError(f"the cost of a target call must be >= 0 seconds, got {call_cost_s}")
        if not server_curve or len(server_curve.get("n", [])) != len(server_curve.get("s", [])) \
                or not server_curve["n"]:
            raise ValueError("the verifier published no verify cost curve")
        self.server_grid = [int(n) for n in server_curve["n"]]
        self.server_values = [float(s) for s in server_curve["s"]]
        self.draft_grid, self.draft_values = list(draft_grid), list(draft_s)
        self.network_s = max(0.0, float(network_s))
        self.server_extra_s = 0.0
        self.call_cost_s = float(call_cost_s)
        self.iteration_overhead_s = overhead_s
        self.revision = 0

    def server_s(self, n: int) -> float:
        """Predicted server seconds of a round over n tree tokens (root included)."""
        return max(0.0, self._curve(np.array([n]))[0] + self.server_extra_s)

    def _curve(self, n: np.ndarray) -> np.ndarray:
        return interpolate(self.server_grid, self.server_values, n)

    def verify_s(self, n_max: int) -> np.ndarray:
        curve = self._curve(np.arange(1, n_max + 1))
        return self.network_s + np.maximum(0.0, curve + self.server_extra_s) + self.call_cost_s

    def draft_s(self, f_max: int) -> np.ndarray:
        return interpolate(self.draft_grid, self.draft_values, np.arange(1, f_max + 1))

    spread = 0.0                 # it learns online itself: no measurement spread to refit against

    def hidden_draft_curve(self, n_max: int) -> np.ndarray:
        """Drafting overlaps nothing here: the loop waits for the server's answer (seconds, zeros)."""
        return np.zeros(n_max)

    def observe(self, n: int, round_trip_s: float, server_s: float) -> None:
        """Learn from one round over n tree tokens."""
        if round_trip_s <= 0:
            return
        net = max(0.0, round_trip_s - server_s)
        self.network_s += LEARNING_RATE * (net - self.network_s)
        if server_s > 0:
            extra = server_s - self._curve(np.array([n]))[0]
            self.server_extra_s += LEARNING_RATE * (extra - self.server_extra_s)
        self.revision += 1

    def summary(self) -> dict:
        return {"network_ms": round(self.network_s * 1e3, 3), "server_extra_ms": round(self.server_extra_s * 1e3, 3),
                "call_cost_ms": round(self.call_cost_s * 1e3, 3),
                "verify_ms": {n: round(float(self.verify_s(n)[-1]) * 1e3, 2) for n in (1, 16, 64)}}

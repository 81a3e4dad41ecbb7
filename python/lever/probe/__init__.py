"""Early-exit probes: score draft tree nodes part-way through the target pass
and prune those the target will reject (README: "Early-exit probes", and Design).

- `features`: the probe's features of a node (numpy reference of the native scorer);
- `traces`: recording tree passes over a prompt corpus (`lever probe record`);
- `train`, `evaluate`: numpy logistic probes per layer vs the draft-only
  baseline, held-out recall table, threshold by expected tokens/s (`lever probe train`);
- `store`: the trained `ProbeModel` on disk, keyed by the target (`load_probe`);
- `plot`: recall / precision against the threshold (PNG);
- `prune`: the pass hook that prunes with a probe during verification;
- `choice`: `--probes on|off|auto`, and whether pruning pays under a cost model.
"""

from .features import FEATURES, lens_scores, node_features, sibling_ranks
from .store import ProbeModel, load_probe, probe_key_for, probe_path, save_probe

__all__ = ["FEATURES", "lens_scores", "node_features", "sibling_ranks", "ProbeModel", "load_probe",
           "probe_key_for", "probe_path", "save_probe"]

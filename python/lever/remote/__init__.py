"""Edge-cloud mode (docs/edge-cloud.md): a verifier server hosting the target
(`lever serve-verifier`, server.py), the token-only protocol (protocol.py),
the tree batcher that scores concurrent sessions' trees in one pass
(batcher.py), the verifier clients (client.py; vllm_verifier.py verifies
through an unmodified vLLM server), the cost of a remote round for the
gain-cost policy (cost.py), and a loopback delay/loss proxy (netem.py).
The edge client that drafts here and verifies there, `RemoteTarget`, sits
above the runtime: `from lever.edge import RemoteTarget` (it moved out of
this package, which the runtime imports)."""

from .client import RemoteVerifier, RemoteVerifierError, VerifierBusyError, VerifierUnreachableError
from .vllm_verifier import VllmVerifier

__all__ = ["RemoteVerifier", "RemoteVerifierError", "VerifierBusyError", "VerifierUnreachableError",
           "VllmVerifier"]


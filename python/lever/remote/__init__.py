"""Edge-cloud mode (README, "Design"): a verifier server hosting the target
(`lever serve-verifier`, server.py), the token-only protocol (protocol.py),
the tree batcher that scores concurrent sessions' trees in one pass
(batcher.py), the edge client (client.py, edge.py), the adapter that
verifies through an unmodified vLLM server (vllm_verifier.py), the cost of
a remote round for the gain-cost policy (cost.py), and a loopback
delay/loss proxy (netem.py)."""

from .client import RemoteVerifier, RemoteVerifierError, VerifierBusyError, VerifierUnreachableError
from .edge import RemoteTarget
from .vllm_verifier import VllmVerifier

__all__ = ["RemoteTarget", "RemoteVerifier", "RemoteVerifierError", "VerifierBusyError", "VerifierUnreachableError",
           "VllmVerifier"]

"""Target-side token choice: greedy, or sampling from the processed distribution.

Sampling is keyed by position: the token at position t is the Gumbel-max
draw of the processed distribution at t with noise derived from (seed, t)
alone (`sample_at`).  So the same seed gives the same text whatever drafts
were proposed and however the trees were sized, in every mode, locally and
on a verifier server, and across restarts; and since the noise of different
positions is independent, the text has exactly the target's distribution.

`processed_probs` is *the* distribution the target samples from (temperature,
then top-k, then top-p, in that order as in Hugging Face); speculative
verification later uses the same function, which is what keeps it exact.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np
import torch


# The accepted ranges, defined once for the API, the CLI and the verifier
# server.  Temperatures below MIN_TEMPERATURE (other than 0, greedy) and top-p
# below MIN_TOP_P are refused rather than silently turned into greedy: at
# such values the processed distribution is a point mass only up to float32
# round-off, which is where inf/nan would come from.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 100.0
MIN_TOP_P = 1e-6
MAX_TOP_K = 1 << 31
MAX_SEED = (1 << 63) - 1


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy, else in [MIN_TEMPERATURE, MAX_TEMPERATURE];
    top_p in [MIN_TOP_P, 1] (1 disables it); top_k 0 (disabled) or a positive
    count of tokens; seed None (a random one) or an integer in 0..MAX_SEED.
    A value outside these ranges raises ValueError naming the field."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        t, p = self.temperature, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) \
                or not (t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):
            raise ValueError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE:g} and "
                             f"{MAX_TEMPERATURE:g}, got {t!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) \
                or not MIN_TOP_P <= p <= 1:
            raise ValueError(f"top_p must be between {MIN_TOP_P:g} and 1, got {p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 0 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be an integer between 0 and {MAX_TOP_K}, got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed must be an integer between 0 and 2**63-1, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def processed_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits [..., vocab] (float32) divided by the temperature, with the tokens
    that top-k and top-p remove set to -inf (greedy params are not allowed)."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already reach top_p
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities [..., vocab] (float32) after temperature, top-k and top-p:
    *the* distribution the target samples from."""
    return processed_logits(logits, params).softmax(-1)


def resolve_seed(params: SamplingParams) -> int:
    """The sequence's seed: params.seed, else a fresh random one in 0..MAX_SEED."""
    return params.seed if params.seed is not None else secrets.randbelow(MAX_SEED + 1)


# splitmix64 constants (a counter-based generator: any (seed, position, token)
# maps to its own 64 random bits, with no state carried between draws)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1, _MUL2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * _MUL1
    x = (x ^ (x >> np.uint64(27))) * _MUL2
    return x ^ (x >> np.uint64(31))


def position_noise(seed: int, position: int, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [vocab_size] (float64) of the token at `position`
    (tokens before it in the sequence) for sequence seed `seed`: the same
    numbers on every call, in every process and on every machine."""
    with np.errstate(over="ignore"):
        key = _mix64(np.array([seed], dtype=np.uint64) ^ _mix64(np.array([position], dtype=np.uint64) + _GOLDEN))
        bits = _mix64(key + np.arange(1, vocab_size + 1, dtype=np.uint64) * _GOLDEN)
    uniform = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53      # in (0, 1)
    return torch.from_numpy(-np.log(-np.log(uniform)))


def sample_at(logits: torch.Tensor, params: SamplingParams, seed: int, position: int) -> int:
    """The token at `position` given the model's logits [vocab] there: the
    argmax when greedy, else the Gumbel-max draw argmax(processed logits +
    position_noise(seed, position)), which is a draw from processed_probs.
    It depends on (seed, position, the distribution) only -- not on how the
    token was reached (plain decoding, a chain, a tree, a remote verifier)."""
    if params.greedy:
        return int(torch.argmax(logits))
    scores = processed_logits(logits, params).double() + position_noise(seed, position, logits.shape[-1])
    return int(torch.argmax(scores))

"""Target-side token choice: greedy, or sampling from the processed distribution.

`processed_probs` is *the* distribution the target samples from (temperature,
then top-k, then top-p, in that order as in Hugging Face); speculative
verification later uses the same function, which is what keeps it exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities [..., vocab] (float32) after temperature, top-k and top-p."""
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
    return logits.softmax(-1)


def choose_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id from logits [vocab]: argmax when greedy, else a seeded draw."""
    if params.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(processed_probs(logits, params), 1, generator=generator))


def make_generator(params: SamplingParams) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(params.seed if params.seed is not None else torch.seed())
    return g

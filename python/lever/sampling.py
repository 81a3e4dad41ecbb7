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

from . import _native


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


def processed_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Logits [..., vocab] (float32) divided by the temperature, with the tokens
    that top-k and top-p remove set to -inf (greedy params are not allowed)."""
    logits = np.asarray(logits, dtype=np.float32) / np.float32(params.temperature)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = np.partition(logits, -params.top_k, axis=-1)[..., -params.top_k, None]   # k-th largest
        logits = np.where(logits < kth, np.float32(-np.inf), logits)
    if params.top_p < 1.0:
        order = np.argsort(-logits, axis=-1, kind="stable")                          # descending
        sorted_probs = softmax(np.take_along_axis(logits, order, axis=-1))
        # drop a token when the tokens before it already reach top_p
        drop_sorted = (np.cumsum(sorted_probs, axis=-1) - sorted_probs) >= params.top_p
        drop = np.empty_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        logits = np.where(drop, np.float32(-np.inf), logits)
    return logits


def processed_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Probabilities [..., vocab] (float32) after temperature, top-k and top-p:
    *the* distribution the target samples from."""
    return softmax(processed_logits(logits, params))


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in x's float dtype (-inf entries get 0)."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(x: np.ndarray) -> np.ndarray:
    """Log-probabilities over the last axis (float32 for float32 logits)."""
    x = np.asarray(x, dtype=np.float32)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def head_for(params: SamplingParams) -> str:
    """The model head a token choice needs: "argmax" ids when greedy (no
    [rows, vocab] logits are made), else "logits"."""
    return "argmax" if params.greedy else "logits"


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


def position_noise(seed: int, position: int, vocab_size: int) -> np.ndarray:
    """Gumbel(0, 1) noise [vocab_size] (float64) of the token at `position`
    (tokens before it in the sequence) for sequence seed `seed`: the same
    numbers on every call, in every process and on every machine."""
    with np.errstate(over="ignore"):
        key = _mix64(np.array([seed], dtype=np.uint64) ^ _mix64(np.array([position], dtype=np.uint64) + _GOLDEN))
        bits = _mix64(key + np.arange(1, vocab_size + 1, dtype=np.uint64) * _GOLDEN)
    uniform = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53      # in (0, 1)
    return -np.log(-np.log(uniform))


def sample_at(logits: np.ndarray, params: SamplingParams, seed: int, position: int) -> int:
    """The token at `position` given the model's logits [vocab] there: the
    argmax (first maximum) when greedy, else the Gumbel-max draw
    argmax(processed logits + position_noise(seed, position)), which is a draw
    from processed_probs.  It depends on (seed, position, the distribution)
    only -- not on how the token was reached (plain decoding, a chain, a tree,
    a remote verifier).

    The draw runs in the native core (`lever._native.sample_position`, ~0.1 ms
    over a 152k vocabulary): the token `sample_at_reference` gives, up to float
    rounding at the top-p boundary (csrc/model/sampler.h says where)."""
    if params.greedy:
        return int(np.argmax(logits))
    row = np.ascontiguousarray(logits, dtype=np.float32)
    return _native.sample_position(row, params.temperature, params.top_k, params.top_p, seed, position)


def sample_at_reference(logits: np.ndarray, params: SamplingParams, seed: int, position: int) -> int:
    """`sample_at` in numpy (the definition; slow: a full sort for top-p and
    two logs per vocabulary entry): argmax(processed_logits(logits) (float32,
    widened) + position_noise(seed, position)) (float64), the first maximum."""
    if params.greedy:
        return int(np.argmax(logits))
    scores = processed_logits(logits, params).astype(np.float64) + position_noise(seed, position, logits.shape[-1])
    return int(np.argmax(scores))


def choose_token(row, params: SamplingParams, seed: int | None, position: int) -> int:
    """The token from one row of a forward whose head was `head_for(params)`:
    the argmax id itself when greedy, else `sample_at` of the logits row."""
    return int(row) if params.greedy else sample_at(row, params, seed, position)

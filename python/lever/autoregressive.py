"""Plain autoregressive decoding: prefill the prompt, then one token per forward.

`model` is any model of the numpy protocol (lever.model.loading): forward(tokens,
positions, mask, cache, logits_rows=None, head="logits"|"argmax").  Greedy
decoding asks for argmax ids only; sampling for the logits row it draws from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .errors import ContextOverflowError
from .masks import causal_mask
from .sampling import SamplingParams, choose_token, head_for, resolve_seed

PREFILL_CHUNK = 512   # tokens per prefill forward (bounds attention memory)


@dataclass
class GenerationResult:
    """What one `generate_tokens` call produced. Times are in seconds."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    stop_reason: str = "length"          # "eos" or "length"
    seed: int | None = None              # the sequence's sampling seed (None when greedy)
    prefill_s: float = 0.0
    decode_s: float = 0.0

    def emit(self, token: int, max_new_tokens: int, stop_ids: frozenset[int],
             on_token: Callable[[int], None] | None = None) -> bool:
        """Append a new token (and pass it to `on_token`); True when generation
        must stop: it is a stop id (stop_reason "eos") or the length is reached."""
        self.token_ids.append(token)
        if on_token is not None:
            on_token(token)
        if token in stop_ids:
            self.stop_reason = "eos"
            return True
        return len(self.token_ids) >= max_new_tokens

    @property
    def decode_tokens_per_s(self) -> float:
        """Generated tokens after the first, per second of decoding."""
        n = len(self.token_ids) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


def kv_tokens(*, prompt_tokens: int, new_tokens: int, extra: int = 0, floor: int = 0,
              context: int | None = None, sequences: int = 1) -> int:
    """KV cache rows (tokens), the one sizing rule of every cache and every plan:
    prompt + new tokens + `extra` (a pass's draft rows and the engine's
    headroom), at least `floor`, at most the model's `context` (a longer
    request is refused by `check_context`, naming that limit), times
    `sequences` (sessions sharing one planned cache)."""
    need = max(int(floor), int(prompt_tokens) + int(new_tokens) + int(extra))
    if context is not None:
        need = min(int(context), need)
    return need * int(sequences)


def check_context(n_prompt: int, max_new_tokens: int, max_context: int, tree_room: int = 0,
                  tree_what: str = "") -> None:
    """ContextOverflowError unless the prompt, the new tokens and `tree_room`
    more (a draft tree's depth, or its rows on a static-shape target: tree_what
    says which) fit `max_context` tokens."""
    if n_prompt == 0:
        raise ContextOverflowError("the prompt is empty (0 tokens)")
    if n_prompt + max_new_tokens + tree_room > max_context:
        tree = f" and {tree_room} for {tree_what or 'the draft tree'}" if tree_room else ""
        raise ContextOverflowError(
            f"prompt of {n_prompt} tokens plus {max_new_tokens} new tokens{tree} exceeds "
            f"the model's context of {max_context} tokens")


def prefill_chunk(model, chunk_ids: list[int], start: int, cache, head: str = "logits") -> np.ndarray:
    """Feed `chunk_ids` at positions start.. after the `start` cached rows;
    returns the chunk's last row of the head: its logits float32 [vocab]
    (head "logits") or its argmax id, an int64 scalar (head "argmax")."""
    n = len(chunk_ids)
    out = model(np.asarray(chunk_ids, dtype=np.int64), np.arange(start, start + n, dtype=np.int64),
                causal_mask(n, start), cache, logits_rows=np.array([n - 1], dtype=np.int64), head=head)
    return out[0]


PrefillPace = Callable[[int, int], int]
"""pace(tokens prefilled so far, tokens to prefill) -> the next chunk's tokens:
called before each prefill forward; it may raise (a LeverError) to stop the
prefill between two chunks -- how `lever serve` cancels one (lever.serve.generation)."""


def chunk_size(pace: "PrefillPace | int", done: int, total: int) -> int:
    """The tokens of the next prefill chunk: `pace` itself when an int, else
    what pace(done, total) returns (at least 1)."""
    size = pace if isinstance(pace, int) else pace(done, total)
    if size < 1:
        raise ValueError(f"a prefill chunk needs at least 1 token, got {size}")
    return size


def prefill(model, prompt_ids: list[int], cache, head: str = "logits",
            pace: "PrefillPace | int" = PREFILL_CHUNK) -> np.ndarray:
    """Feed the prompt in chunks of PREFILL_CHUNK tokens (or as `pace` sizes
    them: see `PrefillPace`); returns the last token's row of the head (see
    `prefill_chunk`)."""
    out, start = None, 0
    while start < len(prompt_ids):
        n = chunk_size(pace, start, len(prompt_ids))
        out = prefill_chunk(model, list(prompt_ids[start:start + n]), start, cache, head)
        start += len(prompt_ids[start:start + n])
    return out


def generate_tokens(model, prompt_ids: list[int], max_new_tokens: int,
                    params: SamplingParams = SamplingParams(), stop_ids: frozenset[int] = frozenset(),
                    on_token: Callable[[int], None] | None = None) -> GenerationResult:
    """Decode up to `max_new_tokens` tokens after `prompt_ids`, stopping at a stop id
    (which is included in the output). `on_token` is called with each new id."""
    check_context(len(prompt_ids), max_new_tokens, model.config.max_context)
    result = GenerationResult(prompt_ids=list(prompt_ids))
    if max_new_tokens <= 0:
        return result
    seed = None if params.greedy else resolve_seed(params)
    result.seed = seed
    cache = model.new_cache(capacity=kv_tokens(prompt_tokens=len(prompt_ids), new_tokens=max_new_tokens))
    head = head_for(params)
    t0 = time.perf_counter()
    row = prefill(model, prompt_ids, cache, head)
    result.prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    while True:
        token = choose_token(row, params, seed, position=len(prompt_ids) + len(result.token_ids))
        if result.emit(token, max_new_tokens, stop_ids, on_token):
            break
        pos = cache.length
        row = model(np.array([token], dtype=np.int64), np.array([pos], dtype=np.int64), causal_mask(1, pos),
                    cache, head=head)[0]
    result.decode_s = time.perf_counter() - t0
    return result

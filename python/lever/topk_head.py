"""The model protocol's head="topk": each row's K best tokens and their log-probs.

    model.forward(..., head="topk", topk=K) -> (ids int64 [R, K], logprobs float32 [R, K])

ids: each row's K largest logits (K is clipped to the vocabulary), largest
first, equal logits in token id order (the lower id first) -- `top_k_ids`
of the logits, so column 0 is the row's argmax (its first maximum).
logprobs: log_softmax of the row at those ids, computed as
logit - logsumexp(row) with the log-sum-exp accumulated in float64 and the
result rounded to float32 once.  They equal numpy's float32
`lever.sampling.log_softmax` of the row to within float32 rounding (a few
ulp), not bitwise: numpy sums the exponentials in float32, pairwise.

The native decoder gets them from `_native.topk_update` without ever making
the [R, vocab] logits (`topk_state` / `topk_result`); a model that has the
logits anyway (the torch reference) uses `topk_of_logits`.
"""

from __future__ import annotations

import numpy as np

EMPTY_ID = np.iinfo(np.int64).max    # token id of a top-k slot not filled yet (ranks last)


def top_k_ids(rows: np.ndarray, k: int) -> np.ndarray:
    """Each row's `k` largest entries (at most the row's length): int64 ids
    [R, k], largest first, equal values in index order -- so column 0 is the
    row's argmax (its first maximum), and the result never depends on how a
    partition happened to break ties."""
    k = min(k, rows.shape[-1])
    part = np.argpartition(rows, -k, axis=-1)[:, -k:]                  # the k largest, in any order
    vals = np.take_along_axis(rows, part, axis=-1)
    top = np.take_along_axis(part, np.lexsort((part, -vals), axis=-1), axis=-1)
    kth = vals.min(axis=-1, keepdims=True)
    # rows where the k-th value ties with entries the partition left out: take the lowest ids
    for r in np.flatnonzero((rows == kth).sum(axis=-1) > (vals == kth).sum(axis=-1)):
        ids = np.flatnonzero(rows[r] >= kth[r])
        top[r] = ids[np.argsort(-rows[r, ids], kind="stable")[:k]]
    return top


def check_topk(topk, vocab_size: int) -> int:
    """K for head="topk": `topk` (an int >= 1) clipped to the vocabulary; ValueError otherwise."""
    if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)) or topk < 1:
        raise ValueError(f"head='topk' needs topk >= 1 (tokens per row), got {topk!r}")
    return min(int(topk), vocab_size)


def topk_state(rows: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Empty running state for `_native.topk_update` over `rows` rows:
    (best_val float32 [rows, k] = -inf, best_idx int64 [rows, k] = EMPTY_ID,
    run_max float32 [rows] = -inf, run_sum float64 [rows] = 0)."""
    return (np.full((rows, k), -np.inf, dtype=np.float32), np.full((rows, k), EMPTY_ID, dtype=np.int64),
            np.full(rows, -np.inf, dtype=np.float32), np.zeros(rows, dtype=np.float64))


def topk_result(best_val: np.ndarray, best_idx: np.ndarray, run_max: np.ndarray,
                run_sum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids, logprobs) from a finished top-k state: logprobs = best_val -
    (run_max + log(run_sum)) in float64, rounded to float32."""
    lse = run_max.astype(np.float64) + np.log(run_sum)
    return best_idx, (best_val.astype(np.float64) - lse[:, None]).astype(np.float32)


def topk_of_logits(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """head="topk" of full logits float32 [R, vocab] (see the module docstring)."""
    logits = np.asarray(logits, dtype=np.float32)
    ids = top_k_ids(logits, k)
    run_max = logits.max(axis=-1)
    run_sum = np.exp(logits.astype(np.float64) - run_max[:, None]).sum(axis=-1)
    return topk_result(np.take_along_axis(logits, ids, axis=-1), ids, run_max, run_sum)

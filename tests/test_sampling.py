"""Sampling: the processed distribution equals transformers' warpers, draws follow it."""

import math

import pytest
import torch
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from lever.sampling import SamplingParams, choose_token, make_generator, processed_probs


def hf_probs(logits, t, k, p):
    scores = logits[None].clone()
    scores = TemperatureLogitsWarper(t)(None, scores)
    if k:
        scores = TopKLogitsWarper(k)(None, scores)
    if p < 1:
        scores = TopPLogitsWarper(p)(None, scores)
    return scores.softmax(-1)[0]


@pytest.mark.parametrize("t,k,p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (0.8, 0, 0.9),
                                   (1.3, 20, 0.5), (0.5, 3, 0.95), (1.0, 0, 0.01)])
def test_processed_probs_match_transformers(t, k, p):
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3
    ours = processed_probs(logits, SamplingParams(temperature=t, top_k=k, top_p=p))
    ref = hf_probs(logits, t, k, p)
    assert torch.allclose(ours, ref, atol=1e-6)
    assert (ours > 0).sum() == (ref > 0).sum()


def test_greedy_is_argmax():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    assert choose_token(logits, SamplingParams(), None) == int(logits.argmax())


def test_draws_follow_the_processed_distribution():
    """Chi-square goodness of fit of 20,000 seeded draws (p-value threshold 1e-3)."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    params = SamplingParams(temperature=0.9, top_k=6, top_p=0.95, seed=123)
    probs = processed_probs(logits, params)
    gen = make_generator(params)
    n = 20_000
    counts = torch.zeros(8)
    for _ in range(n):
        counts[choose_token(logits, params, gen)] += 1
    support = probs > 0
    assert counts[~support].sum() == 0                       # filtered tokens never drawn
    expected = probs[support] * n
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    dof = int(support.sum()) - 1
    # Wilson-Hilferty approximation of the chi-square quantile at 1 - 1e-3
    z = 3.09
    crit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < crit, (chi2, crit, counts, expected)


def test_seed_makes_draws_repeatable():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=1.0, seed=7)
    a = [choose_token(logits, params, g) for g in [make_generator(params)] for _ in range(20)]
    b = [choose_token(logits, params, g) for g in [make_generator(params)] for _ in range(20)]
    assert a == b and len(set(a)) > 1


@pytest.mark.parametrize("kwargs,msg", [(dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"),
                                        (dict(top_p=1.5), "top_p"), (dict(top_k=-2), "top_k")])
def test_bad_sampling_parameters(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kwargs)

"""Sampling: the processed distribution equals transformers' warpers; the
position-keyed draws follow it, depend on (seed, position) alone and are
independent across positions; the accepted parameter ranges."""

import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from lever import _native
from lever.sampling import (MAX_SEED, SamplingParams, position_noise, processed_logits, processed_probs,
                            resolve_seed, sample_at, sample_at_reference)


def hf_probs(logits, t, k, p):
    """transformers' warpers on numpy logits (they run on torch): the reference."""
    scores = torch.from_numpy(logits)[None].clone()
    scores = TemperatureLogitsWarper(t)(None, scores)
    if k:
        scores = TopKLogitsWarper(k)(None, scores)
    if p < 1:
        scores = TopPLogitsWarper(p)(None, scores)
    return scores.softmax(-1)[0].numpy()


@pytest.mark.parametrize("t,k,p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (0.8, 0, 0.9),
                                   (1.3, 20, 0.5), (0.5, 3, 0.95), (1.0, 0, 0.01)])
def test_processed_probs_match_transformers(t, k, p):
    logits = (torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3).numpy()
    ours = processed_probs(logits, SamplingParams(temperature=t, top_k=k, top_p=p))
    ref = hf_probs(logits, t, k, p)
    assert ours.dtype == np.float32 and ours.shape == (1000,)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-6)
    assert (ours > 0).sum() == (ref > 0).sum()


def test_greedy_is_argmax():
    logits = (torch.randn(50, generator=torch.Generator().manual_seed(1))).numpy()
    assert sample_at(logits, SamplingParams(), None, 0) == int(logits.argmax())
    tied = np.array([0.0, 3.0, 1.0, 3.0], dtype=np.float32)      # the first maximum
    assert sample_at(tied, SamplingParams(), None, 0) == 1


def test_processed_probs_rows_are_independent():
    """A [rows, vocab] batch gives each row what it gets alone (verification passes rows)."""
    rows = (torch.randn(5, 300, generator=torch.Generator().manual_seed(4)) * 2).numpy()
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.8)
    batch = processed_probs(rows, params)
    for r in range(5):
        assert np.array_equal(batch[r], processed_probs(rows[r], params))


def chi2_critical(dof: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at 1 - 1e-3 (z = 3.09)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi2_stat(counts, probs, n):
    support = probs > 0
    assert counts[~support].sum() == 0                       # filtered tokens never drawn
    expected = probs[support] * n
    return float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1


def test_draws_over_positions_follow_the_processed_distribution():
    """20,000 draws at successive positions of one seed: chi-square goodness of fit."""
    logits = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], dtype=np.float32)
    params = SamplingParams(temperature=0.9, top_k=6, top_p=0.95, seed=123)
    n = 20_000
    counts = np.zeros(8)
    for pos in range(n):
        counts[sample_at(logits, params, params.seed, pos)] += 1
    chi2, dof = chi2_stat(counts, processed_probs(logits, params), n)
    assert chi2 < chi2_critical(dof), (chi2, counts)


def test_draws_over_seeds_follow_the_processed_distribution():
    """20,000 draws at one position under successive seeds."""
    logits = np.array([0.3, 1.5, -1.0, 0.5, 2.0, -0.5], dtype=np.float32)
    params = SamplingParams(temperature=1.2, top_p=0.97)
    n = 20_000
    counts = np.zeros(6)
    for seed in range(n):
        counts[sample_at(logits, params, seed, 17)] += 1
    chi2, dof = chi2_stat(counts, processed_probs(logits, params), n)
    assert chi2 < chi2_critical(dof), (chi2, counts)


def test_neighbouring_positions_are_independent():
    """The pair (draw at t, draw at t + 1) over 20,000 t: chi-square test of
    independence against the product of the marginals (4 x 4 cells)."""
    logits = np.zeros(4, dtype=np.float32)
    params = SamplingParams(temperature=1.0)
    n = 20_000
    draws = [sample_at(logits, params, 99, t) for t in range(n + 1)]
    pairs = np.zeros((4, 4))
    for a, b in zip(draws[:-1], draws[1:]):
        pairs[a, b] += 1
    expected = np.full((4, 4), n / 16)
    chi2 = float(((pairs - expected) ** 2 / expected).sum())
    assert chi2 < chi2_critical(15), pairs


def test_a_draw_depends_on_seed_and_position_only():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(2)).numpy()
    params = SamplingParams(temperature=1.0, seed=7)
    a = [sample_at(logits, params, 7, t) for t in range(40)]
    b = [sample_at(logits.copy(), params, 7, t) for t in range(40)]
    c = [sample_at(logits, params, 8, t) for t in range(40)]
    assert a == b and len(set(a)) > 1 and a != c


def test_noise_is_fixed_across_versions():
    """The counter-based noise is part of the seed's meaning (a seed names the
    same text on every machine and in every release): pinned values."""
    noise = position_noise(12345, 67, 4)
    assert isinstance(noise, np.ndarray) and noise.dtype == np.float64
    g = noise.tolist()
    assert g == pytest.approx(PINNED_NOISE, abs=1e-12), g
    assert np.isfinite(position_noise(MAX_SEED, 2**40, 3)).all()


PINNED_NOISE = [0.6317335971926811, 2.479646964765107, 2.347810961077632, 1.4400464822540124]


# ---------------------------------------------------------------------------
# The native draw (lever._native.sample_position, behind sample_at) against the
# numpy reference (sample_at_reference). What may differ is float rounding only
# (csrc/model/sampler.h): numpy's SIMD log vs libm's (1 ulp of the noise), and
# at the top-p boundary numpy's float32 pairwise sum and SIMD exp vs the
# native double sum and libm exp (a few float32 ulps of a probability). So the
# native processed row must equal processed_logits except for tokens whose
# cumulative mass before them is within BOUNDARY of top_p, and the native token
# must be the Gumbel-max of the native processed row -- hence the reference's
# token whenever the rows agree.

BOUNDARY = 1e-6      # |cumsum - p - float32(top_p)| of a token the two may keep differently


def reference_mass_before(logits, params):
    """Per token: the float32 probability mass before it in processed_logits'
    top-p sort (the quantity its drop rule compares with top_p)."""
    lg = np.asarray(logits, np.float32) / np.float32(params.temperature)
    if params.top_k and params.top_k < lg.shape[-1]:
        kth = np.partition(lg, -params.top_k)[-params.top_k]
        lg = np.where(lg < kth, np.float32(-np.inf), lg)
    order = np.argsort(-lg, kind="stable")
    e = np.exp(lg[order] - lg.max())
    probs = e / e.sum()
    before = np.empty_like(probs)
    before[order] = np.cumsum(probs) - probs
    return before


def check_native_draw(logits, params, seed, position) -> bool:
    """Asserts the native draw is the reference's up to the rounding above;
    returns whether the processed rows were bit-identical."""
    ours = _native.processed_scores(logits, params.temperature, params.top_k, params.top_p)
    ref = processed_logits(logits, params)
    differ = np.flatnonzero(ours != ref)
    if len(differ):
        assert params.top_p < 1, (differ, params)
        margin = np.abs(reference_mass_before(logits, params)[differ].astype(np.float64) - np.float32(params.top_p))
        assert margin.max() <= BOUNDARY, (differ, margin, params)
    token = sample_at(logits, params, seed, position)
    scores = ours.astype(np.float64) + position_noise(seed, position, len(logits))
    assert token == int(np.argmax(scores)), (token, int(np.argmax(scores)), params, seed, position)
    if not len(differ):
        assert token == sample_at_reference(logits, params, seed, position)
    return not len(differ)


def random_row(rng, vocab: int, kind: int) -> np.ndarray:
    """Logits of one of several shapes: normal, wide, rounded (many ties),
    flat, one peaked token, some -inf, nearly flat."""
    x = rng.standard_normal(vocab)
    x = [x, x * 20, np.round(x * 2), np.zeros(vocab), x, x * 3, x * 0.01][kind]
    if kind == 4:
        x[rng.integers(vocab)] += 30
    if kind == 5:
        x[rng.random(vocab) < 0.3] = -np.inf
    return x.astype(np.float32)


def test_native_draw_equals_reference_on_random_rows():
    """4,000 random (row, temperature, top_k, top_p, seed, position) cases."""
    rng = np.random.default_rng(20261201)
    identical = 0
    n = 4000
    for _ in range(n):       # (an all -inf row makes the reference warn: errstate below)
        vocab = int(rng.choice([1, 2, 7, 50, 1000, 4099]))
        params = SamplingParams(temperature=float(rng.choice([1e-3, 0.3, 0.8, 1.0, 1.5, 100.0])),
                                top_k=int(rng.choice([0, 0, 1, 2, 10, 40, vocab, vocab + 5])),
                                top_p=float(rng.choice([1.0, 1.0, 0.9, 0.5, 0.95, 0.999, 1e-6, 0.9999999])))
        with np.errstate(invalid="ignore"):
            identical += check_native_draw(random_row(rng, vocab, int(rng.integers(7))), params,
                                           int(rng.integers(0, MAX_SEED, dtype=np.int64)), int(rng.integers(0, 2**40)))
    assert identical >= 0.98 * n           # differences only at a top-p boundary within rounding


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8), SamplingParams(temperature=1.0, top_k=40),
                                    SamplingParams(temperature=0.8, top_p=0.95),
                                    SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
                                    SamplingParams(temperature=1.0, top_k=5000)])
def test_native_draw_equals_reference_at_full_vocabulary(params):
    """A 151,936-token vocabulary (Qwen's), flat and peaked rows: the pruned
    draw and the prefix-only top-p sort give the reference's token."""
    rng = np.random.default_rng(7)
    vocab = 151_936
    rows = [rng.standard_normal(vocab).astype(np.float32), (rng.standard_normal(vocab) * 4).astype(np.float32)]
    rows[1][123] += 25
    for row in rows:
        for position in range(3):
            assert check_native_draw(row, params, 99, 1000 + position)


def test_native_draw_non_finite_rows():
    """As the reference: a NaN wins (the first), else a +inf (the first); an
    all -inf row gives token 0; -inf entries are never drawn."""
    cases = [[0.0, np.nan, 1.0, np.nan], [0.0, np.inf, 1.0, np.inf], [-np.inf] * 3, [np.inf, np.nan],
             [-np.inf, 2.0, -np.inf, 2.0], [1e38, 3e38, -3e38]]
    with np.errstate(invalid="ignore", over="ignore"):
        for row in cases:
            row = np.array(row, dtype=np.float32)
            for params in (SamplingParams(temperature=1e-3), SamplingParams(temperature=1.0, top_k=1),
                           SamplingParams(temperature=0.5, top_p=0.5), SamplingParams(temperature=2.0, top_k=2, top_p=0.9)):
                for position in range(4):
                    assert sample_at(row, params, 5, position) == sample_at_reference(row, params, 5, position), \
                        (row, params, position)


def test_native_noise_is_the_reference_noise():
    """The native splitmix64 bits are the reference's; the logs agree to ~1 ulp."""
    for seed, position in [(12345, 67), (0, 0), (MAX_SEED, 2**40), (7, 123_456)]:
        np.testing.assert_allclose(_native.position_noise(seed, position, 50_000), position_noise(seed, position, 50_000),
                                   rtol=4e-16, atol=4e-16)
    assert _native.position_noise(12345, 67, 4).tolist() == pytest.approx(PINNED_NOISE, abs=1e-12)


def test_native_draw_argument_checks():
    row = np.zeros(8, dtype=np.float32)
    for bad in (row.astype(np.float64), row.reshape(2, 4), row[::2], np.zeros(0, dtype=np.float32)):
        with pytest.raises(ValueError, match="logits"):
            _native.sample_position(bad, 1.0, 0, 1.0, 0, 0)
    for t in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            _native.sample_position(row, t, 0, 1.0, 0, 0)
    with pytest.raises(ValueError, match="top_k"):
        _native.sample_position(row, 1.0, -1, 1.0, 0, 0)
    for p in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="top_p"):
            _native.sample_position(row, 1.0, 0, p, 0, 0)
    assert sample_at(row.astype(np.float64), SamplingParams(temperature=1.0), 3, 4) == \
        sample_at_reference(row, SamplingParams(temperature=1.0), 3, 4)       # sample_at converts to float32


def test_resolve_seed():
    assert resolve_seed(SamplingParams(seed=5)) == 5
    s = resolve_seed(SamplingParams())
    assert 0 <= s <= MAX_SEED


@pytest.mark.parametrize("kwargs,msg", [
    (dict(temperature=-1), "temperature"), (dict(temperature=1e-300), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=1e9), "temperature"), (dict(top_p=0), "top_p"), (dict(top_p=1e-300), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(top_p=float("nan")), "top_p"), (dict(top_k=-2), "top_k"),
    (dict(top_k=1.5), "top_k"), (dict(seed=-1), "seed"), (dict(seed=2**64), "seed"), (dict(seed="7"), "seed")])
def test_bad_sampling_parameters(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(temperature=1e-3), dict(temperature=100.0), dict(top_p=1e-6),
                                    dict(temperature=0.5, top_p=1e-6, top_k=1), dict(seed=MAX_SEED)])
def test_extreme_but_valid_parameters_draw_a_token(kwargs):
    """At the floors the processed distribution is still finite: a draw is a real token."""
    logits = (torch.randn(50, generator=torch.Generator().manual_seed(3)) * 30).numpy()
    params = SamplingParams(**kwargs)
    tok = sample_at(logits, params, params.seed or 0, 3)
    assert 0 <= tok < 50
    if not params.greedy:
        probs = processed_probs(logits, params)
        assert np.isfinite(probs).all() and probs[tok] > 0

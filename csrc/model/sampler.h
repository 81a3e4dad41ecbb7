// The position-keyed Gumbel-max draw of lever.sampling.sample_at, in C++.
//
// The token at `position` under sequence seed `seed` is
//   argmax_i  double(s_i) + g_i        (the first index on ties)
// where s [vocab] (float32) are the processed logits -- divided by the
// temperature, then top-k, then top-p, exactly the float32 steps of
// lever.sampling.processed_logits, dropped tokens -inf -- and g_i (float64) is
// the Gumbel noise of token i: g = -log(-log(u)), u = ((bits >> 11) + 0.5) 2^-53,
// bits = splitmix64 of (seed, position, i) as in lever.sampling.position_noise.
//
// It is fast because it is exact without scoring every token:
//  * the 64 noise bits of every token are cheap (a vectorised splitmix64), the
//    two logs are not: a token whose bits are below kHighBits (all but 1 in
//    256) has g <= g0 (~5.54), so once the others and the top token are
//    scored (best B), such a token needs its logs only if
//    s_i + g0 >= B -- in practice a few dozen tokens out of 150k;
//  * top-k: the k-th largest by a size-k heap (nth_element for large k);
//  * top-p: one vectorised pass sums exp(s_i - top) and the mass within 1, 4
//    and 16 nats of the top logit; only the tokens within the smallest such
//    distance whose mass can reach top_p are sorted (more if they fall short;
//    a radix sort past 4096 tokens), and the scan stops once the cumulative
//    mass is past top_p by more than its rounding;
//  * the passes over the row are vectorised; chunks of 32 tokens with nothing
//    above a pass's threshold are skipped by one vector compare.
//
// Where the result can differ from the numpy reference (float rounding only):
//  * numpy's float64 log (SIMD) and libm's log differ by 1 ulp on ~0.3% of
//    inputs, so g_i may differ by ~1e-16 relative: a different token only if
//    two scores are within a few ulps of each other (never seen in practice);
//  * top-p: numpy normalises with a float32 pairwise sum over the fully sorted
//    row and a SIMD float32 exp; here the sum is accumulated in double over
//    the row (then rounded to float32) of a ~1-ulp polynomial exp, and the
//    probabilities of the sorted prefix use libm's expf. Probabilities
//    may differ by a few float32 ulps, so the cumulative mass before a token
//    can fall on the other side of top_p when it is within ~1e-6 of it: only
//    such tokens can be kept by one and dropped by the other -- normally none
//    or the one token at the nucleus boundary; with float32(top_p) within
//    ~1e-6 of 1 (top_p = 0.9999999), possibly the whole tail of tokens whose
//    probabilities round to nothing. The cumulative sum itself is the
//    reference's: float32, in sorted order, and the drop test is its
//    (cumsum - p) >= float32(top_p), token by token.
// Non-finite rows follow the reference too: a NaN anywhere gives the first
// NaN's index, else a +inf the first +inf's index, and an all -inf row gives 0.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lever {

// Gumbel(0, 1) noise of tokens [0, n) at (seed, position): out[i] is
// lever.sampling.position_noise(seed, position, n)[i] (up to libm's log).
void position_noise(uint64_t seed, uint64_t position, size_t n, double* out);

// Processed logits (float32) of one row of `vocab` logits into out[vocab]:
// logits / float32(temperature); then, if 0 < top_k < vocab, tokens below the
// k-th largest -> -inf; then, if top_p < 1, tokens whose sorted predecessors'
// probabilities already sum to >= float32(top_p) -> -inf. temperature > 0.
void processed_scores(const float* logits, size_t vocab, double temperature, int64_t top_k,
                      double top_p, float* out);

// The sampled token (see above). temperature > 0 and finite (greedy is the
// caller's argmax), top_k >= 0, 0 < top_p <= 1, 1 <= vocab < 2^31; throws
// std::invalid_argument otherwise. Thread-safe (per-thread scratch buffers).
int64_t sample_position(const float* logits, size_t vocab, double temperature, int64_t top_k,
                        double top_p, uint64_t seed, uint64_t position);

}  // namespace lever

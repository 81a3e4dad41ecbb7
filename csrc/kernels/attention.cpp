// Row-invariant masked attention (see attention.h).
//
// Each (query row, head) pair is one work item on the thread pool:
//   1. gather the unmasked keys in index order and score them (q . k * scale),
//   2. softmax the scores (max, exp, sum with a fixed 16-lane structure),
//   3. add up the value rows weighted by the softmax numerators, divide by the sum.
// The loops are plain C++ over 16 independent lanes, which the compiler turns
// into SIMD code; on x86-64 the work function is compiled for AVX-512, AVX2
// and baseline and the best is picked at load time (as in dequant.cpp).
//
// aarch64 (GCC 12, -O3; ASIMD is baseline): the q . k dot products (fp32 and
// bf16 keys: shll + fmla), the softmax sum and the weighted value sum are
// vectorised by the compiler (checked with objdump); the exp of the softmax
// is not (its clamp and floor stay scalar under -ftrapping-math), so it has
// an explicit NEON version below, softmax_numerators, 4 lanes at a time with
// the same operations as the scalar code, fused exactly where GCC fuses the
// scalar code under -ffp-contract=fast: bit-identical results (tested in
// tests/native/test_attention.cpp).

#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common/parallel.h"
#include "kernels/dequant.h"

#include "common/multiversion.h"  // LEVER_KERNEL

#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#define LEVER_INLINE inline __attribute__((always_inline))

namespace lever {
namespace {

constexpr size_t kLanes = 16;

LEVER_INLINE float to_f32(float x) { return x; }
LEVER_INLINE float to_f32(uint16_t bf16) {
  const uint32_t u = static_cast<uint32_t>(bf16) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// exp(x) for x <= 0 (scores minus their maximum), relative error ~1e-7:
// x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its degree-7 Taylor polynomial.
LEVER_INLINE float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// x[i] = exp_nonpositive(x[i] - mx) for i < n: the softmax numerators.
LEVER_INLINE void softmax_numerators_scalar(float* x, size_t n, float mx) {
  for (size_t i = 0; i < n; ++i) x[i] = exp_nonpositive(x[i] - mx);
}

#if defined(__aarch64__)
// exp_nonpositive on 4 lanes. Each step is the scalar step: a * b + c where
// GCC contracts the scalar code (x * log2e + 0.5, the Horner steps) is one
// fused vfmaq_f32, x - n * c is one fused vfmsq_f32, and the rest are single
// roundings; std::max(x, -87) is vmaxq_f32 (the same for every non-NaN x).
LEVER_INLINE float32x4_t exp_nonpositive_neon(float32x4_t x) {
  x = vmaxq_f32(x, vdupq_n_f32(-87.0f));
  const float32x4_t n =
      vrndmq_f32(vfmaq_f32(vdupq_n_f32(0.5f), x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f));
  r = vfmsq_f32(r, n, vdupq_n_f32(1.428606765330187e-06f));
  float32x4_t p = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), r, vdupq_n_f32(1.0f / 5040.0f));
  p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

LEVER_INLINE void softmax_numerators_neon(float* x, size_t n, float mx) {
  const float32x4_t m = vdupq_n_f32(mx);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(x + i, exp_nonpositive_neon(vsubq_f32(vld1q_f32(x + i), m)));
  softmax_numerators_scalar(x + i, n - i, mx);
}
#endif

LEVER_INLINE void softmax_numerators_best(float* x, size_t n, float mx) {
#if defined(__aarch64__)
  softmax_numerators_neon(x, n, mx);
#else
  softmax_numerators_scalar(x, n, mx);
#endif
}

// q . k over d values with 16 partial sums combined in a fixed order.
template <typename T>
LEVER_INLINE float dot(const float* q, const T* k, size_t d) {
  float acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) acc[l] += q[i + l] * to_f32(k[i + l]);
  }
  for (; i < d; ++i) acc[i % kLanes] += q[i] * to_f32(k[i]);
  for (size_t w = kLanes / 2; w > 0; w /= 2) {
    for (size_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0];
}

struct Job {
  AttentionShape s;
  const void* q;
  ElemType q_type;
  size_t q_head, q_row;
  const void* k;
  const void* v;
  size_t kv_head, kv_row;
  const uint8_t* mask;
  float scale;
  void* out;
  ElemType out_type;
  size_t out_row;
};

// Per-thread buffers for one work item.
struct Scratch {
  std::vector<float> q, scores, acc;
  std::vector<uint32_t> keys;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

template <typename KV>
LEVER_INLINE void attend(const Job& job, size_t item, Scratch& buf) {
  const AttentionShape& s = job.s;
  const size_t t = item / s.n_heads, h = item % s.n_heads;
  const size_t g = h / (s.n_heads / s.n_kv_heads);
  const size_t d = s.d;
  const KV* k = static_cast<const KV*>(job.k) + g * job.kv_head;
  const KV* v = static_cast<const KV*>(job.v) + g * job.kv_head;

  float* q = buf.q.data();
  const size_t q_at = h * job.q_head + t * job.q_row;
  for (size_t i = 0; i < d; ++i) {
    q[i] = job.q_type == ElemType::kF32 ? static_cast<const float*>(job.q)[q_at + i]
                                        : to_f32(static_cast<const uint16_t*>(job.q)[q_at + i]);
  }

  // 1. Scores of the unmasked keys, in key order.
  const uint8_t* mask = job.mask + t * s.L;
  float* scores = buf.scores.data();
  uint32_t* keys = buf.keys.data();
  size_t n = 0;
  for (size_t j = 0; j < s.L; ++j) {
    if (!mask[j]) continue;
    keys[n] = static_cast<uint32_t>(j);
    scores[n] = dot(q, k + j * job.kv_row, d) * job.scale;
    ++n;
  }

  // 2. Softmax numerators and their sum.
  float* acc = buf.acc.data();
  std::fill(acc, acc + d, 0.0f);
  float sum = 0.0f;
  if (n > 0) {
    float mx = scores[0];
    for (size_t i = 1; i < n; ++i) mx = std::max(mx, scores[i]);
    softmax_numerators_best(scores, n, mx);
    float part[kLanes] = {};
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (size_t l = 0; l < kLanes; ++l) part[l] += scores[i + l];
    }
    for (; i < n; ++i) part[i % kLanes] += scores[i];
    for (size_t w = kLanes / 2; w > 0; w /= 2) {
      for (size_t l = 0; l < w; ++l) part[l] += part[l + w];
    }
    sum = part[0];
  }

  // 3. Weighted sum of the value rows.
  for (size_t i = 0; i < n; ++i) {
    const float p = scores[i];
    const KV* vr = v + keys[i] * job.kv_row;
    for (size_t c = 0; c < d; ++c) acc[c] += p * to_f32(vr[c]);
  }
  const float inv = n > 0 ? 1.0f / sum : 0.0f;
  const size_t o_at = t * job.out_row + h * d;
  if (job.out_type == ElemType::kF32) {
    float* o = static_cast<float*>(job.out) + o_at;
    for (size_t c = 0; c < d; ++c) o[c] = acc[c] * inv;
  } else {
    uint16_t* o = static_cast<uint16_t*>(job.out) + o_at;
    for (size_t c = 0; c < d; ++c) o[c] = fp32_to_bf16(acc[c] * inv);
  }
}

LEVER_KERNEL void attend_range_f32(const Job& job, size_t begin, size_t end) {
  Scratch& buf = scratch();
  for (size_t item = begin; item < end; ++item) attend<float>(job, item, buf);
}

LEVER_KERNEL void attend_range_bf16(const Job& job, size_t begin, size_t end) {
  Scratch& buf = scratch();
  for (size_t item = begin; item < end; ++item) attend<uint16_t>(job, item, buf);
}

}  // namespace

namespace attention_detail {
void softmax_numerators(float* x, size_t n, float mx) { softmax_numerators_best(x, n, mx); }
void softmax_numerators_portable(float* x, size_t n, float mx) {
  softmax_numerators_scalar(x, n, mx);
}
}  // namespace attention_detail

void attention(const AttentionShape& s, const void* q, ElemType q_type, size_t q_head,
               size_t q_row, const void* k, const void* v, ElemType kv_type, size_t kv_head,
               size_t kv_row, const uint8_t* mask, float scale, void* out, ElemType out_type,
               size_t out_row) {
  if (s.n_heads == 0 || s.n_kv_heads == 0 || s.d == 0 || s.n_heads % s.n_kv_heads != 0) {
    throw std::invalid_argument("attention: n_heads must be a positive multiple of n_kv_heads");
  }
  if (out_row < s.n_heads * s.d) throw std::invalid_argument("attention: output row too short");
  if (s.T == 0) return;
  const Job job{s, q, q_type, q_head, q_row, k, v, kv_head, kv_row, mask, scale, out, out_type, out_row};
  const size_t items = s.T * s.n_heads;
  const size_t work = std::max<size_t>(1, s.L * s.d);  // multiply-adds per item, about
  const size_t grain = std::max<size_t>(1, 32768 / work);
  parallel_for(items, grain, [&](size_t begin, size_t end) {
    Scratch& buf = scratch();
    if (buf.q.size() < s.d) buf.q.resize(s.d);
    if (buf.acc.size() < s.d) buf.acc.resize(s.d);
    if (buf.scores.size() < s.L) buf.scores.resize(s.L);
    if (buf.keys.size() < s.L) buf.keys.resize(s.L);
    if (kv_type == ElemType::kF32) {
      attend_range_f32(job, begin, end);
    } else {
      attend_range_bf16(job, begin, end);
    }
  });
}

}  // namespace lever

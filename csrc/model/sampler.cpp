// The position-keyed Gumbel-max draw (see sampler.h for what is computed and
// where float rounding can differ from the numpy reference).

#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

// The noise-bits loop is compiled for AVX-512 (a vector 64-bit multiply),
// AVX2 and the baseline, picked at load time.
#include "common/multiversion.h"  // LEVER_KERNEL

namespace lever {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Tokens whose noise bits are >= kHighBits (the top 8 bits set: 1 token in
// 256) are scored in the first pass; any other token has g <= g0 (~5.54).
constexpr uint64_t kHighBits = 0xFF00000000000000ull;
constexpr size_t kBitsBlock = 2048;  // tokens per noise-bits block
constexpr size_t kScanChunk = 32;    // tokens per vectorised "any candidate here?" test

// Up to this k, top-k's threshold comes from a size-k heap, else nth_element.
constexpr size_t kHeapTopK = 4096;

inline uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t position_key(uint64_t seed, uint64_t position) {
  return mix(seed ^ mix(position + kGolden));
}

// The noise bits of token i (0-based; the reference counts tokens from 1).
inline uint64_t token_bits(uint64_t key, uint64_t i) { return mix(key + (i + 1) * kGolden); }

inline double gumbel_of_bits(uint64_t bits) {
  const double u = (static_cast<double>(bits >> 11) + 0.5) * 0x1p-53;  // in (0, 1)
  return -std::log(-std::log(u));
}

// out[j] = mix(first + j * kGolden): the noise bits of n consecutive tokens.
LEVER_KERNEL void bits_run(uint64_t first, size_t n, uint64_t* out) {
  for (size_t j = 0; j < n; ++j) out[j] = mix(first + j * kGolden);
}

// 16 lanes (GCC/Clang vector extensions: lowered to whatever the clone's ISA has).
typedef float F32x16 __attribute__((vector_size(64)));
typedef int32_t I32x16 __attribute__((vector_size(64)));

// s[i] = x[i] / t; *max_out = max s[i] (NaN ignored) and *arg_out its first
// index (n <= INT32_MAX); returns false when some s[i] is not finite (NaN or +-inf).
LEVER_KERNEL bool divide_and_max(const float* x, size_t n, float t, float* s, float* max_out,
                                 int64_t* arg_out) {
  for (size_t i = 0; i < n; ++i) s[i] = x[i] / t;
  F32x16 m, bad = {}, v;  // bad: 0, or NaN once a lane saw a NaN or an inf
  I32x16 arg = {}, at;
  for (int l = 0; l < 16; ++l) m[l] = -kInf, at[l] = l;
  size_t i = 0;
  for (; i + 16 <= n; i += 16, at += 16) {
    std::memcpy(&v, s + i, sizeof v);
    arg = v > m ? at : arg;
    m = v > m ? v : m;
    bad += v * 0.0f;
  }
  float best = -kInf, flag = 0.0f;
  int64_t best_at = 0;
  for (int l = 0; l < 16; ++l) {  // the lanes' maxima: the first index of the largest
    if (m[l] > best || (m[l] == best && arg[l] < best_at)) best = m[l], best_at = arg[l];
    flag += bad[l];
  }
  for (; i < n; ++i) {
    if (s[i] > best) best = s[i], best_at = static_cast<int64_t>(i);
    flag += s[i] * 0.0f;
  }
  *max_out = best;
  *arg_out = best_at;
  return flag == 0.0f;
}

// Whether any of v[0, n) is >= threshold (vectorised; n small).
LEVER_KERNEL bool any_at_least(const float* v, size_t n, float threshold) {
  unsigned any = 0;
  for (size_t i = 0; i < n; ++i) any |= v[i] >= threshold;
  return any != 0;
}

LEVER_KERNEL bool any_bits_at_least(const uint64_t* v, size_t n, uint64_t threshold) {
  unsigned any = 0;
  for (size_t i = 0; i < n; ++i) any |= v[i] >= threshold;
  return any != 0;
}

// Scratch space, reused across calls of one thread.
struct Workspace {
  std::vector<float> s;            // processed scores (before the top-k / top-p masks)
  std::vector<int32_t> kept;       // kept token ids (when not every token is kept)
  std::vector<uint64_t> prefix;    // top-p: rank keys of the sorted prefix
  std::vector<uint64_t> scratch;   // top-p: radix sort buffer
  std::vector<float> gathered;     // top-p: the candidates' scores
  std::vector<int32_t> from;       // top-p: the top-k candidates
  std::vector<float> heap;         // top-k threshold
  std::vector<uint64_t> bits;      // noise bits of one block
};

Workspace& workspace() {
  thread_local Workspace w;
  return w;
}

// The k-th largest of s[0, n) (k in [1, n]; no NaN), with multiplicity.
float kth_largest(const float* s, size_t n, size_t k, std::vector<float>& work) {
  if (k <= kHeapTopK) {
    work.assign(s, s + k);
    std::make_heap(work.begin(), work.end(), std::greater<float>());  // min-heap
    for (size_t i0 = k; i0 < n; i0 += kScanChunk) {
      const size_t end = std::min(n, i0 + kScanChunk);
      if (!any_at_least(s + i0, end - i0, std::nextafter(work.front(), kInf))) continue;
      for (size_t i = i0; i < end; ++i) {
        if (s[i] > work.front()) {
          std::pop_heap(work.begin(), work.end(), std::greater<float>());
          work.back() = s[i];
          std::push_heap(work.begin(), work.end(), std::greater<float>());
        }
      }
    }
    return work.front();
  }
  work.assign(s, s + n);
  std::nth_element(work.begin(), work.begin() + static_cast<std::ptrdiff_t>(k - 1), work.end(),
                   std::greater<float>());
  return work[k - 1];
}

// exp(x) for x <= 0 in float32, ~1 ulp (cephes' expf polynomial), vectorisable;
// x < -87 gives exp(-87) (~1.6e-38), as good as 0 in a sum of probabilities.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t scale = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &scale, sizeof two_n);
  return e * two_n;
}

// Distances below the top logit (nats) at which the top-p prefix may be cut.
constexpr int kLadder = 4;
constexpr float kLadderNats[kLadder] = {1.0f, 4.0f, 16.0f, kInf};

// Over v[0, n) (no NaN, <= top): total = sum of exp(v - top) (double lanes) and
// mass[k] = the part with top - v <= kLadderNats[k] (float lanes: a guide only).
LEVER_KERNEL void mass_ladder(const float* v, size_t n, float top, double* total, float* mass) {
  constexpr size_t kLanes = 16;
  double sum[kLanes] = {};
  float near1[kLanes] = {}, near4[kLanes] = {}, near16[kLanes] = {}, tail[kLanes];
  for (size_t i = 0; i < n; i += kLanes) {
    const float* x = v + i;
    if (n - i < kLanes) {  // the last, partial block: padded with -inf (adds ~0)
      std::fill(tail, tail + kLanes, -kInf);
      std::copy(v + i, v + n, tail);
      x = tail;
    }
    for (size_t l = 0; l < kLanes; ++l) {
      const float e = exp_nonpositive(x[l] - top), dist = top - x[l];
      sum[l] += static_cast<double>(e);
      near1[l] += dist <= kLadderNats[0] ? e : 0.0f;
      near4[l] += dist <= kLadderNats[1] ? e : 0.0f;
      near16[l] += dist <= kLadderNats[2] ? e : 0.0f;
    }
  }
  *total = 0.0;
  std::fill(mass, mass + kLadder, 0.0f);
  for (size_t l = 0; l < kLanes; ++l) {
    *total += sum[l];
    mass[0] += near1[l], mass[1] += near4[l], mass[2] += near16[l];
  }
  mass[3] = static_cast<float>(*total);
}

// Sort key of token i with score v: ascending keys = score descending, then id ascending.
inline uint64_t rank_key(float v, int32_t i) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending with v (no NaN)
  if (v == 0.0f) u = 0x80000000u;                   // -0 == +0: the id decides
  return (static_cast<uint64_t>(~u) << 32) | static_cast<uint32_t>(i);
}

// Sorts rank keys ascending. Large inputs: a stable LSD radix sort on the
// score half (3 passes of 11 bits); the keys arrive in id order, so equal
// scores stay in id order, as a full sort of the keys would leave them.
void sort_keys(std::vector<uint64_t>& keys, std::vector<uint64_t>& scratch) {
  constexpr size_t kRadixFrom = 4096;
  if (keys.size() < kRadixFrom) {
    std::sort(keys.begin(), keys.end());
    return;
  }
  scratch.resize(keys.size());
  for (int shift = 32; shift < 64; shift += 11) {
    size_t count[2048 + 1] = {};
    for (const uint64_t k : keys) ++count[((k >> shift) & 2047) + 1];
    for (size_t b = 0; b < 2048; ++b) count[b + 1] += count[b];
    for (const uint64_t k : keys) scratch[count[(k >> shift) & 2047]++] = k;
    keys.swap(scratch);
  }
}

// Top-p over the candidates (cand[0, n), or every token when cand is null):
// writes the kept ones to `out`, sorted by (score descending, id ascending).
// top is the row's maximum (finite). Mirrors processed_logits: p = exp(s - top)
// / sum (float32), c = cumsum(p) (float32, sorted order), drop when c - p >= top_p.
// Only a prefix of the sorted order is sorted: the tokens within the smallest
// ladder distance of the top whose mass can reach top_p (grown if it falls short).
void nucleus(const float* s, const int32_t* cand, size_t n, float top, float top_p,
             std::vector<float>& gathered, std::vector<uint64_t>& prefix, std::vector<uint64_t>& scratch,
             std::vector<int32_t>& out) {
  const float* v = s;
  if (cand) {
    gathered.resize(n);
    for (size_t j = 0; j < n; ++j) gathered[j] = s[cand[j]];
    v = gathered.data();
  }
  double total = 0.0;
  float mass[kLadder];
  mass_ladder(v, n, top, &total, mass);
  const float sum = static_cast<float>(total);
  // Past this cumulative mass every later token is dropped (c only grows, and
  // c_k - p_k >= c_{k-1} - 2^-24), so the scan can stop.
  const float stop = top_p + 0x1p-21f;
  const double want = std::min(1.0, static_cast<double>(top_p) + 1e-3) * total;
  int rung = 0;
  while (rung < kLadder - 1 && mass[rung] < want) ++rung;
  for (;; ++rung) {
    const float reach = kLadderNats[rung];
    prefix.clear();
    // chunks with nothing above `lower` (below top - reach, with slack) are skipped
    const float lower = reach == kInf ? -std::numeric_limits<float>::max()
                                      : (top - reach) - 1e-5f * (1.0f + std::fabs(top - reach));
    for (size_t j0 = 0; j0 < n; j0 += kScanChunk) {
      const size_t end = std::min(n, j0 + kScanChunk);
      if (!any_at_least(v + j0, end - j0, lower)) continue;
      for (size_t j = j0; j < end; ++j) {
        if (v[j] != -kInf && top - v[j] <= reach) {
          const int32_t i = cand ? cand[j] : static_cast<int32_t>(j);
          prefix.push_back(rank_key(v[j], i));
        }
      }
    }
    sort_keys(prefix, scratch);
    out.clear();
    float c = 0.0f;
    bool stopped = false;
    for (const uint64_t key : prefix) {
      const auto i = static_cast<int32_t>(key & 0xFFFFFFFFu);
      const float p = std::exp(s[i] - top) / sum;
      c = c + p;
      if (c - p < top_p) out.push_back(i);
      if (c >= stop) {
        stopped = true;
        break;
      }
    }
    if (stopped || rung == kLadder - 1) return;
  }
}

struct Best {
  double score;
  int64_t id;
  void consider(double v, int64_t i) {
    if (v > score || (v == score && i < id)) score = v, id = i;
  }
};

// argmax over the kept tokens (kept[0, n), or every token when kept is null)
// of double(s_i) + g_i, the first id on ties. `top` is a kept token with the
// largest score. Pass 1 scores the tokens with high noise bits; pass 2 the
// others that could still reach the best score (s_i + g0 >= best).
int64_t pruned_argmax(const float* s, size_t vocab, const int32_t* kept, size_t n, uint64_t key,
                      int64_t top, std::vector<uint64_t>& bits) {
  static const double g0 = gumbel_of_bits(kHighBits - 1) + 1e-9;  // margin: libm log monotone or not
  auto exact = [&](int64_t i, uint64_t b) { return static_cast<double>(s[i]) + gumbel_of_bits(b); };
  Best best{exact(top, token_bits(key, static_cast<uint64_t>(top))), top};
  if (kept) {
    for (size_t j = 0; j < n; ++j) {
      const uint64_t b = token_bits(key, static_cast<uint64_t>(kept[j]));
      if (b >= kHighBits) best.consider(exact(kept[j], b), kept[j]);
    }
  } else {
    bits.resize(kBitsBlock);
    for (size_t i0 = 0; i0 < vocab; i0 += kBitsBlock) {
      const size_t len = std::min(kBitsBlock, vocab - i0);
      bits_run(key + (i0 + 1) * kGolden, len, bits.data());
      for (size_t j0 = 0; j0 < len; j0 += kScanChunk) {
        const size_t end = std::min(len, j0 + kScanChunk);
        if (!any_bits_at_least(bits.data() + j0, end - j0, kHighBits)) continue;
        for (size_t j = j0; j < end; ++j) {
          if (bits[j] >= kHighBits) best.consider(exact(static_cast<int64_t>(i0 + j), bits[j]),
                                                  static_cast<int64_t>(i0 + j));
        }
      }
    }
  }
  // A float pre-filter below B - g0 (slack for the float rounding), then the exact test.
  const double bound = best.score - g0;
  const float pre = static_cast<float>(bound - 1e-3 - 1e-6 * std::fabs(bound));
  auto second = [&](int64_t i) {
    if (s[i] >= pre && static_cast<double>(s[i]) + g0 >= best.score) {
      best.consider(exact(i, token_bits(key, static_cast<uint64_t>(i))), i);
    }
  };
  if (kept) {
    for (size_t j = 0; j < n; ++j) second(kept[j]);
  } else {
    for (size_t i0 = 0; i0 < vocab; i0 += kScanChunk) {
      const size_t end = std::min(vocab, i0 + kScanChunk);
      if (!any_at_least(s + i0, end - i0, pre)) continue;
      for (size_t i = i0; i < end; ++i) second(static_cast<int64_t>(i));
    }
  }
  return best.id;
}

// The processed row in w.s, and which tokens are kept: w.kept when *all is
// false. Returns the answer of a non-finite row (>= 0: a NaN, +inf or all
// -inf row, see sampler.h) or -1, with *top a kept token of the largest score.
int64_t process_row(const float* logits, size_t vocab, double temperature, int64_t top_k,
                    double top_p, Workspace& w, bool* all, int64_t* top) {
  if (vocab == 0 || vocab > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw std::invalid_argument("sample_position: vocab must be in [1, 2^31), got " +
                                std::to_string(vocab));
  }
  if (!(temperature > 0) || !std::isfinite(temperature)) {
    throw std::invalid_argument("sample_position: temperature must be finite and > 0");
  }
  if (top_k < 0) throw std::invalid_argument("sample_position: top_k must be >= 0");
  if (!(top_p > 0 && top_p <= 1)) throw std::invalid_argument("sample_position: top_p must be in (0, 1]");
  w.s.resize(vocab);
  float* s = w.s.data();
  *all = true;
  float m = -kInf;
  if (!divide_and_max(logits, vocab, static_cast<float>(temperature), s, &m, top)) {
    const float* nan = std::find_if(s, s + vocab, [](float v) { return v != v; });
    if (nan != s + vocab) return nan - s;
    if (m == kInf) return std::find(s, s + vocab, m) - s;
  }
  if (m == -kInf) return 0;  // every token -inf

  const int32_t* cand = nullptr;
  size_t n = vocab;
  if (top_k > 0 && static_cast<uint64_t>(top_k) < vocab) {
    const float kth = kth_largest(s, vocab, static_cast<size_t>(top_k), w.heap);
    w.kept.clear();
    for (size_t i0 = 0; i0 < vocab; i0 += kScanChunk) {
      const size_t end = std::min(vocab, i0 + kScanChunk);
      if (!any_at_least(s + i0, end - i0, kth)) continue;
      for (size_t i = i0; i < end; ++i) {
        if (s[i] >= kth) w.kept.push_back(static_cast<int32_t>(i));
      }
    }
    *all = false;
    cand = w.kept.data();
    n = w.kept.size();
  }
  if (top_p < 1.0) {
    if (cand) w.from.swap(w.kept);  // the candidates must not alias the output
    nucleus(s, cand ? w.from.data() : nullptr, n, m, static_cast<float>(top_p), w.gathered, w.prefix,
            w.scratch, w.kept);
    *all = false;
  }
  return -1;
}

}  // namespace

void position_noise(uint64_t seed, uint64_t position, size_t n, double* out) {
  const uint64_t key = position_key(seed, position);
  for (size_t i = 0; i < n; ++i) out[i] = gumbel_of_bits(token_bits(key, i));
}

void processed_scores(const float* logits, size_t vocab, double temperature, int64_t top_k,
                      double top_p, float* out) {
  Workspace& w = workspace();
  bool all = true;
  int64_t top = 0;
  const int64_t special = process_row(logits, vocab, temperature, top_k, top_p, w, &all, &top);
  const float* s = w.s.data();
  if (special >= 0) {  // NaN / inf rows: numpy's top-k (NaN counts as the largest); top-p is a no-op
    std::copy(s, s + vocab, out);
    if (top_k <= 0 || static_cast<uint64_t>(top_k) >= vocab) return;
    std::vector<float> finite;
    for (size_t i = 0; i < vocab; ++i) {
      if (s[i] == s[i]) finite.push_back(s[i]);
    }
    const size_t nans = vocab - finite.size(), k = static_cast<size_t>(top_k);
    if (k <= nans) return;  // the k-th largest is NaN: nothing is below it
    const float kth = kth_largest(finite.data(), finite.size(), k - nans, w.heap);
    for (size_t i = 0; i < vocab; ++i) {
      if (s[i] < kth) out[i] = -kInf;
    }
    return;
  }
  if (all) {
    std::copy(s, s + vocab, out);
    return;
  }
  std::fill(out, out + vocab, -kInf);
  for (const int32_t i : w.kept) out[i] = s[i];
}

int64_t sample_position(const float* logits, size_t vocab, double temperature, int64_t top_k,
                        double top_p, uint64_t seed, uint64_t position) {
  Workspace& w = workspace();
  bool all = true;
  int64_t top = 0;
  const int64_t special = process_row(logits, vocab, temperature, top_k, top_p, w, &all, &top);
  if (special >= 0) return special;
  const uint64_t key = position_key(seed, position);
  if (all) return pruned_argmax(w.s.data(), vocab, nullptr, vocab, key, top, w.bits);
  return pruned_argmax(w.s.data(), vocab, w.kept.data(), w.kept.size(), key, top, w.bits);
}

}  // namespace lever

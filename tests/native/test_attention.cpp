// Native tests of masked attention (kernels/attention.h): a double-precision
// reference, bitwise row independence, masked-out rows, bf16 inputs.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/attention.h"
#include "kernels/dequant.h"
#include "native_test.h"

using namespace lever;

namespace {

struct Problem {
  AttentionShape s;
  std::vector<float> q, k, v;  // q [H, T, d], k/v [G, L, d]
  std::vector<uint8_t> mask;   // [T, L]
};

Problem random_problem(size_t H, size_t G, size_t T, size_t L, size_t d, uint64_t seed) {
  lever_test::Rng rng(seed);
  Problem p{{H, G, T, L, d}, {}, {}, {}, {}};
  p.q.resize(H * T * d);
  p.k.resize(G * L * d);
  p.v.resize(G * L * d);
  for (float& x : p.q) x = rng.normal(1.0f);
  for (float& x : p.k) x = rng.normal(1.0f);
  for (float& x : p.v) x = rng.normal(1.0f);
  p.mask.resize(T * L);
  for (size_t t = 0; t < T; ++t)
    for (size_t j = 0; j < L; ++j) p.mask[t * L + j] = (rng.next_u32() % 4 != 0) || j == 0;
  return p;
}

std::vector<float> run(const Problem& p, float scale) {
  const AttentionShape& s = p.s;
  std::vector<float> out(s.T * s.n_heads * s.d, -1.0f);
  attention(s, p.q.data(), ElemType::kF32, s.T * s.d, s.d, p.k.data(), p.v.data(),
            ElemType::kF32, s.L * s.d, s.d, p.mask.data(), scale, out.data(), ElemType::kF32,
            s.n_heads * s.d);
  return out;
}

std::vector<double> reference(const Problem& p, float scale) {
  const AttentionShape& s = p.s;
  std::vector<double> out(s.T * s.n_heads * s.d, 0.0);
  for (size_t t = 0; t < s.T; ++t)
    for (size_t h = 0; h < s.n_heads; ++h) {
      const size_t g = h / (s.n_heads / s.n_kv_heads);
      std::vector<double> w(s.L, 0.0);
      double mx = -1e300, z = 0;
      for (size_t j = 0; j < s.L; ++j) {
        if (!p.mask[t * s.L + j]) continue;
        double dot = 0;
        for (size_t i = 0; i < s.d; ++i)
          dot += static_cast<double>(p.q[(h * s.T + t) * s.d + i]) * p.k[(g * s.L + j) * s.d + i];
        w[j] = dot * scale;
        mx = std::max(mx, w[j]);
      }
      for (size_t j = 0; j < s.L; ++j)
        if (p.mask[t * s.L + j]) z += (w[j] = std::exp(w[j] - mx));
      for (size_t j = 0; j < s.L; ++j) {
        if (!p.mask[t * s.L + j]) continue;
        for (size_t i = 0; i < s.d; ++i)
          out[t * s.n_heads * s.d + h * s.d + i] += w[j] / z * p.v[(g * s.L + j) * s.d + i];
      }
    }
  return out;
}

}  // namespace

TEST(attention_matches_reference) {
  for (size_t d : {16, 64, 72}) {  // 72: a tail past the 16 lanes
    Problem p = random_problem(4, 2, 3, 37, d, d);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<float> got = run(p, scale);
    std::vector<double> want = reference(p, scale);
    double err = 0;
    for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
    CHECK_MSG(err < 2e-5, "d=" << d << " max error " << err);
  }
}

TEST(attention_rows_are_independent) {
  // Row 1 of a batch of 4 must equal the same query attended alone, bitwise.
  Problem batch = random_problem(4, 2, 4, 50, 64, 3);
  const float scale = 0.125f;
  std::vector<float> all = run(batch, scale);
  Problem alone = batch;
  alone.s.T = 1;
  alone.q.assign(4 * 64, 0.0f);
  for (size_t h = 0; h < 4; ++h)
    std::memcpy(&alone.q[h * 64], &batch.q[(h * 4 + 1) * 64], 64 * sizeof(float));
  alone.mask.assign(batch.mask.begin() + 50, batch.mask.begin() + 100);
  std::vector<float> one = run(alone, scale);
  CHECK_EQ(lever_test::first_bit_difference(one.data(), all.data() + 4 * 64, 4 * 64), -1);
}

TEST(attention_masked_keys_do_not_matter) {
  // Changing a masked key / value must not change a bit of the output.
  Problem p = random_problem(2, 1, 2, 20, 32, 4);
  std::vector<float> before = run(p, 0.2f);
  p.mask[0 * 20 + 7] = 0;
  p.mask[1 * 20 + 7] = 0;
  std::vector<float> ref = run(p, 0.2f);
  for (size_t i = 0; i < 32; ++i) {
    p.k[7 * 32 + i] = 1e3f;
    p.v[7 * 32 + i] = -1e3f;
  }
  std::vector<float> after = run(p, 0.2f);
  CHECK_EQ(lever_test::first_bit_difference(ref.data(), after.data(), ref.size()), -1);
  CHECK(lever_test::first_bit_difference(before.data(), after.data(), ref.size()) >= 0);
}

TEST(attention_row_without_keys_is_zero) {
  Problem p = random_problem(2, 2, 2, 8, 16, 5);
  for (size_t j = 0; j < 8; ++j) p.mask[8 + j] = 0;  // row 1: nothing visible
  std::vector<float> out = run(p, 0.25f);
  for (size_t i = 0; i < 2 * 16; ++i) CHECK_EQ(out[2 * 16 + i], 0.0f);
}

TEST(attention_bf16_inputs_and_output) {
  Problem p = random_problem(2, 1, 2, 24, 32, 6);
  // Round q, k, v to bf16; the fp32 run on the rounded values must give the
  // same fp32 result, and the bf16 output must be that result rounded.
  auto to_bf16 = [](std::vector<float>& x) {
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      b[i] = fp32_to_bf16(x[i]);
      uint32_t u = static_cast<uint32_t>(b[i]) << 16;
      std::memcpy(&x[i], &u, 4);
    }
    return b;
  };
  std::vector<uint16_t> qb = to_bf16(p.q), kb = to_bf16(p.k), vb = to_bf16(p.v);
  std::vector<float> want = run(p, 0.2f);
  const AttentionShape& s = p.s;
  std::vector<uint16_t> out(s.T * s.n_heads * s.d);
  attention(s, qb.data(), ElemType::kBF16, s.T * s.d, s.d, kb.data(), vb.data(), ElemType::kBF16,
            s.L * s.d, s.d, p.mask.data(), 0.2f, out.data(), ElemType::kBF16, s.n_heads * s.d);
  for (size_t i = 0; i < out.size(); ++i) CHECK_EQ(out[i], fp32_to_bf16(want[i]));
}

TEST(attention_rejects_bad_shapes) {
  Problem p = random_problem(3, 2, 1, 4, 8, 7);
  bool threw = false;
  try {
    run(p, 1.0f);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
}

TEST(attention_softmax_exp_simd_matches_portable) {
  // The softmax numerators attention() computes (NEON on aarch64) against
  // the plain C++ loop, bit for bit, and against std::exp.
  lever_test::Rng rng(8);
  const float specials[] = {0.0f, -0.0f, -1e-30f, -0.5f, -0.6931472f, -1.0f, -10.0f,
                            -86.9f, -87.0f, -87.5f, -100.0f, -1e30f};
  std::vector<float> base;
  for (float v : specials) base.push_back(v);
  for (int i = 0; i < 4000; ++i) base.push_back(-std::fabs(rng.normal(1.0f)) * (i % 3 == 0 ? 40.0f : 3.0f));
  for (float mx : {0.0f, 2.5f, -3.0f}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{5}, size_t{17}, base.size()}) {
      std::vector<float> a(base.begin(), base.begin() + n), b;
      for (float& v : a) v += mx;  // x - mx == the base value (or close)
      b = a;
      attention_detail::softmax_numerators(a.data(), n, mx);
      attention_detail::softmax_numerators_portable(b.data(), n, mx);
      const long diff = lever_test::first_bit_difference(a.data(), b.data(), n);
      CHECK_MSG(diff < 0, "mx " << mx << " n " << n << " element " << diff << ": simd "
                                << a[diff < 0 ? 0 : diff] << " portable " << b[diff < 0 ? 0 : diff]);
    }
  }
  std::vector<float> a = base;
  attention_detail::softmax_numerators(a.data(), a.size(), 0.0f);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double want = std::exp(std::max(static_cast<double>(base[i]), -87.0));
    worst = std::max(worst, std::fabs(a[i] - want) / want);
  }
  NOTE("max relative error vs exp: " << worst);
  CHECK(worst < 1e-6);
}

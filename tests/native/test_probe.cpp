// Native tests of the early-exit probe (model/probe.h):
//  - probe_scores_match_scalar_reference: lens, lens margin and logit of a
//    small tree against a plain double-precision reference written here
//    (Q8_0, F16 and F32 head rows; several nodes share a parent row).
//  - probe_scores_rejects_bad_arguments, prune_closure_*.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/dequant.h"
#include "model/dense_matmul.h"
#include "model/probe.h"
#include "native_test.h"

using namespace lever;

using lever_test::throws_invalid;

namespace {

// n rows of H values of `type`, random: Q8_0 blocks or fp32 / fp16 values.
std::vector<uint8_t> random_table(lever_test::Rng& rng, int type, size_t n, size_t H) {
  std::vector<uint8_t> b(n * row_bytes(type, H));
  if (type == kTypeQ8_0) {
    for (size_t blk = 0; blk < b.size() / 34; ++blk) {
      const auto d = static_cast<uint16_t>(0x2000 + rng.next_u32() % 0x400);  // scale ~ 2^-7
      std::memcpy(&b[blk * 34], &d, 2);
      for (int j = 0; j < 32; ++j) b[blk * 34 + 2 + j] = static_cast<uint8_t>(rng.next_u32() >> 24);
    }
  } else if (type == kTypeF32) {
    for (size_t i = 0; i < n * H; ++i) {
      const float v = rng.normal(0.5f);
      std::memcpy(&b[4 * i], &v, 4);
    }
  } else {  // F16: random values in about [-2, 2] (sign, exponent 13..15, mantissa)
    for (size_t i = 0; i < n * H; ++i) {
      const auto h = static_cast<uint16_t>((rng.next_u32() & 0x8000) | ((13 + rng.next_u32() % 3) << 10) |
                                           (rng.next_u32() & 0x3ff));
      std::memcpy(&b[2 * i], &h, 2);
    }
  }
  return b;
}

void check_scores(int type, size_t H) {
  lever_test::Rng rng(1000 + type);
  // Tree nodes 1..6 scored; node j's parent id and the x row holding it.
  const std::vector<int64_t> parents = {0, 0, 0, 1, 1, 3};
  const std::vector<int64_t> parent_rows = {0, 0, 0, 1, 1, 3};
  const size_t n = parents.size(), x_rows = 5;
  std::vector<float> x(x_rows * H), norm_w(H);
  for (float& v : x) v = rng.normal(2.0f);
  for (float& v : norm_w) v = 1.0f + rng.normal(0.1f);
  std::vector<uint8_t> table = random_table(rng, type, n, H);
  std::vector<float> logp(n), rank(n), depth(n);
  for (size_t j = 0; j < n; ++j) {
    logp[j] = -rng.uniform(0.0f, 5.0f);
    rank[j] = static_cast<float>(j % 3);
    depth[j] = static_cast<float>(1 + parents[j]);
  }
  const double w[kProbeFeatures + 1] = {0.3, 0.7, 1.1, 0.9, -0.4, -0.2};
  const float eps = 1e-6f;
  std::vector<float> lens(n), logit(n);
  probe_scores(x.data(), x_rows, H, parent_rows.data(), parents.data(), n, table.data(),
               table.size(), type, norm_w.data(), eps, logp.data(), rank.data(), depth.data(), w,
               lens.data(), logit.data());

  // Reference: the same dequantised rows, everything else in double.
  std::vector<float> rows(n * H);
  dequantize_to_f32(table.data(), table.size(), type, rows.data(), rows.size());
  std::vector<double> want(n);
  for (size_t j = 0; j < n; ++j) {
    const float* xr = x.data() + parent_rows[j] * H;
    double ms = 0;
    for (size_t i = 0; i < H; ++i) ms += static_cast<double>(xr[i]) * xr[i];
    const double inv = 1.0 / std::sqrt(ms / H + eps);
    double dot = 0;
    for (size_t i = 0; i < H; ++i) dot += norm_w[i] * xr[i] * inv * rows[j * H + i];
    want[j] = dot;
  }
  double scale = 1.0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  for (size_t j = 0; j < n; ++j) {
    double best = -1e300;
    for (size_t i = 0; i < n; ++i)
      if (parents[i] == parents[j]) best = std::max(best, want[i]);
    const double margin = want[j] - best;
    const double lg = w[0] + w[1] * want[j] + w[2] * margin + w[3] * logp[j] + w[4] * rank[j] +
                      w[5] * depth[j];
    CHECK_MSG(std::fabs(lens[j] - want[j]) <= 1e-4 * scale,
              type_name(type) << " node " << j << ": lens " << lens[j] << ", want " << want[j]);
    CHECK_MSG(std::fabs(logit[j] - lg) <= 1e-4 * scale * 3,
              type_name(type) << " node " << j << ": logit " << logit[j] << ", want " << lg);
  }
  // A node alone among its siblings has margin 0: logit = w0 + w1 lens + w3 logp + ...
  const size_t alone = 5;
  const double lg5 = w[0] + w[1] * static_cast<double>(lens[alone]) + w[3] * logp[alone] +
                     w[4] * rank[alone] + w[5] * depth[alone];
  CHECK_NEAR(logit[alone], lg5, 1e-6 * std::max(1.0, std::fabs(lg5)));
}

}  // namespace

TEST(probe_scores_match_scalar_reference) {
  check_scores(kTypeQ8_0, 96);
  check_scores(kTypeF16, 70);
  check_scores(kTypeF32, 64);
}

TEST(probe_scores_rejects_bad_arguments) {
  const size_t H = 32, n = 2;
  std::vector<float> x(2 * H, 1.0f), norm_w(H, 1.0f), f(n, 0.0f), lens(n, -7.0f), logit(n);
  std::vector<uint8_t> table(n * row_bytes(kTypeQ8_0, H), 0);
  const double w[kProbeFeatures + 1] = {};
  const std::vector<int64_t> parents = {0, 0};
  auto run = [&](const std::vector<int64_t>& rows, size_t table_bytes, int type) {
    probe_scores(x.data(), 2, H, rows.data(), parents.data(), n, table.data(), table_bytes, type,
                 norm_w.data(), 1e-6f, f.data(), f.data(), f.data(), w, lens.data(), logit.data());
  };
  CHECK(throws_invalid([&] { run({0, 2}, table.size(), kTypeQ8_0); }));   // row outside x
  CHECK(throws_invalid([&] { run({0, -1}, table.size(), kTypeQ8_0); }));
  CHECK(throws_invalid([&] { run({0, 1}, table.size() - 1, kTypeQ8_0); }));  // short table
  CHECK(throws_invalid([&] { run({0, 1}, table.size(), 99); }));            // unknown type
  CHECK_EQ(lens[0], -7.0f);  // outputs untouched on error
  run({0, 1}, table.size(), kTypeQ8_0);
  CHECK_EQ(lens[0], 0.0f);
}

TEST(prune_closure_keeps_ancestor_closed_sets) {
  // 0 -> {1, 2}; 1 -> {3, 4}; 2 -> {5}; 3 -> {6}
  const std::vector<int64_t> parents = {-1, 0, 0, 1, 1, 2, 3};
  const std::vector<uint8_t> keep_self = {0, 1, 0, 0, 1, 1, 1};
  std::vector<uint8_t> kept(parents.size(), 9);
  prune_closure(parents.data(), keep_self.data(), parents.size(), kept.data());
  const std::vector<uint8_t> want = {1, 1, 0, 0, 1, 0, 0};  // node 0 always kept
  CHECK(kept == want);
}

TEST(prune_closure_rejects_bad_parents) {
  std::vector<uint8_t> keep(3, 1), kept(3);
  const std::vector<std::vector<int64_t>> bad = {{0, 0, 1}, {-1, 1, 0}, {-1, 0, 3}, {-1, -1, 0}};
  for (const auto& p : bad) {
    CHECK(throws_invalid([&] { prune_closure(p.data(), keep.data(), 3, kept.data()); }));
  }
}

// Probe scoring and prune closure (see probe.h).

#include "model/probe.h"

#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/parallel.h"
#include "kernels/dequant.h"
#include "model/decoder_layer.h"  // rms_norm_rows, dot_f32
#include "model/dense_matmul.h"   // row_bytes

namespace lever {

void probe_scores(const float* x, size_t x_rows, size_t H, const int64_t* parent_rows,
                  const int64_t* parents, size_t n, const uint8_t* table, size_t table_bytes,
                  int qtype, const float* norm_w, float eps, const float* draft_logp,
                  const float* sibling_rank, const float* depth, const double* weights,
                  float* lens_out, float* logit_out) {
  const size_t rb = row_bytes(qtype, H);  // throws for an unsupported type / partial blocks
  if (table_bytes != n * rb) {
    throw std::invalid_argument("probe_scores: table has " + std::to_string(table_bytes) +
                                " bytes, expected " + std::to_string(n) + " rows of " +
                                std::to_string(rb) + " (" + type_name(qtype) + ", " +
                                std::to_string(H) + " values)");
  }
  // Each distinct parent row normalised once: norm_index[row] = its place in `normed`.
  std::vector<int64_t> norm_index(x_rows, -1);
  std::vector<size_t> distinct;  // rows of x, in first-use order
  for (size_t j = 0; j < n; ++j) {
    const int64_t r = parent_rows[j];
    if (r < 0 || static_cast<size_t>(r) >= x_rows) {
      throw std::invalid_argument("probe_scores: parent_rows[" + std::to_string(j) + "] = " +
                                  std::to_string(r) + " is outside the " + std::to_string(x_rows) +
                                  " rows of x");
    }
    if (norm_index[static_cast<size_t>(r)] < 0) {
      norm_index[static_cast<size_t>(r)] = static_cast<int64_t>(distinct.size());
      distinct.push_back(static_cast<size_t>(r));
    }
  }
  if (n == 0) return;

  std::vector<float> normed(distinct.size() * H);  // [distinct parents, H]
  for (size_t i = 0; i < distinct.size(); ++i) {
    rms_norm_rows(x + distinct[i] * H, 1, H, H, norm_w, eps, normed.data() + i * H, H);
  }
  std::vector<float> rows(n * H);  // the n head rows as fp32 [n, H]
  dequantize_to_f32(table, table_bytes, qtype, rows.data(), rows.size());

  // lens: one dot product per node (n <= a few hundred, H <= a few thousand).
  parallel_for(n, 16, [&](size_t begin, size_t end) {
    for (size_t j = begin; j < end; ++j) {
      const auto row = static_cast<size_t>(parent_rows[j]);
      const float* h = normed.data() + static_cast<size_t>(norm_index[row]) * H;
      lens_out[j] = dot_f32(h, rows.data() + j * H, H);
    }
  });

  // The best lens value among each group of siblings (nodes with equal parents).
  std::unordered_map<int64_t, float> best;
  for (size_t j = 0; j < n; ++j) {
    auto it = best.find(parents[j]);
    if (it == best.end()) {
      best.emplace(parents[j], lens_out[j]);
    } else if (lens_out[j] > it->second) {
      it->second = lens_out[j];
    }
  }
  for (size_t j = 0; j < n; ++j) {
    const float lens = lens_out[j];
    const float margin = lens - best[parents[j]];  // <= 0; 0 for the group's best
    const double f[kProbeFeatures] = {lens, margin, draft_logp[j], sibling_rank[j], depth[j]};
    double logit = weights[0];
    for (size_t k = 0; k < kProbeFeatures; ++k) logit += weights[1 + k] * f[k];
    logit_out[j] = static_cast<float>(logit);
  }
}

void prune_closure(const int64_t* parents, const uint8_t* keep_self, size_t n, uint8_t* kept) {
  if (n == 0) return;
  if (parents[0] != -1) {
    throw std::invalid_argument("prune_closure: parents[0] must be -1 (node 0 is the root), got " +
                                std::to_string(parents[0]));
  }
  for (size_t j = 1; j < n; ++j) {
    if (parents[j] < 0 || static_cast<size_t>(parents[j]) >= j) {
      throw std::invalid_argument("prune_closure: parents[" + std::to_string(j) + "] = " +
                                  std::to_string(parents[j]) + " must be in [0, " +
                                  std::to_string(j) + ")");
    }
  }
  kept[0] = 1;
  for (size_t j = 1; j < n; ++j) {
    kept[j] = (keep_self[j] != 0 && kept[static_cast<size_t>(parents[j])] != 0) ? 1 : 0;
  }
}

}  // namespace lever

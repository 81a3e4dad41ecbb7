// Embedding, head linear, running argmax and running top-k (see head.h).

#include "model/head.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/parallel.h"
#include "kernels/dequant.h"
#include "kernels/qmatmul.h"
#include "kernels/repack.h"
#include "model/dense_matmul.h"

namespace lever {
namespace {

void check_matrix_bytes(const char* what, int type, size_t N, size_t K, size_t nbytes) {
  if (!is_matrix_type(type)) {
    throw std::invalid_argument(std::string(what) + ": type " + type_name(type) + " (" +
                                std::to_string(type) + ") has no matmul kernel");
  }
  const size_t expected = N * row_bytes(type, K);
  if (nbytes != expected) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(nbytes) + " bytes; a " +
                                std::to_string(N) + " x " + std::to_string(K) + " " +
                                type_name(type) + " matrix has " + std::to_string(expected));
  }
}

// Rows of h handed to one thread at a time when a chunk's logits are visited.
constexpr size_t kVisitGrain = 4;

// Scores the N rows of W (`type`, K columns, w_nbytes bytes) against every
// row of h, kArgmaxChunkRows weight rows at a time into one [R, chunk]
// buffer, and after each chunk calls visit(r, n0, logits, nc) for every row r
// of h (rows spread over the thread pool; one row's visits run in order):
// logits[j] is the logit of weight row n0 + j, for j < nc. The rows of h are
// quantised once for all chunks (a quantised W), not once per chunk.
template <typename Visit>
void for_each_logit_chunk(const char* what, const float* h, size_t R, size_t K, size_t h_stride,
                          const uint8_t* w, size_t w_nbytes, int type, size_t N,
                          const Visit& visit) {
  check_matrix_bytes(what, type, N, K, w_nbytes);
  const size_t rb = row_bytes(type, K);
  const size_t chunk = std::min(N, kArgmaxChunkRows);
  std::vector<float> logits(R * chunk);  // [R, chunk]
  std::optional<QuantizedRows> hq;  // a quantised W: h's rows quantised once
  if (!is_dense_type(type)) hq.emplace(h, ElemType::kF32, R, K, h_stride, type);
  for (size_t n0 = 0; n0 < N; n0 += chunk) {
    const size_t nc = std::min(chunk, N - n0);
    if (!hq) {
      weight_matmul(h, R, K, h_stride, w + n0 * rb, type, nc, logits.data(), nc);
    } else {
      quant_matmul_rows(*hq, w + n0 * rb, type, nc, logits.data(), ElemType::kF32, nc);
    }
    parallel_for(R, kVisitGrain, [&](size_t begin, size_t end) {
      for (size_t r = begin; r < end; ++r) visit(r, n0, logits.data() + r * nc, nc);
    });
  }
}

// (v, id) ranks before (bv, bid): larger value first, then the lower id.
inline bool ranks_before(float v, int64_t id, float bv, int64_t bid) {
  return v > bv || (v == bv && id < bid);
}

// Merges logits row[0, nc) (token ids first + j) into one row's k best
// entries val / idx [k], kept best first (see ranks_before).
void keep_top_k(const float* row, size_t nc, int64_t first, size_t k, float* val, int64_t* idx) {
  for (size_t j = 0; j < nc; ++j) {
    const float v = row[j];
    const int64_t id = first + static_cast<int64_t>(j);
    if (!ranks_before(v, id, val[k - 1], idx[k - 1])) continue;  // the common case
    size_t at = k - 1;
    for (; at > 0 && ranks_before(v, id, val[at - 1], idx[at - 1]); --at) {
      val[at] = val[at - 1];
      idx[at] = idx[at - 1];
    }
    val[at] = v;
    idx[at] = id;
  }
}

// Adds exp(row[j]) for j < nc to a running total held as exp(max) * sum
// (float32 max, float64 sum): sum is rescaled whenever the maximum grows.
void accumulate_exp(const float* row, size_t nc, float& max, double& sum) {
  for (size_t j = 0; j < nc; ++j) {
    const float v = row[j];
    if (v > max) {
      sum = sum * std::exp(static_cast<double>(max) - static_cast<double>(v)) + 1.0;
      max = v;
    } else {
      sum += static_cast<double>(std::exp(v - max));
    }
  }
}

}  // namespace

void embed_rows(const uint8_t* table, size_t table_nbytes, int type, size_t n_rows, size_t hidden,
                const int64_t* ids, size_t T, float* out, size_t out_stride) {
  const size_t rb = row_bytes(type, hidden);
  if (table_nbytes != n_rows * rb) {
    throw std::invalid_argument("embed: table has " + std::to_string(table_nbytes) + " bytes; " +
                                std::to_string(n_rows) + " rows of " + std::to_string(hidden) +
                                " " + type_name(type) + " values have " +
                                std::to_string(n_rows * rb));
  }
  for (size_t t = 0; t < T; ++t) {
    if (ids[t] < 0 || static_cast<size_t>(ids[t]) >= n_rows) {
      throw std::invalid_argument("embed: token id " + std::to_string(ids[t]) +
                                  " is outside the vocabulary of " + std::to_string(n_rows));
    }
  }
  if (is_repacked_type(type)) {  // restore each row's original blocks first
    std::vector<uint8_t> row(rb);
    for (size_t t = 0; t < T; ++t) {
      unpack_rows(type, table, n_rows, hidden, static_cast<size_t>(ids[t]), 1, row.data());
      dequantize_to_f32(row.data(), rb, base_type(type), out + t * out_stride, hidden);
    }
    return;
  }
  for (size_t t = 0; t < T; ++t) {
    dequantize_to_f32(table + static_cast<size_t>(ids[t]) * rb, rb, type, out + t * out_stride,
                      hidden);
  }
}

void linear_rows(const float* x, size_t R, size_t K, size_t x_stride, const uint8_t* w,
                 size_t w_nbytes, int type, size_t N, float* y, size_t y_stride) {
  check_matrix_bytes("linear", type, N, K, w_nbytes);
  weight_matmul(x, R, K, x_stride, w, type, N, y, y_stride);
}

void argmax_update(const float* h, size_t R, size_t K, size_t h_stride, const uint8_t* w,
                   size_t w_nbytes, int type, size_t N, int64_t row_offset, float* best_val,
                   int64_t* best_idx) {
  for_each_logit_chunk("argmax_update", h, R, K, h_stride, w, w_nbytes, type, N,
                       [&](size_t r, size_t n0, const float* row, size_t nc) {
                         for (size_t j = 0; j < nc; ++j) {
                           if (row[j] > best_val[r]) {
                             best_val[r] = row[j];
                             best_idx[r] = row_offset + static_cast<int64_t>(n0 + j);
                           }
                         }
                       });
}

void topk_update(const float* h, size_t R, size_t K, size_t h_stride, const uint8_t* w,
                 size_t w_nbytes, int type, size_t N, int64_t row_offset, size_t k,
                 float* best_val, int64_t* best_idx, float* run_max, double* run_sum) {
  if (k == 0) throw std::invalid_argument("topk_update: k must be >= 1");
  for_each_logit_chunk("topk_update", h, R, K, h_stride, w, w_nbytes, type, N,
                       [&](size_t r, size_t n0, const float* row, size_t nc) {
                         const int64_t first = row_offset + static_cast<int64_t>(n0);
                         keep_top_k(row, nc, first, k, best_val + r * k, best_idx + r * k);
                         accumulate_exp(row, nc, run_max[r], run_sum[r]);
                       });
}

}  // namespace lever

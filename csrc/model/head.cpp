// Embedding, head linear and running argmax (see head.h).

#include "model/head.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dequant.h"
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
  check_matrix_bytes("argmax_update", type, N, K, w_nbytes);
  const size_t rb = row_bytes(type, K);
  const size_t chunk = std::min(N, kArgmaxChunkRows);
  std::vector<float> logits(R * chunk);  // [R, chunk]
  for (size_t n0 = 0; n0 < N; n0 += chunk) {
    const size_t nc = std::min(chunk, N - n0);
    weight_matmul(h, R, K, h_stride, w + n0 * rb, type, nc, logits.data(), nc);
    for (size_t r = 0; r < R; ++r) {
      const float* row = logits.data() + r * nc;
      for (size_t j = 0; j < nc; ++j) {
        if (row[j] > best_val[r]) {
          best_val[r] = row[j];
          best_idx[r] = row_offset + static_cast<int64_t>(n0 + j);
        }
      }
    }
  }
}

}  // namespace lever

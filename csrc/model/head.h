// The ends of the model: token embedding lookup, the final norm, the output
// head as logits (linear) or as a running argmax that never materialises
// the [rows, vocab] logits.
//
// Units: n_rows / N are weight rows (vocabulary entries); K / hidden are
// elements; *_nbytes are bytes; strides are in elements (fp32).
#pragma once

#include <cstddef>
#include <cstdint>

namespace lever {

// Vocabulary rows scored per step by argmax_update.
constexpr size_t kArgmaxChunkRows = 1024;

// out[t] = row ids[t] of the [n_rows, hidden] table (ggml `type` bytes) as fp32.
// Throws std::invalid_argument for a table of the wrong size or an id out of range.
void embed_rows(const uint8_t* table, size_t table_nbytes, int type, size_t n_rows, size_t hidden,
                const int64_t* ids, size_t T, float* out, size_t out_stride);

// y [R, N] = x [R, K] W^T for W an [N, K] matrix of `type` (w_nbytes bytes).
// Throws std::invalid_argument if w_nbytes does not match.
void linear_rows(const float* x, size_t R, size_t K, size_t x_stride, const uint8_t* w,
                 size_t w_nbytes, int type, size_t N, float* y, size_t y_stride);

// For each row r: for n < N with logit h[r] . W[n] > best_val[r] (strictly),
// best_val[r] = that logit and best_idx[r] = row_offset + n. Rows of W are
// scored kArgmaxChunkRows at a time into a small buffer, so the first maximum
// wins across chunks and across calls over consecutive vocabulary slices.
void argmax_update(const float* h, size_t R, size_t K, size_t h_stride, const uint8_t* w,
                   size_t w_nbytes, int type, size_t N, int64_t row_offset, float* best_val,
                   int64_t* best_idx);

}  // namespace lever

// The ends of the model: token embedding lookup, the final norm, the output
// head as logits (linear), as a running argmax or as a running top-k with a
// running log-sum-exp; the last two never materialise the [rows, vocab] logits.
//
// Units: n_rows / N are weight rows (vocabulary entries); K / hidden are
// elements; *_nbytes are bytes; strides are in elements (fp32).
#pragma once

#include <cstddef>
#include <cstdint>

namespace lever {

// Vocabulary rows scored per step by argmax_update and topk_update: few
// enough that the [rows, chunk] float32 buffer stays small (1 MiB at 64 rows),
// enough that the thread pool is woken a few dozen times per head, not hundreds.
constexpr size_t kArgmaxChunkRows = 4096;

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

// Running top-k and log-sum-exp over a slice of the head's rows. For each row
// r, best_val / best_idx [r * k, r * k + k) hold the k best (logit, token id)
// pairs seen so far, best first: larger logit first, equal logits in token id
// order (the lower id wins a tie). Start every slot at (-inf, INT64_MAX), the
// worst possible entry. run_max[r] (start -inf) and run_sum[r] (start 0) keep
// the log-sum-exp of every logit seen: logsumexp = run_max + log(run_sum),
// where run_sum = sum(exp(logit - run_max)) in float64, rescaled when the
// maximum grows (element by element, so the result does not depend on how
// the vocabulary is split into calls or chunks). A token's log-prob is then
// best_val - (run_max + log(run_sum)). Logits are those of linear_rows
// (bitwise); rows are independent (bitwise) and the rows of h are spread over
// the thread pool. Logits are assumed finite.
void topk_update(const float* h, size_t R, size_t K, size_t h_stride, const uint8_t* w,
                 size_t w_nbytes, int type, size_t N, int64_t row_offset, size_t k,
                 float* best_val, int64_t* best_idx, float* run_max, double* run_sum);

}  // namespace lever

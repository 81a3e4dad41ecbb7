// Masked multi-head attention with grouped key/value heads, one query row at a
// time, so that a row's result never depends on the other rows of the pass.
//
// For query row t and head h (kv head g = h / (n_heads / n_kv_heads)):
//   s_j   = scale * q[h, t] . k[g, j]          for every key j with mask[t, j]
//   p_j   = exp(s_j - max s) / sum exp(s - max s)
//   out[t, h * d : (h + 1) * d] = sum_j p_j v[g, j]
// Keys are visited in index order and masked keys are skipped entirely, with
// a fixed summation structure, so the result for a row depends only on the
// query and the unmasked keys / values: a token verified inside a tree gets
// exactly the numbers it would get when decoded alone (with the kernels of
// qmatmul.h for the linear layers, the whole forward is row-invariant).
// Arithmetic is fp32; inputs and output may be fp32 or bf16.
//
// Units: strides are in elements; d is the head dimension.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/qmatmul.h"  // ElemType

namespace lever {

struct AttentionShape {
  size_t n_heads, n_kv_heads, T, L, d;
};

// q: [n_heads, T, d] with strides (q_head, q_row, 1).
// k, v: [n_kv_heads, L, d] with strides (kv_head, kv_row, 1), same element type.
// mask: T rows of L bytes (non-zero = may attend), row stride L.
// out: [T, n_heads * d] with row stride out_row.
// Rows with no unmasked key get zeros. Throws std::invalid_argument for bad shapes.
void attention(const AttentionShape& s, const void* q, ElemType q_type, size_t q_head,
               size_t q_row, const void* k, const void* v, ElemType kv_type, size_t kv_head,
               size_t kv_row, const uint8_t* mask, float scale, void* out, ElemType out_type,
               size_t out_row);

// The softmax step of attention, exposed for tests: x[i] = exp(x[i] - mx)
// for i < n (x[i] <= mx; relative error ~1e-7). softmax_numerators is what
// attention() runs (NEON on aarch64); softmax_numerators_portable is the
// plain C++ loop. Both give the same bits.
namespace attention_detail {
void softmax_numerators(float* x, size_t n, float mx);
void softmax_numerators_portable(float* x, size_t n, float mx);
}  // namespace attention_detail

}  // namespace lever

// y = x W^T for weight matrices of any type the model may hold.
//
// Dense weights (F32, F16, BF16) are multiplied here: for each weight row the
// row is converted to fp32 once (per thread), then dotted with every
// activation row by an fp32 sum over 16 lanes combined in a fixed order. A
// result y[m, n] therefore depends only on x[m] and W[n], never on M or on the
// thread split: rows are bitwise independent, as with quant_matmul.
// Quantised weights go to lever::quant_matmul (kernels/qmatmul.h).
//
// Units: K, N, M are element / row counts; strides are in elements (fp32).
// Weight bytes are ggml rows, row after row (N * row_bytes(type, K) bytes).
#pragma once

#include <cstddef>
#include <cstdint>

namespace lever {

// True for F32 / F16 / BF16 (the dense types handled by dense_matmul).
bool is_dense_type(int type);
// True if weight_matmul accepts `type` (dense, or a quantised type with a kernel).
bool is_matrix_type(int type);
// Bytes of one row of K values of `type`. Throws std::invalid_argument if
// the type is unsupported or K is not a multiple of its block size.
size_t row_bytes(int type, size_t K);

// Dense only: y[m, n] = sum_k x[m, k] * W[n, k]; W is N rows of K values of
// `type` (F32 / F16 / BF16), any alignment. x, y fp32 with row strides.
void dense_matmul(const float* x, size_t M, size_t K, size_t x_stride, const uint8_t* w,
                  int type, size_t N, float* y, size_t y_stride);

// Any matrix type: dense_matmul or quant_matmul (fp32 in / out).
void weight_matmul(const float* x, size_t M, size_t K, size_t x_stride, const uint8_t* w,
                   int type, size_t N, float* y, size_t y_stride);

}  // namespace lever

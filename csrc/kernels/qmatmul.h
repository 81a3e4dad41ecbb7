// Matrix multiplication with block-quantised weights: y = x W^T.
//
// W is an [N, K] weight matrix stored row by row as ggml blocks (Q4_K, Q6_K,
// Q8_0, Q5_0, Q4_0), e.g. straight from a GGUF file or a flash read buffer;
// it is never dequantised into memory. x is [M, K] activations in fp32 or
// bf16 (M = 1 for decoding, up to a few hundred for tree verification); each
// row is first quantised to 8 bits per value (see qdot.h), then every weight
// block is unpacked once in registers and used for several activation rows
// (up to kMaxDotRows, or a kMaxTileW x kMaxTileX tile of weight and activation
// rows where a tile kernel exists and M is large). The result row y[m]
// depends only on x[m] and W, never on the other rows, on M or on the tiling,
// so a token gets bit-identical outputs whether it is decoded alone or
// verified inside a tree.
//
// Work is split over weight rows on the process-wide thread pool
// (common/parallel.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/qdot.h"

namespace lever {

enum class ElemType : int { kF32 = 0, kBF16 = 1 };

// y[m, n] = sum_k x[m, k] * W[n, k] for m < M, n < N.
//   x: M rows of K values of x_type; row m starts x_stride elements after row m-1.
//   w: N * K / block_size(type) blocks of `type`, row after row.
//   y: M rows of N values of y_type; row stride y_stride elements.
//   isa: kernel instruction set (kAuto: the best this CPU has).
// Throws std::invalid_argument if the type has no kernel, K is not a multiple
// of its block size, the strides are too small, or the Isa is unavailable.
void quant_matmul(const void* x, ElemType x_type, size_t M, size_t K, size_t x_stride,
                  const uint8_t* w, int type, size_t N, void* y, ElemType y_type,
                  size_t y_stride, Isa isa = Isa::kAuto);

// Activation rows quantised once for weights of one `type` (ActQ8K or
// ActQ8_32 blocks, row_bytes bytes per row, 64-byte aligned), so that several
// matrices of that type (e.g. the parts or chunks of an output head) can be
// multiplied without quantising the rows again.
class QuantizedRows {
 public:
  QuantizedRows(const void* x, ElemType x_type, size_t M, size_t K, size_t x_stride, int type);
  const uint8_t* data() const { return data_; }
  size_t rows() const { return M_; }
  size_t cols() const { return K_; }
  size_t row_bytes() const { return row_bytes_; }
  int type() const { return type_; }

 private:
  size_t M_, K_, row_bytes_;
  int type_;
  std::vector<uint8_t> buf_;
  uint8_t* data_;
};

// y = x W^T for rows quantised beforehand (xq.type() must be a type whose
// activation blocks match `type`'s: the same family, Q8K or 32-value blocks).
// Same results, bit for bit, as quant_matmul on the original rows.
void quant_matmul_rows(const QuantizedRows& xq, const uint8_t* w, int type, size_t N, void* y,
                       ElemType y_type, size_t y_stride, Isa isa = Isa::kAuto);

// Quantise one row of K values to activation blocks for weight `type`
// (ActQ8K or ActQ8_32 per qdot.h); dst holds act_row_bytes(type, K) bytes.
void quantize_activation_row(const float* x, size_t K, int type, uint8_t* dst);
size_t act_row_bytes(int type, size_t K);

// The Isa that kAuto resolves to for this process: best_isa(), unless the
// environment variable LEVER_KERNEL_ISA (scalar / avx2 / avx512 / neon / dotprod / i8mm) or
// set_default_isa() chose another.
Isa default_isa();
// Sets what kAuto means from now on (kAuto: back to the environment / best).
// Throws std::invalid_argument if `isa` is not available on this CPU.
void set_default_isa(Isa isa);

}  // namespace lever

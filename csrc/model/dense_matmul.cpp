// Dense fp32-accumulating matmul and the matrix-type dispatch (see dense_matmul.h).
//
// Compiled with -ffp-contract=fast (CMakeLists.txt): the same code runs for
// every (activation row, weight row) pair, so contraction keeps rows identical.

#include "model/dense_matmul.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/parallel.h"
#include "kernels/block_bytes.h"  // load_u16, bf16_to_float
#include "kernels/dequant.h"
#include "kernels/qmatmul.h"
#include "kernels/repack.h"

#include "common/multiversion.h"  // LEVER_KERNEL

namespace lever {
namespace {

constexpr size_t kLanes = 16;

// Weight row n as fp32 values (K of them) into dst.
void row_to_f32(const uint8_t* src, int type, size_t K, float* dst) {
  if (type == kTypeF32) {
    std::memcpy(dst, src, K * sizeof(float));
  } else if (type == kTypeBF16) {
    for (size_t k = 0; k < K; ++k) {
      dst[k] = block_bytes::bf16_to_float(block_bytes::load_u16(src + 2 * k));
    }
  } else {  // F16: the vectorised row conversion (NEON fcvtl on aarch64), same bits
    fp16_to_fp32_row(src, K, dst);
  }
}

// 16 fp32 values operated on together (a GCC/Clang vector: one AVX-512
// register, two AVX2 registers, four SSE registers).
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

// (Passed by pointer: a 64-byte vector by value would change the call ABI.)
inline __attribute__((always_inline)) void load_lanes(Lanes* v, const float* p) {
  std::memcpy(v, p, sizeof *v);
}

// A tile of dot products: y[r * y_stride + c] = x[r] . w[c] over K values, for MR
// activation rows and NR weight rows. Every output has its own 16 partial
// sums, added to in index order and combined pairwise in a fixed order, so
// each output is the same number whatever tile (MR, NR) it is computed in; the
// tile only lets one weight load serve MR rows and gives the CPU MR * NR
// independent chains of multiply-adds.
template <size_t MR, size_t NR>
inline __attribute__((always_inline)) void dot_tile(const float* const* x, const float* const* w,
                                                    size_t K, float* y, size_t y_stride) {
  Lanes acc[MR][NR] = {};
  size_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    Lanes wv[NR];
    for (size_t c = 0; c < NR; ++c) load_lanes(&wv[c], w[c] + k);
    for (size_t r = 0; r < MR; ++r) {
      Lanes xv;
      load_lanes(&xv, x[r] + k);
      for (size_t c = 0; c < NR; ++c) acc[r][c] += xv * wv[c];
    }
  }
  for (; k < K; ++k) {  // the last K % 16 values, lane k % 16
    for (size_t r = 0; r < MR; ++r) {
      for (size_t c = 0; c < NR; ++c) acc[r][c][k % kLanes] += x[r][k] * w[c][k];
    }
  }
  for (size_t r = 0; r < MR; ++r) {
    for (size_t c = 0; c < NR; ++c) {
      float a[kLanes];
      std::memcpy(a, &acc[r][c], sizeof a);
      for (size_t half = kLanes / 2; half > 0; half /= 2) {
        for (size_t l = 0; l < half; ++l) a[l] += a[l + half];
      }
      y[r * y_stride + c] = a[0];
    }
  }
}

// y[m, c] for every activation row m and the nr (1..4) weight rows w[0..nr).
LEVER_KERNEL void dot_block(const float* x, size_t M, size_t K, size_t x_stride,
                            const float* const* w, size_t nr, float* y, size_t y_stride) {
  size_t m = 0;
  for (; m + 2 <= M; m += 2) {
    const float* xr[2] = {x + m * x_stride, x + (m + 1) * x_stride};
    float* yr = y + m * y_stride;
    if (nr == 4) {
      dot_tile<2, 4>(xr, w, K, yr, y_stride);
    } else {
      for (size_t c = 0; c < nr; ++c) dot_tile<2, 1>(xr, w + c, K, yr + c, y_stride);
    }
  }
  if (m < M) {
    const float* xr[1] = {x + m * x_stride};
    float* yr = y + m * y_stride;
    if (nr == 4) {
      dot_tile<1, 4>(xr, w, K, yr, y_stride);
    } else {
      for (size_t c = 0; c < nr; ++c) dot_tile<1, 1>(xr, w + c, K, yr + c, y_stride);
    }
  }
}

}  // namespace

bool is_dense_type(int type) {
  return type == kTypeF32 || type == kTypeF16 || type == kTypeBF16;
}

bool is_matrix_type(int type) { return is_dense_type(type) || has_dot_kernel(type); }

size_t row_bytes(int type, size_t K) {
  if (!is_supported_type(base_type(type))) {
    throw std::invalid_argument("unsupported ggml type " + std::to_string(type));
  }
  const size_t bs = block_size(type);
  if (K % bs != 0) {
    throw std::invalid_argument(std::string("a row of ") + std::to_string(K) + " values is not whole " +
                                type_name(type) + " blocks of " + std::to_string(bs));
  }
  return K / bs * type_size(type);
}

void dense_matmul(const float* x, size_t M, size_t K, size_t x_stride, const uint8_t* w,
                  int type, size_t N, float* y, size_t y_stride) {
  if (!is_dense_type(type)) throw std::invalid_argument("dense_matmul: not a dense type");
  if (M == 0 || N == 0) return;
  const size_t w_row = row_bytes(type, K);
  // Ranges of whole 4-row groups, about 32K multiply-adds or more each.
  const size_t grain = (std::max<size_t>(1, 32768 / std::max<size_t>(1, K * M)) + 3) / 4 * 4;
  parallel_for(N, grain, [&](size_t begin, size_t end) {
    thread_local std::vector<float> rows;  // up to 4 weight rows as fp32
    if (rows.size() < 4 * K) rows.resize(4 * K);
    for (size_t n = begin; n < end; n += 4) {
      const size_t nr = std::min<size_t>(4, end - n);
      const float* wf[4];
      for (size_t c = 0; c < nr; ++c) {
        const uint8_t* src = w + (n + c) * w_row;
        if (type == kTypeF32 && reinterpret_cast<uintptr_t>(src) % alignof(float) == 0) {
          wf[c] = reinterpret_cast<const float*>(src);
        } else {
          row_to_f32(src, type, K, rows.data() + c * K);
          wf[c] = rows.data() + c * K;
        }
      }
      dot_block(x, M, K, x_stride, wf, nr, y + n, y_stride);
    }
  });
}

void weight_matmul(const float* x, size_t M, size_t K, size_t x_stride, const uint8_t* w,
                   int type, size_t N, float* y, size_t y_stride) {
  if (is_dense_type(type)) {
    dense_matmul(x, M, K, x_stride, w, type, N, y, y_stride);
  } else {
    if (M == 0 || N == 0) return;
    quant_matmul(x, ElemType::kF32, M, K, x_stride, w, type, N, y, ElemType::kF32, y_stride);
  }
}

}  // namespace lever

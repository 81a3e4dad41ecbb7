// Quantised matrix multiplication driver (see qmatmul.h).
//
// 1. Quantise every activation row to 8-bit blocks (ActQ8K or ActQ8_32).
// 2. Split the weight rows over the thread pool. Each thread walks its rows
//    in groups small enough to stay in cache. Where the type and Isa have a
//    tile kernel and M >= kTileMinRows, it is called for tiles of up to
//    kMaxTileW weight rows x kMaxTileX activation rows; otherwise, for each
//    tile of up to kMaxDotRows activation rows, the dot kernel is called once
//    per weight row. Repacked weights (repack.h) take the group kernels
//    (qdot_r8.h), 8 weight rows at a time. Either way a (weight row, activation row) result is bit-identical
//    whatever M, N and the tiling are (see qdot.h).

#include "kernels/qmatmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/parallel.h"
#include "kernels/block_bytes.h"  // bf16_to_float
#include "kernels/dequant.h"
#include "kernels/qdot_r8.h"
#include "kernels/repack.h"

namespace lever {
namespace {

// Batches of at least this many activation rows use the tile kernels.
constexpr size_t kTileMinRows = 32;

// -- activation quantisation --------------------------------------------------

// Round-to-nearest of v in [-127, 127] (ties away from zero).
// Same result as std::lround (a library call that does not vectorise): v - t is
// exact (t = v truncated, |v| <= 127), so the tie test is exact too.
inline int8_t round_q(float v) {
  const int t = static_cast<int>(v);
  const float frac = v - static_cast<float>(t);
  return static_cast<int8_t>(t + (frac >= 0.5f ? 1 : 0) - (frac <= -0.5f ? 1 : 0));
}

// Scale d = max|x| / 127 of n values and its inverse (0 for an all-zero block).
inline void block_scale(const float* x, int n, float* d, float* inv_d) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  *d = amax / 127.0f;
  *inv_d = amax > 0.0f ? 127.0f / amax : 0.0f;
}

void quantize_q8k(const float* x, size_t K, ActQ8K* out) {
  for (size_t b = 0; b < K / 256; ++b, x += 256) {
    ActQ8K& blk = out[b];
    float inv_d;
    block_scale(x, 256, &blk.d, &inv_d);
    for (int i = 0; i < 256; ++i) blk.qs[i] = round_q(x[i] * inv_d);
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += blk.qs[16 * j + i];
      blk.bsums[j] = static_cast<int16_t>(s);
    }
  }
}

void quantize_q8_32(const float* x, size_t K, ActQ8_32* out) {
  for (size_t b = 0; b < K / 32; ++b, x += 32) {
    ActQ8_32& blk = out[b];
    float inv_d;
    block_scale(x, 32, &blk.d, &inv_d);
    int s = 0;
    for (int i = 0; i < 32; ++i) {
      blk.qs[i] = round_q(x[i] * inv_d);
      s += blk.qs[i];
    }
    blk.sum = s;
  }
}

// A 64-byte aligned start of at least n bytes in buf (grown when too small).
uint8_t* aligned_64(std::vector<uint8_t>& buf, size_t n) {
  if (buf.size() < n + 64) buf.resize(n + 64);
  const auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64);
}

// Quantised activation rows: a 64-byte aligned buffer of at least n bytes,
// reused between calls of one thread.
uint8_t* act_scratch(size_t n) {
  thread_local std::vector<uint8_t> buf;
  return aligned_64(buf, n);
}

// -- default Isa ------------------------------------------------------------------

std::atomic<int>& chosen_isa() {  // kAuto until set_default_isa picks one
  static std::atomic<int> isa{static_cast<int>(Isa::kAuto)};
  return isa;
}

Isa isa_from_environment() {
  static const Isa isa = [] {
    const char* env = std::getenv("LEVER_KERNEL_ISA");
    if (env == nullptr || *env == '\0') return Isa::kAuto;
    const Isa wanted = isa_from_name(env);
    if (!isa_available(wanted)) {
      throw std::invalid_argument(std::string("LEVER_KERNEL_ISA=") + env +
                                  ": this CPU cannot run that instruction set");
    }
    return wanted;
  }();
  return isa;
}

}  // namespace

size_t act_row_bytes(int type, size_t K) {
  return uses_q8k_activations(type) ? K / 256 * sizeof(ActQ8K) : K / 32 * sizeof(ActQ8_32);
}

void quantize_activation_row(const float* x, size_t K, int type, uint8_t* dst) {
  if (uses_q8k_activations(type)) {
    quantize_q8k(x, K, reinterpret_cast<ActQ8K*>(dst));
  } else {
    quantize_q8_32(x, K, reinterpret_cast<ActQ8_32*>(dst));
  }
}

Isa default_isa() {
  const Isa chosen = static_cast<Isa>(chosen_isa().load());
  if (chosen != Isa::kAuto) return chosen;
  const Isa env = isa_from_environment();
  return env != Isa::kAuto ? env : best_isa();
}

void set_default_isa(Isa isa) {
  if (!isa_available(isa)) {
    throw std::invalid_argument(std::string("instruction set ") + isa_name(isa) +
                                " is not available on this CPU");
  }
  chosen_isa().store(static_cast<int>(isa));
}

namespace {

// Checks shared by both entry points; returns the dot kernel for (type, isa)
// (nullptr for a repacked type, which has group kernels instead).
DotRowsFn checked_dot(int type, size_t K, Isa* isa) {
  if (!has_dot_kernel(type)) {
    throw std::invalid_argument(std::string("no quantised matmul kernel for type ") +
                                type_name(type));
  }
  const size_t bs = block_size(type);
  if (K == 0 || K % bs != 0) {
    throw std::invalid_argument("K = " + std::to_string(K) + " is not a positive multiple of " +
                                std::to_string(bs) + " (the block size of " + type_name(type) + ")");
  }
  if (*isa == Isa::kAuto) *isa = default_isa();
  if (is_repacked_type(type)) {
    if (dot_group_kernel(type, *isa) == nullptr) {
      throw std::invalid_argument(std::string("instruction set ") + isa_name(*isa) +
                                  " is not available on this CPU");
    }
    return nullptr;  // the caller takes the group kernel (dot_repacked_rows)
  }
  const DotRowsFn dot = dot_rows_kernel(type, *isa);
  if (dot == nullptr) {
    throw std::invalid_argument(std::string("instruction set ") + isa_name(*isa) +
                                " is not available on this CPU");
  }
  return dot;
}

// Step 1: quantise M activation rows (fp32 or bf16) into xq (a_row_bytes each).
void quantize_rows_into(const void* x, ElemType x_type, size_t M, size_t K, size_t x_stride,
                        int type, uint8_t* xq, size_t a_row_bytes) {
  parallel_for(M, 4, [&](size_t begin, size_t end) {
    std::vector<float> row(K);
    for (size_t m = begin; m < end; ++m) {
      const float* src;
      if (x_type == ElemType::kF32) {
        src = static_cast<const float*>(x) + m * x_stride;
      } else {
        const uint16_t* xb = static_cast<const uint16_t*>(x) + m * x_stride;
        for (size_t k = 0; k < K; ++k) row[k] = block_bytes::bf16_to_float(xb[k]);
        src = row.data();
      }
      quantize_activation_row(src, K, type, xq + m * a_row_bytes);
    }
  });
}

// One result into y (fp32, or bf16 rounded to nearest-even).
inline void store_result(void* y, ElemType y_type, size_t at, float v) {
  if (y_type == ElemType::kF32) {
    static_cast<float*>(y)[at] = v;
  } else {
    static_cast<uint16_t*>(y)[at] = fp32_to_bf16(v);
  }
}

// Step 2 for repacked weights (kernels/repack.h): the N rows are N / 8
// groups, split over the thread pool; each group's weights pass over every
// activation row (4 at a time inside the group kernel) while they stay in cache.
void dot_repacked_rows(const uint8_t* xq, size_t a_row_bytes, size_t M, size_t K,
                       const uint8_t* w, int type, size_t N, void* y, ElemType y_type,
                       size_t y_stride, Isa isa) {
  if (N % kRepackRows != 0) {
    throw std::invalid_argument(std::string("a repacked ") + type_name(type) + " matrix of " +
                                std::to_string(N) + " rows is not whole groups of " +
                                std::to_string(kRepackRows));
  }
  const DotGroupFn group_fn = dot_group_kernel(type, isa);
  const size_t n_blocks = K / block_size(type);
  const size_t group_bytes = kRepackRows * n_blocks * type_size(type);
  // Chunks of at least ~32 KiB of weights x activation rows, so that waking
  // the pool pays off.
  const size_t grain = std::max<size_t>(1, (32u << 10) / (group_bytes * M));
  constexpr size_t kRowsPerCall = 64;  // activation rows per group-kernel call (fp32 out: any)
  parallel_for(N / kRepackRows, grain, [&](size_t begin, size_t end) {
    float out[kRowsPerCall * kRepackRows];
    for (size_t g = begin; g < end; ++g) {
      const uint8_t* wg = w + g * group_bytes;
      if (y_type == ElemType::kF32) {
        float* yg = static_cast<float*>(y) + g * kRepackRows;
        group_fn(wg, xq, a_row_bytes, static_cast<int>(M), n_blocks, yg, y_stride);
        continue;
      }
      for (size_t m0 = 0; m0 < M; m0 += kRowsPerCall) {
        const size_t n_x = std::min(kRowsPerCall, M - m0);
        group_fn(wg, xq + m0 * a_row_bytes, a_row_bytes, static_cast<int>(n_x), n_blocks, out,
                 kRepackRows);
        for (size_t r = 0; r < n_x; ++r) {
          for (int c = 0; c < kRepackRows; ++c) {
            store_result(y, y_type, (m0 + r) * y_stride + g * kRepackRows + c,
                         out[r * kRepackRows + c]);
          }
        }
      }
    }
  });
}

// Step 2: dot products of M quantised rows against N weight rows. Weight rows
// are taken in groups of about 128 KiB so a group stays in cache while every
// activation tile passes over it.
void dot_quantized_rows(const uint8_t* xq, size_t a_row_bytes, size_t M, size_t K,
                        const uint8_t* w, int type, size_t N, void* y, ElemType y_type,
                        size_t y_stride, Isa isa, DotRowsFn dot) {
  const size_t n_blocks = K / block_size(type);
  const size_t w_row_bytes = n_blocks * type_size(type);
  const size_t group = std::max<size_t>(1, (128u << 10) / w_row_bytes);
  // Chunks of at least ~32 KiB of weights per activation tile, so that waking
  // the pool pays off.
  const size_t tiles = (M + kMaxDotRows - 1) / kMaxDotRows;
  const size_t grain = std::max<size_t>(1, (32u << 10) / (w_row_bytes * tiles));
  // The tile kernels only pay off from a few dozen activation rows up (for
  // fewer, streaming the weights row by row measured faster, in particular
  // from DRAM at M = 1); the results are the same either way.
  DotTileFn tile = nullptr;
  if (M >= kTileMinRows) tile = dot_tile_kernel(type, isa);
  auto store = [&](size_t m, size_t n, float v) { store_result(y, y_type, m * y_stride + n, v); };
  parallel_for(N, grain, [&](size_t begin, size_t end) {
    float out[kMaxTileX * kMaxTileW];
    const size_t tile_x = tile != nullptr ? kMaxTileX : kMaxDotRows;
    for (size_t g0 = begin; g0 < end; g0 += group) {
      const size_t g1 = std::min(end, g0 + group);
      for (size_t m0 = 0; m0 < M; m0 += tile_x) {
        const int n_x = static_cast<int>(std::min<size_t>(tile_x, M - m0));
        if (tile != nullptr) {
          // Tiles of up to kMaxTileW weight rows x kMaxTileX activation rows.
          for (size_t n = g0; n < g1; n += kMaxTileW) {
            const int n_w = static_cast<int>(std::min<size_t>(kMaxTileW, g1 - n));
            tile(w + n * w_row_bytes, w_row_bytes, n_w, xq + m0 * a_row_bytes, a_row_bytes, n_x,
                 n_blocks, out, kMaxTileW);
            for (int r = 0; r < n_x; ++r) {
              for (int c = 0; c < n_w; ++c) store(m0 + r, n + c, out[r * kMaxTileW + c]);
            }
          }
          continue;
        }
        for (size_t n = g0; n < g1; ++n) {
          dot(w + n * w_row_bytes, xq + m0 * a_row_bytes, a_row_bytes, n_x, n_blocks, out);
          for (int r = 0; r < n_x; ++r) store(m0 + r, n, out[r]);
        }
      }
    }
  });
}

}  // namespace

QuantizedRows::QuantizedRows(const void* x, ElemType x_type, size_t M, size_t K, size_t x_stride,
                             int type)
    : M_(M), K_(K), row_bytes_(0), type_(type) {
  Isa isa = Isa::kAuto;
  checked_dot(type, K, &isa);
  if (x_stride < K) throw std::invalid_argument("row stride smaller than the row");
  row_bytes_ = act_row_bytes(type, K);
  data_ = aligned_64(buf_, M * row_bytes_);
  quantize_rows_into(x, x_type, M, K, x_stride, type, data_, row_bytes_);
}

void quant_matmul_rows(const QuantizedRows& xq, const uint8_t* w, int type, size_t N, void* y,
                       ElemType y_type, size_t y_stride, Isa isa) {
  const DotRowsFn dot = checked_dot(type, xq.cols(), &isa);
  if (uses_q8k_activations(type) != uses_q8k_activations(xq.type())) {
    throw std::invalid_argument(std::string("rows quantised for ") + type_name(xq.type()) +
                                " cannot be multiplied with " + type_name(type));
  }
  if (y_stride < N) throw std::invalid_argument("row stride smaller than the row");
  if (xq.rows() == 0 || N == 0) return;
  if (is_repacked_type(type)) {
    dot_repacked_rows(xq.data(), xq.row_bytes(), xq.rows(), xq.cols(), w, type, N, y, y_type,
                      y_stride, isa);
    return;
  }
  dot_quantized_rows(xq.data(), xq.row_bytes(), xq.rows(), xq.cols(), w, type, N, y, y_type,
                     y_stride, isa, dot);
}

void quant_matmul(const void* x, ElemType x_type, size_t M, size_t K, size_t x_stride,
                  const uint8_t* w, int type, size_t N, void* y, ElemType y_type,
                  size_t y_stride, Isa isa) {
  const DotRowsFn dot = checked_dot(type, K, &isa);
  if (x_stride < K || y_stride < N) throw std::invalid_argument("row stride smaller than the row");
  if (M == 0 || N == 0) return;
  const size_t a_row_bytes = act_row_bytes(type, K);
  uint8_t* const xq = act_scratch(M * a_row_bytes);        // this thread's reusable buffer
  quantize_rows_into(x, x_type, M, K, x_stride, type, xq, a_row_bytes);
  if (is_repacked_type(type)) {
    dot_repacked_rows(xq, a_row_bytes, M, K, w, type, N, y, y_type, y_stride, isa);
    return;
  }
  dot_quantized_rows(xq, a_row_bytes, M, K, w, type, N, y, y_type, y_stride, isa, dot);
}

}  // namespace lever

// Group kernels for repacked weights (see qdot_r8.h, repack.h): Q4_K and
// Q6_K here, the 32-value block types further down.
//
// The integer part follows the scalar kernels (qdot_kquants.cpp) exactly:
//   Q4_K: dot  = sum_j sc_j * sum_{i in sub-block j} q_i x_i
//         offs = sum_j m_j * (bsums[2j] + bsums[2j+1])
//         acc += (d * xd) * float(dot) - (dmin * xd) * float(offs)
//   Q6_K: dot  = sum_g sc_g * sum_{i in group g} q_i x_i,  offs = sum_g sc_g bsums[g]
//         acc += (d * xd) * float(dot - 32 * offs)
// with lane r of every vector belonging to weight row r of the group. The
// float steps are the scalar ones, one rounding each (this file is built
// with -ffp-contract=off), in the same order, block after block, so the
// results match the scalar kernels bit for bit.
//
// AVX2 integer core, per 4 values of the 8 rows (one 256-bit weight vector):
//   vpbroadcastd the activation row's 4 bytes, vpmaddubsw (u8 weights x s8
//   activations, pairs summed into int16), then vpaddw into a per-sub-block
//   int16 sum; vpmaddwd with the sub-block's int16 scale (one per row, twice)
//   turns it into int32 (once per sub-block for Q4_K, twice per group for
//   Q6_K). int16 bounds, products per int16 lane: Q4_K sums the 8 vectors of
//   a 32-value sub-block, 16 products, |sum| <= 16 * 15 * 127 = 30480; Q6_K
//   sums 2 vectors (8 of a group's 16 values), 4 products,
//   |sum| <= 4 * 63 * 127 = 32004 < 32767.

#include "kernels/qdot_r8.h"

#include <cstring>
#include <vector>

#include "kernels/block_bytes.h"
#include "kernels/dequant.h"
#include "kernels/qdot_r8_x86.h"
#include "kernels/repack.h"

namespace lever {
namespace {

// -- any Isa: restore the original layout and run the row kernel ---------------

struct FallbackContext {
  int base;
  DotRowsFn rows;
};

void fallback_group(const FallbackContext& ctx, int type, const uint8_t* w, const uint8_t* x,
                    size_t x_stride, int n_x, size_t n_blocks, float* out, size_t out_stride) {
  const size_t block_bytes = type_size(ctx.base);
  const size_t row_bytes = n_blocks * block_bytes;
  thread_local std::vector<uint8_t> rows, blocks;
  rows.resize(kRepackRows * row_bytes);
  blocks.resize(kRepackRows * block_bytes);
  for (size_t b = 0; b < n_blocks; ++b) {
    unpack_group_block(type, w + b * kRepackRows * block_bytes, blocks.data());
    for (int c = 0; c < kRepackRows; ++c) {
      std::memcpy(rows.data() + c * row_bytes + b * block_bytes, blocks.data() + c * block_bytes,
                  block_bytes);
    }
  }
  float tmp[kMaxDotRows];
  for (int c = 0; c < kRepackRows; ++c) {
    for (int r0 = 0; r0 < n_x; r0 += kMaxDotRows) {
      const int n = n_x - r0 < kMaxDotRows ? n_x - r0 : kMaxDotRows;
      ctx.rows(rows.data() + c * row_bytes, x + r0 * x_stride, x_stride, n, n_blocks, tmp);
      for (int r = 0; r < n; ++r) out[(r0 + r) * out_stride + c] = tmp[r];
    }
  }
}

template <int kType, Isa kIsa>
void fallback_kernel(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                     size_t n_blocks, float* out, size_t out_stride) {
  const int base = base_type(kType);
  const FallbackContext ctx{base, dot_rows_kernel(base, kIsa)};
  fallback_group(ctx, kType, w, x, x_stride, n_x, n_blocks, out, out_stride);
}

// -- AVX2 ----------------------------------------------------------------------

#if defined(__x86_64__)
#define LEVER_AVX2 LEVER_R8_AVX2
using namespace r8;

// Q4_K_R8, NX activation rows.
template <int NX>
LEVER_AVX2 void q4_k_r8_avx2_tile(const uint8_t* w, const uint8_t* x, size_t x_stride,
                                  size_t n_blocks, float* out, size_t out_stride) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  // pshufb patterns: pick[j] puts byte j of each 32-bit lane into both int16
  // halves of that lane (zero-extended).
  __m256i pick[4];
  for (int j = 0; j < 4; ++j) {
    alignas(32) int8_t idx[32];
    for (int i = 0; i < 32; ++i) idx[i] = (i % 2 == 0) ? static_cast<int8_t>((i % 16) / 4 * 4 + j) : -128;
    pick[j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(idx));
  }
  __m256 acc[NX];
  for (int r = 0; r < NX; ++r) acc[r] = _mm256_setzero_ps();

  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * kQ4KGroupBlock;
    const __m256 vd = halves8(g);
    const __m256 vdmin = halves8(g + 16);
    const Q4KScalesR8 s6 = q4k_scales_r8(g);
    __m256i sc[8], mn[8];  // int16 pairs per row lane: scale / min of sub-block j
    for (int j = 0; j < 4; ++j) {
      sc[j] = _mm256_shuffle_epi8(s6.sc_lo, pick[j]);
      sc[j + 4] = _mm256_shuffle_epi8(s6.sc_hi, pick[j]);
      mn[j] = _mm256_shuffle_epi8(s6.mn_lo, pick[j]);
      mn[j + 4] = _mm256_shuffle_epi8(s6.mn_hi, pick[j]);
    }
    const uint8_t* xb[NX];
    for (int r = 0; r < NX; ++r) xb[r] = x + r * x_stride + b * kActBytes;

    __m256i dot[NX];
    for (int r = 0; r < NX; ++r) dot[r] = _mm256_setzero_si256();
    for (int cc = 0; cc < 4; ++cc) {  // sub-blocks 2cc (low nibbles), 2cc+1 (high)
      __m256i s_lo[NX], s_hi[NX];
      for (int r = 0; r < NX; ++r) s_lo[r] = s_hi[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int u = 0; u < 8; ++u) {
        const __m256i wv = load256(g + 128 + 32 * (8 * cc + u));
        const __m256i lo = _mm256_and_si256(wv, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), low4);
#pragma GCC unroll 4
        for (int r = 0; r < NX; ++r) {
          const uint8_t* xq = xb[r] + kActQs + 64 * cc + 4 * u;
          s_lo[r] = _mm256_add_epi16(s_lo[r], _mm256_maddubs_epi16(lo, broadcast4(xq)));
          s_hi[r] = _mm256_add_epi16(s_hi[r], _mm256_maddubs_epi16(hi, broadcast4(xq + 32)));
        }
      }
      for (int r = 0; r < NX; ++r) {
        dot[r] = _mm256_add_epi32(dot[r], _mm256_add_epi32(_mm256_madd_epi16(s_lo[r], sc[2 * cc]),
                                                           _mm256_madd_epi16(s_hi[r], sc[2 * cc + 1])));
      }
    }
    for (int r = 0; r < NX; ++r) {
      const uint8_t* bs = xb[r] + kActBsums;
      __m256i offs = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        offs = _mm256_add_epi32(offs, _mm256_madd_epi16(mn[j], broadcast4(bs + 4 * j)));
      }
      acc[r] = q4k_update(acc[r], vd, vdmin, block_bytes::load_f32(xb[r] + kActD), dot[r],
                                offs);
    }
  }
  for (int r = 0; r < NX; ++r) _mm256_storeu_ps(out + r * out_stride, acc[r]);
}

// Q6_K_R8, NX activation rows.
template <int NX>
LEVER_AVX2 void q6_k_r8_avx2_tile(const uint8_t* w, const uint8_t* x, size_t x_stride,
                                  size_t n_blocks, float* out, size_t out_stride) {
  __m256 acc[NX];
  for (int r = 0; r < NX; ++r) acc[r] = _mm256_setzero_ps();

  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * kQ6KGroupBlock;
    const __m256 vd = halves8(g + 1664);
    // pair[p]: int16 (sc[2p], sc[2p+1]) per row lane; sc[g]: (sc_g, sc_g).
    __m256i pair[8], sc[16];
    for (int p = 0; p < 8; ++p) {
      pair[p] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 1536 + 16 * p)));
      sc[2 * p] = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(pair[p], 0xA0), 0xA0);
      sc[2 * p + 1] = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(pair[p], 0xF5), 0xF5);
    }
    const uint8_t* xb[NX];
    for (int r = 0; r < NX; ++r) xb[r] = x + r * x_stride + b * kActBytes;

    __m256i dot[NX];
    for (int r = 0; r < NX; ++r) dot[r] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
      for (int s = 0; s < 4; ++s) {
        // Values 128h + 32s + l: low 4 bits from ql word 16h + 8(s % 2) + l/4
        // (nibble s / 2), high 2 bits from qh word 8h + l/4 (bits 2s, 2s+1).
        // (Rebuilt for each s: measured faster than unpacking all four s of a
        // word at once, which runs out of registers.)
        for (int l8 = 0; l8 < 8; l8 += 2) {  // two words: 8 of the group's 16 values
          __m256i q[2];
          for (int k = 0; k < 2; ++k) {
            const int l4 = l8 + k;
            q[k] = q6k_values(load256(g + 32 * (16 * h + 8 * (s % 2) + l4)),
                              load256(g + 1024 + 32 * (8 * h + l4)), s);
          }
          const __m256i scale = sc[8 * h + 2 * s + (l8 >= 4 ? 1 : 0)];
#pragma GCC unroll 4
          for (int r = 0; r < NX; ++r) {
            const uint8_t* xq = xb[r] + kActQs + 128 * h + 32 * s + 4 * l8;
            const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(q[0], broadcast4(xq)),
                                                 _mm256_maddubs_epi16(q[1], broadcast4(xq + 4)));
            dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(s16, scale));
          }
        }
      }
    }
    for (int r = 0; r < NX; ++r) {
      const uint8_t* bs = xb[r] + kActBsums;
      __m256i offs = _mm256_setzero_si256();
      for (int p = 0; p < 8; ++p) {
        offs = _mm256_add_epi32(offs, _mm256_madd_epi16(pair[p], broadcast4(bs + 4 * p)));
      }
      acc[r] = scaled_update(acc[r], vd, block_bytes::load_f32(xb[r] + kActD),
                             _mm256_sub_epi32(dot[r], _mm256_slli_epi32(offs, 5)));
    }
  }
  for (int r = 0; r < NX; ++r) _mm256_storeu_ps(out + r * out_stride, acc[r]);
}

// -- AVX2, 32-value blocks (ActQ8_32 activations) ------------------------------
//   Q8_0: isum = sum_i q_i x_i with signed q: vpmaddubsw(|q|, x with q's
//         sign) -> int16 pairs (|.| <= 2 * 128 * 127), vpmaddwd to int32 at once.
//   Q5_0, Q4_0: unsigned q5 / q4 times x, then isum = sum q x - offset * x.sum
//         (offset 16 / 8: the scalar kernel's q - offset, summed exactly);
//         int16 sums of 4 vectors (8 products per int16 lane,
//         |sum| <= 8 * 31 * 127 = 31496).
//   Q4_1: unsigned q4; acc += d_x * (d_w * isum + m * x.sum).
//   Others: acc += (d_w * d_x) * isum, the scalar kernel's steps.
template <int NX>
LEVER_AVX2 void q8_0_r8_avx2_tile(const uint8_t* w, const uint8_t* x, size_t x_stride,
                                  size_t n_blocks, float* out, size_t out_stride) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NX];
  for (int r = 0; r < NX; ++r) acc[r] = _mm256_setzero_ps();
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * kQ8_0GroupBlock;
    const __m256 vd = halves8(g);
    const uint8_t* xb[NX];
    for (int r = 0; r < NX; ++r) xb[r] = x + r * x_stride + b * kAct32Bytes;
    __m256i isum[NX];
    for (int r = 0; r < NX; ++r) isum[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
      const __m256i wv = load256(g + 16 + 32 * t);
      const __m256i aw = _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 4
      for (int r = 0; r < NX; ++r) {
        const __m256i xs = _mm256_sign_epi8(broadcast4(xb[r] + kAct32Qs + 4 * t), wv);
        isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones));
      }
    }
    for (int r = 0; r < NX; ++r) {
      acc[r] = scaled_update(acc[r], vd, block_bytes::load_f32(xb[r] + kAct32D), isum[r]);
    }
  }
  for (int r = 0; r < NX; ++r) _mm256_storeu_ps(out + r * out_stride, acc[r]);
}

template <class T, int NX>
LEVER_AVX2 void nibbles_r8_avx2_tile(const uint8_t* w, const uint8_t* x, size_t x_stride,
                                     size_t n_blocks, float* out, size_t out_stride) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NX];
  for (int r = 0; r < NX; ++r) acc[r] = _mm256_setzero_ps();
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * T::kGroupBlock;
    const __m256 vd = halves8(g);
    __m256i q[8];
    nibble_values<T>(g, q);
#pragma GCC unroll 4
    for (int r = 0; r < NX; ++r) {
      const uint8_t* xb = x + r * x_stride + b * kAct32Bytes;
      const uint8_t* xq = xb + kAct32Qs;
      __m256i s16[2];
      for (int k = 0; k < 2; ++k) {  // words 2k, 2k+1
        const int t0 = 2 * k, t1 = 2 * k + 1;
        s16[k] = _mm256_add_epi16(
            _mm256_add_epi16(_mm256_maddubs_epi16(q[2 * t0], broadcast4(xq + 4 * t0)),
                             _mm256_maddubs_epi16(q[2 * t0 + 1], broadcast4(xq + 16 + 4 * t0))),
            _mm256_add_epi16(_mm256_maddubs_epi16(q[2 * t1], broadcast4(xq + 4 * t1)),
                             _mm256_maddubs_epi16(q[2 * t1 + 1], broadcast4(xq + 16 + 4 * t1))));
      }
      __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(s16[0], ones), _mm256_madd_epi16(s16[1], ones));
      int32_t xsum;
      std::memcpy(&xsum, xb + kAct32Sum, 4);
      const float dx = block_bytes::load_f32(xb + kAct32D);
      if constexpr (T::kMin) {
        acc[r] = min_update(acc[r], vd, halves8(g + 16), dx, isum, xsum);
      } else {
        acc[r] = scaled_update(acc[r], vd, dx, _mm256_sub_epi32(isum, _mm256_set1_epi32(T::kOffset * xsum)));
      }
    }
  }
  for (int r = 0; r < NX; ++r) _mm256_storeu_ps(out + r * out_stride, acc[r]);
}

// Any n_x, 4 activation rows per pass over a group's weights.
template <int NX> struct Q4KTile { static constexpr TileFn fn = q4_k_r8_avx2_tile<NX>; };
template <int NX> struct Q6KTile { static constexpr TileFn fn = q6_k_r8_avx2_tile<NX>; };
template <int NX> struct Q8_0Tile { static constexpr TileFn fn = q8_0_r8_avx2_tile<NX>; };
template <int NX> struct Q5_0Tile { static constexpr TileFn fn = nibbles_r8_avx2_tile<Q5_0R8, NX>; };
template <int NX> struct Q4_0Tile { static constexpr TileFn fn = nibbles_r8_avx2_tile<Q4_0R8, NX>; };
template <int NX> struct Q4_1Tile { static constexpr TileFn fn = nibbles_r8_avx2_tile<Q4_1R8, NX>; };
#endif  // __x86_64__

#if defined(__x86_64__)
DotGroupFn avx2_group_kernel(int type) {
  return group_kernel_of<4, Q4KTile, Q6KTile, Q8_0Tile, Q5_0Tile, Q4_0Tile, Q4_1Tile>(type);
}
#endif

template <Isa kIsa>
DotGroupFn fallback_for(int type) {
  switch (type) {
    case kTypeQ4_K_R8: return fallback_kernel<kTypeQ4_K_R8, kIsa>;
    case kTypeQ6_K_R8: return fallback_kernel<kTypeQ6_K_R8, kIsa>;
    case kTypeQ8_0_R8: return fallback_kernel<kTypeQ8_0_R8, kIsa>;
    case kTypeQ5_0_R8: return fallback_kernel<kTypeQ5_0_R8, kIsa>;
    case kTypeQ4_0_R8: return fallback_kernel<kTypeQ4_0_R8, kIsa>;
    case kTypeQ4_1_R8: return fallback_kernel<kTypeQ4_1_R8, kIsa>;
    default: return nullptr;
  }
}

}  // namespace

DotGroupFn dot_group_kernel(int type, Isa isa) {
  if (!is_repacked_type(type)) return nullptr;
  if (isa == Isa::kAuto) isa = best_isa();
  if (!isa_available(isa)) return nullptr;
#if defined(__x86_64__)
  if (isa == Isa::kAvx2) return avx2_group_kernel(type);
  if (isa == Isa::kAvx512) return r8::avx512_group_kernel(type);
#endif
#if defined(__aarch64__)
  if (isa == Isa::kI8mm) return r8::i8mm_group_kernel(type);
  if (isa == Isa::kDotprod) return r8::dotprod_group_kernel(type);
  if (isa == Isa::kNeon) return r8::asimd_group_kernel(type);
#endif
  switch (isa) {
    case Isa::kScalar: return fallback_for<Isa::kScalar>(type);
    case Isa::kNeon: return fallback_for<Isa::kNeon>(type);
    case Isa::kDotprod: return fallback_for<Isa::kDotprod>(type);
    case Isa::kI8mm: return fallback_for<Isa::kI8mm>(type);
    default: return nullptr;
  }
}

}  // namespace lever

// AVX-512 VNNI group kernels for repacked weights (see qdot_r8.h, repack.h).
//
// The same lanes as the AVX2 kernels (qdot_r8.cpp): 256-bit vectors, lane r
// = weight row r of the group, one integer sum per (weight row, activation
// row) pair in that lane, the scalar kernels' float steps lane-wise
// (qdot_r8_x86.h). What AVX-512 adds:
//   - vpdpbusd (u8 weights x s8 activations, 4 products summed into int32
//     and accumulated): one instruction where AVX2 needs vpmaddubsw + vpaddw
//     + a later vpmaddwd, and no int16 bound on how many products a sum takes;
//   - 32 vector registers (EVEX encoding): 8 activation rows per pass over a
//     group's weights instead of 4, so each unpacked weight vector serves
//     twice as many rows;
//   - 512-bit vectors for Q6_K, whose per-16-value scales need a multiply
//     per group: two groups share one vector (its 256-bit halves).
// Per block, for each pair:
//   Q4_K: s_j  = sum over sub-block j of q x (vpdpbusd), dot = sum_j sc_j s_j
//         (vpmulld); offs = sum_j m_j (bsums[2j] + bsums[2j+1]) (vpdpwssd)
//   Q6_K: s_g  = sum over group g of q x, dot = sum_g sc_g s_g,
//         isum = dot - 32 sum_g sc_g bsums[g]
//   Q8_0: weights made unsigned (q + 128, an xor with 0x80) as they are
//         loaded: isum = sum (q + 128) x - 128 x.sum
//   Q5_0, Q4_0, Q4_1: unsigned q; isum = sum q x - offset x.sum
// Every integer sum is exact (int32, no saturating step), so each lane holds
// the scalar kernel's block sums and the float steps that follow are the
// scalar ones in the same order: the results equal the scalar kernels' bit
// for bit (this file is built with -ffp-contract=off).

#include <cstring>

#include "kernels/block_bytes.h"
#include "kernels/qdot_r8_x86.h"
#include "kernels/repack.h"

#if defined(__x86_64__)

#define LEVER_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

namespace lever {
namespace r8 {
namespace vnni {  // named: see rows_in_tiles (qdot_r8.h)
namespace {

constexpr int kTileRows = 8;  // activation rows per pass over a group's weights

LEVER_VNNI inline __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8) {
  return _mm256_dpbusd_epi32(acc, u8, s8);
}

// Byte j (0..3) of every int32 lane of v, zero-extended.
LEVER_VNNI inline __m256i byte_of(__m256i v, int j) {
  return _mm256_and_si256(_mm256_srli_epi32(v, 8 * j), _mm256_set1_epi32(0xFF));
}

// The bsums pair (2j, 2j + 1) of an activation block times a lane's int16
// pair, summed into acc: the offsets sum_j m_j (bsums[2j] + bsums[2j+1]).
LEVER_VNNI inline __m256i pair_dot(__m256i acc, __m256i pairs16, const uint8_t* bsums2) {
  return _mm256_dpwssd_epi32(acc, pairs16, broadcast4(bsums2));
}

// Q4_K_R8, NX activation rows.
template <int NX>
LEVER_VNNI void q4_k_r8_vnni_tile(const uint8_t* w, const uint8_t* x, size_t x_stride,
                                  size_t n_blocks, float* out, size_t out_stride) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[NX];
  for (int r = 0; r < NX; ++r) acc[r] = _mm256_setzero_ps();

  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * kQ4KGroupBlock;
    const Q4KScalesR8 s6 = q4k_scales_r8(g);
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
#pragma GCC unroll 8
        for (int r = 0; r < NX; ++r) {
          const uint8_t* xq = xb[r] + kActQs + 64 * cc + 4 * u;
          s_lo[r] = dpbusd(s_lo[r], lo, broadcast4(xq));
          s_hi[r] = dpbusd(s_hi[r], hi, broadcast4(xq + 32));
        }
      }
      const __m256i src = cc < 2 ? s6.sc_lo : s6.sc_hi;
      const __m256i sc0 = byte_of(src, 2 * (cc % 2)), sc1 = byte_of(src, 2 * (cc % 2) + 1);
      for (int r = 0; r < NX; ++r) {
        dot[r] = _mm256_add_epi32(dot[r], _mm256_add_epi32(_mm256_mullo_epi32(s_lo[r], sc0),
                                                           _mm256_mullo_epi32(s_hi[r], sc1)));
      }
    }
    // (m_j, m_j) as an int16 pair per lane, for the bsums pair (2j, 2j + 1).
    __m256i mn[8];
    for (int j = 0; j < 8; ++j) {
      const __m256i m = byte_of(j < 4 ? s6.mn_lo : s6.mn_hi, j % 4);
      mn[j] = _mm256_or_si256(m, _mm256_slli_epi32(m, 16));
    }
    const __m256 vd = halves8(g), vdmin = halves8(g + 16);
    for (int r = 0; r < NX; ++r) {
      const uint8_t* bs = xb[r] + kActBsums;
      __m256i offs = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) offs = pair_dot(offs, mn[j], bs + 4 * j);
      acc[r] = q4k_update(acc[r], vd, vdmin, block_bytes::load_f32(xb[r] + kActD), dot[r], offs);
    }
  }
  for (int r = 0; r < NX; ++r) _mm256_storeu_ps(out + r * out_stride, acc[r]);
}

// Q6_K value bits (as q6k_values) of 64 bytes of ql and qh words.
LEVER_VNNI inline __m512i q6k_values512(__m512i l, __m512i hbits, int s) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  const __m512i lo = s < 2 ? _mm512_and_si512(l, low4)
                           : _mm512_and_si512(_mm512_srli_epi16(l, 4), low4);
  __m512i hi;
  switch (s) {
    case 0: hi = _mm512_slli_epi16(hbits, 4); break;
    case 1: hi = _mm512_slli_epi16(hbits, 2); break;
    case 2: hi = hbits; break;
    default: hi = _mm512_srli_epi16(hbits, 2); break;
  }
  return _mm512_or_si512(lo, _mm512_and_si512(hi, bits45));
}

// Q6_K_R8, NX activation rows. Per (h, s), the 32 values 128h + 32s + l of
// each row form two groups (l < 16: group 8h + 2s, l >= 16: the next), four
// words each: 512-bit vector j holds word j of the first group in its low
// 256 bits and word j of the second in its high 256 bits, so one vpdpbusd
// serves both groups, each lane keeps one group's sum, and one vpmulld
// applies both groups' scales (lanes 0..7 the first, 8..15 the second); the
// two halves are folded once per block.
template <int NX>
LEVER_VNNI void q6_k_r8_vnni_tile(const uint8_t* w, const uint8_t* x, size_t x_stride,
                                  size_t n_blocks, float* out, size_t out_stride) {
  // spread[j]: activation word j into lanes 0..7, word 4 + j into lanes 8..15.
  __m512i spread[4];
  for (int j = 0; j < 4; ++j) {
    spread[j] = _mm512_inserti64x4(_mm512_set1_epi32(j), _mm256_set1_epi32(4 + j), 1);
  }
  __m256 acc[NX];
  for (int r = 0; r < NX; ++r) acc[r] = _mm256_setzero_ps();

  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * kQ6KGroupBlock;
    const uint8_t* xb[NX];
    for (int r = 0; r < NX; ++r) xb[r] = x + r * x_stride + b * kActBytes;

    __m512i dot[NX];
    for (int r = 0; r < NX; ++r) dot[r] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 4; ++s) {
        // Scales of groups 8h + 2s (lanes 0..7) and 8h + 2s + 1 (lanes 8..15),
        // int32: pair p = 4h + s holds them as the two int16 of each row's lane.
        const __m256i pair = _mm256_cvtepi8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 1536 + 16 * (4 * h + s))));
        const __m512i sc = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_srai_epi32(_mm256_slli_epi32(pair, 16), 16)),
            _mm256_srai_epi32(pair, 16), 1);
        // Word j of group l < 16 is ql word 16h + 8(s % 2) + j (nibble s / 2)
        // and qh word 8h + j (bits 2s, 2s+1); of group l >= 16, word j + 4.
        const uint8_t* ql = g + 32 * (16 * h + 8 * (s % 2));
        const uint8_t* qh = g + 1024 + 32 * (8 * h);
        __m512i q[4];
        for (int j = 0; j < 4; ++j) {
          const __m512i l = _mm512_inserti64x4(
              _mm512_castsi256_si512(load256(ql + 32 * j)), load256(ql + 32 * (4 + j)), 1);
          const __m512i hb = _mm512_inserti64x4(
              _mm512_castsi256_si512(load256(qh + 32 * j)), load256(qh + 32 * (4 + j)), 1);
          q[j] = q6k_values512(l, hb, s);
        }
#pragma GCC unroll 8
        for (int r = 0; r < NX; ++r) {
          const __m512i xw = _mm512_castsi256_si512(load256(xb[r] + kActQs + 128 * h + 32 * s));
          __m512i z = _mm512_setzero_si512();
          for (int j = 0; j < 4; ++j) {
            z = _mm512_dpbusd_epi32(z, q[j], _mm512_permutexvar_epi32(spread[j], xw));
          }
          dot[r] = _mm512_add_epi32(dot[r], _mm512_mullo_epi32(z, sc));
        }
      }
    }
    const __m256 vd = halves8(g + 1664);
    __m256i pairs[8];  // int16 (sc[2p], sc[2p+1]) per row lane, for the offsets
    for (int p = 0; p < 8; ++p) {
      pairs[p] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 1536 + 16 * p)));
    }
    for (int r = 0; r < NX; ++r) {
      const uint8_t* bs = xb[r] + kActBsums;
      __m256i offs = _mm256_setzero_si256();
      for (int p = 0; p < 8; ++p) offs = pair_dot(offs, pairs[p], bs + 4 * p);
      const __m256i dot8 = _mm256_add_epi32(_mm512_castsi512_si256(dot[r]),
                                            _mm512_extracti64x4_epi64(dot[r], 1));
      acc[r] = scaled_update(acc[r], vd, block_bytes::load_f32(xb[r] + kActD),
                             _mm256_sub_epi32(dot8, _mm256_slli_epi32(offs, 5)));
    }
  }
  for (int r = 0; r < NX; ++r) _mm256_storeu_ps(out + r * out_stride, acc[r]);
}

// Q8_0_R8, NX activation rows.
template <int NX>
LEVER_VNNI void q8_0_r8_vnni_tile(const uint8_t* w, const uint8_t* x, size_t x_stride,
                                  size_t n_blocks, float* out, size_t out_stride) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[NX];
  for (int r = 0; r < NX; ++r) acc[r] = _mm256_setzero_ps();
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * kQ8_0GroupBlock;
    const uint8_t* xb[NX];
    for (int r = 0; r < NX; ++r) xb[r] = x + r * x_stride + b * kAct32Bytes;
    __m256i isum[NX];
    for (int r = 0; r < NX; ++r) isum[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
      const __m256i wu = _mm256_xor_si256(load256(g + 16 + 32 * t), flip);  // q + 128
#pragma GCC unroll 8
      for (int r = 0; r < NX; ++r) isum[r] = dpbusd(isum[r], wu, broadcast4(xb[r] + kAct32Qs + 4 * t));
    }
    const __m256 vd = halves8(g);
    for (int r = 0; r < NX; ++r) {
      int32_t xsum;
      std::memcpy(&xsum, xb[r] + kAct32Sum, 4);
      const __m256i exact = _mm256_sub_epi32(isum[r], _mm256_set1_epi32(128 * xsum));
      acc[r] = scaled_update(acc[r], vd, block_bytes::load_f32(xb[r] + kAct32D), exact);
    }
  }
  for (int r = 0; r < NX; ++r) _mm256_storeu_ps(out + r * out_stride, acc[r]);
}

// Q5_0_R8, Q4_0_R8, Q4_1_R8 (layout T), NX activation rows.
template <class T, int NX>
LEVER_VNNI void nibbles_r8_vnni_tile(const uint8_t* w, const uint8_t* x, size_t x_stride,
                                     size_t n_blocks, float* out, size_t out_stride) {
  __m256 acc[NX];
  for (int r = 0; r < NX; ++r) acc[r] = _mm256_setzero_ps();
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * T::kGroupBlock;
    __m256i q[8];
    nibble_values<T>(g, q);
    const __m256 vd = halves8(g);
#pragma GCC unroll 8
    for (int r = 0; r < NX; ++r) {
      const uint8_t* xb = x + r * x_stride + b * kAct32Bytes;
      const uint8_t* xq = xb + kAct32Qs;
      __m256i isum = _mm256_setzero_si256();
      for (int t = 0; t < 4; ++t) {
        isum = dpbusd(isum, q[2 * t], broadcast4(xq + 4 * t));
        isum = dpbusd(isum, q[2 * t + 1], broadcast4(xq + 16 + 4 * t));
      }
      int32_t xsum;
      std::memcpy(&xsum, xb + kAct32Sum, 4);
      const float dx = block_bytes::load_f32(xb + kAct32D);
      if constexpr (T::kMin) {
        acc[r] = min_update(acc[r], vd, halves8(g + 16), dx, isum, xsum);
      } else {
        acc[r] = scaled_update(acc[r], vd, dx,
                               _mm256_sub_epi32(isum, _mm256_set1_epi32(T::kOffset * xsum)));
      }
    }
  }
  for (int r = 0; r < NX; ++r) _mm256_storeu_ps(out + r * out_stride, acc[r]);
}

// Any n_x: kTileRows activation rows per pass over a group's weights.
template <int NX> struct Q4K { static constexpr TileFn fn = q4_k_r8_vnni_tile<NX>; };
template <int NX> struct Q6K { static constexpr TileFn fn = q6_k_r8_vnni_tile<NX>; };
template <int NX> struct Q8_0 { static constexpr TileFn fn = q8_0_r8_vnni_tile<NX>; };
template <int NX> struct Q5_0 { static constexpr TileFn fn = nibbles_r8_vnni_tile<Q5_0R8, NX>; };
template <int NX> struct Q4_0 { static constexpr TileFn fn = nibbles_r8_vnni_tile<Q4_0R8, NX>; };
template <int NX> struct Q4_1 { static constexpr TileFn fn = nibbles_r8_vnni_tile<Q4_1R8, NX>; };

}  // namespace
}  // namespace vnni

DotGroupFn avx512_group_kernel(int type) {
  return group_kernel_of<vnni::kTileRows, vnni::Q4K, vnni::Q6K, vnni::Q8_0, vnni::Q5_0, vnni::Q4_0,
                         vnni::Q4_1>(type);
}

}  // namespace r8
}  // namespace lever

#endif  // __x86_64__

// Dot kernels for the K-quant weight types Q4_K and Q6_K (see qdot.h).
//
// Every kernel computes, for activation rows r < n_x,
//   out[r] = sum over the weight row of dequant(w)[i] * (xd_r * xqs_r[i])
// block by block (256 values per block). The products are summed exactly in
// integers inside a block; floats only enter once per block (the fp16 scales
// of the weights times the activation block's d).
//
//   Q4_K: value = d * sc_j * q - dmin * m_j   (q in 0..15, sub-block j of 32)
//     block sum = d * xd * sum_j sc_j * dot_j(q, xqs)
//               - dmin * xd * sum_j m_j * (bsums[2j] + bsums[2j+1])
//   Q6_K: value = d * sc_g * (q - 32)         (q in 0..63, group g of 16)
//     block sum = d * xd * (sum_g sc_g * dot_g(q, xqs) - 32 * sum_g sc_g * bsums[g])
//
// The weights q are unsigned and the activations signed bytes (|x| <= 127).
// How the integer part is done (AVX-512 CPUs run the AVX2 kernels on weights
// in this layout; their fast path is the repacked layout, qdot_r8_vnni.cpp):
//   AVX2:    vpmaddubsw (u8 x s8, pairs summed into int16), vphaddw, vpmaddwd
//            with the int16 scales (see "AVX2 kernels").
//   scalar:  scale * q precomputed as int16 per block, then a plain int16 x
//            int8 dot product of 256 values per row (vectorised by the compiler).
// Each weight block is unpacked once and then used for all n_x activation
// rows; each row keeps its own float accumulator (a vector in the SIMD
// versions, reduced to one number only at the end of the row).
//
// Block layouts (ggml; see dequant.cpp for the element order):
//   Q4_K (144 bytes): fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins,
//     qs[128]: for chunk c < 4, qs[32c .. 32c+31] hold values 64c .. 64c+31 in
//     their low nibbles and 64c+32 .. 64c+63 in their high nibbles.
//   Q6_K (210 bytes): ql[128], qh[64], int8 scales[16], fp16 d. For half
//     h < 2 (128 values), value 128h + 32s + l (s < 4, l < 32) has
//     low 4 bits = nibble s / 2 of ql[64h + 32(s % 2) + l] and
//     high 2 bits = bits 2s, 2s+1 of qh[32h + l].

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/block_bytes.h"
#include "kernels/qdot.h"
#include "kernels/qdot_tile.h"
#include "kernels/x86_simd.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "qdot_kquants.cpp assumes a little-endian CPU (GGUF data is little-endian)"
#endif

namespace lever {
namespace qdot {
namespace {

using block_bytes::load_u16;
using block_bytes::load_u32;
using block_bytes::load_f32;
using block_bytes::half_to_float;

constexpr size_t kQ4KBytes = 144;      // bytes per Q4_K block
constexpr size_t kQ6KBytes = 210;      // bytes per Q6_K block
constexpr size_t kActBytes = sizeof(ActQ8K);  // bytes per activation block
constexpr size_t kActD = offsetof(ActQ8K, d);
constexpr size_t kActQs = offsetof(ActQ8K, qs);
constexpr size_t kActBsums = offsetof(ActQ8K, bsums);

// The 12-byte scale field of Q4_K, unpacked: byte j of `scales` / `mins` is
// the 6-bit scale / min of sub-block j (the same bits as ggml's
// get_scale_min_k4, done four bytes at a time).
//   bytes 0..3   scale j (j < 4) in bits 0..5; bits 6..7 = bits 4..5 of scale j+4
//   bytes 4..7   min j (j < 4) in bits 0..5; bits 6..7 = bits 4..5 of min j+4
//   bytes 8..11  low nibble: bits 0..3 of scale j+4; high nibble: of min j+4
struct K4Scales {
  uint64_t scales;
  uint64_t mins;
};

inline K4Scales unpack_q4k_scales(const uint8_t* s) {
  const uint32_t a = load_u32(s), b = load_u32(s + 4), c = load_u32(s + 8);
  const uint32_t low6 = 0x3F3F3F3Fu, low4 = 0x0F0F0F0Fu, bits45 = 0x30303030u;
  // (a >> 2) & bits45 moves bits 6..7 of each byte to bits 4..5 of that byte.
  const uint32_t sc_lo = a & low6;
  const uint32_t mn_lo = b & low6;
  const uint32_t sc_hi = (c & low4) | ((a >> 2) & bits45);
  const uint32_t mn_hi = ((c >> 4) & low4) | ((b >> 2) & bits45);
  return {sc_lo | (static_cast<uint64_t>(sc_hi) << 32),
          mn_lo | (static_cast<uint64_t>(mn_hi) << 32)};
}

// ---------------------------------------------------------------------------
// Scalar kernels (any CPU). Each weight block is unpacked once into 256 int16
// values q * scale (at most 63 * 15 for Q4_K, 128 * 63 for Q6_K), so that the
// per-row work is one flat int16 x int8 dot product of 256 values, which
// compilers vectorise well (SSE2 pmaddwd, NEON smlal).

// sum_i w[i] * x[i] over 256 values (|sum| < 2^31 for the ranges above).
inline int32_t dot256(const int16_t* w, const int8_t* x) {
  int32_t sum = 0;
  for (int i = 0; i < 256; ++i) sum += static_cast<int32_t>(w[i]) * static_cast<int32_t>(x[i]);
  return sum;
}

// Q4_K, scalar.
void q4_k_scalar_impl(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                      size_t n_blocks, float* out) {
  float acc[kMaxDotRows] = {};
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = w + b * kQ4KBytes;
    const float d = half_to_float(load_u16(blk));
    const float dmin = half_to_float(load_u16(blk + 2));
    const K4Scales s = unpack_q4k_scales(blk + 4);
    int16_t min16[16];  // min of sub-block j at 2j and 2j+1, to pair with the bsums
    for (int j = 0; j < 8; ++j) {
      min16[2 * j] = min16[2 * j + 1] = static_cast<int16_t>((s.mins >> (8 * j)) & 0xFF);
    }
    // scale_j * q for the 256 values in element order: chunk c holds values
    // 64c .. 64c+31 (sub-block 2c) in its low nibbles, 64c+32 .. (2c+1) in the high.
    alignas(64) int16_t wq[256];
    const uint8_t* qs = blk + 16;
    for (int c = 0; c < 4; ++c) {
      const int16_t sc_lo = static_cast<int16_t>((s.scales >> (16 * c)) & 0xFF);
      const int16_t sc_hi = static_cast<int16_t>((s.scales >> (16 * c + 8)) & 0xFF);
      for (int l = 0; l < 32; ++l) {
        wq[64 * c + l] = static_cast<int16_t>(sc_lo * (qs[32 * c + l] & 0x0F));
        wq[64 * c + 32 + l] = static_cast<int16_t>(sc_hi * (qs[32 * c + l] >> 4));
      }
    }
    for (int r = 0; r < n_x; ++r) {
      const uint8_t* xb = x + r * x_stride + b * kActBytes;
      int16_t bsums[16];
      std::memcpy(bsums, xb + kActBsums, sizeof bsums);
      const int32_t dot = dot256(wq, reinterpret_cast<const int8_t*>(xb + kActQs));
      int32_t offs = 0;  // sum_j min_j * (sum of x over sub-block j)
      for (int i = 0; i < 16; ++i) offs += min16[i] * bsums[i];
      const float xd = load_f32(xb + kActD);
      acc[r] += (d * xd) * static_cast<float>(dot) - (dmin * xd) * static_cast<float>(offs);
    }
  }
  for (int r = 0; r < n_x; ++r) out[r] = acc[r];
}

// Q6_K, scalar: the -32 offset is applied with the bsums.
void q6_k_scalar_impl(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                      size_t n_blocks, float* out) {
  float acc[kMaxDotRows] = {};
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = w + b * kQ6KBytes;
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    const int8_t* scale = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = half_to_float(load_u16(blk + 208));
    // scale_g * q (q = the 6-bit value, 0..63) for the 256 values in element
    // order; value 128h + 32s + l takes nibble s / 2 of ql[64h + 32(s % 2) + l]
    // and bits 2s, 2s+1 of qh[32h + l], and is in group 8h + 2s + (l >= 16).
    alignas(64) int16_t wq[256];
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 4; ++s) {
        const uint8_t* lo = ql + 64 * h + 32 * (s % 2);
        const uint8_t* hi = qh + 32 * h;
        const int16_t sc0 = scale[8 * h + 2 * s];      // values l < 16
        const int16_t sc1 = scale[8 * h + 2 * s + 1];  // values l >= 16
        int16_t* y = wq + 128 * h + 32 * s;
        for (int l = 0; l < 32; ++l) {
          const int q = ((lo[l] >> (4 * (s / 2))) & 0x0F) | (((hi[l] >> (2 * s)) & 3) << 4);
          y[l] = static_cast<int16_t>((l < 16 ? sc0 : sc1) * q);
        }
      }
    }
    for (int r = 0; r < n_x; ++r) {
      const uint8_t* xb = x + r * x_stride + b * kActBytes;
      int16_t bsums[16];
      std::memcpy(bsums, xb + kActBsums, sizeof bsums);
      const int32_t dot = dot256(wq, reinterpret_cast<const int8_t*>(xb + kActQs));
      int32_t offs = 0;  // sum_g scale_g * (sum of x over group g)
      for (int g = 0; g < 16; ++g) offs += scale[g] * bsums[g];
      acc[r] += (d * load_f32(xb + kActD)) * static_cast<float>(dot - 32 * offs);
    }
  }
  for (int r = 0; r < n_x; ++r) out[r] = acc[r];
}

#if defined(__x86_64__)

#define LEVER_AVX2 __attribute__((target("avx2,fma,f16c")))

// Calls Rows<1> .. Rows<8> (the template argument is the row count, so that
// each row's accumulator stays in a register).
#define LEVER_DISPATCH_ROWS(ROWS, w, x, x_stride, n_x, n_blocks, out) \
  switch (n_x) {                                                      \
    case 1: ROWS<1>(w, x, x_stride, n_blocks, out); break;            \
    case 2: ROWS<2>(w, x, x_stride, n_blocks, out); break;            \
    case 3: ROWS<3>(w, x, x_stride, n_blocks, out); break;            \
    case 4: ROWS<4>(w, x, x_stride, n_blocks, out); break;            \
    case 5: ROWS<5>(w, x, x_stride, n_blocks, out); break;            \
    case 6: ROWS<6>(w, x, x_stride, n_blocks, out); break;            \
    case 7: ROWS<7>(w, x, x_stride, n_blocks, out); break;            \
    default: ROWS<8>(w, x, x_stride, n_blocks, out); break;           \
  }

// Sum of the 8 int32 lanes (exact, wrapping like the scalar int32 sums).
LEVER_AVX2 inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// ---------------------------------------------------------------------------
// AVX2 kernels (256-bit vectors: 32 values each). Each activation row keeps
// one float accumulator and takes the scalar kernel's float steps on each
// block's exact integer sums, so the results equal the scalar kernel's bit
// for bit.
//
// Integer core per 64 values (vectors a, b of 32):
//   vpmaddubsw: u8 weights x s8 activations, pairs summed -> int16 P_a, P_b
//   vphaddw:    neighbours summed again (|sum| <= 4 * 63 * 127 < 32767, exact)
//               -> per 128-bit lane: 4 sums from P_a, then 4 from P_b
//   vpmaddwd:   times the int16 scales, pairs summed -> int32.
// That is 3 multiply-class instructions per 64 values instead of 4 with a
// vpmaddwd for each vector (the multiply ports are the bottleneck).

// Q4_K, AVX2, N activation rows.
template <int N>
LEVER_AVX2 void q4_k_avx2_rows(const uint8_t* w, const uint8_t* x, size_t x_stride,
                               size_t n_blocks, float* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  // pshufb patterns for the scales of chunk c (sub-blocks 2c, 2c+1): in each
  // 128-bit lane, int16 scale 2c four times, then scale 2c+1 four times.
  __m256i pick[4];
  for (int c = 0; c < 4; ++c) {
    const short a = static_cast<short>(0x0100 + 0x0202 * (2 * c));
    const short b = static_cast<short>(0x0100 + 0x0202 * (2 * c + 1));
    pick[c] = _mm256_setr_epi16(a, a, a, a, b, b, b, b, a, a, a, a, b, b, b, b);
  }

  float facc[N] = {};

  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = w + b * kQ4KBytes;
    // d and dmin (two fp16 values, converted exactly).
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(blk))));
    const float d = _mm_cvtss_f32(dm);
    const float dmin = _mm_cvtss_f32(_mm_movehdup_ps(dm));

    // Scales, as int16 matching the hadd output of chunk c.
    const K4Scales s = unpack_q4k_scales(blk + 4);
    const __m256i sc_all = _mm256_broadcastsi128_si256(
        _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(s.scales))));
    __m256i sc[4];
    for (int c = 0; c < 4; ++c) sc[c] = _mm256_shuffle_epi8(sc_all, pick[c]);
    // Mins as 16 int16: lanes 2j and 2j+1 = m_j, to pair with bsums 2j, 2j+1.
    const __m128i mn8 = _mm_cvtsi64_si128(static_cast<long long>(s.mins));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));

    // The 256 4-bit values in element order: vector j = sub-block j.
    __m256i q[8];
    for (int c = 0; c < 4; ++c) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
      q[2 * c] = _mm256_and_si256(bytes, low4);
      q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
    }

#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) {
      const uint8_t* xb = x + r * x_stride + b * kActBytes;
      const uint8_t* xq = xb + kActQs;
      // p[c] = 8 int32 partial sums of sc_j * q * x over sub-blocks 2c, 2c+1.
      __m256i p[4];
      for (int c = 0; c < 4; ++c) {
        const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64 * c));
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64 * c + 32));
        const __m256i sums = _mm256_hadd_epi16(_mm256_maddubs_epi16(q[2 * c], x0),
                                               _mm256_maddubs_epi16(q[2 * c + 1], x1));
        p[c] = _mm256_madd_epi16(sums, sc[c]);
      }
      const __m256i dot = _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
      // Offsets: m_j * (bsums[2j] + bsums[2j+1]) in 8 int32 lanes.
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + kActBsums));
      const __m256i offs = _mm256_madd_epi16(bsums, mins);
      // The scalar kernel's float steps on the exact block sums.
      const float xd = load_f32(xb + kActD);
      facc[r] += (d * xd) * static_cast<float>(hsum_epi32(dot)) -
                 (dmin * xd) * static_cast<float>(hsum_epi32(offs));
    }
  }
  for (int r = 0; r < N; ++r) out[r] = facc[r];
}

// Q6_K, AVX2, N activation rows.
template <int N>
LEVER_AVX2 void q6_k_avx2_rows(const uint8_t* w, const uint8_t* x, size_t x_stride,
                               size_t n_blocks, float* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  // Vector v (values 32v .. 32v+31) covers group 2v in its low 128 bits and
  // group 2v+1 in its high 128 bits. The hadd of vectors (2i, 2i+1) holds, per
  // 128-bit lane L, 4 sums of group 4i + L, then 4 of group 4i + 2 + L.
  // pshufb patterns for those scales (group numbers mod 8: the source holds
  // scales 0..7 or 8..15 in both lanes).
  __m256i pick[2];
  for (int i = 0; i < 2; ++i) {
    short g[4];
    for (int k = 0; k < 4; ++k) g[k] = static_cast<short>(0x0100 + 0x0202 * ((4 * i + k) % 8));
    pick[i] = _mm256_setr_epi16(g[0], g[0], g[0], g[0], g[2], g[2], g[2], g[2],
                                g[1], g[1], g[1], g[1], g[3], g[3], g[3], g[3]);
  }

  float facc[N] = {};

  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = w + b * kQ6KBytes;
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    const float d = _cvtsh_ss(load_u16(blk + 208));

    // Scales: 16 int8 -> int16, spread to match the hadd outputs.
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    const __m256i sc_first = _mm256_permute4x64_epi64(sc16, 0x44);   // sc[0..7] in both halves
    const __m256i sc_second = _mm256_permute4x64_epi64(sc16, 0xEE);  // sc[8..15] in both halves
    __m256i sc[4];
    for (int i = 0; i < 2; ++i) {
      sc[i] = _mm256_shuffle_epi8(sc_first, pick[i]);
      sc[i + 2] = _mm256_shuffle_epi8(sc_second, pick[i]);
    }
    // -32 * sc[g], for the offset term with the bsums (fits in int16).
    const __m256i neg32sc = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));

    // The 6-bit values in element order, 32 per vector.
    __m256i q[8];
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
      // low nibble | (2 high bits moved to bits 4..5)
      q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, low4),
                                     _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45));
      q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                                     _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45));
      q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                     _mm256_and_si256(hb, bits45));
      q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                     _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45));
    }

#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) {
      const uint8_t* xb = x + r * x_stride + b * kActBytes;
      const uint8_t* xq = xb + kActQs;
      __m256i p[4];
      for (int i = 0; i < 4; ++i) {
        const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64 * i));
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64 * i + 32));
        const __m256i sums = _mm256_hadd_epi16(_mm256_maddubs_epi16(q[2 * i], x0),
                                               _mm256_maddubs_epi16(q[2 * i + 1], x1));
        p[i] = _mm256_madd_epi16(sums, sc[i]);
      }
      // Offset: -32 * sum_g sc_g * bsums[g].
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + kActBsums));
      const __m256i offs = _mm256_madd_epi16(bsums, neg32sc);
      const __m256i dot = _mm256_add_epi32(
          _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3])), offs);
      // The scalar kernel's float step on the exact block sum (dot - 32 * offs).
      facc[r] += (d * load_f32(xb + kActD)) * static_cast<float>(hsum_epi32(dot));
    }
  }
  for (int r = 0; r < N; ++r) out[r] = facc[r];
}

#endif  // __x86_64__

}  // namespace

// ---------------------------------------------------------------------------
// Entry points (DotRowsFn; n_x > kMaxDotRows is handled in groups of 8).

void q4_k_scalar(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
                 float* out) {
  tile_detail::in_row_groups(q4_k_scalar_impl, w, x, x_stride, n_x, n_blocks, out);
}

void q6_k_scalar(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
                 float* out) {
  tile_detail::in_row_groups(q6_k_scalar_impl, w, x, x_stride, n_x, n_blocks, out);
}

#if defined(__x86_64__)

namespace {
void q4_k_avx2_group(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                     size_t n_blocks, float* out) {
  LEVER_DISPATCH_ROWS(q4_k_avx2_rows, w, x, x_stride, n_x, n_blocks, out)
}
void q6_k_avx2_group(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                     size_t n_blocks, float* out) {
  LEVER_DISPATCH_ROWS(q6_k_avx2_rows, w, x, x_stride, n_x, n_blocks, out)
}
}  // namespace

void q4_k_avx2(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
               float* out) {
  tile_detail::in_row_groups(q4_k_avx2_group, w, x, x_stride, n_x, n_blocks, out);
}

void q6_k_avx2(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
               float* out) {
  tile_detail::in_row_groups(q6_k_avx2_group, w, x, x_stride, n_x, n_blocks, out);
}

#undef LEVER_DISPATCH_ROWS
#undef LEVER_AVX2

#endif  // __x86_64__

}  // namespace qdot
}  // namespace lever

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

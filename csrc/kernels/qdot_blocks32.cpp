// Dot kernels for the 32-value weight blocks Q8_0, Q5_0, Q4_0 and Q4_1
// against ActQ8_32 activations (see qdot.h for the interface and activation
// format).
//
// Weight blocks (ggml layouts, as in dequant.cpp):
//   Q8_0  34 bytes: fp16 d, int8 qs[32]                       w = d * q
//   Q5_0  22 bytes: fp16 d, uint32 qh, qs[16] (4-bit pairs)   w = d * (q5 - 16)
//   Q4_0  18 bytes: fp16 d, qs[16] (4-bit pairs)              w = d * (q4 - 8)
//   Q4_1  20 bytes: fp16 d, fp16 m, qs[16] (4-bit pairs)      w = d * q4 + m
// Element j < 16 of a 4-bit block is the low nibble of qs[j], element j + 16
// the high nibble; Q5_0 adds bit j of qh as the 5th bit of element j.
//
// Every path first turns a weight block into 32 8-bit integers w' = q8,
// q5 - 16 or q4 - 8 (signed), or q4 for Q4_1, then for each activation row
// computes the exact integer sum isum = sum w'[i] * x.qs[i] and accumulates
// (d_w * d_x) * isum in fp32; Q4_1 adds its offset as d_x * m * x.sum.
// The scalar and AVX2 paths take the same fp32 steps in the same order (the
// AVX2 one with one activation row per vector lane), so they agree bit for
// bit. AVX-512 CPUs run the AVX2 kernels on weights in this layout; their
// fast path is the repacked layout (qdot_r8_vnni.cpp).
//
//   - scalar: plain loops (the compiler may vectorise them; also the aarch64 build).
//   - AVX2: one block per 256-bit register; vpmaddubsw needs one unsigned
//     operand, so it multiplies |w'| by x with the sign of w' moved onto x
//     (vpsignb), then vpmaddwd sums pairs to int32.
// In both paths a weight block is unpacked once and used for all n_x rows.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/block_bytes.h"
#include "kernels/qdot.h"
#include "kernels/qdot_tile.h"
#include "kernels/x86_simd.h"


namespace lever {
namespace qdot {
namespace {

using block_bytes::load_u16;
using block_bytes::load_u32;
using block_bytes::load_i32;
using block_bytes::load_f32;
using block_bytes::half_to_float;

// Bytes per weight block.
constexpr size_t kQ8_0Bytes = 34;
constexpr size_t kQ5_0Bytes = 22;
constexpr size_t kQ4_0Bytes = 18;
constexpr size_t kQ4_1Bytes = 20;

// Byte offsets inside an ActQ8_32 block.
constexpr size_t kActBytes = sizeof(ActQ8_32);
constexpr size_t kActD = offsetof(ActQ8_32, d);
constexpr size_t kActSum = offsetof(ActQ8_32, sum);
constexpr size_t kActQs = offsetof(ActQ8_32, qs);
static_assert(kActBytes == 40 && kActD == 0 && kActSum == 4 && kActQs == 8,
              "unexpected ActQ8_32 layout");

// ---------------------------------------------------------------------------
// Scalar: unpack a block to int8 w', then integer dot products per row.

// Q8_0: the quants are already signed.
inline void unpack_q8_0(const uint8_t* blk, int8_t* wq) { std::memcpy(wq, blk + 2, 32); }

// Q5_0: w' = q5 - 16 = nibble - 16, plus 16 if the 5th bit (bit j of qh) is set.
// (Written with a mask table instead of shifts by j so that it vectorises.)
inline void unpack_q5_0(const uint8_t* blk, int8_t* wq) {
  static constexpr uint32_t kBit[16] = {1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,
                                        1u << 6,  1u << 7,  1u << 8,  1u << 9,  1u << 10, 1u << 11,
                                        1u << 12, 1u << 13, 1u << 14, 1u << 15};
  const uint32_t qh = load_u32(blk + 2);
  const uint32_t qh_lo = qh & 0xFFFFu, qh_hi = qh >> 16;
  const uint8_t* qs = blk + 6;
  for (int j = 0; j < 16; ++j) {
    const uint32_t lo_set = qh_lo & kBit[j], hi_set = qh_hi & kBit[j];
    wq[j] = static_cast<int8_t>((qs[j] & 0x0F) - (lo_set ? 0 : 16));
    wq[j + 16] = static_cast<int8_t>((qs[j] >> 4) - (hi_set ? 0 : 16));
  }
}

// Q4_0: the nibbles minus 8.
inline void unpack_q4_0(const uint8_t* blk, int8_t* wq) {
  const uint8_t* qs = blk + 2;
  for (int j = 0; j < 16; ++j) {
    wq[j] = static_cast<int8_t>((qs[j] & 0x0F) - 8);
    wq[j + 16] = static_cast<int8_t>((qs[j] >> 4) - 8);
  }
}

// Q4_1: the nibbles (the offset m is applied separately).
inline void unpack_q4_1(const uint8_t* blk, int8_t* wq) {
  const uint8_t* qs = blk + 4;
  for (int j = 0; j < 16; ++j) {
    wq[j] = static_cast<int8_t>(qs[j] & 0x0F);
    wq[j + 16] = static_cast<int8_t>(qs[j] >> 4);
  }
}

// kMin: the block has an fp16 offset m after d (Q4_1).
template <size_t kBlockBytes, void (*Unpack)(const uint8_t*, int8_t*), bool kMin = false>
void dot_scalar(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
                float* out) {
  // More than kMaxDotRows rows (not expected): in groups of kMaxDotRows.
  for (; n_x > kMaxDotRows; n_x -= kMaxDotRows, x += kMaxDotRows * x_stride, out += kMaxDotRows) {
    dot_scalar<kBlockBytes, Unpack, kMin>(w, x, x_stride, kMaxDotRows, n_blocks, out);
  }
  float acc[kMaxDotRows] = {};
  int8_t wq[32];
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = w + b * kBlockBytes;
    Unpack(blk, wq);
    const float dw = half_to_float(load_u16(blk));
    const float m = kMin ? half_to_float(load_u16(blk + 2)) : 0.0f;
    for (int r = 0; r < n_x; ++r) {
      const uint8_t* xb = x + r * x_stride + b * kActBytes;
      const int8_t* xq = reinterpret_cast<const int8_t*>(xb + kActQs);
      int32_t isum = 0;
      for (int i = 0; i < 32; ++i) isum += wq[i] * xq[i];
      const float dx = load_f32(xb + kActD);
      if (kMin) {
        // sum (d q + m) x = d * isum + m * x.sum
        const float xsum = static_cast<float>(load_i32(xb + kActSum));
        acc[r] += dx * (dw * static_cast<float>(isum) + m * xsum);
      } else {
        acc[r] += (dw * dx) * static_cast<float>(isum);
      }
    }
  }
  for (int r = 0; r < n_x; ++r) out[r] = acc[r];
}

}  // namespace

void q8_0_scalar(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
                 float* out) {
  dot_scalar<kQ8_0Bytes, unpack_q8_0>(w, x, x_stride, n_x, n_blocks, out);
}

void q5_0_scalar(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
                 float* out) {
  dot_scalar<kQ5_0Bytes, unpack_q5_0>(w, x, x_stride, n_x, n_blocks, out);
}

void q4_0_scalar(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
                 float* out) {
  dot_scalar<kQ4_0Bytes, unpack_q4_0>(w, x, x_stride, n_x, n_blocks, out);
}

void q4_1_scalar(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
                 float* out) {
  dot_scalar<kQ4_1Bytes, unpack_q4_1, true>(w, x, x_stride, n_x, n_blocks, out);
}

#if defined(__x86_64__)

#define LEVER_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace {

// ---------------------------------------------------------------------------
// AVX2: one block per iteration, 8 int32 / fp32 lanes per row.

// The 32 nibbles of qs[16] as bytes: low nibbles (elements 0..15), then high.
LEVER_AVX2 inline __m256i nibbles256(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

struct Q8_0Avx2 {
  static constexpr size_t kBytes = kQ8_0Bytes;
  static constexpr bool kMin = false;
  LEVER_AVX2 static __m256i unpack(const uint8_t* blk) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  }
};

struct Q5_0Avx2 {
  static constexpr size_t kBytes = kQ5_0Bytes;
  static constexpr bool kMin = false;
  LEVER_AVX2 static __m256i unpack(const uint8_t* blk) {
    const __m256i q = nibbles256(blk + 6);
    // Byte j gets byte j / 8 of qh, then tests its bit j % 8: 0xFF where the 5th bit is set.
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(load_u32(blk + 2))), sel);
    h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
    // 5th bit clear: q - 16, which as int8 is q | 0xF0; set: q.
    return _mm256_or_si256(q, _mm256_andnot_si256(h, _mm256_set1_epi8(static_cast<char>(0xF0))));
  }
};

struct Q4_0Avx2 {
  static constexpr size_t kBytes = kQ4_0Bytes;
  static constexpr bool kMin = false;
  LEVER_AVX2 static __m256i unpack(const uint8_t* blk) {
    return _mm256_sub_epi8(nibbles256(blk + 2), _mm256_set1_epi8(8));
  }
};

// Unsigned weights q4 (0..15) and an offset m.
struct Q4_1Avx2 {
  static constexpr size_t kBytes = kQ4_1Bytes;
  static constexpr bool kMin = true;
  LEVER_AVX2 static __m256i unpack(const uint8_t* blk) { return nibbles256(blk + 4); }
};

// Lane r = the sum of the 8 int32 lanes of v[r], for r < NX (0 beyond): the
// exact block sums of NX activation rows in one vector.
template <int NX>
LEVER_AVX2 inline __m256i row_sums(const __m256i* v) {
  __m256i a[8];
  for (int r = 0; r < 8; ++r) a[r] = r < NX ? v[r] : _mm256_setzero_si256();
  const __m256i b0 = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
  const __m256i b1 = _mm256_hadd_epi32(_mm256_hadd_epi32(a[4], a[5]), _mm256_hadd_epi32(a[6], a[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20),
                          _mm256_permute2x128_si256(b0, b1, 0x31));
}

// Lane r = the float at byte `at` of block b of activation row r (0 beyond NX).
template <int NX>
LEVER_AVX2 inline __m256 row_floats(const uint8_t* x, size_t x_stride, size_t b, size_t at) {
  alignas(32) float f[8] = {};
  for (int r = 0; r < NX; ++r) f[r] = load_f32(x + r * x_stride + b * kActBytes + at);
  return _mm256_load_ps(f);
}

// Adds block b of the weight row (at blk) times block b of each activation
// row r to lane r of acc, with the scalar kernel's float steps on the exact
// block sums (so each row's result equals dot_scalar's bit for bit).
template <class T, int NX>
LEVER_AVX2 inline void step_avx2(const uint8_t* blk, const uint8_t* x, size_t x_stride, size_t b,
                                 __m256& acc) {
  const __m256i wq = T::unpack(blk);
  const __m256 dw = _mm256_set1_ps(_cvtsh_ss(load_u16(blk)));
  __m256i p32[NX];
  if constexpr (T::kMin) {
    // Q4_1: q4 is unsigned already.
#pragma GCC unroll 8
    for (int r = 0; r < NX; ++r) {
      const uint8_t* xb = x + r * x_stride + b * kActBytes;
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + kActQs));
      p32[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xv), _mm256_set1_epi16(1));
    }
  } else {
    // |w'|: the unsigned operand of vpmaddubsw (|-128| = 0x80 = 128).
    const __m256i wabs = _mm256_sign_epi8(wq, wq);
#pragma GCC unroll 8
    for (int r = 0; r < NX; ++r) {
      const uint8_t* xb = x + r * x_stride + b * kActBytes;
      // x with the sign of w' (x = -128 never occurs: |x.qs| <= 127), times |w'|:
      // int16 pair sums (|.| <= 2 * 128 * 127, no saturation), then int32 quad sums.
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + kActQs));
      const __m256i p16 = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xv, wq));
      p32[r] = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    }
  }
  if constexpr (NX == 1) {  // one row: a scalar lane is cheaper than the transpose
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(p32[0]), _mm256_extracti128_si256(p32[0], 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    const float is = static_cast<float>(_mm_cvtsi128_si32(h));
    const float dws = _mm256_cvtss_f32(dw), dxs = load_f32(x + b * kActBytes + kActD);
    float lane0 = _mm256_cvtss_f32(acc);
    if constexpr (T::kMin) {
      const float m = _cvtsh_ss(load_u16(blk + 2));
      const float xs = static_cast<float>(load_i32(x + b * kActBytes + kActSum));
      lane0 += dxs * (dws * is + m * xs);
    } else {
      lane0 += (dws * dxs) * is;
    }
    acc = _mm256_castps128_ps256(_mm_set_ss(lane0));
    return;
  }
  const __m256 isum = _mm256_cvtepi32_ps(row_sums<NX>(p32));
  const __m256 dx = row_floats<NX>(x, x_stride, b, kActD);
  if constexpr (T::kMin) {
    // acc += d_x * (d_w * isum + m * x.sum)
    const __m256 m = _mm256_set1_ps(_cvtsh_ss(load_u16(blk + 2)));
    alignas(32) float xs[8] = {};
    for (int r = 0; r < NX; ++r) xs[r] = static_cast<float>(load_i32(x + r * x_stride + b * kActBytes + kActSum));
    const __m256 t = _mm256_add_ps(_mm256_mul_ps(dw, isum), _mm256_mul_ps(m, _mm256_load_ps(xs)));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(dx, t));
  } else {
    // acc += (d_w * d_x) * isum
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dw, dx), isum));
  }
}

template <class T, int NX>
LEVER_AVX2 void dot_avx2(const uint8_t* w, const uint8_t* x, size_t x_stride, size_t n_blocks,
                         float* out) {
  // Lane r accumulates row r, blocks in order: a row's result is the same
  // whatever NX is (a token scores alike alone or inside a tree).
  __m256 acc = _mm256_setzero_ps();
  for (size_t b = 0; b < n_blocks; ++b) step_avx2<T, NX>(w + b * T::kBytes, x, x_stride, b, acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (int r = 0; r < NX; ++r) out[r] = lanes[r];
}

template <class T>
LEVER_AVX2 void dispatch_avx2(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                              size_t n_blocks, float* out) {
  static_assert(kMaxDotRows == 8, "one case per row count below");
  switch (n_x) {
    case 1: return dot_avx2<T, 1>(w, x, x_stride, n_blocks, out);
    case 2: return dot_avx2<T, 2>(w, x, x_stride, n_blocks, out);
    case 3: return dot_avx2<T, 3>(w, x, x_stride, n_blocks, out);
    case 4: return dot_avx2<T, 4>(w, x, x_stride, n_blocks, out);
    case 5: return dot_avx2<T, 5>(w, x, x_stride, n_blocks, out);
    case 6: return dot_avx2<T, 6>(w, x, x_stride, n_blocks, out);
    case 7: return dot_avx2<T, 7>(w, x, x_stride, n_blocks, out);
    case 8: return dot_avx2<T, 8>(w, x, x_stride, n_blocks, out);
    default: break;
  }
  // More than kMaxDotRows rows (not expected): 8 now, the rest recursively.
  if (n_x > 8) {
    dot_avx2<T, 8>(w, x, x_stride, n_blocks, out);
    dispatch_avx2<T>(w, x + 8 * x_stride, x_stride, n_x - 8, n_blocks, out + 8);
  }
}

}  // namespace

LEVER_AVX2 void q8_0_avx2(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                          size_t n_blocks, float* out) {
  dispatch_avx2<Q8_0Avx2>(w, x, x_stride, n_x, n_blocks, out);
}

LEVER_AVX2 void q5_0_avx2(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                          size_t n_blocks, float* out) {
  dispatch_avx2<Q5_0Avx2>(w, x, x_stride, n_x, n_blocks, out);
}

LEVER_AVX2 void q4_0_avx2(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                          size_t n_blocks, float* out) {
  dispatch_avx2<Q4_0Avx2>(w, x, x_stride, n_x, n_blocks, out);
}

LEVER_AVX2 void q4_1_avx2(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                          size_t n_blocks, float* out) {
  dispatch_avx2<Q4_1Avx2>(w, x, x_stride, n_x, n_blocks, out);
}

#undef LEVER_AVX2

#endif  // __x86_64__

}  // namespace qdot
}  // namespace lever

// aarch64 dot kernels for the 32-value weight blocks Q8_0, Q5_0, Q4_0 and
// Q4_1 against ActQ8_32 activations (interface and formats: qdot.h; block
// layouts and the scalar reference: qdot_blocks32.cpp).
//
// Every path computes, for each (weight row, activation row) pair and each
// block b, the same two things as the scalar path (dot_scalar):
//   1. the exact integer isum = sum over the 32 values of w'[i] * x.qs[i]
//      (w' = q8, q5 - 16, q4 - 8, or q4 for Q4_1, as signed int8; |x.qs| <=
//      127). |isum| <= 32 * 128 * 127 < 2^24, so any order of integer adds
//      gives the same value and its fp32 conversion is exact.
//   2. the fp32 update of that pair's accumulator, with the scalar path's
//      operations in the scalar path's order, one rounding each:
//        Q8_0 / Q5_0 / Q4_0:  acc += (d_w * d_x) * float(isum)
//        Q4_1:                acc += d_x * (d_w * float(isum) + m * float(x.sum))
//      Blocks are added in order b = 0, 1, ... starting from acc = 0, and the
//      result is acc itself (no horizontal fp32 sum).
// The fp32 update runs on 4 pairs at once (one pair per float32x4 lane);
// each lane does exactly the scalar operations (vmulq_f32 / vaddq_f32, never
// a fused multiply-add: neon_simd.h switches contraction off for this file,
// and qdot_blocks32.cpp must be built with -ffp-contract=off too, since GCC
// contracts C++ by default and aarch64 has fmadd). fp16 scales go through
// the same block_bytes::half_to_float as the scalar path. So every result is
// bit-identical to the scalar kernel's, whatever n_x, n_w or the tiling.
//
// The integer step, per Isa (all on signed int8 w' and x):
//   - neon (baseline ASIMD): smull/smlal2 multiply 8 byte pairs into int16
//     lanes, two products per lane (|.| <= 2 * 128 * 127 = 32512, no
//     overflow); saddlp/sadalp widen-add them into 4 int32 lanes.
//   - dotprod (armv8.2-a sdot): vdotq_s32 adds 4 byte products into each of
//     4 int32 lanes; two sdot per block and activation row.
//   For both, the 4 int32 lanes of 4 activation rows are reduced to one
//   int32x4 of isums (lane = row) by two rounds of pairwise adds (addp).
//   - i8mm (armv8.6-a smmla, tile kernel only): vmmlaq_s32 multiplies a 2x8
//     int8 matrix by an 8x2 one into a 2x2 int32 block. Weight rows are
//     paired (rows c0, c1: 8 values of each per operand) and activation rows
//     paired (r0, r1); four smmla cover a block's 32 values and give the
//     isums of (c0,r0), (c0,r1), (c1,r0), (c1,r1) in lanes 0..3. An odd
//     weight or activation row count is padded with a copy of the last row,
//     whose results are dropped.
// The row kernels (DotRowsFn) of kDotprod and kI8mm are the dotprod ones.

#if defined(__aarch64__)

// First: it turns off fp contraction for everything below.
#include "kernels/neon_simd.h"

#include <cstddef>
#include <cstdint>

#include "kernels/block_bytes.h"
#include "kernels/qdot.h"
#include "kernels/qdot_tile.h"

namespace lever {
namespace qdot {
namespace {

using block_bytes::half_to_float;
using block_bytes::load_f32;
using block_bytes::load_i32;
using block_bytes::load_u16;
using block_bytes::load_u32;

// Byte offsets inside an ActQ8_32 block (40 bytes: not 16-byte aligned).
constexpr size_t kActBytes = sizeof(ActQ8_32);
constexpr size_t kActD = offsetof(ActQ8_32, d);
constexpr size_t kActSum = offsetof(ActQ8_32, sum);
constexpr size_t kActQs = offsetof(ActQ8_32, qs);
static_assert(kActBytes == 40 && kActD == 0 && kActSum == 4 && kActQs == 8,
              "unexpected ActQ8_32 layout");

// ---------------------------------------------------------------------------
// Weight blocks, unpacked (baseline ASIMD; inlined into every path).

// One weight block: w' of values 0..15 (lo) and 16..31 (hi), the scale d_w
// and (Q4_1 only, else 0) the offset m, both fp16 -> fp32 exactly.
struct WeightBlock {
  int8x16_t lo, hi;
  float d, m;
};

// The 16 low nibbles (values 0..15) and 16 high nibbles (values 16..31) of qs[16].
inline void nibbles(const uint8_t* qs, uint8x16_t* lo, uint8x16_t* hi) {
  const uint8x16_t q = vld1q_u8(qs);
  *lo = vandq_u8(q, vdupq_n_u8(0x0F));
  *hi = vshrq_n_u8(q, 4);
}

// Q8_0 (34 bytes: fp16 d, int8 qs[32]): w' = q8.
struct Q8_0 {
  static constexpr size_t kBytes = 34;
  static constexpr bool kMin = false;
  static WeightBlock unpack(const uint8_t* blk) {
    const int8_t* qs = reinterpret_cast<const int8_t*>(blk + 2);
    return {vld1q_s8(qs), vld1q_s8(qs + 16), half_to_float(load_u16(blk)), 0.0f};
  }
};

// Q5_0 (22 bytes: fp16 d, uint32 qh, qs[16]): w' = nibble + 16 * (bit j of qh) - 16.
struct Q5_0 {
  static constexpr size_t kBytes = 22;
  static constexpr bool kMin = false;
  static WeightBlock unpack(const uint8_t* blk) {
    uint8x16_t lo, hi;
    nibbles(blk + 6, &lo, &hi);
    // Value j tests bit j % 8 of qh byte j / 8: 0xFF where the 5th bit is set.
    static const uint8_t kBitInByte[16] = {1, 2, 4, 8, 16, 32, 64, 128,
                                           1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bit = vld1q_u8(kBitInByte);
    const uint32_t qh = load_u32(blk + 2);
    const uint8x16_t qh_lo = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(qh)),
                                         vdup_n_u8(static_cast<uint8_t>(qh >> 8)));
    const uint8x16_t qh_hi = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(qh >> 16)),
                                         vdup_n_u8(static_cast<uint8_t>(qh >> 24)));
    // Bit clear: nibble - 16, which as int8 is nibble | 0xF0; set: the nibble.
    const uint8x16_t f0 = vdupq_n_u8(0xF0);
    lo = vorrq_u8(lo, vbicq_u8(f0, vtstq_u8(qh_lo, bit)));
    hi = vorrq_u8(hi, vbicq_u8(f0, vtstq_u8(qh_hi, bit)));
    return {vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), half_to_float(load_u16(blk)), 0.0f};
  }
};

// Q4_0 (18 bytes: fp16 d, qs[16]): w' = nibble - 8.
struct Q4_0 {
  static constexpr size_t kBytes = 18;
  static constexpr bool kMin = false;
  static WeightBlock unpack(const uint8_t* blk) {
    uint8x16_t lo, hi;
    nibbles(blk + 2, &lo, &hi);
    const int8x16_t eight = vdupq_n_s8(8);
    return {vsubq_s8(vreinterpretq_s8_u8(lo), eight), vsubq_s8(vreinterpretq_s8_u8(hi), eight),
            half_to_float(load_u16(blk)), 0.0f};
  }
};

// Q4_1 (20 bytes: fp16 d, fp16 m, qs[16]): w' = nibble (0..15); the offset m
// enters through x.sum.
struct Q4_1 {
  static constexpr size_t kBytes = 20;
  static constexpr bool kMin = true;
  static WeightBlock unpack(const uint8_t* blk) {
    uint8x16_t lo, hi;
    nibbles(blk + 4, &lo, &hi);
    return {vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), half_to_float(load_u16(blk)),
            half_to_float(load_u16(blk + 2))};
  }
};

// ---------------------------------------------------------------------------
// Shared steps (baseline ASIMD).

// Activation block b of the row at xr: its 32 quants.
struct ActBlock {
  int8x16_t lo, hi;
};
inline ActBlock load_act(const uint8_t* xb) {
  const int8_t* qs = reinterpret_cast<const int8_t*>(xb + kActQs);
  return {vld1q_s8(qs), vld1q_s8(qs + 16)};
}

// d_x and float(x.sum) of up to 4 activation blocks (lane i: the block at
// xb + i * x_stride, i < n; lanes i >= n are 0).
struct ActScales {
  float32x4_t d, sum;
};
template <bool kMin>
inline ActScales load_scales4(const uint8_t* xb, size_t x_stride, int n) {
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int32_t sum[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; ++i) {
    d[i] = load_f32(xb + i * x_stride + kActD);
    if (kMin) sum[i] = load_i32(xb + i * x_stride + kActSum);
  }
  return {vld1q_f32(d), kMin ? vcvtq_f32_s32(vld1q_s32(sum)) : vdupq_n_f32(0.0f)};
}

// The scalar path's fp32 update, one pair per lane (see the top comment).
template <bool kMin>
inline float32x4_t add_block(float32x4_t acc, float32x4_t dw, float32x4_t m, int32x4_t isum,
                             float32x4_t dx, float32x4_t xsum) {
  const float32x4_t fisum = vcvtq_f32_s32(isum);
  if (kMin) {
    // acc += d_x * (d_w * isum + m * x.sum)
    const float32x4_t t = vaddq_f32(vmulq_f32(dw, fisum), vmulq_f32(m, xsum));
    return vaddq_f32(acc, vmulq_f32(dx, t));
  }
  // acc += (d_w * d_x) * isum
  return vaddq_f32(acc, vmulq_f32(vmulq_f32(dw, dx), fisum));
}

// Writes the first n lanes of v to out[0], out[stride], ...
inline void store_lanes(float32x4_t v, int n, float* out, size_t stride) {
  float tmp[4];
  vst1q_f32(tmp, v);
  for (int i = 0; i < n; ++i) out[i * stride] = tmp[i];
}

// ---------------------------------------------------------------------------
// neon: row kernel, widening multiplies.

// 4 int32 lanes whose sum is sum w'[i] * x[i] over the block.
inline int32x4_t block_products_neon(const WeightBlock& w, const ActBlock& x) {
  int16x8_t p_lo = vmull_s8(vget_low_s8(w.lo), vget_low_s8(x.lo));
  p_lo = vmlal_high_s8(p_lo, w.lo, x.lo);
  int16x8_t p_hi = vmull_s8(vget_low_s8(w.hi), vget_low_s8(x.hi));
  p_hi = vmlal_high_s8(p_hi, w.hi, x.hi);
  return vpadalq_s16(vpaddlq_s16(p_lo), p_hi);
}

// out[r] for NX activation rows (NX <= kMaxDotRows): 4 rows per accumulator.
template <class T, int NX>
void rows_neon(const uint8_t* w, const uint8_t* x, size_t x_stride, size_t n_blocks,
               float* out) {
  constexpr int kGroups = (NX + 3) / 4;
  float32x4_t acc[kGroups];
  for (int g = 0; g < kGroups; ++g) acc[g] = vdupq_n_f32(0.0f);
  for (size_t b = 0; b < n_blocks; ++b) {
    const WeightBlock wb = T::unpack(w + b * T::kBytes);
    const float32x4_t dw = vdupq_n_f32(wb.d), m = vdupq_n_f32(wb.m);
    const uint8_t* xb = x + b * kActBytes;
#pragma GCC unroll 2
    for (int g = 0; g < kGroups; ++g) {
      const int n = NX - 4 * g < 4 ? NX - 4 * g : 4;
      int32x4_t p[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        p[i] = i < n ? block_products_neon(wb, load_act(xb + (4 * g + i) * x_stride))
                     : vdupq_n_s32(0);
      }
      const ActScales s = load_scales4<T::kMin>(xb + 4 * g * x_stride, x_stride, n);
      const int32x4_t isum = neon::lane_sums(p[0], p[1], p[2], p[3]);
      acc[g] = add_block<T::kMin>(acc[g], dw, m, isum, s.d, s.sum);
    }
  }
  for (int g = 0; g < kGroups; ++g) {
    store_lanes(acc[g], NX - 4 * g < 4 ? NX - 4 * g : 4, out + 4 * g, 1);
  }
}

// ---------------------------------------------------------------------------
// dotprod: sdot; row kernel and tile kernel share tile_dotprod.

LEVER_DOTPROD inline int32x4_t block_products_dotprod(const WeightBlock& w, const ActBlock& x) {
  return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w.lo, x.lo), w.hi, x.hi);
}

// out[r * out_stride + c] for NW weight rows (w + c * w_stride) x NX
// activation rows: each weight block unpacked once, each activation block
// loaded once; accumulators hold 4 activation rows of one weight row.
template <class T, int NW, int NX>
LEVER_DOTPROD void tile_dotprod(const uint8_t* w, size_t w_stride, const uint8_t* x,
                                size_t x_stride, size_t n_blocks, float* out, size_t out_stride) {
  constexpr int kGroups = (NX + 3) / 4;
  float32x4_t acc[NW][kGroups];
  for (int c = 0; c < NW; ++c) {
    for (int g = 0; g < kGroups; ++g) acc[c][g] = vdupq_n_f32(0.0f);
  }
  for (size_t b = 0; b < n_blocks; ++b) {
    WeightBlock wb[NW];
#pragma GCC unroll 4
    for (int c = 0; c < NW; ++c) wb[c] = T::unpack(w + c * w_stride + b * T::kBytes);
    const uint8_t* xb = x + b * kActBytes;
#pragma GCC unroll 4
    for (int g = 0; g < kGroups; ++g) {
      const int n = NX - 4 * g < 4 ? NX - 4 * g : 4;
      ActBlock xa[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        xa[i] = load_act(xb + (4 * g + (i < n ? i : 0)) * x_stride);
      }
      const ActScales s = load_scales4<T::kMin>(xb + 4 * g * x_stride, x_stride, n);
#pragma GCC unroll 4
      for (int c = 0; c < NW; ++c) {
        int32x4_t p[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          p[i] = i < n ? block_products_dotprod(wb[c], xa[i]) : vdupq_n_s32(0);
        }
        acc[c][g] = add_block<T::kMin>(acc[c][g], vdupq_n_f32(wb[c].d), vdupq_n_f32(wb[c].m),
                                       neon::lane_sums(p[0], p[1], p[2], p[3]), s.d, s.sum);
      }
    }
  }
  for (int c = 0; c < NW; ++c) {
    for (int g = 0; g < kGroups; ++g) {
      store_lanes(acc[c][g], NX - 4 * g < 4 ? NX - 4 * g : 4, out + 4 * g * out_stride + c,
                  out_stride);
    }
  }
}

// Sub-tile of the dotprod tile kernel: 4 weight rows (8 registers of
// unpacked weights) x 4 activation rows (8 registers) and 4 accumulators.
template <class T>
struct TileDotprod {
  static constexpr int kTW = 4, kTX = 4;
  template <int NW, int NX>
  static void run(const uint8_t* w, size_t w_stride, const uint8_t* x, size_t x_stride,
                  size_t n_blocks, float* out, size_t out_stride) {
    tile_dotprod<T, NW, NX>(w, w_stride, x, x_stride, n_blocks, out, out_stride);
  }
};

// ---------------------------------------------------------------------------
// i8mm: smmla on pairs of weight rows x pairs of activation rows.

// The 8-byte halves of a and b interleaved as smmla operands: for rows
// (a, b), operand k holds bytes 8k..8k+7 of a then of b (k = 0..3 over lo, hi).
struct PairOperands {
  int8x16_t k[4];
};
inline PairOperands interleave_pair(int8x16_t a_lo, int8x16_t a_hi, int8x16_t b_lo,
                                    int8x16_t b_hi) {
  PairOperands op;
  neon::zip_rows(a_lo, b_lo, op.k[0], op.k[1]);
  neon::zip_rows(a_hi, b_hi, op.k[2], op.k[3]);
  return op;
}

// Lanes [lo, lo, hi, hi] and [lo, hi, lo, hi].
inline float32x4_t pair_outer(float lo, float hi) {
  return vcombine_f32(vdup_n_f32(lo), vdup_n_f32(hi));
}
inline float32x4_t pair_inner(float lo, float hi) {
  const float v[2] = {lo, hi};
  const float32x2_t p = vld1_f32(v);
  return vcombine_f32(p, p);
}

// out[r * out_stride + c] for NW weight rows x NX activation rows. Accumulator
// [p][q] holds the pairs (2p, 2q), (2p, 2q+1), (2p+1, 2q), (2p+1, 2q+1) of
// (weight row, activation row) in lanes 0..3; a missing odd row reuses the
// last one and its lanes are not stored.
template <class T, int NW, int NX>
LEVER_I8MM void tile_i8mm(const uint8_t* w, size_t w_stride, const uint8_t* x, size_t x_stride,
                          size_t n_blocks, float* out, size_t out_stride) {
  constexpr int kPW = (NW + 1) / 2, kPX = (NX + 1) / 2;
  float32x4_t acc[kPW][kPX];
  for (int p = 0; p < kPW; ++p) {
    for (int q = 0; q < kPX; ++q) acc[p][q] = vdupq_n_f32(0.0f);
  }
  for (size_t b = 0; b < n_blocks; ++b) {
    PairOperands wp[kPW];
    float32x4_t dw[kPW], m[kPW];
#pragma GCC unroll 2
    for (int p = 0; p < kPW; ++p) {
      const WeightBlock w0 = T::unpack(w + (2 * p) * w_stride + b * T::kBytes);
      const WeightBlock w1 = 2 * p + 1 < NW
                                 ? T::unpack(w + (2 * p + 1) * w_stride + b * T::kBytes)
                                 : w0;
      wp[p] = interleave_pair(w0.lo, w0.hi, w1.lo, w1.hi);
      dw[p] = pair_outer(w0.d, w1.d);
      m[p] = pair_outer(w0.m, w1.m);
    }
    const uint8_t* xb = x + b * kActBytes;
#pragma GCC unroll 8
    for (int q = 0; q < kPX; ++q) {
      const uint8_t* x0 = xb + (2 * q) * x_stride;
      const uint8_t* x1 = 2 * q + 1 < NX ? x0 + x_stride : x0;
      const ActBlock a0 = load_act(x0), a1 = load_act(x1);
      const PairOperands xp = interleave_pair(a0.lo, a0.hi, a1.lo, a1.hi);
      const float32x4_t dx = pair_inner(load_f32(x0 + kActD), load_f32(x1 + kActD));
      const float32x4_t xsum =
          T::kMin ? pair_inner(static_cast<float>(load_i32(x0 + kActSum)),
                               static_cast<float>(load_i32(x1 + kActSum)))
                  : vdupq_n_f32(0.0f);
#pragma GCC unroll 2
      for (int p = 0; p < kPW; ++p) {
        int32x4_t isum = vmmlaq_s32(vdupq_n_s32(0), wp[p].k[0], xp.k[0]);
        isum = vmmlaq_s32(isum, wp[p].k[1], xp.k[1]);
        isum = vmmlaq_s32(isum, wp[p].k[2], xp.k[2]);
        isum = vmmlaq_s32(isum, wp[p].k[3], xp.k[3]);
        acc[p][q] = add_block<T::kMin>(acc[p][q], dw[p], m[p], isum, dx, xsum);
      }
    }
  }
  for (int p = 0; p < kPW; ++p) {
    for (int q = 0; q < kPX; ++q) {
      float v[4];
      vst1q_f32(v, acc[p][q]);
      const int c = 2 * p, r = 2 * q;
      out[r * out_stride + c] = v[0];
      if (r + 1 < NX) out[(r + 1) * out_stride + c] = v[1];
      if (c + 1 < NW) out[r * out_stride + c + 1] = v[2];
      if (c + 1 < NW && r + 1 < NX) out[(r + 1) * out_stride + c + 1] = v[3];
    }
  }
}

// Sub-tile of the i8mm tile kernel: 2 weight-row pairs (8 registers of
// operands) x 4 activation-row pairs, 8 accumulators.
template <class T>
struct TileI8mm {
  static constexpr int kTW = 4, kTX = 8;
  template <int NW, int NX>
  static void run(const uint8_t* w, size_t w_stride, const uint8_t* x, size_t x_stride,
                  size_t n_blocks, float* out, size_t out_stride) {
    tile_i8mm<T, NW, NX>(w, w_stride, x, x_stride, n_blocks, out, out_stride);
  }
};

// ---------------------------------------------------------------------------
// Entry points by row count.

template <class T>
void dispatch_neon(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                   size_t n_blocks, float* out) {
  static_assert(kMaxDotRows == 8, "one case per row count below");
  // More than kMaxDotRows rows (not expected): 8 at a time.
  for (; n_x > 8; n_x -= 8, x += 8 * x_stride, out += 8) {
    rows_neon<T, 8>(w, x, x_stride, n_blocks, out);
  }
  switch (n_x) {
    case 1: return rows_neon<T, 1>(w, x, x_stride, n_blocks, out);
    case 2: return rows_neon<T, 2>(w, x, x_stride, n_blocks, out);
    case 3: return rows_neon<T, 3>(w, x, x_stride, n_blocks, out);
    case 4: return rows_neon<T, 4>(w, x, x_stride, n_blocks, out);
    case 5: return rows_neon<T, 5>(w, x, x_stride, n_blocks, out);
    case 6: return rows_neon<T, 6>(w, x, x_stride, n_blocks, out);
    case 7: return rows_neon<T, 7>(w, x, x_stride, n_blocks, out);
    case 8: return rows_neon<T, 8>(w, x, x_stride, n_blocks, out);
    default: break;
  }
}

template <class T>
void dispatch_dotprod(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                      size_t n_blocks, float* out) {
  static_assert(kMaxDotRows == 8, "one case per row count below");
  for (; n_x > 8; n_x -= 8, x += 8 * x_stride, out += 8) {
    tile_dotprod<T, 1, 8>(w, 0, x, x_stride, n_blocks, out, 1);
  }
  switch (n_x) {
    case 1: return tile_dotprod<T, 1, 1>(w, 0, x, x_stride, n_blocks, out, 1);
    case 2: return tile_dotprod<T, 1, 2>(w, 0, x, x_stride, n_blocks, out, 1);
    case 3: return tile_dotprod<T, 1, 3>(w, 0, x, x_stride, n_blocks, out, 1);
    case 4: return tile_dotprod<T, 1, 4>(w, 0, x, x_stride, n_blocks, out, 1);
    case 5: return tile_dotprod<T, 1, 5>(w, 0, x, x_stride, n_blocks, out, 1);
    case 6: return tile_dotprod<T, 1, 6>(w, 0, x, x_stride, n_blocks, out, 1);
    case 7: return tile_dotprod<T, 1, 7>(w, 0, x, x_stride, n_blocks, out, 1);
    case 8: return tile_dotprod<T, 1, 8>(w, 0, x, x_stride, n_blocks, out, 1);
    default: break;
  }
}

}  // namespace

#define LEVER_BLOCKS32_NEON(t, T)                                                              \
  void t##_neon(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,                  \
                size_t n_blocks, float* out) {                                                 \
    dispatch_neon<T>(w, x, x_stride, n_x, n_blocks, out);                                      \
  }                                                                                            \
  void t##_dotprod(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,               \
                   size_t n_blocks, float* out) {                                              \
    dispatch_dotprod<T>(w, x, x_stride, n_x, n_blocks, out);                                   \
  }                                                                                            \
  void t##_dotprod_tile(const uint8_t* w, size_t w_stride, int n_w, const uint8_t* x,          \
                        size_t x_stride, int n_x, size_t n_blocks, float* out,                 \
                        size_t out_stride) {                                                   \
    tile_detail::run_tile<TileDotprod<T>>(w, w_stride, n_w, x, x_stride, n_x, n_blocks, out,   \
                                          out_stride);                                         \
  }                                                                                            \
  void t##_i8mm_tile(const uint8_t* w, size_t w_stride, int n_w, const uint8_t* x,             \
                     size_t x_stride, int n_x, size_t n_blocks, float* out,                    \
                     size_t out_stride) {                                                      \
    tile_detail::run_tile<TileI8mm<T>>(w, w_stride, n_w, x, x_stride, n_x, n_blocks, out,      \
                                       out_stride);                                            \
  }

LEVER_BLOCKS32_NEON(q8_0, Q8_0)
LEVER_BLOCKS32_NEON(q5_0, Q5_0)
LEVER_BLOCKS32_NEON(q4_0, Q4_0)
LEVER_BLOCKS32_NEON(q4_1, Q4_1)

#undef LEVER_BLOCKS32_NEON

}  // namespace qdot
}  // namespace lever

#endif  // __aarch64__

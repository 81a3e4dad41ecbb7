// aarch64 i8mm (smmla) group kernels for repacked weights (see qdot_r8.h,
// repack.h). Empty on other architectures.
//
// vmmlaq_s32(acc, a, b) multiplies a 2x8 int8 matrix by an 8x2 one: with a =
// 8 bytes of activation rows p and p + 1, b = the same 8 bytes of weight rows
// c and c + 1, acc = [p.c, p.c+1, p+1.c, p+1.c+1] gains 32 products, twice
// what one sdot adds. The R8 layout holds 4 bytes of each of 8 weight rows
// per 32-byte word; two words t, t + 1 of rows 4h .. 4h+3 become the operands
// of row pairs (4h, 4h+1) and (4h+2, 4h+3) with one vzip1q_s32 / vzip2q_s32
// each. Activation rows are taken in pairs (an odd last row is paired with
// itself and the copy's results dropped), two pairs per pass.
//
// Each lane is one (activation row, weight row) pair and keeps the integer
// sums the scalar kernel makes for it (exact, any order); the scales, the
// K-quants' per-sub-block factors and the float steps are broadcast into the
// same lane order ("pair lanes" [c, c+1, c, c+1] for weight-row values,
// "activation lanes" [p, p, p+1, p+1] for activation-row values) and applied
// in the scalar kernels' order, one rounding per operation (neon_simd.h turns
// fp contraction off). Every result is bit-identical to the scalar kernel of
// the base type.

#if defined(__aarch64__)

#include "kernels/neon_simd.h"  // first: it switches fp contraction off

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/block_bytes.h"
#include "kernels/qdot.h"
#include "kernels/qdot_r8.h"
#include "kernels/qdot_r8_neon.h"
#include "kernels/repack.h"

namespace lever {
namespace r8 {
namespace i8mm {  // named: see rows_in_tiles (qdot_r8.h)
namespace {

// Activation rows per pass (two smmla pairs).
constexpr int kPairTile = 4;

// Words t and t + 1 of rows 4h .. 4h+3 (lane = row) -> the smmla operands of
// rows (4h, 4h+1) in `lo` and (4h+2, 4h+3) in `hi`: 8 bytes of each row.
LEVER_NEON_INLINE void row_pairs(int8x16_t wt, int8x16_t wt1, int8x16_t& lo, int8x16_t& hi) {
  const int32x4_t a = vreinterpretq_s32_s8(wt), b = vreinterpretq_s32_s8(wt1);
  lo = vreinterpretq_s8_s32(vzip1q_s32(a, b));
  hi = vreinterpretq_s8_s32(vzip2q_s32(a, b));
}

// 8 bytes at offset o of activation rows a and b: the first smmla operand.
LEVER_NEON_INLINE int8x16_t act_pair(const uint8_t* a, const uint8_t* b, size_t o) {
  return vcombine_s8(vld1_s8(reinterpret_cast<const int8_t*>(a + o)),
                     vld1_s8(reinterpret_cast<const int8_t*>(b + o)));
}

// Lanes [v[2q], v[2q+1], v[2q], v[2q+1]] of a rows vector (q = 0, 1).
LEVER_NEON_INLINE int32x4_t pair_lanes(int32x4_t v, int q) {
  const int64x2_t v64 = vreinterpretq_s64_s32(v);
  return vreinterpretq_s32_s64(q == 0 ? vdupq_laneq_s64(v64, 0) : vdupq_laneq_s64(v64, 1));
}
LEVER_NEON_INLINE float32x4_t pair_lanes(float32x4_t v, int q) {
  return vreinterpretq_f32_s32(pair_lanes(vreinterpretq_s32_f32(v), q));
}

// Activation lanes [a, a, b, b].
LEVER_NEON_INLINE float32x4_t act_lanes(float a, float b) {
  return vcombine_f32(vdup_n_f32(a), vdup_n_f32(b));
}
LEVER_NEON_INLINE int32x4_t act_lanes(int32_t a, int32_t b) {
  return vcombine_s32(vdup_n_s32(a), vdup_n_s32(b));
}

// The activation rows of a tile of NX rows, in pairs: pair P is rows 2P and
// 2P + 1, or row 2P twice when 2P + 1 == NX.
template <int NX>
struct ActPairs {
  static constexpr int kPairs = (NX + 1) / 2;
  const uint8_t* a[kPairs];
  const uint8_t* b[kPairs];
  ActPairs(const uint8_t* x, size_t x_stride, size_t block_offset) {
    for (int p = 0; p < kPairs; ++p) {
      a[p] = x + 2 * p * x_stride + block_offset;
      b[p] = 2 * p + 1 < NX ? a[p] + x_stride : a[p];
    }
  }
};

// What the K-quant tiles read of one activation pair's block: both rows'
// 16 bsums and their scales d in activation lanes.
struct PairSums {
  int16_t a[16], b[16];
  float32x4_t xd;
  PairSums(const uint8_t* xa, const uint8_t* xb) {
    std::memcpy(a, xa + kActBsums, sizeof a);
    std::memcpy(b, xb + kActBsums, sizeof b);
    xd = act_lanes(block_bytes::load_f32(xa + kActD), block_bytes::load_f32(xb + kActD));
  }
};

// acc[P][c] = 0 for every activation pair P and weight-row pair c.
template <int NP>
LEVER_NEON_INLINE void zero_pairs(float32x4_t (&acc)[NP][4]) {
  for (int p = 0; p < NP; ++p) {
    for (int c = 0; c < 4; ++c) acc[p][c] = vdupq_n_f32(0.0f);
  }
}

// acc[P][c] holds weight rows 2c, 2c + 1 against pair P (pair lanes order);
// writes them to out (row r at out + r * out_stride, 8 columns).
template <int NX>
LEVER_NEON_INLINE void store_pairs(const float32x4_t (&acc)[(NX + 1) / 2][4], float* out,
                                   size_t out_stride) {
  for (int p = 0; p < (NX + 1) / 2; ++p) {
    for (int c = 0; c < 4; ++c) {
      vst1_f32(out + 2 * p * out_stride + 2 * c, vget_low_f32(acc[p][c]));
      if (2 * p + 1 < NX) vst1_f32(out + (2 * p + 1) * out_stride + 2 * c, vget_high_f32(acc[p][c]));
    }
  }
}

// The scalar kernels' float step for a block, in pair lanes:
// acc + (d * xd) * isum.
LEVER_NEON_INLINE float32x4_t scaled_pair_update(float32x4_t acc, float32x4_t d, float32x4_t xd,
                                                 int32x4_t isum) {
  return vaddq_f32(acc, vmulq_f32(vmulq_f32(d, xd), vcvtq_f32_s32(isum)));
}

// -- Q4_K_R8 (layout in qdot_r8_neon_tiles.h / repack.h) --------------------------

template <int NX>
LEVER_I8MM void q4_k_tile(const uint8_t* w, const uint8_t* x, size_t x_stride, size_t n_blocks,
                          float* out, size_t out_stride) {
  constexpr int NP = (NX + 1) / 2;
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  float32x4_t acc[NP][4];
  zero_pairs(acc);
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * kQ4KGroupBlock;
    const ActPairs<NX> xs(x, x_stride, b * kActBytes);
    for (int h = 0; h < 2; ++h) {  // weight rows 4h .. 4h+3: row pairs 2h, 2h + 1
      int32x4_t sc[8], mn[8];
      q4k_scales(g, h, sc, mn);
      int32x4_t dot[NP][2];
      for (int p = 0; p < NP; ++p) dot[p][0] = dot[p][1] = vdupq_n_s32(0);
      for (int cc = 0; cc < 4; ++cc) {  // sub-blocks 2cc (low nibbles), 2cc + 1 (high)
        int32x4_t s_lo[NP][2], s_hi[NP][2];
        for (int p = 0; p < NP; ++p) s_lo[p][0] = s_lo[p][1] = s_hi[p][0] = s_hi[p][1] = vdupq_n_s32(0);
        for (int u = 0; u < 4; ++u) {  // words 8cc + 2u, 8cc + 2u + 1: values 8u .. 8u+7
          const uint8x16_t w0 = vreinterpretq_u8_s8(word_half(g + 128 + 32 * (8 * cc + 2 * u), h));
          const uint8x16_t w1 = vreinterpretq_u8_s8(word_half(g + 128 + 32 * (8 * cc + 2 * u + 1), h));
          int8x16_t lo[2], hi[2];
          row_pairs(vreinterpretq_s8_u8(vandq_u8(w0, low4)), vreinterpretq_s8_u8(vandq_u8(w1, low4)),
                    lo[0], lo[1]);
          row_pairs(vreinterpretq_s8_u8(vshrq_n_u8(w0, 4)), vreinterpretq_s8_u8(vshrq_n_u8(w1, 4)),
                    hi[0], hi[1]);
          for (int p = 0; p < NP; ++p) {
            const size_t o = kActQs + 64 * cc + 8 * u;
            const int8x16_t x_lo = act_pair(xs.a[p], xs.b[p], o);
            const int8x16_t x_hi = act_pair(xs.a[p], xs.b[p], o + 32);
            for (int c = 0; c < 2; ++c) {
              s_lo[p][c] = vmmlaq_s32(s_lo[p][c], x_lo, lo[c]);
              s_hi[p][c] = vmmlaq_s32(s_hi[p][c], x_hi, hi[c]);
            }
          }
        }
        for (int p = 0; p < NP; ++p) {
          for (int c = 0; c < 2; ++c) {
            dot[p][c] = vmlaq_s32(vmlaq_s32(dot[p][c], s_lo[p][c], pair_lanes(sc[2 * cc], c)),
                                  s_hi[p][c], pair_lanes(sc[2 * cc + 1], c));
          }
        }
      }
      const float32x4_t d = halves4(g, h), dmin = halves4(g + 16, h);
      for (int p = 0; p < NP; ++p) {
        const PairSums x2(xs.a[p], xs.b[p]);
        for (int c = 0; c < 2; ++c) {
          int32x4_t offs = vdupq_n_s32(0);
          for (int j = 0; j < 8; ++j) {
            offs = vmlaq_s32(offs, pair_lanes(mn[j], c),
                             act_lanes(x2.a[2 * j] + x2.a[2 * j + 1], x2.b[2 * j] + x2.b[2 * j + 1]));
          }
          const float32x4_t t =
              vsubq_f32(vmulq_f32(vmulq_f32(pair_lanes(d, c), x2.xd), vcvtq_f32_s32(dot[p][c])),
                        vmulq_f32(vmulq_f32(pair_lanes(dmin, c), x2.xd), vcvtq_f32_s32(offs)));
          acc[p][2 * h + c] = vaddq_f32(acc[p][2 * h + c], t);
        }
      }
    }
  }
  store_pairs<NX>(acc, out, out_stride);
}

// -- Q6_K_R8 ---------------------------------------------------------------------

template <int NX>
LEVER_I8MM void q6_k_tile(const uint8_t* w, const uint8_t* x, size_t x_stride, size_t n_blocks,
                          float* out, size_t out_stride) {
  constexpr int NP = (NX + 1) / 2;
  const uint8x16_t low4 = vdupq_n_u8(0x0F), three = vdupq_n_u8(3);
  float32x4_t acc[NP][4];
  zero_pairs(acc);
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * kQ6KGroupBlock;
    const ActPairs<NX> xs(x, x_stride, b * kActBytes);
    for (int h = 0; h < 2; ++h) {  // weight rows 4h .. 4h+3
      int32x4_t sc[16];
      q6k_scales(g, h, sc);
      int32x4_t dot[NP][2];
      for (int p = 0; p < NP; ++p) dot[p][0] = dot[p][1] = vdupq_n_s32(0);
      for (int hv = 0; hv < 2; ++hv) {  // values 128 hv + 32 s + l
        for (int s = 0; s < 4; ++s) {
          const int8x16_t down = vdupq_n_s8(static_cast<int8_t>(-2 * s));
          for (int half = 0; half < 2; ++half) {  // group 8 hv + 2 s + half: 4 words
            int32x4_t gsum[NP][2];
            for (int p = 0; p < NP; ++p) gsum[p][0] = gsum[p][1] = vdupq_n_s32(0);
            for (int k2 = 0; k2 < 2; ++k2) {  // words 2 k2, 2 k2 + 1 of the group
              int8x16_t q[2];
              for (int e = 0; e < 2; ++e) {
                const int k = 2 * k2 + e;
                const uint8x16_t ql = vreinterpretq_u8_s8(word_half(g + 32 * (16 * hv + 8 * (s % 2) + 4 * half + k), h));
                const uint8x16_t qh = vreinterpretq_u8_s8(word_half(g + 1024 + 32 * (8 * hv + 4 * half + k), h));
                const uint8x16_t lo = s < 2 ? vandq_u8(ql, low4) : vshrq_n_u8(ql, 4);
                const uint8x16_t hi = vshlq_n_u8(vandq_u8(vshlq_u8(qh, down), three), 4);
                q[e] = vreinterpretq_s8_u8(vorrq_u8(lo, hi));
              }
              int8x16_t wp[2];
              row_pairs(q[0], q[1], wp[0], wp[1]);
              for (int p = 0; p < NP; ++p) {
                const int8x16_t xv = act_pair(xs.a[p], xs.b[p], kActQs + 128 * hv + 32 * s + 16 * half + 8 * k2);
                gsum[p][0] = vmmlaq_s32(gsum[p][0], xv, wp[0]);
                gsum[p][1] = vmmlaq_s32(gsum[p][1], xv, wp[1]);
              }
            }
            const int32x4_t scale = sc[8 * hv + 2 * s + half];
            for (int p = 0; p < NP; ++p) {
              for (int c = 0; c < 2; ++c) dot[p][c] = vmlaq_s32(dot[p][c], gsum[p][c], pair_lanes(scale, c));
            }
          }
        }
      }
      const float32x4_t d = halves4(g + 1664, h);
      for (int p = 0; p < NP; ++p) {
        const PairSums x2(xs.a[p], xs.b[p]);
        for (int c = 0; c < 2; ++c) {
          int32x4_t offs = vdupq_n_s32(0);
          for (int gi = 0; gi < 16; ++gi) {
            offs = vmlaq_s32(offs, pair_lanes(sc[gi], c), act_lanes(int32_t{x2.a[gi]}, int32_t{x2.b[gi]}));
          }
          acc[p][2 * h + c] = scaled_pair_update(acc[p][2 * h + c], pair_lanes(d, c), x2.xd,
                                                 vsubq_s32(dot[p][c], vshlq_n_s32(offs, 5)));
        }
      }
    }
  }
  store_pairs<NX>(acc, out, out_stride);
}

// -- Q8_0_R8 ---------------------------------------------------------------------

template <int NX>
LEVER_I8MM void q8_0_tile(const uint8_t* w, const uint8_t* x, size_t x_stride, size_t n_blocks,
                          float* out, size_t out_stride) {
  constexpr int NP = (NX + 1) / 2;
  float32x4_t acc[NP][4];
  zero_pairs(acc);
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * kQ8_0GroupBlock;
    const ActPairs<NX> xs(x, x_stride, b * kAct32Bytes);
    for (int h = 0; h < 2; ++h) {
      int8x16_t wp[4][2];  // words 2j, 2j + 1 (values 8j .. 8j+7), row pairs 2h, 2h + 1
      for (int j = 0; j < 4; ++j) {
        row_pairs(word_half(g + 16 + 32 * (2 * j), h), word_half(g + 16 + 32 * (2 * j + 1), h),
                  wp[j][0], wp[j][1]);
      }
      const float32x4_t d = halves4(g, h);
      for (int p = 0; p < NP; ++p) {
        int32x4_t isum[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int j = 0; j < 4; ++j) {
          const int8x16_t xv = act_pair(xs.a[p], xs.b[p], kAct32Qs + 8 * j);
          for (int c = 0; c < 2; ++c) isum[c] = vmmlaq_s32(isum[c], xv, wp[j][c]);
        }
        const float32x4_t vxd = act_lanes(block_bytes::load_f32(xs.a[p] + kAct32D),
                                          block_bytes::load_f32(xs.b[p] + kAct32D));
        for (int c = 0; c < 2; ++c) {
          acc[p][2 * h + c] = scaled_pair_update(acc[p][2 * h + c], pair_lanes(d, c), vxd, isum[c]);
        }
      }
    }
  }
  store_pairs<NX>(acc, out, out_stride);
}

// -- Q5_0_R8, Q4_0_R8, Q4_1_R8 --------------------------------------------------------

template <class T, int NX>
LEVER_I8MM void nibbles_tile(const uint8_t* w, const uint8_t* x, size_t x_stride, size_t n_blocks,
                             float* out, size_t out_stride) {
  constexpr int NP = (NX + 1) / 2;
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  float32x4_t acc[NP][4];
  zero_pairs(acc);
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * T::kGroupBlock;
    const ActPairs<NX> xs(x, x_stride, b * kAct32Bytes);
    for (int h = 0; h < 2; ++h) {
      // Words t (t < 4): low nibbles are values 4t .. 4t+3, high ones 16 + 4t ..
      int8x16_t q[8];  // q[t]: low nibbles of word t, q[4 + t]: high nibbles
      const uint32x4_t qh = vld1q_u32(reinterpret_cast<const uint32_t*>(g + 16) + 4 * h);  // Q5_0 only
      for (int t = 0; t < 4; ++t) {
        const uint8x16_t qs = vreinterpretq_u8_s8(word_half(g + T::kQs + 32 * t, h));
        uint8x16_t l = vandq_u8(qs, low4), u = vshrq_n_u8(qs, 4);
        if constexpr (T::kHighBit) {
          l = vorrq_u8(l, fifth_bits(qh, 4 * t));
          u = vorrq_u8(u, fifth_bits(qh, 16 + 4 * t));
        }
        q[t] = vreinterpretq_s8_u8(l);
        q[4 + t] = vreinterpretq_s8_u8(u);
      }
      int8x16_t wp[4][2];  // values 8j .. 8j+7: words 2j, 2j + 1 of q
      for (int j = 0; j < 4; ++j) row_pairs(q[2 * j], q[2 * j + 1], wp[j][0], wp[j][1]);
      const float32x4_t d = halves4(g, h);
      for (int p = 0; p < NP; ++p) {
        int32x4_t isum[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int j = 0; j < 4; ++j) {
          const int8x16_t xv = act_pair(xs.a[p], xs.b[p], kAct32Qs + 8 * j);
          for (int c = 0; c < 2; ++c) isum[c] = vmmlaq_s32(isum[c], xv, wp[j][c]);
        }
        int32_t xsum_a, xsum_b;
        std::memcpy(&xsum_a, xs.a[p] + kAct32Sum, 4);
        std::memcpy(&xsum_b, xs.b[p] + kAct32Sum, 4);
        const float32x4_t vdx = act_lanes(block_bytes::load_f32(xs.a[p] + kAct32D),
                                          block_bytes::load_f32(xs.b[p] + kAct32D));
        for (int c = 0; c < 2; ++c) {
          float32x4_t& a = acc[p][2 * h + c];
          if constexpr (T::kMin) {
            const float32x4_t m = pair_lanes(halves4(g + 16, h), c);
            const float32x4_t t = vaddq_f32(
                vmulq_f32(pair_lanes(d, c), vcvtq_f32_s32(isum[c])),
                vmulq_f32(m, act_lanes(static_cast<float>(xsum_a), static_cast<float>(xsum_b))));
            a = vaddq_f32(a, vmulq_f32(vdx, t));
          } else {
            a = scaled_pair_update(a, pair_lanes(d, c), vdx,
                                   vsubq_s32(isum[c], act_lanes(T::kOffset * xsum_a, T::kOffset * xsum_b)));
          }
        }
      }
    }
  }
  store_pairs<NX>(acc, out, out_stride);
}

template <int NX> struct Q4K { static constexpr TileFn fn = q4_k_tile<NX>; };
template <int NX> struct Q6K { static constexpr TileFn fn = q6_k_tile<NX>; };
template <int NX> struct Q8_0 { static constexpr TileFn fn = q8_0_tile<NX>; };
template <int NX> struct Q5_0 { static constexpr TileFn fn = nibbles_tile<Q5_0R8, NX>; };
template <int NX> struct Q4_0 { static constexpr TileFn fn = nibbles_tile<Q4_0R8, NX>; };
template <int NX> struct Q4_1 { static constexpr TileFn fn = nibbles_tile<Q4_1R8, NX>; };

}  // namespace
}  // namespace i8mm

DotGroupFn i8mm_group_kernel(int type) {
  return group_kernel_of<i8mm::kPairTile, i8mm::Q4K, i8mm::Q6K, i8mm::Q8_0, i8mm::Q5_0, i8mm::Q4_0, i8mm::Q4_1>(type);
}

}  // namespace r8
}  // namespace lever

#endif  // __aarch64__

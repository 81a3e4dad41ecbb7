// The tile kernels of the aarch64 R8 group kernels (qdot_r8.h, repack.h),
// shared by two translation units that differ only in how a 4-byte dot
// product is done:
//   qdot_r8_neon.cpp   sdot (vdotq_laneq_s32), LEVER_R8_TARGET = LEVER_DOTPROD;
//   qdot_r8_asimd.cpp  plain armv8.0 ASIMD (widening multiplies, pairwise
//                      adds), LEVER_R8_TARGET empty.
// The includer defines LEVER_R8_TARGET and, inside lever::r8::{anonymous},
//   int32x4_t dot4(int32x4_t acc, const int8x16_t (&w)[4], int8x16_t x):
//   acc + per lane i, sum over k < 4 of (4 bytes of w[k] lane i) . (word k of x),
// then includes this file inside lever::r8::{anonymous}; the plain helpers
// (loads, scales, float steps) are in qdot_r8_neon.h. Everything here is
// then that unit's own copy (internal linkage).
//
// The R8 layout puts 4 bytes of each of a group's 8 weight rows in one
// 32-byte word: two 128-bit vectors, rows 0..3 and rows 4..7, lane = weight
// row. Per block, for each (weight row, activation row) pair, the integer
// sums are the scalar kernels' (exact, any order):
//   Q4_K: s_j = sum over sub-block j of q x, dot = sum_j sc_j s_j (mla);
//         offs = sum_j m_j (bsums[2j] + bsums[2j+1])
//   Q6_K: s_g over each 16-value group, dot = sum_g sc_g s_g,
//         isum = dot - 32 sum_g sc_g bsums[g]
//   Q8_0: signed weights times signed activations
//   Q5_0, Q4_0, Q4_1: unsigned q; isum = sum q x - offset x.sum
// and the float steps are the scalar ones, lane-wise, in the same order (no
// fused multiply-add: neon_simd.h turns contraction off). Every result is
// bit-identical to the scalar kernel of the base type. Activation rows are
// taken 4 at a time (the 32 registers hold 4 rows' sums for both row halves).
//
// No include guard and no #pragma once: each including unit needs its copy.

// -- Q4_K_R8 -------------------------------------------------------------------
// Group-block (1152 bytes): d [0, 16), dmin [16, 32), scale words a, b, c at
// 32, 64, 96, qs word t at 128 + 32 t (repack.h).

template <int NX>
LEVER_R8_TARGET void q4_k_tile(const uint8_t* w, const uint8_t* x, size_t x_stride, size_t n_blocks,
                               float* out, size_t out_stride) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  float32x4_t acc[NX][2];
  for (int r = 0; r < NX; ++r) acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * kQ4KGroupBlock;
    const uint8_t* xb[NX];
    for (int r = 0; r < NX; ++r) xb[r] = x + r * x_stride + b * kActBytes;
    for (int h = 0; h < 2; ++h) {
      int32x4_t sc[8], mn[8];
      q4k_scales(g, h, sc, mn);
      int32x4_t dot[NX];
      for (int r = 0; r < NX; ++r) dot[r] = vdupq_n_s32(0);
      for (int cc = 0; cc < 4; ++cc) {  // sub-blocks 2cc (low nibbles), 2cc + 1 (high)
        int32x4_t s_lo[NX], s_hi[NX];
        for (int r = 0; r < NX; ++r) s_lo[r] = s_hi[r] = vdupq_n_s32(0);
        for (int u4 = 0; u4 < 2; ++u4) {  // words 8cc + 4u4 .. + 3
          int8x16_t lo[4], hi[4];
          for (int k = 0; k < 4; ++k) {
            const uint8x16_t wv = vreinterpretq_u8_s8(word_half(g + 128 + 32 * (8 * cc + 4 * u4 + k), h));
            lo[k] = vreinterpretq_s8_u8(vandq_u8(wv, low4));
            hi[k] = vreinterpretq_s8_u8(vshrq_n_u8(wv, 4));
          }
          for (int r = 0; r < NX; ++r) {
            const uint8_t* xq = xb[r] + kActQs + 64 * cc + 16 * u4;
            s_lo[r] = dot4(s_lo[r], lo, act16(xq));
            s_hi[r] = dot4(s_hi[r], hi, act16(xq + 32));
          }
        }
        for (int r = 0; r < NX; ++r) {
          dot[r] = vmlaq_s32(vmlaq_s32(dot[r], s_lo[r], sc[2 * cc]), s_hi[r], sc[2 * cc + 1]);
        }
      }
      const float32x4_t d = halves4(g, h), dmin = halves4(g + 16, h);
      for (int r = 0; r < NX; ++r) {
        int16_t bs[16];
        std::memcpy(bs, xb[r] + kActBsums, sizeof bs);
        int32x4_t offs = vdupq_n_s32(0);
        for (int j = 0; j < 8; ++j) offs = vmlaq_n_s32(offs, mn[j], bs[2 * j] + bs[2 * j + 1]);
        const float32x4_t vxd = vdupq_n_f32(block_bytes::load_f32(xb[r] + kActD));
        const float32x4_t t = vsubq_f32(vmulq_f32(vmulq_f32(d, vxd), vcvtq_f32_s32(dot[r])),
                                        vmulq_f32(vmulq_f32(dmin, vxd), vcvtq_f32_s32(offs)));
        acc[r][h] = vaddq_f32(acc[r][h], t);
      }
    }
  }
  for (int r = 0; r < NX; ++r) {
    vst1q_f32(out + r * out_stride, acc[r][0]);
    vst1q_f32(out + r * out_stride + 4, acc[r][1]);
  }
}

// -- Q6_K_R8 -------------------------------------------------------------------
// Group-block (1680 bytes): ql word t at 32 t, qh word v at 1024 + 32 v,
// scale bytes 2p, 2p + 1 of row r at 1536 + 16 p + 2 r, d at 1664.

template <int NX>
LEVER_R8_TARGET void q6_k_tile(const uint8_t* w, const uint8_t* x, size_t x_stride, size_t n_blocks,
                               float* out, size_t out_stride) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F), three = vdupq_n_u8(3);
  float32x4_t acc[NX][2];
  for (int r = 0; r < NX; ++r) acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * kQ6KGroupBlock;
    const uint8_t* xb[NX];
    for (int r = 0; r < NX; ++r) xb[r] = x + r * x_stride + b * kActBytes;
    for (int h = 0; h < 2; ++h) {  // weight rows 4h .. 4h + 3
      int32x4_t sc[16];
      q6k_scales(g, h, sc);
      int32x4_t dot[NX];
      for (int r = 0; r < NX; ++r) dot[r] = vdupq_n_s32(0);
      for (int hv = 0; hv < 2; ++hv) {  // values 128 hv + 32 s + l
        for (int s = 0; s < 4; ++s) {
          const int8x16_t down = vdupq_n_s8(static_cast<int8_t>(-2 * s));
          for (int half = 0; half < 2; ++half) {  // group 8 hv + 2 s + half: 4 words
            int8x16_t q[4];
            for (int k = 0; k < 4; ++k) {
              const uint8x16_t ql = vreinterpretq_u8_s8(word_half(g + 32 * (16 * hv + 8 * (s % 2) + 4 * half + k), h));
              const uint8x16_t qh = vreinterpretq_u8_s8(word_half(g + 1024 + 32 * (8 * hv + 4 * half + k), h));
              const uint8x16_t lo = s < 2 ? vandq_u8(ql, low4) : vshrq_n_u8(ql, 4);
              const uint8x16_t hi = vshlq_n_u8(vandq_u8(vshlq_u8(qh, down), three), 4);
              q[k] = vreinterpretq_s8_u8(vorrq_u8(lo, hi));
            }
            const int32x4_t scale = sc[8 * hv + 2 * s + half];
            for (int r = 0; r < NX; ++r) {
              const uint8_t* xq = xb[r] + kActQs + 128 * hv + 32 * s + 16 * half;
              dot[r] = vmlaq_s32(dot[r], dot4(vdupq_n_s32(0), q, act16(xq)), scale);
            }
          }
        }
      }
      const float32x4_t d = halves4(g + 1664, h);
      for (int r = 0; r < NX; ++r) {
        int16_t bs[16];
        std::memcpy(bs, xb[r] + kActBsums, sizeof bs);
        int32x4_t offs = vdupq_n_s32(0);
        for (int gi = 0; gi < 16; ++gi) offs = vmlaq_n_s32(offs, sc[gi], bs[gi]);
        acc[r][h] = scaled_update(acc[r][h], d, block_bytes::load_f32(xb[r] + kActD),
                                  vsubq_s32(dot[r], vshlq_n_s32(offs, 5)));
      }
    }
  }
  for (int r = 0; r < NX; ++r) {
    vst1q_f32(out + r * out_stride, acc[r][0]);
    vst1q_f32(out + r * out_stride + 4, acc[r][1]);
  }
}

// -- the 32-value block types ----------------------------------------------------
// Q8_0_R8 (272 bytes): d [0, 16), qs word t (t < 8) at 16 + 32 t.
// Q4_0_R8 / Q5_0_R8 / Q4_1_R8: d [0, 16); qs word t (t < 4) at kQs + 32 t
// (low nibbles: elements 4t .. 4t+3, high: 16 + 4t ..); Q5_0's qh of row r at
// 16 + 4 r; Q4_1's fp16 m at [16, 32).


template <int NX>
LEVER_R8_TARGET void q8_0_tile(const uint8_t* w, const uint8_t* x, size_t x_stride, size_t n_blocks,
                               float* out, size_t out_stride) {
  float32x4_t acc[NX][2];
  for (int r = 0; r < NX; ++r) acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * kQ8_0GroupBlock;
    for (int h = 0; h < 2; ++h) {
      int8x16_t q0[4], q1[4];
      for (int k = 0; k < 4; ++k) {
        q0[k] = word_half(g + 16 + 32 * k, h);
        q1[k] = word_half(g + 16 + 32 * (4 + k), h);
      }
      const float32x4_t d = halves4(g, h);
      for (int r = 0; r < NX; ++r) {
        const uint8_t* xb = x + r * x_stride + b * kAct32Bytes;
        const int32x4_t isum = dot4(dot4(vdupq_n_s32(0), q0, act16(xb + kAct32Qs)), q1, act16(xb + kAct32Qs + 16));
        acc[r][h] = scaled_update(acc[r][h], d, block_bytes::load_f32(xb + kAct32D), isum);
      }
    }
  }
  for (int r = 0; r < NX; ++r) {
    vst1q_f32(out + r * out_stride, acc[r][0]);
    vst1q_f32(out + r * out_stride + 4, acc[r][1]);
  }
}

template <class T, int NX>
LEVER_R8_TARGET void nibbles_tile(const uint8_t* w, const uint8_t* x, size_t x_stride, size_t n_blocks,
                                  float* out, size_t out_stride) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  float32x4_t acc[NX][2];
  for (int r = 0; r < NX; ++r) acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* g = w + b * T::kGroupBlock;
    for (int h = 0; h < 2; ++h) {
      int8x16_t lo[4], hi[4];  // elements 4t .. 4t+3 / 16 + 4t .. of rows 4h .. 4h+3
      const uint32x4_t qh = vld1q_u32(reinterpret_cast<const uint32_t*>(g + 16) + 4 * h);  // Q5_0 only
      for (int t = 0; t < 4; ++t) {
        uint8x16_t qs = vreinterpretq_u8_s8(word_half(g + T::kQs + 32 * t, h));
        uint8x16_t l = vandq_u8(qs, low4), u = vshrq_n_u8(qs, 4);
        if constexpr (T::kHighBit) {
          l = vorrq_u8(l, fifth_bits(qh, 4 * t));
          u = vorrq_u8(u, fifth_bits(qh, 16 + 4 * t));
        }
        lo[t] = vreinterpretq_s8_u8(l);
        hi[t] = vreinterpretq_s8_u8(u);
      }
      const float32x4_t d = halves4(g, h);
      for (int r = 0; r < NX; ++r) {
        const uint8_t* xb = x + r * x_stride + b * kAct32Bytes;
        const int32x4_t isum = dot4(dot4(vdupq_n_s32(0), lo, act16(xb + kAct32Qs)), hi, act16(xb + kAct32Qs + 16));
        int32_t xsum;
        std::memcpy(&xsum, xb + kAct32Sum, 4);
        const float dx = block_bytes::load_f32(xb + kAct32D);
        if constexpr (T::kMin) {
          const float32x4_t m = halves4(g + 16, h);
          const float32x4_t t = vaddq_f32(vmulq_f32(d, vcvtq_f32_s32(isum)),
                                          vmulq_f32(m, vdupq_n_f32(static_cast<float>(xsum))));
          acc[r][h] = vaddq_f32(acc[r][h], vmulq_f32(vdupq_n_f32(dx), t));
        } else {
          acc[r][h] = scaled_update(acc[r][h], d, dx, vsubq_s32(isum, vdupq_n_s32(T::kOffset * xsum)));
        }
      }
    }
  }
  for (int r = 0; r < NX; ++r) {
    vst1q_f32(out + r * out_stride, acc[r][0]);
    vst1q_f32(out + r * out_stride + 4, acc[r][1]);
  }
}

template <int NX> struct Q4K { static constexpr TileFn fn = q4_k_tile<NX>; };
template <int NX> struct Q6K { static constexpr TileFn fn = q6_k_tile<NX>; };
template <int NX> struct Q8_0 { static constexpr TileFn fn = q8_0_tile<NX>; };
template <int NX> struct Q5_0 { static constexpr TileFn fn = nibbles_tile<Q5_0R8, NX>; };
template <int NX> struct Q4_0 { static constexpr TileFn fn = nibbles_tile<Q4_0R8, NX>; };
template <int NX> struct Q4_1 { static constexpr TileFn fn = nibbles_tile<Q4_1R8, NX>; };

// Helpers of the aarch64 R8 group kernels (qdot_r8_neon_tiles.h for sdot and
// baseline ASIMD, qdot_r8_i8mm.cpp for smmla): loads of the repacked fields
// (repack.h), the K-quants' scales decoded per lane, and the scalar kernels'
// float step. Plain ASIMD only, so they inline into any of those units.
// Lane r of a "rows" vector is weight row 4h + r of the group (h = 0, 1).
#pragma once

#if defined(__aarch64__)

#include "kernels/neon_simd.h"

#include <cstddef>
#include <cstdint>

namespace lever {
namespace r8 {

// Rows 0..3 (h = 0) or 4..7 (h = 1) of a 32-byte word.
LEVER_NEON_INLINE int8x16_t word_half(const uint8_t* word, int h) {
  return vreinterpretq_s8_u8(vld1q_u8(word + 16 * h));
}

// Four fp16 values (rows 4h .. 4h+3) as fp32 (exact).
LEVER_NEON_INLINE float32x4_t halves4(const uint8_t* p, int h) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p) + 4 * h)));
}

LEVER_NEON_INLINE int8x16_t act16(const uint8_t* p) { return vld1q_s8(reinterpret_cast<const int8_t*>(p)); }

// The scalar kernels' float steps per block, lane-wise.
LEVER_NEON_INLINE float32x4_t scaled_update(float32x4_t acc, float32x4_t d, float xd, int32x4_t isum) {
  return vaddq_f32(acc, vmulq_f32(vmulq_f32(d, vdupq_n_f32(xd)), vcvtq_f32_s32(isum)));
}

// Q4_K_R8 group-block g: the 6-bit scales sc[j] and mins mn[j] (sub-block
// j < 8) of rows 4h .. 4h+3, one int32 per lane (as the scalar unpack_q4k_scales).
LEVER_NEON_INLINE void q4k_scales(const uint8_t* g, int h, int32x4_t (&sc)[8], int32x4_t (&mn)[8]) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F), low6 = vdupq_n_u8(0x3F), bits45 = vdupq_n_u8(0x30);
  // Byte j of sc_lo / sc_hi is sub-block j / j + 4.
  const uint8x16_t a = vld1q_u8(g + 32 + 16 * h), bw = vld1q_u8(g + 64 + 16 * h),
                   c = vld1q_u8(g + 96 + 16 * h);
  const uint32x4_t sc_lo = vreinterpretq_u32_u8(vandq_u8(a, low6));
  const uint32x4_t mn_lo = vreinterpretq_u32_u8(vandq_u8(bw, low6));
  const uint32x4_t sc_hi = vreinterpretq_u32_u8(vorrq_u8(
      vandq_u8(c, low4), vandq_u8(vreinterpretq_u8_u32(vshrq_n_u32(vreinterpretq_u32_u8(a), 2)), bits45)));
  const uint32x4_t mn_hi = vreinterpretq_u32_u8(vorrq_u8(
      vandq_u8(vreinterpretq_u8_u32(vshrq_n_u32(vreinterpretq_u32_u8(c), 4)), low4),
      vandq_u8(vreinterpretq_u8_u32(vshrq_n_u32(vreinterpretq_u32_u8(bw), 2)), bits45)));
  for (int j = 0; j < 8; ++j) {
    const int32x4_t shift = vdupq_n_s32(-8 * (j % 4));
    const uint32x4_t byte = vdupq_n_u32(0xFF);
    sc[j] = vreinterpretq_s32_u32(vandq_u32(vshlq_u32(j < 4 ? sc_lo : sc_hi, shift), byte));
    mn[j] = vreinterpretq_s32_u32(vandq_u32(vshlq_u32(j < 4 ? mn_lo : mn_hi, shift), byte));
  }
}

// Q6_K_R8 group-block g: the scale sc[gi] of each 16-value group gi < 16 of
// rows 4h .. 4h+3, one int32 per lane.
LEVER_NEON_INLINE void q6k_scales(const uint8_t* g, int h, int32x4_t (&sc)[16]) {
  // Pair p holds groups 2p and 2p + 1 as the two int16 of each row's lane.
  for (int p = 0; p < 8; ++p) {
    const int32x4_t pair = vreinterpretq_s32_s16(vmovl_s8(vld1_s8(
        reinterpret_cast<const int8_t*>(g + 1536 + 16 * p + 8 * h))));
    sc[2 * p] = vshrq_n_s32(vshlq_n_s32(pair, 16), 16);
    sc[2 * p + 1] = vshrq_n_s32(pair, 16);
  }
}

// Q5_0's 5th bits for word t of rows 4h..4h+3: byte i of lane r is 0x10 if bit
// `first + i` of row r's qh is set (first = 4t for the low nibbles, 16 + 4t
// for the high ones).
LEVER_NEON_INLINE uint8x16_t fifth_bits(uint32x4_t qh, int first) {
  const uint32x4_t nib = vandq_u32(vshlq_u32(qh, vdupq_n_s32(-first)), vdupq_n_u32(0xF));
  const uint8x16_t spread = vreinterpretq_u8_u32(vmulq_n_u32(nib, 0x01010101u));
  const uint8x16_t set = vtstq_u8(spread, vreinterpretq_u8_u32(vdupq_n_u32(0x08040201u)));
  return vandq_u8(set, vdupq_n_u8(0x10));
}

}  // namespace r8
}  // namespace lever

#endif  // __aarch64__

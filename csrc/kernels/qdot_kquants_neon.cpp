// aarch64 dot kernels for the K-quant weight types Q4_K and Q6_K against
// ActQ8K activations (interface and formats: qdot.h; block layouts and the
// scalar reference: qdot_kquants.cpp). Empty on other architectures.
//
// Bit-exactness. Every path computes, for each (weight row, activation row)
// pair and each 256-value block b, the same two things as the scalar path:
//   1. Two exact integers:
//        dot  = sum over the 256 values of sc_g * q[i] * x.qs[i]
//        offs = Q4_K: sum_j m_j * (bsums[2j] + bsums[2j+1])   (8 sub-blocks j)
//               Q6_K: sum_g sc_g * bsums[g]                    (16 groups g)
//      (q: Q4_K 0..15, Q6_K 0..63, unsigned values that are also valid signed
//      int8; sc_g: the scale of the group of value i, Q4_K 0..63 per 32
//      values, Q6_K -128..127 per 16 values; |x.qs| <= 127.) Integer adds are
//      exact whatever their order, as long as nothing overflows; the bounds
//      are given at each step below (worst case |x.qs| = 128).
//   2. The fp32 update of that pair's accumulator with the scalar path's
//      operations in its order, one rounding each:
//        Q4_K: acc += (d * xd) * float(dot) - (dmin * xd) * float(offs)
//        Q6_K: acc += (d * xd) * float(dot - 32 * offs)
//      with d, dmin from the fp16 fields through block_bytes::half_to_float
//      (exact), blocks in order b = 0, 1, ... from acc = 0, and out = acc.
//      No fused multiply-add anywhere (neon_simd.h turns contraction off).
// So every result is bit-identical to q4_k_scalar / q6_k_scalar whatever n_x,
// n_w, the tiling or the pair's place in a tile.
//
// Loop structure (all paths). A block is walked in 8 slices of 32 values
// (slice k = values 32k .. 32k+31: one Q4_K sub-block, two Q6_K groups). For
// each slice the weight rows' values are unpacked once into int8x16 pairs
// (values 0..15 and 16..31 of the slice), each activation row's 32 bytes are
// loaded once, and every (weight row, activation row) pair adds
// sc_g * (its group dot products) to its own int32x4 accumulator. After the 8
// slices, each pair's accumulator is summed to `dot`, `offs` is computed from
// the activation bsums, and the fp32 step runs.
//
// Integer step per slice and pair:
//   neon (baseline ASIMD): smull/smlal2 multiply 8 byte pairs into int16
//     lanes. Q4_K: 4 products per lane per sub-block (|.| <= 4*15*128 = 7680);
//     Q6_K: 2 per lane per group (|.| <= 2*63*128 = 16128); both < 2^15. Then
//     smlal/smlal2 by the int16 scale into int32 lanes (|lane| <= 66e6).
//   dotprod (sdot, armv8.2-a): vdotq_s32 adds 4 byte products per int32
//     lane (Q4_K two sdot per sub-block, Q6_K one per group), then the lanes
//     are multiplied by the scale and added (mla) to the accumulator.
//   i8mm (smmla, armv8.6-a; tile kernel only): vmmlaq_s32 multiplies a 2x8
//     int8 matrix by an 8x2 one into a 2x2 int32 block. Weight rows go in
//     pairs (c0, c1) and activation rows in pairs (r0, r1), 8 values of each
//     row per operand (neon::zip_rows); the accumulator lanes are the pairs
//     (c0,r0), (c0,r1), (c1,r0), (c1,r1). Q4_K: 4 smmla per sub-block
//     (|lane| <= 32*15*128), Q6_K: 2 per group (<= 16*63*128), each then
//     times the lane's scale (mla). An odd row count is padded with a copy of
//     the last row, whose results are dropped. Its fp32 step runs on the 4
//     lanes at once (vmulq/vsubq/vaddq: per lane the scalar operations).
// The whole-block bounds: |dot| <= 256*15*128*63 < 2^25 (Q4_K), <=
// 256*63*128*128 < 2^29 (Q6_K); |offs| <= 8*63*4096 < 2^21 (Q4_K), <=
// 16*128*2048 < 2^23 (Q6_K, so |dot - 32 offs| < 2^30): no int32 overflows.
//
// Tables (qdot.cpp): kNeon rows = *_neon; kDotprod and kI8mm rows = *_dotprod;
// tiles: kDotprod = *_dotprod_tile, kI8mm = *_i8mm_tile.

#if defined(__aarch64__)

#include "kernels/neon_simd.h"  // first: it switches fp contraction off

#include <cstddef>
#include <cstdint>

#include "kernels/block_bytes.h"
#include "kernels/qdot.h"
#include "kernels/qdot_tile.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "qdot_kquants_neon.cpp assumes a little-endian CPU (GGUF data is little-endian)"
#endif

namespace lever {
namespace qdot {
namespace {

using block_bytes::half_to_float;
using block_bytes::load_f32;
using block_bytes::load_u16;
using block_bytes::load_u32;

// Byte offsets inside an ActQ8K activation block.
constexpr size_t kActBytes = sizeof(ActQ8K);
constexpr size_t kActD = offsetof(ActQ8K, d);
constexpr size_t kActQs = offsetof(ActQ8K, qs);
constexpr size_t kActBsums = offsetof(ActQ8K, bsums);

// The activation block b of row r (rows x_stride bytes apart).
LEVER_NEON_INLINE const uint8_t* act_block(const uint8_t* x, size_t x_stride, int r, size_t b) {
  return x + static_cast<size_t>(r) * x_stride + b * kActBytes;
}

// ---------------------------------------------------------------------------
// The two weight types: block layout, per-block scales, slice unpacking, the
// offset sum and the fp32 step (plain ASIMD, inlined into every path).

// Q4_K (144 bytes): fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins,
// qs[128]: qs[32c + l] holds value 64c + l in its low nibble and 64c + 32 + l
// in its high nibble (c < 4, l < 32). Slice k = sub-block k.
struct Q4K {
  static constexpr size_t kBytes = 144;
  static constexpr int kGroupsPerSlice = 1;  // one scale per 32 values

  struct Scales {
    float d, dmin;
    int32_t sc[8];  // scale of sub-block j, 0..63
    int16x8_t mins; // min of sub-block j in lane j, 0..63
  };

  // The 12-byte field: bytes 0..3 hold scale j (j < 4) in bits 0..5 and bits
  // 4..5 of scale j+4 in bits 6..7; bytes 4..7 the same for the mins; bytes
  // 8..11 bits 0..3 of scale j+4 (low nibble) and of min j+4 (high nibble).
  static LEVER_NEON_INLINE Scales load_scales(const uint8_t* blk) {
    Scales s;
    s.d = half_to_float(load_u16(blk));
    s.dmin = half_to_float(load_u16(blk + 2));
    const uint32_t a = load_u32(blk + 4), b = load_u32(blk + 8), c = load_u32(blk + 12);
    const uint32_t low6 = 0x3F3F3F3Fu, low4 = 0x0F0F0F0Fu, bits45 = 0x30303030u;
    const uint32_t sc_lo = a & low6;                                // scales 0..3
    const uint32_t sc_hi = (c & low4) | ((a >> 2) & bits45);        // scales 4..7
    const uint32_t mn_lo = b & low6;                                // mins 0..3
    const uint32_t mn_hi = ((c >> 4) & low4) | ((b >> 2) & bits45); // mins 4..7
    for (int j = 0; j < 4; ++j) {
      s.sc[j] = static_cast<int32_t>((sc_lo >> (8 * j)) & 0xFF);
      s.sc[j + 4] = static_cast<int32_t>((sc_hi >> (8 * j)) & 0xFF);
    }
    const uint64_t mins8 = mn_lo | (static_cast<uint64_t>(mn_hi) << 32);
    s.mins = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(mins8)));
    return s;
  }

  // Values 32k .. 32k+15 (lo) and 32k+16 .. 32k+31 (hi), 0..15 each.
  static LEVER_NEON_INLINE void unpack_slice(const uint8_t* blk, int k, int8x16_t& lo,
                                             int8x16_t& hi) {
    const uint8_t* qs = blk + 16 + 32 * (k / 2);
    const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(-4 * (k % 2)));  // >> 0 or >> 4
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    lo = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(qs), shift), low4));
    hi = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(qs + 16), shift), low4));
  }

  // int32 lanes summing to offs = sum_j m_j * (bsums[2j] + bsums[2j+1]);
  // bsums 0..7 in b_lo, 8..15 in b_hi (|bsums[2j] + bsums[2j+1]| <= 4096).
  static LEVER_NEON_INLINE int32x4_t offset_terms(const Scales& s, int16x8_t b_lo,
                                                  int16x8_t b_hi) {
    const int16x8_t sub = vpaddq_s16(b_lo, b_hi);  // lane j: bsums[2j] + bsums[2j+1]
    return vmlal_high_s16(vmull_s16(vget_low_s16(sub), vget_low_s16(s.mins)), sub, s.mins);
  }

  // The scalar path's per-block term (qdot_kquants.cpp, q4_k_scalar_impl).
  static LEVER_NEON_INLINE float block_term(const Scales& s, float xd, int32_t dot,
                                            int32_t offs) {
    return (s.d * xd) * static_cast<float>(dot) - (s.dmin * xd) * static_cast<float>(offs);
  }
  // The same on 4 lanes (d4, dmin4, xd4: per-lane d, dmin, xd).
  static LEVER_NEON_INLINE float32x4_t block_term4(float32x4_t d4, float32x4_t dmin4,
                                                   float32x4_t xd4, int32x4_t dot4,
                                                   int32x4_t offs4) {
    return vsubq_f32(vmulq_f32(vmulq_f32(d4, xd4), vcvtq_f32_s32(dot4)),
                     vmulq_f32(vmulq_f32(dmin4, xd4), vcvtq_f32_s32(offs4)));
  }
};

// Q6_K (210 bytes): ql[128], qh[64], int8 scales[16], fp16 d. Value
// 128h + 32s + l (h < 2, s < 4, l < 32) = nibble s / 2 of ql[64h + 32(s % 2) + l]
// | bits 2s, 2s+1 of qh[32h + l] << 4; group g = values 16g .. 16g+15.
// Slice k = 4h + s = groups 2k (lo) and 2k+1 (hi).
struct Q6K {
  static constexpr size_t kBytes = 210;
  static constexpr int kGroupsPerSlice = 2;  // one scale per 16 values

  struct Scales {
    float d, dmin;  // dmin unused (0)
    int32_t sc[16];  // scale of group g, -128..127
    int16x8_t sc_lo, sc_hi;  // the same, groups 0..7 and 8..15
  };

  static LEVER_NEON_INLINE Scales load_scales(const uint8_t* blk) {
    Scales s;
    s.d = half_to_float(load_u16(blk + 208));
    s.dmin = 0.0f;
    const int8x16_t sc8 = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 192));
    s.sc_lo = vmovl_s8(vget_low_s8(sc8));
    s.sc_hi = vmovl_high_s8(sc8);
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    for (int g = 0; g < 16; ++g) s.sc[g] = sc[g];
    return s;
  }

  // Values 32k .. 32k+15 (lo) and 32k+16 .. 32k+31 (hi), 0..63 each.
  static LEVER_NEON_INLINE void unpack_slice(const uint8_t* blk, int k, int8x16_t& lo,
                                             int8x16_t& hi) {
    const int h = k / 4, s = k % 4;
    const uint8_t* ql = blk + 64 * h + 32 * (s % 2);
    const uint8_t* qh = blk + 128 + 32 * h;
    // Low 4 bits: nibble s / 2 (shift right by 0 or 4, then mask). High 2
    // bits: bits 2s, 2s+1 of qh moved to bits 4, 5 (shift by 4 - 2s).
    const int8x16_t ql_shift = vdupq_n_s8(static_cast<int8_t>(-4 * (s / 2)));
    const int8x16_t qh_shift = vdupq_n_s8(static_cast<int8_t>(4 - 2 * s));
    const uint8x16_t low4 = vdupq_n_u8(0x0F), bits45 = vdupq_n_u8(0x30);
    const uint8x16_t lo_u = vorrq_u8(vandq_u8(vshlq_u8(vld1q_u8(ql), ql_shift), low4),
                                     vandq_u8(vshlq_u8(vld1q_u8(qh), qh_shift), bits45));
    const uint8x16_t hi_u = vorrq_u8(vandq_u8(vshlq_u8(vld1q_u8(ql + 16), ql_shift), low4),
                                     vandq_u8(vshlq_u8(vld1q_u8(qh + 16), qh_shift), bits45));
    lo = vreinterpretq_s8_u8(lo_u);
    hi = vreinterpretq_s8_u8(hi_u);
  }

  // int32 lanes summing to offs = sum_g sc_g * bsums[g] (|.| <= 128 * 2048 each).
  static LEVER_NEON_INLINE int32x4_t offset_terms(const Scales& s, int16x8_t b_lo,
                                                  int16x8_t b_hi) {
    int32x4_t t = vmull_s16(vget_low_s16(b_lo), vget_low_s16(s.sc_lo));
    t = vmlal_high_s16(t, b_lo, s.sc_lo);
    t = vmlal_s16(t, vget_low_s16(b_hi), vget_low_s16(s.sc_hi));
    return vmlal_high_s16(t, b_hi, s.sc_hi);
  }

  // The scalar path's per-block term (qdot_kquants.cpp, q6_k_scalar_impl).
  static LEVER_NEON_INLINE float block_term(const Scales& s, float xd, int32_t dot,
                                            int32_t offs) {
    return (s.d * xd) * static_cast<float>(dot - 32 * offs);
  }
  static LEVER_NEON_INLINE float32x4_t block_term4(float32x4_t d4, float32x4_t /*dmin4*/,
                                                   float32x4_t xd4, int32x4_t dot4,
                                                   int32x4_t offs4) {
    const int32x4_t n = vsubq_s32(dot4, vmulq_n_s32(offs4, 32));
    return vmulq_f32(vmulq_f32(d4, xd4), vcvtq_f32_s32(n));
  }
};

// The activation block's 16 bsums (int16), as two vectors.
LEVER_NEON_INLINE void load_bsums(const uint8_t* xb, int16x8_t& b_lo, int16x8_t& b_hi) {
  const int16_t* bs = reinterpret_cast<const int16_t*>(xb + kActBsums);
  b_lo = vld1q_s16(bs);
  b_hi = vld1q_s16(bs + 8);
}

// The fp32 step of the neon and dotprod paths: for each pair (c, r), the
// accumulated int32 lanes iacc[c][r] give `dot`, the bsums give `offs`, and
// acc[c][r] += T::block_term(...).
template <class T, int NW, int NX>
LEVER_NEON_INLINE void finish_block(const typename T::Scales (&s)[NW],
                                    const int32x4_t (&iacc)[NW][NX], const uint8_t* x,
                                    size_t x_stride, size_t b, float (&acc)[NW][NX]) {
  for (int r = 0; r < NX; ++r) {
    const uint8_t* xb = act_block(x, x_stride, r, b);
    const float xd = load_f32(xb + kActD);
    int16x8_t b_lo, b_hi;
    load_bsums(xb, b_lo, b_hi);
    for (int c = 0; c < NW; ++c) {
      const int32_t dot = vaddvq_s32(iacc[c][r]);
      const int32_t offs = vaddvq_s32(T::offset_terms(s[c], b_lo, b_hi));
      acc[c][r] += T::block_term(s[c], xd, dot, offs);
    }
  }
}

// ---------------------------------------------------------------------------
// neon (baseline ASIMD): NW weight rows x NX activation rows,
// out[r * out_stride + c].

// iacc += sc * (q . x) over one slice (32 values; smull/smlal into int16).
template <class T>
LEVER_NEON_INLINE int32x4_t neon_slice(int32x4_t iacc, int8x16_t q_lo, int8x16_t q_hi,
                                       int8x16_t x_lo, int8x16_t x_hi,
                                       const typename T::Scales& s, int k) {
  if constexpr (T::kGroupsPerSlice == 1) {
    // 4 products per int16 lane: |.| <= 4 * 15 * 128 = 7680.
    int16x8_t p = vmull_s8(vget_low_s8(q_lo), vget_low_s8(x_lo));
    p = vmlal_high_s8(p, q_lo, x_lo);
    p = vmlal_s8(p, vget_low_s8(q_hi), vget_low_s8(x_hi));
    p = vmlal_high_s8(p, q_hi, x_hi);
    const int16_t sc = static_cast<int16_t>(s.sc[k]);
    iacc = vmlal_n_s16(iacc, vget_low_s16(p), sc);
    return vmlal_high_n_s16(iacc, p, sc);
  } else {
    // One group per vector, 2 products per int16 lane: |.| <= 2 * 63 * 128 = 16128.
    const int16x8_t p0 = vmlal_high_s8(vmull_s8(vget_low_s8(q_lo), vget_low_s8(x_lo)), q_lo, x_lo);
    const int16x8_t p1 = vmlal_high_s8(vmull_s8(vget_low_s8(q_hi), vget_low_s8(x_hi)), q_hi, x_hi);
    const int16_t sc0 = static_cast<int16_t>(s.sc[2 * k]);
    const int16_t sc1 = static_cast<int16_t>(s.sc[2 * k + 1]);
    iacc = vmlal_n_s16(iacc, vget_low_s16(p0), sc0);
    iacc = vmlal_high_n_s16(iacc, p0, sc0);
    iacc = vmlal_n_s16(iacc, vget_low_s16(p1), sc1);
    return vmlal_high_n_s16(iacc, p1, sc1);
  }
}

template <class T, int NW, int NX>
void neon_tile(const uint8_t* w, size_t w_stride, const uint8_t* x, size_t x_stride,
               size_t n_blocks, float* out, size_t out_stride) {
  float acc[NW][NX] = {};
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk[NW];
    typename T::Scales s[NW];
    int32x4_t iacc[NW][NX];
    for (int c = 0; c < NW; ++c) {
      blk[c] = w + static_cast<size_t>(c) * w_stride + b * T::kBytes;
      s[c] = T::load_scales(blk[c]);
      for (int r = 0; r < NX; ++r) iacc[c][r] = vdupq_n_s32(0);
    }
    for (int k = 0; k < 8; ++k) {
      int8x16_t q_lo[NW], q_hi[NW];
      for (int c = 0; c < NW; ++c) T::unpack_slice(blk[c], k, q_lo[c], q_hi[c]);
      for (int r = 0; r < NX; ++r) {
        const int8_t* xq =
            reinterpret_cast<const int8_t*>(act_block(x, x_stride, r, b) + kActQs) + 32 * k;
        const int8x16_t x_lo = vld1q_s8(xq), x_hi = vld1q_s8(xq + 16);
        for (int c = 0; c < NW; ++c)
          iacc[c][r] = neon_slice<T>(iacc[c][r], q_lo[c], q_hi[c], x_lo, x_hi, s[c], k);
      }
    }
    finish_block<T, NW, NX>(s, iacc, x, x_stride, b, acc);
  }
  for (int r = 0; r < NX; ++r)
    for (int c = 0; c < NW; ++c) out[r * out_stride + c] = acc[c][r];
}

// ---------------------------------------------------------------------------
// dotprod (sdot): the same loops, vdotq_s32 for the products.

template <class T>
LEVER_DOTPROD LEVER_NEON_INLINE int32x4_t dotprod_slice(int32x4_t iacc, int8x16_t q_lo,
                                                        int8x16_t q_hi, int8x16_t x_lo,
                                                        int8x16_t x_hi,
                                                        const typename T::Scales& s, int k) {
  const int32x4_t zero = vdupq_n_s32(0);
  if constexpr (T::kGroupsPerSlice == 1) {
    const int32x4_t p = vdotq_s32(vdotq_s32(zero, q_lo, x_lo), q_hi, x_hi);
    return vmlaq_n_s32(iacc, p, s.sc[k]);
  } else {
    iacc = vmlaq_n_s32(iacc, vdotq_s32(zero, q_lo, x_lo), s.sc[2 * k]);
    return vmlaq_n_s32(iacc, vdotq_s32(zero, q_hi, x_hi), s.sc[2 * k + 1]);
  }
}

template <class T, int NW, int NX>
LEVER_DOTPROD void dotprod_tile(const uint8_t* w, size_t w_stride, const uint8_t* x,
                                size_t x_stride, size_t n_blocks, float* out,
                                size_t out_stride) {
  float acc[NW][NX] = {};
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk[NW];
    typename T::Scales s[NW];
    int32x4_t iacc[NW][NX];
    for (int c = 0; c < NW; ++c) {
      blk[c] = w + static_cast<size_t>(c) * w_stride + b * T::kBytes;
      s[c] = T::load_scales(blk[c]);
      for (int r = 0; r < NX; ++r) iacc[c][r] = vdupq_n_s32(0);
    }
    for (int k = 0; k < 8; ++k) {
      int8x16_t q_lo[NW], q_hi[NW];
      for (int c = 0; c < NW; ++c) T::unpack_slice(blk[c], k, q_lo[c], q_hi[c]);
      for (int r = 0; r < NX; ++r) {
        const int8_t* xq =
            reinterpret_cast<const int8_t*>(act_block(x, x_stride, r, b) + kActQs) + 32 * k;
        const int8x16_t x_lo = vld1q_s8(xq), x_hi = vld1q_s8(xq + 16);
        for (int c = 0; c < NW; ++c)
          iacc[c][r] = dotprod_slice<T>(iacc[c][r], q_lo[c], q_hi[c], x_lo, x_hi, s[c], k);
      }
    }
    finish_block<T, NW, NX>(s, iacc, x, x_stride, b, acc);
  }
  for (int r = 0; r < NX; ++r)
    for (int c = 0; c < NW; ++c) out[r * out_stride + c] = acc[c][r];
}

// ---------------------------------------------------------------------------
// i8mm (smmla): weight rows in pairs (NWP = ceil(NW / 2)) and activation rows
// in pairs (NXP = ceil(NX / 2)); accumulator lanes (c0,r0), (c0,r1), (c1,r0),
// (c1,r1) with c0 = 2 cp, c1 = 2 cp + 1 and r0 = 2 rp, r1 = 2 rp + 1 (a
// missing c1 / r1 is a copy of c0 / r0).

// iacc += sc * (the 2x2 dot products) over one slice. qz / xz: the slice's
// 32 values of both rows of the pair, zipped 8 values per row (zip_rows).
template <class T>
LEVER_I8MM LEVER_NEON_INLINE int32x4_t i8mm_slice(int32x4_t iacc, const int8x16_t (&qz)[4],
                                                  const int8x16_t (&xz)[4],
                                                  const int32x4_t* sc_pair, int k) {
  const int32x4_t zero = vdupq_n_s32(0);
  if constexpr (T::kGroupsPerSlice == 1) {
    int32x4_t p = vmmlaq_s32(zero, qz[0], xz[0]);
    p = vmmlaq_s32(p, qz[1], xz[1]);
    p = vmmlaq_s32(p, qz[2], xz[2]);
    p = vmmlaq_s32(p, qz[3], xz[3]);
    return vmlaq_s32(iacc, p, sc_pair[k]);
  } else {
    const int32x4_t p0 = vmmlaq_s32(vmmlaq_s32(zero, qz[0], xz[0]), qz[1], xz[1]);
    const int32x4_t p1 = vmmlaq_s32(vmmlaq_s32(zero, qz[2], xz[2]), qz[3], xz[3]);
    iacc = vmlaq_s32(iacc, p0, sc_pair[2 * k]);
    return vmlaq_s32(iacc, p1, sc_pair[2 * k + 1]);
  }
}

template <class T, int NW, int NX>
LEVER_I8MM void i8mm_tile(const uint8_t* w, size_t w_stride, const uint8_t* x, size_t x_stride,
                          size_t n_blocks, float* out, size_t out_stride) {
  constexpr int NWP = (NW + 1) / 2, NXP = (NX + 1) / 2;
  constexpr int kGroups = 8 * T::kGroupsPerSlice;
  // Row index of member m (0, 1) of pair p, padded with a copy of the last row.
  auto w_row = [](int p, int m) { return 2 * p + m < NW ? 2 * p + m : NW - 1; };
  auto x_row = [](int p, int m) { return 2 * p + m < NX ? 2 * p + m : NX - 1; };

  float32x4_t facc[NWP][NXP];
  for (int cp = 0; cp < NWP; ++cp)
    for (int rp = 0; rp < NXP; ++rp) facc[cp][rp] = vdupq_n_f32(0.0f);

  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk[NWP][2];
    typename T::Scales s[NWP][2];
    int32x4_t sc_pair[NWP][kGroups];  // group g: [sc(c0), sc(c0), sc(c1), sc(c1)]
    int32x4_t iacc[NWP][NXP];
    for (int cp = 0; cp < NWP; ++cp) {
      for (int m = 0; m < 2; ++m) {
        blk[cp][m] = w + static_cast<size_t>(w_row(cp, m)) * w_stride + b * T::kBytes;
        s[cp][m] = T::load_scales(blk[cp][m]);
      }
      for (int g = 0; g < kGroups; ++g)
        sc_pair[cp][g] = vcombine_s32(vdup_n_s32(s[cp][0].sc[g]), vdup_n_s32(s[cp][1].sc[g]));
      for (int rp = 0; rp < NXP; ++rp) iacc[cp][rp] = vdupq_n_s32(0);
    }
    for (int k = 0; k < 8; ++k) {
      int8x16_t qz[NWP][4];
      for (int cp = 0; cp < NWP; ++cp) {
        int8x16_t lo0, hi0, lo1, hi1;
        T::unpack_slice(blk[cp][0], k, lo0, hi0);
        T::unpack_slice(blk[cp][1], k, lo1, hi1);
        neon::zip_rows(lo0, lo1, qz[cp][0], qz[cp][1]);
        neon::zip_rows(hi0, hi1, qz[cp][2], qz[cp][3]);
      }
      for (int rp = 0; rp < NXP; ++rp) {
        const int8_t* xq0 = reinterpret_cast<const int8_t*>(
                                act_block(x, x_stride, x_row(rp, 0), b) + kActQs) + 32 * k;
        const int8_t* xq1 = reinterpret_cast<const int8_t*>(
                                act_block(x, x_stride, x_row(rp, 1), b) + kActQs) + 32 * k;
        int8x16_t xz[4];
        neon::zip_rows(vld1q_s8(xq0), vld1q_s8(xq1), xz[0], xz[1]);
        neon::zip_rows(vld1q_s8(xq0 + 16), vld1q_s8(xq1 + 16), xz[2], xz[3]);
        for (int cp = 0; cp < NWP; ++cp)
          iacc[cp][rp] = i8mm_slice<T>(iacc[cp][rp], qz[cp], xz, sc_pair[cp], k);
      }
    }
    // fp32 step on the 4 pairs of each (weight pair, activation pair).
    for (int rp = 0; rp < NXP; ++rp) {
      const uint8_t* xb0 = act_block(x, x_stride, x_row(rp, 0), b);
      const uint8_t* xb1 = act_block(x, x_stride, x_row(rp, 1), b);
      const float xd0 = load_f32(xb0 + kActD), xd1 = load_f32(xb1 + kActD);
      const float xd_lanes[4] = {xd0, xd1, xd0, xd1};
      const float32x4_t xd4 = vld1q_f32(xd_lanes);
      int16x8_t b0_lo, b0_hi, b1_lo, b1_hi;
      load_bsums(xb0, b0_lo, b0_hi);
      load_bsums(xb1, b1_lo, b1_hi);
      for (int cp = 0; cp < NWP; ++cp) {
        const typename T::Scales& s0 = s[cp][0];
        const typename T::Scales& s1 = s[cp][1];
        const int32x4_t offs4 = neon::lane_sums(
            T::offset_terms(s0, b0_lo, b0_hi), T::offset_terms(s0, b1_lo, b1_hi),
            T::offset_terms(s1, b0_lo, b0_hi), T::offset_terms(s1, b1_lo, b1_hi));
        const float32x4_t d4 = vcombine_f32(vdup_n_f32(s0.d), vdup_n_f32(s1.d));
        const float32x4_t dmin4 = vcombine_f32(vdup_n_f32(s0.dmin), vdup_n_f32(s1.dmin));
        facc[cp][rp] =
            vaddq_f32(facc[cp][rp], T::block_term4(d4, dmin4, xd4, iacc[cp][rp], offs4));
      }
    }
  }
  for (int cp = 0; cp < NWP; ++cp) {
    for (int rp = 0; rp < NXP; ++rp) {
      float lanes[4];
      vst1q_f32(lanes, facc[cp][rp]);
      for (int m = 0; m < 4; ++m) {
        const int c = 2 * cp + m / 2, r = 2 * rp + m % 2;
        if (c < NW && r < NX) out[r * out_stride + c] = lanes[m];
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Dispatch: row kernels (1 weight row, up to kMaxDotRows activation rows)
// and the Kernel classes for tile_detail::run_tile.

template <class T>
void neon_rows(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
               float* out) {
  switch (n_x) {
    case 1: neon_tile<T, 1, 1>(w, 0, x, x_stride, n_blocks, out, 1); break;
    case 2: neon_tile<T, 1, 2>(w, 0, x, x_stride, n_blocks, out, 1); break;
    case 3: neon_tile<T, 1, 3>(w, 0, x, x_stride, n_blocks, out, 1); break;
    case 4: neon_tile<T, 1, 4>(w, 0, x, x_stride, n_blocks, out, 1); break;
    case 5: neon_tile<T, 1, 5>(w, 0, x, x_stride, n_blocks, out, 1); break;
    case 6: neon_tile<T, 1, 6>(w, 0, x, x_stride, n_blocks, out, 1); break;
    case 7: neon_tile<T, 1, 7>(w, 0, x, x_stride, n_blocks, out, 1); break;
    default: neon_tile<T, 1, 8>(w, 0, x, x_stride, n_blocks, out, 1); break;
  }
}

template <class T>
void dotprod_rows(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                  size_t n_blocks, float* out) {
  switch (n_x) {
    case 1: dotprod_tile<T, 1, 1>(w, 0, x, x_stride, n_blocks, out, 1); break;
    case 2: dotprod_tile<T, 1, 2>(w, 0, x, x_stride, n_blocks, out, 1); break;
    case 3: dotprod_tile<T, 1, 3>(w, 0, x, x_stride, n_blocks, out, 1); break;
    case 4: dotprod_tile<T, 1, 4>(w, 0, x, x_stride, n_blocks, out, 1); break;
    case 5: dotprod_tile<T, 1, 5>(w, 0, x, x_stride, n_blocks, out, 1); break;
    case 6: dotprod_tile<T, 1, 6>(w, 0, x, x_stride, n_blocks, out, 1); break;
    case 7: dotprod_tile<T, 1, 7>(w, 0, x, x_stride, n_blocks, out, 1); break;
    default: dotprod_tile<T, 1, 8>(w, 0, x, x_stride, n_blocks, out, 1); break;
  }
}

// Sub-tile shapes. dotprod: 2 weight rows x 8 activation rows (16 int32x4
// accumulators). i8mm: 2 weight-row pairs x 4 activation-row pairs (8
// accumulators; each zipped activation slice serves 2 weight pairs).
template <class T>
struct DotprodTile {
  static constexpr int kTW = 2, kTX = 8;
  template <int NW, int NX>
  static void run(const uint8_t* w, size_t w_stride, const uint8_t* x, size_t x_stride,
                  size_t n_blocks, float* out, size_t out_stride) {
    dotprod_tile<T, NW, NX>(w, w_stride, x, x_stride, n_blocks, out, out_stride);
  }
};
template <class T>
struct I8mmTile {
  static constexpr int kTW = 4, kTX = 8;
  template <int NW, int NX>
  static void run(const uint8_t* w, size_t w_stride, const uint8_t* x, size_t x_stride,
                  size_t n_blocks, float* out, size_t out_stride) {
    i8mm_tile<T, NW, NX>(w, w_stride, x, x_stride, n_blocks, out, out_stride);
  }
};

}  // namespace

// ---------------------------------------------------------------------------
// Entry points (qdot.h).

void q4_k_neon(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
               float* out) {
  tile_detail::in_row_groups(neon_rows<Q4K>, w, x, x_stride, n_x, n_blocks, out);
}
void q6_k_neon(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
               float* out) {
  tile_detail::in_row_groups(neon_rows<Q6K>, w, x, x_stride, n_x, n_blocks, out);
}
void q4_k_dotprod(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                  size_t n_blocks, float* out) {
  tile_detail::in_row_groups(dotprod_rows<Q4K>, w, x, x_stride, n_x, n_blocks, out);
}
void q6_k_dotprod(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                  size_t n_blocks, float* out) {
  tile_detail::in_row_groups(dotprod_rows<Q6K>, w, x, x_stride, n_x, n_blocks, out);
}
void q4_k_dotprod_tile(const uint8_t* w, size_t w_stride, int n_w, const uint8_t* x,
                       size_t x_stride, int n_x, size_t n_blocks, float* out,
                       size_t out_stride) {
  tile_detail::run_tile<DotprodTile<Q4K>>(w, w_stride, n_w, x, x_stride, n_x, n_blocks, out,
                                          out_stride);
}
void q6_k_dotprod_tile(const uint8_t* w, size_t w_stride, int n_w, const uint8_t* x,
                       size_t x_stride, int n_x, size_t n_blocks, float* out,
                       size_t out_stride) {
  tile_detail::run_tile<DotprodTile<Q6K>>(w, w_stride, n_w, x, x_stride, n_x, n_blocks, out,
                                          out_stride);
}
void q4_k_i8mm_tile(const uint8_t* w, size_t w_stride, int n_w, const uint8_t* x,
                    size_t x_stride, int n_x, size_t n_blocks, float* out, size_t out_stride) {
  tile_detail::run_tile<I8mmTile<Q4K>>(w, w_stride, n_w, x, x_stride, n_x, n_blocks, out,
                                       out_stride);
}
void q6_k_i8mm_tile(const uint8_t* w, size_t w_stride, int n_w, const uint8_t* x,
                    size_t x_stride, int n_x, size_t n_blocks, float* out, size_t out_stride) {
  tile_detail::run_tile<I8mmTile<Q6K>>(w, w_stride, n_w, x, x_stride, n_x, n_blocks, out,
                                       out_stride);
}

}  // namespace qdot
}  // namespace lever

#endif  // __aarch64__

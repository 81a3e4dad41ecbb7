// Dequantisation of GGUF / ggml blocks to fp32 and bf16 (see dequant.h).
//
// One kernel per format: dequant_<format>(src, dst, n_blocks) reads n_blocks
// consecutive blocks at src and writes n_blocks * block_size fp32 values to
// dst. Each kernel starts with the layout of its block in bytes. The arithmetic
// is done in fp32 in the same order as the reference (gguf.quants), e.g.
// (d * scale) * q - (dmin * min), with one rounding per operation, so the
// results are bit-identical. For that reason this file is compiled with
// -ffp-contract=off (no fused multiply-add).
//
// The kernels are plain loops written for the compiler's auto-vectoriser. On
// x86-64 each kernel is compiled three times (AVX-512, AVX2, baseline SSE2)
// and the best version for the running CPU is picked at load time
// (GCC/Clang target_clones); elsewhere (aarch64: NEON is baseline) there is one
// version. Work is split over blocks on the process-wide thread pool.
//
// aarch64 (GCC 12 -O3, checked with -fopt-info-vec and objdump): every block
// kernel's inner loop, BF16 -> fp32 and fp32 -> bf16 rounding are vectorised
// to ASIMD by the compiler, so they have no hand-written version. F16 -> fp32
// is vectorised too, but as ~35 integer instructions per 8 values (the
// branchless bit construction); the hardware conversion (fcvtl) does it in
// two, so F16 has an explicit NEON kernel (dequant_f16_neon) that gives the
// same bits as the portable one, NaN payloads included.

#include "kernels/dequant.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/parallel.h"
#include "kernels/block_bytes.h"
#include "kernels/repack.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dequant.cpp assumes a little-endian CPU (GGUF data is little-endian)"
#endif

#include "common/multiversion.h"  // LEVER_KERNEL: one version per x86-64 level

#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace lever {
namespace {

using block_bytes::float_bits;
using block_bytes::bits_float;
using block_bytes::load_u16;
using block_bytes::load_u32;
using block_bytes::half_to_float;

// ---------------------------------------------------------------------------
// Scalar helpers (inlined into every kernel version).

// half_to_float without branches (all cases computed, one selected with bit
// masks), so that loops over many fp16 values vectorise.
inline float half_to_float_branchless(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;
  const uint32_t normal = (em << 13) + (112u << 23);
  const uint32_t inf_nan = (em << 13) | 0x7F800000u;
  const uint32_t subnormal = float_bits(static_cast<float>(em) * 0x1p-24f);
  const uint32_t is_inf_nan = 0u - static_cast<uint32_t>(em >= 0x7C00u);  // all ones or 0
  const uint32_t is_normal = 0u - static_cast<uint32_t>(em >= 0x0400u);
  const uint32_t bits = (inf_nan & is_inf_nan) | (normal & is_normal & ~is_inf_nan) |
                        (subnormal & ~is_normal);
  return bits_float(bits | sign);
}

// Reads an fp16 scale stored at p (2 bytes).
inline float load_half(const uint8_t* p) { return half_to_float(load_u16(p)); }

// fp32 -> bf16 (the top 16 bits), rounded to nearest, ties to even.
inline uint16_t float_bits_to_bf16(uint32_t u) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: keep sign, set quiet bit
  }
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Unpacks the 12-byte scale field of Q4_K / Q5_K: eight 6-bit scales and
// eight 6-bit mins, one pair per 32-element sub-block j.
//   bytes 0..3   scale j (j < 4) in bits 0..5; bits 6..7 are bits 4..5 of scale j+4
//   bytes 4..7   min j   (j < 4) in bits 0..5; bits 6..7 are bits 4..5 of min j+4
//   bytes 8..11  low nibble: bits 0..3 of scale j+4; high nibble: bits 0..3 of min j+4
inline void unpack_k4_scales(const uint8_t* s, int scale[8], int min[8]) {
  for (int j = 0; j < 4; ++j) {
    scale[j] = s[j] & 0x3F;
    min[j] = s[j + 4] & 0x3F;
    scale[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30);
    min[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
  }
}

// The 6-bit scale of sub-block i (i < 16) in the 12-byte scale field of Q3_K:
// its low 4 bits are the low nibble of byte i (i < 8) or the high nibble of
// byte i - 8 (i >= 8); its top 2 bits are bits 2*(i/4), 2*(i/4)+1 of byte 8 + i%4.
inline int q3k_scale(const uint8_t* s, int i) {
  const int low4 = i < 8 ? (s[i] & 0x0F) : (s[i - 8] >> 4);
  const int high2 = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return low4 | (high2 << 4);
}

// ---------------------------------------------------------------------------
// Kernels: n_blocks blocks at src -> n_blocks * block_size fp32 values at dst.

// F32: 1 element in 4 bytes (IEEE binary32).
void dequant_f32(const uint8_t* src, float* dst, size_t n_blocks) {
  std::memcpy(dst, src, n_blocks * sizeof(float));
}

// F16: 1 element in 2 bytes (IEEE binary16).
LEVER_KERNEL void dequant_f16_portable(const uint8_t* __restrict src, float* __restrict dst,
                                       size_t n_blocks) {
  for (size_t i = 0; i < n_blocks; ++i) dst[i] = half_to_float_branchless(load_u16(src + 2 * i));
}

#if defined(__aarch64__)
// 4 fp16 values (the bits in h) -> fp32, as half_to_float: fcvtl is exact
// for every non-NaN input; a NaN lane is rebuilt from its bits (sign,
// all-ones exponent, the payload shifted up 13), because fcvtl would set the
// quiet bit of a signalling NaN (or give the default NaN if FPCR.DN is set).
inline float32x4_t half4_to_float(uint16x4_t h) {
  const float32x4_t converted = vcvt_f32_f16(vreinterpret_f16_u16(h));
  const uint16x4_t em = vand_u16(h, vdup_n_u16(0x7FFF));
  // All ones in NaN lanes (the 16-bit mask sign-extended to 32 bits).
  const uint32x4_t nan_mask = vreinterpretq_u32_s32(
      vmovl_s16(vreinterpret_s16_u16(vcgt_u16(em, vdup_n_u16(0x7C00)))));
  const uint32x4_t sign = vshlq_n_u32(vmovl_u16(vand_u16(h, vdup_n_u16(0x8000))), 16);
  const uint32x4_t nan_bits =
      vorrq_u32(vorrq_u32(sign, vdupq_n_u32(0x7F800000u)), vshlq_n_u32(vmovl_u16(em), 13));
  return vbslq_f32(nan_mask, vreinterpretq_f32_u32(nan_bits), converted);
}

void dequant_f16_neon(const uint8_t* __restrict src, float* __restrict dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint16x8_t h = vreinterpretq_u16_u8(vld1q_u8(src + 2 * i));  // any alignment
    vst1q_f32(dst + i, half4_to_float(vget_low_u16(h)));
    vst1q_f32(dst + i + 4, half4_to_float(vget_high_u16(h)));
  }
  dequant_f16_portable(src + 2 * i, dst + i, n - i);
}
#endif

void dequant_f16(const uint8_t* src, float* dst, size_t n_blocks) {
#if defined(__aarch64__)
  dequant_f16_neon(src, dst, n_blocks);
#else
  dequant_f16_portable(src, dst, n_blocks);
#endif
}

// BF16: 1 element in 2 bytes, the top half of an fp32.
LEVER_KERNEL void dequant_bf16(const uint8_t* __restrict src, float* __restrict dst,
                               size_t n_blocks) {
  for (size_t i = 0; i < n_blocks; ++i) {
    dst[i] = bits_float(static_cast<uint32_t>(load_u16(src + 2 * i)) << 16);
  }
}

// Q4_0: 32 elements in 18 bytes.
//   bytes 0..1   d: fp16 scale
//   bytes 2..17  qs[16]: 4-bit quants; element j in the low nibble of qs[j],
//                element j+16 in the high nibble (j < 16)
//   y = d * (q - 8)
LEVER_KERNEL void dequant_q4_0(const uint8_t* __restrict src, float* __restrict dst,
                               size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += 18, dst += 32) {
    const float d = load_half(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
      dst[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

// Q4_1: 32 elements in 20 bytes.
//   bytes 0..1   d: fp16 scale
//   bytes 2..3   m: fp16 offset (the block minimum)
//   bytes 4..19  qs[16]: 4-bit quants, nibbles as in Q4_0
//   y = d * q + m
LEVER_KERNEL void dequant_q4_1(const uint8_t* __restrict src, float* __restrict dst,
                               size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += 20, dst += 32) {
    const float d = load_half(src);
    const float m = load_half(src + 2);
    const uint8_t* qs = src + 4;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
      dst[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
    }
  }
}

// Q5_0: 32 elements in 22 bytes.
//   bytes 0..1   d: fp16 scale
//   bytes 2..5   qh: uint32, bit j is the 5th (top) bit of element j
//   bytes 6..21  qs[16]: low 4 bits, nibbles as in Q4_0
//   y = d * (q - 16)
LEVER_KERNEL void dequant_q5_0(const uint8_t* __restrict src, float* __restrict dst,
                               size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += 22, dst += 32) {
    const float d = load_half(src);
    const uint32_t qh = load_u32(src + 2);
    const uint8_t* qs = src + 6;
    int32_t high[32];  // the 5th bits, in place (0 or 16)
    for (int j = 0; j < 32; ++j) high[j] = static_cast<int32_t>(((qh >> j) & 1u) << 4);
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(((qs[j] & 0x0F) | high[j]) - 16);
      dst[j + 16] = d * static_cast<float>(((qs[j] >> 4) | high[j + 16]) - 16);
    }
  }
}

// Q5_1: 32 elements in 24 bytes.
//   bytes 0..1   d: fp16 scale
//   bytes 2..3   m: fp16 offset
//   bytes 4..7   qh: uint32, bit j is the 5th bit of element j
//   bytes 8..23  qs[16]: low 4 bits, nibbles as in Q4_0
//   y = d * q + m
LEVER_KERNEL void dequant_q5_1(const uint8_t* __restrict src, float* __restrict dst,
                               size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += 24, dst += 32) {
    const float d = load_half(src);
    const float m = load_half(src + 2);
    const uint32_t qh = load_u32(src + 4);
    const uint8_t* qs = src + 8;
    int32_t high[32];  // the 5th bits, in place (0 or 16)
    for (int j = 0; j < 32; ++j) high[j] = static_cast<int32_t>(((qh >> j) & 1u) << 4);
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>((qs[j] & 0x0F) | high[j]) + m;
      dst[j + 16] = d * static_cast<float>((qs[j] >> 4) | high[j + 16]) + m;
    }
  }
}

// Q8_0: 32 elements in 34 bytes.
//   bytes 0..1   d: fp16 scale
//   bytes 2..33  qs[32]: int8 quants
//   y = q * d
LEVER_KERNEL void dequant_q8_0(const uint8_t* __restrict src, float* __restrict dst,
                               size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += 34, dst += 32) {
    const float d = load_half(src);
    const int8_t* qs = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(qs[j]) * d;
  }
}

// Q2_K: 256 elements in 84 bytes, as 16 sub-blocks of 16 elements.
//   bytes  0..15  scales[16]: sub-block i: low nibble = scale, high nibble = min
//   bytes 16..79  qs[64]: 2-bit quants, four per byte
//   bytes 80..81  d: fp16, multiplies the scales
//   bytes 82..83  dmin: fp16, multiplies the mins
//   Element e = 128*h + 32*s + l (h < 2, s < 4, l < 32) has
//   q = (qs[32*h + l] >> 2*s) & 3 and sub-block i = e / 16;
//   y = (d * scale_i) * q - (dmin * min_i)
LEVER_KERNEL void dequant_q2_k(const uint8_t* __restrict src, float* __restrict dst,
                               size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += 84, dst += 256) {
    const uint8_t* scales = src;
    const uint8_t* qs = src + 16;
    const float d = load_half(src + 80);
    const float dmin = load_half(src + 82);
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 4; ++s) {
        const int i = 8 * h + 2 * s;  // sub-blocks i (l < 16) and i + 1 (l >= 16)
        const float dl0 = d * static_cast<float>(scales[i] & 0x0F);
        const float dl1 = d * static_cast<float>(scales[i + 1] & 0x0F);
        const float ml0 = dmin * static_cast<float>(scales[i] >> 4);
        const float ml1 = dmin * static_cast<float>(scales[i + 1] >> 4);
        const uint8_t* q = qs + 32 * h;
        float* y = dst + 128 * h + 32 * s;
        // Two loops of 16 (sub-blocks i and i + 1): without the per-element
        // select they vectorise (the same operations, so the same bits).
        for (int l = 0; l < 16; ++l) {
          y[l] = dl0 * static_cast<float>((q[l] >> (2 * s)) & 3) - ml0;
        }
        for (int l = 16; l < 32; ++l) {
          y[l] = dl1 * static_cast<float>((q[l] >> (2 * s)) & 3) - ml1;
        }
      }
    }
  }
}

// Q3_K: 256 elements in 110 bytes, as 16 sub-blocks of 16 elements.
//   bytes   0..31   hmask[32]: bit j of hmask[l] is the high bit of element 32*j + l
//   bytes  32..95   qs[64]: low 2 bits, four per byte, placed as in Q2_K
//   bytes  96..107  scales: sixteen 6-bit scales, one per sub-block (q3k_scale)
//   bytes 108..109  d: fp16
//   Element e = 128*h + 32*s + l: q = ((qs[32*h + l] >> 2*s) & 3) - 4 if its
//   high bit is 0, else without the -4; y = (d * (scale_i - 32)) * q, i = e / 16
LEVER_KERNEL void dequant_q3_k(const uint8_t* __restrict src, float* __restrict dst,
                               size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += 110, dst += 256) {
    const uint8_t* hmask = src;
    const uint8_t* qs = src + 32;
    const uint8_t* sc = src + 96;
    const float d = load_half(src + 108);
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 4; ++s) {
        const int j = 4 * h + s;  // bit of hmask
        const int i = 8 * h + 2 * s;  // sub-blocks i (l < 16) and i + 1 (l >= 16)
        const float dl0 = d * static_cast<float>(q3k_scale(sc, i) - 32);
        const float dl1 = d * static_cast<float>(q3k_scale(sc, i + 1) - 32);
        const uint8_t* q = qs + 32 * h;
        float* y = dst + 128 * h + 32 * s;
        for (int l = 0; l < 32; ++l) {
          const int low2 = (q[l] >> (2 * s)) & 3;
          const int minus4 = (((hmask[l] >> j) & 1) ^ 1) << 2;  // 4 if the bit is 0
          y[l] = (l < 16 ? dl0 : dl1) * static_cast<float>(low2 - minus4);
        }
      }
    }
  }
}

// Q4_K: 256 elements in 144 bytes, as 8 sub-blocks of 32 elements.
//   bytes   0..1    d: fp16, multiplies the scales
//   bytes   2..3    dmin: fp16, multiplies the mins
//   bytes   4..15   scales: 6-bit scale and min per sub-block (unpack_k4_scales)
//   bytes  16..143  qs[128]: 4-bit quants; sub-block j = 2*c + n takes the low
//                   (n = 0) or high (n = 1) nibbles of qs[32*c .. 32*c + 31]
//   y = (d * scale_j) * q - (dmin * min_j)
LEVER_KERNEL void dequant_q4_k(const uint8_t* __restrict src, float* __restrict dst,
                               size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += 144, dst += 256) {
    const float d = load_half(src);
    const float dmin = load_half(src + 2);
    int scale[8], min[8];
    unpack_k4_scales(src + 4, scale, min);
    const uint8_t* qs = src + 16;
    for (int c = 0; c < 4; ++c) {
      for (int n = 0; n < 2; ++n) {
        const int j = 2 * c + n;
        const float dl = d * static_cast<float>(scale[j]);
        const float ml = dmin * static_cast<float>(min[j]);
        const uint8_t* q = qs + 32 * c;
        float* y = dst + 32 * j;
        for (int l = 0; l < 32; ++l) {
          y[l] = dl * static_cast<float>((q[l] >> (4 * n)) & 0x0F) - ml;
        }
      }
    }
  }
}

// Q5_K: 256 elements in 176 bytes, as 8 sub-blocks of 32 elements.
//   bytes   0..1    d: fp16
//   bytes   2..3    dmin: fp16
//   bytes   4..15   scales: as Q4_K
//   bytes  16..47   qh[32]: bit j of qh[l] is the 5th bit of element l of sub-block j
//   bytes  48..175  qs[128]: low 4 bits, placed as in Q4_K
//   y = (d * scale_j) * q - (dmin * min_j)
LEVER_KERNEL void dequant_q5_k(const uint8_t* __restrict src, float* __restrict dst,
                               size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += 176, dst += 256) {
    const float d = load_half(src);
    const float dmin = load_half(src + 2);
    int scale[8], min[8];
    unpack_k4_scales(src + 4, scale, min);
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + 48;
    for (int c = 0; c < 4; ++c) {  // sub-blocks 2c (low nibbles) and 2c+1 (high nibbles)
      const float dl0 = d * static_cast<float>(scale[2 * c]);
      const float ml0 = dmin * static_cast<float>(min[2 * c]);
      const float dl1 = d * static_cast<float>(scale[2 * c + 1]);
      const float ml1 = dmin * static_cast<float>(min[2 * c + 1]);
      const uint8_t* q = qs + 32 * c;
      float* y = dst + 64 * c;
      for (int l = 0; l < 32; ++l) {
        const int high0 = ((qh[l] >> (2 * c)) & 1) << 4;
        const int high1 = ((qh[l] >> (2 * c + 1)) & 1) << 4;
        y[l] = dl0 * static_cast<float>((q[l] & 0x0F) | high0) - ml0;
        y[l + 32] = dl1 * static_cast<float>((q[l] >> 4) | high1) - ml1;
      }
    }
  }
}

// Q6_K: 256 elements in 210 bytes, as 16 sub-blocks of 16 elements.
//   bytes   0..127  ql[128]: low 4 bits
//   bytes 128..191  qh[64]: high 2 bits, four per byte
//   bytes 192..207  scales[16]: int8 scale per sub-block
//   bytes 208..209  d: fp16
//   Element e = 128*h + 32*s + l (h < 2, s < 4, l < 32):
//     low 4 bits  = (ql[64*h + 32*(s % 2) + l] >> 4*(s / 2)) & 15
//     high 2 bits = (qh[32*h + l] >> 2*s) & 3
//   q = (high << 4 | low) - 32, i = e / 16; y = (d * scale_i) * q
LEVER_KERNEL void dequant_q6_k(const uint8_t* __restrict src, float* __restrict dst,
                               size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += 210, dst += 256) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const int8_t* scales = reinterpret_cast<const int8_t*>(src + 192);
    const float d = load_half(src + 208);
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 4; ++s) {
        const int i = 8 * h + 2 * s;  // sub-blocks i (l < 16) and i + 1 (l >= 16)
        const float dl0 = d * static_cast<float>(scales[i]);
        const float dl1 = d * static_cast<float>(scales[i + 1]);
        const uint8_t* lo = ql + 64 * h + 32 * (s % 2);
        const uint8_t* hi = qh + 32 * h;
        float* y = dst + 128 * h + 32 * s;
        for (int l = 0; l < 32; ++l) {
          const int low4 = (lo[l] >> (4 * (s / 2))) & 0x0F;
          const int high2 = (hi[l] >> (2 * s)) & 3;
          y[l] = (l < 16 ? dl0 : dl1) * static_cast<float>((low4 | (high2 << 4)) - 32);
        }
      }
    }
  }
}

// n fp32 values (raw little-endian bytes at src) -> n bf16 bit patterns.
LEVER_KERNEL void round_to_bf16(const uint8_t* __restrict src, uint16_t* __restrict dst,
                                size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = float_bits_to_bf16(load_u32(src + 4 * i));
}

// ---------------------------------------------------------------------------
// Format table and drivers.

using BlockKernel = void (*)(const uint8_t* src, float* dst, size_t n_blocks);

struct Format {
  int type;
  const char* name;
  size_t block_size;  // elements per block
  size_t type_size;   // bytes per block
  BlockKernel to_f32;
};

const Format kFormats[] = {
    {kTypeF32, "F32", 1, 4, dequant_f32},
    {kTypeF16, "F16", 1, 2, dequant_f16},
    {kTypeQ4_0, "Q4_0", 32, 18, dequant_q4_0},
    {kTypeQ4_1, "Q4_1", 32, 20, dequant_q4_1},
    {kTypeQ5_0, "Q5_0", 32, 22, dequant_q5_0},
    {kTypeQ5_1, "Q5_1", 32, 24, dequant_q5_1},
    {kTypeQ8_0, "Q8_0", 32, 34, dequant_q8_0},
    {kTypeQ2_K, "Q2_K", 256, 84, dequant_q2_k},
    {kTypeQ3_K, "Q3_K", 256, 110, dequant_q3_k},
    {kTypeQ4_K, "Q4_K", 256, 144, dequant_q4_k},
    {kTypeQ5_K, "Q5_K", 256, 176, dequant_q5_k},
    {kTypeQ6_K, "Q6_K", 256, 210, dequant_q6_k},
    {kTypeBF16, "BF16", 1, 2, dequant_bf16},
};

// A thread's share of a job is at least this many elements (waking the pool
// costs tens of microseconds; this much work takes about as long).
constexpr size_t kMinElementsPerTask = 64 * 1024;

// bf16 output of quantised types goes through an fp32 buffer of this many
// elements (16 KiB, stays in L1) on the stack of each thread.
constexpr size_t kBf16BatchElements = 4096;

const Format* find_format(int type) {
  for (const Format& f : kFormats) {
    if (f.type == type) return &f;
  }
  return nullptr;
}

std::string supported_list() {
  std::string s;
  for (const Format& f : kFormats) {
    if (!s.empty()) s += ", ";
    s += std::string(f.name) + " (" + std::to_string(f.type) + ")";
  }
  return s;
}

const Format& require_format(int type) {
  const Format* f = find_format(type);
  if (f == nullptr) {
    throw std::invalid_argument("ggml tensor type id " + std::to_string(type) +
                                " is not supported by lever's dequantiser; supported: " +
                                supported_list());
  }
  return *f;
}

// Checks the sizes of a dequantize call; returns the number of blocks.
size_t check_sizes(const Format& f, size_t n_bytes, size_t n_elements) {
  const size_t expected = element_count(f.type, n_bytes);
  if (n_elements != expected) {
    throw std::invalid_argument("output holds " + std::to_string(n_elements) +
                                " elements but " + std::to_string(n_bytes) + " bytes of " +
                                f.name + " encode " + std::to_string(expected) + " elements");
  }
  return n_bytes / f.type_size;
}

size_t grain_blocks(const Format& f) { return std::max<size_t>(1, kMinElementsPerTask / f.block_size); }

}  // namespace

bool is_supported_type(int type) { return find_format(type) != nullptr; }

std::vector<int> supported_types() {
  std::vector<int> types;
  for (const Format& f : kFormats) types.push_back(f.type);
  std::sort(types.begin(), types.end());
  return types;
}

const char* type_name(int type) {
  switch (type) {
    case kTypeQ4_K_R8: return "Q4_K_R8";
    case kTypeQ6_K_R8: return "Q6_K_R8";
    case kTypeQ8_0_R8: return "Q8_0_R8";
    case kTypeQ5_0_R8: return "Q5_0_R8";
    case kTypeQ4_0_R8: return "Q4_0_R8";
    case kTypeQ4_1_R8: return "Q4_1_R8";
    default: break;
  }
  const Format* f = find_format(type);
  return f ? f->name : "unknown";
}

// A repacked type (kernels/repack.h) has its base type's blocks, interleaved.
size_t block_size(int type) { return require_format(base_type(type)).block_size; }

size_t type_size(int type) { return require_format(base_type(type)).type_size; }

size_t element_count(int type, size_t n_bytes) {
  const Format& f = require_format(type);
  if (n_bytes % f.type_size != 0) {
    throw std::invalid_argument(std::to_string(n_bytes) + " bytes is not a whole number of " +
                                f.name + " blocks (" + std::to_string(f.type_size) +
                                " bytes each): the data is truncated or of another type");
  }
  return n_bytes / f.type_size * f.block_size;
}

void dequantize_to_f32(const uint8_t* src, size_t n_bytes, int type, float* dst,
                       size_t n_elements) {
  const Format& f = require_format(type);
  const size_t n_blocks = check_sizes(f, n_bytes, n_elements);
  parallel_for(n_blocks, grain_blocks(f), [&](size_t begin, size_t end) {
    f.to_f32(src + begin * f.type_size, dst + begin * f.block_size, end - begin);
  });
}

uint16_t fp32_to_fp16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof(x));
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;      // NaN: a quiet NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;     // >= 65520 rounds to infinity (and inf stays)
  if (abs >= 0x38800000u) {                           // a normal fp16 (>= 2^-14)
    uint32_t h = ((abs >> 23) - 112u) << 10 | ((abs & 0x7fffffu) >> 13);
    const uint32_t rest = abs & 0x1fffu;              // the 13 bits dropped
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may raise the exponent: right
    return sign | static_cast<uint16_t>(h);
  }
  if (abs < 0x33000000u) return sign;                 // <= 2^-25 rounds to zero
  // A subnormal fp16: m * 2^-24 with m = the 24-bit mantissa * 2^(exponent - 126), rounded.
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - (abs >> 23);          // 14..24
  uint32_t m = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (m & 1u))) ++m; // m = 1024 is the smallest normal: right
  return sign | static_cast<uint16_t>(m);
}

namespace {

// Dequantise into 16-bit patterns: data already of type `same_type` is
// copied, F32 data is rounded as it is, anything else is dequantised a batch
// at a time to fp32 and then rounded. round(f32 bytes, dst, n) rounds n values.
template <class RoundRow>
void dequantize_rounded(const uint8_t* src, size_t n_bytes, int type, uint16_t* dst,
                        size_t n_elements, int same_type, RoundRow round) {
  const Format& f = require_format(type);
  const size_t n_blocks = check_sizes(f, n_bytes, n_elements);
  parallel_for(n_blocks, grain_blocks(f), [&](size_t begin, size_t end) {
    const uint8_t* s = src + begin * f.type_size;
    uint16_t* y = dst + begin * f.block_size;
    const size_t n = end - begin;
    if (f.type == same_type) {
      std::memcpy(y, s, n * sizeof(uint16_t));  // already in the target format
      return;
    }
    if (f.type == kTypeF32) {
      round(s, y, n);
      return;
    }
    float tmp[kBf16BatchElements];
    const size_t batch_blocks = kBf16BatchElements / f.block_size;
    for (size_t b = 0; b < n; b += batch_blocks) {
      const size_t nb = std::min(batch_blocks, n - b);
      f.to_f32(s + b * f.type_size, tmp, nb);
      round(reinterpret_cast<const uint8_t*>(tmp), y + b * f.block_size, nb * f.block_size);
    }
  });
}

void round_to_f16(const uint8_t* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof(float));
    dst[i] = fp32_to_fp16(v);
  }
}

}  // namespace

void dequantize_to_bf16(const uint8_t* src, size_t n_bytes, int type, uint16_t* dst,
                        size_t n_elements) {
  dequantize_rounded(src, n_bytes, type, dst, n_elements, kTypeBF16,
                     [](const uint8_t* f32, uint16_t* out, size_t n) { round_to_bf16(f32, out, n); });
}

void dequantize_to_f16(const uint8_t* src, size_t n_bytes, int type, uint16_t* dst,
                       size_t n_elements) {
  dequantize_rounded(src, n_bytes, type, dst, n_elements, kTypeF16, round_to_f16);
}

float fp16_to_fp32(uint16_t h) { return half_to_float(h); }

void fp16_to_fp32_row(const uint8_t* src, size_t n, float* dst) { dequant_f16(src, dst, n); }

void fp16_to_fp32_row_portable(const uint8_t* src, size_t n, float* dst) {
  dequant_f16_portable(src, dst, n);
}

uint16_t fp32_to_bf16(float f) { return float_bits_to_bf16(float_bits(f)); }

}  // namespace lever

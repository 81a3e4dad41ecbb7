// aarch64 SIMD support for the NEON dot kernels (qdot_kquants_neon.cpp,
// qdot_blocks32_neon.cpp); empty on other architectures. Include it FIRST in
// a kernel source, before any other header.
//
// No fused multiply-add. The kernels must give the scalar path's fp32 results
// bit for bit, so every float multiply and add is rounded on its own. In C++
// GCC contracts a * b + c into fmadd/fmla by default (-ffp-contract=fast;
// -std=c++17 turns contraction off for C only, not for C++), and
// arm_neon.h's vmulq_f32 / vaddq_f32 are plain vector `*` and `+`, which get
// contracted too. The pragma below switches contraction off for the rest of
// the including file, whatever the build flags (the build should also pass
// -ffp-contract=off for these files and for the scalar reference kernels).
//
// Target attributes: the files are compiled for plain armv8-a (ASIMD); the
// functions using sdot (vdotq_s32) or smmla (vmmlaq_s32) carry LEVER_DOTPROD /
// LEVER_I8MM and run only where qdot.cpp's hwcap check allows. Plain
// (attribute-less) inline helpers may be inlined into both.
#pragma once

#if defined(__aarch64__)

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

#include <arm_neon.h>

#define LEVER_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#define LEVER_I8MM __attribute__((target("arch=armv8.6-a+i8mm")))
#define LEVER_NEON_INLINE inline __attribute__((always_inline))

namespace lever {
namespace neon {

// Interleaves two rows for smmla (vmmlaq_s32, which multiplies a 2x8 int8
// matrix by an 8x2 one): given 16 bytes of row a and of row b,
//   lo = [a[0..7], b[0..7]], hi = [a[8..15], b[8..15]].
LEVER_NEON_INLINE void zip_rows(int8x16_t a, int8x16_t b, int8x16_t& lo, int8x16_t& hi) {
  const int64x2_t a64 = vreinterpretq_s64_s8(a), b64 = vreinterpretq_s64_s8(b);
  lo = vreinterpretq_s8_s64(vzip1q_s64(a64, b64));
  hi = vreinterpretq_s8_s64(vzip2q_s64(a64, b64));
}

// Sums of the four int32x4 vectors, one per lane: [sum a, sum b, sum c, sum d].
LEVER_NEON_INLINE int32x4_t lane_sums(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
  return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

}  // namespace neon
}  // namespace lever

#endif  // __aarch64__

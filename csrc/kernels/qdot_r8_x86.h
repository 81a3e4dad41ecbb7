// Internal to the x86-64 group kernels for repacked weights (qdot_r8.cpp:
// AVX2; qdot_r8_vnni.cpp: AVX-512 VNNI): the pieces both families read the
// same way. Lane r of every 256-bit vector is weight row r of the group
// (repack.h); these helpers only load and decode, they do no arithmetic whose
// rounding could differ between the families.
#pragma once

#if defined(__x86_64__)

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/qdot.h"
#include "kernels/qdot_r8.h"
#include "kernels/x86_simd.h"

#define LEVER_R8_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace lever {
namespace r8 {

LEVER_R8_AVX2 inline __m256i load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// The 4 bytes at p in every 32-bit lane.
LEVER_R8_AVX2 inline __m256i broadcast4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// The 8 fp16 values at p as fp32 (exact).
LEVER_R8_AVX2 inline __m256 halves8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The 6-bit scales and mins of a Q4_K group-block's 8 rows (as the scalar
// unpack_q4k_scales, lane-wise): byte j of lane r of sc_lo / sc_hi is the
// scale of sub-block j / j + 4 of row r; likewise mn_lo / mn_hi for the mins.
struct Q4KScalesR8 {
  __m256i sc_lo, sc_hi, mn_lo, mn_hi;
};

LEVER_R8_AVX2 inline Q4KScalesR8 q4k_scales_r8(const uint8_t* g) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i low6 = _mm256_set1_epi8(0x3F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  const __m256i a = load256(g + 32), b = load256(g + 64), c = load256(g + 96);
  return {_mm256_and_si256(a, low6),
          _mm256_or_si256(_mm256_and_si256(c, low4), _mm256_and_si256(_mm256_srli_epi32(a, 2), bits45)),
          _mm256_and_si256(b, low6),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(c, 4), low4),
                          _mm256_and_si256(_mm256_srli_epi32(b, 2), bits45))};
}

// Q6_K value bits: the low 4 bits of a ql word (nibble s / 2) and the 2 high
// bits of a qh word (bits 2s, 2s + 1) as one byte per value, s < 4.
LEVER_R8_AVX2 inline __m256i q6k_values(__m256i ql, __m256i qh, int s) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  const __m256i lo = s < 2 ? _mm256_and_si256(ql, low4)
                           : _mm256_and_si256(_mm256_srli_epi16(ql, 4), low4);
  __m256i hi;
  switch (s) {
    case 0: hi = _mm256_slli_epi16(qh, 4); break;
    case 1: hi = _mm256_slli_epi16(qh, 2); break;
    case 2: hi = qh; break;
    default: hi = _mm256_srli_epi16(qh, 2); break;
  }
  return _mm256_or_si256(lo, _mm256_and_si256(hi, bits45));
}

// The 32 values of a 4-bit group-block (Q4_0 / Q5_0 / Q4_1 layout T) as
// bytes: q[2t] holds elements 4t .. 4t+3 (low nibbles of qs word t),
// q[2t+1] elements 16+4t .. 16+4t+3 (high nibbles), each lane one row;
// Q5_0's 5th bit (bit j of the row's qh for element j) is or-ed in.
template <class T>
LEVER_R8_AVX2 inline void nibble_values(const uint8_t* g, __m256i q[8]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int t = 0; t < 4; ++t) {
    const __m256i qs = load256(g + T::kQs + 32 * t);
    q[2 * t] = _mm256_and_si256(qs, low4);
    q[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16(qs, 4), low4);
  }
  if constexpr (T::kHighBit) {
    // sel[k] puts byte k of each row's qh into all 4 bytes of its lane;
    // mask[p] tests bit 4p + i in byte i. Elements 4t+i have their bit in
    // qh byte t/2, elements 16+4t+i in byte 2 + t/2.
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    __m256i sel[4], mask[2];
    for (int k = 0; k < 4; ++k) {
      const int32_t b = 0x01010101 * k;
      sel[k] = _mm256_setr_epi32(b, b + 0x04040404, b + 0x08080808, b + 0x0C0C0C0C,
                                 b, b + 0x04040404, b + 0x08080808, b + 0x0C0C0C0C);
    }
    mask[0] = _mm256_set1_epi32(0x08040201);
    mask[1] = _mm256_set1_epi32(static_cast<int32_t>(0x80402010u));
    const __m256i qh = load256(g + 16);
    for (int t = 0; t < 4; ++t) {
      for (int half = 0; half < 2; ++half) {
        const __m256i m = mask[t % 2];
        const __m256i hb = _mm256_cmpeq_epi8(
            _mm256_and_si256(_mm256_shuffle_epi8(qh, sel[2 * half + t / 2]), m), m);
        q[2 * t + half] = _mm256_or_si256(q[2 * t + half], _mm256_and_si256(hb, bit4));
      }
    }
  }
}

// The scalar kernels' float steps per block, lane-wise (one rounding each;
// the kernel files are built with -ffp-contract=off).
//   Q4_K:            acc + ((d * xd) * float(dot) - (dmin * xd) * float(offs))
//   Q6_K, Q8_0, Q5_0, Q4_0:  acc + (d * xd) * float(isum)
//   Q4_1:            acc + xd * (d * float(isum) + m * float(x.sum))
LEVER_R8_AVX2 inline __m256 q4k_update(__m256 acc, __m256 vd, __m256 vdmin, float xd, __m256i dot,
                                       __m256i offs) {
  const __m256 vxd = _mm256_set1_ps(xd);
  const __m256 a = _mm256_mul_ps(_mm256_mul_ps(vd, vxd), _mm256_cvtepi32_ps(dot));
  const __m256 m = _mm256_mul_ps(_mm256_mul_ps(vdmin, vxd), _mm256_cvtepi32_ps(offs));
  return _mm256_add_ps(acc, _mm256_sub_ps(a, m));
}

LEVER_R8_AVX2 inline __m256 scaled_update(__m256 acc, __m256 vd, float xd, __m256i isum) {
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(vd, _mm256_set1_ps(xd)),
                                          _mm256_cvtepi32_ps(isum)));
}

LEVER_R8_AVX2 inline __m256 min_update(__m256 acc, __m256 vd, __m256 vm, float xd, __m256i isum,
                                       int32_t xsum) {
  const __m256 t = _mm256_add_ps(_mm256_mul_ps(vd, _mm256_cvtepi32_ps(isum)),
                                 _mm256_mul_ps(vm, _mm256_set1_ps(static_cast<float>(xsum))));
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(xd), t));
}

// The AVX-512 VNNI group kernel of repacked `type` (qdot_r8_vnni.cpp);
// nullptr for a type that is not repacked.
DotGroupFn avx512_group_kernel(int type);

}  // namespace r8
}  // namespace lever

#endif  // __x86_64__

// Reading the fields of packed ggml blocks: little-endian loads from any
// address (blocks are packed without alignment) and exact fp16 / bf16 -> fp32.
// Shared by the dequantisation and dot kernels.
#pragma once

#include <cstdint>
#include <cstring>

namespace lever {
namespace block_bytes {

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline int32_t load_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bf16 bit pattern -> fp32 (exact: the top 16 bits of the fp32).
inline float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// fp16 (1 sign, 5 exponent, 10 mantissa bits) -> fp32, exact for every input
// (NaN payloads kept). Scalar, with branches: for per-block scales.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;  // exponent and mantissa
  if (em >= 0x7C00u) return bits_float(sign | (em << 13) | 0x7F800000u);  // inf / NaN
  if (em >= 0x0400u) return bits_float(sign | ((em << 13) + (112u << 23)));  // normal: bias 15 -> 127
  // subnormal or zero: em * 2^-24, exact in fp32
  return bits_float(float_bits(static_cast<float>(em) * 0x1p-24f) | sign);
}

}  // namespace block_bytes
}  // namespace lever

// CRC32C: a hardware version per CPU family, a portable slicing-by-8 table
// version, and a dispatcher that picks one once, at first use.
//
// All versions work on the "raw" register (the CRC before the final
// inversion): crc32c() inverts on the way in and on the way out.

#include "io/checksum.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>  // _mm_crc32_u8 / _mm_crc32_u64 (SSE4.2)
#define LEVER_CRC_X86 1
#elif defined(__aarch64__)
#include <arm_acle.h>  // __crc32cb / __crc32cd
#define LEVER_CRC_ARM 1
#if !defined(__ARM_FEATURE_CRC32) && defined(__linux__)
#include <sys/auxv.h>  // getauxval(AT_HWCAP): Linux and Android
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif
#endif

namespace lever {
namespace io {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, bit-reflected

// ---------------------------------------------------------------------------
// Portable: slicing-by-8. table[k][b] is the CRC contribution of byte b
// followed by k zero bytes, so 8 input bytes take 8 lookups.

struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t crc = b;
      for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (kPolynomial & (0u - (crc & 1u)));
      t[0][b] = crc;
    }
    for (int k = 1; k < 8; ++k) {
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    }
  }
};

const Tables& tables() {
  static const Tables instance;  // built once, thread-safe (C++11 statics)
  return instance;
}

// Little-endian 8-byte load, whatever the CPU's byte order.
inline uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint32_t raw_portable(uint32_t crc, const uint8_t* p, size_t n) {
  const Tables& tb = tables();
  const auto& t = tb.t;
  for (; n >= 8; n -= 8, p += 8) {
    const uint64_t v = load_le64(p) ^ crc;
    crc = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^
          t[4][(v >> 24) & 0xFF] ^ t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^
          t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
  }
  for (; n > 0; --n, ++p) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xFF];
  return crc;
}

// ---------------------------------------------------------------------------
// Three streams at once. The CRC instruction takes ~3 cycles but can start
// one per cycle, so long buffers are cut into rounds of three consecutive
// kStreamBytes blocks A, B, C whose CRCs are computed side by side and then
// joined. With raw registers (no inversion):
//   crc(A B) = shift(crc(A)) ^ crc_from_zero(B),
// where shift(x) is the register after feeding kStreamBytes zero bytes into
// x -- a linear map of x's 32 bits, applied with four 256-entry tables.

constexpr size_t kStreamBytes = 8192;  // bytes per stream per round

struct ShiftTables {
  uint32_t t[4][256];  // t[k][v]: shift() of byte v in byte position k
  ShiftTables() {
    static const uint8_t zeros[kStreamBytes] = {};
    uint32_t basis[32];  // shift() of each single bit
    for (int i = 0; i < 32; ++i) basis[i] = raw_portable(1u << i, zeros, kStreamBytes);
    for (int k = 0; k < 4; ++k) {
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t r = 0;
        for (int b = 0; b < 8; ++b) {
          if ((v >> b) & 1u) r ^= basis[8 * k + b];
        }
        t[k][v] = r;
      }
    }
  }
};

inline uint32_t shift(const ShiftTables& s, uint32_t x) {
  return s.t[0][x & 0xFF] ^ s.t[1][(x >> 8) & 0xFF] ^ s.t[2][(x >> 16) & 0xFF] ^ s.t[3][x >> 24];
}

const ShiftTables& shift_tables() {
  static const ShiftTables instance;
  return instance;
}

// Joins the raw CRCs of three consecutive blocks of kStreamBytes: c0 continues
// the running CRC, c1 and c2 started from zero.
inline uint32_t join3(uint32_t c0, uint32_t c1, uint32_t c2) {
  const ShiftTables& s = shift_tables();
  return shift(s, shift(s, c0) ^ c1) ^ c2;
}

// ---------------------------------------------------------------------------
// Hardware: one instruction per 8 bytes, three streams side by side.

#if defined(LEVER_CRC_X86)

__attribute__((target("sse4.2"))) uint32_t raw_hardware(uint32_t crc, const uint8_t* p,
                                                         size_t n) {
#if defined(__x86_64__)
  for (; n >= 3 * kStreamBytes; n -= 3 * kStreamBytes, p += 3 * kStreamBytes) {
    uint64_t c0 = crc, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kStreamBytes; i += 8) {
      uint64_t a, b, c;
      std::memcpy(&a, p + i, 8);
      std::memcpy(&b, p + kStreamBytes + i, 8);
      std::memcpy(&c, p + 2 * kStreamBytes + i, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, c);
    }
    crc = join3(static_cast<uint32_t>(c0), static_cast<uint32_t>(c1), static_cast<uint32_t>(c2));
  }
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  crc = static_cast<uint32_t>(c);
#endif
  for (; n > 0; --n, ++p) crc = _mm_crc32_u8(crc, *p);
  return crc;
}

bool cpu_has_crc_instruction() { return __builtin_cpu_supports("sse4.2"); }
constexpr const char* kHardwareName = "sse4.2";

#elif defined(LEVER_CRC_ARM)

#if defined(__ARM_FEATURE_CRC32)
#define LEVER_CRC_TARGET
#elif defined(__clang__)
#define LEVER_CRC_TARGET __attribute__((target("crc")))
#else
#define LEVER_CRC_TARGET __attribute__((target("+crc")))
#endif

LEVER_CRC_TARGET uint32_t raw_hardware(uint32_t crc, const uint8_t* p, size_t n) {
  for (; n >= 3 * kStreamBytes; n -= 3 * kStreamBytes, p += 3 * kStreamBytes) {
    uint32_t c0 = crc, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kStreamBytes; i += 8) {
      uint64_t a, b, c;
      std::memcpy(&a, p + i, 8);
      std::memcpy(&b, p + kStreamBytes + i, 8);
      std::memcpy(&c, p + 2 * kStreamBytes + i, 8);
      c0 = __crc32cd(c0, a);
      c1 = __crc32cd(c1, b);
      c2 = __crc32cd(c2, c);
    }
    crc = join3(c0, c1, c2);
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    crc = __crc32cd(crc, v);
  }
  for (; n > 0; --n, ++p) crc = __crc32cb(crc, *p);
  return crc;
}

bool cpu_has_crc_instruction() {
#if defined(__ARM_FEATURE_CRC32)
  return true;  // the compiler was told the CPU has it
#elif defined(__linux__)
  return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#else
  return false;
#endif
}
constexpr const char* kHardwareName = "armv8-crc";

#else  // no known instruction

uint32_t raw_hardware(uint32_t crc, const uint8_t* p, size_t n) { return raw_portable(crc, p, n); }
bool cpu_has_crc_instruction() { return false; }
constexpr const char* kHardwareName = "slicing-by-8";

#endif

using RawFn = uint32_t (*)(uint32_t, const uint8_t*, size_t);

struct Dispatch {
  RawFn fn;
  const char* name;
};

const Dispatch& dispatch() {
  static const Dispatch d = cpu_has_crc_instruction() ? Dispatch{&raw_hardware, kHardwareName}
                                                      : Dispatch{&raw_portable, "slicing-by-8"};
  return d;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t value) {
  return ~dispatch().fn(~value, static_cast<const uint8_t*>(data), n);
}

uint32_t crc32c_portable(const void* data, size_t n, uint32_t value) {
  return ~raw_portable(~value, static_cast<const uint8_t*>(data), n);
}

const char* crc32c_implementation() { return dispatch().name; }

}  // namespace io
}  // namespace lever

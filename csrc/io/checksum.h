// CRC32C (Castagnoli polynomial 0x1EDC6F41, bit-reflected 0x82F63B78), the
// checksum the store writes per chunk of every layer extent and the flash
// reader verifies as each chunk arrives.
//
// The convention is zlib's crc32(): `value` is the CRC of the bytes before
// `data` (0 for none), so crc32c(b, crc32c(a)) == crc32c(a + b), and
// crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lever {
namespace io {

// CRC32C of `n` bytes at `data`, continuing from `value`.
// Uses the CPU's CRC32C instruction where there is one (x86 SSE4.2,
// aarch64 CRC extension; picked at run time), otherwise a table.
uint32_t crc32c(const void* data, size_t n, uint32_t value = 0);

// The same with the portable table code, whatever the CPU (for tests).
uint32_t crc32c_portable(const void* data, size_t n, uint32_t value = 0);

// Which implementation crc32c() uses on this CPU: "sse4.2", "armv8-crc" or
// "slicing-by-8".
const char* crc32c_implementation();

}  // namespace io
}  // namespace lever

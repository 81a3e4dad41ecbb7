// Repacking weight matrices into groups of 8 interleaved rows (see repack.h).

#include "kernels/repack.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dequant.h"
#include "kernels/qmatmul.h"

namespace lever {
namespace {

constexpr size_t kQ4KBytes = 144;
constexpr size_t kQ6KBytes = 210;

// One field of a block: `count` items of `width` bytes (4: words, 2: fp16
// values or scale pairs) at byte `src` of each row's block, placed in the
// group-block with row r's item t at dst + stride * t + width * r.
struct Field {
  size_t src, dst, count, width, stride;
};

// The layouts of repack.h, field by field.
constexpr Field kQ4KFields[] = {
    {0, 0, 1, 2, 16},       // d: row r at 2 r
    {2, 16, 1, 2, 16},      // dmin: row r at 16 + 2 r
    {4, 32, 3, 4, 32},      // scale words a, b, c
    {16, 128, 32, 4, 32},   // qs words
};
constexpr Field kQ6KFields[] = {
    {0, 0, 32, 4, 32},       // ql words
    {128, 1024, 16, 4, 32},  // qh words
    {192, 1536, 8, 2, 16},   // scale pairs
    {208, 1664, 1, 2, 16},   // d
};

constexpr Field kQ8_0Fields[] = {{0, 0, 1, 2, 16}, {2, 16, 8, 4, 32}};
constexpr Field kQ5_0Fields[] = {{0, 0, 1, 2, 16}, {2, 16, 1, 4, 32}, {6, 48, 4, 4, 32}};
constexpr Field kQ4_0Fields[] = {{0, 0, 1, 2, 16}, {2, 16, 4, 4, 32}};
constexpr Field kQ4_1Fields[] = {{0, 0, 1, 2, 16}, {2, 16, 1, 2, 16}, {4, 32, 4, 4, 32}};

struct Layout {
  const Field* fields;
  size_t n_fields;
  size_t block_bytes;
};

Layout layout_of(int repacked) {
  if (repacked == kTypeQ4_K_R8) return {kQ4KFields, 4, kQ4KBytes};
  if (repacked == kTypeQ6_K_R8) return {kQ6KFields, 4, kQ6KBytes};
  if (repacked == kTypeQ8_0_R8) return {kQ8_0Fields, 2, 34};
  if (repacked == kTypeQ5_0_R8) return {kQ5_0Fields, 3, 22};
  if (repacked == kTypeQ4_0_R8) return {kQ4_0Fields, 2, 18};
  if (repacked == kTypeQ4_1_R8) return {kQ4_1Fields, 3, 20};
  throw std::invalid_argument("type " + std::to_string(repacked) + " is not a repacked type");
}

// Copies every field between the 8 row blocks (rows[r * block_bytes]) and one
// group-block; to_group: rows -> group, else group -> rows.
void move_fields(const Layout& L, const uint8_t* in, uint8_t* out, bool to_group) {
  for (size_t f = 0; f < L.n_fields; ++f) {
    const Field& F = L.fields[f];
    for (int r = 0; r < kRepackRows; ++r) {
      for (size_t t = 0; t < F.count; ++t) {
        const size_t row_at = r * L.block_bytes + F.src + F.width * t;
        const size_t group_at = F.dst + F.stride * t + F.width * r;
        if (to_group) {
          std::memcpy(out + group_at, in + row_at, F.width);
        } else {
          std::memcpy(out + row_at, in + group_at, F.width);
        }
      }
    }
  }
}

void check_matrix(int repacked, size_t N, size_t K, const char* what) {
  const int base = base_type(repacked);
  if (!can_repack(base, N, K)) {
    throw std::invalid_argument(std::string(what) + ": a " + std::to_string(N) + " x " +
                                std::to_string(K) + " " + type_name(base) +
                                " matrix has no repacked form (rows must be a multiple of " +
                                std::to_string(kRepackRows) + ")");
  }
}

}  // namespace

bool is_repacked_type(int type) {
  return type == kTypeQ4_K_R8 || type == kTypeQ6_K_R8 || type == kTypeQ8_0_R8 ||
         type == kTypeQ5_0_R8 || type == kTypeQ4_0_R8 || type == kTypeQ4_1_R8;
}

int base_type(int type) { return is_repacked_type(type) ? type - kRepackedTypeOffset : type; }

int repacked_type(int type) {
  if (type == kTypeQ4_K) return kTypeQ4_K_R8;
  if (type == kTypeQ6_K) return kTypeQ6_K_R8;
  if (type == kTypeQ8_0) return kTypeQ8_0_R8;
  if (type == kTypeQ5_0) return kTypeQ5_0_R8;
  if (type == kTypeQ4_0) return kTypeQ4_0_R8;
  if (type == kTypeQ4_1) return kTypeQ4_1_R8;
  return -1;
}

bool can_repack(int type, size_t N, size_t K) {
  return repacked_type(type) >= 0 && N > 0 && N % kRepackRows == 0 && K > 0 &&
         K % block_size(type) == 0;
}

void pack_group_block(int type, const uint8_t* in, uint8_t* out) {
  move_fields(layout_of(type), in, out, true);
}

void unpack_group_block(int type, const uint8_t* in, uint8_t* out) {
  move_fields(layout_of(type), in, out, false);
}

void repack_rows(int type, uint8_t* w, size_t N, size_t K) {
  const int repacked = repacked_type(type);
  check_matrix(repacked, N, K, "repack");
  const Layout L = layout_of(repacked);
  const size_t n_blocks = K / block_size(type), row_bytes = n_blocks * L.block_bytes;
  const size_t gb_bytes = kRepackRows * L.block_bytes;
  std::vector<uint8_t> rows(kRepackRows * row_bytes), blocks(gb_bytes);
  for (size_t g = 0; g < N / kRepackRows; ++g) {
    uint8_t* group = w + g * kRepackRows * row_bytes;
    std::memcpy(rows.data(), group, rows.size());
    for (size_t b = 0; b < n_blocks; ++b) {
      for (int r = 0; r < kRepackRows; ++r) {
        std::memcpy(blocks.data() + r * L.block_bytes,
                    rows.data() + r * row_bytes + b * L.block_bytes, L.block_bytes);
      }
      move_fields(L, blocks.data(), group + b * gb_bytes, true);
    }
  }
}

void unpack_rows(int type, const uint8_t* w, size_t N, size_t K, size_t first, size_t n,
                 uint8_t* out) {
  check_matrix(type, N, K, "unpack");
  if (first > N || n > N - first) {
    throw std::invalid_argument("unpack: rows " + std::to_string(first) + " + " +
                                std::to_string(n) + " are outside the " + std::to_string(N) +
                                " rows of the matrix");
  }
  const Layout L = layout_of(type);
  const size_t n_blocks = K / block_size(type), row_bytes = n_blocks * L.block_bytes;
  const size_t gb_bytes = kRepackRows * L.block_bytes;
  std::vector<uint8_t> blocks(gb_bytes);
  // Each group-block is restored once for all the wanted rows of its group.
  for (size_t row0 = first; row0 < first + n;) {
    const size_t g = row0 / kRepackRows;
    const size_t row1 = std::min(first + n, (g + 1) * kRepackRows);  // rows [row0, row1) of group g
    const uint8_t* group = w + g * kRepackRows * row_bytes;
    for (size_t b = 0; b < n_blocks; ++b) {
      move_fields(L, group + b * gb_bytes, blocks.data(), false);
      for (size_t row = row0; row < row1; ++row) {
        std::memcpy(out + (row - first) * row_bytes + b * L.block_bytes,
                    blocks.data() + (row % kRepackRows) * L.block_bytes, L.block_bytes);
      }
    }
    row0 = row1;
  }
}

bool should_repack() {
  const char* env = std::getenv("LEVER_REPACK");  // "0": keep the original layout (A/B runs)
  if (env != nullptr && std::string(env) == "0") return false;
  return default_isa() == Isa::kAvx2 || default_isa() == Isa::kAvx512;
}

}  // namespace lever

// The SIMD K-quant dot kernels against the scalar path, bit for bit: for
// Q4_K and Q6_K and every SIMD Isa this CPU has (avx2, avx512 on x86-64;
// neon, dotprod, i8mm on aarch64; the ones that ran are printed), the row
// kernels for n_x = 1..8, the tile kernels for every (n_w <= 4, n_x <= 16),
// several weight-row offsets and block counts, random and worst-case
// (largest magnitude) blocks, and quant_matmul for several M.
// The repacked kernels (kernels/repack.h, qdot_r8.h) are checked the same
// way on every available Isa: every M from 1 to 64 and every group of the
// matrix, memcmp-equal to the scalar kernel on the original rows, and the
// repack / unpack round trip.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dequant.h"
#include "kernels/qdot.h"
#include "kernels/qdot_r8.h"
#include "kernels/qmatmul.h"
#include "kernels/repack.h"
#include "native_test.h"

namespace {

using lever::Isa;

constexpr int kKquantTypes[] = {lever::kTypeQ4_K, lever::kTypeQ6_K};

// A float with its bit pattern, e.g. "3.30498 (0x40538b2a)".
std::string describe(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", static_cast<double>(f), u);
  return buf;
}

size_t block_bytes_of(int type) { return type == lever::kTypeQ4_K ? 144 : 210; }

// Byte offsets of the fp16 scale fields in a block.
std::vector<size_t> half_fields(int type) {
  if (type == lever::kTypeQ4_K) return {0, 2};  // d, dmin
  return {208};                                 // d
}

// A random finite positive fp16 in [2^-10, 2^-3).
uint16_t random_half(lever_test::Rng& rng) {
  const uint32_t exponent = 5 + rng.next_u32() % 8;  // biased exponent 5..12
  return static_cast<uint16_t>((exponent << 10) | (rng.next_u32() & 0x3FF));
}

// n_rows weight rows of n_blocks blocks: random bytes with finite fp16
// scales; `extreme`: every 4/6-bit value at its maximum and the largest
// scales (Q6_K scales -128), for the integer overflow bounds.
std::vector<uint8_t> make_weights(int type, size_t n_rows, size_t n_blocks,
                                  lever_test::Rng& rng, bool extreme) {
  const size_t bb = block_bytes_of(type);
  std::vector<uint8_t> w(n_rows * n_blocks * bb);
  rng.fill_bytes(w.data(), w.size());
  for (size_t i = 0; i < n_rows * n_blocks; ++i) {
    uint8_t* blk = w.data() + i * bb;
    if (extreme) {
      std::memset(blk, 0xFF, bb);
      if (type == lever::kTypeQ6_K) std::memset(blk + 192, 0x80, 16);  // scales -128
    }
    for (size_t off : half_fields(type)) {
      const uint16_t h = random_half(rng);
      std::memcpy(blk + off, &h, 2);
    }
  }
  return w;
}

// n_x activation rows of K = 256 * n_blocks values (ActQ8K blocks),
// x_stride bytes apart. Random rows go through quantize_activation_row;
// `extreme` rows are written directly with every qs = +-127 (sign random per
// row) and the matching bsums.
struct ActRows {
  std::vector<lever::ActQ8K> storage;
  size_t x_stride = 0;
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(storage.data()); }
};

ActRows make_activations(int type, int n_x, size_t n_blocks, lever_test::Rng& rng,
                         bool extreme) {
  ActRows a;
  const size_t row_bytes = lever::act_row_bytes(type, 256 * n_blocks);
  // One spare block per row so rows are not packed back to back.
  const size_t blocks_per_row = row_bytes / sizeof(lever::ActQ8K) + 1;
  a.x_stride = blocks_per_row * sizeof(lever::ActQ8K);
  a.storage.resize(blocks_per_row * static_cast<size_t>(n_x));
  std::vector<float> xf(256 * n_blocks);
  for (int r = 0; r < n_x; ++r) {
    uint8_t* dst = reinterpret_cast<uint8_t*>(a.storage.data()) + r * a.x_stride;
    if (extreme) {
      const int8_t v = (rng.next_u32() & 1) ? 127 : -127;
      for (size_t b = 0; b < n_blocks; ++b) {
        lever::ActQ8K& blk = reinterpret_cast<lever::ActQ8K*>(dst)[b];
        std::memset(blk.qs, static_cast<uint8_t>(v), 256);
        for (int j = 0; j < 16; ++j) blk.bsums[j] = static_cast<int16_t>(16 * v);
        blk.d = rng.uniform(0.001f, 0.1f);
      }
    } else {
      const float sd = rng.uniform(0.1f, 10.0f);
      for (float& f : xf) f = rng.normal(sd);
      lever::quantize_activation_row(xf.data(), xf.size(), type, dst);
    }
  }
  return a;
}

// SIMD Isas whose K-quant kernels take the scalar kernel's float steps.
bool is_scalar_exact_isa(Isa isa) {
  return isa == Isa::kAvx2 || isa == Isa::kAvx512 || isa == Isa::kNeon || isa == Isa::kDotprod ||
         isa == Isa::kI8mm;
}

std::vector<Isa> available_exact_isas() {
  std::vector<Isa> out;
  for (Isa isa : lever::kAllIsas)
    if (is_scalar_exact_isa(isa) && lever::isa_available(isa)) out.push_back(isa);
  return out;
}

std::string isa_list(const std::vector<Isa>& isas) {
  std::string s;
  for (Isa isa : isas) s += std::string(s.empty() ? "" : ", ") + lever::isa_name(isa);
  return s.empty() ? "none" : s;
}

constexpr size_t kBlockCounts[] = {1, 2, 3, 7};
constexpr int kRowOffsets = 3;  // weight rows start at row 0, 1, 2 of the matrix

// Row kernels for n_x = 1..8 against the scalar kernel, bit for bit.
// Returns the number of comparisons made.
long check_rows(int type, Isa isa, bool extreme, uint64_t seed) {
  lever::DotRowsFn kernel = lever::dot_rows_kernel(type, isa);
  lever::DotRowsFn scalar = lever::dot_rows_kernel(type, Isa::kScalar);
  CHECK(kernel != nullptr);
  CHECK(scalar != nullptr);
  if (kernel == nullptr || scalar == nullptr) return 0;
  long compared = 0;
  lever_test::Rng rng(seed);
  for (size_t n_blocks : kBlockCounts) {
    const std::vector<uint8_t> w = make_weights(type, kRowOffsets + 1, n_blocks, rng, extreme);
    const ActRows a = make_activations(type, lever::kMaxDotRows, n_blocks, rng, extreme);
    const size_t row_bytes = n_blocks * block_bytes_of(type);
    for (int off = 0; off < kRowOffsets; ++off) {
      const uint8_t* wr = w.data() + off * row_bytes;
      for (int n_x = 1; n_x <= lever::kMaxDotRows; ++n_x) {
        float got[lever::kMaxDotRows], want[lever::kMaxDotRows];
        kernel(wr, a.data(), a.x_stride, n_x, n_blocks, got);
        scalar(wr, a.data(), a.x_stride, n_x, n_blocks, want);
        const long diff = lever_test::first_bit_difference(got, want, n_x);
        CHECK_MSG(diff < 0, lever::type_name(type) << " " << lever::isa_name(isa) << " rows: n_x="
                                << n_x << " n_blocks=" << n_blocks << " offset=" << off
                                << " extreme=" << extreme << " row " << diff << ": got "
                                << describe(got[diff < 0 ? 0 : diff]) << " want "
                                << describe(want[diff < 0 ? 0 : diff]));
        compared += n_x;
      }
    }
  }
  return compared;
}

// Tile kernels for every (n_w 1..4, n_x 1..16) against `reference` (the
// scalar row kernel, or on x86 the Isa's own row kernel), bit for bit; also
// checks that nothing outside the tile is written.
long check_tiles(int type, Isa isa, lever::DotRowsFn reference, bool extreme, uint64_t seed) {
  lever::DotTileFn tile = lever::dot_tile_kernel(type, isa);
  if (tile == nullptr) return 0;
  long compared = 0;
  lever_test::Rng rng(seed);
  const float sentinel = -12345.5f;
  for (size_t n_blocks : kBlockCounts) {
    const size_t row_bytes = n_blocks * block_bytes_of(type);
    const std::vector<uint8_t> w =
        make_weights(type, kRowOffsets + lever::kMaxTileW, n_blocks, rng, extreme);
    const ActRows a = make_activations(type, lever::kMaxTileX, n_blocks, rng, extreme);
    // Reference: every weight row against all activation rows.
    const int n_ref_rows = kRowOffsets + lever::kMaxTileW;
    std::vector<float> want(static_cast<size_t>(n_ref_rows) * lever::kMaxTileX);
    for (int c = 0; c < n_ref_rows; ++c)
      reference(w.data() + c * row_bytes, a.data(), a.x_stride, lever::kMaxTileX, n_blocks,
                want.data() + static_cast<size_t>(c) * lever::kMaxTileX);
    for (int off = 0; off < kRowOffsets; ++off) {
      for (int n_w = 1; n_w <= lever::kMaxTileW; ++n_w) {
        for (int n_x = 1; n_x <= lever::kMaxTileX; ++n_x) {
          const size_t out_stride = static_cast<size_t>(n_w) + 1;
          std::vector<float> out(out_stride * n_x, sentinel);
          tile(w.data() + off * row_bytes, row_bytes, n_w, a.data(), a.x_stride, n_x, n_blocks,
               out.data(), out_stride);
          for (int r = 0; r < n_x; ++r) {
            for (int c = 0; c < n_w; ++c) {
              const float got = out[r * out_stride + c];
              const float ref = want[static_cast<size_t>(off + c) * lever::kMaxTileX + r];
              CHECK_MSG(lever_test::same_bits(got, ref),
                        lever::type_name(type) << " " << lever::isa_name(isa) << " tile n_w=" << n_w
                                               << " n_x=" << n_x << " n_blocks=" << n_blocks
                                               << " offset=" << off << " extreme=" << extreme
                                               << " pair (" << c << "," << r << "): got "
                                               << describe(got) << " want " << describe(ref));
              ++compared;
            }
            CHECK_MSG(lever_test::same_bits(out[r * out_stride + n_w], sentinel),
                      "tile wrote outside the tile: n_w=" << n_w << " n_x=" << n_x);
          }
        }
      }
    }
  }
  return compared;
}

// quant_matmul with `isa` against Isa::kScalar, bit for bit.
long check_matmul(int type, Isa isa, uint64_t seed) {
  lever_test::Rng rng(seed);
  const size_t K = 256 * 3, N = 37;
  const std::vector<uint8_t> w = make_weights(type, N, K / 256, rng, false);
  long compared = 0;
  for (size_t M : {1, 4, 16, 64, 256}) {
    std::vector<float> x(M * K);
    for (float& f : x) f = rng.normal(1.0f);
    std::vector<float> got(M * N), want(M * N);
    lever::quant_matmul(x.data(), lever::ElemType::kF32, M, K, K, w.data(), type, N, got.data(),
                        lever::ElemType::kF32, N, isa);
    lever::quant_matmul(x.data(), lever::ElemType::kF32, M, K, K, w.data(), type, N,
                        want.data(), lever::ElemType::kF32, N, Isa::kScalar);
    const long diff = lever_test::first_bit_difference(got.data(), want.data(), got.size());
    CHECK_MSG(diff < 0, lever::type_name(type) << " " << lever::isa_name(isa)
                            << " quant_matmul M=" << M << ": element " << diff << ": got "
                            << describe(got[diff < 0 ? 0 : diff]) << " want "
                            << describe(want[diff < 0 ? 0 : diff]));
    compared += static_cast<long>(got.size());
  }
  return compared;
}

}  // namespace

TEST(qdot_kquants_simd_rows_match_scalar) {
  const std::vector<Isa> isas = available_exact_isas();
  if (isas.empty()) SKIP("no avx2 or aarch64 isas here");
  NOTE("isas run: " << isa_list(isas));
  for (Isa isa : isas) {
    for (int type : kKquantTypes) {
      long n = 0;
      for (bool extreme : {false, true}) n += check_rows(type, isa, extreme, 1000 + type);
      NOTE(lever::type_name(type) << " " << lever::isa_name(isa) << ": " << n
                                  << " row results compared");
    }
  }
}

TEST(qdot_kquants_simd_tiles_match_scalar) {
  const std::vector<Isa> isas = available_exact_isas();
  if (isas.empty()) SKIP("no avx2 or aarch64 isas here");
  NOTE("isas run: " << isa_list(isas));
  for (Isa isa : isas) {
    for (int type : kKquantTypes) {
      if (lever::dot_tile_kernel(type, isa) == nullptr) continue;
      lever::DotRowsFn scalar = lever::dot_rows_kernel(type, Isa::kScalar);
      long n = 0;
      for (bool extreme : {false, true}) n += check_tiles(type, isa, scalar, extreme, 2000 + type);
      NOTE(lever::type_name(type) << " " << lever::isa_name(isa) << ": " << n
                                  << " tile results compared");
    }
  }
}

TEST(qdot_kquants_simd_matmul_matches_scalar) {
  const std::vector<Isa> isas = available_exact_isas();
  if (isas.empty()) SKIP("no avx2 or aarch64 isas here");
  for (Isa isa : isas) {
    for (int type : kKquantTypes) {
      const long n = check_matmul(type, isa, 3000 + type);
      NOTE(lever::type_name(type) << " " << lever::isa_name(isa) << ": " << n
                                  << " quant_matmul outputs compared");
    }
  }
}

namespace {

// The repacked kernels of `type` on `isa` against the scalar kernel on the
// original rows: every M in 1..64, every group of an N-row matrix.
long check_repacked(int type, Isa isa, bool extreme, uint64_t seed) {
  const int rtype = lever::repacked_type(type);
  const lever::DotGroupFn group = lever::dot_group_kernel(rtype, isa);
  const lever::DotRowsFn scalar = lever::dot_rows_kernel(type, Isa::kScalar);
  REQUIRE(group != nullptr && scalar != nullptr);
  lever_test::Rng rng(seed);
  long compared = 0;
  for (size_t n_blocks : {size_t{1}, size_t{3}}) {
    const size_t N = 16, K = 256 * n_blocks, row_bytes = n_blocks * block_bytes_of(type);
    const std::vector<uint8_t> w = make_weights(type, N, n_blocks, rng, extreme);
    std::vector<uint8_t> packed = w;
    lever::repack_rows(type, packed.data(), N, K);
    std::vector<uint8_t> back(w.size());
    lever::unpack_rows(rtype, packed.data(), N, K, 0, N, back.data());
    CHECK_MSG(back == w, lever::type_name(type) << ": repack / unpack does not give the rows back");
    const ActRows a = make_activations(type, 64, n_blocks, rng, extreme);
    std::vector<float> want(64 * N);
    for (size_t n = 0; n < N; ++n) {
      float out[lever::kMaxDotRows];
      for (int r0 = 0; r0 < 64; r0 += lever::kMaxDotRows) {
        scalar(w.data() + n * row_bytes, a.data() + r0 * a.x_stride, a.x_stride, lever::kMaxDotRows,
               n_blocks, out);
        for (int r = 0; r < lever::kMaxDotRows; ++r) want[(r0 + r) * N + n] = out[r];
      }
    }
    for (int M = 1; M <= 64; ++M) {
      std::vector<float> got(M * N);
      for (size_t g = 0; g < N / lever::kRepackRows; ++g) {
        group(packed.data() + g * lever::kRepackRows * row_bytes, a.data(), a.x_stride, M, n_blocks,
              got.data() + g * lever::kRepackRows, N);
      }
      const long diff = lever_test::first_bit_difference(got.data(), want.data(), got.size());
      CHECK_MSG(diff < 0, lever::type_name(rtype) << " " << lever::isa_name(isa) << " M=" << M
                              << " blocks=" << n_blocks << ": element " << diff << ": got "
                              << describe(got[diff < 0 ? 0 : diff]) << " want "
                              << describe(want[diff < 0 ? 0 : diff]));
      compared += static_cast<long>(got.size());
    }
  }
  return compared;
}

// quant_matmul on repacked weights (isa) against quant_matmul on the original
// rows (scalar), for every M in 1..64 and a matrix of several groups.
long check_repacked_matmul(int type, Isa isa, uint64_t seed) {
  lever_test::Rng rng(seed);
  const size_t K = 256 * 2, N = 40;
  const std::vector<uint8_t> w = make_weights(type, N, K / 256, rng, false);
  std::vector<uint8_t> packed = w;
  lever::repack_rows(type, packed.data(), N, K);
  long compared = 0;
  for (size_t M = 1; M <= 64; ++M) {
    std::vector<float> x(M * K);
    for (float& f : x) f = rng.normal(1.0f);
    std::vector<float> got(M * N), want(M * N);
    lever::quant_matmul(x.data(), lever::ElemType::kF32, M, K, K, packed.data(),
                        lever::repacked_type(type), N, got.data(), lever::ElemType::kF32, N, isa);
    lever::quant_matmul(x.data(), lever::ElemType::kF32, M, K, K, w.data(), type, N, want.data(),
                        lever::ElemType::kF32, N, Isa::kScalar);
    const long diff = lever_test::first_bit_difference(got.data(), want.data(), got.size());
    CHECK_MSG(diff < 0, lever::type_name(type) << " repacked " << lever::isa_name(isa)
                            << " quant_matmul M=" << M << ": element " << diff);
    compared += static_cast<long>(got.size());
  }
  return compared;
}

}  // namespace

TEST(qdot_repacked_match_scalar_every_isa) {
  std::vector<Isa> ran;
  for (Isa isa : lever::kAllIsas) {
    if (!lever::isa_available(isa)) continue;
    ran.push_back(isa);
    for (int type : kKquantTypes) {
      long n = 0;
      for (bool extreme : {false, true}) n += check_repacked(type, isa, extreme, 5000 + type);
      n += check_repacked_matmul(type, isa, 6000 + type);
      NOTE(lever::type_name(type) << "_R8 " << lever::isa_name(isa) << ": " << n
                                  << " results compared with the scalar kernel");
    }
  }
  NOTE("isas run: " << isa_list(ran));
}

// Every Isa has its own group kernel for every repacked type: no two Isas
// share one (a kernel unit's code must not stand in for another's, as it
// would if the linker merged their tile templates).
TEST(qdot_repacked_kernel_per_isa) {
  const int types[] = {lever::kTypeQ4_K_R8, lever::kTypeQ6_K_R8, lever::kTypeQ8_0_R8,
                       lever::kTypeQ5_0_R8, lever::kTypeQ4_0_R8, lever::kTypeQ4_1_R8};
  std::vector<Isa> ran;
  for (int type : types) {
    std::vector<lever::DotGroupFn> seen;
    for (Isa isa : lever::kAllIsas) {
      if (!lever::isa_available(isa)) continue;
      if (type == types[0]) ran.push_back(isa);
      const lever::DotGroupFn fn = lever::dot_group_kernel(type, isa);
      CHECK(fn != nullptr);
      for (lever::DotGroupFn other : seen) CHECK(fn != other);
      seen.push_back(fn);
    }
  }
  NOTE("isas: " << isa_list(ran));
}

TEST(qdot_repacked_rejects_bad_shapes) {
  std::vector<uint8_t> w(7 * 144);
  CHECK(!lever::can_repack(lever::kTypeQ4_K, 7, 256));
  CHECK(!lever::can_repack(lever::kTypeF16, 8, 256));
  CHECK(!lever::can_repack(lever::kTypeQ6_K, 8, 288));
  CHECK(lever::can_repack(lever::kTypeQ6_K, 8, 512));
  bool threw = false;
  try {
    lever::repack_rows(lever::kTypeQ4_K, w.data(), 7, 256);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
}

// The SIMD dot kernels of the 32-value block types (Q8_0, Q5_0, Q4_0, Q4_1;
// csrc/kernels/qdot_blocks32.cpp, qdot_blocks32_neon.cpp) against the scalar
// kernels, bit for bit, for every Isa among avx2 / avx512 / neon / dotprod /
// i8mm that this CPU has:
//  - blocks32_simd_rows_match_scalar: dot_rows_kernel for n_x = 1..8 (and 11).
//  - blocks32_simd_tiles_match_scalar: dot_tile_kernel for every n_w 1..4 x
//    n_x 1..16; the cells outside the tile must stay untouched.
//  - blocks32_simd_quant_matmul_matches_scalar: quant_matmul, M in {1, 4, 16,
//    64, 256} (64 and 256 go through the tile kernels).
//  - blocks32_repacked_match_scalar_every_isa: the repacked kernels
//    (kernels/repack.h, qdot_r8.h) on every available Isa, every M in 1..64,
//    and quant_matmul on repacked weights, against the scalar kernel on the
//    original rows; the repack / unpack round trip.
// Each over n_blocks in {1, 2, 3, 28} and several weight-row offsets (the
// weight rows are packed blocks at any byte address). Weights are random
// bytes with finite small fp16 scales / offsets (zero and subnormal
// included); activations are random rows quantised by quantize_activation_row.
// With none of those Isas there is nothing to compare: the tests say so and
// check only that the scalar kernels exist and agree with quant_matmul.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/dequant.h"
#include "kernels/qdot.h"
#include "kernels/qdot_r8.h"
#include "kernels/qmatmul.h"
#include "kernels/repack.h"
#include "native_test.h"

using namespace lever;

namespace {

struct BlockType {
  int type;
  const char* name;
  size_t block_bytes;
  bool has_min;  // an fp16 offset m after the scale (Q4_1)
};

const BlockType kBlockTypes[] = {{kTypeQ8_0, "q8_0", 34, false},
                                 {kTypeQ5_0, "q5_0", 22, false},
                                 {kTypeQ4_0, "q4_0", 18, false},
                                 {kTypeQ4_1, "q4_1", 20, true}};

const size_t kBlockCounts[] = {1, 2, 3, 28};

// The SIMD Isas this CPU runs (all take the scalar float steps).
std::vector<Isa> exact_isas_here() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kNeon, Isa::kDotprod, Isa::kI8mm}) {
    if (isa_available(isa)) isas.push_back(isa);
  }
  return isas;
}

std::string isa_list(const std::vector<Isa>& isas) {
  std::string s;
  for (Isa isa : isas) s += std::string(s.empty() ? "" : ", ") + isa_name(isa);
  return s;
}

// A finite fp16 of magnitude below 2: random sign and mantissa, exponent field
// 0..15 (0: zero or subnormal).
uint16_t small_half(lever_test::Rng& rng) {
  const uint32_t r = rng.next_u32();
  return static_cast<uint16_t>((r & 0x8000u) | (((r >> 16) % 16) << 10) | (r & 0x3FFu));
}

// n_rows weight rows of n_blocks blocks each, packed, starting `shift` bytes
// into the returned buffer.
std::vector<uint8_t> random_weights(lever_test::Rng& rng, const BlockType& t, size_t n_rows,
                                    size_t n_blocks, size_t shift) {
  std::vector<uint8_t> buf(shift + n_rows * n_blocks * t.block_bytes);
  rng.fill_bytes(buf.data(), buf.size());
  for (size_t b = 0; b < n_rows * n_blocks; ++b) {
    uint8_t* blk = buf.data() + shift + b * t.block_bytes;
    const uint16_t d = small_half(rng);
    std::memcpy(blk, &d, 2);
    if (t.has_min) {
      const uint16_t m = small_half(rng);
      std::memcpy(blk + 2, &m, 2);
    }
  }
  return buf;
}

// n_rows activation rows of K = 32 * n_blocks values, quantised, row_stride
// bytes apart (more than a row: rows need not be 64-byte aligned). Row 0 has
// an all-zero block (d = 0); every fourth row is scaled up 1000 times.
std::vector<uint8_t> random_activations(lever_test::Rng& rng, int type, size_t n_rows,
                                        size_t n_blocks, size_t row_stride) {
  const size_t K = 32 * n_blocks;
  std::vector<uint8_t> buf(n_rows * row_stride);
  std::vector<float> row(K);
  for (size_t r = 0; r < n_rows; ++r) {
    const float scale = r % 4 == 3 ? 1000.0f : 1.0f;
    for (size_t k = 0; k < K; ++k) row[k] = rng.normal(scale);
    if (r == 0) {
      for (size_t k = 0; k < 32; ++k) row[K - 32 + k] = 0.0f;
    }
    quantize_activation_row(row.data(), K, type, buf.data() + r * row_stride);
  }
  return buf;
}

bool same_floats(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Sentinel of the tile tests' output cells outside the tile.
constexpr float kSentinel = -12345.5f;
// Row stride of the tile tests' output: wider than any tile, so that the
// cells with c >= n_w must keep the sentinel.
constexpr size_t kOutStride = kMaxTileW + 2;

// The first cell of a tile call's output (kMaxTileX rows of kOutStride) that
// is wrong: inside the n_x x n_w tile it must equal want[r][c] bitwise,
// outside it must still hold kSentinel. Returns false if there is none.
bool first_wrong_cell(const float* out, const float (*want)[kMaxTileW], int n_w, int n_x,
                      int* bad_r, int* bad_c) {
  for (int r = 0; r < kMaxTileX; ++r) {
    for (int c = 0; c < static_cast<int>(kOutStride); ++c) {
      const float v = out[r * kOutStride + c];
      const bool ok = r < n_x && c < n_w ? lever_test::same_bits(v, want[r][c])
                                         : lever_test::same_bits(v, kSentinel);
      if (!ok) {
        *bad_r = r;
        *bad_c = c;
        return true;
      }
    }
  }
  return false;
}

}  // namespace

TEST(blocks32_simd_rows_match_scalar) {
  const std::vector<Isa> isas = exact_isas_here();
  if (isas.empty()) NOTE("no avx2 / aarch64 isas here: scalar kernels only");
  else NOTE("isas: " << isa_list(isas));
  lever_test::Rng rng(0xB32);
  long compared = 0;
  for (const BlockType& t : kBlockTypes) {
    const DotRowsFn scalar = dot_rows_kernel(t.type, Isa::kScalar);
    REQUIRE(scalar != nullptr);
    for (size_t n_blocks : kBlockCounts) {
      const size_t w_row = n_blocks * t.block_bytes;
      const size_t x_stride = act_row_bytes(t.type, 32 * n_blocks) + 8;
      const std::vector<uint8_t> w = random_weights(rng, t, 4, n_blocks, 1);
      const std::vector<uint8_t> x = random_activations(rng, t.type, 11, n_blocks, x_stride);
      for (size_t w_row_index : {0, 1, 3}) {
        const uint8_t* wr = w.data() + 1 + w_row_index * w_row;
        for (int n_x : {1, 2, 3, 4, 5, 6, 7, 8, 11}) {
          float want[16], got[16];
          scalar(wr, x.data(), x_stride, n_x, n_blocks, want);
          for (Isa isa : isas) {
            const DotRowsFn fn = dot_rows_kernel(t.type, isa);
            REQUIRE(fn != nullptr);
            fn(wr, x.data(), x_stride, n_x, n_blocks, got);
            ++compared;
            CHECK_MSG(same_floats(got, want, n_x),
                      t.name << " " << isa_name(isa) << " n_blocks=" << n_blocks << " row="
                             << w_row_index << " n_x=" << n_x << ": first difference at row "
                             << lever_test::first_bit_difference(got, want, n_x));
          }
        }
      }
    }
  }
  NOTE(compared << " row-kernel calls compared bitwise");
}

TEST(blocks32_simd_tiles_match_scalar) {
  const std::vector<Isa> isas = exact_isas_here();
  if (isas.empty()) NOTE("no aarch64 isas here: nothing to compare");
  lever_test::Rng rng(0x711E);
  long compared = 0;
  std::string ran;
  for (const BlockType& t : kBlockTypes) {
    const DotRowsFn scalar = dot_rows_kernel(t.type, Isa::kScalar);
    REQUIRE(scalar != nullptr);
    for (size_t n_blocks : kBlockCounts) {
      const size_t w_row = n_blocks * t.block_bytes;
      const size_t x_stride = act_row_bytes(t.type, 32 * n_blocks) + 12;
      const std::vector<uint8_t> w = random_weights(rng, t, 7, n_blocks, 3);
      const std::vector<uint8_t> x = random_activations(rng, t.type, kMaxTileX, n_blocks, x_stride);
      for (size_t w_row_index : {0, 1, 3}) {
        const uint8_t* w0 = w.data() + 3 + w_row_index * w_row;
        // want[r][c]: scalar dot of weight row c and activation row r.
        float want[kMaxTileX][kMaxTileW];
        for (int c = 0; c < kMaxTileW; ++c) {
          float col[kMaxTileX];
          scalar(w0 + c * w_row, x.data(), x_stride, kMaxTileX, n_blocks, col);
          for (int r = 0; r < kMaxTileX; ++r) want[r][c] = col[r];
        }
        for (Isa isa : isas) {
          const DotTileFn tile = dot_tile_kernel(t.type, isa);
          if (tile == nullptr) continue;
          if (ran.find(isa_name(isa)) == std::string::npos) ran += std::string(" ") + isa_name(isa);
          for (int n_w = 1; n_w <= kMaxTileW; ++n_w) {
            for (int n_x = 1; n_x <= kMaxTileX; ++n_x) {
              float out[kMaxTileX * kOutStride];
              for (float& v : out) v = kSentinel;
              tile(w0, w_row, n_w, x.data(), x_stride, n_x, n_blocks, out, kOutStride);
              ++compared;
              int bad_r = -1, bad_c = -1;
              CHECK_MSG(!first_wrong_cell(out, want, n_w, n_x, &bad_r, &bad_c), t.name << " " << isa_name(isa) << " tile n_blocks=" << n_blocks
                                          << " row=" << w_row_index << " n_w=" << n_w
                                          << " n_x=" << n_x << ": wrong cell (r=" << bad_r
                                          << ", c=" << bad_c << ")");
            }
          }
        }
      }
    }
  }
  NOTE("tile isas:" << (ran.empty() ? " none" : ran) << "; " << compared
                    << " tile calls compared bitwise");
}

TEST(blocks32_simd_quant_matmul_matches_scalar) {
  std::vector<Isa> isas = exact_isas_here();
  const bool arm = !isas.empty();
  if (!arm) {
    // Nothing but scalar here: compare scalar quant_matmul with itself run
    // through the row kernel (a trivial check that the path works).
    NOTE("no avx2 / aarch64 isas here");
  }
  lever_test::Rng rng(0x3A7);
  const size_t K = 32 * 28, N = 37;
  long compared = 0;
  for (const BlockType& t : kBlockTypes) {
    const std::vector<uint8_t> w = random_weights(rng, t, N, K / 32, 0);
    for (size_t M : {1, 4, 16, 64, 256}) {
      std::vector<float> x(M * K);
      for (float& v : x) v = rng.normal(1.0f);
      std::vector<float> want(M * N), got(M * N);
      quant_matmul(x.data(), ElemType::kF32, M, K, K, w.data(), t.type, N, want.data(),
                   ElemType::kF32, N, Isa::kScalar);
      if (!arm) {
        // Row 0, weight row 0 through the scalar row kernel.
        std::vector<uint8_t> xq(act_row_bytes(t.type, K));
        quantize_activation_row(x.data(), K, t.type, xq.data());
        float v = 0.0f;
        dot_rows_kernel(t.type, Isa::kScalar)(w.data(), xq.data(), xq.size(), 1, K / 32, &v);
        CHECK_MSG(lever_test::same_bits(v, want[0]), t.name << " M=" << M);
        ++compared;
        continue;
      }
      for (Isa isa : isas) {
        quant_matmul(x.data(), ElemType::kF32, M, K, K, w.data(), t.type, N, got.data(),
                     ElemType::kF32, N, isa);
        ++compared;
        CHECK_MSG(same_floats(got.data(), want.data(), M * N),
                  t.name << " " << isa_name(isa) << " M=" << M << ": first difference at "
                         << lever_test::first_bit_difference(got.data(), want.data(), M * N));
      }
    }
  }
  NOTE(compared << " quant_matmul results compared bitwise");
}

TEST(blocks32_repacked_match_scalar_every_isa) {
  lever_test::Rng rng(0x5E8);
  std::string ran;
  long compared = 0;
  for (Isa isa : kAllIsas) {
    if (!isa_available(isa)) continue;
    ran += std::string(ran.empty() ? "" : ", ") + isa_name(isa);
    for (const BlockType& t : kBlockTypes) {
      const int rtype = repacked_type(t.type);
      const DotGroupFn group = dot_group_kernel(rtype, isa);
      const DotRowsFn scalar = dot_rows_kernel(t.type, Isa::kScalar);
      REQUIRE(group != nullptr && scalar != nullptr);
      for (size_t n_blocks : {size_t{1}, size_t{3}, size_t{28}}) {
        const size_t N = 16, K = 32 * n_blocks, w_row = n_blocks * t.block_bytes;
        const std::vector<uint8_t> w = random_weights(rng, t, N, n_blocks, 0);
        std::vector<uint8_t> packed = w, back(w.size());
        repack_rows(t.type, packed.data(), N, K);
        unpack_rows(rtype, packed.data(), N, K, 0, N, back.data());
        CHECK_MSG(back == w, t.name << ": repack / unpack does not give the rows back");
        const size_t x_stride = act_row_bytes(t.type, K) + 12;
        const std::vector<uint8_t> x = random_activations(rng, t.type, 64, n_blocks, x_stride);
        std::vector<float> want(64 * N);
        for (size_t n = 0; n < N; ++n) {
          for (int r0 = 0; r0 < 64; r0 += kMaxDotRows) {
            float col[kMaxDotRows];
            scalar(w.data() + n * w_row, x.data() + r0 * x_stride, x_stride, kMaxDotRows, n_blocks, col);
            for (int r = 0; r < kMaxDotRows; ++r) want[(r0 + r) * N + n] = col[r];
          }
        }
        for (int M = 1; M <= 64; ++M) {
          std::vector<float> got(M * N);
          for (size_t g = 0; g < N / kRepackRows; ++g) {
            group(packed.data() + g * kRepackRows * w_row, x.data(), x_stride, M, n_blocks,
                  got.data() + g * kRepackRows, N);
          }
          ++compared;
          CHECK_MSG(same_floats(got.data(), want.data(), got.size()),
                    t.name << "_r8 " << isa_name(isa) << " M=" << M << " blocks=" << n_blocks
                           << ": first difference at "
                           << lever_test::first_bit_difference(got.data(), want.data(), got.size()));
        }
      }
      // quant_matmul on the repacked matrix against the scalar one on the original.
      const size_t K = 32 * 5, N = 40;
      const std::vector<uint8_t> w = random_weights(rng, t, N, K / 32, 0);
      std::vector<uint8_t> packed = w;
      repack_rows(t.type, packed.data(), N, K);
      for (size_t M = 1; M <= 64; ++M) {
        std::vector<float> xf(M * K);
        for (float& v : xf) v = rng.normal(1.0f);
        std::vector<float> want(M * N), got(M * N);
        quant_matmul(xf.data(), ElemType::kF32, M, K, K, w.data(), t.type, N, want.data(),
                     ElemType::kF32, N, Isa::kScalar);
        quant_matmul(xf.data(), ElemType::kF32, M, K, K, packed.data(), rtype, N, got.data(),
                     ElemType::kF32, N, isa);
        ++compared;
        CHECK_MSG(same_floats(got.data(), want.data(), M * N),
                  t.name << "_r8 " << isa_name(isa) << " quant_matmul M=" << M);
      }
    }
  }
  NOTE("isas: " << ran << "; " << compared << " calls compared bitwise");
}

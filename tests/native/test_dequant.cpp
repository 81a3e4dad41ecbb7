// Native tests of dequantisation (kernels/dequant.h): fp16 / bf16 conversions
// against independent references, block formats against per-element
// formulas, bf16 output = fp32 output rounded, size errors.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/dequant.h"
#include "native_test.h"

using namespace lever;

namespace {

// fp16 -> double by the definition (sign, exponent, mantissa).
double fp16_by_definition(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0) v = std::ldexp(m, -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(1024 + m, e - 25);
  return sign ? -v : v;
}

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<uint8_t> random_blocks(int type, size_t n_blocks, uint64_t seed) {
  lever_test::Rng rng(seed);
  std::vector<uint8_t> b(n_blocks * type_size(type));
  rng.fill_bytes(b.data(), b.size());
  // Keep fp16 scales finite and modest: scale fields hold values in [2^-8, 2^-4).
  auto set_half = [&](size_t at) {
    uint16_t h = static_cast<uint16_t>(0x1C00 + rng.next_u32() % 0x1000);
    std::memcpy(&b[at], &h, 2);
  };
  const size_t ts = type_size(type);
  for (size_t i = 0; i < n_blocks; ++i) {
    const size_t o = i * ts;
    switch (type) {
      case kTypeQ4_0: case kTypeQ5_0: case kTypeQ8_0: set_half(o); break;
      case kTypeQ4_1: case kTypeQ5_1: case kTypeQ4_K: case kTypeQ5_K: set_half(o); set_half(o + 2); break;
      case kTypeQ2_K: set_half(o + 80); set_half(o + 82); break;
      case kTypeQ3_K: set_half(o + 108); break;
      case kTypeQ6_K: set_half(o + 208); break;
      default: break;
    }
  }
  return b;
}

std::vector<float> deq(const std::vector<uint8_t>& b, int type) {
  std::vector<float> y(element_count(type, b.size()));
  dequantize_to_f32(b.data(), b.size(), type, y.data(), y.size());
  return y;
}

}  // namespace

TEST(dequant_fp16_exhaustive) {
  // Every fp16 value, through the scalar helper and the F16 kernel.
  std::vector<uint8_t> src(65536 * 2);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    std::memcpy(&src[2 * h], &v, 2);
  }
  std::vector<float> y = deq(src, kTypeF16);
  int bad = 0;
  for (uint32_t h = 0; h < 65536 && bad < 5; ++h) {
    const double want = fp16_by_definition(static_cast<uint16_t>(h));
    const float scalar = fp16_to_fp32(static_cast<uint16_t>(h));
    bool ok;
    if (std::isnan(want)) {
      // NaN: sign kept, payload moved to the top of the fp32 mantissa.
      const uint32_t expect = (static_cast<uint32_t>(h & 0x8000) << 16) | 0x7F800000u |
                              (static_cast<uint32_t>(h & 0x3FF) << 13);
      ok = float_to_bits(y[h]) == expect && float_to_bits(scalar) == expect;
    } else {
      ok = static_cast<double>(y[h]) == want && static_cast<double>(scalar) == want &&
           std::signbit(y[h]) == std::signbit(want);
    }
    if (!ok) ++bad;
    CHECK_MSG(ok, "fp16 0x" << std::hex << h << std::dec << ": kernel " << y[h] << " scalar "
                            << scalar << " want " << want);
  }
}

TEST(dequant_fp32_to_bf16_rounding) {
  CHECK_EQ(fp32_to_bf16(1.0f), 0x3F80);
  CHECK_EQ(fp32_to_bf16(bits_to_float(0x3F808000u)), 0x3F80);  // tie, even stays
  CHECK_EQ(fp32_to_bf16(bits_to_float(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  CHECK_EQ(fp32_to_bf16(bits_to_float(0x3F808001u)), 0x3F81);
  CHECK_EQ(fp32_to_bf16(bits_to_float(0x7F7FFFFFu)), 0x7F80);  // overflows to inf
  CHECK_EQ(fp32_to_bf16(bits_to_float(0xFF800001u)), 0xFFC0);  // NaN stays NaN, sign kept
  CHECK_EQ(fp32_to_bf16(-0.0f), 0x8000);
}

TEST(dequant_q8_0_q4_0_q4_1_formulas) {
  {
    std::vector<uint8_t> b = random_blocks(kTypeQ8_0, 5, 1);
    std::vector<float> y = deq(b, kTypeQ8_0);
    for (size_t i = 0; i < y.size(); ++i) {
      const uint8_t* blk = &b[(i / 32) * 34];
      uint16_t d;
      std::memcpy(&d, blk, 2);
      const float want = static_cast<float>(static_cast<int8_t>(blk[2 + i % 32])) * fp16_to_fp32(d);
      CHECK(lever_test::same_bits(y[i], want));
    }
  }
  {
    std::vector<uint8_t> b = random_blocks(kTypeQ4_0, 5, 2);
    std::vector<float> y = deq(b, kTypeQ4_0);
    for (size_t i = 0; i < y.size(); ++i) {
      const uint8_t* blk = &b[(i / 32) * 18];
      uint16_t d;
      std::memcpy(&d, blk, 2);
      const int j = static_cast<int>(i % 32);
      const int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
      CHECK(lever_test::same_bits(y[i], fp16_to_fp32(d) * static_cast<float>(q - 8)));
    }
  }
  {
    std::vector<uint8_t> b = random_blocks(kTypeQ4_1, 5, 3);
    std::vector<float> y = deq(b, kTypeQ4_1);
    for (size_t i = 0; i < y.size(); ++i) {
      const uint8_t* blk = &b[(i / 32) * 20];
      uint16_t d, m;
      std::memcpy(&d, blk, 2);
      std::memcpy(&m, blk + 2, 2);
      const int j = static_cast<int>(i % 32);
      const int q = j < 16 ? (blk[4 + j] & 15) : (blk[4 + j - 16] >> 4);
      const float prod = fp16_to_fp32(d) * static_cast<float>(q);  // one rounding each
      CHECK(lever_test::same_bits(y[i], prod + fp16_to_fp32(m)));
    }
  }
}

TEST(dequant_q6_k_formula) {
  std::vector<uint8_t> b = random_blocks(kTypeQ6_K, 3, 4);
  std::vector<float> y = deq(b, kTypeQ6_K);
  for (size_t blk = 0; blk < 3; ++blk) {
    const uint8_t* s = &b[blk * 210];
    uint16_t dh;
    std::memcpy(&dh, s + 208, 2);
    const float d = fp16_to_fp32(dh);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, sh = (e % 128) / 32, l = e % 32;
      const int low = (s[64 * h + 32 * (sh % 2) + l] >> (4 * (sh / 2))) & 15;
      const int high = (s[128 + 32 * h + l] >> (2 * sh)) & 3;
      const float dl = d * static_cast<float>(static_cast<int8_t>(s[192 + e / 16]));
      const float want = dl * static_cast<float>((high << 4 | low) - 32);
      CHECK_MSG(lever_test::same_bits(y[blk * 256 + e], want), "block " << blk << " element " << e);
    }
  }
}

TEST(dequant_bf16_output_is_rounded_f32_output) {
  for (int type : supported_types()) {
    const size_t n_blocks = block_size(type) == 1 ? 1000 : 40;
    std::vector<uint8_t> b = random_blocks(type, n_blocks, 100 + type);
    if (type == kTypeF32) {  // finite random floats
      lever_test::Rng rng(5);
      for (size_t i = 0; i < n_blocks; ++i) {
        float v = rng.normal(3.0f);
        std::memcpy(&b[4 * i], &v, 4);
      }
    }
    std::vector<float> f = deq(b, type);
    std::vector<uint16_t> h(f.size());
    dequantize_to_bf16(b.data(), b.size(), type, h.data(), h.size());
    if (type == kTypeBF16) {  // a plain copy (signalling NaNs stay as they are)
      CHECK(std::memcmp(h.data(), b.data(), b.size()) == 0);
      continue;
    }
    size_t bad = 0;
    for (size_t i = 0; i < f.size(); ++i) bad += h[i] != fp32_to_bf16(f[i]);
    CHECK_MSG(bad == 0, type_name(type) << ": " << bad << " values differ");
  }
}

TEST(dequant_large_input_uses_threads_consistently) {
  // Big enough for the thread pool to split it: same bits as block by block.
  std::vector<uint8_t> b = random_blocks(kTypeQ4_K, 2048, 9);  // 512 Ki elements
  std::vector<float> all = deq(b, kTypeQ4_K);
  std::vector<float> one(256);
  for (size_t blk = 0; blk < 2048; blk += 97) {
    dequantize_to_f32(&b[blk * 144], 144, kTypeQ4_K, one.data(), 256);
    CHECK_EQ(lever_test::first_bit_difference(one.data(), &all[blk * 256], 256), -1);
  }
}

TEST(dequant_rejects_bad_sizes) {
  std::vector<uint8_t> b(35);
  std::vector<float> y(32);
  bool threw = false;
  try {
    dequantize_to_f32(b.data(), b.size(), kTypeQ8_0, y.data(), y.size());
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
  threw = false;
  try {
    dequantize_to_f32(b.data(), 34, 99, y.data(), y.size());
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
  CHECK(!is_supported_type(99));
}

TEST(dequant_fp16_row_simd_matches_portable) {
  // fp16_to_fp32_row (NEON fcvtl on aarch64) against the plain C++ loop, bit
  // for bit: every fp16 value, at an odd address, in rows of odd lengths.
  std::vector<uint8_t> src(1 + 65536 * 2);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = static_cast<uint16_t>(h * 40503u);  // a permutation of all values
    std::memcpy(&src[1 + 2 * h], &v, 2);
  }
  std::vector<float> a(65536), b(65536);
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{65535}, size_t{65536}}) {
    std::fill(a.begin(), a.end(), 0.0f);
    std::fill(b.begin(), b.end(), 0.0f);
    fp16_to_fp32_row(src.data() + 1, n, a.data());
    fp16_to_fp32_row_portable(src.data() + 1, n, b.data());
    const long diff = lever_test::first_bit_difference(a.data(), b.data(), n);
    CHECK_MSG(diff < 0, "n " << n << " element " << diff);
  }
  // Signalling NaNs keep their payload (no quiet bit added).
  const uint16_t snan = 0x7C01;
  float out;
  fp16_to_fp32_row(reinterpret_cast<const uint8_t*>(&snan), 1, &out);
  CHECK_EQ(float_to_bits(out), 0x7F802000u);
  uint16_t eight_snans[8];
  for (uint16_t& h : eight_snans) h = 0xFC05;
  float outs[8];
  fp16_to_fp32_row(reinterpret_cast<const uint8_t*>(eight_snans), 8, outs);
  for (float f : outs) CHECK_EQ(float_to_bits(f), 0xFF80A000u);
}

TEST(dequant_q2_k_formula) {
  std::vector<uint8_t> b = random_blocks(kTypeQ2_K, 3, 12);
  std::vector<float> y = deq(b, kTypeQ2_K);
  for (size_t blk = 0; blk < 3; ++blk) {
    const uint8_t* s = &b[blk * 84];
    uint16_t dh, mh;
    std::memcpy(&dh, s + 80, 2);
    std::memcpy(&mh, s + 82, 2);
    const float d = fp16_to_fp32(dh), dmin = fp16_to_fp32(mh);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, sh = (e % 128) / 32, l = e % 32, i = e / 16;
      const int q = (s[16 + 32 * h + l] >> (2 * sh)) & 3;
      const float dl = d * static_cast<float>(s[i] & 15), ml = dmin * static_cast<float>(s[i] >> 4);
      const float prod = dl * static_cast<float>(q);
      CHECK_MSG(lever_test::same_bits(y[blk * 256 + e], prod - ml), "block " << blk << " element " << e);
    }
  }
}

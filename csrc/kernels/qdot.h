// Dot products of block-quantised weight rows with quantised activations.
//
// These are the inner kernels of quantised matrix multiplication
// (kernels/qmatmul.h): one weight row, stored as ggml blocks exactly as in a
// GGUF file or a Lever store, against up to kMaxDotRows activation rows that
// were quantised to 8 bits first. Weights are never expanded to floats in
// memory: each block is unpacked in registers and multiplied with integer
// instructions (AVX2 vpmaddubsw / vpmaddwd, NEON, or plain C++; AVX-512 VNNI
// in the repacked layout, qdot_r8.h), and the block's float scales are applied once per
// block.
//
// Activation formats. An activation row of K values is quantised per block
// of the weight type:
//   - K-quant weights (Q4_K, Q6_K; 256 values per block) use ActQ8K blocks:
//     x[i] ~= d * qs[i], with d = max|x| / 127 over the 256 values and
//     qs[i] = round-to-nearest(x[i] / d) in [-127, 127] (ties away from zero); bsums[j] is the sum
//     of qs[16 j .. 16 j + 15] (for the weights' per-sub-block offsets).
//   - 32-value weight blocks (Q8_0, Q5_0, Q4_0, Q4_1) use ActQ8_32 blocks: the same
//     rule over 32 values, and sum = the sum of the 32 qs.
// A row of K values is K / 256 (or K / 32) consecutive blocks; K must be a
// multiple of the weight type's block size, as it is in every GGUF tensor.
//
// Units: n_blocks counts weight blocks (= activation blocks) in a row;
// strides are in bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lever {

// 64-byte aligned so that each 64-value load stays within one cache line
// (activation rows are allocated 64-byte aligned by the driver).
struct alignas(64) ActQ8K {
  int8_t qs[256];
  int16_t bsums[16];
  float d;
};

struct ActQ8_32 {
  float d;
  int32_t sum;
  int8_t qs[32];
};

// The most activation rows one dot call handles (the weight block is unpacked
// once and used for all of them).
constexpr int kMaxDotRows = 8;

// out[r] = sum over the row of w * x_r, for r in [0, n_x), 1 <= n_x <= kMaxDotRows.
//   w: one weight row, n_blocks consecutive blocks of the weight type.
//   x: activation row 0 (n_blocks ActQ8K or ActQ8_32 blocks); row r starts at
//      x + r * x_stride.
using DotRowsFn = void (*)(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                           size_t n_blocks, float* out);

// The most weight rows / activation rows one tile call handles.
constexpr int kMaxTileW = 4;
constexpr int kMaxTileX = 16;

// Register-tiled kernels: out[r * out_stride + c] = dot(weight row c,
// activation row r) for c < n_w (1 <= n_w <= kMaxTileW) and r < n_x
// (1 <= n_x <= kMaxTileX).
//   w: weight row 0; row c starts at w + c * w_stride.
//   x: activation row 0; row r starts at x + r * x_stride.
// Each block of the n_w weight rows is unpacked once and each activation
// block loaded once for all of them. The result for a (weight row,
// activation row) pair is bit-identical to what the DotRowsFn of the same
// type and Isa gives, whatever n_w, n_x and the pair's place in the tile.
using DotTileFn = void (*)(const uint8_t* w, size_t w_stride, int n_w, const uint8_t* x,
                           size_t x_stride, int n_x, size_t n_blocks, float* out,
                           size_t out_stride);

// Instruction sets a kernel can be built for. kAuto picks the best the
// running CPU supports. x86-64: AVX2, AVX-512. aarch64: kNeon (baseline
// ASIMD, every aarch64 CPU), kDotprod (armv8.2-a sdot/udot), kI8mm (dotprod
// plus the smmla 8-bit matrix multiply of armv8.6-a).
enum class Isa : int {
  kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3, kNeon = 4, kDotprod = 5, kI8mm = 6
};

// Every Isa but kAuto, in order of preference within an architecture.
constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512,
                            Isa::kNeon,   Isa::kDotprod, Isa::kI8mm};

// Name of an Isa ("scalar", "avx2", "avx512", "neon", "dotprod", "i8mm", "auto").
const char* isa_name(Isa isa);

// The Isa named `name` (one of the names above); throws std::invalid_argument
// naming the valid ones otherwise.
Isa isa_from_name(const std::string& name);

// True if the running CPU can execute kernels built for `isa` and this build
// contains them. x86-64 (cpuid): AVX2 needs avx2, fma, f16c; AVX-512 also
// avx512f/bw/vl/dq + VNNI. aarch64 (getauxval AT_HWCAP / AT_HWCAP2): NEON
// needs asimd, dotprod asimddp, i8mm also HWCAP2_I8MM.
bool isa_available(Isa isa);

// The best available Isa on this CPU.
Isa best_isa();

// True if `type` (a ggml type id) has dot kernels (then every available Isa has one).
bool has_dot_kernel(int type);

// True if `type` uses ActQ8K activations (else ActQ8_32).
bool uses_q8k_activations(int type);

// The kernel for weight `type` built for `isa` (kAuto = best_isa()); nullptr
// if the type has no kernel or the Isa is not available.
DotRowsFn dot_rows_kernel(int type, Isa isa);

// The tile kernel for weight `type` built for `isa` (kAuto = best_isa());
// nullptr if there is none (then use dot_rows_kernel).
DotTileFn dot_tile_kernel(int type, Isa isa);

// Per-type kernels, one set per Isa (defined in qdot_kquants.cpp and
// qdot_blocks32.cpp: Q8_0, Q5_0, Q4_0, Q4_1; the aarch64 ones in
// qdot_kquants_neon.cpp and qdot_blocks32_neon.cpp). The AVX2 variants exist
// on x86-64 builds only (kAvx512 runs them too on weights in the GGUF layout:
// its own kernels are the repacked ones, qdot_r8.h), the NEON ones on aarch64 only.
// kI8mm uses the dotprod row kernels and has its own (smmla) tile kernels.
namespace qdot {
void q4_k_scalar(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);
void q6_k_scalar(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);
void q8_0_scalar(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);
void q5_0_scalar(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);
void q4_0_scalar(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);
void q4_1_scalar(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);
#if defined(__x86_64__)
void q4_k_avx2(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);
void q6_k_avx2(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);
void q8_0_avx2(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);
void q5_0_avx2(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);
void q4_0_avx2(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);
void q4_1_avx2(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);
#endif
#if defined(__aarch64__)
#define LEVER_DECLARE_NEON(type)                                                              \
  void type##_neon(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);             \
  void type##_dotprod(const uint8_t*, const uint8_t*, size_t, int, size_t, float*);          \
  void type##_dotprod_tile(const uint8_t*, size_t, int, const uint8_t*, size_t, int, size_t, \
                           float*, size_t);                                                  \
  void type##_i8mm_tile(const uint8_t*, size_t, int, const uint8_t*, size_t, int, size_t,    \
                        float*, size_t);
LEVER_DECLARE_NEON(q4_k)
LEVER_DECLARE_NEON(q6_k)
LEVER_DECLARE_NEON(q8_0)
LEVER_DECLARE_NEON(q5_0)
LEVER_DECLARE_NEON(q4_0)
LEVER_DECLARE_NEON(q4_1)
#undef LEVER_DECLARE_NEON
#endif
}  // namespace qdot

}  // namespace lever

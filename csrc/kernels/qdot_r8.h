// Dot kernels for repacked weights (kernels/repack.h): one group of 8
// interleaved weight rows against any number of quantised activation rows
// (ActQ8K rows for Q4_K / Q6_K, ActQ8_32 rows for Q8_0, Q5_0, Q4_0, Q4_1;
// qdot.h), register-blocked: the group's unpacked weights are
// used for up to 4 activation rows at a time, each (weight row, activation
// row) pair keeping its integer block sums in one SIMD lane.
//
// Every result is bit-identical to the scalar kernel of the base type
// (qdot::q4_k_scalar, q6_k_scalar, ...) on the same row in its original layout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/qdot.h"
#include "kernels/repack.h"

namespace lever {

// out[r * out_stride + c] = dot(weight row c of the group, activation row r)
// for c < kRepackRows and r < n_x (n_x >= 1, any size).
//   w: the group's first group-block (n_blocks group-blocks follow).
//   x: activation row 0; row r starts at x + r * x_stride.
using DotGroupFn = void (*)(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                            size_t n_blocks, float* out, size_t out_stride);

// The group kernel for repacked `type` and `isa` (kAuto = best_isa()): on
// x86 the AVX2 one for kAvx2 and the AVX-512 VNNI one for kAvx512; on aarch64
// the smmla one for kI8mm, the sdot one for kDotprod and the plain ASIMD one
// for kNeon; for kScalar one that restores each group-block to the original
// layout and runs the scalar row kernel (the reference). nullptr for a type
// that is not repacked or an Isa that is not available.
DotGroupFn dot_group_kernel(int type, Isa isa);

// Internal to the group kernels (qdot_r8*.cpp).
namespace r8 {

// Byte offsets inside the activation blocks (qdot.h).
constexpr size_t kActBytes = sizeof(ActQ8K);
constexpr size_t kActD = offsetof(ActQ8K, d);
constexpr size_t kActQs = offsetof(ActQ8K, qs);
constexpr size_t kActBsums = offsetof(ActQ8K, bsums);
constexpr size_t kAct32Bytes = sizeof(ActQ8_32);
constexpr size_t kAct32D = offsetof(ActQ8_32, d);
constexpr size_t kAct32Sum = offsetof(ActQ8_32, sum);
constexpr size_t kAct32Qs = offsetof(ActQ8_32, qs);

// Bytes of one group-block (8 rows' blocks).
constexpr size_t kQ4KGroupBlock = 8 * 144;
constexpr size_t kQ6KGroupBlock = 8 * 210;
constexpr size_t kQ8_0GroupBlock = 8 * 34;

// The 4-bit block types: group-block bytes, where the qs words start, the
// offset subtracted from q (times x.sum), a 5th bit (Q5_0), an fp16 min (Q4_1).
struct Q4_0R8 { static constexpr size_t kGroupBlock = 144, kQs = 16; static constexpr int kOffset = 8; static constexpr bool kHighBit = false, kMin = false; };
struct Q5_0R8 { static constexpr size_t kGroupBlock = 176, kQs = 48; static constexpr int kOffset = 16; static constexpr bool kHighBit = true, kMin = false; };
struct Q4_1R8 { static constexpr size_t kGroupBlock = 160, kQs = 32; static constexpr int kOffset = 0; static constexpr bool kHighBit = false, kMin = true; };

// A tile kernel for a fixed number of activation rows:
// (w, x, x_stride, n_blocks, out, out_stride).
using TileFn = void (*)(const uint8_t*, const uint8_t*, size_t, size_t, float*, size_t);

// Any n_x: full tiles of sizeof...(Tiles) activation rows, then one tile for
// the remainder; the i-th function of Tiles handles i + 1 rows.
template <TileFn... Tiles>
inline void run_group(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                      size_t n_blocks, float* out, size_t out_stride) {
  constexpr int kTile = sizeof...(Tiles);
  constexpr TileFn kFns[] = {Tiles...};
  int r0 = 0;
  for (; r0 + kTile <= n_x; r0 += kTile) {
    kFns[kTile - 1](w, x + r0 * x_stride, x_stride, n_blocks, out + r0 * out_stride, out_stride);
  }
  if (n_x > r0) {
    kFns[n_x - r0 - 1](w, x + r0 * x_stride, x_stride, n_blocks, out + r0 * out_stride,
                       out_stride);
  }
}

// The group kernel of repacked `type` from one tile template per type (Tile<n>::fn
// handles n activation rows), taking kTile activation rows per pass: a
// DotGroupFn for Q4_K, Q6_K, Q8_0, Q5_0, Q4_0, Q4_1; nullptr for another type.
// Each kernel unit keeps its Tile templates in a namespace named after it
// (r8::sdot, r8::asimd, ...): GCC gives rows_in_tiles<n, Tile> weak linkage
// even when Tile is in an anonymous namespace, so two units with the same
// Tile names would share one unit's code.
template <int kTile, template <int> class Tile>
void rows_in_tiles(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x, size_t n_blocks,
                   float* out, size_t out_stride) {
  static_assert(kTile == 4 || kTile == 8, "the tile heights the kernels use");
  if constexpr (kTile == 4) {
    run_group<Tile<1>::fn, Tile<2>::fn, Tile<3>::fn, Tile<4>::fn>(w, x, x_stride, n_x, n_blocks,
                                                                  out, out_stride);
  } else {
    run_group<Tile<1>::fn, Tile<2>::fn, Tile<3>::fn, Tile<4>::fn, Tile<5>::fn, Tile<6>::fn,
              Tile<7>::fn, Tile<8>::fn>(w, x, x_stride, n_x, n_blocks, out, out_stride);
  }
}

template <int kTile, template <int> class Q4K, template <int> class Q6K, template <int> class Q8_0,
          template <int> class Q5_0, template <int> class Q4_0, template <int> class Q4_1>
DotGroupFn group_kernel_of(int type) {
  switch (type) {
    case kTypeQ4_K_R8: return rows_in_tiles<kTile, Q4K>;
    case kTypeQ6_K_R8: return rows_in_tiles<kTile, Q6K>;
    case kTypeQ8_0_R8: return rows_in_tiles<kTile, Q8_0>;
    case kTypeQ5_0_R8: return rows_in_tiles<kTile, Q5_0>;
    case kTypeQ4_0_R8: return rows_in_tiles<kTile, Q4_0>;
    case kTypeQ4_1_R8: return rows_in_tiles<kTile, Q4_1>;
    default: return nullptr;
  }
}

// The aarch64 group kernels of repacked `type` (aarch64 builds only; nullptr
// for a type that is not repacked): sdot (qdot_r8_neon.cpp), baseline ASIMD
// (qdot_r8_asimd.cpp) and smmla (qdot_r8_i8mm.cpp).
DotGroupFn dotprod_group_kernel(int type);
DotGroupFn asimd_group_kernel(int type);
DotGroupFn i8mm_group_kernel(int type);

}  // namespace r8
}  // namespace lever

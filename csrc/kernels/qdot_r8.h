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

namespace lever {

// out[r * out_stride + c] = dot(weight row c of the group, activation row r)
// for c < kRepackRows and r < n_x (n_x >= 1, any size).
//   w: the group's first group-block (n_blocks group-blocks follow).
//   x: activation row 0; row r starts at x + r * x_stride.
using DotGroupFn = void (*)(const uint8_t* w, const uint8_t* x, size_t x_stride, int n_x,
                            size_t n_blocks, float* out, size_t out_stride);

// The group kernel for repacked `type` and `isa` (kAuto = best_isa()): the
// AVX2 one for kAvx2, the AVX-512 VNNI one for kAvx512, otherwise one
// that restores each group-block to the original layout and runs the isa's
// row kernel (the same results, slower). nullptr for a type that is not
// repacked or an Isa that is not available.
DotGroupFn dot_group_kernel(int type, Isa isa);

}  // namespace lever

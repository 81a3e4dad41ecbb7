// Internal helpers of the dot kernels (qdot_kquants*.cpp, qdot_blocks32*.cpp):
// running a row kernel over any number of activation rows, and a tile kernel
// template over any tile of up to kMaxTileW weight rows x kMaxTileX
// activation rows (see DotRowsFn and DotTileFn in qdot.h).
//
// A Kernel class provides kTW, kTX (the largest sub-tile it is instantiated
// for) and `template <int NW, int NX> static void run(w, w_stride, x,
// x_stride, n_blocks, out, out_stride)`. The tile is cut into sub-tiles of at
// most kTW x kTX; every pair's result must not depend on the sub-tile shape.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/qdot.h"

namespace lever {
namespace qdot {
namespace tile_detail {

// Kernel::run<NW, n_x> for 1 <= n_x <= Kernel::kTX.
template <class Kernel, int NW>
inline void dispatch_tile_nx(int n_x, const uint8_t* w, size_t w_stride, const uint8_t* x,
                             size_t x_stride, size_t n_blocks, float* out, size_t out_stride) {
  switch (n_x) {
#define LEVER_CASE(n)                                                                 \
  case n:                                                                             \
    if constexpr (n <= Kernel::kTX)                                                   \
      Kernel::template run<NW, n>(w, w_stride, x, x_stride, n_blocks, out, out_stride); \
    break;
    LEVER_CASE(1) LEVER_CASE(2) LEVER_CASE(3) LEVER_CASE(4)
    LEVER_CASE(5) LEVER_CASE(6) LEVER_CASE(7) LEVER_CASE(8)
    LEVER_CASE(9) LEVER_CASE(10) LEVER_CASE(11) LEVER_CASE(12)
    LEVER_CASE(13) LEVER_CASE(14) LEVER_CASE(15) LEVER_CASE(16)
#undef LEVER_CASE
    default: break;
  }
}

// Runs a row kernel that handles at most kMaxDotRows activation rows (a
// DotRowsFn or any callable with its arguments) over any n_x, in groups.
template <class RowsFn>
inline void in_row_groups(RowsFn rows, const uint8_t* w, const uint8_t* x, size_t x_stride,
                          int n_x, size_t n_blocks, float* out) {
  while (n_x > 0) {
    const int n = n_x < kMaxDotRows ? n_x : kMaxDotRows;
    rows(w, x, x_stride, n, n_blocks, out);
    x += static_cast<size_t>(n) * x_stride;
    out += n;
    n_x -= n;
  }
}

// Splits an n_w x n_x tile (n_w <= kMaxTileW, n_x <= kMaxTileX) into
// sub-tiles of at most Kernel::kTW x Kernel::kTX.
template <class Kernel>
inline void run_tile(const uint8_t* w, size_t w_stride, int n_w, const uint8_t* x,
                     size_t x_stride, int n_x, size_t n_blocks, float* out, size_t out_stride) {
  // Activation sub-tiles outer: the n_w weight rows stay in L1 while each
  // activation sub-tile passes over them.
  for (int r0 = 0; r0 < n_x; r0 += Kernel::kTX) {
    const int nx = n_x - r0 < Kernel::kTX ? n_x - r0 : Kernel::kTX;
    for (int c0 = 0; c0 < n_w; c0 += Kernel::kTW) {
      const int nw = n_w - c0 < Kernel::kTW ? n_w - c0 : Kernel::kTW;
      const uint8_t* wc = w + static_cast<size_t>(c0) * w_stride;
      const uint8_t* xr = x + static_cast<size_t>(r0) * x_stride;
      float* o = out + static_cast<size_t>(r0) * out_stride + c0;
      switch (nw) {
        case 1:
          dispatch_tile_nx<Kernel, 1>(nx, wc, w_stride, xr, x_stride, n_blocks, o, out_stride);
          break;
        case 2:
          if constexpr (Kernel::kTW >= 2)
            dispatch_tile_nx<Kernel, 2>(nx, wc, w_stride, xr, x_stride, n_blocks, o, out_stride);
          break;
        case 3:
          if constexpr (Kernel::kTW >= 3)
            dispatch_tile_nx<Kernel, 3>(nx, wc, w_stride, xr, x_stride, n_blocks, o, out_stride);
          break;
        case 4:
          if constexpr (Kernel::kTW >= 4)
            dispatch_tile_nx<Kernel, 4>(nx, wc, w_stride, xr, x_stride, n_blocks, o, out_stride);
          break;
        default: break;
      }
    }
  }
}

}  // namespace tile_detail
}  // namespace qdot
}  // namespace lever

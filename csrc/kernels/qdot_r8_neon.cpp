// aarch64 dotprod (sdot) group kernels for repacked weights (see qdot_r8.h,
// repack.h; the tiles are in qdot_r8_neon_tiles.h). Empty on other
// architectures.
//
// vdotq_laneq_s32(acc, w, x, k) adds, per lane, the 4 products of that weight
// row's bytes with activation word k of a 16-byte load, so no broadcast is
// needed.

#if defined(__aarch64__)

#include "kernels/neon_simd.h"  // first: it switches fp contraction off

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/block_bytes.h"
#include "kernels/qdot.h"
#include "kernels/qdot_r8.h"
#include "kernels/qdot_r8_neon.h"
#include "kernels/repack.h"

namespace lever {
namespace r8 {
namespace sdot {  // named: see rows_in_tiles (qdot_r8.h)
namespace {

// acc + w0 . x word 0 + w1 . x word 1 + w2 . x word 2 + w3 . x word 3, per lane.
LEVER_DOTPROD LEVER_NEON_INLINE int32x4_t dot4(int32x4_t acc, const int8x16_t (&w)[4], int8x16_t x) {
  acc = vdotq_laneq_s32(acc, w[0], x, 0);
  acc = vdotq_laneq_s32(acc, w[1], x, 1);
  acc = vdotq_laneq_s32(acc, w[2], x, 2);
  return vdotq_laneq_s32(acc, w[3], x, 3);
}

#define LEVER_R8_TARGET LEVER_DOTPROD
#include "kernels/qdot_r8_neon_tiles.h"
#undef LEVER_R8_TARGET

}  // namespace
}  // namespace sdot

DotGroupFn dotprod_group_kernel(int type) {
  return group_kernel_of<4, sdot::Q4K, sdot::Q6K, sdot::Q8_0, sdot::Q5_0, sdot::Q4_0, sdot::Q4_1>(type);
}

}  // namespace r8
}  // namespace lever

#endif  // __aarch64__

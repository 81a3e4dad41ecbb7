// aarch64 baseline (armv8.0 ASIMD, no sdot) group kernels for repacked
// weights (see qdot_r8.h, repack.h; the tiles are in qdot_r8_neon_tiles.h),
// for CPUs such as the Cortex-A53/A55 without the dot-product extension.
// Empty on other architectures.
//
// A 4-byte dot product per lane without sdot: broadcast activation word k to
// every lane, multiply the 16 weight bytes by it into 16 exact int16 products
// (vmull_s8 on each half: |q x| <= 128 * 127 fits), add neighbouring products
// into int32 (vpadalq_s16), and after the four words add the two remaining
// pairs per lane (vpaddq_s32). The integer sums are exact, so the results are
// the sdot kernels' and the scalar kernels', bit for bit.

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
namespace asimd {  // named: see rows_in_tiles (qdot_r8.h)
namespace {

// acc + w0 . x word 0 + w1 . x word 1 + w2 . x word 2 + w3 . x word 3, per lane.
LEVER_NEON_INLINE int32x4_t dot4(int32x4_t acc, const int8x16_t (&w)[4], int8x16_t x) {
  const int32x4_t x32 = vreinterpretq_s32_s8(x);
  int32x4_t rows01 = vdupq_n_s32(0), rows23 = vdupq_n_s32(0);  // [r b01, r b23] per row
  for (int k = 0; k < 4; ++k) {
    int8x16_t xk;
    switch (k) {  // the lane index must be a constant
      case 0: xk = vreinterpretq_s8_s32(vdupq_laneq_s32(x32, 0)); break;
      case 1: xk = vreinterpretq_s8_s32(vdupq_laneq_s32(x32, 1)); break;
      case 2: xk = vreinterpretq_s8_s32(vdupq_laneq_s32(x32, 2)); break;
      default: xk = vreinterpretq_s8_s32(vdupq_laneq_s32(x32, 3)); break;
    }
    rows01 = vpadalq_s16(rows01, vmull_s8(vget_low_s8(w[k]), vget_low_s8(xk)));
    rows23 = vpadalq_s16(rows23, vmull_high_s8(w[k], xk));
  }
  return vaddq_s32(acc, vpaddq_s32(rows01, rows23));
}

#define LEVER_R8_TARGET
#include "kernels/qdot_r8_neon_tiles.h"
#undef LEVER_R8_TARGET

}  // namespace
}  // namespace asimd

DotGroupFn asimd_group_kernel(int type) {
  return group_kernel_of<4, asimd::Q4K, asimd::Q6K, asimd::Q8_0, asimd::Q5_0, asimd::Q4_0, asimd::Q4_1>(type);
}

}  // namespace r8
}  // namespace lever

#endif  // __aarch64__

// See allocator.h.

#include "common/allocator.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace lever {

bool bound_allocator() {
#if defined(__GLIBC__)
  // A fixed threshold also turns off glibc's dynamic adjustment of it.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThresholdBytes)) == 1;
  const bool arenas_ok = mallopt(M_ARENA_MAX, kMaxArenas) == 1;
  return mmap_ok && arenas_ok;
#else
  return false;
#endif
}

}  // namespace lever

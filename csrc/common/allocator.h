// Process-wide malloc settings for running inside a memory limit.
//
// glibc raises its mmap threshold each time a large block is freed, so after
// a model's buffers come and go, later large allocations land on the heap and
// are never given back to the system; and every thread that allocates may get
// an arena of its own. Under one memory limit for the whole process both show
// up as resident memory nobody uses. bound_allocator() fixes the threshold
// (blocks of kMmapThresholdBytes and more are mapped and unmapped on free) and
// caps the arenas at kMaxArenas. Elsewhere than glibc it does nothing.
#pragma once

#include <cstddef>

namespace lever {

constexpr size_t kMmapThresholdBytes = 256u << 10;  // bytes
constexpr int kMaxArenas = 2;

// Returns true when the settings were applied (glibc), false otherwise.
bool bound_allocator();

}  // namespace lever

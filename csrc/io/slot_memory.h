// SlotMemory: the memory a FlashReader reads into, one anonymous mapping per
// buffer, optionally backed by transparent huge pages (2 MiB on x86-64 and
// most aarch64 kernels).
//
// Why huge pages: the kernel hands an O_DIRECT read of user memory to the
// device as one segment per physically contiguous run of pages. With 4 KiB
// pages a 1 MiB chunk is 256 segments, more than a virtio disk takes per
// request (/sys/block/<dev>/queue/max_segments: 254 on the development VM),
// so every chunk went out as two requests of about 520 KiB. Within a 2 MiB
// page a chunk is one segment, and the block layer merges neighbouring
// chunks into requests of up to max_sectors_kb (4 MiB there). Measured on
// that VM, one pass of a 1.1 GB store through 8 slots: 1480 requests of
// 520 KiB and 1.09 GiB/s (median of 16 passes, 0.80 at worst) on 4 KiB
// pages, 200 requests of 3.85 MiB and 1.75 GiB/s (1.57 at worst) on huge
// pages (bench/reader_buffers.py).
//
// The pages are touched once when the buffer is made, so the backing is
// settled (and counted in the process's RSS) before the first read, and
// huge_page_bytes() can say what the kernel gave. Where it gives no huge
// pages (transparent huge pages set to "never", fragmented memory, a
// memory cgroup at its limit, a kernel without them) the buffer is simply
// on 4 KiB pages; the reader's stats say so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lever {
namespace io {

// Bytes of one huge page: the alignment huge-page buffers get.
constexpr size_t kHugePageBytes = size_t{2} << 20;

// Bytes of memory a buffer of `bytes` takes: with huge_pages and at least one
// huge page's worth, rounded up to whole huge pages (io_uring merges a
// registered buffer's pages into large segments only when every page of it is
// a huge page); else `bytes` rounded up to 4096.
size_t slot_memory_bytes(size_t bytes, bool huge_pages);

class SlotMemory {
 public:
  // `bytes` (0 for none) of zeroed memory, 4096-aligned; with `huge_pages`
  // and bytes >= 2 MiB, 2 MiB-aligned, slot_memory_bytes() long and advised
  // for huge pages (madvise MADV_HUGEPAGE). size() is `bytes`. Throws
  // std::bad_alloc if the mapping fails.
  SlotMemory(size_t bytes, bool huge_pages);
  ~SlotMemory();
  SlotMemory(const SlotMemory&) = delete;
  SlotMemory& operator=(const SlotMemory&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }
  size_t mapped() const { return mapped_; }  // bytes of memory it takes (slot_memory_bytes)

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  size_t mapped_ = 0;  // bytes mapped at data_
};

// Bytes of the address ranges (start, length in bytes) that the kernel backs
// with transparent huge pages, as /proc/self/smaps reports them
// (AnonHugePages of each mapping they overlap, at most the overlap); 0
// where smaps cannot be read.
uint64_t huge_page_bytes(const std::vector<std::pair<const void*, size_t>>& ranges);

// The transparent huge page mode of this kernel ("always", "madvise" or
// "never"), or "" if it has none (no /sys/kernel/mm/transparent_hugepage).
std::string transparent_huge_page_mode();

// Whether buffers should be on huge pages: `requested` unless LEVER_HUGE_PAGES
// (env_value; nullptr or "" if unset) is "0" (off) or "1" (on). Any other
// value throws std::invalid_argument.
bool choose_huge_pages(bool requested, const char* env_value);

}  // namespace io
}  // namespace lever

// See slot_memory.h.

#include "io/slot_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <stdexcept>

namespace lever {
namespace io {
namespace {

constexpr size_t kPageBytes = 4096;

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

}  // namespace

size_t slot_memory_bytes(size_t bytes, bool huge_pages) {
  return huge_pages && bytes >= kHugePageBytes ? round_up(bytes, kHugePageBytes) : round_up(bytes, kPageBytes);
}

SlotMemory::SlotMemory(size_t bytes, bool huge_pages) : bytes_(bytes) {
  if (bytes == 0) return;
  mapped_ = slot_memory_bytes(bytes, huge_pages);
  const bool huge = mapped_ % kHugePageBytes == 0 && huge_pages;
  // For huge pages, map one huge page more than needed and keep the 2 MiB-aligned
  // part: the kernel only puts huge pages on aligned 2 MiB ranges.
  const size_t mapped = huge ? mapped_ + kHugePageBytes : mapped_;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  auto* base = static_cast<uint8_t*>(p);
  data_ = base;
  if (huge) {
    const auto addr = reinterpret_cast<uintptr_t>(base);
    data_ = reinterpret_cast<uint8_t*>(round_up(addr, kHugePageBytes));
    const size_t head = static_cast<size_t>(data_ - base);
    if (head > 0) munmap(base, head);
    const size_t tail = mapped - head - mapped_;
    if (tail > 0) munmap(data_ + mapped_, tail);
#if defined(MADV_HUGEPAGE)
    madvise(data_, mapped_, MADV_HUGEPAGE);  // advice only: no huge pages is not an error
#endif
  }
  // Touch every page now (see the header): a write per 4 KiB page.
  for (size_t at = 0; at < mapped_; at += kPageBytes) data_[at] = 0;
}

SlotMemory::~SlotMemory() {
  if (data_ != nullptr) munmap(data_, mapped_);
}

uint64_t huge_page_bytes(const std::vector<std::pair<const void*, size_t>>& ranges) {
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return 0;
  uint64_t total = 0;
  uint64_t overlap = 0;  // bytes of `ranges` inside the mapping being read
  std::string line;
  while (std::getline(smaps, line)) {
    unsigned long long start = 0, end = 0;
    char dash = 0;
    // A mapping's header: "start-end perms offset dev inode [path]" (hex addresses).
    if (std::sscanf(line.c_str(), "%llx%c%llx", &start, &dash, &end) == 3 && dash == '-' &&
        line.find(':') > line.find(' ')) {
      overlap = 0;
      for (const auto& [ptr, len] : ranges) {
        const auto lo = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(ptr));
        const unsigned long long hi = lo + len;
        if (hi > start && lo < end) overlap += std::min(hi, end) - std::max(lo, start);
      }
      continue;
    }
    unsigned long long kb = 0;
    if (overlap > 0 && std::sscanf(line.c_str(), "AnonHugePages: %llu kB", &kb) == 1) {
      total += std::min<uint64_t>(kb * 1024, overlap);
    }
  }
  return total;
}

std::string transparent_huge_page_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string text;
  if (!f || !std::getline(f, text)) return "";
  // e.g. "always [madvise] never": the bracketed word is the mode.
  const size_t open = text.find('['), close = text.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  return text.substr(open + 1, close - open - 1);
}

bool choose_huge_pages(bool requested, const char* env_value) {
  if (env_value == nullptr || env_value[0] == '\0') return requested;
  const std::string v(env_value);
  if (v == "0") return false;
  if (v == "1") return true;
  throw std::invalid_argument("LEVER_HUGE_PAGES must be 0 or 1, got '" + v + "'");
}

}  // namespace io
}  // namespace lever

// Slot buffers (csrc/io/slot_memory.h): how many bytes a buffer takes, its
// alignment, that every byte is usable, the LEVER_HUGE_PAGES rule, and that
// a FlashReader's stats count what its slots take. Whether the kernel gives
// huge pages depends on the machine (qemu-user, THP "never"), so what it
// gave is only reported (NOTE) here; tests/test_flash_reader.py checks it on
// a kernel that offers them.

#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "io/flash_reader.h"
#include "io/slot_memory.h"
#include "native_test.h"

using lever::io::kHugePageBytes;
using lever::io::slot_memory_bytes;
using lever::io::SlotMemory;

namespace {
constexpr size_t kMiB = size_t{1} << 20;
}

TEST(slot_memory_bytes_rounds_huge_slots_to_whole_huge_pages) {
  CHECK_EQ(slot_memory_bytes(0, true), size_t{0});
  CHECK_EQ(slot_memory_bytes(4096, true), size_t{4096});
  CHECK_EQ(slot_memory_bytes(4097, true), size_t{8192});
  CHECK_EQ(slot_memory_bytes(kHugePageBytes - 4096, true), kHugePageBytes - 4096);  // no huge page fits
  CHECK_EQ(slot_memory_bytes(kHugePageBytes, true), kHugePageBytes);
  CHECK_EQ(slot_memory_bytes(kHugePageBytes + 4096, true), 2 * kHugePageBytes);
  CHECK_EQ(slot_memory_bytes(29990912, true), 15 * kHugePageBytes);  // a Qwen2.5-1.5B layer extent
  CHECK_EQ(slot_memory_bytes(29990912, false), size_t{29990912});
}

TEST(slot_memory_is_aligned_zeroed_and_writable) {
  for (const bool huge : {true, false}) {
    for (const size_t bytes : {size_t{4096}, 3 * kMiB + 8192, 4 * kMiB}) {
      SlotMemory m(bytes, huge);
      CHECK_EQ(m.size(), bytes);
      CHECK_EQ(m.mapped(), slot_memory_bytes(bytes, huge));
      const auto addr = reinterpret_cast<uintptr_t>(m.data());
      CHECK_EQ(addr % 4096, uintptr_t{0});
      if (huge && bytes >= kHugePageBytes) CHECK_EQ(addr % kHugePageBytes, uintptr_t{0});
      bool zero = true;
      for (size_t i = 0; i < m.mapped(); i += 4093) zero = zero && m.data()[i] == 0;
      CHECK(zero);
      std::memset(m.data(), 0xA5, m.mapped());  // every byte it claims is ours
      CHECK_EQ(m.data()[m.mapped() - 1], uint8_t{0xA5});
      const uint64_t on_huge = lever::io::huge_page_bytes({{m.data(), m.mapped()}});
      CHECK(on_huge <= m.mapped());
      if (!huge) CHECK_EQ(on_huge, uint64_t{0});
      if (huge && bytes >= kHugePageBytes) {
        NOTE(bytes << " bytes: " << on_huge << " on huge pages (THP mode '"
                   << lever::io::transparent_huge_page_mode() << "')");
      }
    }
  }
}

TEST(huge_pages_choice_and_environment) {
  using lever::io::choose_huge_pages;
  CHECK(choose_huge_pages(true, nullptr));
  CHECK(!choose_huge_pages(false, ""));
  CHECK(!choose_huge_pages(true, "0"));
  CHECK(choose_huge_pages(false, "1"));
  for (const char* bad : {"2", "on", "yes", " 1"}) {
    bool refused = false;
    try {
      choose_huge_pages(true, bad);
    } catch (const std::invalid_argument& e) {
      refused = std::string(e.what()).find("LEVER_HUGE_PAGES") != std::string::npos;
    }
    CHECK_MSG(refused, "LEVER_HUGE_PAGES='" << bad << "' accepted");
  }
  const std::string mode = lever::io::transparent_huge_page_mode();
  CHECK_MSG(mode.empty() || mode == "always" || mode == "madvise" || mode == "never", mode);
}

TEST(reader_stats_count_what_the_slots_take) {
  // /proc/self/exe is a file every process can open; the reader never reads it here.
  lever::io::ReaderOptions options;
  options.backend = "pread";
  options.direct = false;
  unsetenv("LEVER_HUGE_PAGES");
  lever::io::FlashReader huge("/proc/self/exe", 3 * kMiB, 2, options);
  const lever::io::ReaderStats s = huge.stats();
  CHECK(s.huge_pages_requested);
  CHECK_EQ(s.slot_buffer_bytes, uint64_t{2 * 4 * kMiB});
  CHECK(s.huge_page_bytes <= s.slot_buffer_bytes);
  CHECK_MSG((s.huge_page_bytes > 0) == s.huge_pages_reason.empty(), s.huge_pages_reason);
  options.huge_pages = false;
  lever::io::FlashReader small("/proc/self/exe", 3 * kMiB, 2, options);
  const lever::io::ReaderStats t = small.stats();
  CHECK(!t.huge_pages_requested);
  CHECK_EQ(t.slot_buffer_bytes, uint64_t{2 * 3 * kMiB});
  CHECK_EQ(t.huge_page_bytes, uint64_t{0});
  CHECK(t.fallback_reason().find("huge") == std::string::npos);  // asked for: no fallback
}

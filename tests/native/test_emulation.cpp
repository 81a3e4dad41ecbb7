// Checks that only make sense under qemu-user (ctest sets LEVER_EMULATED for
// its qemu runs; skipped elsewhere): io_uring_setup is ENOSYS there, so the
// flash reader's default backend must fall back to pread and say why.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "io/flash_reader.h"
#include "native_test.h"

TEST(emulated_reader_reports_pread_fallback) {
  const char* emulated = std::getenv("LEVER_EMULATED");
  if (!emulated || !*emulated) SKIP("not under emulation (LEVER_EMULATED unset)");
  if (!lever::io::kIoUringAllowedByDefault) SKIP("io_uring is not tried on this platform");
  char path[] = "/tmp/lever-emulated-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  std::vector<uint8_t> bytes(64 * 1024);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  REQUIRE(write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  close(fd);
  {
    lever::io::ReaderOptions o;
    o.backend = "auto";
    lever::io::FlashReader r(path, bytes.size(), 1, o);
    const lever::io::ReaderStats s = r.stats();
    NOTE("backend " << s.backend << "; fallback: " << s.fallback_reason());
    CHECK_EQ(s.backend, std::string("pread"));
    CHECK_MSG(s.backend_reason.find("io_uring_setup") != std::string::npos,
              "backend_reason: " << s.backend_reason);
    CHECK(s.fallback_reason().find("io_uring_setup") != std::string::npos);
    r.submit(0, 0, bytes.size(), {}, "extent 0");
    lever::io::SlotView v = r.wait(0);
    CHECK(v.length == bytes.size() && std::equal(bytes.begin(), bytes.end(), v.data));
  }
  unlink(path);
}

// FlashReader under faults (csrc/io): EIO, short reads, a stuck read past
// the deadline, a checksum mismatch, io_uring unavailable (pread fallback
// reported), and the choice of io_uring on Android (played on any platform
// through choose_io_uring's allowed_by_default). Each fault is injected with
// ReaderOptions::faults (io/fault_injection.h) and fires once, so the read
// after it must give the file's bytes. Under qemu-user io_uring is missing:
// the io_uring cases are skipped there and the fallback is checked instead.

#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/checksum.h"
#include "io/fault_injection.h"
#include "io/flash_reader.h"
#include "native_test.h"

using lever::io::FailureKind;
using lever::io::FlashReader;
using lever::io::FlashReadError;
using lever::io::ReaderOptions;

namespace {

constexpr uint32_t kChunk = 16 * 1024;      // bytes per chunk read
constexpr uint64_t kFileBytes = 256 * 1024;  // bytes in the test file

// A temporary file of random bytes, removed at the end.
class TempFile {
 public:
  TempFile() {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr && dir[0] != '\0' ? dir : "/tmp") + "/lever-fr-XXXXXX";
    const int fd = mkstemp(&path_[0]);
    if (fd < 0) throw std::runtime_error("mkstemp failed for " + path_);
    data_.resize(kFileBytes);
    lever_test::Rng rng(15);
    rng.fill_bytes(data_.data(), data_.size());
    const bool ok = write(fd, data_.data(), data_.size()) == static_cast<ssize_t>(data_.size());
    close(fd);
    if (!ok) throw std::runtime_error("cannot write " + path_);
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }
  const uint8_t* at(uint64_t offset) const { return data_.data() + offset; }

 private:
  std::string path_;
  std::vector<uint8_t> data_;
};

// Bytes waiting in a pipe (FIONREAD). 0 or -1.
int ioctl_fionread(int fd, int* bytes) { return ioctl(fd, FIONREAD, bytes); }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

ReaderOptions options_for(const std::string& backend, const std::string& faults) {
  ReaderOptions o;
  o.backend = backend;
  o.chunk_bytes = kChunk;
  o.faults = faults;
  return o;
}

// True if this machine has io_uring (not under qemu-user or seccomp).
bool have_io_uring(const TempFile& file) {
  try {
    FlashReader r(file.path(), 4096, 1, options_for("io_uring", ""));
    return true;
  } catch (const FlashReadError& e) {
    if (e.kind != FailureKind::kUnavailable) throw;  // only a missing io_uring may skip
    NOTE("io_uring unavailable here: " << e.what());
    return false;
  }
}

std::vector<std::string> backends(const TempFile& file) {
  if (have_io_uring(file)) return {"io_uring", "pread"};
  return {"pread"};
}

// Submits [offset, offset + length) into slot 0 and expects wait() to throw
// a FlashReadError of `kind` naming the label, the file and `bad_offset`.
void expect_failure(FlashReader& r, const TempFile& file, uint64_t offset, uint64_t length,
                    FailureKind kind, int64_t bad_offset, const std::string& backend,
                    std::vector<uint32_t> crcs = {}) {
  r.submit(0, offset, length, std::move(crcs), "layer 3");
  try {
    r.wait(0);
    CHECK_MSG(false, backend << ": wait() returned instead of failing");
  } catch (const FlashReadError& e) {
    const std::string what = e.what();
    CHECK_MSG(e.kind == kind, backend << ": kind " << static_cast<int>(e.kind) << ": " << what);
    CHECK_EQ(e.label, std::string("layer 3"));
    CHECK_EQ(e.offset, bad_offset);
    CHECK_MSG(contains(what, "layer 3") && contains(what, file.path()) &&
                  contains(what, std::to_string(bad_offset)),
              backend << ": message does not name extent, file and offset: " << what);
  }
}

// The next read of the same extent gives the file's bytes.
void expect_clean_read(FlashReader& r, const TempFile& file, uint64_t offset, uint64_t length,
                       const std::string& backend) {
  r.submit(0, offset, length, {}, "layer 3");
  const lever::io::SlotView v = r.wait(0);
  CHECK_MSG(v.length == length && std::memcmp(v.data, file.at(offset), length) == 0,
            backend << ": wrong bytes after the fault");
}

}  // namespace

TEST(flash_reader_eio_names_extent_and_offset) {
  TempFile file;
  for (const std::string& backend : backends(file)) {
    const uint64_t bad = 64 * 1024 + 2 * kChunk + 100;  // inside the extent's third chunk
    FlashReader r(file.path(), 64 * 1024, 1,
                  options_for(backend, "eio@" + std::to_string(bad) + "*1"));
    CHECK_EQ(r.stats().backend, backend);
    expect_failure(r, file, 64 * 1024, 64 * 1024, FailureKind::kIo, 64 * 1024 + 2 * kChunk,
                   backend);
    expect_clean_read(r, file, 64 * 1024, 64 * 1024, backend);
  }
}

TEST(flash_reader_short_read_names_extent_and_offset) {
  TempFile file;
  for (const std::string& backend : backends(file)) {
    const uint64_t chunk_start = 128 * 1024 + kChunk;
    FlashReader r(file.path(), 64 * 1024, 1,
                  options_for(backend, "short@" + std::to_string(chunk_start + 4096) + "*1"));
    expect_failure(r, file, 128 * 1024, 64 * 1024, FailureKind::kShortRead, chunk_start, backend);
    expect_clean_read(r, file, 128 * 1024, 64 * 1024, backend);
  }
}

TEST(flash_reader_checksum_mismatch_names_extent_and_offset) {
  TempFile file;
  for (const std::string& backend : backends(file)) {
    FlashReader r(file.path(), 64 * 1024, 1, options_for(backend, ""));
    std::vector<uint32_t> crcs;
    for (uint64_t o = 0; o < 64 * 1024; o += kChunk) crcs.push_back(lever::io::crc32c(file.at(o), kChunk, 0));
    crcs[1] ^= 1;
    expect_failure(r, file, 0, 64 * 1024, FailureKind::kChecksum, kChunk, backend, crcs);
    expect_clean_read(r, file, 0, 64 * 1024, backend);
  }
}

TEST(flash_reader_stuck_read_hits_the_deadline) {
  TempFile file;
  for (const std::string& backend : backends(file)) {
    // Chunks 0-2 land at once; chunk 3 is 5 s late. The limit leaves room
    // for a loaded machine to finish chunks 0-2 in time.
    ReaderOptions o = options_for(backend, "delay_ms=5000@" + std::to_string(3 * kChunk) + "*1");
    o.read_timeout_s = 0.5;
    FlashReader r(file.path(), 64 * 1024, 1, o);
    CHECK_NEAR(r.stats().read_timeout_s, 0.5, 1e-12);
    const auto t0 = std::chrono::steady_clock::now();
    expect_failure(r, file, 0, 64 * 1024, FailureKind::kTimeout, 3 * kChunk, backend);
    CHECK_MSG(seconds_since(t0) < 3.0, backend << ": the deadline took " << seconds_since(t0) << " s");
    CHECK(!r.ready(0));
    bool refused = false;
    try {
      r.submit(0, 0, 4096, {}, "again");
    } catch (const std::invalid_argument&) {
      refused = true;  // the late read still targets the slot
    }
    CHECK_MSG(refused, backend << ": a slot with a read in flight was resubmitted");
    const auto t1 = std::chrono::steady_clock::now();
    r.close();  // cuts the injected delay short: no hang
    CHECK_MSG(seconds_since(t1) < 1.0, backend << ": close() took " << seconds_since(t1) << " s");
  }
}

// hang@: a read that never completes, not even when cancelled. wait() times
// out; close() returns at once, reports the read as abandoned and leaks the
// slot buffer (the destructor must not free it, nor crash).
TEST(flash_reader_hung_read_is_abandoned_by_close) {
  TempFile file;
  for (const std::string& backend : backends(file)) {
    ReaderOptions o = options_for(backend, "hang@" + std::to_string(3 * kChunk) + "*1");
    o.read_timeout_s = 0.5;
    FlashReader r(file.path(), 64 * 1024, 1, o);
    expect_failure(r, file, 0, 64 * 1024, FailureKind::kTimeout, 3 * kChunk, backend);
    CHECK(!r.ready(0));
    CHECK_EQ(r.stats().abandoned_reads, uint64_t{0});
    const auto t0 = std::chrono::steady_clock::now();
    r.close();
    CHECK_MSG(seconds_since(t0) < 5.0, backend << ": close() took " << seconds_since(t0) << " s");
    CHECK_EQ(r.stats().abandoned_reads, uint64_t{1});
    CHECK(!r.ready(0));  // never completes
  }
}

// A real read that never completes: io_uring reading an empty FIFO (whose
// writer stays open) waits for data for ever. close() cancels it
// (IORING_OP_ASYNC_CANCEL): it ends with ECANCELED, nothing is abandoned.
TEST(flash_reader_close_cancels_a_real_stuck_io_uring_read) {
  TempFile file;
  if (!have_io_uring(file)) SKIP("no io_uring here");
  const std::string fifo = file.path() + ".fifo";
  if (mkfifo(fifo.c_str(), 0600) != 0) SKIP("mkfifo failed");
  const int writer = open(fifo.c_str(), O_RDWR);  // never writes; keeps the reader's open from blocking
  REQUIRE(writer >= 0);
  {
    ReaderOptions o = options_for("io_uring", "");
    o.direct = false;
    o.read_timeout_s = 0.5;
    FlashReader r(fifo, 4096, 1, o);
    r.submit(0, 0, 4096, {}, "fifo");
    bool timed_out = false;
    try {
      r.wait(0);
    } catch (const FlashReadError& e) {
      timed_out = e.kind == FailureKind::kTimeout;
      if (!timed_out) NOTE("wait: " << e.what());
    }
    CHECK_MSG(timed_out, "a read of an empty FIFO must time out");
    const auto t0 = std::chrono::steady_clock::now();
    r.close();
    CHECK_MSG(seconds_since(t0) < 5.0, "close() took " << seconds_since(t0) << " s");
    CHECK_EQ(r.stats().abandoned_reads, uint64_t{0});
    CHECK(r.ready(0));
    try {
      r.wait(0);
      CHECK_MSG(false, "wait() after the cancel returned");
    } catch (const FlashReadError& e) {
      CHECK_MSG(e.kind == FailureKind::kCancelled && contains(e.what(), "cancelled"), e.what());
    }
  }
  close(writer);
  unlink(fifo.c_str());
}

// The same stuck read, but the kernel "cannot cancel" it (no_cancel): close()
// gives up at its deadline (read_timeout_s), abandons the read, detaches
// the reaper and leaks the backend and the slot buffer. When the read
// finally completes (data written to the FIFO), the leaked reaper takes the
// completion and drops it: the destroyed reader is never called.
TEST(flash_reader_close_abandons_an_uncancellable_io_uring_read) {
  TempFile file;
  if (!have_io_uring(file)) SKIP("no io_uring here");
  const std::string fifo = file.path() + ".fifo";
  if (mkfifo(fifo.c_str(), 0600) != 0) SKIP("mkfifo failed");
  const int writer = open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  REQUIRE(writer >= 0);
  {
    ReaderOptions o = options_for("io_uring", "no_cancel");
    o.direct = false;
    o.read_timeout_s = 0.5;
    FlashReader r(fifo, 4096, 1, o);
    r.submit(0, 0, 4096, {}, "fifo");
    CHECK(!r.ready(0));
    const auto t0 = std::chrono::steady_clock::now();
    r.close();
    const double took = seconds_since(t0);
    CHECK_MSG(took >= 0.4 && took < 5.0, "close() took " << took << " s");
    CHECK_EQ(r.stats().abandoned_reads, uint64_t{1});
    CHECK(!r.ready(0));
  }  // destroyed: the slot buffer is leaked, the reaper still waits
  std::vector<uint8_t> bytes(4096, 0x5A);
  CHECK(write(writer, bytes.data(), bytes.size()) == 4096);  // the read completes now
  const auto t1 = std::chrono::steady_clock::now();
  bool consumed = false;
  while (!consumed && seconds_since(t1) < 5.0) {
    int queued = -1;
    // The leaked read took the bytes if the FIFO is empty again.
    if (ioctl_fionread(writer, &queued) == 0 && queued == 0) consumed = true;
    else usleep(10 * 1000);
  }
  CHECK_MSG(consumed, "the abandoned read never took the bytes");
  usleep(50 * 1000);  // the leaked reaper drops the completion (no call into the freed reader)
  close(writer);
  unlink(fifo.c_str());
}

// submit_err: io_uring_enter fails; the reads it did not take are taken
// back and fail naming the errno, and later submits work. Queue depth 2 and
// 4 chunks: the first submit (chunks 0-1) fails, chunks 2-3 go in the next.
TEST(flash_reader_io_uring_submit_error_fails_the_chunks_then_recovers) {
  TempFile file;
  if (!have_io_uring(file)) SKIP("no io_uring here");
  ReaderOptions o = options_for("io_uring", "submit_err=12*1");
  o.queue_depth = 2;
  FlashReader r(file.path(), 64 * 1024, 1, o);
  r.submit(0, 64 * 1024, 64 * 1024, {}, "layer 3");
  try {
    r.wait(0);
    CHECK_MSG(false, "wait() returned instead of failing");
  } catch (const FlashReadError& e) {
    const std::string what = e.what();
    CHECK_MSG(e.kind == FailureKind::kIo && e.offset == 64 * 1024, what);
    CHECK_MSG(contains(what, "could not submit") && contains(what, "io_uring_enter failed") &&
                  contains(what, "errno 12") && contains(what, "layer 3"),
              what);
  }
  expect_clean_read(r, file, 64 * 1024, 64 * 1024, "io_uring after submit_err");
  std::vector<uint8_t> out(64 * 1024);
  r.read(0, 64 * 1024, out.data(), {}, "read");  // unaligned: staged
  CHECK(std::memcmp(out.data(), file.at(0), out.size()) == 0);
}

TEST(flash_reader_slow_reads_within_the_deadline_succeed) {
  TempFile file;
  for (const std::string& backend : backends(file)) {
    ReaderOptions o = options_for(backend, "delay_ms=20");
    o.read_timeout_s = 5;
    FlashReader r(file.path(), 64 * 1024, 1, o);
    expect_clean_read(r, file, 64 * 1024, 64 * 1024, backend);
  }
}

TEST(flash_reader_default_backend_follows_the_platform) {
  TempFile file;
  unsetenv("LEVER_IO_URING");
  FlashReader r(file.path(), 4096, 1, options_for("auto", ""));
  const lever::io::ReaderStats s = r.stats();
  NOTE("backend " << s.backend << (s.backend_reason.empty() ? "" : ": " + s.backend_reason));
  if (!lever::io::kIoUringAllowedByDefault) {  // Android: io_uring_setup is never called
    CHECK_EQ(s.backend, std::string("pread"));
    CHECK_MSG(contains(s.backend_reason, "Android") && contains(s.backend_reason, "LEVER_IO_URING=1"),
              s.backend_reason);
  } else {
    CHECK(s.backend == "io_uring" || contains(s.backend_reason, "io_uring_setup failed"));
  }
}

TEST(flash_reader_io_uring_unavailable_falls_back_to_pread) {
  TempFile file;
  setenv("LEVER_IO_URING", "1", 1);  // on Android too: the injected fault stands in for SIGSYS
  FlashReader r(file.path(), 64 * 1024, 1, options_for("auto", "no_io_uring"));
  unsetenv("LEVER_IO_URING");
  const lever::io::ReaderStats s = r.stats();
  CHECK_EQ(s.backend, std::string("pread"));
  CHECK_MSG(contains(s.backend_reason, "no_io_uring") && contains(s.backend_reason, "pread thread pool"),
            "backend_reason: " << s.backend_reason);
  CHECK(contains(s.fallback_reason(), "no_io_uring"));
  expect_clean_read(r, file, 0, 64 * 1024, "pread (fallback)");
  bool refused = false;
  try {
    setenv("LEVER_IO_URING", "1", 1);
    FlashReader forced(file.path(), 4096, 1, options_for("io_uring", "no_io_uring"));
  } catch (const FlashReadError& e) {
    refused = e.kind == FailureKind::kUnavailable && contains(e.what(), "no_io_uring");
  }
  unsetenv("LEVER_IO_URING");
  CHECK_MSG(refused, "backend io_uring without io_uring must fail (kUnavailable)");
}

TEST(flash_reader_lever_io_uring_0_forces_pread) {
  TempFile file;
  setenv("LEVER_IO_URING", "0", 1);
  FlashReader r(file.path(), 4096, 1, options_for("auto", ""));
  unsetenv("LEVER_IO_URING");
  CHECK_EQ(r.stats().backend, std::string("pread"));
  CHECK_MSG(contains(r.stats().backend_reason, "LEVER_IO_URING=0"), r.stats().backend_reason);
}

TEST(io_uring_choice_android_and_environment) {
  using lever::io::choose_io_uring;
  // Android (allowed_by_default = false): off unless LEVER_IO_URING=1.
  auto android = choose_io_uring("auto", nullptr, false);
  CHECK(!android.try_io_uring);
  CHECK_MSG(contains(android.reason, "Android") && contains(android.reason, "LEVER_IO_URING=1"),
            android.reason);
  CHECK(!choose_io_uring("auto", "", false).try_io_uring);
  CHECK(!choose_io_uring("io_uring", nullptr, false).try_io_uring);
  CHECK(choose_io_uring("auto", "1", false).try_io_uring);
  // Elsewhere: on unless LEVER_IO_URING=0.
  CHECK(choose_io_uring("auto", nullptr, true).try_io_uring);
  auto off = choose_io_uring("auto", "0", true);
  CHECK(!off.try_io_uring && contains(off.reason, "LEVER_IO_URING=0"));
  // pread asked for: nothing to explain.
  auto pread = choose_io_uring("pread", nullptr, true);
  CHECK(!pread.try_io_uring && pread.reason.empty());
  bool refused = false;
  try {
    choose_io_uring("auto", "yes", true);
  } catch (const std::invalid_argument&) {
    refused = true;
  }
  CHECK(refused);
#if defined(__ANDROID__)
  CHECK(!lever::io::kIoUringAllowedByDefault);
#else
  CHECK(lever::io::kIoUringAllowedByDefault);
#endif
}

TEST(read_timeout_choice) {
  using lever::io::choose_read_timeout;
  CHECK_EQ(choose_read_timeout(0, nullptr), lever::io::kDefaultReadTimeoutS);
  CHECK_EQ(choose_read_timeout(2.5, "7"), 2.5);
  CHECK_EQ(choose_read_timeout(0, "7"), 7.0);
  for (const char* bad : {"x", "0", "-3", "1s"}) {
    bool refused = false;
    try {
      choose_read_timeout(0, bad);
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    CHECK_MSG(refused, "LEVER_IO_TIMEOUT_S='" << bad << "' accepted");
  }
}

TEST(fault_plan_parsing) {
  const lever::io::FaultPlan p =
      lever::io::parse_fault_plan(" eio@4096*1, short@8192,delay_ms=5, delay_ms=7@0*2,no_io_uring");
  REQUIRE(p.faults.size() == 4);
  CHECK(p.no_io_uring);
  CHECK(p.faults[0].kind == lever::io::FaultKind::kEio && p.faults[0].offset == 4096 &&
        p.faults[0].times == 1);
  CHECK(p.faults[1].kind == lever::io::FaultKind::kShort && p.faults[1].times == -1);
  CHECK(p.faults[2].any_offset && p.faults[2].delay_s == 0.005);
  CHECK(!p.faults[3].any_offset && p.faults[3].delay_s == 0.007 && p.faults[3].times == 2);
  CHECK(lever::io::parse_fault_plan("").faults.empty());
  const lever::io::FaultPlan q = lever::io::parse_fault_plan("hang@8192*1,submit_err=12*3");
  REQUIRE(q.faults.size() == 1);
  CHECK(q.faults[0].kind == lever::io::FaultKind::kHang && q.faults[0].offset == 8192 &&
        q.faults[0].times == 1);
  CHECK(q.submit_errno == 12 && q.submit_err_times == 3 && q.affects_reads());
  CHECK(!lever::io::parse_fault_plan("submit_err=5").affects_reads());
  CHECK_EQ(lever::io::parse_fault_plan("submit_err=5").submit_err_times, int64_t{-1});
  for (const char* bad : {"eio", "eio@x", "eio@1*", "delay_ms=", "slow@3", "short@-4", "hang@",
                          "submit_err=0", "submit_err=EIO", "submit_err=5*"}) {
    bool refused = false;
    try {
      lever::io::parse_fault_plan(bad);
    } catch (const std::invalid_argument& e) {
      refused = contains(e.what(), bad);
    }
    CHECK_MSG(refused, "fault item '" << bad << "' accepted or not named");
  }
}

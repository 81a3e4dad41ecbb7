// FlashReader: extents, slots, verification and statistics on top of a
// ReadBackend (io_uring_backend.cpp or pread_backend.cpp).
//
// Life of an extent: submit() or read() fills an Extent and cuts it into
// chunks for the backend. The backend calls on_chunk_issued() just before a
// chunk's read goes to the kernel and on_chunk_done() from its I/O thread
// when it is over; on_chunk_done() checks the chunk's CRC32C there, records
// the first failure, and wakes wait() when the extent's last chunk is done.

#include "io/flash_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "io/checksum.h"
#include "io/fault_injection.h"

namespace lever {
namespace io {
namespace {

// Staging window of read() into unaligned memory with O_DIRECT, bytes.
constexpr uint64_t kStagingBytes = 16u << 20;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CPU time of the calling thread, seconds.
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08" PRIx32, v);
  return buf;
}

bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

// ---------------------------------------------------------------------------
// Helpers

// Adds up the time during which at least one read is in flight.
class FlashReader::BusyClock {
 public:
  void begin(int64_t t_ns) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_flight_++ == 0) since_ns_ = t_ns;
  }
  void end() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--in_flight_ == 0) total_ns_ += now_ns() - since_ns_;
  }
  double seconds() const {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t open_ns = in_flight_ > 0 ? now_ns() - since_ns_ : 0;
    return 1e-9 * static_cast<double>(total_ns_ + open_ns);
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    total_ns_ = 0;
    since_ns_ = now_ns();
  }

 private:
  mutable std::mutex mutex_;
  int in_flight_ = 0;
  int64_t since_ns_ = 0;  // when in_flight_ last went from 0 to 1
  int64_t total_ns_ = 0;
};

// Emulates slower flash: a device of `bytes_per_s` serving reads one after
// another. A read issued at t that reaches the front of that virtual
// device's queue at start >= t is delivered at start + bytes / bytes_per_s,
// or when the real read completes, whichever is later.
class FlashReader::Pacer {
 public:
  explicit Pacer(double bytes_per_s) : ns_per_byte_(bytes_per_s > 0 ? 1e9 / bytes_per_s : 0) {}

  void pace(int64_t issued_ns, uint64_t bytes) {
    if (ns_per_byte_ <= 0) return;
    int64_t deliver_ns;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const int64_t start_ns = std::max(issued_ns, free_ns_);
      deliver_ns = start_ns + static_cast<int64_t>(ns_per_byte_ * static_cast<double>(bytes));
      free_ns_ = deliver_ns;
    }
    const int64_t sleep_ns = deliver_ns - now_ns();
    if (sleep_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(sleep_ns));
  }

 private:
  const double ns_per_byte_;
  std::mutex mutex_;
  int64_t free_ns_ = 0;  // when the virtual device finishes its last read
};

// One extent: what to read, and (under mutex_) how far it got.
struct FlashReader::Extent {
  // Set before start_extent(); constant while its reads are in flight.
  uint64_t offset = 0;     // file offset, bytes
  uint64_t length = 0;     // bytes
  uint8_t* dest = nullptr;
  int fixed_buffer = -1;   // registered buffer (the slot index), -1 for read()
  std::string label;       // "layer 7"; names the extent in errors
  std::vector<uint32_t> crcs;  // expected CRC32C per chunk; empty: not checked
  uint32_t n_chunks = 0;
  std::vector<uint8_t> chunk_done;  // 1 once chunk i is over (names a stuck read)

  // Progress.
  bool started = false;
  uint32_t chunks_done = 0;
  // The failure of the lowest-numbered failing chunk, if any.
  bool failed = false;
  uint32_t failed_chunk = 0;
  FailureKind failure_kind = FailureKind::kIo;
  int64_t failure_offset = -1;
  std::string failure_message;

  bool complete() const { return chunks_done == n_chunks; }
  std::string name() const {
    return label.empty() ? "extent at offset " + std::to_string(offset) : label;
  }
};

struct FlashReader::Slot {
  Slot(size_t bytes, bool huge_pages) : buffer(bytes, huge_pages) {}
  SlotMemory buffer;
  Extent extent;
};

// ---------------------------------------------------------------------------
// Construction and teardown

FlashReader::FlashReader(const std::string& path, size_t slot_bytes, int n_slots,
                         const ReaderOptions& options)
    : path_(path),
      slot_bytes_(slot_bytes),
      chunk_bytes_(options.chunk_bytes),
      queue_depth_(options.queue_depth),
      direct_requested_(options.direct),
      max_bytes_per_s_(options.max_bytes_per_s),
      read_timeout_s_(choose_read_timeout(options.read_timeout_s,
                                          std::getenv("LEVER_IO_TIMEOUT_S"))) {
  if (n_slots < 0 || n_slots > 4096) {
    throw std::invalid_argument("n_slots must be in [0, 4096], got " + std::to_string(n_slots));
  }
  if (slot_bytes % kAlignment != 0 || (n_slots > 0 && slot_bytes == 0)) {
    throw std::invalid_argument("slot_bytes must be a positive multiple of 4096, got " +
                                std::to_string(slot_bytes));
  }
  if (!is_power_of_two(chunk_bytes_) || chunk_bytes_ < kAlignment || chunk_bytes_ > (1u << 30)) {
    throw std::invalid_argument(
        "chunk_bytes must be a power of two between 4096 and 1 GiB, got " +
        std::to_string(chunk_bytes_));
  }
  if (queue_depth_ < 1 || queue_depth_ > 4096) {
    throw std::invalid_argument("queue_depth must be in [1, 4096], got " +
                                std::to_string(queue_depth_));
  }
  if (options.pread_threads < 1 || options.pread_threads > 256) {
    throw std::invalid_argument("pread_threads must be in [1, 256], got " +
                                std::to_string(options.pread_threads));
  }
  if (!(options.max_bytes_per_s >= 0)) {
    throw std::invalid_argument("max_bytes_per_s must be >= 0 (0: unlimited)");
  }
  if (options.backend != "auto" && options.backend != "io_uring" && options.backend != "pread") {
    throw std::invalid_argument("backend must be 'auto', 'io_uring' or 'pread', got '" +
                                options.backend + "'");
  }

  busy_ = std::make_unique<BusyClock>();
  pacer_ = std::make_unique<Pacer>(options.max_bytes_per_s);
  huge_pages_requested_ = choose_huge_pages(options.huge_pages, std::getenv("LEVER_HUGE_PAGES"));
  for (int i = 0; i < n_slots; ++i) {
    slots_.push_back(std::make_unique<Slot>(slot_bytes, huge_pages_requested_));
  }
  describe_slot_pages();

  open_file(options.direct);
  try {
    create_backend(options);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

// What backs the slot buffers (measured once: their pages were touched when made).
void FlashReader::describe_slot_pages() {
  std::vector<std::pair<const void*, size_t>> ranges;
  for (const auto& slot : slots_) {
    ranges.emplace_back(slot->buffer.data(), slot->buffer.mapped());
    slot_buffer_bytes_ += slot->buffer.mapped();
  }
  if (!huge_pages_requested_) {
    huge_pages_reason_ = "4 KiB pages requested (huge_pages off or LEVER_HUGE_PAGES=0)";
    return;
  }
  if (slot_bytes_ < kHugePageBytes) return;  // too small for a huge page: nothing to ask for
  huge_page_bytes_ = huge_page_bytes(ranges);
  if (huge_page_bytes_ > 0) return;
  const std::string mode = transparent_huge_page_mode();
  if (mode.empty()) {
    huge_pages_reason_ = "this kernel has no transparent huge pages: slot buffers on 4 KiB pages";
  } else if (mode == "never") {
    huge_pages_reason_ = "transparent huge pages are off on this kernel ([never]): slot buffers on 4 KiB pages";
  } else {
    huge_pages_reason_ = "the kernel gave no huge pages (THP mode " + mode +
                         "; fragmented memory or a memory limit): slot buffers on 4 KiB pages";
  }
}

FlashReader::~FlashReader() {
  close();
  if (abandoned_reads_ > 0) {
    // The kernel may still write into the slot buffers (and their extents
    // are named by the abandoned reads): leak them on purpose.
    for (auto& slot : slots_) slot.release();
  }
}

void FlashReader::open_file(bool want_direct) {
  if (want_direct) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd_ >= 0) {
      direct_ = true;
      return;
    }
    if (errno != EINVAL) {
      throw FlashReadError(FailureKind::kOpen, "cannot open " + path_ + ": " + errno_text(errno),
                           path_, "", -1);
    }
    // EINVAL: the file system has no direct I/O (e.g. tmpfs before Linux 6.6).
    direct_reason_ = "the file system refused O_DIRECT (" + errno_text(EINVAL) +
                     "); reading through the page cache";
  } else {
    direct_reason_ = "buffered reads requested (direct=False)";
  }
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    throw FlashReadError(FailureKind::kOpen, "cannot open " + path_ + ": " + errno_text(errno),
                         path_, "", -1);
  }
}

IoUringChoice choose_io_uring(const std::string& backend, const char* env_value,
                              bool allowed_by_default) {
  IoUringChoice choice;
  if (backend == "pread") return choice;  // as requested: no reason to give
  const std::string env = env_value != nullptr ? env_value : "";
  if (env == "0") {
    choice.reason = "io_uring disabled by LEVER_IO_URING=0";
  } else if (env == "1" || (env.empty() && allowed_by_default)) {
    choice.try_io_uring = true;
  } else if (env.empty()) {
    choice.reason =
        "io_uring is off by default on Android (the app seccomp filter kills a process that "
        "calls io_uring_setup); set LEVER_IO_URING=1 to try it";
  } else {
    throw std::invalid_argument("LEVER_IO_URING must be 0 (never use io_uring) or 1 (try it), got '" +
                                env + "'");
  }
  return choice;
}

double choose_read_timeout(double option, const char* env_value) {
  // At most kMaxReadTimeoutS: a deadline in nanoseconds must fit in 64 bits
  // (an infinite or huge one would overflow into "already past").
  if (!(option >= 0 && option <= kMaxReadTimeoutS)) {
    throw std::invalid_argument("read_timeout_s must be > 0 and <= " +
                                std::to_string(kMaxReadTimeoutS) +
                                " seconds (0: the default), got " + std::to_string(option));
  }
  if (option > 0) return option;
  if (env_value == nullptr || env_value[0] == '\0') return kDefaultReadTimeoutS;
  char* end = nullptr;
  const double v = std::strtod(env_value, &end);
  if (end == env_value || *end != '\0' || !(v > 0 && v <= kMaxReadTimeoutS)) {
    throw std::invalid_argument(std::string("LEVER_IO_TIMEOUT_S must be a number of seconds > 0 and <= ") +
                                std::to_string(kMaxReadTimeoutS) + ", got '" + env_value + "'");
  }
  return v;
}

void FlashReader::create_backend(const ReaderOptions& options) {
  const FaultPlan faults = fault_plan_from(options.faults);
  faults_ = faults.spec;
  if (options.backend != "pread") {
    const IoUringChoice choice =
        choose_io_uring(options.backend, std::getenv("LEVER_IO_URING"), kIoUringAllowedByDefault);
    std::string why = choice.reason;
    if (choice.try_io_uring && faults.no_io_uring) {
      why = "io_uring_setup failed: " + errno_text(ENOSYS) + " (injected fault no_io_uring)";
    } else if (choice.try_io_uring) {
      IoUringConfig config;
      config.fd = fd_;
      config.direct = direct_;
      config.queue_depth = queue_depth_;
      config.inject_submit_errno = faults.submit_errno;
      config.inject_submit_times = faults.submit_err_times;
      config.inject_no_cancel = faults.no_cancel;
      for (const auto& slot : slots_) {
        config.fixed_buffers.push_back(iovec{slot->buffer.data(), slot->buffer.size()});
      }
      backend_ = make_fault_injecting_backend(faults, *this, [&](ChunkSink& sink) {
        return make_io_uring_backend(config, sink, &why, &buffers_reason_);
      });
      if (backend_ != nullptr) {
        registered_buffers_ = !slots_.empty() && buffers_reason_.empty();
        return;
      }
    }
    if (options.backend == "io_uring") {
      throw FlashReadError(FailureKind::kUnavailable,
                           "io_uring was requested for " + path_ + " but is unavailable: " + why,
                           path_, "", -1);
    }
    backend_reason_ = why + "; using the pread thread pool";
  }
  // A pread thread has one read in flight: no more threads than queue_depth.
  pread_threads_ = std::min(options.pread_threads, queue_depth_);
  backend_ = make_fault_injecting_backend(faults, *this, [&](ChunkSink& sink) {
    return make_pread_backend(fd_, direct_, pread_threads_, sink);
  });
}

void FlashReader::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
  }
  // Cancels the reads in flight and waits for them at most read_timeout_s_
  // seconds; no I/O thread calls back into *this after it returns.
  const size_t abandoned = backend_ != nullptr ? backend_->shutdown(read_timeout_s_) : 0;
  if (abandoned > 0) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      abandoned_reads_ = abandoned;
    }
    std::fprintf(stderr,
                 "lever: FlashReader.close(): abandoned %zu read(s) of %s that did not complete "
                 "within %g s of being cancelled (%s backend; hung device?); the %zu slot "
                 "buffers (%zu bytes each) are leaked, not freed: the kernel may still write "
                 "into them\n",
                 abandoned, path_.c_str(), read_timeout_s_, backend_->name(), slots_.size(),
                 slot_bytes_);
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool FlashReader::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

// ---------------------------------------------------------------------------
// Submitting and waiting

FlashReader::Slot& FlashReader::slot_at(int slot, const char* what) {
  if (slot < 0 || slot >= n_slots()) {
    throw std::invalid_argument(std::string(what) + ": slot " + std::to_string(slot) +
                                " out of range (the reader has " + std::to_string(n_slots()) +
                                " slots)");
  }
  return *slots_[static_cast<size_t>(slot)];
}

uint32_t FlashReader::count_chunks(uint64_t length) const {
  return static_cast<uint32_t>((length + chunk_bytes_ - 1) / chunk_bytes_);
}

void FlashReader::check_extent_args(const char* what, uint64_t offset, uint64_t length,
                                    size_t n_crcs) const {
  if (offset % kAlignment != 0 || length % kAlignment != 0 || length == 0) {
    throw std::invalid_argument(std::string(what) + ": offset and length must be multiples of " +
                                "4096 bytes (and length > 0), got offset " +
                                std::to_string(offset) + ", length " + std::to_string(length));
  }
  if (n_crcs != 0 && n_crcs != count_chunks(length)) {
    throw std::invalid_argument(std::string(what) + ": expected " +
                                std::to_string(count_chunks(length)) +
                                " chunk checksums (one per " + std::to_string(chunk_bytes_) +
                                "-byte chunk of " + std::to_string(length) + " bytes), got " +
                                std::to_string(n_crcs));
  }
}

void FlashReader::reset_extent(Extent& e, uint64_t offset, uint64_t length, uint8_t* dest,
                               int fixed_buffer, std::string label, std::vector<uint32_t> crcs) {
  e.offset = offset;
  e.length = length;
  e.dest = dest;
  e.fixed_buffer = fixed_buffer;
  e.label = std::move(label);
  e.crcs = std::move(crcs);
  e.n_chunks = count_chunks(length);
  e.chunk_done.assign(e.n_chunks, 0);
  e.started = true;
  e.chunks_done = 0;
  e.failed = false;
  e.failed_chunk = 0;
  e.failure_offset = -1;
  e.failure_message.clear();
}

// Cuts the extent into chunks and hands them to the backend. Must not hold
// mutex_ (the backend may call back at once).
void FlashReader::start_extent(Extent& e) {
  std::vector<ChunkRead> chunks(e.n_chunks);
  for (uint32_t i = 0; i < e.n_chunks; ++i) {
    const uint64_t start = static_cast<uint64_t>(i) * chunk_bytes_;  // within the extent
    ChunkRead& c = chunks[i];
    c.file_offset = e.offset + start;
    c.dest = e.dest + start;
    c.length = static_cast<uint32_t>(std::min<uint64_t>(chunk_bytes_, e.length - start));
    c.fixed_buffer = e.fixed_buffer;
    c.extent = &e;
    c.index = i;
  }
  backend_->enqueue(chunks);
}

void FlashReader::submit(int slot, uint64_t offset, uint64_t length,
                         std::vector<uint32_t> chunk_crcs, std::string label) {
  Slot& s = slot_at(slot, "submit");
  check_extent_args("submit", offset, length, chunk_crcs.size());
  if (length > slot_bytes_) {
    throw std::invalid_argument("submit: length " + std::to_string(length) +
                                " exceeds slot_bytes " + std::to_string(slot_bytes_));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) throw std::invalid_argument("submit: the reader is closed");
    if (s.extent.started && !s.extent.complete()) {
      throw std::invalid_argument("submit: slot " + std::to_string(slot) +
                                  " still has a read in flight (wait for it first)");
    }
    reset_extent(s.extent, offset, length, s.buffer.data(), slot, std::move(label),
                 std::move(chunk_crcs));
    ++extents_;
  }
  start_extent(s.extent);
}

// Waits for the extent; with `deadline`, throws kTimeout once a whole
// read_timeout_s window passes without any of its chunks finishing (done_cv_
// is notified only when an extent completes, so progress is checked at the
// end of each window: a stuck read is reported after 1 to 2 windows).
void FlashReader::await_extent(Extent& e, bool deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!e.complete()) {
    const int64_t t0 = now_ns();
    if (!deadline) {
      done_cv_.wait(lock, [&e] { return e.complete(); });
    } else {
      const auto window = std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::duration<double>(read_timeout_s_));
      for (;;) {
        const uint32_t seen = e.chunks_done;
        const bool moved = done_cv_.wait_for(
            lock, window, [&e, seen] { return e.complete() || e.chunks_done != seen; });
        if (e.complete()) break;
        if (!moved) {
          wait_s_ += 1e-9 * static_cast<double>(now_ns() - t0);
          int64_t offset = -1;
          const std::string message = describe_timeout(e, &offset);
          throw FlashReadError(FailureKind::kTimeout, message, path_, e.label, offset);
        }
      }
    }
    wait_s_ += 1e-9 * static_cast<double>(now_ns() - t0);
  }
  if (e.failed) {
    throw FlashReadError(e.failure_kind, e.failure_message, path_, e.label, e.failure_offset);
  }
}

void FlashReader::drain_extent(Extent& e) {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&e] { return e.complete(); });
}

SlotView FlashReader::wait(int slot) {
  Slot& s = slot_at(slot, "wait");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!s.extent.started) {
      throw std::invalid_argument("wait: slot " + std::to_string(slot) +
                                  " has no read submitted (call submit first)");
    }
  }
  await_extent(s.extent, /*deadline=*/true);
  return SlotView{s.buffer.data(), static_cast<size_t>(s.extent.length)};
}

bool FlashReader::ready(int slot) {
  Slot& s = slot_at(slot, "ready");
  std::lock_guard<std::mutex> lock(mutex_);
  return s.extent.started && s.extent.complete();
}

void FlashReader::read(uint64_t offset, uint64_t length, uint8_t* out,
                       const std::vector<uint32_t>& chunk_crcs, const std::string& label) {
  check_extent_args("read", offset, length, chunk_crcs.size());
  if (out == nullptr) throw std::invalid_argument("read: out is null");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) throw std::invalid_argument("read: the reader is closed");
    ++extents_;
  }
  if (direct_ && reinterpret_cast<uintptr_t>(out) % kAlignment != 0) {
    read_staged(offset, length, out, chunk_crcs, label);
    return;
  }
  Extent e;
  reset_extent(e, offset, length, out, -1, label, chunk_crcs);
  start_extent(e);
  await_extent(e, /*deadline=*/false);  // returns or throws once every chunk is over
}

// read() into memory O_DIRECT cannot target: windows of kStagingBytes go
// into two aligned staging buffers, one filling while the other is copied.
void FlashReader::read_staged(uint64_t offset, uint64_t length, uint8_t* out,
                              const std::vector<uint32_t>& chunk_crcs, const std::string& label) {
  // A multiple of chunk_bytes (both are powers of two), so each window's
  // checksums are a slice of chunk_crcs.
  const uint64_t window = std::max<uint64_t>(chunk_bytes_, kStagingBytes);
  const size_t stage_bytes = static_cast<size_t>(std::min(window, length));
  // Short-lived and small: on 4 KiB pages.
  SlotMemory stage[2] = {SlotMemory(stage_bytes, false), SlotMemory(stage_bytes, false)};
  Extent part[2];

  auto start_part = [&](int i, uint64_t pos) {
    const uint64_t n = std::min(window, length - pos);
    std::vector<uint32_t> crcs;
    if (!chunk_crcs.empty()) {
      const auto first = chunk_crcs.begin() + static_cast<ptrdiff_t>(pos / chunk_bytes_);
      crcs.assign(first, first + count_chunks(n));
    }
    reset_extent(part[i], offset + pos, n, stage[i].data(), -1, label, std::move(crcs));
    start_extent(part[i]);
  };

  start_part(0, 0);
  int cur = 0;
  for (uint64_t pos = 0; pos < length; pos += window, cur ^= 1) {
    const bool more = pos + window < length;
    if (more) start_part(cur ^ 1, pos + window);
    try {
      await_extent(part[cur], /*deadline=*/false);
    } catch (...) {
      if (more) drain_extent(part[cur ^ 1]);  // its reads target stage[cur ^ 1]
      throw;
    }
    std::memcpy(out + pos, stage[cur].data(), static_cast<size_t>(part[cur].length));
  }
}

// ---------------------------------------------------------------------------
// Completions (backend threads)

void FlashReader::on_chunk_issued(ChunkRead& chunk) {
  chunk.issued_ns = now_ns();
  busy_->begin(chunk.issued_ns);
}

void FlashReader::on_chunk_done(const ChunkRead& chunk, const ChunkResult& result) {
  pacer_->pace(chunk.issued_ns, result.bytes);
  busy_->end();

  // The extent is in flight, so nothing else changes what is read here.
  Extent& e = *static_cast<Extent*>(chunk.extent);
  bool ok = result.error == 0 && result.bytes == chunk.length;
  uint32_t actual_crc = 0;
  double crc_s = 0;
  if (ok && !e.crcs.empty()) {
    const double t0 = thread_cpu_seconds();
    actual_crc = crc32c(chunk.dest, chunk.length);
    crc_s = thread_cpu_seconds() - t0;
    ok = actual_crc == e.crcs[chunk.index];
  }
  FailureKind kind = FailureKind::kIo;
  std::string message;
  if (!ok) message = describe_failure(e, chunk, result, actual_crc, &kind);

  std::lock_guard<std::mutex> lock(mutex_);
  bytes_read_ += result.bytes;
  reads_ += 1;
  checksum_s_ += crc_s;
  if (!ok) record_failure_locked(e, chunk, kind, std::move(message));
  finish_chunk_locked(e, chunk.index);
}

void FlashReader::on_chunk_cancelled(const ChunkRead& chunk) {
  Extent& e = *static_cast<Extent*>(chunk.extent);
  std::string message = e.name() + ": the reader was closed before the read at offset " +
                        std::to_string(chunk.file_offset) + " of " + path_ + " was issued";
  std::lock_guard<std::mutex> lock(mutex_);
  record_failure_locked(e, chunk, FailureKind::kCancelled, std::move(message));
  finish_chunk_locked(e, chunk.index);
}

void FlashReader::record_failure_locked(Extent& e, const ChunkRead& chunk, FailureKind kind,
                                        std::string message) {
  if (e.failed && e.failed_chunk < chunk.index) return;  // report the first chunk
  e.failed = true;
  e.failed_chunk = chunk.index;
  e.failure_kind = kind;
  e.failure_offset = static_cast<int64_t>(chunk.file_offset);
  e.failure_message = std::move(message);
}

void FlashReader::finish_chunk_locked(Extent& e, uint32_t chunk_index) {
  e.chunk_done[chunk_index] = 1;
  if (++e.chunks_done == e.n_chunks) done_cv_.notify_all();
}

// The timeout error of extent e (under mutex_): names the first chunk whose
// read is not over, and sets *offset to its file offset.
std::string FlashReader::describe_timeout(const Extent& e, int64_t* offset) const {
  uint32_t i = 0;
  while (i < e.n_chunks && e.chunk_done[i] != 0) ++i;
  const uint64_t start = static_cast<uint64_t>(i) * chunk_bytes_;
  const uint64_t bytes = std::min<uint64_t>(chunk_bytes_, e.length - std::min(start, e.length));
  *offset = static_cast<int64_t>(e.offset + start);
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%g", read_timeout_s_);
  return e.name() + ": read timed out at offset " + std::to_string(e.offset + start) + " (" +
         std::to_string(bytes) + " bytes) of " + path_ + ": no read of the extent finished for " +
         seconds + " s (" + std::to_string(e.chunks_done) + " of " + std::to_string(e.n_chunks) +
         " chunks done; the device is stuck or far too slow; LEVER_IO_TIMEOUT_S sets the limit)";
}

std::string FlashReader::describe_failure(const Extent& e, const ChunkRead& chunk,
                                          const ChunkResult& result, uint32_t actual_crc,
                                          FailureKind* kind) const {
  const std::string at = std::to_string(chunk.file_offset);
  if (result.not_submitted) {
    *kind = FailureKind::kIo;
    return e.name() + ": could not submit the read at offset " + at + " (" +
           std::to_string(chunk.length) + " bytes) of " + path_ +
           ": io_uring_enter failed: " + errno_text(result.error);
  }
  if (result.error == ECANCELED) {
    *kind = FailureKind::kCancelled;
    return e.name() + ": the reader was closed while the read at offset " + at + " of " + path_ +
           " was in flight (cancelled)";
  }
  if (result.error != 0) {
    *kind = FailureKind::kIo;
    return e.name() + ": read failed at offset " + at + " (" + std::to_string(chunk.length) +
           " bytes) of " + path_ + ": " + errno_text(result.error);
  }
  if (result.bytes < chunk.length) {
    *kind = FailureKind::kShortRead;
    struct stat st;
    const std::string size =
        fstat(fd_, &st) == 0 ? std::to_string(st.st_size) + " bytes" : "of unknown size";
    return e.name() + ": short read: got " + std::to_string(result.bytes) + " of " +
           std::to_string(chunk.length) + " bytes at offset " + at + " of " + path_ +
           " (the file is " + size + "; truncated?)";
  }
  *kind = FailureKind::kChecksum;
  return "checksum mismatch in " + e.name() + " at offset " + at + " (expected " +
         hex32(e.crcs[chunk.index]) + ", got " + hex32(actual_crc) + ") of " + path_ +
         " (chunk of " + std::to_string(chunk.length) + " bytes)";
}

// ---------------------------------------------------------------------------
// Statistics

ReaderStats FlashReader::stats() const {
  ReaderStats s;
  s.backend = backend_->name();
  s.direct = direct_;
  s.direct_requested = direct_requested_;
  s.backend_reason = backend_reason_;
  s.direct_reason = direct_reason_;
  s.registered_buffers = registered_buffers_;
  s.buffers_reason = buffers_reason_;
  s.huge_pages_requested = huge_pages_requested_;
  s.slot_buffer_bytes = slot_buffer_bytes_;
  s.huge_page_bytes = huge_page_bytes_;
  s.huge_pages_reason = huge_pages_reason_;
  s.queue_depth = queue_depth_;
  s.chunk_bytes = chunk_bytes_;
  s.pread_threads = pread_threads_;
  s.max_bytes_per_s = max_bytes_per_s_;
  s.read_timeout_s = read_timeout_s_;
  s.faults = faults_;
  s.crc32c_implementation = crc32c_implementation();
  s.busy_s = busy_->seconds();
  std::lock_guard<std::mutex> lock(mutex_);
  s.bytes_read = bytes_read_;
  s.reads = reads_;
  s.extents = extents_;
  s.wait_s = wait_s_;
  s.checksum_s = checksum_s_;
  s.abandoned_reads = abandoned_reads_;
  return s;
}

void FlashReader::reset_stats() {
  busy_->reset();
  std::lock_guard<std::mutex> lock(mutex_);
  bytes_read_ = reads_ = extents_ = 0;
  wait_s_ = checksum_s_ = 0;
}

std::string ReaderStats::fallback_reason() const {
  std::string out;
  auto add = [&out](const std::string& reason) {
    if (reason.empty()) return;
    if (!out.empty()) out += "; ";
    out += reason;
  };
  add(backend_reason);
  if (direct_requested && !direct) add(direct_reason);
  add(buffers_reason);
  if (huge_pages_requested) add(huge_pages_reason);
  if (!faults.empty()) add("injected faults: " + faults);  // never measure these unawares
  return out;
}

}  // namespace io
}  // namespace lever

// FlashReader: asynchronous, checksummed reads of large aligned extents of
// one file (a store's weights.bin) into a ring of aligned slot buffers.
//
//   FlashReader r(path, slot_bytes, n_slots, options);
//   r.submit(slot, offset, length, crcs, "layer 7");  // returns at once
//   ...                                                 // compute meanwhile
//   SlotView v = r.wait(slot);                          // bytes, verified
//
// Every extent is cut into chunks of options.chunk_bytes; at most
// options.queue_depth chunk reads are in flight, and each chunk's CRC32C is
// checked as soon as it arrives, on an I/O thread. Reads go through io_uring
// (registered buffers, READ_FIXED) or, where that is missing or blocked,
// through a pread thread pool; the file is opened with O_DIRECT unless the
// file system refuses it. Which of these happened is reported in stats().
//
// On Android io_uring is not even tried unless LEVER_IO_URING=1: the app
// seccomp filter kills a process calling io_uring_setup (SIGSYS) instead of
// failing the call. See choose_io_uring().
//
// A wait never hangs: a wait(slot) that sees no read of its extent finish
// for read_timeout_s seconds fails with FailureKind::kTimeout, and the
// backends bound their retries. read() still waits for the kernel without a
// deadline, because it may be writing into the caller's buffer. close()
// cancels the reads in flight (io_uring) and waits for them at most
// read_timeout_s seconds; reads still out then are abandoned: reported
// (stderr, ReaderStats::abandoned_reads), and the slot buffers they target
// are leaked rather than freed. With the pread backend close() waits for a
// blocked pread() without a deadline (it cannot be cancelled; see
// pread_backend.cpp). Faults can be injected for tests
// (ReaderOptions::faults, LEVER_IO_FAULTS; see io/fault_injection.h).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/read_backend.h"
#include "io/slot_memory.h"

namespace lever {
namespace io {

struct ReaderOptions {
  std::string backend = "auto";    // "auto" (io_uring, else pread), "io_uring" or "pread"
  bool direct = true;              // open with O_DIRECT (bypass the page cache)
  int queue_depth = 8;             // chunk reads in flight at most
  uint32_t chunk_bytes = 1u << 20;  // bytes per read: a power of two, >= 4096
  int pread_threads = 4;           // threads of the pread backend
  double max_bytes_per_s = 0;      // pace reads to emulate slower flash; 0: unlimited
  // Seconds wait(slot) may go without any read of its extent finishing
  // before it fails (kTimeout). 0: LEVER_IO_TIMEOUT_S if set, else
  // kDefaultReadTimeoutS.
  double read_timeout_s = 0;
  // Faults to inject (tests; grammar in io/fault_injection.h). "": those of
  // LEVER_IO_FAULTS, if set.
  std::string faults;
  // Slot buffers on transparent huge pages where the kernel gives them (one
  // request per several chunks instead of two per chunk; see
  // io/slot_memory.h). LEVER_HUGE_PAGES=0 / =1 overrides this.
  bool huge_pages = true;
};

// Default of ReaderOptions::read_timeout_s, seconds: generous, since a
// healthy read of one chunk takes milliseconds.
constexpr double kDefaultReadTimeoutS = 30.0;
// The longest read_timeout_s allowed, seconds (about 11.6 days).
constexpr double kMaxReadTimeoutS = 1e6;

// io_uring is tried by default except on Android, whose app seccomp filter
// kills the process on io_uring_setup rather than returning an error.
#if defined(__ANDROID__)
constexpr bool kIoUringAllowedByDefault = false;
#else
constexpr bool kIoUringAllowedByDefault = true;
#endif

// Whether FlashReader tries io_uring, and if not, why.
struct IoUringChoice {
  bool try_io_uring = false;
  std::string reason;  // why not; "" when trying it or when pread was asked for
};

// backend: ReaderOptions::backend. env_value: LEVER_IO_URING (nullptr or ""
// if unset). allowed_by_default: kIoUringAllowedByDefault (a parameter so a
// test can play Android anywhere). LEVER_IO_URING=0 turns io_uring off on
// every platform, =1 lets it be tried on every platform (Android included);
// any other value throws std::invalid_argument.
IoUringChoice choose_io_uring(const std::string& backend, const char* env_value,
                              bool allowed_by_default);

// The read timeout in seconds: option if > 0, else LEVER_IO_TIMEOUT_S (env_value,
// nullptr or "" if unset), else kDefaultReadTimeoutS. Throws
// std::invalid_argument for a negative option or a bad env value.
double choose_read_timeout(double option, const char* env_value);

struct ReaderStats {
  // Configuration as it turned out.
  std::string backend;           // "io_uring" or "pread"
  bool direct = false;           // O_DIRECT in use
  bool direct_requested = true;  // O_DIRECT was asked for
  std::string backend_reason;    // why not io_uring ("" if as requested)
  std::string direct_reason;     // why not O_DIRECT ("" if in use)
  bool registered_buffers = false;  // io_uring READ_FIXED on the slot buffers
  std::string buffers_reason;    // why not registered ("" if registered or pread)
  bool huge_pages_requested = true;  // slot buffers asked for huge pages
  uint64_t slot_buffer_bytes = 0;    // bytes of memory all slot buffers take (io/slot_memory.h)
  uint64_t huge_page_bytes = 0;      // of those, bytes on huge pages (measured when made)
  std::string huge_pages_reason;     // why none ("" if some, or if slots are under 2 MiB)
  int queue_depth = 0;
  uint32_t chunk_bytes = 0;
  int pread_threads = 0;         // 0 with io_uring
  double max_bytes_per_s = 0;
  double read_timeout_s = 0;     // see ReaderOptions::read_timeout_s
  std::string faults;            // injected faults in use ("" normally)
  const char* crc32c_implementation = "";
  // Counters since construction or reset_stats().
  uint64_t bytes_read = 0;   // bytes read from the file
  uint64_t reads = 0;        // chunk reads completed
  uint64_t extents = 0;      // submit() and read() calls
  double wait_s = 0;         // seconds callers were blocked in wait() and read()
  double busy_s = 0;         // seconds with at least one read in flight
  double checksum_s = 0;     // CPU seconds spent computing CRC32C
  // Reads close() gave up on (still in flight read_timeout_s seconds after
  // being cancelled); their slot buffers are leaked. 0 normally; not reset.
  uint64_t abandoned_reads = 0;

  // Everything that is not as requested (io_uring, O_DIRECT, registered
  // buffers, huge pages) and any injected faults, "; "-separated; "" if none.
  std::string fallback_reason() const;
};

// Why a read failed.
enum class FailureKind {
  kOpen,         // the file could not be opened
  kUnavailable,  // the requested backend cannot be used here
  kIo,           // the read returned an errno
  kShortRead,    // the file ended before the extent did
  kChecksum,     // a chunk's CRC32C differs from the expected one
  kCancelled,    // the reader was closed before the read was issued
  kTimeout,      // no read of the extent finished for read_timeout_s seconds
};

// A read that failed. what() names the label, the file, the file offset of
// the failing chunk and the reason.
class FlashReadError : public std::runtime_error {
 public:
  FlashReadError(FailureKind kind, const std::string& message, std::string path,
                 std::string label, int64_t offset)
      : std::runtime_error(message),
        kind(kind), path(std::move(path)), label(std::move(label)), offset(offset) {}
  FailureKind kind;
  std::string path;
  std::string label;
  int64_t offset;  // file offset of the failing chunk, bytes; -1 if none
};

// A slot's bytes after wait(): valid until the slot is submitted again.
struct SlotView {
  const uint8_t* data;
  size_t length;  // bytes
};

class FlashReader final : private ChunkSink {
 public:
  // Opens `path` read-only and allocates n_slots buffers of slot_bytes
  // (a multiple of 4096) each, 4096-aligned, on huge pages where asked and
  // given (options.huge_pages; io/slot_memory.h), every page touched.
  // Throws std::invalid_argument for bad arguments and FlashReadError if the file cannot be opened or
  // options.backend == "io_uring" is unavailable.
  FlashReader(const std::string& path, size_t slot_bytes, int n_slots,
              const ReaderOptions& options = ReaderOptions());
  ~FlashReader() override;  // close(), then frees the buffers
  FlashReader(const FlashReader&) = delete;
  FlashReader& operator=(const FlashReader&) = delete;

  // Starts reading [offset, offset + length) of the file into `slot` and
  // returns. offset and length: bytes, multiples of 4096, length <=
  // slot_bytes. chunk_crcs: empty, or the expected CRC32C of each chunk of
  // the extent (chunk_bytes each, the last one possibly shorter). `label`
  // names the extent in errors ("layer 7"). The slot must not have reads in
  // flight (wait() for it first).
  void submit(int slot, uint64_t offset, uint64_t length, std::vector<uint32_t> chunk_crcs,
              std::string label);

  // Blocks until the slot's extent is read and verified and returns its
  // bytes; throws FlashReadError if a chunk failed, or (kTimeout) if none
  // of its reads finished for read_timeout_s seconds -- the reads then stay
  // in flight: ready(slot) says when they are over, and the slot cannot be
  // submitted again before. May be called again.
  SlotView wait(int slot);

  // True if wait(slot) would not block.
  bool ready(int slot);

  // Reads [offset, offset + length) into `out` (length bytes) and returns
  // when it is verified (a synchronous submit + wait without a slot). With
  // O_DIRECT, `out` should be 4096-aligned; otherwise the bytes go through
  // two aligned staging buffers and are copied. Has no deadline: it must
  // not return while the kernel may still write into `out`.
  void read(uint64_t offset, uint64_t length, uint8_t* out, const std::vector<uint32_t>& chunk_crcs,
            const std::string& label);

  ReaderStats stats() const;
  void reset_stats();

  // Cancels queued reads and (io_uring) the ones in flight, waits for the
  // reads in flight at most read_timeout_s seconds (pread: until they end),
  // stops the I/O threads and closes the file. Reads still out at the
  // deadline are abandoned (see the top of this file). Slot buffers stay
  // allocated (views of them remain readable) until the destructor, and for
  // ever if a read was abandoned. Safe to call more than once.
  void close();
  bool closed() const;

  const std::string& path() const { return path_; }
  size_t slot_bytes() const { return slot_bytes_; }
  int n_slots() const { return static_cast<int>(slots_.size()); }

 private:
  struct Extent;
  class BusyClock;
  class Pacer;
  struct Slot;

  // ChunkSink (called from the backend's threads).
  void on_chunk_issued(ChunkRead& chunk) override;
  void on_chunk_done(const ChunkRead& chunk, const ChunkResult& result) override;
  void on_chunk_cancelled(const ChunkRead& chunk) override;

  void describe_slot_pages();
  void open_file(bool want_direct);
  void create_backend(const ReaderOptions& options);
  void check_extent_args(const char* what, uint64_t offset, uint64_t length,
                         size_t n_crcs) const;
  uint32_t count_chunks(uint64_t length) const;
  void reset_extent(Extent& e, uint64_t offset, uint64_t length, uint8_t* dest,
                    int fixed_buffer, std::string label, std::vector<uint32_t> crcs);
  void start_extent(Extent& extent);
  void await_extent(Extent& extent, bool deadline);
  std::string describe_timeout(const Extent& extent, int64_t* offset) const;
  void drain_extent(Extent& extent);
  void read_staged(uint64_t offset, uint64_t length, uint8_t* out,
                   const std::vector<uint32_t>& chunk_crcs, const std::string& label);
  std::string describe_failure(const Extent& extent, const ChunkRead& chunk,
                               const ChunkResult& result, uint32_t actual_crc,
                               FailureKind* kind) const;
  void record_failure_locked(Extent& e, const ChunkRead& chunk, FailureKind kind,
                             std::string message);
  void finish_chunk_locked(Extent& e, uint32_t chunk_index);
  Slot& slot_at(int slot, const char* what);

  const std::string path_;
  const size_t slot_bytes_;
  const uint32_t chunk_bytes_;
  const int queue_depth_;
  const bool direct_requested_;
  const double max_bytes_per_s_;
  const double read_timeout_s_;  // seconds; see ReaderOptions
  std::string faults_;           // the injected-fault plan's text ("" normally)
  int fd_ = -1;
  bool direct_ = false;
  std::string direct_reason_;
  std::string backend_reason_;
  std::string buffers_reason_;
  bool registered_buffers_ = false;
  int pread_threads_ = 0;
  bool huge_pages_requested_ = true;
  uint64_t slot_buffer_bytes_ = 0;
  uint64_t huge_page_bytes_ = 0;
  std::string huge_pages_reason_;

  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<BusyClock> busy_;
  std::unique_ptr<Pacer> pacer_;
  std::unique_ptr<ReadBackend> backend_;

  mutable std::mutex mutex_;  // guards extents' progress, counters, closed_
  std::condition_variable done_cv_;  // an extent completed
  bool closed_ = false;
  uint64_t bytes_read_ = 0;
  uint64_t reads_ = 0;
  uint64_t extents_ = 0;
  double wait_s_ = 0;
  double checksum_s_ = 0;
  uint64_t abandoned_reads_ = 0;  // see ReaderStats::abandoned_reads
};

}  // namespace io
}  // namespace lever

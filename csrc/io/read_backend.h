// The interface between FlashReader (extents, checksums, statistics) and the
// two ways of reading a file: io_uring and a pread thread pool.
//
// FlashReader cuts every extent into chunks (ChunkRead) and hands them to a
// backend, which reads them in order with at most `queue_depth` in flight and
// reports each one back through a ChunkSink from its own thread.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lever {
namespace io {

// O_DIRECT needs file offsets, lengths and memory addresses aligned to the
// device's logical block; the reader asks for 4096 bytes (safe everywhere).
constexpr uint64_t kAlignment = 4096;

// One read of up to chunk_bytes bytes: the unit the backends work with.
struct ChunkRead {
  uint64_t file_offset = 0;  // where the chunk starts in the file, bytes
  uint8_t* dest = nullptr;   // where its bytes go
  uint32_t length = 0;       // bytes
  int fixed_buffer = -1;     // index of the registered buffer holding dest, or -1
  void* extent = nullptr;    // the FlashReader extent it belongs to (opaque here)
  uint32_t index = 0;        // chunk number within that extent
  int64_t issued_ns = 0;     // steady-clock time it was issued (set by the sink)
};

// How a chunk's read ended.
struct ChunkResult {
  uint32_t bytes = 0;  // bytes read into dest; < length at the end of the file
  int error = 0;       // 0, or the errno of the failed read
  // The read never reached the kernel: io_uring_enter refused to submit it
  // (error is that call's errno).
  bool not_submitted = false;
};

// FlashReader's side. Both calls may come from any backend thread.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  // The chunk's read is about to be issued to the kernel.
  virtual void on_chunk_issued(ChunkRead& chunk) = 0;
  // The chunk's read is over (all bytes, end of file, or an error).
  virtual void on_chunk_done(const ChunkRead& chunk, const ChunkResult& result) = 0;
  // The chunk was never issued: the backend was shut down first.
  virtual void on_chunk_cancelled(const ChunkRead& chunk) = 0;
};

class ReadBackend {
 public:
  virtual ~ReadBackend() = default;
  // "io_uring" or "pread".
  virtual const char* name() const = 0;
  // Reads the chunks (in order, at most queue_depth at a time) and returns
  // at once. After shutdown() the chunks are cancelled instead.
  virtual void enqueue(const std::vector<ChunkRead>& chunks) = 0;
  // Cancels chunks not issued yet, stops the reads in flight where the
  // backend can, waits for them at most about timeout_s seconds, stops the
  // backend's threads, and returns the number of reads it gave up on
  // ("abandoned": still in the kernel's hands, or never to be delivered).
  // After it returns the backend never calls the sink again and may be
  // destroyed; it keeps alive (leaks) whatever an abandoned read still uses
  // on its side (ring, thread). The caller must then leak the memory those
  // reads target (the kernel may still write into it). 0 normally. Safe to
  // call more than once (later calls return the same count at once).
  //   io_uring: IORING_OP_ASYNC_CANCEL for every read in flight, then waits
  //     for their completions until the deadline.
  //   pread: a blocked pread() cannot be cancelled; it waits for the reads in
  //     flight without a deadline (timeout_s is not used) and returns 0.
  virtual size_t shutdown(double timeout_s) = 0;
};

// The timeout_s of a shutdown a backend does on its own (destructor), seconds.
constexpr double kDefaultShutdownTimeoutS = 5.0;

// A chunk read that came back short may go on from where it stopped, unless
// the file is open with O_DIRECT and the stop is not block-aligned: O_DIRECT
// reads stop short only at the end of the file.
inline bool can_continue_short_read(bool direct, uint64_t next_offset) {
  return !direct || next_offset % kAlignment == 0;
}

// A pool of `n_threads` threads, each doing one blocking pread() at a time
// (so at most n_threads reads are in flight).
std::unique_ptr<ReadBackend> make_pread_backend(int fd, bool direct, int n_threads,
                                                ChunkSink& sink);

// What the io_uring backend needs to know.
struct IoUringConfig {
  int fd = -1;
  bool direct = true;
  int queue_depth = 8;
  std::vector<iovec> fixed_buffers;  // registered with the ring (READ_FIXED)
  // Fault injection (tests, io/fault_injection.h: submit_err=ERRNO*K): the
  // first inject_submit_times submits of reads (-1: all) fail with this errno.
  int inject_submit_errno = 0;
  int64_t inject_submit_times = -1;
  // Fault injection (no_cancel): shutdown() sends no IORING_OP_ASYNC_CANCEL,
  // as if the kernel could not cancel the reads in flight.
  bool inject_no_cancel = false;
};

// An io_uring ring with one reaper thread. Returns nullptr and sets *error
// when the kernel refuses io_uring (ENOSYS: too old; EPERM: seccomp or
// sysctl). If the buffers cannot be registered (e.g. RLIMIT_MEMLOCK) the
// backend still works with plain READV and says why in *buffers_note.
std::unique_ptr<ReadBackend> make_io_uring_backend(const IoUringConfig& config,
                                                   ChunkSink& sink, std::string* error,
                                                   std::string* buffers_note);

}  // namespace io
}  // namespace lever

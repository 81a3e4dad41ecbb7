// The pread backend: worker threads take chunks from a queue, in order, and
// read each with blocking pread() calls. Used where io_uring is missing or
// blocked (Android apps: seccomp) and when asked for explicitly.
//
// shutdown() waits for the preads in flight without a deadline: a blocked
// pread() cannot be cancelled, and leaving its thread running would mean
// leaking the whole pool with it (the thread touches the backend when the
// call returns) and reissuing reads on a file descriptor number the reader
// has closed and the process may reuse. A device whose reads never complete
// can therefore hold close() with this backend; wait() still times out.

#include <errno.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "io/read_backend.h"

namespace lever {
namespace io {
namespace {

// How often one chunk's pread may fail with EINTR / EAGAIN before it fails.
constexpr int kMaxTransientRetries = 16;

// Reads the whole chunk, going on after short reads where that is allowed
// (each round makes progress, so the loop ends).
ChunkResult read_chunk(int fd, bool direct, const ChunkRead& chunk) {
  ChunkResult result;
  int retries = 0;
  while (result.bytes < chunk.length) {
    const uint64_t offset = chunk.file_offset + result.bytes;
    const ssize_t n = ::pread(fd, chunk.dest + result.bytes, chunk.length - result.bytes,
                              static_cast<off_t>(offset));
    if (n < 0) {
      if ((errno == EINTR || errno == EAGAIN) && ++retries <= kMaxTransientRetries) continue;
      result.error = errno;
      break;
    }
    if (n == 0) break;  // end of file
    result.bytes += static_cast<uint32_t>(n);
    if (!can_continue_short_read(direct, chunk.file_offset + result.bytes)) break;
  }
  return result;
}

class PreadBackend final : public ReadBackend {
 public:
  PreadBackend(int fd, bool direct, int n_threads, ChunkSink& sink)
      : fd_(fd), direct_(direct), sink_(sink) {
    for (int i = 0; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  ~PreadBackend() override { shutdown(kDefaultShutdownTimeoutS); }

  const char* name() const override { return "pread"; }

  void enqueue(const std::vector<ChunkRead>& chunks) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!stopping_) {
        queue_.insert(queue_.end(), chunks.begin(), chunks.end());
        work_cv_.notify_all();
        return;
      }
    }
    for (const ChunkRead& chunk : chunks) sink_.on_chunk_cancelled(chunk);
  }

  // timeout_s is not used: see the top of this file. Returns 0.
  size_t shutdown(double /*timeout_s*/) override {
    std::deque<ChunkRead> cancelled;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      cancelled.swap(queue_);
    }
    work_cv_.notify_all();
    for (const ChunkRead& chunk : cancelled) sink_.on_chunk_cancelled(chunk);
    // Workers finish the read they are doing, then see stopping_ and exit.
    for (std::thread& worker : workers_) {
      if (worker.joinable()) worker.join();
    }
    return 0;
  }

 private:
  void worker_loop() {
    for (;;) {
      ChunkRead chunk;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping
        chunk = queue_.front();
        queue_.pop_front();
      }
      sink_.on_chunk_issued(chunk);
      const ChunkResult result = read_chunk(fd_, direct_, chunk);
      sink_.on_chunk_done(chunk, result);  // verifies the checksum on this thread
    }
  }

  const int fd_;
  const bool direct_;
  ChunkSink& sink_;
  std::vector<std::thread> workers_;

  std::mutex mutex_;  // guards the fields below
  std::condition_variable work_cv_;
  std::deque<ChunkRead> queue_;  // chunks not taken by a worker yet
  bool stopping_ = false;
};

}  // namespace

std::unique_ptr<ReadBackend> make_pread_backend(int fd, bool direct, int n_threads,
                                                ChunkSink& sink) {
  return std::make_unique<PreadBackend>(fd, direct, n_threads < 1 ? 1 : n_threads, sink);
}

}  // namespace io
}  // namespace lever

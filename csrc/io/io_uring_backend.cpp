// The io_uring backend, through raw system calls (no liburing): the kernel's
// uapi header <linux/io_uring.h> gives the structures, and the rings are
// mmapped here. That keeps the wheel free of runtime dependencies and the
// code cross-compilable for Android.
//
// How it works:
//   - The submission queue (SQ) is filled under `mutex_`, from the thread
//     calling enqueue() and from the reaper thread; each read carries the
//     index of a Tag (one per possible read in flight) as its user_data.
//   - One reaper thread blocks in io_uring_enter(GETEVENTS) until reads
//     complete, takes the completions off the completion queue (CQ), issues
//     the next queued chunks at once (so the device never idles while
//     checksums are computed), then reports the finished chunks to the sink.
//     With no read in flight it sleeps on a condition variable instead, so
//     shutdown() never has to wake it through the ring.
//   - Nothing waits forever on the ring's account: a failed submit takes its
//     entries back and fails their chunks with the errno; EAGAIN / EINTR
//     completions are retried at most kMaxTransientRetries times; a short
//     read goes on only while it makes progress. (A read the kernel never
//     completes is the FlashReader's deadline's business, see wait().)
//   - shutdown() is bounded: it sends IORING_OP_ASYNC_CANCEL for every read
//     in flight (those complete with -ECANCELED, or -EINTR if already
//     running in an io-wq worker; a block-device read that is already
//     running cannot be cancelled, -EALREADY, and completes normally) and
//     waits for the reads until its deadline. Reads still out then are
//     abandoned: the reaper thread is detached and the backend object is
//     leaked (IoUringHandle), and the reaper drops their completions if
//     they ever come, so the sink is never called again.
//   - Ring indices are shared with the kernel: we read what the kernel
//     writes with acquire loads and publish what we write with release
//     stores, so the entries themselves are visible before the index moves.

#include <errno.h>
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "io/read_backend.h"

// The io_uring system calls have the same numbers on every architecture of
// the unified syscall table (x86-64, aarch64, ...); older libc headers may
// not name them.
#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#endif
#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif
#ifndef __NR_io_uring_register
#define __NR_io_uring_register 427
#endif

namespace lever {
namespace io {
namespace {

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

// ---------------------------------------------------------------------------
// A minimal io_uring: setup, the two mmapped rings, submit and reap.
// The SQ side must be used by one thread at a time (the backend's mutex),
// the CQ side by the reaper only.
class Ring {
 public:
  Ring() = default;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() { close(); }

  // Creates a ring of at least `entries` SQ entries. 0 or -errno.
  int setup(unsigned entries) {
    io_uring_params params;
    std::memset(&params, 0, sizeof(params));
    const long fd = syscall(__NR_io_uring_setup, entries, &params);
    if (fd < 0) return -errno;
    fd_ = static_cast<int>(fd);

    // Sizes of the two ring mappings; one mapping serves both on 5.4+.
    sq_map_bytes_ = params.sq_off.array + params.sq_entries * sizeof(unsigned);
    cq_map_bytes_ = params.cq_off.cqes + params.cq_entries * sizeof(io_uring_cqe);
    const bool single_mmap = (params.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single_mmap) sq_map_bytes_ = cq_map_bytes_ = std::max(sq_map_bytes_, cq_map_bytes_);

    sq_map_ = map(sq_map_bytes_, IORING_OFF_SQ_RING);
    if (sq_map_ == nullptr) return fail_setup();
    cq_map_ = single_mmap ? sq_map_ : map(cq_map_bytes_, IORING_OFF_CQ_RING);
    if (cq_map_ == nullptr) return fail_setup();
    sqes_bytes_ = params.sq_entries * sizeof(io_uring_sqe);
    sqes_ = static_cast<io_uring_sqe*>(map(sqes_bytes_, IORING_OFF_SQES));
    if (sqes_ == nullptr) return fail_setup();

    auto* sq = static_cast<char*>(sq_map_);
    sq_head_ = reinterpret_cast<unsigned*>(sq + params.sq_off.head);
    sq_tail_ = reinterpret_cast<unsigned*>(sq + params.sq_off.tail);
    sq_mask_ = *reinterpret_cast<unsigned*>(sq + params.sq_off.ring_mask);
    sq_entries_ = params.sq_entries;
    sq_array_ = reinterpret_cast<unsigned*>(sq + params.sq_off.array);
    auto* cq = static_cast<char*>(cq_map_);
    cq_head_ = reinterpret_cast<unsigned*>(cq + params.cq_off.head);
    cq_tail_ = reinterpret_cast<unsigned*>(cq + params.cq_off.tail);
    cq_mask_ = *reinterpret_cast<unsigned*>(cq + params.cq_off.ring_mask);
    cqes_ = reinterpret_cast<io_uring_cqe*>(cq + params.cq_off.cqes);
    sqe_tail_ = *sq_tail_;
    return 0;
  }

  // Registers buffers for IORING_OP_READ_FIXED (pins their pages). 0 or -errno.
  int register_buffers(const std::vector<iovec>& buffers) {
    const long r = syscall(__NR_io_uring_register, fd_, IORING_REGISTER_BUFFERS, buffers.data(),
                           static_cast<unsigned>(buffers.size()));
    return r < 0 ? -errno : 0;
  }

  // A zeroed SQE to fill in, or nullptr when the SQ is full.
  io_uring_sqe* next_sqe() {
    const unsigned head = __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE);
    if (sqe_tail_ - head >= sq_entries_) return nullptr;
    const unsigned index = sqe_tail_ & sq_mask_;
    io_uring_sqe* sqe = &sqes_[index];
    std::memset(sqe, 0, sizeof(*sqe));
    sq_array_[index] = index;
    ++sqe_tail_;
    return sqe;
  }

  // Hands every SQE filled since the last call to the kernel. 0 or -errno.
  // inject_errno (fault injection, tests): if not 0 and there is something
  // to submit, publish the SQEs but fail with that errno instead of calling
  // io_uring_enter, as a kernel that refused them would.
  int submit(int inject_errno = 0) {
    const unsigned published = *sq_tail_;
    if (sqe_tail_ != published) {
      unsubmitted_ += sqe_tail_ - published;
      __atomic_store_n(sq_tail_, sqe_tail_, __ATOMIC_RELEASE);  // SQEs first, then the tail
    }
    if (inject_errno != 0 && unsubmitted_ > 0) return -inject_errno;
    // Every way of not making progress counts against one bound (1000 tries,
    // about 0.1 s of sleeps at most), so a submit always ends.
    int stalled_tries = 0;
    while (unsubmitted_ > 0) {
      const long n = syscall(__NR_io_uring_enter, fd_, unsubmitted_, 0, 0, nullptr, 0);
      if (n > 0) {
        unsubmitted_ -= static_cast<unsigned>(n);
        stalled_tries = 0;
        continue;
      }
      const int err = n == 0 ? EAGAIN : errno;  // took nothing: as if busy
      if (++stalled_tries >= 1000) return -err;
      if (err == EINTR) continue;
      // EAGAIN / EBUSY: the kernel is short of memory or of CQ room for a
      // moment; the entries stay in the ring, so try again shortly.
      if (err == EAGAIN || err == EBUSY) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      return -err;
    }
    return 0;
  }

  // True if SQEs were filled since the last submit() or not taken by it.
  bool has_unsubmitted() const { return unsubmitted_ > 0 || sqe_tail_ != *sq_tail_; }

  // Takes back the SQEs published but not taken by the kernel (after a
  // failed submit) and appends their user_data to *out. Safe because the
  // kernel reads the SQ only inside io_uring_enter with to_submit > 0 (no
  // SQPOLL), and those calls hold the same lock as this one.
  void retract_unsubmitted(std::vector<uint64_t>* out) {
    const unsigned head = __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE);
    for (unsigned i = head; i != sqe_tail_; ++i) {
      out->push_back(sqes_[sq_array_[i & sq_mask_]].user_data);
    }
    sqe_tail_ = head;
    __atomic_store_n(sq_tail_, head, __ATOMIC_RELEASE);
    unsubmitted_ = 0;
  }

  // Blocks until at least one completion is waiting. 0 or -errno.
  int wait() {
    for (;;) {
      const long r = syscall(__NR_io_uring_enter, fd_, 0, 1, IORING_ENTER_GETEVENTS, nullptr, 0);
      if (r >= 0) return 0;
      if (errno != EINTR) return -errno;
    }
  }

  // Copies the oldest completion to *out and frees its CQ entry; false if none.
  bool pop(io_uring_cqe* out) {
    const unsigned head = *cq_head_;  // only this thread writes it
    const unsigned tail = __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);
    if (head == tail) return false;
    *out = cqes_[head & cq_mask_];
    __atomic_store_n(cq_head_, head + 1, __ATOMIC_RELEASE);  // the kernel may reuse it now
    return true;
  }

  // Unmaps the rings and closes the ring (which also unregisters buffers).
  void close() {
    if (sqes_ != nullptr) munmap(sqes_, sqes_bytes_);
    if (cq_map_ != nullptr && cq_map_ != sq_map_) munmap(cq_map_, cq_map_bytes_);
    if (sq_map_ != nullptr) munmap(sq_map_, sq_map_bytes_);
    sqes_ = nullptr;
    cq_map_ = sq_map_ = nullptr;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  void* map(size_t bytes, off_t what) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, what);
    return p == MAP_FAILED ? nullptr : p;
  }

  int fail_setup() {
    const int err = errno;
    close();
    return -err;
  }

  int fd_ = -1;
  void* sq_map_ = nullptr;
  void* cq_map_ = nullptr;
  size_t sq_map_bytes_ = 0;
  size_t cq_map_bytes_ = 0;
  io_uring_sqe* sqes_ = nullptr;
  size_t sqes_bytes_ = 0;

  unsigned* sq_head_ = nullptr;  // written by the kernel
  unsigned* sq_tail_ = nullptr;  // written by us
  unsigned* sq_array_ = nullptr;
  unsigned sq_mask_ = 0;
  unsigned sq_entries_ = 0;
  unsigned sqe_tail_ = 0;        // SQEs handed out by next_sqe()
  unsigned unsubmitted_ = 0;     // published but not yet taken by io_uring_enter

  unsigned* cq_head_ = nullptr;  // written by us
  unsigned* cq_tail_ = nullptr;  // written by the kernel
  unsigned cq_mask_ = 0;
  io_uring_cqe* cqes_ = nullptr;
};

// ---------------------------------------------------------------------------

// How often one chunk's read may come back EAGAIN / EINTR before it fails.
constexpr uint32_t kMaxTransientRetries = 16;

// user_data of an IORING_OP_ASYNC_CANCEL entry: this bit, or'ed with the
// tag it cancels (reads carry their bare tag index).
constexpr uint64_t kCancelBit = uint64_t{1} << 62;

class IoUringBackend final : public ReadBackend {
 public:
  IoUringBackend(const IoUringConfig& config, ChunkSink& sink)
      : fd_(config.fd), direct_(config.direct), sink_(sink), tags_(config.queue_depth),
        inject_submit_errno_(config.inject_submit_errno),
        inject_submit_times_(config.inject_submit_times),
        inject_no_cancel_(config.inject_no_cancel) {
    for (size_t i = tags_.size(); i > 0; --i) free_tags_.push_back(static_cast<uint32_t>(i - 1));
  }

  // Only destroyed when shutdown() abandoned nothing (see IoUringHandle).
  ~IoUringBackend() override { shutdown(kDefaultShutdownTimeoutS); }

  // Ring setup and buffer registration; see make_io_uring_backend.
  bool init(const IoUringConfig& config, std::string* error, std::string* buffers_note) {
    // One SQE per read in flight (plus one to spare).
    const int err = ring_.setup(static_cast<unsigned>(config.queue_depth) + 1);
    if (err != 0) {
      *error = "io_uring_setup failed: " + errno_text(-err);
      return false;
    }
    if (!config.fixed_buffers.empty()) {
      const int reg = ring_.register_buffers(config.fixed_buffers);
      registered_ = reg == 0;
      if (!registered_) {
        *buffers_note = "could not register the slot buffers with io_uring (" + errno_text(-reg) +
                        "; RLIMIT_MEMLOCK?); reading with IORING_OP_READV instead of READ_FIXED";
      }
    }
    reaper_done_ = false;
    reaper_ = std::thread([this] { reaper_loop(); });
    return true;
  }

  const char* name() const override { return "io_uring"; }

  void enqueue(const std::vector<ChunkRead>& chunks) override {
    std::vector<Finished> failed;  // chunks whose submit failed
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping = stopping_;
      if (!stopping) {
        queued_.insert(queued_.end(), chunks.begin(), chunks.end());
        issue_queued_locked(&failed);
      }
    }
    reads_cv_.notify_one();  // reads are in flight: the reaper waits for them
    if (stopping) {
      for (const ChunkRead& chunk : chunks) sink_.on_chunk_cancelled(chunk);
      return;
    }
    for (const Finished& f : failed) sink_.on_chunk_done(f.chunk, f.result);
  }

  // See ReadBackend::shutdown and the top of this file. timeout_s: seconds.
  size_t shutdown(double timeout_s) override {
    std::deque<ChunkRead> cancelled;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (shut_down_) return abandoned_;
      shut_down_ = true;
      stopping_ = true;
      cancelled.swap(queued_);
      if (!reaper_done_ && !inject_no_cancel_) cancel_in_flight_locked();
    }
    // The reaper exits once the reads in flight are over (at once if none).
    reads_cv_.notify_all();
    for (const ChunkRead& chunk : cancelled) sink_.on_chunk_cancelled(chunk);
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(std::max(0.0, timeout_s)));
      if (!state_cv_.wait_until(lock, deadline, [this] { return reaper_done_; })) {
        // Let a report the reaper is making to the sink end (it is short),
        // then stop all reports: the caller may free the sink.
        state_cv_.wait(lock, [this] { return reaper_done_ || !delivering_; });
        if (!reaper_done_) abandoned_ = tags_in_use();
      }
    }
    if (abandoned_ > 0) {
      reaper_.detach();  // blocked in io_uring_enter; it and *this are leaked
      return abandoned_;
    }
    if (reaper_.joinable()) reaper_.join();
    ring_.close();
    return 0;
  }

 private:
  // One read in flight.
  struct Tag {
    ChunkRead chunk;
    uint32_t done = 0;     // bytes of the chunk read so far (short reads go on)
    uint32_t retries = 0;  // EAGAIN / EINTR completions of this chunk so far
    iovec iov{};           // for IORING_OP_READV
  };

  // A chunk whose read is over, to report to the sink.
  struct Finished {
    ChunkRead chunk;
    ChunkResult result;
  };

  size_t tags_in_use() const { return tags_.size() - free_tags_.size(); }

  // Queues an IORING_OP_ASYNC_CANCEL for every read in flight and submits
  // them. Best effort: a cancel that cannot be queued or submitted (or that
  // the kernel refuses, e.g. -EINVAL before Linux 5.5) leaves its read to
  // the deadline of shutdown(). Holds mutex_.
  void cancel_in_flight_locked() {
    std::vector<bool> is_free(tags_.size(), false);
    for (uint32_t t : free_tags_) is_free[t] = true;
    for (uint32_t t = 0; t < tags_.size(); ++t) {
      if (is_free[t]) continue;
      io_uring_sqe* sqe = ring_.next_sqe();
      if (sqe == nullptr && ring_.submit() == 0) sqe = ring_.next_sqe();  // SQ full: flush
      if (sqe == nullptr) break;
      sqe->opcode = IORING_OP_ASYNC_CANCEL;
      sqe->fd = -1;
      sqe->addr = t;  // the user_data of the read to cancel
      sqe->user_data = kCancelBit | t;
    }
    if (ring_.submit() != 0) {
      std::vector<uint64_t> untaken;  // cancel entries only: drop them
      ring_.retract_unsubmitted(&untaken);
    }
  }

  // Issues queued chunks while there is a free tag (queue depth), and
  // submits them together with any re-issued reads; chunks that cannot be
  // submitted go to *failed. A failed submit frees its tags, so the next
  // queued chunks are tried (and fail) too: none is left queued with no
  // read in flight to trigger its issue. Holds mutex_.
  void issue_queued_locked(std::vector<Finished>* failed) {
    do {
      while (!free_tags_.empty() && !queued_.empty()) {
        const uint32_t t = free_tags_.back();
        free_tags_.pop_back();
        tags_[t].chunk = queued_.front();
        tags_[t].done = 0;
        tags_[t].retries = 0;
        queued_.pop_front();
        sink_.on_chunk_issued(tags_[t].chunk);
        prepare_read_locked(t, failed);
      }
    } while (!submit_locked(failed) && !queued_.empty());  // no system call when nothing is new
  }

  // Fills an SQE reading the rest of tag t's chunk (or fails the chunk if
  // the SQ is full, which the queue depth rules out). Holds mutex_.
  void prepare_read_locked(uint32_t t, std::vector<Finished>* failed) {
    Tag& tag = tags_[t];
    io_uring_sqe* sqe = ring_.next_sqe();
    if (sqe == nullptr) {
      finish_locked(t, EBUSY, failed);
      return;
    }
    sqe->fd = fd_;
    sqe->off = tag.chunk.file_offset + tag.done;
    sqe->len = tag.chunk.length - tag.done;
    sqe->user_data = t;
    uint8_t* dest = tag.chunk.dest + tag.done;
    if (registered_ && tag.chunk.fixed_buffer >= 0) {
      sqe->opcode = IORING_OP_READ_FIXED;
      sqe->addr = reinterpret_cast<uint64_t>(dest);
      sqe->buf_index = static_cast<uint16_t>(tag.chunk.fixed_buffer);
    } else {
      // READV rather than READ: READV exists since 5.1, READ only since 5.6.
      tag.iov.iov_base = dest;
      tag.iov.iov_len = sqe->len;
      sqe->opcode = IORING_OP_READV;
      sqe->addr = reinterpret_cast<uint64_t>(&tag.iov);
      sqe->len = 1;  // one iovec
    }
  }

  // Submits the prepared SQEs. Transient EAGAIN/EBUSY are retried inside
  // Ring::submit (bounded); if it still fails, the entries the kernel did
  // not take are taken back and their chunks fail with that errno, so no
  // read is left waiting for a completion that cannot come. False if it
  // failed. Holds mutex_.
  bool submit_locked(std::vector<Finished>* failed) {
    int inject = 0;
    if (inject_submit_errno_ != 0 && inject_submit_times_ != 0 && ring_.has_unsubmitted()) {
      inject = inject_submit_errno_;
      if (inject_submit_times_ > 0) --inject_submit_times_;
    }
    const int err = ring_.submit(inject);
    if (err == 0) return true;
    std::vector<uint64_t> untaken;
    ring_.retract_unsubmitted(&untaken);
    for (uint64_t t : untaken) {
      if ((t & kCancelBit) != 0) continue;  // not a read
      finish_locked(static_cast<uint32_t>(t), -err, failed);
      failed->back().result.not_submitted = true;
    }
    return false;
  }

  // Tag t's chunk is over (error: 0 or an errno); frees the tag. Holds mutex_.
  void finish_locked(uint32_t t, int error, std::vector<Finished>* finished) {
    finished->push_back({tags_[t].chunk, ChunkResult{tags_[t].done, error}});
    free_tags_.push_back(t);
  }

  // Handles one completion: the chunk is finished (added to *finished) or
  // re-issued for its remaining bytes. Holds mutex_.
  void complete_locked(const io_uring_cqe& cqe, std::vector<Finished>* finished) {
    if ((cqe.user_data & kCancelBit) != 0) return;  // a cancel's own result: nothing to do
    const auto t = static_cast<uint32_t>(cqe.user_data);
    if (t >= tags_.size()) return;  // not ours (cannot happen)
    Tag& tag = tags_[t];
    const int res = cqe.res;
    if (stopping_) {
      // Shutting down: issue nothing new (it would escape the cancels).
      // A cancelled read ends with -ECANCELED, or -EINTR if it was running.
      if (res < 0) {
        finish_locked(t, res == -EINTR || res == -EAGAIN ? ECANCELED : -res, finished);
      } else {
        tag.done += static_cast<uint32_t>(res);
        const bool would_go_on = tag.done < tag.chunk.length && res > 0 &&
                                 can_continue_short_read(direct_, tag.chunk.file_offset + tag.done);
        finish_locked(t, would_go_on ? ECANCELED : 0, finished);  // else: whole, or end of file
      }
      return;
    }
    if (res == -EAGAIN || res == -EINTR) {  // transient: issue the same read again, a few times
      if (++tag.retries <= kMaxTransientRetries) {
        prepare_read_locked(t, finished);
      } else {
        finish_locked(t, -res, finished);
      }
      return;
    }
    if (res < 0) {
      finish_locked(t, -res, finished);
      return;
    }
    tag.done += static_cast<uint32_t>(res);
    const bool short_read = tag.done < tag.chunk.length;
    if (short_read && res > 0 && can_continue_short_read(direct_, tag.chunk.file_offset + tag.done)) {
      prepare_read_locked(t, finished);  // read the rest (each round makes progress)
      return;
    }
    finish_locked(t, 0, finished);  // complete, or stopped at the end of the file
  }

  void reaper_loop() {
    std::vector<Finished> finished;
    for (;;) {
      {
        // Nothing in flight: sleep until enqueue() issues reads or shutdown().
        std::unique_lock<std::mutex> lock(mutex_);
        reads_cv_.wait(lock, [this] { return stopping_ || tags_in_use() > 0; });
        if (tags_in_use() == 0) {  // stopping, and every read is over
          reaper_done_ = true;
          state_cv_.notify_all();
          return;
        }
      }
      if (ring_.wait() != 0) {
        // Cannot happen with a valid ring (EINTR is retried); do not spin.
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      finished.clear();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        io_uring_cqe cqe;
        while (ring_.pop(&cqe)) complete_locked(cqe, &finished);
        issue_queued_locked(&finished);  // keep the device busy while we verify
        if (abandoned_ > 0) continue;    // shutdown gave up: nobody listens any more
        delivering_ = !finished.empty();
      }
      if (finished.empty()) continue;
      for (const Finished& f : finished) sink_.on_chunk_done(f.chunk, f.result);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        delivering_ = false;
      }
      state_cv_.notify_all();
    }
  }

  const int fd_;
  const bool direct_;
  ChunkSink& sink_;
  Ring ring_;
  bool registered_ = false;  // slot buffers registered: READ_FIXED
  std::thread reaper_;

  std::mutex mutex_;  // guards the SQ side of ring_ and the fields below
  std::condition_variable reads_cv_;  // reads were issued, or stopping_ was set
  std::vector<Tag> tags_;           // one per read that may be in flight
  std::vector<uint32_t> free_tags_;
  std::deque<ChunkRead> queued_;    // chunks waiting for a free tag
  bool stopping_ = false;
  // Shutdown.
  std::condition_variable state_cv_;  // reaper_done_ or delivering_ changed
  bool shut_down_ = false;    // shutdown() was called
  bool reaper_done_ = true;   // the reaper has exited (or never started)
  bool delivering_ = false;   // the reaper is reporting finished chunks to the sink
  size_t abandoned_ = 0;      // reads shutdown() gave up on: > 0 means *this is leaked
  // Fault injection (IoUringConfig::inject_submit_*).
  const int inject_submit_errno_;
  int64_t inject_submit_times_;
  const bool inject_no_cancel_;
};

// What make_io_uring_backend returns: owns the backend and deletes it,
// unless its shutdown abandoned reads -- then the backend, its ring and its
// detached reaper thread stay alive (leaked) for the kernel's sake.
class IoUringHandle final : public ReadBackend {
 public:
  explicit IoUringHandle(std::unique_ptr<IoUringBackend> backend) : backend_(backend.release()) {}
  ~IoUringHandle() override {
    if (backend_->shutdown(kDefaultShutdownTimeoutS) == 0) delete backend_;
  }
  const char* name() const override { return backend_->name(); }
  void enqueue(const std::vector<ChunkRead>& chunks) override { backend_->enqueue(chunks); }
  size_t shutdown(double timeout_s) override { return backend_->shutdown(timeout_s); }

 private:
  IoUringBackend* backend_;  // owned, see above
};

}  // namespace

std::unique_ptr<ReadBackend> make_io_uring_backend(const IoUringConfig& config,
                                                   ChunkSink& sink, std::string* error,
                                                   std::string* buffers_note) {
  auto backend = std::make_unique<IoUringBackend>(config, sink);
  if (!backend->init(config, error, buffers_note)) return nullptr;
  return std::make_unique<IoUringHandle>(std::move(backend));
}

}  // namespace io
}  // namespace lever

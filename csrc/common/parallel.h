// A small persistent thread pool and a process-wide parallel_for.
//
// Kernels split their work into independent items (e.g. quantisation blocks)
// and call lever::parallel_for(n_items, grain, fn); fn(begin, end) is then run
// on disjoint ranges that together cover [0, n_items), on the calling thread
// and the pool's worker threads. Nothing here knows about Python or torch.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace lever {

// fn(begin, end): process items [begin, end).
using RangeFn = std::function<void(size_t begin, size_t end)>;

// A fixed set of threads that run one parallel_for job at a time.
//
// A pool of N threads starts N - 1 workers: the thread that calls
// parallel_for always takes part in the job. Jobs are cut into chunks that
// threads take from a shared counter, so a thread that is slowed down (the
// machine is shared, a core is busy) simply takes fewer chunks, and the
// caller never waits for a worker that has not started one. Idle workers
// poll for about 50 microseconds before they sleep, so back-to-back jobs (one
// per matrix while decoding) do not pay a thread wake-up each.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads that work on a job, the caller included (>= 1).
  int num_threads() const { return num_threads_; }

  // Runs fn over [0, n_items) and returns when every item is done. Ranges
  // hold at least `grain` items (except the last one); if n_items <= grain
  // the whole range runs on the calling thread. If the pool is already busy
  // (another thread's job, or a parallel_for nested inside fn) the whole
  // range also runs on the calling thread, so nesting never deadlocks.
  // The first exception thrown by fn is rethrown here once all threads
  // have stopped.
  void parallel_for(size_t n_items, size_t grain, const RangeFn& fn);

 private:
  struct Job;
  void worker_loop();
  static void run_chunks(Job& job);

  const int num_threads_;
  std::vector<std::thread> workers_;

  std::atomic<bool> busy_{false};  // a job is running (set by its caller)

  std::mutex mutex_;  // guards job_ and stop_; generation_ changes under it
  std::condition_variable work_cv_;  // workers sleep here until a new job
  std::shared_ptr<Job> job_;  // the current job (workers take a reference)
  std::atomic<uint64_t> generation_{0};  // incremented for every job (and at stop)
  bool stop_ = false;
};

// Threads this process may run on: the CPU affinity mask where the OS has
// one (Linux), otherwise std::thread::hardware_concurrency(); at least 1.
int default_num_threads();

// The process-wide pool, used by all kernels. It is created on first use
// with default_num_threads() threads.
int get_num_threads();
// Replaces the process-wide pool with one of n threads; n <= 0 restores the
// default. Jobs already running finish on the old pool.
void set_num_threads(int n);

// parallel_for on the process-wide pool (see ThreadPool::parallel_for).
void parallel_for(size_t n_items, size_t grain, const RangeFn& fn);

}  // namespace lever

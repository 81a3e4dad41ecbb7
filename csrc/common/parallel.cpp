#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <utility>

#include <unistd.h>  // getpid
#if defined(__linux__)
#include <sched.h>  // sched_getaffinity, CPU_COUNT
#endif

namespace lever {

namespace {
// True while this thread runs fn for a job: a parallel_for called from inside
// fn then runs inline instead of waiting for a pool that is busy with the
// outer job.
thread_local bool t_inside_job = false;

struct InsideJob {
  bool saved = t_inside_job;
  InsideJob() { t_inside_job = true; }
  ~InsideJob() { t_inside_job = saved; }
};
}  // namespace

// One parallel_for call: the range, the chunk size and the next unclaimed item.
// Shared (shared_ptr) between the caller and the workers, so a worker that
// wakes up late may still look at it after the caller has returned.
struct ThreadPool::Job {
  const RangeFn* fn = nullptr;  // valid until the caller returns; only called on a claimed chunk
  size_t n_items = 0;
  size_t chunk = 1;  // items per fn call
  std::atomic<size_t> next{0};  // first item not yet claimed by a thread
  std::atomic<int> in_flight{0};  // threads between "about to claim" and "chunk done"

  std::mutex error_mutex;
  std::exception_ptr error;  // first exception thrown by fn
};

namespace {
// How long an idle worker keeps polling for the next job before it sleeps:
// decoding issues a job every few tens of microseconds, and waking a
// sleeping thread costs about as much.
constexpr auto kSpinTime = std::chrono::microseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  workers_.reserve(static_cast<size_t>(num_threads_ - 1));
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this] { worker_loop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

// Claims chunks of the job until none are left; used by the caller and workers.
// in_flight is raised before each claim and lowered after the chunk, so once
// `next` has passed the end, in_flight == 0 means no thread is inside fn.
void ThreadPool::run_chunks(Job& job) {
  InsideJob inside;
  for (;;) {
    job.in_flight.fetch_add(1);
    const size_t begin = job.next.fetch_add(job.chunk);
    if (begin >= job.n_items) {
      job.in_flight.fetch_sub(1);
      return;
    }
    const size_t end = std::min(job.n_items, begin + job.chunk);
    try {
      (*job.fn)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
      job.next.store(job.n_items);  // nobody starts another chunk
    }
    job.in_flight.fetch_sub(1);
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // Poll for a while, then sleep until the next job is announced.
    const auto spin_until = std::chrono::steady_clock::now() + kSpinTime;
    while (generation_.load(std::memory_order_acquire) == seen &&
           std::chrono::steady_clock::now() < spin_until) {
      for (int i = 0; i < 32; ++i) cpu_relax();
    }
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || generation_.load() != seen; });
      if (stop_) return;
      seen = generation_.load();
      job = job_;
    }
    if (job) run_chunks(*job);
  }
}

void ThreadPool::parallel_for(size_t n_items, size_t grain, const RangeFn& fn) {
  if (n_items == 0) return;
  grain = std::max<size_t>(grain, 1);
  // Small jobs, single-thread pools, nested calls and busy pools: run here.
  if (workers_.empty() || n_items <= grain || t_inside_job ||
      busy_.exchange(true, std::memory_order_acquire)) {
    fn(0, n_items);
    return;
  }

  // About four chunks per thread: few enough that the per-chunk overhead is
  // nil, enough that a thread slowed down by other load gets fewer of them.
  const size_t threads = static_cast<size_t>(num_threads_);
  const size_t even_share = (n_items + 4 * threads - 1) / (4 * threads);

  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n_items = n_items;
  job->chunk = std::max(grain, even_share);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = job;
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();

  run_chunks(*job);
  // Every chunk is claimed. Wait only for threads still running one; a worker
  // that has not woken up yet (its core busy with other work) is not waited
  // for: it will find nothing left to claim.
  while (job->in_flight.load() != 0) std::this_thread::yield();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (job_ == job) job_.reset();
  }
  busy_.store(false, std::memory_order_release);
  if (job->error) std::rethrow_exception(job->error);
}

int default_num_threads() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

namespace {

// The process-wide pool. It is allocated once and never destroyed, so that no
// static destructor joins threads while the interpreter shuts down.
struct GlobalPool {
  std::mutex mutex;
  std::shared_ptr<ThreadPool> pool;  // callers hold a reference while they use it
  pid_t owner_pid = 0;               // the process that started pool's threads
};

GlobalPool& global_pool_state() {
  static GlobalPool* state = new GlobalPool();
  return *state;
}

std::shared_ptr<ThreadPool> current_pool() {
  GlobalPool& g = global_pool_state();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.pool && g.owner_pid != getpid()) {
    // We are in a child created by fork(): the pool's worker threads were not
    // copied into it, and its locks may be in any state. Abandon the old pool
    // object (deliberately leaked; destroying it would join threads that do
    // not exist here) and start a new one below.
    new std::shared_ptr<ThreadPool>(std::move(g.pool));
    g.pool.reset();
  }
  if (!g.pool) {
    g.pool = std::make_shared<ThreadPool>(default_num_threads());
    g.owner_pid = getpid();
  }
  return g.pool;
}

}  // namespace

int get_num_threads() { return current_pool()->num_threads(); }

void set_num_threads(int n) {
  auto pool = std::make_shared<ThreadPool>(n > 0 ? n : default_num_threads());
  GlobalPool& g = global_pool_state();
  std::shared_ptr<ThreadPool> old;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    if (g.pool && g.owner_pid != getpid()) {
      // Forked child: abandon the parent's pool, as in current_pool().
      new std::shared_ptr<ThreadPool>(std::move(g.pool));
    }
    old = std::move(g.pool);
    g.pool = std::move(pool);
    g.owner_pid = getpid();
  }
  // `old` is released here, outside the lock: if no job holds it any more its
  // idle workers are joined now, otherwise when the last job using it ends.
}

void parallel_for(size_t n_items, size_t grain, const RangeFn& fn) {
  std::shared_ptr<ThreadPool> pool = current_pool();
  pool->parallel_for(n_items, grain, fn);
}

}  // namespace lever

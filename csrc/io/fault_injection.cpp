// Fault injection (see fault_injection.h): a ReadBackend that owns the real
// backend and sits between it and the FlashReader as its ChunkSink.

#include "io/fault_injection.h"

#include <errno.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace lever {
namespace io {
namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

[[noreturn]] void bad_item(const std::string& item, const std::string& why) {
  throw std::invalid_argument("LEVER_IO_FAULTS: bad item '" + item + "': " + why +
                              " (items: eio@OFFSET, short@OFFSET, delay_ms=N[@OFFSET], hang@OFFSET, "
                              "submit_err=ERRNO, no_io_uring, no_cancel; each but the last "
                              "two may end with *K to fire K times)");
}

// A whole decimal number; bad_item otherwise.
uint64_t parse_count(const std::string& text, const std::string& item) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
    bad_item(item, "'" + text + "' is not a decimal number");
  }
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE) bad_item(item, "'" + text + "' is too large");
  return v;
}

Fault parse_item(const std::string& item) {
  std::string rest = item;
  Fault f;
  const size_t star = rest.rfind('*');
  if (star != std::string::npos) {
    f.times = static_cast<int64_t>(parse_count(rest.substr(star + 1), item));
    rest = rest.substr(0, star);
  }
  auto after = [&rest](const std::string& prefix) { return rest.substr(prefix.size()); };
  if (rest.rfind("eio@", 0) == 0) {
    f.kind = FaultKind::kEio;
    f.offset = parse_count(after("eio@"), item);
  } else if (rest.rfind("short@", 0) == 0) {
    f.kind = FaultKind::kShort;
    f.offset = parse_count(after("short@"), item);
  } else if (rest.rfind("hang@", 0) == 0) {
    f.kind = FaultKind::kHang;
    f.offset = parse_count(after("hang@"), item);
  } else if (rest.rfind("delay_ms=", 0) == 0) {
    f.kind = FaultKind::kDelay;
    std::string ms = after("delay_ms=");
    const size_t at = ms.find('@');
    f.any_offset = at == std::string::npos;
    if (!f.any_offset) {
      f.offset = parse_count(ms.substr(at + 1), item);
      ms = ms.substr(0, at);
    }
    f.delay_s = 1e-3 * static_cast<double>(parse_count(ms, item));
  } else {
    bad_item(item, "unknown fault");
  }
  return f;
}

bool covers(const Fault& f, const ChunkRead& chunk) {
  return f.any_offset ||
         (f.offset >= chunk.file_offset && f.offset - chunk.file_offset < chunk.length);
}

// Wraps the real backend: its completions come to on_chunk_done() here,
// are changed by the plan, and go on to the FlashReader's sink -- at once,
// or, for a delayed read, from the `delayer_` thread when the delay is over
// (so one late read does not hold up the others, as on a real device).
class FaultInjectingBackend final : public ReadBackend, private ChunkSink {
 public:
  FaultInjectingBackend(const FaultPlan& plan, ChunkSink& downstream)
      : downstream_(downstream), faults_(plan.faults) {
    delayer_ = std::thread([this] { delayer_loop(); });
  }

  ~FaultInjectingBackend() override { shutdown(kDefaultShutdownTimeoutS); }

  bool attach(const std::function<std::unique_ptr<ReadBackend>(ChunkSink&)>& make_inner) {
    inner_ = make_inner(*this);
    return inner_ != nullptr;
  }

  const char* name() const override { return inner_->name(); }

  void enqueue(const std::vector<ChunkRead>& chunks) override { inner_->enqueue(chunks); }

  // Delayed completions are delivered at once from now on; returns when the
  // real backend has stopped and every delayed completion has been
  // delivered. Hung reads (hang@) are never delivered: they count as
  // abandoned, with those the real backend gave up on.
  size_t shutdown(double timeout_s) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (shut_down_) return abandoned_;
      hurry_ = true;
    }
    delay_cv_.notify_all();
    // No completion comes in after this.
    const size_t inner_abandoned = inner_ != nullptr ? inner_->shutdown(timeout_s) : 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    delay_cv_.notify_all();
    if (delayer_.joinable()) delayer_.join();
    std::lock_guard<std::mutex> lock(mutex_);
    shut_down_ = true;
    abandoned_ = inner_abandoned + hung_;
    return abandoned_;
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct Late {
    Clock::time_point due;
    ChunkRead chunk;
    ChunkResult result;
  };

  void on_chunk_issued(ChunkRead& chunk) override { downstream_.on_chunk_issued(chunk); }

  void on_chunk_cancelled(const ChunkRead& chunk) override {
    downstream_.on_chunk_cancelled(chunk);
  }

  void on_chunk_done(const ChunkRead& chunk, const ChunkResult& real) override {
    ChunkResult result = real;
    double delay_s = 0;
    bool hang = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (Fault& f : faults_) {
        if (f.times == 0 || !covers(f, chunk)) continue;
        if (f.times > 0) --f.times;
        switch (f.kind) {
          case FaultKind::kEio:
            result = ChunkResult{0, EIO};
            break;
          case FaultKind::kShort:
            if (result.error == 0) {
              result.bytes = std::min<uint32_t>(
                  result.bytes, static_cast<uint32_t>(f.offset - chunk.file_offset));
            }
            break;
          case FaultKind::kDelay:
            delay_s += f.delay_s;
            break;
          case FaultKind::kHang:
            hang = true;
            break;
        }
      }
      if (hang) {  // never delivered: the reader sees a read that never ends
        ++hung_;
        return;
      }
      if (delay_s > 0 && !hurry_) {
        const auto due = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(delay_s));
        late_.push_back(Late{due, chunk, result});
        delay_cv_.notify_all();
        return;
      }
    }
    downstream_.on_chunk_done(chunk, result);
  }

  // Delivers each late completion when it is due (all at once when hurried).
  void delayer_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (late_.empty()) {
        if (stop_) return;
        delay_cv_.wait(lock);
        continue;
      }
      auto next = std::min_element(late_.begin(), late_.end(),
                                   [](const Late& a, const Late& b) { return a.due < b.due; });
      if (!hurry_ && Clock::now() < next->due) {
        const Clock::time_point due = next->due;  // a copy: late_ may grow while we wait
        delay_cv_.wait_until(lock, due);
        continue;
      }
      const Late late = *next;
      late_.erase(next);
      lock.unlock();
      downstream_.on_chunk_done(late.chunk, late.result);
      lock.lock();
    }
  }

  ChunkSink& downstream_;
  std::mutex mutex_;  // guards the fields below
  std::condition_variable delay_cv_;
  std::vector<Fault> faults_;  // with their remaining counts
  std::vector<Late> late_;     // delayed completions not delivered yet
  bool hurry_ = false;         // shutting down: deliver late completions now
  bool stop_ = false;          // the real backend has stopped: the delayer may exit
  size_t hung_ = 0;            // completions held for ever (hang@)
  bool shut_down_ = false;     // shutdown() is over
  size_t abandoned_ = 0;       // what it returned
  std::thread delayer_;
  std::unique_ptr<ReadBackend> inner_;  // last: destroyed first, while *this still exists
};

}  // namespace

FaultPlan parse_fault_plan(const std::string& spec) {
  FaultPlan plan;
  plan.spec = spec;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = trim(spec.substr(start, comma - start));
    start = comma + 1;
    if (item.empty()) continue;
    if (item == "no_io_uring") {
      plan.no_io_uring = true;
    } else if (item == "no_cancel") {
      plan.no_cancel = true;
    } else if (item.rfind("submit_err=", 0) == 0) {
      std::string rest = item.substr(std::string("submit_err=").size());
      const size_t star = rest.rfind('*');
      if (star != std::string::npos) {
        plan.submit_err_times = static_cast<int64_t>(parse_count(rest.substr(star + 1), item));
        rest = rest.substr(0, star);
      }
      const uint64_t err = parse_count(rest, item);
      if (err == 0 || err > 4095) bad_item(item, "ERRNO must be an errno number in [1, 4095]");
      plan.submit_errno = static_cast<int>(err);
    } else {
      plan.faults.push_back(parse_item(item));
    }
  }
  return plan;
}

FaultPlan fault_plan_from(const std::string& spec) {
  if (!spec.empty()) return parse_fault_plan(spec);
  const char* env = std::getenv("LEVER_IO_FAULTS");
  return parse_fault_plan(env != nullptr ? env : "");
}

std::unique_ptr<ReadBackend> make_fault_injecting_backend(
    const FaultPlan& plan, ChunkSink& sink,
    const std::function<std::unique_ptr<ReadBackend>(ChunkSink& report_to)>& make_inner) {
  if (!plan.affects_reads()) return make_inner(sink);
  auto backend = std::make_unique<FaultInjectingBackend>(plan, sink);
  if (!backend->attach(make_inner)) return nullptr;
  return backend;
}

}  // namespace io
}  // namespace lever

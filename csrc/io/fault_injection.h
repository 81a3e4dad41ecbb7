// Fault injection for tests: make chosen reads fail, stop short or take
// longer, deterministically, with either backend (io_uring or pread).
//
// A plan is written as comma-separated items (ReaderOptions::faults, or the
// environment variable LEVER_IO_FAULTS when that is empty):
//
//   eio@OFFSET        the chunk read covering file byte OFFSET fails with EIO
//   short@OFFSET      the chunk read covering OFFSET ends short: it returns
//                     only the bytes before OFFSET
//   delay_ms=N        every read finishes N milliseconds late (a slow device)
//   delay_ms=N@OFFSET only the chunk read covering OFFSET is late
//   hang@OFFSET       the chunk read covering OFFSET never finishes: its
//                     completion is held and never delivered, not even when
//                     the reader is closed (a hung device whose read cannot
//                     be cancelled): wait() times out, and close() counts it
//                     as abandoned (ReaderStats::abandoned_reads) instead of
//                     waiting for it
//   submit_err=ERRNO  io_uring only: submitting reads to the kernel
//                     (io_uring_enter) fails with errno ERRNO (decimal, e.g.
//                     12 for ENOMEM); the reads not taken fail with it
//   no_cancel         io_uring only: close() does not cancel the reads in
//                     flight (as if the kernel could not): a read that never
//                     completes is then abandoned at close()'s deadline
//   no_io_uring       io_uring_setup fails as if the kernel had no io_uring
//                     (ENOSYS): "auto" falls back to pread and says so
//
// OFFSET is in bytes (decimal). An item may end with *K (e.g. eio@4096*1):
// it then fires for the first K matching reads only, so a test can check
// that the read after a failure works. Without *K it fires every time.
//
// The faults are applied where a backend reports a finished read to the
// FlashReader: the real read happens, then its result is replaced (EIO,
// short) or delayed. So every error path of the reader above the backend
// runs exactly as with a real device error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/read_backend.h"

namespace lever {
namespace io {

enum class FaultKind { kEio, kShort, kDelay, kHang };

struct Fault {
  FaultKind kind = FaultKind::kEio;
  bool any_offset = false;  // delay_ms=N without @: every read
  uint64_t offset = 0;      // file byte the fault is attached to
  int64_t times = -1;       // reads it fires for; -1: every matching read
  double delay_s = 0;       // kDelay: seconds added to the read
};

struct FaultPlan {
  std::vector<Fault> faults;
  bool no_io_uring = false;  // pretend io_uring_setup fails with ENOSYS
  int submit_errno = 0;       // submit_err=ERRNO: io_uring submits fail with it (0: no)
  int64_t submit_err_times = -1;  // how many submits fail; -1: all
  bool no_cancel = false;     // io_uring shutdown sends no cancels
  std::string spec;          // the text it was parsed from (for messages)

  // True if some read's result is affected (no_io_uring and submit_err,
  // which the io_uring backend applies itself, need no wrapper).
  bool affects_reads() const { return !faults.empty(); }
};

// Parses a plan (grammar above); "" gives an empty plan. Throws
// std::invalid_argument naming the bad item.
FaultPlan parse_fault_plan(const std::string& spec);

// The plan from `spec`, or from LEVER_IO_FAULTS when spec is empty.
FaultPlan fault_plan_from(const std::string& spec);

// Builds a backend with make_inner(report_to) and puts the plan's faults
// between it and `sink`: make_inner must make its backend report to
// `report_to`. Returns nullptr when make_inner does. With a plan that
// affects no read this is make_inner(sink) itself.
std::unique_ptr<ReadBackend> make_fault_injecting_backend(
    const FaultPlan& plan, ChunkSink& sink,
    const std::function<std::unique_ptr<ReadBackend>(ChunkSink& report_to)>& make_inner);

}  // namespace io
}  // namespace lever

// lever-kbench: a standalone benchmark of Lever's native kernels and flash
// reader, with no Python (built with -DLEVER_BUILD_KBENCH=ON; with
// -DLEVER_STATIC_KBENCH=ON it links statically and runs from `adb shell`).
//
//   lever-kbench [--quick] [--isa NAME] [--threads N] [--dir PATH] [--json PATH] [--emulated]
//
//   --quick     small sizes and short timings (a smoke run; tiny under emulation)
//   --isa       kernel instruction set for quant_matmul (default: the best one)
//   --threads   threads of the library's pool (default: all the process may use)
//   --dir       where the temporary flash file goes (default: $TMPDIR, else
//               /data/local/tmp on Android, else /tmp); it is deleted at the end
//   --json      also write the results as JSON to this path
//   --emulated  label the figures as emulated (also detected, see below)
//
// It first measures its own reference bandwidths:
//   DRAM  a read-and-sum over a buffer much larger than the caches, on all
//         threads (what a matmul streaming its weights can get at most), and a
//         single-thread memcpy (reported only);
//   flash a big sequential O_DIRECT read of a temporary file it writes in --dir.
// and the CPU's int8 dot-product peak: a tight loop of the multiply-add
// instruction the quantised kernels are built on (AVX2 vpmaddubsw + vpaddw,
// AVX-512 VNNI vpdpbusd, aarch64 sdot), with independent accumulators, on
// all threads; every matmul line then also gives its fraction of that peak.
// Then, through the library's public functions:
//   qmatmul    quant_matmul (kernels/qmatmul.h) for Q4_K, Q6_K, Q8_0, Q5_0,
//              Q4_0, Q4_1 and each of them repacked (*_R8, kernels/repack.h)
//              and M = 1, 4, 8, 16, 32, 64, 256 on layer-sized matrices
//              (1536 x 1536 and 8960 x 1536, N x K);
//   attention  attention (kernels/attention.h) over a few context lengths;
//   dequant    dequantize_to_f32 (kernels/dequant.h) of a layer-sized matrix;
//   flash      FlashReader (io/flash_reader.h): sequential and layer-sized
//              extent reads with io_uring, the pread pool, with O_DIRECT,
//              reporting the backend actually used and any fallback reason.
// For each it prints GB/s (weight or KV bytes read / time), GFLOP/s and the
// fraction of the measured DRAM (or flash) bandwidth, and writes all of it as
// JSON (--json).
//
// Under emulation (qemu-user: --emulated, the environment variables
// LEVER_EMULATED or QEMU_CPU, or an x86 /proc/cpuinfo seen from an aarch64
// binary) the figures say nothing about performance; the output and the JSON
// are labelled so ("emulated": true).
//
// Units: bytes, seconds; GB = 1e9 bytes; GFLOP = 1e9 multiply-or-add; the
// int8 peak in GOP/s likewise counts a multiply-add as 2 operations.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/parallel.h"
#include "io/flash_reader.h"
#include "kernels/attention.h"
#include "kernels/dequant.h"
#include "kernels/qdot.h"
#include "kernels/qmatmul.h"
#include "kernels/repack.h"
#include "kernels/x86_simd.h"
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// Options and environment.

// $TMPDIR, else /data/local/tmp on Android (adb shell can write there), else /tmp.
std::string default_temp_dir() {
  if (const char* t = std::getenv("TMPDIR"); t && *t) return t;
#if defined(__ANDROID__)
  return "/data/local/tmp";
#else
  return "/tmp";
#endif
}

struct Options {
  bool quick = false;
  bool emulated_flag = false;
  std::string isa = "auto";
  int threads = 0;  // 0: the library's default
  std::string dir = default_temp_dir();
  std::string json_path;
};

void usage() {
  std::printf(
      "usage: lever-kbench [--quick] [--isa auto|scalar|avx2|avx512|neon|dotprod|i8mm]\n"
      "                    [--threads N] [--dir PATH] [--json PATH] [--emulated]\n");
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--quick") o.quick = true;
    else if (a == "--emulated") o.emulated_flag = true;
    else if (a == "--isa") o.isa = value();
    else if (a == "--threads") o.threads = std::stoi(value());
    else if (a == "--dir") o.dir = value();
    else if (a == "--json") o.json_path = value();
    else if (a == "--help" || a == "-h") { usage(); std::exit(0); }
    else throw std::invalid_argument("unknown argument " + a);
  }
  return o;
}

const char* build_arch() {
#if defined(__aarch64__)
  return "aarch64";
#elif defined(__x86_64__)
  return "x86_64";
#else
  return "other";
#endif
}

// Why we think the figures are emulated ("" if not).
std::string emulation_reason(const Options& o) {
  if (o.emulated_flag) return "--emulated";
  if (const char* e = std::getenv("LEVER_EMULATED"); e && *e) return std::string("LEVER_EMULATED=") + e;
  if (const char* e = std::getenv("QEMU_CPU"); e && *e) return std::string("QEMU_CPU=") + e;
#if defined(__aarch64__)
  // qemu-user passes the host's /proc/cpuinfo through.
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.find("GenuineIntel") != std::string::npos || line.find("AuthenticAMD") != std::string::npos)
      return "x86 /proc/cpuinfo seen from an aarch64 binary";
  }
#endif
  return "";
}

// ---------------------------------------------------------------------------
// Timing and JSON.

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median seconds of one call of fn: one warm-up call, then calls until
// min_total seconds have passed and at least min_calls were made.
double time_call(const std::function<void()>& fn, double min_total, int min_calls) {
  fn();
  std::vector<double> times;
  const auto start = Clock::now();
  while (static_cast<int>(times.size()) < min_calls || seconds_since(start) < min_total) {
    const auto t0 = Clock::now();
    fn();
    times.push_back(seconds_since(t0));
    if (times.size() >= 1000) break;
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') { out += '\\'; out += c; }
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else out += c;
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  if (v == std::floor(v) && std::fabs(v) < 9e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.6g", v);  // timings and rates: 6 digits
  return buf;
}

// One JSON object built field by field.
class JsonObject {
 public:
  JsonObject& add(const std::string& k, const std::string& v) { return raw(k, json_string(v)); }
  JsonObject& add(const std::string& k, const char* v) { return raw(k, json_string(v)); }
  JsonObject& add(const std::string& k, double v) { return raw(k, json_number(v)); }
  JsonObject& add(const std::string& k, int v) { return raw(k, std::to_string(v)); }
  JsonObject& add(const std::string& k, size_t v) { return raw(k, std::to_string(v)); }
  JsonObject& add(const std::string& k, bool v) { return raw(k, v ? "true" : "false"); }
  JsonObject& raw(const std::string& k, const std::string& json) {
    fields_ += (fields_.empty() ? "" : ", ") + json_string(k) + ": " + json;
    return *this;
  }
  std::string str() const { return "{" + fields_ + "}"; }

 private:
  std::string fields_;
};

std::string json_array(const std::vector<std::string>& items, const char* indent) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ",\n" : "\n") + std::string(indent) + items[i];
  return out + (items.empty() ? "]" : "\n  ]");
}

// ---------------------------------------------------------------------------
// Reference bandwidths.

struct References {
  double int8_peak_gops = 0;    // all threads, multiply-adds x 2 per second (0: not measured)
  std::string int8_instruction; // what the peak loop runs
  double dram_read_gbps = 0;    // all threads, read and sum
  double dram_memcpy_gbps = 0;  // one thread, memcpy (bytes copied / time)
  double flash_read_gbps = 0;   // sequential O_DIRECT pread (page cache if no O_DIRECT)
  bool flash_direct = false;
  std::string flash_note;
};

// Sums the buffer as uint64 words on all threads (the sum is returned so the
// loop is not optimised away).
uint64_t parallel_read_sum(const uint64_t* p, size_t n_words) {
  const size_t grain = 1 << 16;
  const size_t n_chunks = (n_words + grain - 1) / grain;
  std::vector<uint64_t> partial(n_chunks, 0);
  lever::parallel_for(n_chunks, 1, [&](size_t b, size_t e) {
    for (size_t c = b; c < e; ++c) {
      const size_t lo = c * grain, hi = std::min(n_words, lo + grain);
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      size_t i = lo;
      for (; i + 4 <= hi; i += 4) { s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3]; }
      for (; i < hi; ++i) s0 += p[i];
      partial[c] = s0 + s1 + s2 + s3;
    }
  });
  uint64_t s = 0;
  for (uint64_t v : partial) s += v;
  return s;
}

// -- int8 peak -----------------------------------------------------------------
// Each loop runs `iters` rounds of 8 independent multiply-add chains and
// returns the int8 multiply-adds done (the folded result keeps the loop alive).
constexpr int kPeakChains = 8;

#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t peak_loop_avx2(size_t iters, int* sink) {
  __m256i acc[kPeakChains];
  for (int i = 0; i < kPeakChains; ++i) acc[i] = _mm256_set1_epi16(static_cast<short>(i));
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-1);
  for (size_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kPeakChains; ++i) {
      acc[i] = _mm256_add_epi16(acc[i], _mm256_maddubs_epi16(a, b));
      __asm__ volatile("" : "+x"(acc[i]));  // one instruction pair per chain and round
    }
  }
  __m256i t = acc[0];
  for (int i = 1; i < kPeakChains; ++i) t = _mm256_add_epi16(t, acc[i]);
  *sink += _mm256_extract_epi16(t, 0);
  return static_cast<uint64_t>(iters) * kPeakChains * 32;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) uint64_t peak_loop_avx512(size_t iters,
                                                                                 int* sink) {
  __m512i acc[kPeakChains];
  for (int i = 0; i < kPeakChains; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-1);
  for (size_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kPeakChains; ++i) {
      acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
      __asm__ volatile("" : "+v"(acc[i]));
    }
  }
  __m512i t = acc[0];
  for (int i = 1; i < kPeakChains; ++i) t = _mm512_add_epi32(t, acc[i]);
  *sink += _mm512_reduce_add_epi32(t);
  return static_cast<uint64_t>(iters) * kPeakChains * 64;
}
#endif

#if defined(__aarch64__)
__attribute__((target("arch=armv8.2-a+dotprod"))) uint64_t peak_loop_sdot(size_t iters, int* sink) {
  int32x4_t acc[kPeakChains];
  for (int i = 0; i < kPeakChains; ++i) acc[i] = vdupq_n_s32(i);
  const int8x16_t a = vdupq_n_s8(3), b = vdupq_n_s8(-1);
  for (size_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kPeakChains; ++i) {
      acc[i] = vdotq_s32(acc[i], a, b);
      __asm__ volatile("" : "+w"(acc[i]));
    }
  }
  int32x4_t t = acc[0];
  for (int i = 1; i < kPeakChains; ++i) t = vaddq_s32(t, acc[i]);
  *sink += vaddvq_s32(t);
  return static_cast<uint64_t>(iters) * kPeakChains * 16;
}
#endif

// The peak loop for the kernels' instruction set, or nullptr (none here).
using PeakLoop = uint64_t (*)(size_t, int*);
PeakLoop peak_loop(lever::Isa isa, std::string* instruction) {
#if defined(__x86_64__)
  if (isa == lever::Isa::kAvx512) { *instruction = "vpdpbusd zmm"; return peak_loop_avx512; }
  if (isa == lever::Isa::kAvx2) { *instruction = "vpmaddubsw+vpaddw ymm"; return peak_loop_avx2; }
#endif
#if defined(__aarch64__)
  if (isa == lever::Isa::kDotprod || isa == lever::Isa::kI8mm) {
    *instruction = "sdot v.4s";
    return peak_loop_sdot;
  }
#endif
  (void)isa;
  *instruction = "none (no int8 dot-product loop for this instruction set)";
  return nullptr;
}

void measure_int8_peak(References& ref, lever::Isa isa, double min_time) {
  const PeakLoop loop = peak_loop(isa, &ref.int8_instruction);
  if (loop == nullptr) return;
  const int threads = lever::get_num_threads();
  const size_t iters = 1u << 20;
  std::vector<int> sinks(threads, 0);
  std::vector<uint64_t> macs(threads, 0);
  const double s = time_call([&] {
    lever::parallel_for(threads, 1, [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) macs[t] = loop(iters, &sinks[t]);
    });
  }, min_time, 3);
  uint64_t total = 0;
  for (uint64_t m : macs) total += m;
  ref.int8_peak_gops = 2.0 * static_cast<double>(total) / s / 1e9;
}

void measure_dram(References& ref, size_t bytes, double min_time) {
  std::vector<uint64_t> buf(bytes / 8);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = i * 2654435761u;
  volatile uint64_t sink = 0;
  const double t_read = time_call([&] { sink = sink + parallel_read_sum(buf.data(), buf.size()); },
                                  min_time, 3);
  ref.dram_read_gbps = bytes / t_read / 1e9;
  std::vector<uint64_t> dst(buf.size());
  const double t_copy = time_call([&] { std::memcpy(dst.data(), buf.data(), bytes); }, min_time, 3);
  ref.dram_memcpy_gbps = bytes / t_copy / 1e9;
}

// A 4096-aligned buffer.
struct AlignedBytes {
  explicit AlignedBytes(size_t n) : size(n) {
    if (posix_memalign(reinterpret_cast<void**>(&data), 4096, n) != 0) throw std::bad_alloc();
    std::memset(data, 0, n);
  }
  ~AlignedBytes() { std::free(data); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  uint8_t* data = nullptr;
  size_t size;
};

// Writes `bytes` of pseudo-random data to path and drops it from the page cache.
void write_temp_file(const std::string& path, size_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
  AlignedBytes chunk(1 << 20);
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < chunk.size; i += 8) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    std::memcpy(chunk.data + i, &x, 8);
  }
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(chunk.size, bytes - done);
    if (::write(fd, chunk.data, n) != static_cast<ssize_t>(n)) {
      ::close(fd);
      throw std::runtime_error("short write to " + path);
    }
    done += n;
  }
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Sequential O_DIRECT pread of the whole file in 8 MiB reads, one thread.
void measure_flash(References& ref, const std::string& path, size_t bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  ref.flash_direct = fd >= 0;
  if (fd < 0) {
    ref.flash_note = std::string("O_DIRECT refused (") + std::strerror(errno) + "): page cache read";
    fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error("cannot open " + path);
  }
  AlignedBytes buf(8 << 20);
  const auto t0 = Clock::now();
  for (size_t off = 0; off < bytes; off += buf.size) {
    const size_t n = std::min(buf.size, bytes - off);
    if (::pread(fd, buf.data, n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      ::close(fd);
      throw std::runtime_error("short read of " + path);
    }
  }
  ref.flash_read_gbps = bytes / seconds_since(t0) / 1e9;
  ::close(fd);
}

// ---------------------------------------------------------------------------
// Kernel benchmarks.

struct Context {
  Options opt;
  bool emulated = false;
  lever::Isa isa = lever::Isa::kAuto;
  References ref;
  double min_time = 0.3;  // seconds of timed calls per measurement
  std::vector<std::string> qmatmul_rows, attention_rows, dequant_rows, flash_rows;
};

const int kMatmulTypes[] = {lever::kTypeQ4_K, lever::kTypeQ6_K, lever::kTypeQ8_0,
                            lever::kTypeQ5_0, lever::kTypeQ4_0, lever::kTypeQ4_1};
// Measured in their repacked form too (kernels/repack.h).
const int kRepackableTypes[] = {lever::kTypeQ4_K, lever::kTypeQ6_K, lever::kTypeQ8_0,
                                lever::kTypeQ5_0, lever::kTypeQ4_0, lever::kTypeQ4_1};
const size_t kMatmulRows[] = {1, 4, 8, 16, 32, 64, 256};

// Byte offsets of the fp16 scale fields in one block of `type`.
std::vector<size_t> half_fields(int type) {
  switch (type) {
    case lever::kTypeQ4_K: case lever::kTypeQ4_1: return {0, 2};
    case lever::kTypeQ6_K: return {208};
    default: return {0};  // Q8_0, Q5_0, Q4_0
  }
}

// n_blocks random blocks of `type` with finite, modest fp16 scales.
std::vector<uint8_t> random_weights(int type, size_t n_blocks, uint64_t seed) {
  const size_t ts = lever::type_size(type);
  std::vector<uint8_t> w(n_blocks * ts);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < w.size(); ++i) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    w[i] = static_cast<uint8_t>(x >> 56);
  }
  const std::vector<size_t> fields = half_fields(type);
  for (size_t b = 0; b < n_blocks; ++b) {
    for (size_t f : fields) {
      const uint16_t h = static_cast<uint16_t>(0x2000 + (b * 7 + f) % 0x400);  // ~[2^-7, 2^-6)
      std::memcpy(&w[b * ts + f], &h, 2);
    }
  }
  return w;
}

// One result line: time, GB/s, a second rate (`rate_unit` per second, e.g.
// GFLOP; none if rate_unit is "") and the fraction of the reference `of`.
void print_row(const char* kind, const std::string& what, double s, double gbps, double rate,
               const char* rate_unit, double fraction, const char* of,
               const std::string& extra = "") {
  char rate_text[32] = "";
  if (*rate_unit) std::snprintf(rate_text, sizeof rate_text, "%8.2f %s/s", rate, rate_unit);
  std::printf("%-9s %-34s %10.3f ms %8.2f GB/s %-15s %6.1f%% of %s%s\n", kind, what.c_str(),
              s * 1e3, gbps, rate_text, 100 * fraction, of, extra.c_str());
  std::fflush(stdout);
}

// Weights are cold, as in a decoder that streams a different layer's matrix
// each time: successive calls cycle through copies of the matrix that
// together exceed `cold_bytes` (larger than the last-level cache).
void bench_qmatmul_type(Context& c, int type, bool repacked, size_t N, size_t K,
                        size_t cold_bytes) {
  const size_t n_blocks = N * K / lever::block_size(type);
  const size_t w_bytes = n_blocks * lever::type_size(type);
  const size_t n_copies = std::max<size_t>(1, (cold_bytes + w_bytes - 1) / w_bytes);
  std::vector<std::vector<uint8_t>> copies;
  for (size_t i = 0; i < n_copies; ++i) {
    copies.push_back(random_weights(type, n_blocks, static_cast<uint64_t>(type) + 100 * i));
    if (repacked) lever::repack_rows(type, copies.back().data(), N, K);
  }
  if (repacked) type = lever::repacked_type(type);
  for (size_t M : kMatmulRows) {
    std::vector<float> x(M * K), y(M * N);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
    size_t call = 0;
    const double s = time_call([&] {
      const uint8_t* w = copies[call++ % n_copies].data();
      lever::quant_matmul(x.data(), lever::ElemType::kF32, M, K, K, w, type, N, y.data(),
                          lever::ElemType::kF32, N, c.isa);
    }, c.min_time, c.opt.quick ? 1 : 3);
    const double gbps = w_bytes / s / 1e9, gflops = 2.0 * M * N * K / s / 1e9;
    const double frac = gbps / c.ref.dram_read_gbps;
    const double peak_frac = c.ref.int8_peak_gops > 0 ? gflops / c.ref.int8_peak_gops : 0;
    const std::string what = std::string(lever::type_name(type)) + " " + std::to_string(N) +
                             "x" + std::to_string(K) + " M=" + std::to_string(M);
    char peak_text[40] = "";
    if (c.ref.int8_peak_gops > 0)
      std::snprintf(peak_text, sizeof peak_text, "  %5.1f%% of int8 peak", 100 * peak_frac);
    print_row("qmatmul", what, s, gbps, gflops, "GFLOP", frac, "DRAM", peak_text);
    c.qmatmul_rows.push_back(JsonObject()
                                 .add("type", lever::type_name(type)).add("M", M).add("N", N)
                                 .add("K", K).add("weight_bytes", w_bytes)
                                 .add("weight_copies", n_copies).add("seconds", s)
                                 .add("gbps", gbps).add("gflops", gflops)
                                 .add("dram_fraction", frac)
                                 .add("int8_peak_fraction", peak_frac).str());
  }
}

void bench_qmatmul(Context& c, size_t N, size_t K, size_t cold_bytes) {
  for (int type : kMatmulTypes) bench_qmatmul_type(c, type, false, N, K, cold_bytes);
  for (int type : kRepackableTypes) bench_qmatmul_type(c, type, true, N, K, cold_bytes);
}

// Decoding-style attention: T query rows over L cached keys (all visible),
// Qwen2-1.5B heads: 12 query heads, 2 kv heads of 128.
void bench_attention(Context& c, size_t L, size_t T, lever::ElemType kv_type) {
  const size_t H = 12, G = 2, d = 128;
  const size_t kv_elem = kv_type == lever::ElemType::kF32 ? 4 : 2;
  std::vector<float> q(H * T * d, 0.01f), out(T * H * d);
  std::vector<uint8_t> kv_bytes(2 * G * L * d * kv_elem);
  for (size_t i = 0; i < kv_bytes.size(); ++i) kv_bytes[i] = static_cast<uint8_t>(i * 37 % 61);
  const uint8_t* k = kv_bytes.data();
  const uint8_t* v = kv_bytes.data() + G * L * d * kv_elem;
  std::vector<uint8_t> mask(T * L, 1);
  const double s = time_call([&] {
    lever::attention({H, G, T, L, d}, q.data(), lever::ElemType::kF32, T * d, d, k, v, kv_type,
                     L * d, d, mask.data(), 0.088f, out.data(), lever::ElemType::kF32, H * d);
  }, c.min_time, c.opt.quick ? 1 : 3);
  const double bytes = static_cast<double>(kv_bytes.size());
  const double gbps = bytes / s / 1e9, gflops = 4.0 * T * H * L * d / s / 1e9;
  const double frac = gbps / c.ref.dram_read_gbps;
  const char* kv_name = kv_type == lever::ElemType::kF32 ? "f32" : "bf16";
  print_row("attention", "L=" + std::to_string(L) + " T=" + std::to_string(T) + " kv=" + kv_name,
            s, gbps, gflops, "GFLOP", frac, "DRAM");
  c.attention_rows.push_back(JsonObject()
                                 .add("L", L).add("T", T).add("n_heads", H).add("n_kv_heads", G)
                                 .add("head_dim", d).add("kv_type", kv_name)
                                 .add("kv_bytes", kv_bytes.size()).add("seconds", s)
                                 .add("gbps", gbps).add("gflops", gflops)
                                 .add("dram_fraction", frac).str());
}

// Dequantises N x K values of `type` to fp32. gbps counts the weight bytes
// read; dram_fraction counts bytes read + written.
void bench_dequant(Context& c, int type, size_t n_elements) {
  const size_t n_blocks = n_elements / lever::block_size(type);
  std::vector<uint8_t> w = type == lever::kTypeF16 || type == lever::kTypeBF16
                               ? std::vector<uint8_t>(n_blocks * 2, 0x3C)
                               : random_weights(type, n_blocks, 77);
  std::vector<float> y(n_elements);
  const double s = time_call([&] {
    lever::dequantize_to_f32(w.data(), w.size(), type, y.data(), y.size());
  }, c.min_time, c.opt.quick ? 1 : 3);
  const double gbps = w.size() / s / 1e9;
  const double frac = (w.size() + 4.0 * n_elements) / s / 1e9 / c.ref.dram_read_gbps;
  print_row("dequant", std::string(lever::type_name(type)) + " -> f32, " +
                           std::to_string(n_elements) + " values",
            s, gbps, n_elements / s / 1e9, "Gval", frac, "DRAM (in+out)");
  c.dequant_rows.push_back(JsonObject()
                               .add("type", lever::type_name(type)).add("elements", n_elements)
                               .add("weight_bytes", w.size()).add("seconds", s).add("gbps", gbps)
                               .add("gelements_per_s", n_elements / s / 1e9)
                               .add("dram_fraction", frac).str());
}

// Reads the file through FlashReader: "sequential" = the whole file as
// slot-sized extents one after another (read()); "extents" = layer-sized
// extents through a ring of 2 slots (submit ahead, wait).
void bench_flash(Context& c, const std::string& path, size_t file_bytes, const std::string& backend,
                 const std::string& mode, size_t extent_bytes) {
  lever::io::ReaderOptions ro;
  ro.backend = backend;
  ro.direct = true;
  JsonObject row;
  row.add("mode", mode).add("backend_requested", backend).add("extent_bytes", extent_bytes);
  try {
    lever::io::FlashReader reader(path, extent_bytes, 2, ro);
    const size_t n_extents = file_bytes / extent_bytes;
    AlignedBytes out(extent_bytes);
    const auto t0 = Clock::now();
    if (mode == "sequential") {
      for (size_t e = 0; e < n_extents; ++e)
        reader.read(e * extent_bytes, extent_bytes, out.data, {}, "extent " + std::to_string(e));
    } else {
      reader.submit(0, 0, extent_bytes, {}, "extent 0");
      for (size_t e = 0; e < n_extents; ++e) {
        if (e + 1 < n_extents)
          reader.submit((e + 1) % 2, (e + 1) * extent_bytes, extent_bytes, {},
                        "extent " + std::to_string(e + 1));
        reader.wait(e % 2);
      }
    }
    const double s = seconds_since(t0);
    const lever::io::ReaderStats st = reader.stats();
    const size_t bytes = n_extents * extent_bytes;
    const double gbps = static_cast<double>(bytes) / s / 1e9, frac = gbps / c.ref.flash_read_gbps;
    const std::string fallback = st.fallback_reason();
    print_row("flash", mode + " " + backend + "->" + st.backend + (st.direct ? " direct" : " cached"),
              s, gbps, 0, "", frac, "flash");
    if (!fallback.empty()) std::printf("          fallback: %s\n", fallback.c_str());
    row.add("backend", st.backend).add("direct", st.direct).add("fallback_reason", fallback)
        .add("bytes", bytes).add("seconds", s).add("gbps", gbps).add("flash_fraction", frac)
        .add("queue_depth", st.queue_depth).add("chunk_bytes", static_cast<size_t>(st.chunk_bytes));
  } catch (const std::exception& e) {
    std::printf("flash     %s %s: unavailable: %s\n", mode.c_str(), backend.c_str(), e.what());
    row.add("backend", "").add("error", e.what());
  }
  c.flash_rows.push_back(row.str());
}

// ---------------------------------------------------------------------------
// Sizes and the run.

struct Sizes {
  std::vector<std::pair<size_t, size_t>> matrices;  // (N, K)
  std::vector<size_t> contexts;
  size_t dequant_elements, dram_bytes, flash_bytes, extent_bytes;
  size_t cold_bytes;  // the matmul cycles through this many bytes of weight copies
};

Sizes choose_sizes(const Context& c) {
  if (c.opt.quick && c.emulated)  // qemu: a few seconds in all
    return {{{256, 512}}, {256}, 256 * 512, 16u << 20, 8u << 20, 1u << 20, 0};
  if (c.opt.quick)
    return {{{1536, 1536}}, {512, 4096}, 8960 * 1536, 256u << 20, 64u << 20, 8u << 20, 64u << 20};
  return {{{1536, 1536}, {8960, 1536}}, {512, 2048, 8192, 32768}, 8960 * 1536, 1u << 30,
          1u << 30, 8u << 20, 256u << 20};
}

std::string to_json(const Context& c, const Sizes& sz, const std::string& emu_reason) {
  JsonObject ref;
  ref.add("int8_peak_gops", c.ref.int8_peak_gops).add("int8_instruction", c.ref.int8_instruction)
      .add("dram_read_gbps", c.ref.dram_read_gbps).add("dram_memcpy_gbps", c.ref.dram_memcpy_gbps)
      .add("dram_bytes", sz.dram_bytes).add("flash_read_gbps", c.ref.flash_read_gbps)
      .add("flash_direct", c.ref.flash_direct).add("flash_note", c.ref.flash_note)
      .add("flash_bytes", sz.flash_bytes);
  JsonObject top;
  top.add("tool", "lever-kbench").add("schema", 1).add("arch", build_arch())
      .add("isa", lever::isa_name(c.isa == lever::Isa::kAuto ? lever::default_isa() : c.isa))
      .add("best_isa", lever::isa_name(lever::best_isa())).add("threads", lever::get_num_threads())
      .add("quick", c.opt.quick).add("emulated", c.emulated).add("emulation_reason", emu_reason)
      .add("note", c.emulated ? "EMULATED: timings are not performance figures" : "")
      .raw("reference", ref.str())
      .raw("qmatmul", json_array(c.qmatmul_rows, "    "))
      .raw("attention", json_array(c.attention_rows, "    "))
      .raw("dequant", json_array(c.dequant_rows, "    "))
      .raw("flash", json_array(c.flash_rows, "    "));
  return top.str() + "\n";
}

int run(const Options& opt) {
  Context c;
  c.opt = opt;
  const std::string emu = emulation_reason(opt);
  c.emulated = !emu.empty();
  if (opt.threads > 0) lever::set_num_threads(opt.threads);
  if (opt.isa != "auto") {
    c.isa = lever::isa_from_name(opt.isa);
    lever::set_default_isa(c.isa);  // throws if unavailable
  }
  c.min_time = opt.quick ? 0.02 : 0.3;
  const Sizes sz = choose_sizes(c);
  const lever::Isa isa = c.isa == lever::Isa::kAuto ? lever::default_isa() : c.isa;
  std::printf("lever-kbench: arch=%s isa=%s best_isa=%s threads=%d%s\n", build_arch(),
              lever::isa_name(isa), lever::isa_name(lever::best_isa()), lever::get_num_threads(),
              opt.quick ? " quick" : "");
  if (c.emulated)
    std::printf("EMULATED (%s): timings below are NOT performance figures\n", emu.c_str());

  measure_int8_peak(c.ref, isa, c.min_time);
  if (c.ref.int8_peak_gops > 0)
    std::printf("reference: int8 peak %.1f GOP/s (%s, %d threads)\n", c.ref.int8_peak_gops,
                c.ref.int8_instruction.c_str(), lever::get_num_threads());
  measure_dram(c.ref, sz.dram_bytes, c.min_time);
  const std::string path = opt.dir + "/lever-kbench-" + std::to_string(::getpid()) + ".bin";
  write_temp_file(path, sz.flash_bytes);
  try {
    measure_flash(c.ref, path, sz.flash_bytes);
    std::printf("reference: DRAM read %.2f GB/s (all threads), memcpy %.2f GB/s (1 thread); "
                "flash %.2f GB/s%s %s\n",
                c.ref.dram_read_gbps, c.ref.dram_memcpy_gbps, c.ref.flash_read_gbps,
                c.ref.flash_direct ? " (O_DIRECT)" : "", c.ref.flash_note.c_str());
    for (const auto& nk : sz.matrices) bench_qmatmul(c, nk.first, nk.second, sz.cold_bytes);
    for (size_t L : sz.contexts) {
      bench_attention(c, L, 1, lever::ElemType::kF32);
      bench_attention(c, L, 1, lever::ElemType::kBF16);
      bench_attention(c, L, 16, lever::ElemType::kBF16);
    }
    for (int type : kMatmulTypes) bench_dequant(c, type, sz.dequant_elements);
    bench_dequant(c, lever::kTypeF16, sz.dequant_elements);
    bench_dequant(c, lever::kTypeBF16, sz.dequant_elements);
    for (const char* backend : {"auto", "io_uring", "pread"}) {
      bench_flash(c, path, sz.flash_bytes, backend, "sequential", sz.extent_bytes);
      bench_flash(c, path, sz.flash_bytes, backend, "extents", sz.extent_bytes);
    }
  } catch (...) {
    ::unlink(path.c_str());
    throw;
  }
  ::unlink(path.c_str());
  if (c.emulated) std::printf("EMULATED: the figures above are not performance figures\n");

  if (!opt.json_path.empty()) {
    std::ofstream f(opt.json_path);
    f << to_json(c, sz, emu);
    if (!f) throw std::runtime_error("cannot write " + opt.json_path);
    std::printf("wrote %s\n", opt.json_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lever-kbench: %s\n", e.what());
    return 1;
  }
}

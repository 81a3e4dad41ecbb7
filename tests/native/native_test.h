// A tiny test framework for the native C++ tests (tests/native/*.cpp), built
// into one executable, lever_native_tests, when CMake runs with
// -DLEVER_BUILD_TESTS=ON (ctest runs it; cross builds run it under qemu).
//
// Writing a test (in any tests/native/test_*.cpp; the glob picks it up):
//
//   #include "native_test.h"
//
//   TEST(q4_k_matches_scalar) {
//     CHECK(x == y);                          // records file:line, goes on
//     CHECK_MSG(a < b, "a=" << a << " b=" << b);  // with a streamed message
//     CHECK_EQ(got, want);                    // prints both values
//     CHECK_NEAR(got, want, 1e-6);            // |got - want| <= tol
//     REQUIRE(ptr != nullptr);                // like CHECK, but ends the test
//     SKIP("no io_uring here");               // ends the test, counted as skipped
//     NOTE("backend=" << name);               // prints a line (always shown)
//   }
//
// A failed CHECK does not stop the test; every failure is printed as
// "file:line: CHECK(expr) failed: message". An exception escaping a test
// fails it. Names must be valid C++ identifiers and unique across files.
//
// Running: lever_native_tests [--list] [FILTER...]
//   FILTER is a substring of test names (several: any of them). Exit status
//   0 if every test that ran passed, 1 otherwise (2: no test matched).
//   A summary line "N passed, N failed, N skipped" ends the output.
//
// Helpers for bit-exact comparisons: lever_test::same_bits(a, b) for floats,
// lever_test::first_bit_difference(a, b, n) for float arrays (-1 if equal),
// lever_test::Rng for reproducible random data.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace lever_test {

using TestFn = void (*)();

struct TestCase {
  const char* name;
  const char* file;
  TestFn fn;
};

// All registered tests, in registration order (static initialisation).
std::vector<TestCase>& registry();

struct Registrar {
  Registrar(const char* name, const char* file, TestFn fn) {
    registry().push_back({name, file, fn});
  }
};

// Records a failed check of the running test (prints it at once).
void report_failure(const char* file, int line, const char* expr, const std::string& message);
// Prints a note line for the running test.
void report_note(const std::string& message);

// Thrown by REQUIRE and SKIP to leave a test early.
struct TestAbort {};
struct TestSkip {
  std::string reason;
};

// True if two floats have the same bit pattern (NaNs compared bit for bit).
inline bool same_bits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// Index of the first element whose bits differ, or -1 if all n are equal.
inline long first_bit_difference(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!same_bits(a[i], b[i])) return static_cast<long>(i);
  return -1;
}

// True if f() throws std::invalid_argument (what the core throws for bad arguments).
template <typename F>
bool throws_invalid(F f) {
  try {
    f();
  } catch (const std::invalid_argument&) {
    return true;
  }
  return false;
}

// Reproducible pseudo-random numbers (splitmix64), the same on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint32_t next_u32() { return static_cast<uint32_t>(next_u64() >> 32); }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next_u32() >> 8) * (1.0f / 16777216.0f);
  }
  // Roughly normal (sum of 4 uniforms), mean 0, standard deviation `sd`.
  float normal(float sd) {
    float s = 0;
    for (int i = 0; i < 4; ++i) s += uniform(-1.0f, 1.0f);
    return s * sd * 0.8660254f;
  }
  void fill_bytes(uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(next_u32() >> 24);
  }

 private:
  uint64_t state_;
};

}  // namespace lever_test

#define LEVER_TEST_CAT2(a, b) a##b
#define LEVER_TEST_CAT(a, b) LEVER_TEST_CAT2(a, b)

// Defines and registers a test: TEST(name) { body }.
#define TEST(name)                                                                    \
  static void lever_test_fn_##name();                                                 \
  static ::lever_test::Registrar lever_test_reg_##name(#name, __FILE__,               \
                                                       &lever_test_fn_##name);        \
  static void lever_test_fn_##name()

#define CHECK_MSG(cond, msg)                                                            \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::ostringstream lever_test_os_;                                                \
      lever_test_os_ << msg;                                                            \
      ::lever_test::report_failure(__FILE__, __LINE__, #cond, lever_test_os_.str());   \
    }                                                                                   \
  } while (0)

#define CHECK(cond) CHECK_MSG(cond, "")

#define CHECK_EQ(a, b) CHECK_MSG((a) == (b), "got " << (a) << ", want " << (b))

#define CHECK_NEAR(a, b, tol)                                                          \
  CHECK_MSG(std::fabs(static_cast<double>(a) - static_cast<double>(b)) <=             \
                static_cast<double>(tol),                                              \
            "got " << (a) << ", want " << (b) << " (tolerance " << (tol) << ")")

#define REQUIRE(cond)                                                                   \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      ::lever_test::report_failure(__FILE__, __LINE__, #cond, "(required; test ends)");\
      throw ::lever_test::TestAbort{};                                                  \
    }                                                                                   \
  } while (0)

#define SKIP(msg)                                                                       \
  do {                                                                                  \
    std::ostringstream lever_test_os_;                                                  \
    lever_test_os_ << msg;                                                              \
    throw ::lever_test::TestSkip{lever_test_os_.str()};                                 \
  } while (0)

#define NOTE(msg)                                                                       \
  do {                                                                                  \
    std::ostringstream lever_test_os_;                                                  \
    lever_test_os_ << msg;                                                              \
    ::lever_test::report_note(lever_test_os_.str());                                    \
  } while (0)

// The runner of the native tests (see native_test.h): runs every registered
// test, or those whose name contains one of the command-line filters, and
// prints a summary. Exit status: 0 all passed, 1 a failure, 2 nothing matched.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "kernels/qdot.h"
#include "kernels/qmatmul.h"
#include "native_test.h"

namespace lever_test {

std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;
  return tests;
}

namespace {
int g_failures_in_test = 0;
const char* g_current = "";
}  // namespace

void report_failure(const char* file, int line, const char* expr, const std::string& message) {
  ++g_failures_in_test;
  std::printf("  %s:%d: CHECK(%s) failed%s%s\n", file, line, expr, message.empty() ? "" : ": ",
              message.c_str());
  std::fflush(stdout);
}

void report_note(const std::string& message) {
  std::printf("  [%s] %s\n", g_current, message.c_str());
  std::fflush(stdout);
}

}  // namespace lever_test

namespace {

bool matches(const char* name, const std::vector<std::string>& filters) {
  if (filters.empty()) return true;
  for (const auto& f : filters)
    if (std::strstr(name, f.c_str())) return true;
  return false;
}

// The machine the tests run on: the kernel Isa that kAuto resolves to, so a
// log of a run under qemu -cpu X shows which NEON dispatch path it exercised.
void print_platform() {
  const char* arch =
#if defined(__aarch64__)
      "aarch64";
#elif defined(__x86_64__)
      "x86_64";
#else
      "other";
#endif
  const char* qemu_cpu = std::getenv("QEMU_CPU");
  std::printf("lever_native_tests: arch=%s best_isa=%s default_isa=%s QEMU_CPU=%s\n", arch,
              lever::isa_name(lever::best_isa()), lever::isa_name(lever::default_isa()),
              qemu_cpu ? qemu_cpu : "(unset)");
  std::printf("available isas:");
  for (lever::Isa isa : lever::kAllIsas)
    if (lever::isa_available(isa)) std::printf(" %s", lever::isa_name(isa));
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lever_test;
  std::vector<std::string> filters;
  bool list_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0) list_only = true;
    else filters.emplace_back(argv[i]);
  }
  if (list_only) {
    for (const auto& t : registry())
      if (matches(t.name, filters)) std::printf("%s\n", t.name);
    return 0;
  }
  print_platform();
  int passed = 0, failed = 0, skipped = 0;
  std::vector<std::string> failed_names;
  for (const auto& t : registry()) {
    if (!matches(t.name, filters)) continue;
    g_current = t.name;
    g_failures_in_test = 0;
    std::printf("[ RUN  ] %s\n", t.name);
    std::fflush(stdout);
    auto start = std::chrono::steady_clock::now();
    bool skip = false;
    std::string skip_reason;
    try {
      t.fn();
    } catch (const TestAbort&) {
    } catch (const TestSkip& s) {
      skip = true;
      skip_reason = s.reason;
    } catch (const std::exception& e) {
      report_failure(t.file, 0, "no exception", std::string("threw: ") + e.what());
    } catch (...) {
      report_failure(t.file, 0, "no exception", "threw a non-std exception");
    }
    double ms = std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - start).count();
    if (g_failures_in_test > 0) {
      ++failed;
      failed_names.push_back(t.name);
      std::printf("[ FAIL ] %s (%.1f ms, %d failed checks)\n", t.name, ms, g_failures_in_test);
    } else if (skip) {
      ++skipped;
      std::printf("[ SKIP ] %s: %s\n", t.name, skip_reason.c_str());
    } else {
      ++passed;
      std::printf("[  OK  ] %s (%.1f ms)\n", t.name, ms);
    }
    std::fflush(stdout);
  }
  std::printf("\n%d passed, %d failed, %d skipped (best_isa=%s)\n", passed, failed, skipped,
              lever::isa_name(lever::best_isa()));
  for (const auto& n : failed_names) std::printf("FAILED: %s\n", n.c_str());
  if (passed + failed + skipped == 0) {
    std::printf("no test matched\n");
    return 2;
  }
  return failed ? 1 : 0;
}

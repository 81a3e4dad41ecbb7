// Kernel instruction-set dispatch: every Isa the CPU lacks is refused (never
// silently replaced), names round-trip, and under qemu each emulated CPU
// dispatches to the path it has (ctest sets LEVER_EMULATED=qemu-<cpu>):
//   max -> i8mm, cortex-a76 -> dotprod, cortex-a53 -> neon.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/dequant.h"
#include "kernels/qdot.h"
#include "kernels/qmatmul.h"
#include "native_test.h"

TEST(isa_names_round_trip_and_unknown_names_are_refused) {
  for (lever::Isa isa : lever::kAllIsas) {
    CHECK(lever::isa_from_name(lever::isa_name(isa)) == isa);
  }
  bool refused = false;
  try {
    lever::isa_from_name("sve2");
  } catch (const std::invalid_argument& e) {
    refused = std::string(e.what()).find("neon, dotprod, i8mm") != std::string::npos;
  }
  CHECK_MSG(refused, "an unknown name must be refused with the list of valid ones");
}

TEST(an_unavailable_isa_is_refused_and_has_no_kernels) {
  for (lever::Isa isa : lever::kAllIsas) {
    if (lever::isa_available(isa)) {
      CHECK(lever::dot_rows_kernel(lever::kTypeQ4_K, isa) != nullptr);
      continue;
    }
    NOTE("not available here: " << lever::isa_name(isa));
    CHECK(lever::dot_rows_kernel(lever::kTypeQ4_K, isa) == nullptr);
    CHECK(lever::dot_tile_kernel(lever::kTypeQ4_K, isa) == nullptr);
    bool refused = false;
    try {
      lever::set_default_isa(isa);
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    CHECK_MSG(refused, "set_default_isa(" << lever::isa_name(isa) << ") must throw");
  }
  lever::set_default_isa(lever::Isa::kAuto);
}

TEST(each_emulated_cpu_dispatches_to_its_own_path) {
  const char* emulated = std::getenv("LEVER_EMULATED");
  if (!emulated || !*emulated) SKIP("not under emulation (LEVER_EMULATED unset)");
  const std::string cpu(emulated);
  const char* want = cpu == "qemu-max"          ? "i8mm"
                     : cpu == "qemu-cortex-a76" ? "dotprod"
                     : cpu == "qemu-cortex-a53" ? "neon"
                                                : nullptr;
  if (want == nullptr) SKIP("no expectation for " << cpu);
  CHECK_EQ(std::string(lever::isa_name(lever::best_isa())), std::string(want));
}

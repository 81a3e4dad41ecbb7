// Choosing a dot kernel: which instruction sets this CPU has, and the
// per-type kernel table (see qdot.h). The kernels themselves are in
// qdot_kquants.cpp (Q4_K, Q6_K) and qdot_blocks32.cpp (Q8_0, Q5_0, Q4_0, Q4_1),
// and for aarch64 in qdot_kquants_neon.cpp and qdot_blocks32_neon.cpp.

#include "kernels/qdot.h"

#include "kernels/dequant.h"
#include "kernels/repack.h"

#include <stdexcept>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace lever {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAuto: return "auto";
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kNeon: return "neon";
    case Isa::kDotprod: return "dotprod";
    case Isa::kI8mm: return "i8mm";
  }
  return "unknown";
}

Isa isa_from_name(const std::string& name) {
  if (name == isa_name(Isa::kAuto)) return Isa::kAuto;
  std::string names = "auto";
  for (Isa isa : kAllIsas) {
    if (name == isa_name(isa)) return isa;
    names += std::string(", ") + isa_name(isa);
  }
  throw std::invalid_argument("unknown kernel instruction set '" + name + "' (use " + names +
                              ")");
}

#if defined(__aarch64__) && defined(__linux__)
namespace {
// Feature bits of the kernel's auxiliary vector (asm/hwcap.h); spelled out
// because older C libraries (and some NDK levels) do not name all of them.
constexpr unsigned long kHwcapAsimd = 1ul << 1;
constexpr unsigned long kHwcapAsimdDp = 1ul << 20;
constexpr unsigned long kHwcap2I8mm = 1ul << 13;

bool has_hwcap(unsigned long type, unsigned long bit) { return (getauxval(type) & bit) != 0; }
}  // namespace
#endif

bool isa_available(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
    case Isa::kScalar:
      return true;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#else
    case Isa::kAvx2:
    case Isa::kAvx512:
      return false;
#endif
#if defined(__aarch64__) && defined(__linux__)
    case Isa::kNeon:
      return has_hwcap(AT_HWCAP, kHwcapAsimd);
    case Isa::kDotprod:
      return has_hwcap(AT_HWCAP, kHwcapAsimd) && has_hwcap(AT_HWCAP, kHwcapAsimdDp);
    case Isa::kI8mm:
      return has_hwcap(AT_HWCAP, kHwcapAsimd) && has_hwcap(AT_HWCAP, kHwcapAsimdDp) &&
             has_hwcap(AT_HWCAP2, kHwcap2I8mm);
#else
    case Isa::kNeon:
    case Isa::kDotprod:
    case Isa::kI8mm:
      return false;
#endif
  }
  return false;
}

Isa best_isa() {
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kI8mm, Isa::kDotprod, Isa::kNeon}) {
    if (isa_available(isa)) return isa;
  }
  return Isa::kScalar;
}

namespace {

constexpr int kIsaSlots = static_cast<int>(Isa::kI8mm) + 1;

// One row of the kernel table: a weight type and its kernels per Isa
// (indexed by the Isa's value; nullptr where this build has none).
struct KernelSet {
  int type;
  bool q8k_activations;
  DotRowsFn rows[kIsaSlots];
  DotTileFn tile[kIsaSlots];
};

#if defined(__x86_64__)
// kAvx512 runs the AVX2 kernels on weights in the GGUF layout: they equal the
// scalar kernels bit for bit, and AVX-512's own kernels are the repacked ones
// (qdot_r8.h), which weights take as they load.
#define LEVER_X86_ROWS(t) qdot::t##_avx2, qdot::t##_avx2
#define LEVER_X86_TILE(t) nullptr, nullptr
#else
#define LEVER_X86_ROWS(t) nullptr, nullptr
#define LEVER_X86_TILE(t) nullptr, nullptr
#endif
#if defined(__aarch64__)
#define LEVER_ARM_ROWS(t) qdot::t##_neon, qdot::t##_dotprod, qdot::t##_dotprod
#define LEVER_ARM_TILE(t) nullptr, qdot::t##_dotprod_tile, qdot::t##_i8mm_tile
#else
#define LEVER_ARM_ROWS(t) nullptr, nullptr, nullptr
#define LEVER_ARM_TILE(t) nullptr, nullptr, nullptr
#endif
#define LEVER_KERNELS(type_id, q8k, t)                                                 \
  {type_id, q8k, {nullptr, qdot::t##_scalar, LEVER_X86_ROWS(t), LEVER_ARM_ROWS(t)},     \
   {nullptr, nullptr, LEVER_X86_TILE(t), LEVER_ARM_TILE(t)}}

const KernelSet kKernels[] = {
    LEVER_KERNELS(kTypeQ4_K, true, q4_k),
    LEVER_KERNELS(kTypeQ6_K, true, q6_k),
    LEVER_KERNELS(kTypeQ8_0, false, q8_0),
    LEVER_KERNELS(kTypeQ5_0, false, q5_0),
    LEVER_KERNELS(kTypeQ4_0, false, q4_0),
    LEVER_KERNELS(kTypeQ4_1, false, q4_1),
};

const KernelSet* find_kernels(int type) {
  for (const KernelSet& k : kKernels) {
    if (k.type == type) return &k;
  }
  return nullptr;
}

}  // namespace

// Repacked types (kernels/repack.h) have group kernels (qdot_r8.h), not the
// row or tile kernels here, and take their base type's activations.
bool has_dot_kernel(int type) { return find_kernels(base_type(type)) != nullptr; }

bool uses_q8k_activations(int type) {
  const KernelSet* k = find_kernels(base_type(type));
  return k != nullptr && k->q8k_activations;
}

DotRowsFn dot_rows_kernel(int type, Isa isa) {
  const KernelSet* k = find_kernels(type);
  if (k == nullptr) return nullptr;
  if (isa == Isa::kAuto) isa = best_isa();
  if (!isa_available(isa)) return nullptr;
  return k->rows[static_cast<int>(isa)];
}

DotTileFn dot_tile_kernel(int type, Isa isa) {
  const KernelSet* k = find_kernels(type);
  if (k == nullptr) return nullptr;
  if (isa == Isa::kAuto) isa = best_isa();
  if (!isa_available(isa)) return nullptr;
  return k->tile[static_cast<int>(isa)];
}


}  // namespace lever

// Choosing a dot kernel: which instruction sets this CPU has, and the
// per-type kernel table (see qdot.h). The kernels themselves are in
// qdot_kquants.cpp (Q4_K, Q6_K) and qdot_blocks32.cpp (Q8_0, Q5_0, Q4_0, Q4_1).

#include "kernels/qdot.h"

#include "kernels/dequant.h"

namespace lever {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAuto: return "auto";
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

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
  }
  return false;
}

Isa best_isa() {
  if (isa_available(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_available(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

namespace {

// One row of the kernel table: a weight type and its kernel per Isa.
struct KernelSet {
  int type;
  bool q8k_activations;
  DotRowsFn scalar, avx2, avx512;
  DotTileFn avx512_tile;  // nullptr: none
};

#if defined(__x86_64__)
#define LEVER_X86(fn) qdot::fn
#else
#define LEVER_X86(fn) nullptr
#endif

const KernelSet kKernels[] = {
    {kTypeQ4_K, true, qdot::q4_k_scalar, LEVER_X86(q4_k_avx2), LEVER_X86(q4_k_avx512),
     LEVER_X86(q4_k_avx512_tile)},
    {kTypeQ6_K, true, qdot::q6_k_scalar, LEVER_X86(q6_k_avx2), LEVER_X86(q6_k_avx512),
     LEVER_X86(q6_k_avx512_tile)},
    {kTypeQ8_0, false, qdot::q8_0_scalar, LEVER_X86(q8_0_avx2), LEVER_X86(q8_0_avx512),
     LEVER_X86(q8_0_avx512_tile)},
    {kTypeQ5_0, false, qdot::q5_0_scalar, LEVER_X86(q5_0_avx2), LEVER_X86(q5_0_avx512),
     LEVER_X86(q5_0_avx512_tile)},
    {kTypeQ4_0, false, qdot::q4_0_scalar, LEVER_X86(q4_0_avx2), LEVER_X86(q4_0_avx512),
     LEVER_X86(q4_0_avx512_tile)},
    {kTypeQ4_1, false, qdot::q4_1_scalar, LEVER_X86(q4_1_avx2), LEVER_X86(q4_1_avx512),
     LEVER_X86(q4_1_avx512_tile)},
};

const KernelSet* find_kernels(int type) {
  for (const KernelSet& k : kKernels) {
    if (k.type == type) return &k;
  }
  return nullptr;
}

}  // namespace

bool has_dot_kernel(int type) { return find_kernels(type) != nullptr; }

bool uses_q8k_activations(int type) {
  const KernelSet* k = find_kernels(type);
  return k != nullptr && k->q8k_activations;
}

DotRowsFn dot_rows_kernel(int type, Isa isa) {
  const KernelSet* k = find_kernels(type);
  if (k == nullptr) return nullptr;
  if (isa == Isa::kAuto) isa = best_isa();
  if (!isa_available(isa)) return nullptr;
  switch (isa) {
    case Isa::kScalar: return k->scalar;
    case Isa::kAvx2: return k->avx2;
    case Isa::kAvx512: return k->avx512;
    case Isa::kAuto: break;
  }
  return nullptr;
}

DotTileFn dot_tile_kernel(int type, Isa isa) {
  const KernelSet* k = find_kernels(type);
  if (k == nullptr) return nullptr;
  if (isa == Isa::kAuto) isa = best_isa();
  if (!isa_available(isa)) return nullptr;
  return isa == Isa::kAvx512 ? k->avx512_tile : nullptr;
}

}  // namespace lever

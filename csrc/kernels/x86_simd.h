// x86 SIMD intrinsics for the dot kernels (x86-64 builds only).
//
// GCC 12 reports its own AVX-512 intrinsics (the _mm512_undefined_* they use)
// as possibly uninitialised under -Wall (GCC bug 105593). The warning is
// raised where the intrinsics are inlined, so it stays off for the rest of
// the including file; include this header only from kernel sources.
#pragma once

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

// LEVER_KERNEL: compile a function for several x86-64 levels (AVX-512,
// AVX2, the baseline) and let the loader pick the best one the CPU runs.
//
// target_clones needs ifunc support (glibc Linux, not Android or macOS);
// elsewhere, and when built with -DLEVER_NO_MULTIVERSION (used to test the
// baseline and AVX2 versions on any x86-64), the function is compiled once
// for the -march given.
#pragma once

#if defined(__x86_64__) && defined(__linux__) && !defined(__ANDROID__) && \
    (defined(__GNUC__) || defined(__clang__)) && !defined(LEVER_NO_MULTIVERSION)
#if defined(__clang__) || __GNUC__ >= 12
#define LEVER_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else  // older GCC: no arch= levels in target_clones
#define LEVER_KERNEL __attribute__((target_clones("avx2", "default")))
#endif
#else
#define LEVER_KERNEL
#endif

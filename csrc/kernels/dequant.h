// Dequantisation of GGUF / ggml tensor data to fp32 or bf16.
//
// A ggml tensor of a quantised type is a sequence of fixed-size blocks; each
// block encodes `block_size` consecutive elements in `type_size` bytes (the
// layouts are documented next to each kernel in dequant.cpp). The results are
// bit-identical to the reference `gguf.quants.dequantize` of the gguf Python
// package; the bf16 results are those fp32 values rounded to nearest-even.
//
// Units: sizes called n_bytes are in bytes, n_elements in tensor elements
// (output values), block_size in elements per block, type_size in bytes per
// block. All data is little-endian, as in GGUF files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lever {

// ggml tensor type ids, as stored in GGUF files (enum ggml_type).
enum GgmlType : int {
  kTypeF32 = 0,
  kTypeF16 = 1,
  kTypeQ4_0 = 2,
  kTypeQ4_1 = 3,
  kTypeQ5_0 = 6,
  kTypeQ5_1 = 7,
  kTypeQ8_0 = 8,
  kTypeQ2_K = 10,
  kTypeQ3_K = 11,
  kTypeQ4_K = 12,
  kTypeQ5_K = 13,
  kTypeQ6_K = 14,
  kTypeBF16 = 30,
};

// True if `type` can be dequantised here.
bool is_supported_type(int type);

// The supported ggml type ids, in increasing order.
std::vector<int> supported_types();

// Name of a supported type ("Q4_K"); "unknown" otherwise.
const char* type_name(int type);

// Elements per block / bytes per block of a supported type.
// Throw std::invalid_argument for an unsupported type.
size_t block_size(int type);
size_t type_size(int type);

// Elements encoded by n_bytes of data of `type`. Throws std::invalid_argument
// if the type is unsupported or n_bytes is not a whole number of blocks.
size_t element_count(int type, size_t n_bytes);

// Dequantise n_bytes of `type` data at src into dst, which holds n_elements
// values: fp32, or bf16 bit patterns (round-to-nearest-even; NaN stays a
// quiet NaN with the same sign). n_elements must equal
// element_count(type, n_bytes). Throws std::invalid_argument (before touching
// dst) if the type is unsupported or the sizes do not match. Runs on the
// process-wide thread pool (common/parallel.h); src and dst must not overlap.
void dequantize_to_f32(const uint8_t* src, size_t n_bytes, int type, float* dst,
                       size_t n_elements);
void dequantize_to_bf16(const uint8_t* src, size_t n_bytes, int type, uint16_t* dst,
                        size_t n_elements);
// The same into fp16 bit patterns (IEEE binary16, round-to-nearest-even:
// beyond 65504 to infinity, below 2^-14 to subnormals; NaN -> quiet NaN):
// the float16 weights an NPU graph takes (lever.npu).
void dequantize_to_f16(const uint8_t* src, size_t n_bytes, int type, uint16_t* dst,
                       size_t n_elements);

// Scalar conversions used by the kernels, exposed for other kernels and tests.
// fp16 -> fp32 is exact for every input (NaN payloads are kept unchanged).
float fp16_to_fp32(uint16_t h);
// fp32 -> bf16, round to nearest, ties to even; NaN -> quiet NaN, same sign.
uint16_t fp32_to_bf16(float f);
// fp32 -> fp16, round to nearest, ties to even (as numpy's astype(float16)).
uint16_t fp32_to_fp16(float f);

// n fp16 values (2 n little-endian bytes at src, any alignment) -> fp32 at
// dst, on the calling thread; the same bits as fp16_to_fp32 on each value.
// fp16_to_fp32_row is the fastest version (NEON fcvtl on aarch64, AVX on
// x86-64); fp16_to_fp32_row_portable the plain C++ one (for tests).
void fp16_to_fp32_row(const uint8_t* src, size_t n, float* dst);
void fp16_to_fp32_row_portable(const uint8_t* src, size_t n, float* dst);

}  // namespace lever

// Key/value cache of one sequence for every layer of a decoder (native core).
//
// Layout: two arrays (keys, values) of shape [n_layers][n_kv_heads][capacity][head_dim],
// elements fp32 or bf16 (bf16 halves the memory; values are rounded to nearest
// even when written). Rows are cache positions, one per token: rows
// [0, length) are committed; a forward pass writes its T new rows at
// [length, length + T) and commits them at the end of the pass.
//
// Units: n_rows / length / capacity are rows (tokens); nbytes is bytes;
// element offsets are in elements of the cache dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/qmatmul.h"  // ElemType

namespace lever {

class KVCache {
 public:
  // Throws std::invalid_argument for zero sizes.
  KVCache(size_t n_layers, size_t n_kv_heads, size_t head_dim, size_t capacity, ElemType dtype);

  size_t n_layers() const { return n_layers_; }
  size_t n_kv_heads() const { return n_kv_heads_; }
  size_t head_dim() const { return head_dim_; }
  size_t capacity() const { return capacity_; }
  size_t length() const { return length_; }
  ElemType dtype() const { return dtype_; }
  size_t elem_bytes() const { return dtype_ == ElemType::kF32 ? 4 : 2; }
  // Bytes allocated for keys and values together.
  size_t nbytes() const { return 2 * layer_elems() * n_layers_ * elem_bytes(); }
  // Rows moved by compact() since construction (a counter for tests).
  size_t rows_moved() const { return rows_moved_; }

  // Keep the first n rows. Throws std::invalid_argument unless 0 <= n <= length.
  void truncate(size_t n);
  // Make room for at least n_rows rows: grows to max(n_rows, 2 * capacity),
  // copying only the committed rows. No-op if n_rows <= capacity.
  void reserve(size_t n_rows);
  // Keep rows keep[0..n) (strictly increasing, each < length), moved to the
  // front in place; only rows with keep[i] != i are copied. length becomes n.
  // Throws std::invalid_argument (cache unchanged) for a bad keep.
  void compact(const int64_t* keep, size_t n);
  // Throws std::runtime_error("KV cache overflow: N rows > capacity C")
  // if n_rows > capacity.
  void check_fits(size_t n_rows) const;

  // Write T rows of fp32 keys and values, each [T, n_kv_heads * head_dim]
  // with row stride `stride` elements, into `layer` at rows [length, length + T).
  void write(size_t layer, const float* k, const float* v, size_t T, size_t stride);
  // Write n rows of fp32 keys and values (layout as write) into `layer`, row t
  // at cache row slots[t] (slots need not be contiguous: a pass whose rows were
  // pruned keeps writing its surviving rows at their original rows). Throws
  // std::invalid_argument for a bad layer, std::runtime_error (as check_fits)
  // for a slot >= capacity; nothing is written then.
  void write_rows(size_t layer, const float* k, const float* v, const size_t* slots, size_t n,
                  size_t stride);
  // Commit the rows written by the last pass: length += n.
  void advance(size_t n);

  // Start of `layer`'s keys / values: [n_kv_heads][capacity][head_dim].
  const void* keys(size_t layer) const { return k_.get() + layer * layer_elems() * elem_bytes(); }
  const void* values(size_t layer) const { return v_.get() + layer * layer_elems() * elem_bytes(); }
  // Element strides between kv heads / rows.
  size_t head_stride() const { return capacity_ * head_dim_; }
  size_t row_stride() const { return head_dim_; }

  // fp32 copies of the committed rows of `layer`: [n_kv_heads][length][head_dim] each.
  void read_rows(size_t layer, float* k_out, float* v_out) const;

 private:
  size_t layer_elems() const { return n_kv_heads_ * capacity_ * head_dim_; }
  uint8_t* row_ptr(uint8_t* base, size_t layer, size_t head, size_t row) const;
  // One row of keys and values (n_kv_heads * head_dim fp32 each) to cache row `slot`.
  void write_row(size_t layer, const float* k, const float* v, size_t slot);

  size_t n_layers_, n_kv_heads_, head_dim_, capacity_;
  ElemType dtype_;
  size_t length_ = 0;
  size_t rows_moved_ = 0;
  std::unique_ptr<uint8_t[]> k_, v_;  // uninitialised until written
};

}  // namespace lever

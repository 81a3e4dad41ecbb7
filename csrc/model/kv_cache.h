// Key/value cache of one sequence for every layer of a decoder (native core).
//
// Rows are absolute cache rows, one per token: rows [0, length) are
// committed; a forward pass writes its T new rows at [length, length + T)
// and commits them at the end of the pass. Elements are fp32 or bf16 (bf16
// halves the memory; values are rounded to nearest even when written).
//
// Each layer has its own storage, keys and values [n_kv_heads][rows][head_dim]:
//  - a full layer (window 0) holds every absolute row [0, capacity);
//  - a windowed layer (window W > 0: a sliding-window layer whose queries see
//    only the last W positions, themselves included) holds the absolute rows
//    [base, base + local capacity). Before a pass (prepare), when its rows
//    do not fit, the rows below base' = (lowest position of the pass) - K are
//    dropped by sliding the rest down to storage row 0 (base = base'), where
//    K = W - 1 + R: the W - 1 rows the pass can see, and R = max(W,
//    kMinRollback) more that a later compaction or truncation may take the
//    cache back to (a draft model's tree and the chain it drafts ahead are
//    compacted back to their root: a dozen or two positions deep with the
//    default limits). The local capacity starts at min(capacity, K + W + 1)
//    and grows, when a pass of T rows needs more, to min(capacity, max(need,
//    K + W + T)): with passes of at most T rows it is min(capacity, K + W + 1)
//    while T <= W + 1, else min(capacity, K + W + T); a slide copies K rows
//    about every W tokens. Every windowed layer of one cache shares one base
//    and one local capacity (the largest window decides).
// An operation that would leave the cache needing a dropped row (truncate or
// compact to n rows with base > n - (W - 1), a pass seeing a row below base)
// throws std::runtime_error.
//
// Units: n_rows / length / capacity / base / windows are rows (tokens);
// nbytes is bytes; element offsets and strides are in elements of the cache dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/qmatmul.h"  // ElemType

namespace lever {

class KVCache {
 public:
  // Rows a windowed layer keeps beyond its window below a pass, at least (see the top).
  static constexpr size_t kMinRollback = 64;

  // windows: one per layer (0: a full layer), or empty (every layer full).
  // Throws std::invalid_argument for zero sizes or a windows list of another length.
  KVCache(size_t n_layers, size_t n_kv_heads, size_t head_dim, size_t capacity, ElemType dtype,
          std::vector<size_t> windows = {});

  size_t n_layers() const { return layers_.size(); }
  size_t n_kv_heads() const { return n_kv_heads_; }
  size_t head_dim() const { return head_dim_; }
  // Absolute rows a pass may reach (full layers hold them all).
  size_t capacity() const { return capacity_; }
  size_t length() const { return length_; }
  ElemType dtype() const { return dtype_; }
  size_t elem_bytes() const { return dtype_ == ElemType::kF32 ? 4 : 2; }
  // Layer `layer`'s window (0: full), first held absolute row, rows allocated.
  size_t window(size_t layer) const { return layers_.at(layer).window; }
  size_t base(size_t layer) const { return window(layer) ? base_ : 0; }
  size_t layer_capacity(size_t layer) const { return window(layer) ? local_cap_ : capacity_; }
  // Bytes allocated for keys and values together, every layer.
  size_t nbytes() const;
  // Rows moved by compact() since construction (a counter for tests).
  size_t rows_moved() const { return rows_moved_; }
  // Slides of the windowed layers since construction (a counter for tests).
  size_t slides() const { return slides_; }

  // Keep the first n rows. Throws std::invalid_argument unless 0 <= n <= length,
  // std::runtime_error (cache unchanged) if the windowed layers dropped rows a
  // pass after n rows needs (n > 0 and base > n - (W - 1)). n == 0 empties the
  // cache (base 0).
  void truncate(size_t n);
  // Make room for at least n_rows absolute rows: full layers grow to
  // max(n_rows, 2 * capacity), copying only the committed rows; windowed
  // layers grow in prepare(). No-op if n_rows <= capacity.
  void reserve(size_t n_rows);
  // Keep rows keep[0..n) (strictly increasing, each < length), moved to the
  // front in place: row i gets row keep[i] (keep[i] >= i); only rows with
  // keep[i] != i are copied, and a windowed layer's rows below base are
  // simply gone. length becomes n. Throws std::invalid_argument for a bad
  // keep, std::runtime_error as truncate(n); the cache is unchanged then.
  void compact(const int64_t* keep, size_t n);
  // Throws std::runtime_error("KV cache overflow: N rows > capacity C")
  // if n_rows > capacity.
  void check_fits(size_t n_rows) const;
  // Before a pass of T rows whose lowest position is keep_from: check_fits(length
  // + T), then make the windowed layers hold [base, length + T), sliding
  // (base = max(base, min(keep_from, length) - K)) and growing as the top of
  // this file says. Rows a pass can see are never dropped.
  void prepare(size_t T, size_t keep_from);

  // Write T rows of fp32 keys and values, each [T, n_kv_heads * head_dim]
  // with row stride `stride` elements, into `layer` at rows [length, length + T).
  void write(size_t layer, const float* k, const float* v, size_t T, size_t stride);
  // Write n rows of fp32 keys and values (layout as write) into `layer`, row t
  // at absolute row slots[t] (slots need not be contiguous: a pass whose rows
  // were pruned keeps writing its surviving rows at their original rows).
  // Throws std::invalid_argument for a bad layer, std::runtime_error (as
  // check_fits) for a slot >= capacity or outside a windowed layer's held
  // rows; nothing is written then.
  void write_rows(size_t layer, const float* k, const float* v, const size_t* slots, size_t n,
                  size_t stride);
  // Commit the rows written by the last pass: length += n.
  void advance(size_t n);

  // Start of `layer`'s keys / values: [n_kv_heads][layer_capacity][head_dim],
  // storage row 0 = absolute row base(layer).
  const void* keys(size_t layer) const { return layers_.at(layer).k.get(); }
  const void* values(size_t layer) const { return layers_.at(layer).v.get(); }
  // Absolute row `row` of kv head 0 of `layer`'s keys / values;
  // std::invalid_argument if the layer does not hold it (row < base).
  const void* keys_at(size_t layer, size_t row) const;
  const void* values_at(size_t layer, size_t row) const;
  // Element strides between kv heads / rows of `layer`.
  size_t head_stride(size_t layer) const { return layer_capacity(layer) * head_dim_; }
  size_t row_stride() const { return head_dim_; }

  // fp32 copies of the committed rows `layer` holds, absolute rows
  // [base(layer), length): [n_kv_heads][length - base(layer)][head_dim] each.
  void read_rows(size_t layer, float* k_out, float* v_out) const;

 private:
  struct Layer {
    size_t window;                       // 0: full
    std::unique_ptr<uint8_t[]> k, v;     // uninitialised until written
  };
  size_t row_bytes() const { return head_dim_ * elem_bytes(); }
  // Storage row `srow` of kv head `head` of one layer's keys or values.
  uint8_t* row_ptr(uint8_t* data, size_t layer, size_t head, size_t srow) const;
  // One row of keys and values (n_kv_heads * head_dim fp32 each) to absolute row `slot`.
  void write_row(size_t layer, const float* k, const float* v, size_t slot);
  // std::runtime_error unless `layer` holds absolute row `slot`.
  void check_slot(size_t layer, size_t slot) const;
  // std::runtime_error if a cache of n committed rows would need a dropped row.
  void check_keeps(size_t n, const char* what) const;

  size_t n_kv_heads_, head_dim_, capacity_;
  ElemType dtype_;
  std::vector<Layer> layers_;
  size_t max_window_ = 0;   // largest window (0: no windowed layer)
  size_t keep_ = 0;         // K: rows kept below a pass's lowest position (see the top)
  size_t base_ = 0;         // windowed layers: absolute row of storage row 0
  size_t local_cap_ = 0;    // windowed layers: rows allocated
  size_t length_ = 0;
  size_t rows_moved_ = 0;
  size_t slides_ = 0;
};

}  // namespace lever

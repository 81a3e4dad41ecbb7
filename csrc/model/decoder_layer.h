// One Llama / Qwen2 decoder layer in fp32, and the per-pass state around it.
//
// A forward pass of T new tokens over a cache of L committed rows is:
//   model.begin_pass(positions, mask, cache)   rotary tables, the [T, L + T] mask
//   for each layer i: model.layer(x, layout_i, buffer_i, cache, i)
//   model.end_pass(cache)                      cache.length += T
// Between layers, model.keep_rows(x, keep) may drop rows of the pass (early
// exit): later layers run the kept ("live") rows only, writing their keys and
// values at the cache rows of their original positions in the pass, L + i.
// layer() computes, for the residual stream x [T, hidden] (in place):
//   h = rms_norm(x) ; q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)
//   q, k rotated by RoPE (rotate-half) ; k, v appended to the cache at rows L..L+T
//   x += attention(q, cache keys/values, mask) Wo^T
//   h = rms_norm(x) ; x += (silu(h Wgate^T) * h Wup^T) Wdown^T
// Every step is row-independent: a row's result depends only on that row,
// its position and the cache rows its mask lets it see (bitwise), so a token
// verified inside a tree gets exactly the numbers it gets decoded alone.
//
// Units: sizes are elements; positions are token positions; rms_eps is
// added to the mean square; rope_theta is the RoPE base.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/kv_cache.h"
#include "model/layer_layout.h"

namespace lever {

// Dot product of n fp32 values: 16 partial sums combined in a fixed order (the
// same bits for the same inputs on every path of one build).
float dot_f32(const float* a, const float* b, size_t n);

// out[r] = w * (x[r] / sqrt(mean(x[r]^2) + eps)) for R rows of n values
// (row strides in elements). out may equal x.
void rms_norm_rows(const float* x, size_t R, size_t n, size_t x_stride, const float* w, float eps,
                   float* out, size_t out_stride);

class NativeModel {
 public:
  // Throws std::invalid_argument for inconsistent dims (n_heads not a
  // multiple of n_kv_heads, odd head_dim, zero sizes).
  NativeModel(const LayerDims& dims, float rms_eps, float rope_theta);

  const LayerDims& dims() const { return dims_; }
  float rms_eps() const { return rms_eps_; }
  float rope_theta() const { return rope_theta_; }

  // Throws std::invalid_argument naming the bad or missing tensor.
  void check_layout(const LayerLayout& layout, size_t buffer_nbytes) const;

  // Starts a pass of T tokens: positions [T]; mask: T rows of cache.length + T
  // bytes (non-zero: may attend), copied. Throws std::invalid_argument for a
  // cache of other dims, std::runtime_error if length + T > capacity.
  void begin_pass(const int64_t* positions, size_t T, const uint8_t* mask, size_t mask_cols,
                  const KVCache& cache);
  // Runs layer `layer_index` on x [T_live, hidden] (contiguous, in place);
  // x_rows must equal live_rows() (the pass's T until keep_rows drops rows).
  // Row t's keys / values go to cache row slot(t); its queries attend over the
  // L + T cache rows of the pass that its mask row allows.
  void layer(float* x, size_t x_rows, const LayerLayout& layout, const uint8_t* buffer, size_t buffer_nbytes,
             KVCache& cache, size_t layer_index);
  // Keeps live rows keep[0..n) of the pass, in order: x row i <- row keep[i]
  // (x: x_rows = live_rows() rows of hidden floats, compacted in place), and
  // likewise each row's rotary angles, mask row and cache slot. keep indexes
  // the live rows at the time of the call (it may be called several times in
  // a pass) and must be strictly increasing, start at 0 (the first row is
  // always kept) and stay below live_rows(); std::invalid_argument otherwise
  // (nothing changed). The mask keeps its L + T columns: kept rows still see
  // the original rows they saw, and must never see a dropped one (the caller
  // keeps ancestor-closed sets; not checked here).
  void keep_rows(float* x, size_t x_rows, const int64_t* keep, size_t n);
  // Rows still running in the open pass (0 if none is open).
  size_t live_rows() const { return active_ ? slots_.size() : 0; }
  // Cache row of live row t (L + its original index in the pass).
  size_t slot(size_t t) const { return slots_.at(t); }
  // Commits the pass's T rows to the cache (all T, dropped rows included:
  // their rows past the layer they were dropped at are left unwritten) and
  // ends the pass.
  void end_pass(KVCache& cache);

 private:
  void check_pass(const KVCache& cache) const;
  void rope(float* x, size_t rows, size_t n_heads, size_t stride) const;  // in place

  LayerDims dims_;
  float rms_eps_, rope_theta_;
  std::vector<float> inv_freq_;  // [head_dim / 2]

  // The open pass.
  bool active_ = false;
  size_t T_ = 0, L_ = 0;
  const KVCache* cache_ = nullptr;
  // Per live row (rows dropped by keep_rows removed, order kept):
  std::vector<float> cos_, sin_;  // [T_live, head_dim / 2]
  std::vector<uint8_t> mask_;     // [T_live, L + T]: columns are cache rows
  std::vector<size_t> slots_;     // [T_live]: the row's cache row, L + original index

  // Scratch activations, sized by begin_pass.
  std::vector<float> norm_, q_, k_, v_, attn_, proj_, gate_, up_, vec_;
};

}  // namespace lever

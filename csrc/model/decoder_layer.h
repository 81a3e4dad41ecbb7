// One Llama / Qwen2 decoder layer in fp32, and the per-pass state around it.
//
// A forward pass of T new tokens over a cache of L committed rows is:
//   model.begin_pass(positions, mask, cache)   rotary tables, the [T, L + T] mask
//   for each layer i: model.layer(x, layout_i, buffer_i, cache, i)
//   model.end_pass(cache)                      cache.length += T
// A pass may also carry several SEGMENTS (one per sequence, e.g. the trees of
// several sessions of a verifier server): segment s has its own cache (L_s
// committed rows), T_s rows, their positions and a [T_s, L_s + T_s] mask.
// Its rows are rows row0_s .. row0_s + T_s of x (segments in order). Norms,
// projections and the MLP run over the rows of all segments at once (the
// weights are read once per pass); each segment's keys / values go to its own
// cache and its queries attend over its own cache only (a block-diagonal
// mask). The one-cache pass is the one-segment case of the same code.
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

// One segment of a pass (see the top of this file): T rows at `positions`,
// mask: T rows of mask_cols = cache->length() + T bytes (non-zero: may attend).
struct PassSegment {
  const int64_t* positions;
  size_t T;
  const uint8_t* mask;
  size_t mask_cols;
  const KVCache* cache;
};

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
  // Starts a pass of several segments (at least one), each checked as
  // begin_pass checks its one cache; the caches must be distinct objects
  // (std::invalid_argument otherwise). Nothing is changed on an error.
  void begin_segments(const std::vector<PassSegment>& segments);
  // Runs layer `layer_index` on x [T_live, hidden] (contiguous, in place);
  // x_rows must equal live_rows() (the pass's T until keep_rows drops rows).
  // Row t's keys / values go to cache row slot(t); its queries attend over the
  // L + T cache rows of the pass that its mask row allows.
  void layer(float* x, size_t x_rows, const LayerLayout& layout, const uint8_t* buffer, size_t buffer_nbytes,
             KVCache& cache, size_t layer_index);
  // The same over a pass of segments: caches[s] is segment s's cache (the
  // ones begin_segments was given, in order). x holds the rows of every
  // segment, segment by segment.
  void layer_segments(float* x, size_t x_rows, const LayerLayout& layout, const uint8_t* buffer,
                      size_t buffer_nbytes, KVCache* const* caches, size_t n_caches, size_t layer_index);
  // Keeps live rows keep[0..n) of the pass, in order: x row i <- row keep[i]
  // (x: x_rows = live_rows() rows of hidden floats, compacted in place), and
  // likewise each row's rotary angles, mask row and cache slot. keep indexes
  // the live rows at the time of the call (it may be called several times in
  // a pass) and must be strictly increasing, start at 0 (the first row is
  // always kept) and stay below live_rows(); std::invalid_argument otherwise
  // (nothing changed). The mask keeps its L + T columns: kept rows still see
  // the original rows they saw, and must never see a dropped one (the caller
  // keeps ancestor-closed sets; not checked here). A pass of one segment only
  // (std::invalid_argument for more).
  void keep_rows(float* x, size_t x_rows, const int64_t* keep, size_t n);
  // Rows still running in the open pass (0 if none is open).
  size_t live_rows() const { return active_ ? slots_.size() : 0; }
  // Segments of the open pass (0 if none is open).
  size_t segments() const { return active_ ? segs_.size() : 0; }
  // Cache row of live row t (L + its original index in the pass).
  size_t slot(size_t t) const { return slots_.at(t); }
  // Commits the pass's T rows to the cache (all T, dropped rows included:
  // their rows past the layer they were dropped at are left unwritten) and
  // ends the pass.
  void end_pass(KVCache& cache);
  // Commits every segment's rows to its cache (caches as layer_segments) and ends the pass.
  void end_segments(KVCache* const* caches, size_t n_caches);

 private:
  // Segment s of the open pass.
  struct Segment {
    const KVCache* cache;
    size_t T, L;     // rows of the pass, committed cache rows before it
    size_t live;     // rows still running (T until keep_rows)
    size_t row0;     // its first row in x (and in cos_, sin_, slots_)
    size_t mask0;    // its mask's first byte in mask_ (rows of L + T bytes)
  };

  void check_caches(KVCache* const* caches, size_t n_caches, const char* what) const;
  void rope(float* x, size_t rows, size_t n_heads, size_t stride) const;  // in place

  LayerDims dims_;
  float rms_eps_, rope_theta_;
  std::vector<float> inv_freq_;  // [head_dim / 2]

  // The open pass.
  bool active_ = false;
  std::vector<Segment> segs_;
  // Per live row (rows dropped by keep_rows removed, order kept), all segments:
  std::vector<float> cos_, sin_;  // [T_live, head_dim / 2]
  std::vector<uint8_t> mask_;     // per segment [T_live_s, L_s + T_s]: columns are its cache rows
  std::vector<size_t> slots_;     // [T_live]: the row's cache row, L_s + original index

  // Scratch activations, sized by begin_segments.
  std::vector<float> norm_, q_, k_, v_, attn_, proj_, gate_, up_, vec_;
};

}  // namespace lever

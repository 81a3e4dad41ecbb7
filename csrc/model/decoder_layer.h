// One decoder layer in fp32, as a BlockSpec describes it, and the per-pass
// state around it.  The block (lever.model_config.ModelConfig is the
// description this mirrors; each feature is switched on by its field):
//   h = rms_norm(x) ; q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)
//   q, k = rms_norm of each head (q_norm, k_norm)                   qk_norm
//   q, k rotated by RoPE (rotate-half) on their first rope_dims dims;
//     "n" layers skip it; "l" layers use the local base
//   k, v appended to the cache at rows L..L+T
//   a = attention(q * attn_scale, cache keys/values, mask) Wo^T;
//     on "l" layers the mask also hides keys more than window-1 positions back
//   a = rms_norm(a) (sandwich_norms) ; x += a
//   h = rms_norm(x) ; m = (act(h Wgate^T) * h Wup^T) Wdown^T   act: silu / gelu-tanh
//   m = rms_norm(m) (sandwich_norms) ; x += m
//
// A forward pass of T new tokens over a cache of L committed rows is:
//   model.begin_pass(positions, mask, cache)   rotary tables, the [T, L + T] mask
//   for each layer i: model.layer(x, layout_i, buffer_i, cache, i)
//   model.end_pass(cache)                      cache.length += T
// A cache row's position is its row index (committed rows 0..L-1 hold
// positions 0..L-1, as every caller commits them); the sliding window reads
// the positions of cache rows from that. A cache whose "l" layers are
// windowed (KVCache windows) holds only their last rows: begin_pass lets it
// slide (KVCache::prepare) and "l" layers attend over the cache rows
// [base, L + T) it still holds, with the window mask cropped to them (the
// rows below base are outside every window of the pass: the same bits).
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
// Every step is row-independent: a row's result depends only on that row,
// its position and the cache rows its mask lets it see (bitwise), so a token
// verified inside a tree gets exactly the numbers it gets decoded alone.
//
// Units: sizes are elements; positions are token positions; rms_eps is
// added to the mean square; RoPE bases are theta of the frequency ladder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
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

enum class Activation { kSilu, kGeluTanh };
enum class LayerKind : uint8_t { kGlobal, kLocal, kNoRope };

// What a decoder layer computes (see the top of this file).
struct BlockSpec {
  LayerDims dims;                 // includes the qk_norm / sandwich_norms flags
  float rms_eps = 1e-6f;
  float rope_theta = 10000.0f;    // global layers
  float rope_theta_local = 0.0f;  // "l" layers (0: rope_theta)
  size_t rope_dims = 0;           // dims rotated per head (0: head_dim)
  float rope_linear = 1.0f;       // global layers' frequencies divided by it
  std::vector<float> rope_freq_factors;  // [rope_dims / 2] frequencies divided by them (empty: none)
  float rope_attn_factor = 1.0f;  // cos, sin multiplied by it
  float attn_scale = 0.0f;        // queries' scale (0: 1 / sqrt(head_dim))
  Activation activation = Activation::kSilu;
  size_t sliding_window = 0;      // tokens an "l" layer's query sees, itself included
  std::vector<LayerKind> layer_kinds;  // per layer (empty: all global)
};

// One segment of a pass (see the top of this file): T rows at `positions`,
// mask: T rows of mask_cols = cache->length() + T bytes (non-zero: may attend).
// begin_segments prepares the cache for the pass (a windowed cache may slide).
struct PassSegment {
  const int64_t* positions;
  size_t T;
  const uint8_t* mask;
  size_t mask_cols;
  KVCache* cache;
};

class NativeModel {
 public:
  // Throws std::invalid_argument for an inconsistent spec (n_heads not a
  // multiple of n_kv_heads, odd or too many rotated dims, zero sizes, factors
  // of the wrong count, local layers without a window).
  explicit NativeModel(const BlockSpec& spec);

  const BlockSpec& spec() const { return spec_; }
  const LayerDims& dims() const { return dims_; }
  float rms_eps() const { return rms_eps_; }
  float rope_theta() const { return spec_.rope_theta; }
  LayerKind kind(size_t layer) const {
    return layer < spec_.layer_kinds.size() ? spec_.layer_kinds[layer] : LayerKind::kGlobal;
  }

  // Throws std::invalid_argument naming the bad or missing tensor.
  void check_layout(const LayerLayout& layout, size_t buffer_nbytes) const;

  // Starts a pass of T tokens: positions [T]; mask: T rows of cache.length + T
  // bytes (non-zero: may attend), copied. Throws std::invalid_argument for a
  // cache of other dims or with a window on a layer that is not "l" (or one
  // shorter than sliding_window), std::runtime_error if length + T > capacity
  // or if a mask row of an "l" layer sees a cache row the cache dropped.
  // Then prepares the cache for the pass (KVCache::prepare).
  void begin_pass(const int64_t* positions, size_t T, const uint8_t* mask, size_t mask_cols,
                  KVCache& cache);
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
    size_t wbase;    // first cache row its "l" layers attend over (the cache's base)
    size_t wmask0;   // its window mask's first byte in window_mask_ (rows of L + T - wbase bytes)
  };

  // Rotary angles of one kind of layer: per live row, [rope_dims / 2] cos and sin.
  struct RopeTable {
    std::vector<float> inv_freq;  // [rope_dims / 2]
    std::vector<float> cos, sin;  // [T_live, rope_dims / 2]
  };

  // The tables a pass fills: the global one, and the local one where some layer is "l".
  std::vector<RopeTable*> rope_tables() {
    if (has_local_) return {&rope_global_, &rope_local_};
    return {&rope_global_};
  }
  void check_caches(KVCache* const* caches, size_t n_caches, const char* what) const;
  // The first cache row every "l" layer of the model still holds in `cache`.
  size_t window_base(const KVCache& cache) const;
  // begin_segments' checks of a cache's windows (see begin_pass).
  void check_window_rows(const std::string& where, const PassSegment& g, const KVCache& cache) const;
  void rope(const RopeTable& table, float* x, size_t rows, size_t n_heads, size_t stride) const;  // in place

  BlockSpec spec_;
  LayerDims dims_;
  float rms_eps_;
  size_t rope_half_;               // rotated pairs per head
  bool has_local_ = false;         // some layer is "l"
  RopeTable rope_global_, rope_local_;

  // The open pass.
  bool active_ = false;
  std::vector<Segment> segs_;
  // Per live row (rows dropped by keep_rows removed, order kept), all segments:
  std::vector<uint8_t> mask_;     // per segment [T_live_s, L_s + T_s]: columns are its cache rows
  std::vector<uint8_t> window_mask_;  // per segment [T_live_s, L_s + T_s - wbase_s]: the sliding window
                                      // applied, columns cache rows wbase_s.. ("l" layers; has_local_ only)
  std::vector<size_t> slots_;     // [T_live]: the row's cache row, L_s + original index

  // Scratch activations, sized by begin_segments.
  std::vector<float> norm_, q_, k_, v_, attn_, proj_, gate_, up_, vec_;
};

}  // namespace lever

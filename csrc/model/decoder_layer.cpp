// Decoder layer (see decoder_layer.h).
//
// SIMD: the element-wise steps are plain loops. On aarch64 (GCC 12 -O3,
// ASIMD baseline; checked with -fopt-info-vec and objdump) the compiler
// vectorises the rms_norm sum of squares (16 lanes) and scaling, the RoPE
// rotation and the residual adds, so they have no hand-written NEON. The
// gate activations use gate_exp (below), plain float arithmetic the compiler
// vectorises, instead of the C library's expf / tanhf calls (measured on
// Gemma 3 270M, 64 rows, 2 threads: the layers took 90 ms with tanhf, 55 ms
// with SiLU's expf). Bits may differ between architectures: GCC fuses a * b + c here
// on aarch64 (FMA is baseline) but not on baseline x86-64; exactness is
// always the target against itself on one machine, never across machines.

#include "model/decoder_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/attention.h"
#include "kernels/dequant.h"
#include "model/dense_matmul.h"

namespace lever {
namespace {

constexpr size_t kLanes = 16;
constexpr float kSqrt2OverPi = 0.7978845608028654f;


// exp(x) for the gate activations, in plain float arithmetic the compiler
// vectorises (the C library's expf / tanhf are calls it cannot, and were a
// third of a Gemma 3 layer): x = k ln2 + r with k = round(x / ln2) (the
// 1.5 * 2^23 rounding trick, exact in round-to-nearest), ln2 in two parts
// (Cody-Waite), exp(r) by its degree-7 Taylor polynomial on |r| <= ln2 / 2
// (truncation below 2e-9 relative, so the result is within a few ulp of
// expf), times 2^k built in the exponent bits. x is clamped to [-87, 88],
// where 2^k stays a normal float: exp(-87) ~ 1.6e-38 and exp(88) ~ 1.7e38,
// so 1 + exp(...) never overflows. The same operations in the same order for
// every element of every row: the vector body and the scalar tail round alike
// (no FMA contraction on baseline x86-64; on aarch64 GCC contracts both the
// same way), so a row's result does not depend on which one computed it.
inline float gate_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);  // a select: vectorised with -fno-trapping-math (CMakeLists.txt)
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23
  const float k = (x * 1.44269504088896341f + kShifter) - kShifter;
  const float r = (x - k * 0.693359375f) - k * -2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// A norm / bias vector (F32, F16 or BF16 bytes) as fp32 values in dst.
const float* vector_f32(const TensorView& t, std::vector<float>& dst) {
  dst.resize(t.cols);
  dequantize_to_f32(t.data, row_bytes(t.type, t.cols), t.type, dst.data(), t.cols);
  return dst.data();
}

// y [T, N] (+)= x [T, K] W^T, plus the bias when there is one.
void project(const float* x, size_t T, size_t K, const TensorView& w, const TensorView* bias,
             std::vector<float>& vec, float* y) {
  weight_matmul(x, T, K, K, w.data, w.type, w.rows, y, w.rows);
  if (bias && bias->data) {
    const float* b = vector_f32(*bias, vec);
    for (size_t t = 0; t < T; ++t) {
      for (size_t n = 0; n < w.rows; ++n) y[t * w.rows + n] += b[n];
    }
  }
}

}  // namespace

float dot_f32(const float* a, const float* b, size_t n) {
  float acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) acc[i % kLanes] += a[i] * b[i];
  for (size_t w = kLanes / 2; w > 0; w /= 2) {
    for (size_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0];
}

void rms_norm_rows(const float* x, size_t R, size_t n, size_t x_stride, const float* w, float eps,
                   float* out, size_t out_stride) {
  for (size_t r = 0; r < R; ++r) {
    const float* xr = x + r * x_stride;
    float* o = out + r * out_stride;
    const float inv = 1.0f / std::sqrt(dot_f32(xr, xr, n) / static_cast<float>(n) + eps);
    for (size_t i = 0; i < n; ++i) o[i] = w[i] * (xr[i] * inv);
  }
}

NativeModel::NativeModel(const BlockSpec& spec)
    : spec_(spec), dims_(spec.dims), rms_eps_(spec.rms_eps) {
  const LayerDims& dims = dims_;
  if (dims.hidden == 0 || dims.n_heads == 0 || dims.n_kv_heads == 0 || dims.head_dim == 0 ||
      dims.intermediate == 0) {
    throw std::invalid_argument("NativeModel: sizes must be positive");
  }
  if (dims.n_heads % dims.n_kv_heads != 0) {
    throw std::invalid_argument("NativeModel: n_heads must be a multiple of n_kv_heads");
  }
  const size_t rot = spec.rope_dims ? spec.rope_dims : dims.head_dim;
  if (rot % 2 != 0 || rot > dims.head_dim) {
    throw std::invalid_argument("NativeModel: the rotated dims must be even and at most head_dim");
  }
  rope_half_ = rot / 2;
  if (!spec.rope_freq_factors.empty() && spec.rope_freq_factors.size() != rope_half_) {
    throw std::invalid_argument("NativeModel: rope_freq_factors must hold rope_dims / 2 = " +
                                std::to_string(rope_half_) + " factors");
  }
  if (!(spec.rope_linear > 0.0f) || !(spec.rope_attn_factor > 0.0f) || !(spec.rope_theta > 0.0f)) {
    throw std::invalid_argument("NativeModel: RoPE base, linear factor and attention factor must be positive");
  }
  for (LayerKind k : spec.layer_kinds) has_local_ = has_local_ || k == LayerKind::kLocal;
  if (has_local_ && spec.sliding_window == 0) {
    throw std::invalid_argument("NativeModel: local layers need a sliding window of at least one token");
  }
  // As torch: inv_freq = 1 / (theta ** (arange(0, d, 2) / d)), all fp32, then
  // divided by the frequency factors and (global layers) the linear factor.
  auto ladder = [&](float theta, bool global) {
    std::vector<float> f(rope_half_);
    for (size_t i = 0; i < rope_half_; ++i) {
      const float e = static_cast<float>(2 * i) / static_cast<float>(rot);
      f[i] = 1.0f / std::pow(theta, e);
      if (!spec.rope_freq_factors.empty()) f[i] = f[i] / spec.rope_freq_factors[i];
      if (global && spec.rope_linear != 1.0f) f[i] = f[i] / spec.rope_linear;
    }
    return f;
  };
  rope_global_.inv_freq = ladder(spec.rope_theta, true);
  rope_local_.inv_freq = ladder(spec.rope_theta_local > 0.0f ? spec.rope_theta_local : spec.rope_theta, false);
}

void NativeModel::check_layout(const LayerLayout& layout, size_t buffer_nbytes) const {
  layout.resolve(dims_, nullptr, buffer_nbytes);
}

void NativeModel::begin_pass(const int64_t* positions, size_t T, const uint8_t* mask,
                             size_t mask_cols, KVCache& cache) {
  begin_segments({PassSegment{positions, T, mask, mask_cols, &cache}});
}

void NativeModel::begin_segments(const std::vector<PassSegment>& segments) {
  if (segments.empty()) throw std::invalid_argument("begin_pass: a pass needs at least one segment");
  for (size_t s = 0; s < segments.size(); ++s) {
    const PassSegment& g = segments[s];
    const std::string where =
        segments.size() > 1 ? "begin_pass: segment " + std::to_string(s) + ": " : "begin_pass: ";
    const KVCache& cache = *g.cache;
    if (cache.n_kv_heads() != dims_.n_kv_heads || cache.head_dim() != dims_.head_dim) {
      throw std::invalid_argument(where + "the cache has " + std::to_string(cache.n_kv_heads()) +
                                  " kv heads of " + std::to_string(cache.head_dim()) +
                                  " values; the model has " + std::to_string(dims_.n_kv_heads) +
                                  " of " + std::to_string(dims_.head_dim));
    }
    const size_t L = cache.length();
    if (g.mask_cols != L + g.T) {
      throw std::invalid_argument(where + "mask has " + std::to_string(g.mask_cols) +
                                  " columns, expected cache.length + T = " + std::to_string(L + g.T));
    }
    for (size_t r = 0; r < s; ++r) {
      if (segments[r].cache == g.cache) {
        throw std::invalid_argument(where + "its cache is also segment " + std::to_string(r) +
                                    "'s (each segment needs its own cache)");
      }
    }
    cache.check_fits(L + g.T);
    check_window_rows(where, g, cache);
  }
  active_ = false;
  segs_.clear();
  size_t rows = 0, mask_bytes = 0, window_bytes = 0;
  for (const PassSegment& g : segments) {
    const size_t L = g.cache->length();
    int64_t lowest = static_cast<int64_t>(L);  // the pass's lowest position (the cache keeps its window)
    for (size_t t = 0; t < g.T; ++t) lowest = std::min(lowest, g.positions[t]);
    g.cache->prepare(g.T, static_cast<size_t>(std::max<int64_t>(0, lowest)));
    const size_t wbase = has_local_ ? window_base(*g.cache) : 0;
    segs_.push_back(Segment{g.cache, g.T, L, g.T, rows, mask_bytes, wbase, window_bytes});
    rows += g.T;
    mask_bytes += g.T * (L + g.T);
    window_bytes += g.T * (L + g.T - wbase);
  }
  const size_t T = rows;
  mask_.resize(mask_bytes);
  slots_.resize(T);
  // Rotary tables: angle = position * inv_freq (fp32), as rope_cos_sin in torch.
  const size_t half = rope_half_;
  const float af = spec_.rope_attn_factor;
  const std::vector<RopeTable*> tables = rope_tables();
  for (RopeTable* table : tables) {
    table->cos.resize(T * half);
    table->sin.resize(T * half);
  }
  for (size_t s = 0; s < segments.size(); ++s) {
    const PassSegment& g = segments[s];
    const Segment& seg = segs_[s];
    const size_t mask_n = g.T * (seg.L + g.T);
    if (mask_n > 0) std::memcpy(mask_.data() + seg.mask0, g.mask, mask_n);
    for (size_t t = 0; t < g.T; ++t) {
      const size_t row = seg.row0 + t;
      slots_[row] = seg.L + t;
      const float p = static_cast<float>(g.positions[t]);
      for (RopeTable* table : tables) {
        for (size_t i = 0; i < half; ++i) {
          const float angle = p * table->inv_freq[i];
          table->cos[row * half + i] = af == 1.0f ? std::cos(angle) : std::cos(angle) * af;
          table->sin[row * half + i] = af == 1.0f ? std::sin(angle) : std::sin(angle) * af;
        }
      }
    }
  }
  // The sliding window: a row at position p sees a key at position k only if
  // p - k < window (cache row c < L holds position c; pass row j, position[j]),
  // over the cache rows wbase.. the "l" layers hold (check_window_rows: the
  // rows below are outside every window of the pass).
  window_mask_.clear();
  if (has_local_) {
    window_mask_.resize(window_bytes);
    const auto window = static_cast<int64_t>(spec_.sliding_window);
    for (size_t s = 0; s < segments.size(); ++s) {
      const PassSegment& g = segments[s];
      const Segment& seg = segs_[s];
      const size_t cols = seg.L + g.T, wcols = cols - seg.wbase;
      for (size_t t = 0; t < g.T; ++t) {
        const uint8_t* src = mask_.data() + seg.mask0 + t * cols + seg.wbase;
        uint8_t* m = window_mask_.data() + seg.wmask0 + t * wcols;
        const int64_t p = g.positions[t];
        for (size_t j = 0; j < wcols; ++j) {
          const size_t c = seg.wbase + j;
          const int64_t k = c < seg.L ? static_cast<int64_t>(c) : g.positions[c - seg.L];
          m[j] = p - k >= window ? 0 : src[j];
        }
      }
    }
  }

  const size_t q_cols = dims_.n_heads * dims_.head_dim, kv_cols = dims_.n_kv_heads * dims_.head_dim;
  norm_.resize(T * dims_.hidden);
  q_.resize(T * q_cols);
  k_.resize(T * kv_cols);
  v_.resize(T * kv_cols);
  attn_.resize(T * q_cols);
  proj_.resize(T * dims_.hidden);
  gate_.resize(T * dims_.intermediate);
  up_.resize(T * dims_.intermediate);
  active_ = true;
}

void NativeModel::check_caches(KVCache* const* caches, size_t n_caches, const char* what) const {
  if (!active_) throw std::invalid_argument(std::string(what) + ": no pass open: call begin_pass first");
  if (n_caches != segs_.size()) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(n_caches) +
                                " caches for a pass of " + std::to_string(segs_.size()) + " segments");
  }
  for (size_t s = 0; s < n_caches; ++s) {
    if (caches[s] != segs_[s].cache || caches[s]->length() != segs_[s].L) {
      throw std::invalid_argument(std::string(what) + ": the cache" +
                                  (n_caches > 1 ? " of segment " + std::to_string(s) : std::string()) +
                                  " is not the one begin_pass was given, or it changed");
    }
  }
}

size_t NativeModel::window_base(const KVCache& cache) const {
  size_t b = 0;
  for (size_t l = 0; l < cache.n_layers(); ++l) {
    if (kind(l) == LayerKind::kLocal) b = std::max(b, cache.base(l));
  }
  return b;
}

void NativeModel::check_window_rows(const std::string& where, const PassSegment& g, const KVCache& cache) const {
  for (size_t l = 0; l < cache.n_layers(); ++l) {
    const size_t w = cache.window(l);
    if (w == 0) continue;
    if (kind(l) != LayerKind::kLocal || w < spec_.sliding_window) {
      throw std::invalid_argument(where + "the cache keeps a window of " + std::to_string(w) + " rows on layer " +
                                  std::to_string(l) + ", which " +
                                  (kind(l) != LayerKind::kLocal ? std::string("is not a sliding-window layer")
                                                                : "sees " + std::to_string(spec_.sliding_window)));
    }
  }
  if (!has_local_) return;
  // Mask bits of cache rows below the base inside a row's window: rows the
  // "l" layers no longer hold.
  const size_t L = cache.length(), held = std::min(window_base(cache), L);
  const auto window = static_cast<int64_t>(spec_.sliding_window);
  for (size_t t = 0; t < g.T; ++t) {
    const int64_t p = g.positions[t];
    const size_t lo = p > window - 1 ? static_cast<size_t>(p - (window - 1)) : 0;
    for (size_t c = lo; c < held; ++c) {
      if (g.mask[t * g.mask_cols + c]) {
        throw std::runtime_error(where + "row " + std::to_string(t) + " (position " + std::to_string(p) +
                                 ") sees cache row " + std::to_string(c) +
                                 ", which the cache's sliding-window layers dropped (they hold rows from " +
                                 std::to_string(held) + " on)");
      }
    }
  }
}

void NativeModel::rope(const RopeTable& table, float* x, size_t rows, size_t n_heads, size_t stride) const {
  // Rotate-half over the first 2 * half dims of each head: for i < half,
  // (a, b) = (x[i], x[i + half]) becomes (a cos - b sin, b cos + a sin), as
  // x * cos + rotate_half(x) * sin in torch; the dims past 2 * half stay.
  const size_t d = dims_.head_dim, half = rope_half_;
  for (size_t t = 0; t < rows; ++t) {
    const float* c = table.cos.data() + t * half;
    const float* s = table.sin.data() + t * half;
    for (size_t h = 0; h < n_heads; ++h) {
      float* v = x + t * stride + h * d;
      for (size_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] + (-b) * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

void NativeModel::layer(float* x, size_t x_rows, const LayerLayout& layout, const uint8_t* buffer,
                        size_t buffer_nbytes, KVCache& cache, size_t layer_index) {
  KVCache* caches[1] = {&cache};
  layer_segments(x, x_rows, layout, buffer, buffer_nbytes, caches, 1, layer_index);
}

void NativeModel::layer_segments(float* x, size_t x_rows, const LayerLayout& layout, const uint8_t* buffer,
                                 size_t buffer_nbytes, KVCache* const* caches, size_t n_caches,
                                 size_t layer_index) {
  check_caches(caches, n_caches, "layer");
  const size_t T = live_rows();  // rows still running, all segments (the pass's T until keep_rows)
  if (x_rows != T) {
    throw std::invalid_argument("x has " + std::to_string(x_rows) + " rows, the pass has " +
                                std::to_string(T) + " live rows");
  }
  for (size_t s = 0; s < n_caches; ++s) {
    if (layer_index >= caches[s]->n_layers()) {
      throw std::invalid_argument("layer index " + std::to_string(layer_index) +
                                  " is outside the cache's " + std::to_string(caches[s]->n_layers()) +
                                  " layers");
    }
  }
  const LayerTensors w = layout.resolve(dims_, buffer, buffer_nbytes);
  const size_t H = dims_.hidden, d = dims_.head_dim;
  const size_t q_cols = dims_.n_heads * d, kv_cols = dims_.n_kv_heads * d;
  if (T == 0) return;

  // Attention block: projections over every row of every segment at once.
  rms_norm_rows(x, T, H, H, vector_f32(w.input_norm, vec_), rms_eps_, norm_.data(), H);
  project(norm_.data(), T, H, w.q, w.has_bias ? &w.q_bias : nullptr, vec_, q_.data());
  project(norm_.data(), T, H, w.k, w.has_bias ? &w.k_bias : nullptr, vec_, k_.data());
  project(norm_.data(), T, H, w.v, w.has_bias ? &w.v_bias : nullptr, vec_, v_.data());
  if (dims_.qk_norm) {  // each head's q / k over its head_dim values
    rms_norm_rows(q_.data(), T * dims_.n_heads, d, d, vector_f32(w.q_norm, vec_), rms_eps_, q_.data(), d);
    rms_norm_rows(k_.data(), T * dims_.n_kv_heads, d, d, vector_f32(w.k_norm, vec_), rms_eps_, k_.data(), d);
  }
  const LayerKind kind = this->kind(layer_index);
  if (kind != LayerKind::kNoRope) {
    const RopeTable& table = kind == LayerKind::kLocal ? rope_local_ : rope_global_;
    rope(table, q_.data(), T, dims_.n_heads, q_cols);
    rope(table, k_.data(), T, dims_.n_kv_heads, kv_cols);
  }
  const float scale = spec_.attn_scale > 0.0f ? spec_.attn_scale : 1.0f / std::sqrt(static_cast<float>(d));
  // Per segment: its keys / values to its own cache, its live queries over
  // the L + T rows of its own cache (mask rows of L + T columns).
  for (size_t s = 0; s < n_caches; ++s) {
    const Segment& g = segs_[s];
    if (g.live == 0) continue;
    KVCache& cache = *caches[s];
    cache.write_rows(layer_index, k_.data() + g.row0 * kv_cols, v_.data() + g.row0 * kv_cols,
                     slots_.data() + g.row0, g.live, kv_cols);
    // "l" layers: the cache rows [wbase, L + T) under the cropped window mask.
    const bool local = kind == LayerKind::kLocal;
    const size_t b = local ? g.wbase : 0;
    const uint8_t* mask = local ? window_mask_.data() + g.wmask0 : mask_.data() + g.mask0;
    const AttentionShape shape{dims_.n_heads, dims_.n_kv_heads, g.live, g.L + g.T - b, d};
    attention(shape, q_.data() + g.row0 * q_cols, ElemType::kF32, /*q_head=*/d, /*q_row=*/q_cols,
              cache.keys_at(layer_index, b), cache.values_at(layer_index, b), cache.dtype(),
              cache.head_stride(layer_index), cache.row_stride(), mask, scale,
              attn_.data() + g.row0 * q_cols, ElemType::kF32, q_cols);
  }
  project(attn_.data(), T, q_cols, w.o, nullptr, vec_, proj_.data());
  if (dims_.sandwich_norms) {
    rms_norm_rows(proj_.data(), T, H, H, vector_f32(w.attn_out_norm, vec_), rms_eps_, proj_.data(), H);
  }
  for (size_t i = 0; i < T * H; ++i) x[i] += proj_[i];

  // MLP block (gated: SwiGLU or GeGLU).
  rms_norm_rows(x, T, H, H, vector_f32(w.post_norm, vec_), rms_eps_, norm_.data(), H);
  project(norm_.data(), T, H, w.gate, nullptr, vec_, gate_.data());
  project(norm_.data(), T, H, w.up, nullptr, vec_, up_.data());
  const size_t I = dims_.intermediate;
  const bool gelu = spec_.activation == Activation::kGeluTanh;
  for (size_t t = 0; t < T; ++t) {  // row by row: the same loop shape for every row
    float* g = gate_.data() + t * I;
    const float* u = up_.data() + t * I;
    if (gelu) {  // gelu_tanh(g) * up: 0.5 g (1 + tanh(c)) = g / (1 + exp(-2c)), c = sqrt(2/pi) (g + 0.044715 g^3)
      for (size_t i = 0; i < I; ++i) {
        const float v = g[i];
        g[i] = v / (1.0f + gate_exp(-2.0f * kSqrt2OverPi * (v + 0.044715f * v * v * v))) * u[i];
      }
    } else {
      for (size_t i = 0; i < I; ++i) g[i] = g[i] / (1.0f + gate_exp(-g[i])) * u[i];  // silu(g) * up
    }
  }
  project(gate_.data(), T, I, w.down, nullptr, vec_, proj_.data());
  if (dims_.sandwich_norms) {
    rms_norm_rows(proj_.data(), T, H, H, vector_f32(w.mlp_out_norm, vec_), rms_eps_, proj_.data(), H);
  }
  for (size_t i = 0; i < T * H; ++i) x[i] += proj_[i];
}

void NativeModel::keep_rows(float* x, size_t x_rows, const int64_t* keep, size_t n) {
  if (!active_) throw std::invalid_argument("keep_rows: no pass open: call begin_pass first");
  if (segs_.size() != 1) {
    throw std::invalid_argument("keep_rows: a pass of " + std::to_string(segs_.size()) +
                                " segments cannot drop rows (early exit runs one sequence per pass)");
  }
  const size_t live = live_rows();
  if (x_rows != live) {
    throw std::invalid_argument("keep_rows: x has " + std::to_string(x_rows) +
                                " rows, the pass has " + std::to_string(live) + " live rows");
  }
  if (n == 0 || keep[0] != 0) {
    throw std::invalid_argument("keep_rows: keep must start with row 0 (the first row is always kept)");
  }
  for (size_t i = 1; i < n; ++i) {
    if (keep[i] <= keep[i - 1]) {
      throw std::invalid_argument("keep_rows: keep must be strictly increasing (keep[" +
                                  std::to_string(i) + "] = " + std::to_string(keep[i]) + ")");
    }
  }
  if (static_cast<size_t>(keep[n - 1]) >= live) {
    throw std::invalid_argument("keep_rows: keep[" + std::to_string(n - 1) + "] = " +
                                std::to_string(keep[n - 1]) + " is outside the " +
                                std::to_string(live) + " live rows");
  }
  // keep[i] >= i, so moving rows to the front in order never overwrites a
  // row before it is read.
  const size_t H = dims_.hidden, half = rope_half_, cols = segs_[0].L + segs_[0].T, wcols = cols - segs_[0].wbase;
  const std::vector<RopeTable*> tables = rope_tables();
  for (size_t i = 0; i < n; ++i) {
    const auto src = static_cast<size_t>(keep[i]);
    if (src == i) continue;
    std::memcpy(x + i * H, x + src * H, H * sizeof(float));
    for (RopeTable* table : tables) {
      std::memcpy(table->cos.data() + i * half, table->cos.data() + src * half, half * sizeof(float));
      std::memcpy(table->sin.data() + i * half, table->sin.data() + src * half, half * sizeof(float));
    }
    std::memcpy(mask_.data() + i * cols, mask_.data() + src * cols, cols);
    if (has_local_) std::memcpy(window_mask_.data() + i * wcols, window_mask_.data() + src * wcols, wcols);
    slots_[i] = slots_[src];
  }
  for (RopeTable* table : tables) {
    table->cos.resize(n * half);
    table->sin.resize(n * half);
  }
  mask_.resize(n * cols);
  if (has_local_) window_mask_.resize(n * wcols);
  slots_.resize(n);
  segs_[0].live = n;
}

void NativeModel::end_pass(KVCache& cache) {
  KVCache* caches[1] = {&cache};
  end_segments(caches, 1);
}

void NativeModel::end_segments(KVCache* const* caches, size_t n_caches) {
  check_caches(caches, n_caches, "end_pass");
  for (size_t s = 0; s < n_caches; ++s) caches[s]->advance(segs_[s].T);
  active_ = false;
  segs_.clear();
}

}  // namespace lever

// Native tests of the forward (model/decoder_layer.h): one decoder layer on a
// tiny random layer.
//  - model_layer_matches_reference: fp32 weights, compared with a plain
//    double-precision implementation of the same layer written here.
//  - model_layer_tree_rows_equal_sequential_decode: a token verified inside
//    a tree pass gets bit for bit the numbers it gets when its path is decoded
//    one token at a time (Q8_0 and F32 weights; fp32 and bf16 caches).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/dequant.h"
#include "kernels/qmatmul.h"
#include "model/decoder_layer.h"
#include "model/kv_cache.h"
#include "model/layer_layout.h"
#include "native_test.h"

using namespace lever;

namespace {

// hidden 64, 4 query heads and 2 kv heads of 16, intermediate 96: every
// matrix has K a multiple of 32 (Q8_0 blocks).
const LayerDims kDims{64, 4, 2, 16, 96};
const float kEps = 1e-5f;
const float kTheta = 10000.0f;

// A layer's tensors as fp32 values (what the weights decode to) plus its buffer.
struct TinyLayer {
  std::vector<uint8_t> buffer;
  std::vector<TensorEntry> entries;
  // Decoded fp32 values by name (for the reference).
  std::vector<std::pair<std::string, std::vector<float>>> values;

  const std::vector<float>& get(const std::string& name) const {
    for (const auto& v : values)
      if (v.first == name) return v.second;
    static const std::vector<float> none;
    return none;
  }
};

void append_tensor(TinyLayer& layer, const std::string& name, int type, size_t rows, size_t cols,
                   const std::vector<uint8_t>& bytes) {
  size_t offset = (layer.buffer.size() + 63) / 64 * 64;
  layer.buffer.resize(offset + bytes.size());
  std::memcpy(layer.buffer.data() + offset, bytes.data(), bytes.size());
  std::vector<size_t> shape = rows == 1 ? std::vector<size_t>{cols} : std::vector<size_t>{rows, cols};
  layer.entries.push_back({name, offset, type, shape});
  std::vector<float> decoded(rows * cols);
  dequantize_to_f32(bytes.data(), bytes.size(), type, decoded.data(), decoded.size());
  layer.values.emplace_back(name, std::move(decoded));
}

std::vector<uint8_t> random_f32_bytes(lever_test::Rng& rng, size_t n, float sd, float mean) {
  std::vector<uint8_t> b(n * 4);
  for (size_t i = 0; i < n; ++i) {
    float v = mean + rng.normal(sd);
    std::memcpy(&b[4 * i], &v, 4);
  }
  return b;
}

// Q8_0 blocks: fp16 scale in [2^-7, 2^-6) and 32 random int8 quants.
std::vector<uint8_t> random_q8_0_bytes(lever_test::Rng& rng, size_t n) {
  std::vector<uint8_t> b(n / 32 * 34);
  for (size_t blk = 0; blk < n / 32; ++blk) {
    uint16_t d = static_cast<uint16_t>(0x2000 + rng.next_u32() % 0x400);
    std::memcpy(&b[blk * 34], &d, 2);
    for (int j = 0; j < 32; ++j) b[blk * 34 + 2 + j] = static_cast<uint8_t>(rng.next_u32() >> 24);
  }
  return b;
}

TinyLayer make_layer(int matrix_type, uint64_t seed) {
  lever_test::Rng rng(seed);
  TinyLayer layer;
  const size_t H = kDims.hidden, qc = kDims.n_heads * kDims.head_dim,
               kvc = kDims.n_kv_heads * kDims.head_dim, I = kDims.intermediate;
  auto matrix = [&](const char* name, size_t rows, size_t cols) {
    std::vector<uint8_t> bytes = matrix_type == kTypeQ8_0
                                     ? random_q8_0_bytes(rng, rows * cols)
                                     : random_f32_bytes(rng, rows * cols, 0.15f, 0.0f);
    append_tensor(layer, name, matrix_type, rows, cols, bytes);
  };
  auto vec = [&](const char* name, size_t n, float sd, float mean) {
    append_tensor(layer, name, kTypeF32, 1, n, random_f32_bytes(rng, n, sd, mean));
  };
  vec("input_layernorm.weight", H, 0.1f, 1.0f);
  matrix("self_attn.q_proj.weight", qc, H);
  matrix("self_attn.k_proj.weight", kvc, H);
  matrix("self_attn.v_proj.weight", kvc, H);
  vec("self_attn.q_proj.bias", qc, 0.1f, 0.0f);
  vec("self_attn.k_proj.bias", kvc, 0.1f, 0.0f);
  vec("self_attn.v_proj.bias", kvc, 0.1f, 0.0f);
  matrix("self_attn.o_proj.weight", H, qc);
  vec("post_attention_layernorm.weight", H, 0.1f, 1.0f);
  matrix("mlp.gate_proj.weight", I, H);
  matrix("mlp.up_proj.weight", I, H);
  matrix("mlp.down_proj.weight", H, I);
  return layer;
}

std::vector<float> random_rows(lever_test::Rng& rng, size_t T) {
  std::vector<float> x(T * kDims.hidden);
  for (float& v : x) v = rng.normal(1.0f);
  return x;
}

// Runs one pass of x [T, hidden] through the layer (in place) and commits it.
void run_pass(NativeModel& model, const TinyLayer& layer, KVCache& cache, std::vector<float>& x,
              const std::vector<int64_t>& positions, const std::vector<uint8_t>& mask) {
  const size_t T = positions.size();
  LayerLayout layout(layer.entries);
  model.begin_pass(positions.data(), T, mask.data(), cache.length() + T, cache);
  model.layer(x.data(), T, layout, layer.buffer.data(), layer.buffer.size(), cache, 0);
  model.end_pass(cache);
}

// Causal mask for T new rows after L cached ones.
std::vector<uint8_t> causal_mask(size_t L, size_t T) {
  std::vector<uint8_t> m(T * (L + T), 0);
  for (size_t t = 0; t < T; ++t)
    for (size_t c = 0; c <= L + t; ++c) m[t * (L + T) + c] = 1;
  return m;
}

// y[n] = sum_k x[k] W[n, k] (+ b[n]) in double.
std::vector<double> ref_linear(const std::vector<double>& x, const std::vector<float>& w,
                               size_t N, const std::vector<float>* b) {
  const size_t K = x.size();
  std::vector<double> y(N);
  for (size_t n = 0; n < N; ++n) {
    double s = b ? (*b)[n] : 0.0;
    for (size_t k = 0; k < K; ++k) s += x[k] * w[n * K + k];
    y[n] = s;
  }
  return y;
}

std::vector<double> ref_rms_norm(const std::vector<double>& x, const std::vector<float>& w) {
  double ms = 0;
  for (double v : x) ms += v * v;
  const double inv = 1.0 / std::sqrt(ms / x.size() + kEps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * x[i] * inv;
  return y;
}

void ref_rope(std::vector<double>& v, size_t n_heads, int64_t pos) {
  const size_t d = kDims.head_dim, half = d / 2;
  for (size_t h = 0; h < n_heads; ++h)
    for (size_t i = 0; i < half; ++i) {
      const double inv_freq = 1.0 / std::pow(static_cast<double>(kTheta), 2.0 * i / d);
      const double c = std::cos(pos * inv_freq), s = std::sin(pos * inv_freq);
      const double a = v[h * d + i], b = v[h * d + i + half];
      v[h * d + i] = a * c - b * s;
      v[h * d + i + half] = b * c + a * s;
    }
}

// The layer on a causal sequence of T rows from position 0, in double.
std::vector<double> ref_layer(const TinyLayer& L, const std::vector<float>& x_in, size_t T) {
  const size_t H = kDims.hidden, d = kDims.head_dim, nh = kDims.n_heads, nkv = kDims.n_kv_heads;
  const size_t qc = nh * d, kvc = nkv * d, I = kDims.intermediate;
  std::vector<std::vector<double>> x(T), q(T), k(T), v(T);
  for (size_t t = 0; t < T; ++t) {
    x[t].assign(x_in.begin() + t * H, x_in.begin() + (t + 1) * H);
    std::vector<double> h = ref_rms_norm(x[t], L.get("input_layernorm.weight"));
    q[t] = ref_linear(h, L.get("self_attn.q_proj.weight"), qc, &L.get("self_attn.q_proj.bias"));
    k[t] = ref_linear(h, L.get("self_attn.k_proj.weight"), kvc, &L.get("self_attn.k_proj.bias"));
    v[t] = ref_linear(h, L.get("self_attn.v_proj.weight"), kvc, &L.get("self_attn.v_proj.bias"));
    ref_rope(q[t], nh, static_cast<int64_t>(t));
    ref_rope(k[t], nkv, static_cast<int64_t>(t));
  }
  std::vector<double> out(T * H);
  for (size_t t = 0; t < T; ++t) {
    std::vector<double> attn(qc, 0.0);
    for (size_t hd = 0; hd < nh; ++hd) {
      const size_t g = hd / (nh / nkv);
      std::vector<double> s(t + 1);
      double mx = -1e300;
      for (size_t j = 0; j <= t; ++j) {
        double dot = 0;
        for (size_t i = 0; i < d; ++i) dot += q[t][hd * d + i] * k[j][g * d + i];
        s[j] = dot / std::sqrt(static_cast<double>(d));
        mx = std::max(mx, s[j]);
      }
      double z = 0;
      for (double& e : s) z += (e = std::exp(e - mx));
      for (size_t j = 0; j <= t; ++j)
        for (size_t i = 0; i < d; ++i) attn[hd * d + i] += s[j] / z * v[j][g * d + i];
    }
    std::vector<double> o = ref_linear(attn, L.get("self_attn.o_proj.weight"), H, nullptr);
    for (size_t i = 0; i < H; ++i) x[t][i] += o[i];
    std::vector<double> h = ref_rms_norm(x[t], L.get("post_attention_layernorm.weight"));
    std::vector<double> gate = ref_linear(h, L.get("mlp.gate_proj.weight"), I, nullptr);
    std::vector<double> up = ref_linear(h, L.get("mlp.up_proj.weight"), I, nullptr);
    for (size_t i = 0; i < I; ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
    std::vector<double> down = ref_linear(gate, L.get("mlp.down_proj.weight"), H, nullptr);
    for (size_t i = 0; i < H; ++i) out[t * H + i] = x[t][i] + down[i];
  }
  return out;
}

}  // namespace

TEST(model_layer_matches_reference) {
  const size_t T = 5;
  TinyLayer layer = make_layer(kTypeF32, 11);
  lever_test::Rng rng(12);
  std::vector<float> x = random_rows(rng, T);
  std::vector<double> want = ref_layer(layer, x, T);
  NativeModel model(kDims, kEps, kTheta);
  KVCache cache(1, kDims.n_kv_heads, kDims.head_dim, 16, ElemType::kF32);
  std::vector<int64_t> pos = {0, 1, 2, 3, 4};
  run_pass(model, layer, cache, x, pos, causal_mask(0, T));
  double max_err = 0, max_abs = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    max_err = std::max(max_err, std::fabs(x[i] - want[i]));
    max_abs = std::max(max_abs, std::fabs(want[i]));
  }
  NOTE("max |native - reference| = " << max_err << " (max |value| " << max_abs << ")");
  CHECK_MSG(max_err <= 1e-4 * std::max(1.0, max_abs), "max error " << max_err);
  CHECK_EQ(cache.length(), T);
}

namespace {

// Tree (node: parent): 0 root; 1: 0; 2: 0; 3: 1; 4: 2; 5: 3. Verified in one
// pass after `prefix` committed rows; then each node's path decoded one token
// at a time on a fresh cache with the same prefix. Rows must match bitwise.
void check_tree_vs_sequential(int matrix_type, ElemType cache_type) {
  const std::vector<int> parent = {-1, 0, 0, 1, 2, 3};
  const size_t n = parent.size(), prefix = 3;
  TinyLayer layer = make_layer(matrix_type, 21 + matrix_type);
  lever_test::Rng rng(99);
  std::vector<float> prefix_x = random_rows(rng, prefix);
  std::vector<float> node_x = random_rows(rng, n);
  NativeModel model(kDims, kEps, kTheta);

  auto fresh_cache = [&](KVCache& cache) {
    std::vector<float> px = prefix_x;
    std::vector<int64_t> pos = {0, 1, 2};
    run_pass(model, layer, cache, px, pos, causal_mask(0, prefix));
  };

  // The tree pass.
  KVCache tree_cache(1, kDims.n_kv_heads, kDims.head_dim, 32, cache_type);
  fresh_cache(tree_cache);
  std::vector<int> depth(n, 0);
  for (size_t i = 1; i < n; ++i) depth[i] = depth[parent[i]] + 1;
  std::vector<int64_t> pos(n);
  std::vector<uint8_t> mask(n * (prefix + n), 0);
  for (size_t i = 0; i < n; ++i) {
    pos[i] = static_cast<int64_t>(prefix) + depth[i];
    for (size_t c = 0; c < prefix; ++c) mask[i * (prefix + n) + c] = 1;
    for (int a = static_cast<int>(i); a >= 0; a = parent[a]) mask[i * (prefix + n) + prefix + a] = 1;
  }
  std::vector<float> tree_x = node_x;
  run_pass(model, layer, tree_cache, tree_x, pos, mask);

  // Each leaf's path, one token per pass.
  for (int leaf : {4, 5}) {
    std::vector<int> path;
    for (int a = leaf; a >= 0; a = parent[a]) path.insert(path.begin(), a);
    KVCache cache(1, kDims.n_kv_heads, kDims.head_dim, 32, cache_type);
    fresh_cache(cache);
    for (int node : path) {
      std::vector<float> x(node_x.begin() + node * kDims.hidden,
                           node_x.begin() + (node + 1) * kDims.hidden);
      std::vector<int64_t> p = {static_cast<int64_t>(cache.length())};
      run_pass(model, layer, cache, x, p, causal_mask(cache.length(), 1));
      long diff = lever_test::first_bit_difference(x.data(), tree_x.data() + node * kDims.hidden,
                                                   kDims.hidden);
      CHECK_MSG(diff < 0, "type " << type_name(matrix_type) << " node " << node << " element "
                                  << diff << ": alone " << x[diff < 0 ? 0 : diff] << " in tree "
                                  << tree_x[node * kDims.hidden + (diff < 0 ? 0 : diff)]);
    }
  }
}

}  // namespace

TEST(model_layer_tree_rows_equal_sequential_decode_q8_0) {
  // Under every kernel Isa this CPU has (the quantised projections use them).
  for (Isa isa : kAllIsas) {
    if (!isa_available(isa)) continue;
    NOTE("isa " << isa_name(isa));
    set_default_isa(isa);
    check_tree_vs_sequential(kTypeQ8_0, ElemType::kF32);
    check_tree_vs_sequential(kTypeQ8_0, ElemType::kBF16);
  }
  set_default_isa(Isa::kAuto);
}

TEST(model_layer_tree_rows_equal_sequential_decode_f32) {
  check_tree_vs_sequential(kTypeF32, ElemType::kF32);
}

TEST(model_rms_norm_rows_reference) {
  lever_test::Rng rng(5);
  const size_t n = 67;
  std::vector<float> x(2 * n), w(n), out(2 * n);
  for (float& v : x) v = rng.normal(2.0f);
  for (float& v : w) v = 1.0f + rng.normal(0.1f);
  rms_norm_rows(x.data(), 2, n, n, w.data(), kEps, out.data(), n);
  for (size_t r = 0; r < 2; ++r) {
    double ms = 0;
    for (size_t i = 0; i < n; ++i) ms += static_cast<double>(x[r * n + i]) * x[r * n + i];
    const double inv = 1.0 / std::sqrt(ms / n + kEps);
    for (size_t i = 0; i < n; ++i) CHECK_NEAR(out[r * n + i], w[i] * x[r * n + i] * inv, 1e-5);
  }
}

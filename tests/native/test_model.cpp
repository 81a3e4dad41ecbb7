// Native tests of the forward (model/decoder_layer.h): one decoder layer on a
// tiny random layer.
//  - model_layer_matches_reference: fp32 weights, compared with a plain
//    double-precision implementation of the same layer written here.
//  - model_layer_tree_rows_equal_sequential_decode: a token verified inside
//    a tree pass gets bit for bit the numbers it gets when its path is decoded
//    one token at a time (Q8_0 and F32 weights; fp32 and bf16 caches).
//  - model_keep_rows_*: a tree pass pruned between layers (early exit,
//    NativeModel::keep_rows) gives every surviving row, and its keys / values
//    in every layer, the same bits as the unpruned pass; bad keeps throw.
//  - kv_window_*: windowed KV caches (sliding-window layers keep their last
//    rows) give the bits of full caches over tree passes and compactions;
//    their slides, capacities and refusals.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dequant.h"
#include "kernels/qmatmul.h"
#include "model/decoder_layer.h"
#include "model/kv_cache.h"
#include "model/layer_layout.h"
#include "native_test.h"

using namespace lever;

using lever_test::throws_invalid;

namespace {

// hidden 64, 4 query heads and 2 kv heads of 16, intermediate 96: every
// matrix has K a multiple of 32 (Q8_0 blocks).
const LayerDims kDims{64, 4, 2, 16, 96};
const float kEps = 1e-5f;
const float kTheta = 10000.0f;

// The Llama block of these dims.
BlockSpec llama_spec() {
  BlockSpec spec;
  spec.dims = kDims;
  spec.rms_eps = kEps;
  spec.rope_theta = kTheta;
  return spec;
}

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
  NativeModel model(llama_spec());
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
  NativeModel model(llama_spec());

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

// ---------------------------------------------------------------------------
// Early exit: keep_rows between layers.

namespace {

// Tree (node: parent) verified after `kPrefix` committed rows over 3 layers.
const std::vector<int> kTreeParent = {-1, 0, 0, 1, 2, 3, 1, 4};
const size_t kPrefix = 3, kLayers = 3;

struct TreePass {
  std::vector<TinyLayer> layers;
  std::vector<float> prefix_x, node_x;
  std::vector<int64_t> pos;
  std::vector<uint8_t> mask;  // [n, kPrefix + n]
};

TreePass make_tree_pass(int matrix_type) {
  TreePass p;
  for (size_t i = 0; i < kLayers; ++i) p.layers.push_back(make_layer(matrix_type, 40 + i));
  lever_test::Rng rng(77);
  const size_t n = kTreeParent.size();
  p.prefix_x = random_rows(rng, kPrefix);
  p.node_x = random_rows(rng, n);
  std::vector<int> depth(n, 0);
  for (size_t i = 1; i < n; ++i) depth[i] = depth[kTreeParent[i]] + 1;
  p.pos.resize(n);
  p.mask.assign(n * (kPrefix + n), 0);
  for (size_t i = 0; i < n; ++i) {
    p.pos[i] = static_cast<int64_t>(kPrefix) + depth[i];
    for (size_t c = 0; c < kPrefix; ++c) p.mask[i * (kPrefix + n) + c] = 1;
    for (int a = static_cast<int>(i); a >= 0; a = kTreeParent[a])
      p.mask[i * (kPrefix + n) + kPrefix + a] = 1;
  }
  return p;
}

// A cache holding the prefix, run through every layer.
void fill_prefix(NativeModel& model, const TreePass& p, KVCache& cache) {
  std::vector<float> x = p.prefix_x;
  std::vector<int64_t> pos = {0, 1, 2};
  std::vector<uint8_t> mask = causal_mask(0, kPrefix);
  model.begin_pass(pos.data(), kPrefix, mask.data(), kPrefix, cache);
  for (size_t i = 0; i < kLayers; ++i) {
    LayerLayout layout(p.layers[i].entries);
    model.layer(x.data(), kPrefix, layout, p.layers[i].buffer.data(), p.layers[i].buffer.size(),
                cache, i);
  }
  model.end_pass(cache);
}

// The tree pass; prunes[i] (if non-empty) is the keep given after layer i.
// Returns the final live rows [T_live, hidden]; `slots` gets the live rows'
// cache rows at the end.
std::vector<float> run_tree_pass(NativeModel& model, const TreePass& p, KVCache& cache,
                                 const std::vector<std::vector<int64_t>>& prunes,
                                 std::vector<size_t>* slots) {
  const size_t n = kTreeParent.size();
  std::vector<float> x = p.node_x;
  model.begin_pass(p.pos.data(), n, p.mask.data(), kPrefix + n, cache);
  size_t live = n;
  for (size_t i = 0; i < kLayers; ++i) {
    LayerLayout layout(p.layers[i].entries);
    model.layer(x.data(), live, layout, p.layers[i].buffer.data(), p.layers[i].buffer.size(), cache,
                i);
    if (i < prunes.size() && !prunes[i].empty()) {
      model.keep_rows(x.data(), live, prunes[i].data(), prunes[i].size());
      live = prunes[i].size();
    }
  }
  if (slots) {
    slots->clear();
    for (size_t t = 0; t < model.live_rows(); ++t) slots->push_back(model.slot(t));
  }
  model.end_pass(cache);
  x.resize(live * kDims.hidden);
  return x;
}

void check_pruned_pass_bitwise(int matrix_type, ElemType cache_type) {
  const size_t n = kTreeParent.size(), H = kDims.hidden;
  TreePass p = make_tree_pass(matrix_type);
  NativeModel model(llama_spec());

  KVCache full(kLayers, kDims.n_kv_heads, kDims.head_dim, 32, cache_type);
  fill_prefix(model, p, full);
  std::vector<float> want = run_tree_pass(model, p, full, {}, nullptr);

  // After layer 0 drop nodes 2, 4, 7 (node 2's subtree): live nodes 0 1 3 5 6.
  // After layer 1 drop live row 3 (node 5, a leaf): live nodes 0 1 3 6.
  KVCache pruned(kLayers, kDims.n_kv_heads, kDims.head_dim, 32, cache_type);
  fill_prefix(model, p, pruned);
  std::vector<size_t> slots;
  std::vector<float> got = run_tree_pass(model, p, pruned, {{0, 1, 3, 5, 6}, {0, 1, 2, 4}}, &slots);
  const std::vector<size_t> survivors = {0, 1, 3, 6};
  CHECK_EQ(pruned.length(), kPrefix + n);  // end_pass commits all T rows
  REQUIRE(got.size() == survivors.size() * H);
  REQUIRE(slots.size() == survivors.size());
  for (size_t t = 0; t < survivors.size(); ++t) {
    CHECK_EQ(slots[t], kPrefix + survivors[t]);
    long diff = lever_test::first_bit_difference(got.data() + t * H,
                                                 want.data() + survivors[t] * H, H);
    CHECK_MSG(diff < 0, "type " << type_name(matrix_type) << " node " << survivors[t]
                                << " final hidden differs at element " << diff);
  }

  // Keys / values: the prefix and every row still live when a layer ran.
  const std::vector<std::vector<size_t>> live_at = {
      {0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 3, 5, 6}, {0, 1, 3, 6}};
  const size_t len = kPrefix + n;
  std::vector<float> kf(kDims.n_kv_heads * len * kDims.head_dim), vf(kf.size());
  std::vector<float> kp(kf.size()), vp(kf.size());
  for (size_t layer = 0; layer < kLayers; ++layer) {
    full.read_rows(layer, kf.data(), vf.data());
    pruned.read_rows(layer, kp.data(), vp.data());
    std::vector<size_t> rows = {0, 1, 2};
    for (size_t node : live_at[layer]) rows.push_back(kPrefix + node);
    for (size_t h = 0; h < kDims.n_kv_heads; ++h) {
      for (size_t r : rows) {
        const size_t off = (h * len + r) * kDims.head_dim;
        CHECK_MSG(lever_test::first_bit_difference(kp.data() + off, kf.data() + off,
                                                   kDims.head_dim) < 0 &&
                      lever_test::first_bit_difference(vp.data() + off, vf.data() + off,
                                                       kDims.head_dim) < 0,
                  "type " << type_name(matrix_type) << " layer " << layer << " kv head " << h
                          << " cache row " << r << " differs");
      }
    }
  }
}

}  // namespace

TEST(model_keep_rows_surviving_rows_bitwise_q8_0) {
  for (Isa isa : kAllIsas) {
    if (!isa_available(isa)) continue;
    NOTE("isa " << isa_name(isa));
    set_default_isa(isa);
    check_pruned_pass_bitwise(kTypeQ8_0, ElemType::kF32);
    check_pruned_pass_bitwise(kTypeQ8_0, ElemType::kBF16);
  }
  set_default_isa(Isa::kAuto);
}

TEST(model_keep_rows_surviving_rows_bitwise_f32) {
  check_pruned_pass_bitwise(kTypeF32, ElemType::kF32);
}

TEST(model_keep_rows_rejects_bad_keep) {
  const size_t n = kTreeParent.size(), H = kDims.hidden;
  TreePass p = make_tree_pass(kTypeF32);
  NativeModel model(llama_spec());
  KVCache cache(kLayers, kDims.n_kv_heads, kDims.head_dim, 32, ElemType::kF32);
  std::vector<float> x = p.node_x;
  const std::vector<int64_t> ok = {0, 2};
  CHECK(throws_invalid([&] { model.keep_rows(x.data(), n, ok.data(), ok.size()); }));  // no pass
  model.begin_pass(p.pos.data(), n, p.mask.data(), n, cache);
  CHECK_EQ(model.live_rows(), n);
  CHECK_EQ(model.slot(3), size_t{3});
  const std::vector<std::vector<int64_t>> bad = {
      {}, {1, 2}, {0, 2, 2}, {0, 3, 2}, {0, static_cast<int64_t>(n)}, {0, -1}};
  for (const auto& keep : bad) {
    CHECK_MSG(throws_invalid([&] { model.keep_rows(x.data(), n, keep.data(), keep.size()); }),
              "a keep of " << keep.size() << " rows was accepted");
  }
  CHECK(throws_invalid([&] { model.keep_rows(x.data(), n - 1, ok.data(), ok.size()); }));
  CHECK_EQ(model.live_rows(), n);  // nothing changed
  CHECK(lever_test::first_bit_difference(x.data(), p.node_x.data(), n * H) < 0);

  // Then a good keep; the layer wants the live rows only.
  model.keep_rows(x.data(), n, ok.data(), ok.size());
  CHECK_EQ(model.live_rows(), size_t{2});
  CHECK_EQ(model.slot(1), size_t{2});
  CHECK(lever_test::first_bit_difference(x.data() + H, p.node_x.data() + 2 * H, H) < 0);
  LayerLayout layout(p.layers[0].entries);
  CHECK(throws_invalid([&] {
    model.layer(x.data(), n, layout, p.layers[0].buffer.data(), p.layers[0].buffer.size(), cache, 0);
  }));
  model.layer(x.data(), 2, layout, p.layers[0].buffer.data(), p.layers[0].buffer.size(), cache, 0);
  model.end_pass(cache);
  CHECK_EQ(cache.length(), n);
}

TEST(kv_cache_write_rows_at_slots) {
  KVCache cache(1, 2, 4, 8, ElemType::kF32);
  std::vector<float> k(2 * 8), v(2 * 8);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i);
    v[i] = -static_cast<float>(i);
  }
  const std::vector<size_t> slots = {5, 2};
  cache.write_rows(0, k.data(), v.data(), slots.data(), 2, 8);
  cache.advance(6);
  std::vector<float> kr(2 * 6 * 4), vr(kr.size());
  cache.read_rows(0, kr.data(), vr.data());
  for (size_t h = 0; h < 2; ++h)
    for (size_t t = 0; t < 2; ++t)
      for (size_t c = 0; c < 4; ++c) {
        CHECK_EQ(kr[(h * 6 + slots[t]) * 4 + c], k[t * 8 + h * 4 + c]);
        CHECK_EQ(vr[(h * 6 + slots[t]) * 4 + c], v[t * 8 + h * 4 + c]);
      }
  const std::vector<size_t> outside = {8};
  bool overflow = false;
  try {
    cache.write_rows(0, k.data(), v.data(), outside.data(), 1, 8);
  } catch (const std::runtime_error&) {
    overflow = true;
  }
  CHECK(overflow);
}

// ---------------------------------------------------------------------------
// Segments: several sequences (their own caches, masks and positions) in one
// pass (NativeModel::begin_segments), as a batching verifier server runs the
// trees of several sessions. Every row, and every cache row each segment
// writes, must have the bits of the same segment's pass run alone.

namespace {

struct SegmentCase {
  std::vector<float> prefix_x;  // [prefix, hidden], committed causally first
  std::vector<float> x;         // [T, hidden], the pass's rows
  std::vector<int64_t> pos;     // [T]
  std::vector<uint8_t> mask;    // [T, prefix + T]
  size_t prefix;
};

// `prefix` committed rows, then T rows: a tree of parents `parent` (-1: the root).
SegmentCase make_segment(lever_test::Rng& rng, size_t prefix, const std::vector<int>& parent) {
  SegmentCase c;
  const size_t n = parent.size();
  c.prefix = prefix;
  c.prefix_x = random_rows(rng, prefix);
  c.x = random_rows(rng, n);
  std::vector<int> depth(n, 0);
  for (size_t i = 1; i < n; ++i) depth[i] = depth[parent[i]] + 1;
  c.pos.resize(n);
  c.mask.assign(n * (prefix + n), 0);
  for (size_t i = 0; i < n; ++i) {
    c.pos[i] = static_cast<int64_t>(prefix) + depth[i];
    for (size_t col = 0; col < prefix; ++col) c.mask[i * (prefix + n) + col] = 1;
    for (int a = static_cast<int>(i); a >= 0; a = parent[a]) c.mask[i * (prefix + n) + prefix + a] = 1;
  }
  return c;
}

// Runs every layer of `layers` over the pass begun on `model` (x in place).
void run_layers(NativeModel& model, const std::vector<TinyLayer>& layers, std::vector<float>& x,
                std::vector<KVCache*> caches) {
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerLayout layout(layers[i].entries);
    model.layer_segments(x.data(), x.size() / kDims.hidden, layout, layers[i].buffer.data(),
                         layers[i].buffer.size(), caches.data(), caches.size(), i);
  }
}

// A cache holding c's prefix, run causally through every layer.
void fill_segment_prefix(NativeModel& model, const std::vector<TinyLayer>& layers, const SegmentCase& c,
                         KVCache& cache) {
  std::vector<float> x = c.prefix_x;
  std::vector<int64_t> pos(c.prefix);
  for (size_t i = 0; i < c.prefix; ++i) pos[i] = static_cast<int64_t>(i);
  std::vector<uint8_t> mask = causal_mask(0, c.prefix);
  model.begin_pass(pos.data(), c.prefix, mask.data(), c.prefix, cache);
  run_layers(model, layers, x, {&cache});
  model.end_pass(cache);
}

void check_segments_bitwise(int matrix_type, ElemType cache_type) {
  const size_t H = kDims.hidden, n_layers = 2;
  std::vector<TinyLayer> layers;
  for (size_t i = 0; i < n_layers; ++i) layers.push_back(make_layer(matrix_type, 60 + i));
  lever_test::Rng rng(123);
  // A tree after 3 rows, a chain of 3 after 5 rows, one row after 1 row.
  std::vector<SegmentCase> cases = {make_segment(rng, 3, {-1, 0, 0, 1, 2, 3}),
                                    make_segment(rng, 5, {-1, 0, 1}), make_segment(rng, 1, {-1})};
  NativeModel model(llama_spec());
  auto new_cache = [&] { return KVCache(n_layers, kDims.n_kv_heads, kDims.head_dim, 16, cache_type); };

  // Alone: one pass per segment.
  std::vector<KVCache> solo;
  std::vector<std::vector<float>> solo_x;
  for (const SegmentCase& c : cases) {
    solo.push_back(new_cache());
    fill_segment_prefix(model, layers, c, solo.back());
    std::vector<float> x = c.x;
    model.begin_pass(c.pos.data(), c.pos.size(), c.mask.data(), c.prefix + c.pos.size(), solo.back());
    run_layers(model, layers, x, {&solo.back()});
    model.end_pass(solo.back());
    solo_x.push_back(x);
  }

  // Together: one pass of three segments.
  std::vector<KVCache> batch;
  std::vector<lever::PassSegment> segs;
  std::vector<float> x;
  for (const SegmentCase& c : cases) {
    batch.push_back(new_cache());
    fill_segment_prefix(model, layers, c, batch.back());
    x.insert(x.end(), c.x.begin(), c.x.end());
  }
  std::vector<KVCache*> ptrs;
  for (size_t s = 0; s < cases.size(); ++s) {
    const SegmentCase& c = cases[s];
    segs.push_back({c.pos.data(), c.pos.size(), c.mask.data(), c.prefix + c.pos.size(), &batch[s]});
    ptrs.push_back(&batch[s]);
  }
  model.begin_segments(segs);
  CHECK_EQ(model.segments(), cases.size());
  run_layers(model, layers, x, ptrs);
  model.end_segments(ptrs.data(), ptrs.size());

  size_t row = 0;
  for (size_t s = 0; s < cases.size(); ++s) {
    const size_t T = cases[s].pos.size();
    long diff = lever_test::first_bit_difference(x.data() + row * H, solo_x[s].data(), T * H);
    CHECK_MSG(diff < 0, "type " << type_name(matrix_type) << " segment " << s << " output element " << diff);
    row += T;
    CHECK_EQ(batch[s].length(), solo[s].length());
    const size_t n = batch[s].n_kv_heads() * batch[s].length() * batch[s].head_dim();
    for (size_t layer = 0; layer < n_layers; ++layer) {
      std::vector<float> kb(n), vb(n), ks(n), vs(n);
      batch[s].read_rows(layer, kb.data(), vb.data());
      solo[s].read_rows(layer, ks.data(), vs.data());
      CHECK_MSG(lever_test::first_bit_difference(kb.data(), ks.data(), n) < 0,
                "segment " << s << " layer " << layer << ": keys differ");
      CHECK_MSG(lever_test::first_bit_difference(vb.data(), vs.data(), n) < 0,
                "segment " << s << " layer " << layer << ": values differ");
    }
  }
}

}  // namespace

TEST(model_segments_equal_solo_passes_q8_0) {
  for (Isa isa : kAllIsas) {
    if (!isa_available(isa)) continue;
    NOTE("isa " << isa_name(isa));
    set_default_isa(isa);
    check_segments_bitwise(kTypeQ8_0, ElemType::kF32);
    check_segments_bitwise(kTypeQ8_0, ElemType::kBF16);
  }
  set_default_isa(Isa::kAuto);
}

TEST(model_segments_equal_solo_passes_f32) { check_segments_bitwise(kTypeF32, ElemType::kF32); }

TEST(model_segments_bad_input_throws) {
  NativeModel model(llama_spec());
  KVCache a(1, kDims.n_kv_heads, kDims.head_dim, 8, ElemType::kF32);
  KVCache b(1, kDims.n_kv_heads, kDims.head_dim, 8, ElemType::kF32);
  std::vector<int64_t> pos = {0, 1};
  std::vector<uint8_t> mask = causal_mask(0, 2);
  // No segment; the same cache twice; a mask of the wrong width.
  CHECK(throws_invalid([&] { model.begin_segments({}); }));
  CHECK(throws_invalid([&] {
    model.begin_segments({{pos.data(), 2, mask.data(), 2, &a}, {pos.data(), 2, mask.data(), 2, &a}});
  }));
  CHECK(throws_invalid([&] {
    model.begin_segments({{pos.data(), 2, mask.data(), 2, &a}, {pos.data(), 2, mask.data(), 3, &b}});
  }));
  CHECK_EQ(model.segments(), 0u);
  model.begin_segments({{pos.data(), 2, mask.data(), 2, &a}, {pos.data(), 2, mask.data(), 2, &b}});
  std::vector<float> x(4 * kDims.hidden, 0.5f);
  TinyLayer layer = make_layer(kTypeF32, 5);
  LayerLayout layout(layer.entries);
  KVCache* one[1] = {&a};
  KVCache* swapped[2] = {&b, &a};
  // Caches that are not the pass's (too few, another order); early exit over two segments.
  CHECK(throws_invalid([&] {
    model.layer_segments(x.data(), 4, layout, layer.buffer.data(), layer.buffer.size(), one, 1, 0);
  }));
  CHECK(throws_invalid([&] {
    model.layer_segments(x.data(), 4, layout, layer.buffer.data(), layer.buffer.size(), swapped, 2, 0);
  }));
  CHECK(throws_invalid([&] { model.layer(x.data(), 4, layout, layer.buffer.data(), layer.buffer.size(), a, 0); }));
  const std::vector<int64_t> keep = {0, 1};
  CHECK(throws_invalid([&] { model.keep_rows(x.data(), 4, keep.data(), keep.size()); }));
  KVCache* both[2] = {&a, &b};
  model.end_segments(both, 2);
  CHECK_EQ(a.length(), 2u);
  CHECK_EQ(b.length(), 2u);
}

// ---------------------------------------------------------------------------
// Windowed KV caches: "l" layers keep only their last rows (KVCache windows).
// A long sequence of tree passes and compactions, crossing the window many
// times, gives every row and every held cache row the bits of the same
// sequence over full caches (segments of two sequences, and a pass pruned
// mid-way, included); bad uses throw.

namespace {

const size_t kWindow = 5;

// Two sliding-window layers and a global one, window kWindow.
BlockSpec local_spec() {
  BlockSpec spec = llama_spec();
  spec.sliding_window = kWindow;
  spec.layer_kinds = {LayerKind::kLocal, LayerKind::kLocal, LayerKind::kGlobal};
  return spec;
}

// One sequence, run over a full cache and over a windowed one.
struct WindowSeq {
  KVCache full, win;
  WindowSeq(ElemType type)
      : full(3, kDims.n_kv_heads, kDims.head_dim, 512, type),
        win(3, kDims.n_kv_heads, kDims.head_dim, 512, type, {kWindow, kWindow, 0}) {}
};

// kTreeParent after L committed rows: positions L + depth, mask [T, L + T]
// (every committed row and the node's ancestors; the window hides the rest).
void tree_inputs(size_t L, std::vector<int64_t>& pos, std::vector<uint8_t>& mask) {
  const size_t n = kTreeParent.size();
  std::vector<int> depth(n, 0);
  for (size_t i = 1; i < n; ++i) depth[i] = depth[kTreeParent[i]] + 1;
  pos.resize(n);
  mask.assign(n * (L + n), 0);
  for (size_t i = 0; i < n; ++i) {
    pos[i] = static_cast<int64_t>(L) + depth[i];
    for (size_t c = 0; c < L; ++c) mask[i * (L + n) + c] = 1;
    for (int a = static_cast<int>(i); a >= 0; a = kTreeParent[a]) mask[i * (L + n) + L + a] = 1;
  }
}

// Every layer over the open pass of `caches` (one per segment), pruning after
// layer 0 to `prune` when it is not empty (one segment only).
void run_window_layers(NativeModel& model, const std::vector<TinyLayer>& layers, std::vector<float>& x,
                       std::vector<KVCache*> caches, const std::vector<int64_t>& prune) {
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerLayout layout(layers[i].entries);
    model.layer_segments(x.data(), x.size() / kDims.hidden, layout, layers[i].buffer.data(),
                         layers[i].buffer.size(), caches.data(), caches.size(), i);
    if (i == 0 && !prune.empty()) {
      model.keep_rows(x.data(), x.size() / kDims.hidden, prune.data(), prune.size());
      x.resize(prune.size() * kDims.hidden);
    }
  }
}

// A prefill of `n` rows (positions 0..n-1, causal) into the full and the windowed cache.
void window_prefill(NativeModel& model, const std::vector<TinyLayer>& layers, WindowSeq& s, size_t n,
                    lever_test::Rng& rng) {
  const std::vector<float> x0 = random_rows(rng, n);
  std::vector<int64_t> pos(n);
  for (size_t i = 0; i < n; ++i) pos[i] = static_cast<int64_t>(i);
  const std::vector<uint8_t> mask = causal_mask(0, n);
  for (KVCache* c : {&s.full, &s.win}) {
    std::vector<float> x = x0;
    model.begin_pass(pos.data(), n, mask.data(), n, *c);
    run_window_layers(model, layers, x, {c}, {});
    model.end_pass(*c);
  }
}

// The held rows of every layer of `win` equal the same rows of `full`.
void check_held_rows(const KVCache& full, const KVCache& win, const std::string& what) {
  REQUIRE(full.length() == win.length());
  const size_t len = full.length(), h = full.n_kv_heads(), d = full.head_dim();
  std::vector<float> kf(h * len * d), vf(kf.size()), kw(kf.size()), vw(kf.size());
  for (size_t layer = 0; layer < full.n_layers(); ++layer) {
    const size_t b = win.base(layer), held = len - b;
    full.read_rows(layer, kf.data(), vf.data());
    win.read_rows(layer, kw.data(), vw.data());
    for (size_t head = 0; head < h; ++head) {
      const size_t fo = (head * len + b) * d, wo = head * held * d;
      CHECK_MSG(lever_test::first_bit_difference(kw.data() + wo, kf.data() + fo, held * d) < 0 &&
                    lever_test::first_bit_difference(vw.data() + wo, vf.data() + fo, held * d) < 0,
                what << " layer " << layer << " head " << head << ": held rows differ (base " << b << ")");
    }
  }
}

void check_window_cache_bitwise(int matrix_type, ElemType cache_type) {
  const size_t H = kDims.hidden, n = kTreeParent.size();
  std::vector<TinyLayer> layers;
  for (size_t i = 0; i < 3; ++i) layers.push_back(make_layer(matrix_type, 90 + i));
  NativeModel model(local_spec());
  lever_test::Rng rng(2024);
  // Sequences 0 and 1 run as two segments of one pass; sequence 2 alone, pruned after layer 0.
  std::vector<WindowSeq> seqs;
  for (int s = 0; s < 3; ++s) seqs.emplace_back(cache_type);
  const size_t prefill[3] = {7, 12, 3};
  for (size_t s = 0; s < 3; ++s) window_prefill(model, layers, seqs[s], prefill[s], rng);
  check_held_rows(seqs[1].full, seqs[1].win, "after the prefill");
  // Accepted paths (tree nodes); sequence 2 keeps node 2's subtree pruned.
  const std::vector<std::vector<int64_t>> paths = {{0}, {0, 1, 3, 5}, {0, 2, 4, 7}, {0, 1}, {0, 1, 6}};
  const std::vector<std::vector<int64_t>> pruned_paths = {{0}, {0, 1, 3, 5}, {0, 1, 3}, {0, 1}, {0, 1, 6}};
  const std::vector<int64_t> prune = {0, 1, 3, 5, 6};  // live nodes after layer 0
  for (size_t it = 0; it < 90; ++it) {
    std::vector<std::vector<int64_t>> pos(3);
    std::vector<std::vector<uint8_t>> mask(3);
    std::vector<std::vector<float>> x0(3), want(3);
    for (size_t s = 0; s < 3; ++s) {
      tree_inputs(seqs[s].full.length(), pos[s], mask[s]);
      x0[s] = random_rows(rng, n);
      // Full caches: each sequence alone.
      want[s] = x0[s];
      KVCache& c = seqs[s].full;
      model.begin_pass(pos[s].data(), n, mask[s].data(), c.length() + n, c);
      run_window_layers(model, layers, want[s], {&c}, s == 2 ? prune : std::vector<int64_t>());
      model.end_pass(c);
    }
    // Windowed caches: sequences 0 and 1 as segments of one pass, sequence 2 alone.
    std::vector<float> x = x0[0];
    x.insert(x.end(), x0[1].begin(), x0[1].end());
    KVCache& w0 = seqs[0].win;
    KVCache& w1 = seqs[1].win;
    model.begin_segments({{pos[0].data(), n, mask[0].data(), w0.length() + n, &w0},
                          {pos[1].data(), n, mask[1].data(), w1.length() + n, &w1}});
    run_window_layers(model, layers, x, {&w0, &w1}, {});
    model.end_segments(std::vector<KVCache*>{&w0, &w1}.data(), 2);
    std::vector<float> x2 = x0[2];
    KVCache& w2 = seqs[2].win;
    model.begin_pass(pos[2].data(), n, mask[2].data(), w2.length() + n, w2);
    run_window_layers(model, layers, x2, {&w2}, prune);
    model.end_pass(w2);
    const float* got[3] = {x.data(), x.data() + n * H, x2.data()};
    for (size_t s = 0; s < 3; ++s) {
      long diff = lever_test::first_bit_difference(got[s], want[s].data(), want[s].size());
      CHECK_MSG(diff < 0, "type " << type_name(matrix_type) << " iteration " << it << " sequence " << s
                                  << ": output differs at element " << diff);
    }
    // Compact every cache to the committed rows and the accepted path (row
    // indices of the pass's live rows: sequence 2's pruned nodes were never
    // written past layer 0 and are never kept).
    for (size_t s = 0; s < 3; ++s) {
      const std::vector<int64_t>& path = (s == 2 ? pruned_paths : paths)[(it + s) % paths.size()];
      const size_t L = seqs[s].full.length() - n;
      std::vector<int64_t> keep(L);
      for (size_t i = 0; i < L; ++i) keep[i] = static_cast<int64_t>(i);
      for (int64_t node : path) keep.push_back(static_cast<int64_t>(L) + node);
      seqs[s].full.compact(keep.data(), keep.size());
      seqs[s].win.compact(keep.data(), keep.size());
      check_held_rows(seqs[s].full, seqs[s].win, "iteration " + std::to_string(it));
    }
  }
  for (size_t s = 0; s < 3; ++s) {
    const KVCache& w = seqs[s].win;
    NOTE("sequence " << s << ": " << w.length() << " rows, base " << w.base(0) << ", " << w.slides()
                     << " slides, local capacity " << w.layer_capacity(0) << ", " << w.nbytes() << " of "
                     << seqs[s].full.nbytes() << " bytes");
    CHECK(w.length() > 30 * kWindow);                // the window was crossed many times
    CHECK(w.slides() >= 5);
    CHECK(w.base(0) > 0 && w.base(1) == w.base(0) && w.base(2) == 0);
    CHECK(w.nbytes() < seqs[s].full.nbytes());
  }
}

}  // namespace

TEST(kv_window_passes_equal_full_cache_q8_0) {
  for (Isa isa : kAllIsas) {
    if (!isa_available(isa)) continue;
    NOTE("isa " << isa_name(isa));
    set_default_isa(isa);
    check_window_cache_bitwise(kTypeQ8_0, ElemType::kF32);
    check_window_cache_bitwise(kTypeQ8_0, ElemType::kBF16);
  }
  set_default_isa(Isa::kAuto);
}

TEST(kv_window_passes_equal_full_cache_f32) { check_window_cache_bitwise(kTypeF32, ElemType::kF32); }

namespace {

// Decodes n rows one at a time into `c` (row r's keys: r + 0.5 in every element,
// its values -r), as passes do: prepare, write, advance.
void decode_rows(KVCache& c, size_t n) {
  const size_t cols = c.n_kv_heads() * c.head_dim();
  for (size_t i = 0; i < n; ++i) {
    const size_t r = c.length();
    std::vector<float> k(cols, static_cast<float>(r) + 0.5f), v(cols, -static_cast<float>(r));
    c.prepare(1, r);
    for (size_t l = 0; l < c.n_layers(); ++l) c.write(l, k.data(), v.data(), 1, cols);
    c.advance(1);
  }
}

bool throws_runtime(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error&) {
    return true;
  }
  return false;
}

}  // namespace

TEST(kv_window_slides_and_refuses_dropped_rows) {
  // K = W - 1 + max(W, 64) = 67 rows kept below a pass; K + W + 1 = 72 rows held.
  const size_t W = 4, d = 4, h = 2, K = W - 1 + KVCache::kMinRollback, n = 300;
  KVCache c(2, h, d, 512, ElemType::kF32, {0, W});
  CHECK_EQ(c.layer_capacity(1), K + W + 1);
  CHECK_EQ(c.nbytes(), 2 * h * (512 + K + W + 1) * d * 4);
  decode_rows(c, n);
  // A slide whenever the 72 rows are full, keeping the K rows below the pass:
  // before the passes at L = 72, 77, ..., 297 (every W + 1 tokens), the last
  // one to base 297 - K = 230.
  CHECK_EQ(c.base(0), 0u);
  CHECK_EQ(c.base(1), 230u);
  CHECK_EQ(c.layer_capacity(1), K + W + 1);
  CHECK_EQ(c.slides(), 46u);
  std::vector<float> k(h * n * d), v(k.size());
  c.read_rows(1, k.data(), v.data());
  const size_t held = n - c.base(1);
  for (size_t r = 0; r < held; ++r) {
    CHECK_EQ(k[r * d], static_cast<float>(c.base(1) + r) + 0.5f);
    CHECK_EQ(v[(held + r) * d], -static_cast<float>(c.base(1) + r));  // head 1
  }
  // keys_at: absolute rows; rows below base are gone.
  CHECK_EQ(*static_cast<const float*>(c.keys_at(1, 295)), 295.5f);
  CHECK(throws_invalid([&] { c.keys_at(1, c.base(1) - 1); }));
  // Back to n rows needs rows n - (W - 1).. : allowed down to base + W - 1.
  const size_t b = c.base(1);
  CHECK(throws_runtime([&] { c.truncate(b + W - 2); }));
  std::vector<int64_t> keep(b + W - 2);
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = static_cast<int64_t>(i);
  CHECK(throws_runtime([&] { c.compact(keep.data(), keep.size()); }));
  CHECK_EQ(c.length(), n);  // unchanged
  // A row below base cannot be written, one past the held rows neither.
  std::vector<float> row(h * d, 1.0f);
  const size_t below = b - 1, past = b + c.layer_capacity(1);
  CHECK(throws_runtime([&] { c.write_rows(1, row.data(), row.data(), &below, 1, h * d); }));
  CHECK(throws_runtime([&] { c.write_rows(1, row.data(), row.data(), &past, 1, h * d); }));
  // A compaction that keeps enough rows: rows i >= base get rows keep[i].
  keep.assign(n - 2, 0);
  for (size_t i = 0; i < n - 4; ++i) keep[i] = static_cast<int64_t>(i);
  keep[n - 4] = n - 3;
  keep[n - 3] = n - 1;
  c.compact(keep.data(), keep.size());
  CHECK_EQ(*static_cast<const float*>(c.keys_at(1, n - 4)), n - 3 + 0.5f);
  CHECK_EQ(*static_cast<const float*>(c.keys_at(1, n - 3)), n - 1 + 0.5f);
  c.truncate(b + W - 1);
  CHECK_EQ(c.length(), b + W - 1);
  // Emptied, the cache starts again from row 0.
  c.truncate(0);
  CHECK_EQ(c.base(1), 0u);
  decode_rows(c, 3);
  CHECK_EQ(*static_cast<const float*>(c.keys_at(1, 0)), 0.5f);
  // A pass of more rows than the local capacity holds grows it to K + W + T.
  c.prepare(100, c.length());
  CHECK_EQ(c.layer_capacity(1), K + W + 100);
  CHECK(throws_invalid([] { KVCache(2, h, d, 8, ElemType::kF32, {W}); }));  // one window for two layers
}

TEST(model_window_cache_checks) {
  NativeModel model(local_spec());
  std::vector<int64_t> pos = {0, 1};
  std::vector<uint8_t> mask = causal_mask(0, 2);
  // A window on the global layer, or shorter than the model's.
  KVCache on_global(3, kDims.n_kv_heads, kDims.head_dim, 64, ElemType::kF32, {kWindow, kWindow, kWindow});
  CHECK(throws_invalid([&] { model.begin_pass(pos.data(), 2, mask.data(), 2, on_global); }));
  KVCache short_window(3, kDims.n_kv_heads, kDims.head_dim, 64, ElemType::kF32, {kWindow - 1, kWindow, 0});
  CHECK(throws_invalid([&] { model.begin_pass(pos.data(), 2, mask.data(), 2, short_window); }));
  // A pass whose rows see cache rows the cache dropped (positions far below its length).
  KVCache c(3, kDims.n_kv_heads, kDims.head_dim, 256, ElemType::kF32, {kWindow, kWindow, 0});
  decode_rows(c, 200);
  REQUIRE(c.base(0) > 0);
  const size_t L = c.length();
  std::vector<int64_t> low = {static_cast<int64_t>(c.base(0))};  // its window starts below base
  std::vector<uint8_t> all(L + 1, 1);
  CHECK(throws_runtime([&] { model.begin_pass(low.data(), 1, all.data(), L + 1, c); }));
  CHECK_EQ(model.segments(), 0u);
  // The same row masked off the dropped rows is fine.
  std::fill(all.begin(), all.begin() + c.base(0), 0);
  model.begin_pass(low.data(), 1, all.data(), L + 1, c);
  CHECK_EQ(model.segments(), 1u);
  model.end_pass(c);
}

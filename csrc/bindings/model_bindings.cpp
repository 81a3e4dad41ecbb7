// pybind11 glue for the native model core (csrc/model): argument checks and
// conversions only. std::invalid_argument reaches Python as ValueError,
// std::runtime_error (KV cache overflow) as RuntimeError.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bindings/buffers.h"
#include "model/decoder_layer.h"
#include "model/head.h"
#include "model/kv_cache.h"
#include "model/layer_layout.h"
#include "model/probe.h"

namespace py = pybind11;

namespace {

using lever::ElemType;
using lever::KVCache;
using lever::LayerLayout;
using lever::NativeModel;
using lever_bindings::base_format;

// ---------------------------------------------------------------------------
// Buffer checks

struct Bytes {
  const uint8_t* data;
  size_t n;  // bytes
};

// A 1-D C-contiguous uint8 buffer.
Bytes uint8_bytes(const py::buffer& b, const char* what) {
  const py::buffer_info info = b.request();
  if (info.itemsize != 1 || base_format(info) != "B" || info.ndim != 1 ||
      (info.shape[0] > 1 && info.strides[0] != 1)) {
    throw py::value_error(std::string(what) + " must be a contiguous 1-D uint8 array, got format '" +
                          info.format + "' with " + std::to_string(info.ndim) + " dimensions");
  }
  return {static_cast<const uint8_t*>(info.ptr), static_cast<size_t>(info.size)};
}

struct F32Matrix {
  float* data;
  size_t rows, cols, stride;  // stride: elements between rows
};

// A 2-D float32 array with contiguous rows (the row stride may be larger).
F32Matrix f32_matrix(const py::buffer& b, const char* what, bool writable) {
  const py::buffer_info info = b.request();
  if (info.ndim != 2 || info.itemsize != 4 || base_format(info) != "f") {
    throw py::value_error(std::string(what) + " must be a 2-D float32 array");
  }
  if (writable && info.readonly) throw py::value_error(std::string(what) + " must be writable");
  if (info.shape[1] > 1 && info.strides[1] != 4) {
    throw py::value_error(std::string(what) + " rows must be contiguous");
  }
  const auto rows = static_cast<size_t>(info.shape[0]), cols = static_cast<size_t>(info.shape[1]);
  size_t stride = cols;
  if (rows > 1) {
    if (info.strides[0] < 0 || info.strides[0] % 4 != 0 ||
        static_cast<size_t>(info.strides[0]) / 4 < cols) {
      throw py::value_error(std::string(what) + " has an unsupported row stride");
    }
    stride = static_cast<size_t>(info.strides[0]) / 4;
  }
  return {static_cast<float*>(info.ptr), rows, cols, stride};
}

void require_shape(const F32Matrix& m, size_t rows, size_t cols, const char* what) {
  if (m.rows != rows || m.cols != cols) {
    throw py::value_error(std::string(what) + " has shape (" + std::to_string(m.rows) + ", " +
                          std::to_string(m.cols) + "), expected (" + std::to_string(rows) + ", " +
                          std::to_string(cols) + ")");
  }
}

// A 1-D contiguous array of `itemsize`-byte elements of one of `formats`.
template <typename T>
std::pair<T*, size_t> vector_of(const py::buffer& b, const char* what, const char* formats,
                                const char* dtype, bool writable) {
  const py::buffer_info info = b.request();
  const std::string f = base_format(info);
  if (info.ndim != 1 || info.itemsize != static_cast<py::ssize_t>(sizeof(T)) || f.size() != 1 ||
      std::string(formats).find(f[0]) == std::string::npos ||
      (info.shape[0] > 1 && info.strides[0] != info.itemsize)) {
    throw py::value_error(std::string(what) + " must be a contiguous 1-D " + dtype + " array");
  }
  if (writable && info.readonly) throw py::value_error(std::string(what) + " must be writable");
  return {static_cast<T*>(info.ptr), static_cast<size_t>(info.size)};
}

std::pair<const int64_t*, size_t> int64_vector(const py::buffer& b, const char* what) {
  auto v = vector_of<int64_t>(b, what, "lq", "int64", false);
  return {v.first, v.second};
}

ElemType parse_dtype(const std::string& dtype) {
  if (dtype == "float32") return ElemType::kF32;
  if (dtype == "bfloat16") return ElemType::kBF16;
  throw py::value_error("dtype must be 'float32' or 'bfloat16', got '" + dtype + "'");
}

size_t non_negative(int64_t n, const char* what) {
  if (n < 0) throw py::value_error(std::string(what) + " must be >= 0, got " + std::to_string(n));
  return static_cast<size_t>(n);
}

// ---------------------------------------------------------------------------
// KVCache

std::unique_ptr<KVCache> make_cache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim,
                                    int64_t capacity, const std::string& dtype,
                                    const std::vector<int64_t>& layer_windows) {
  std::vector<size_t> windows;
  for (int64_t w : layer_windows) windows.push_back(non_negative(w, "a layer window"));
  return std::make_unique<KVCache>(non_negative(n_layers, "n_layers"),
                                   non_negative(n_kv_heads, "n_kv_heads"),
                                   non_negative(head_dim, "head_dim"),
                                   non_negative(capacity, "capacity"), parse_dtype(dtype), windows);
}

size_t cache_layer(const KVCache& cache, int64_t layer) {
  const size_t l = non_negative(layer, "layer");
  if (l >= cache.n_layers()) throw py::value_error("layer index out of range");
  return l;
}

void cache_compact(KVCache& cache, const py::buffer& keep) {
  const auto k = int64_vector(keep, "keep");
  cache.compact(k.first, k.second);
}

py::tuple cache_layer_rows(const KVCache& cache, int64_t layer) {
  const size_t l = cache_layer(cache, layer);
  const auto h = static_cast<py::ssize_t>(cache.n_kv_heads());
  const auto n = static_cast<py::ssize_t>(cache.length() - std::min(cache.length(), cache.base(l)));
  const auto d = static_cast<py::ssize_t>(cache.head_dim());
  py::array_t<float> k({h, n, d}), v({h, n, d});
  cache.read_rows(l, k.mutable_data(), v.mutable_data());
  return py::make_tuple(k, v);
}

// ---------------------------------------------------------------------------
// LayerLayout

std::unique_ptr<LayerLayout> make_layout(const py::sequence& entries) {
  std::vector<lever::TensorEntry> out;
  for (const py::handle& item : entries) {
    const auto t = item.cast<py::tuple>();
    if (t.size() != 4) {
      throw py::value_error("a layout entry is (name, offset, ggml type, shape)");
    }
    lever::TensorEntry e;
    e.name = t[0].cast<std::string>();
    e.offset = non_negative(t[1].cast<int64_t>(), "offset");
    e.type = t[2].cast<int>();
    for (const py::handle& dim : t[3].cast<py::sequence>()) {
      e.shape.push_back(non_negative(dim.cast<int64_t>(), "shape"));
    }
    out.push_back(std::move(e));
  }
  return std::make_unique<LayerLayout>(std::move(out));
}

py::list layout_entries(const LayerLayout& layout) {
  py::list out;
  for (const lever::TensorEntry& e : layout.entries()) {
    out.append(py::make_tuple(e.name, e.offset, e.type, py::tuple(py::cast(e.shape))));
  }
  return out;
}

// ---------------------------------------------------------------------------
// NativeModel

std::unique_ptr<NativeModel> make_model(int64_t hidden, int64_t n_heads, int64_t n_kv_heads,
                                        int64_t head_dim, int64_t intermediate, float rms_eps,
                                        float rope_theta, bool qk_norm, bool sandwich_norms,
                                        const std::string& activation, int64_t rope_dims,
                                        float rope_theta_local, float rope_linear,
                                        const std::vector<float>& rope_freq_factors, float rope_attn_factor,
                                        float attn_scale, int64_t sliding_window,
                                        const std::string& layer_kinds) {
  lever::BlockSpec spec;
  spec.dims = lever::LayerDims{non_negative(hidden, "hidden"), non_negative(n_heads, "n_heads"),
                               non_negative(n_kv_heads, "n_kv_heads"), non_negative(head_dim, "head_dim"),
                               non_negative(intermediate, "intermediate"), qk_norm, sandwich_norms};
  spec.rms_eps = rms_eps;
  spec.rope_theta = rope_theta;
  spec.rope_theta_local = rope_theta_local;
  spec.rope_dims = non_negative(rope_dims, "rope_dims");
  spec.rope_linear = rope_linear;
  spec.rope_freq_factors = rope_freq_factors;
  spec.rope_attn_factor = rope_attn_factor;
  spec.attn_scale = attn_scale;
  spec.sliding_window = non_negative(sliding_window, "sliding_window");
  if (activation == "silu") {
    spec.activation = lever::Activation::kSilu;
  } else if (activation == "gelu_tanh") {
    spec.activation = lever::Activation::kGeluTanh;
  } else {
    throw py::value_error("activation must be 'silu' or 'gelu_tanh', got '" + activation + "'");
  }
  for (char c : layer_kinds) {
    if (c == 'g') {
      spec.layer_kinds.push_back(lever::LayerKind::kGlobal);
    } else if (c == 'l') {
      spec.layer_kinds.push_back(lever::LayerKind::kLocal);
    } else if (c == 'n') {
      spec.layer_kinds.push_back(lever::LayerKind::kNoRope);
    } else {
      throw py::value_error(std::string("layer_kinds: unknown kind '") + c + "' (g, l or n)");
    }
  }
  return std::make_unique<NativeModel>(spec);
}

void model_check_layout(const NativeModel& model, const LayerLayout& layout, int64_t nbytes) {
  model.check_layout(layout, non_negative(nbytes, "buffer_nbytes"));
}

// One segment's (positions, mask) as a PassSegment over `cache` (the buffers
// must outlive the call that uses it).
lever::PassSegment pass_segment(const py::buffer& positions, const py::buffer& mask, KVCache& cache,
                                const std::string& where) {
  const auto pos = int64_vector(positions, "positions");
  const py::buffer_info m = mask.request();
  if (m.ndim != 2 || m.itemsize != 1 || base_format(m) != "?") {
    throw py::value_error(where + "mask must be a 2-D bool array");
  }
  const auto rows = static_cast<size_t>(m.shape[0]), cols = static_cast<size_t>(m.shape[1]);
  if ((cols > 1 && m.strides[1] != 1) || (rows > 1 && static_cast<size_t>(m.strides[0]) != cols)) {
    throw py::value_error(where + "mask must be C-contiguous");
  }
  if (rows != pos.second) {
    throw py::value_error(where + "mask has " + std::to_string(rows) + " rows but there are " +
                          std::to_string(pos.second) + " positions");
  }
  return {pos.first, pos.second, static_cast<const uint8_t*>(m.ptr), cols, &cache};
}

void model_begin_pass(NativeModel& model, const py::buffer& positions, const py::buffer& mask,
                      KVCache& cache) {
  model.begin_segments({pass_segment(positions, mask, cache, "")});
}

void model_begin_segments(NativeModel& model, const py::sequence& segments) {
  std::vector<lever::PassSegment> segs;
  for (size_t s = 0; s < static_cast<size_t>(segments.size()); ++s) {
    const auto t = segments[s].cast<py::tuple>();
    if (t.size() != 3) throw py::value_error("a segment is (positions, mask, cache)");
    segs.push_back(pass_segment(t[0].cast<py::buffer>(), t[1].cast<py::buffer>(), t[2].cast<KVCache&>(),
                                "segment " + std::to_string(s) + ": "));
  }
  model.begin_segments(segs);
}

std::vector<KVCache*> cache_list(const py::sequence& caches) {
  std::vector<KVCache*> out;
  for (const py::handle& c : caches) out.push_back(&c.cast<KVCache&>());
  return out;
}

void model_layer(NativeModel& model, const py::buffer& x, const LayerLayout& layout,
                 const py::buffer& buffer, KVCache& cache, int64_t layer_index) {
  const F32Matrix xm = f32_matrix(x, "x", true);
  require_shape(xm, xm.rows, model.dims().hidden, "x");
  if (xm.rows > 1 && xm.stride != xm.cols) throw py::value_error("x must be C-contiguous");
  const Bytes w = uint8_bytes(buffer, "buffer");
  const size_t li = non_negative(layer_index, "layer_index");
  py::gil_scoped_release no_gil;
  model.layer(xm.data, xm.rows, layout, w.data, w.n, cache, li);
}

void model_layer_segments(NativeModel& model, const py::buffer& x, const LayerLayout& layout,
                          const py::buffer& buffer, const py::sequence& caches, int64_t layer_index) {
  const F32Matrix xm = f32_matrix(x, "x", true);
  require_shape(xm, xm.rows, model.dims().hidden, "x");
  if (xm.rows > 1 && xm.stride != xm.cols) throw py::value_error("x must be C-contiguous");
  const Bytes w = uint8_bytes(buffer, "buffer");
  const size_t li = non_negative(layer_index, "layer_index");
  const std::vector<KVCache*> cs = cache_list(caches);
  py::gil_scoped_release no_gil;
  model.layer_segments(xm.data, xm.rows, layout, w.data, w.n, cs.data(), cs.size(), li);
}

void model_end_segments(NativeModel& model, const py::sequence& caches) {
  const std::vector<KVCache*> cs = cache_list(caches);
  model.end_segments(cs.data(), cs.size());
}

void model_keep_rows(NativeModel& model, const py::buffer& x, const py::buffer& keep) {
  const F32Matrix xm = f32_matrix(x, "x", true);
  require_shape(xm, xm.rows, model.dims().hidden, "x");
  if (xm.rows > 1 && xm.stride != xm.cols) throw py::value_error("x must be C-contiguous");
  const auto k = int64_vector(keep, "keep");
  model.keep_rows(xm.data, xm.rows, k.first, k.second);
}

void model_embed(const NativeModel& model, const py::buffer& table, int qtype, int64_t n_rows,
                 const py::buffer& ids, const py::buffer& out) {
  const Bytes t = uint8_bytes(table, "table");
  const auto id = int64_vector(ids, "ids");
  const F32Matrix o = f32_matrix(out, "out", true);
  require_shape(o, id.second, model.dims().hidden, "out");
  const size_t n = non_negative(n_rows, "n_rows");
  py::gil_scoped_release no_gil;
  lever::embed_rows(t.data, t.n, qtype, n, model.dims().hidden, id.first, id.second, o.data,
                    o.stride);
}

void model_rms_norm(const NativeModel& model, const py::buffer& x, const py::buffer& weight,
                    const py::buffer& out) {
  const F32Matrix xm = f32_matrix(x, "x", false);
  const F32Matrix o = f32_matrix(out, "out", true);
  const size_t H = model.dims().hidden;
  require_shape(xm, xm.rows, H, "x");
  require_shape(o, xm.rows, H, "out");
  const auto w = vector_of<float>(weight, "weight", "f", "float32", false);
  if (w.second != H) throw py::value_error("weight must have hidden = " + std::to_string(H) + " values");
  py::gil_scoped_release no_gil;
  lever::rms_norm_rows(xm.data, xm.rows, H, xm.stride, w.first, model.rms_eps(), o.data, o.stride);
}

// ---------------------------------------------------------------------------
// Head

// Two per-row vectors of a and b entries must both have one entry per row of h.
void require_per_row(size_t a, size_t b, size_t rows, const char* names) {
  if (a != rows || b != rows) {
    throw py::value_error(std::string(names) + " must have one entry per row of h (" +
                          std::to_string(rows) + ")");
  }
}

void linear(const py::buffer& x, const py::buffer& w, int qtype, int64_t n_rows,
            const py::buffer& out) {
  const F32Matrix xm = f32_matrix(x, "x", false);
  const Bytes wb = uint8_bytes(w, "w");
  const F32Matrix o = f32_matrix(out, "out", true);
  const size_t N = non_negative(n_rows, "n_rows");
  require_shape(o, xm.rows, N, "out");
  py::gil_scoped_release no_gil;
  lever::linear_rows(xm.data, xm.rows, xm.cols, xm.stride, wb.data, wb.n, qtype, N, o.data,
                     o.stride);
}

void argmax_update(const py::buffer& h, const py::buffer& w, int qtype, int64_t n_rows,
                   int64_t row_offset, const py::buffer& best_val, const py::buffer& best_idx) {
  const F32Matrix hm = f32_matrix(h, "h", false);
  const Bytes wb = uint8_bytes(w, "w");
  const auto bv = vector_of<float>(best_val, "best_val", "f", "float32", true);
  const auto bi = vector_of<int64_t>(best_idx, "best_idx", "lq", "int64", true);
  require_per_row(bv.second, bi.second, hm.rows, "best_val and best_idx");
  const size_t N = non_negative(n_rows, "n_rows");
  py::gil_scoped_release no_gil;
  lever::argmax_update(hm.data, hm.rows, hm.cols, hm.stride, wb.data, wb.n, qtype, N, row_offset,
                       bv.first, bi.first);
}

void topk_update(const py::buffer& h, const py::buffer& w, int qtype, int64_t n_rows,
                 int64_t row_offset, const py::buffer& best_val, const py::buffer& best_idx,
                 const py::buffer& run_max, const py::buffer& run_sum) {
  const F32Matrix hm = f32_matrix(h, "h", false);
  const Bytes wb = uint8_bytes(w, "w");
  const F32Matrix bv = f32_matrix(best_val, "best_val", true);
  const py::buffer_info bi = best_idx.request();
  const std::string bif = base_format(bi);
  if (bi.ndim != 2 || bi.itemsize != 8 || (bif != "l" && bif != "q") || bi.readonly ||
      static_cast<size_t>(bi.shape[0]) != bv.rows || static_cast<size_t>(bi.shape[1]) != bv.cols ||
      (bi.shape[0] > 1 && bi.strides[0] != 8 * bi.shape[1]) ||
      (bi.shape[1] > 1 && bi.strides[1] != 8)) {
    throw py::value_error("best_idx must be a writable C-contiguous int64 array shaped like best_val");
  }
  if (bv.rows != hm.rows || bv.cols == 0 || (bv.rows > 1 && bv.stride != bv.cols)) {
    throw py::value_error("best_val must be C-contiguous float32 [rows of h (" +
                          std::to_string(hm.rows) + "), k >= 1]");
  }
  const auto mx = vector_of<float>(run_max, "run_max", "f", "float32", true);
  const auto sm = vector_of<double>(run_sum, "run_sum", "d", "float64", true);
  require_per_row(mx.second, sm.second, hm.rows, "run_max and run_sum");
  const size_t N = non_negative(n_rows, "n_rows");
  py::gil_scoped_release no_gil;
  lever::topk_update(hm.data, hm.rows, hm.cols, hm.stride, wb.data, wb.n, qtype, N, row_offset,
                     bv.cols, bv.data, static_cast<int64_t*>(bi.ptr), mx.first, sm.first);
}

// ---------------------------------------------------------------------------
// Probe (early-exit pruning)

// A C-contiguous uint8 array of any shape, as bytes.
Bytes uint8_array_bytes(const py::buffer& b, const char* what) {
  const py::buffer_info info = b.request();
  bool contiguous = true;
  py::ssize_t expected = 1;
  for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
    const auto d = static_cast<size_t>(i);
    if (info.shape[d] != 1 && info.strides[d] != expected) contiguous = false;
    expected *= info.shape[d];
  }
  if (info.itemsize != 1 || base_format(info) != "B" || !contiguous) {
    throw py::value_error(std::string(what) + " must be a C-contiguous uint8 array, got format '" +
                          info.format + "'");
  }
  return {static_cast<const uint8_t*>(info.ptr), static_cast<size_t>(info.size)};
}

// A 1-D contiguous vector of exactly n elements.
template <typename T>
T* vector_n(const py::buffer& b, const char* what, const char* formats, const char* dtype,
            size_t n, bool writable) {
  const auto v = vector_of<T>(b, what, formats, dtype, writable);
  if (v.second != n) {
    throw py::value_error(std::string(what) + " has " + std::to_string(v.second) +
                          " values, expected " + std::to_string(n));
  }
  return v.first;
}

void probe_scores(const py::buffer& x, const py::buffer& parent_rows, const py::buffer& parents,
                  const py::buffer& table, int qtype, const py::buffer& norm_w, float eps,
                  const py::buffer& draft_logp, const py::buffer& sibling_rank,
                  const py::buffer& depth, const py::buffer& weights, const py::buffer& lens_out,
                  const py::buffer& logit_out) {
  const F32Matrix xm = f32_matrix(x, "x", false);
  if (xm.rows > 1 && xm.stride != xm.cols) throw py::value_error("x must be C-contiguous");
  const size_t H = xm.cols;
  const auto pr = int64_vector(parent_rows, "parent_rows");
  const size_t n = pr.second;
  const int64_t* par = vector_n<int64_t>(parents, "parents", "lq", "int64", n, false);
  const Bytes t = uint8_array_bytes(table, "table");
  const float* nw = vector_n<float>(norm_w, "norm_w", "f", "float32", H, false);
  const float* lp = vector_n<float>(draft_logp, "draft_logp", "f", "float32", n, false);
  const float* rk = vector_n<float>(sibling_rank, "sibling_rank", "f", "float32", n, false);
  const float* dp = vector_n<float>(depth, "depth", "f", "float32", n, false);
  const double* w = vector_n<double>(weights, "weights", "d", "float64",
                                     lever::kProbeFeatures + 1, false);
  float* lens = vector_n<float>(lens_out, "lens_out", "f", "float32", n, true);
  float* logit = vector_n<float>(logit_out, "logit_out", "f", "float32", n, true);
  py::gil_scoped_release no_gil;
  lever::probe_scores(xm.data, xm.rows, H, pr.first, par, n, t.data, t.n, qtype, nw, eps, lp, rk,
                      dp, w, lens, logit);
}

py::array_t<bool> prune_closure(const py::buffer& parents, const py::buffer& keep_self) {
  const auto p = int64_vector(parents, "parents");
  const uint8_t* ks = vector_n<uint8_t>(keep_self, "keep_self", "?B", "bool or uint8", p.second,
                                        false);
  py::array_t<bool> kept(static_cast<py::ssize_t>(p.second));
  lever::prune_closure(p.first, ks, p.second, reinterpret_cast<uint8_t*>(kept.mutable_data()));
  return kept;
}

}  // namespace

void bind_model(py::module_& m) {
  py::class_<KVCache>(m, "KVCache", R"doc(Key/value cache of one sequence, every layer.

KVCache(n_layers, n_kv_heads, head_dim, capacity, dtype='float32'|'bfloat16', *,
layer_windows=()). Per layer, keys and values [kv_head][rows][head_dim]; rows
[0, length) are committed. layer_windows: one window per layer (tokens a
sliding-window layer sees, itself included; 0: the layer keeps every row),
or empty. A windowed layer holds only absolute rows [base(layer), ...): a
pass slides it down when full, keeping K = W - 1 + max(W, 64) rows below the
pass's lowest position (the window, and rows that compact / truncate may go
back to), in min(capacity, K + W + 1) rows (K + W + T for passes of T > W + 1
rows): see csrc/model/kv_cache.h. Units: rows = tokens, nbytes = bytes.)doc")
      .def(py::init(&make_cache), py::arg("n_layers"), py::arg("n_kv_heads"), py::arg("head_dim"),
           py::arg("capacity"), py::arg("dtype") = "float32", py::kw_only(),
           py::arg("layer_windows") = std::vector<int64_t>())
      .def_property_readonly("length", &KVCache::length, "Rows (tokens) committed.")
      .def_property_readonly("capacity", &KVCache::capacity,
                             "Absolute rows a pass may reach without reallocating (full layers hold them all).")
      .def_property_readonly("nbytes", &KVCache::nbytes, "Bytes allocated for keys and values, every layer.")
      .def("window", [](const KVCache& c, int64_t l) { return c.window(cache_layer(c, l)); }, py::arg("layer"),
           "The layer's window in rows (0: it keeps every row).")
      .def("base", [](const KVCache& c, int64_t l) { return c.base(cache_layer(c, l)); }, py::arg("layer"),
           "The first absolute row the layer still holds (0 for a full layer).")
      .def("layer_capacity", [](const KVCache& c, int64_t l) { return c.layer_capacity(cache_layer(c, l)); },
           py::arg("layer"), "Rows allocated for the layer.")
      .def_property_readonly("slides", &KVCache::slides,
                             "Times the windowed layers slid their rows down so far (a counter for tests).")
      .def_property_readonly("n_layers", &KVCache::n_layers)
      .def_property_readonly("n_kv_heads", &KVCache::n_kv_heads)
      .def_property_readonly("head_dim", &KVCache::head_dim)
      .def_property_readonly("dtype", [](const KVCache& c) {
        return std::string(c.dtype() == ElemType::kF32 ? "float32" : "bfloat16");
      })
      .def_property_readonly("rows_moved", &KVCache::rows_moved,
                             "Rows moved by compact() so far (a counter for tests).")
      .def("truncate", [](KVCache& c, int64_t n) {
             if (n < 0) throw py::value_error("cannot truncate to " + std::to_string(n) + " rows");
             c.truncate(static_cast<size_t>(n));
           }, py::arg("n"),
           "Keep the first n rows (0 <= n <= length; ValueError otherwise; RuntimeError if the "
           "windowed layers dropped rows a pass after n rows needs).")
      .def("reserve", [](KVCache& c, int64_t n) { c.reserve(non_negative(n, "n_rows")); },
           py::arg("n_rows"),
           "Room for at least n_rows rows: full layers grow to max(n_rows, 2 * capacity), copying only "
           "committed rows (windowed layers grow when a pass needs it).")
      .def("compact", &cache_compact, py::arg("keep"),
           "Keep rows keep (int64, strictly increasing, < length), moved to the front; "
           "only rows with keep[i] != i are copied. ValueError for a bad keep; RuntimeError as truncate.")
      .def("layer_rows", &cache_layer_rows, py::arg("layer"),
           "float32 copies (k, v) of the committed rows the layer holds, rows base(layer)..length: "
           "[n_kv_heads, length - base(layer), head_dim] each.")
      .attr("MIN_ROLLBACK") = KVCache::kMinRollback;

  py::class_<LayerLayout>(m, "LayerLayout", R"doc(Where one layer's tensors lie in its byte buffer.

LayerLayout(entries): entries are (name, byte offset, ggml type id, shape
outermost first), names relative to the layer (input_layernorm.weight,
self_attn.q_proj.weight, ..., mlp.down_proj.weight; q/k/v biases optional).
ValueError for an unknown or repeated name.)doc")
      .def(py::init(&make_layout), py::arg("entries"))
      .def_property_readonly("entries", &layout_entries);

  py::class_<NativeModel>(m, "NativeModel", R"doc(A decoder's layers in fp32 (native).

NativeModel(hidden, n_heads, n_kv_heads, head_dim, intermediate, rms_eps, rope_theta, *,
qk_norm, sandwich_norms, activation, rope_dims, rope_theta_local, rope_linear,
rope_freq_factors, rope_attn_factor, attn_scale, sliding_window, layer_kinds):
the block lever.model_config.ModelConfig describes (its fields of those names;
layer_kinds one of "g", "l", "n" per layer, "" all "g").
One pass: begin_pass(positions, mask, cache); layer(x, layout, buffer, cache, i)
for every layer; end_pass(cache). Each row's result depends only on that row,
its position and the cache rows its mask lets it see (bitwise).)doc")
      .def(py::init(&make_model), py::arg("hidden"), py::arg("n_heads"), py::arg("n_kv_heads"),
           py::arg("head_dim"), py::arg("intermediate"), py::arg("rms_eps"), py::arg("rope_theta"),
           py::kw_only(), py::arg("qk_norm") = false, py::arg("sandwich_norms") = false,
           py::arg("activation") = "silu", py::arg("rope_dims") = 0, py::arg("rope_theta_local") = 0.0f,
           py::arg("rope_linear") = 1.0f, py::arg("rope_freq_factors") = std::vector<float>(),
           py::arg("rope_attn_factor") = 1.0f, py::arg("attn_scale") = 0.0f, py::arg("sliding_window") = 0,
           py::arg("layer_kinds") = "")
      .def_property_readonly("hidden", [](const NativeModel& mo) { return mo.dims().hidden; })
      .def_property_readonly("n_heads", [](const NativeModel& mo) { return mo.dims().n_heads; })
      .def_property_readonly("n_kv_heads", [](const NativeModel& mo) { return mo.dims().n_kv_heads; })
      .def_property_readonly("head_dim", [](const NativeModel& mo) { return mo.dims().head_dim; })
      .def_property_readonly("intermediate",
                             [](const NativeModel& mo) { return mo.dims().intermediate; })
      .def_property_readonly("rms_eps", &NativeModel::rms_eps)
      .def_property_readonly("rope_theta", &NativeModel::rope_theta)
      .def("check_layout", &model_check_layout, py::arg("layout"), py::arg("buffer_nbytes"),
           "ValueError naming the bad or missing tensor of a layer laid out in buffer_nbytes bytes.")
      .def("begin_pass", &model_begin_pass, py::arg("positions"), py::arg("mask"), py::arg("cache"),
           R"doc(Start a pass of T tokens: positions int64 [T]; mask C-contiguous bool
[T, cache.length + T] (True: may attend). RuntimeError if the rows do not fit
the cache's capacity (call cache.reserve first).)doc")
      .def("layer", &model_layer, py::arg("x"), py::arg("layout"), py::arg("buffer"),
           py::arg("cache"), py::arg("layer_index"),
           "Run one layer on x (C-contiguous float32 [T, hidden], in place), weights in buffer "
           "(1-D uint8) laid out by layout. Releases the GIL.")
      .def("keep_rows", &model_keep_rows, py::arg("x"), py::arg("keep"),
           R"doc(Keep live rows `keep` of the open pass (early exit): x (C-contiguous
float32 [T_live, hidden]) gets x[:n] = x[keep] in place, and so do the rows'
rotary angles, mask rows and cache rows; later layers take x[:n] and write
each kept row's keys / values at the cache row of its original position in
the pass. keep: int64 [n], strictly increasing, keep[0] == 0, < T_live
(indices of the live rows now; may be called several times per pass).
end_pass still commits all T rows. ValueError for a bad keep.)doc")
      .def_property_readonly("live_rows", &NativeModel::live_rows,
                             "Rows still running in the open pass (0 if none is open).")
      .def("end_pass", &NativeModel::end_pass, py::arg("cache"),
           "Commit the pass's T rows to the cache (length += T).")
      .def("begin_segments", &model_begin_segments, py::arg("segments"),
           R"doc(Start a pass of several sequences (segments): segments is a list of
(positions int64 [T_s], mask C-contiguous bool [T_s, cache_s.length + T_s],
cache_s), each cache a distinct KVCache. x of layer_segments holds every
segment's rows, segment after segment; each segment attends over its own
cache only. ValueError / RuntimeError as begin_pass, naming the segment.)doc")
      .def("layer_segments", &model_layer_segments, py::arg("x"), py::arg("layout"), py::arg("buffer"),
           py::arg("caches"), py::arg("layer_index"),
           "Run one layer on the rows of every segment (x C-contiguous float32 [sum T_s, hidden], in "
           "place); caches: the segments' caches, in begin_segments order. Releases the GIL.")
      .def("end_segments", &model_end_segments, py::arg("caches"),
           "Commit every segment's rows to its cache (length += T_s).")
      .def_property_readonly("segments", &NativeModel::segments,
                             "Segments of the open pass (0 if none is open).")
      .def("embed", &model_embed, py::arg("table"), py::arg("qtype"), py::arg("n_rows"),
           py::arg("ids"), py::arg("out"),
           "out[t] = row ids[t] of an [n_rows, hidden] table of ggml qtype bytes, as float32.")
      .def("rms_norm", &model_rms_norm, py::arg("x"), py::arg("weight"), py::arg("out"),
           "out = rms_norm(x) * weight for float32 x, out [R, hidden] and weight [hidden].");

  m.def("probe_scores", &probe_scores, py::arg("x"), py::arg("parent_rows"), py::arg("parents"),
        py::arg("table"), py::arg("qtype"), py::arg("norm_w"), py::arg("eps"),
        py::arg("draft_logp"), py::arg("sibling_rank"), py::arg("depth"), py::arg("weights"),
        py::arg("lens_out"), py::arg("logit_out"),
        R"doc(Early-exit probe scores of n tree nodes (lever.probe).

x float32 [T_live, H] (C-contiguous): hidden states after the probe's layer;
parent_rows int64 [n]: the row of x holding each node's parent; parents
int64 [n]: each node's parent id (equal parents: siblings); table uint8
(C-contiguous, n * row_bytes bytes): row j = the output head row of node j's
token, ggml type qtype; norm_w float32 [H]: the final norm weight; eps: its
epsilon; draft_logp, sibling_rank, depth float32 [n]; weights float64 [6].
Writes lens_out and logit_out (float32 [n]):
  lens[j] = rms_norm(x[parent_rows[j]]) * norm_w . dequant(table row j)  (fp32)
  margin[j] = lens[j] - max(lens[i] : parents[i] == parents[j])
  logit[j] = w0 + w1 lens + w2 margin + w3 draft_logp + w4 sibling_rank + w5 depth
ValueError naming a bad argument. Releases the GIL.)doc");
  m.def("prune_closure", &prune_closure, py::arg("parents"), py::arg("keep_self"),
        R"doc(kept (bool [n]): node j kept iff keep_self[j] and its parent is kept; node 0
always kept. parents int64 [n] (parents[0] == -1, 0 <= parents[j] < j);
keep_self bool or uint8 [n]. ValueError for bad parents or lengths.)doc");

  m.def("linear", &linear, py::arg("x"), py::arg("w"), py::arg("qtype"), py::arg("n_rows"),
        py::arg("out"),
        R"doc(out = x W^T: x float32 [R, K]; w 1-D uint8, an [n_rows, K] matrix of ggml
qtype (quantised with a kernel, or F32/F16/BF16); out float32 [R, n_rows],
rows contiguous (row stride may be larger: a slice of a wider array).
Rows are independent (bitwise). Releases the GIL.)doc");
  m.def("argmax_update", &argmax_update, py::arg("h"), py::arg("w"), py::arg("qtype"),
        py::arg("n_rows"), py::arg("row_offset"), py::arg("best_val"), py::arg("best_idx"),
        R"doc(Running argmax over a slice of the head's rows: for each row r of h
(float32 [R, K]) and weight row n (an [n_rows, K] matrix, 1-D uint8 of qtype),
if h[r] . W[n] > best_val[r] then best_val[r], best_idx[r] = it, row_offset + n.
Scored 1024 rows at a time: no [R, vocab] array. Strictly greater keeps the
first maximum. best_val float32 [R] (start at -inf), best_idx int64 [R].)doc");
  m.def("topk_update", &topk_update, py::arg("h"), py::arg("w"), py::arg("qtype"),
        py::arg("n_rows"), py::arg("row_offset"), py::arg("best_val"), py::arg("best_idx"),
        py::arg("run_max"), py::arg("run_sum"),
        R"doc(Running top-k and log-sum-exp over a slice of the head's rows (h float32
[R, K]; w 1-D uint8, an [n_rows, K] matrix of qtype; token id = row_offset + n).
best_val float32 [R, k] and best_idx int64 [R, k] (C-contiguous) keep each
row's k best logits, largest first, equal logits by lower token id; start
them at -inf and INT64_MAX. run_max float32 [R] (start -inf) and run_sum
float64 [R] (start 0) keep the log-sum-exp of every logit seen: log-probs are
best_val - (run_max + log(run_sum)). Scored 1024 rows at a time: no
[R, vocab] array. Rows are independent (bitwise), and the result does not
depend on how the vocabulary is split into calls. Releases the GIL.)doc");
}

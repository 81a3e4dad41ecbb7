// Layer tensor layout checks (see layer_layout.h).

#include "model/layer_layout.h"

#include <stdexcept>

#include "kernels/dequant.h"
#include "model/dense_matmul.h"

namespace lever {
namespace {

const char* const kKnownNames[] = {
    "input_layernorm.weight",   "self_attn.q_proj.weight",  "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",  "self_attn.q_proj.bias",    "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",    "self_attn.o_proj.weight",  "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",     "mlp.up_proj.weight",       "mlp.down_proj.weight",
    "self_attn.q_norm.weight",  "self_attn.k_norm.weight",  "self_attn.post_norm.weight",
    "mlp.post_norm.weight",
};

bool known(const std::string& name) {
  for (const char* k : kKnownNames) {
    if (name == k) return true;
  }
  return false;
}

std::string shape_str(const std::vector<size_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

[[noreturn]] void bad(const std::string& name, const std::string& why) {
  throw std::invalid_argument("layer tensor " + name + ": " + why);
}

// Checks that entry e holds `shape` (rows, cols for a matrix; one length for a
// vector) inside a buffer of n bytes, and resolves it.
TensorView check(const TensorEntry& e, const std::vector<size_t>& shape, bool matrix,
                 const uint8_t* buffer, size_t n) {
  if (e.shape != shape) bad(e.name, "shape " + shape_str(e.shape) + ", expected " + shape_str(shape));
  const bool type_ok = matrix ? is_matrix_type(e.type) : is_dense_type(e.type);
  if (!type_ok) {
    bad(e.name, std::string("type ") + type_name(e.type) + " (" + std::to_string(e.type) +
                    ") is not supported for a " + (matrix ? "matrix" : "vector"));
  }
  TensorView v;
  v.type = e.type;
  v.rows = matrix ? shape[0] : 1;
  v.cols = matrix ? shape[1] : shape[0];
  size_t size;
  try {
    size = v.rows * row_bytes(e.type, v.cols);
  } catch (const std::invalid_argument& err) {
    bad(e.name, err.what());
  }
  if (e.offset > n || size > n - e.offset) {
    bad(e.name, "bytes [" + std::to_string(e.offset) + ", " + std::to_string(e.offset + size) +
                    ") lie outside the layer buffer of " + std::to_string(n) + " bytes");
  }
  v.data = buffer ? buffer + e.offset : nullptr;
  return v;
}

}  // namespace

LayerLayout::LayerLayout(std::vector<TensorEntry> entries) : entries_(std::move(entries)) {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!known(entries_[i].name)) bad(entries_[i].name, "unknown tensor name");
    for (size_t j = 0; j < i; ++j) {
      if (entries_[j].name == entries_[i].name) bad(entries_[i].name, "listed twice");
    }
  }
}

const TensorEntry* LayerLayout::find(const std::string& name) const {
  for (const TensorEntry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

LayerTensors LayerLayout::resolve(const LayerDims& d, const uint8_t* buffer, size_t n) const {
  auto need = [&](const char* name) -> const TensorEntry& {
    const TensorEntry* e = find(name);
    if (!e) bad(name, "missing");
    return *e;
  };
  const size_t q_rows = d.n_heads * d.head_dim, kv_rows = d.n_kv_heads * d.head_dim;
  LayerTensors t;
  t.input_norm = check(need("input_layernorm.weight"), {d.hidden}, false, buffer, n);
  t.q = check(need("self_attn.q_proj.weight"), {q_rows, d.hidden}, true, buffer, n);
  t.k = check(need("self_attn.k_proj.weight"), {kv_rows, d.hidden}, true, buffer, n);
  t.v = check(need("self_attn.v_proj.weight"), {kv_rows, d.hidden}, true, buffer, n);
  t.o = check(need("self_attn.o_proj.weight"), {d.hidden, q_rows}, true, buffer, n);
  t.post_norm = check(need("post_attention_layernorm.weight"), {d.hidden}, false, buffer, n);
  t.gate = check(need("mlp.gate_proj.weight"), {d.intermediate, d.hidden}, true, buffer, n);
  t.up = check(need("mlp.up_proj.weight"), {d.intermediate, d.hidden}, true, buffer, n);
  t.down = check(need("mlp.down_proj.weight"), {d.hidden, d.intermediate}, true, buffer, n);

  if (d.qk_norm) {
    t.q_norm = check(need("self_attn.q_norm.weight"), {d.head_dim}, false, buffer, n);
    t.k_norm = check(need("self_attn.k_norm.weight"), {d.head_dim}, false, buffer, n);
  }
  if (d.sandwich_norms) {
    t.attn_out_norm = check(need("self_attn.post_norm.weight"), {d.hidden}, false, buffer, n);
    t.mlp_out_norm = check(need("mlp.post_norm.weight"), {d.hidden}, false, buffer, n);
  }
  const char* bias_names[3] = {"self_attn.q_proj.bias", "self_attn.k_proj.bias",
                               "self_attn.v_proj.bias"};
  int n_bias = 0;
  for (const char* b : bias_names) n_bias += find(b) != nullptr;
  if (n_bias != 0 && n_bias != 3) {
    for (const char* b : bias_names) {
      if (!find(b)) bad(b, "missing (q/k/v biases come all three or none)");
    }
  }
  if (n_bias == 3) {
    t.q_bias = check(need(bias_names[0]), {q_rows}, false, buffer, n);
    t.k_bias = check(need(bias_names[1]), {kv_rows}, false, buffer, n);
    t.v_bias = check(need(bias_names[2]), {kv_rows}, false, buffer, n);
    t.has_bias = true;
  }
  return t;
}

}  // namespace lever

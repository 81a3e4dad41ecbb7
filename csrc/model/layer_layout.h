// Where one decoder layer's tensors lie in a byte buffer.
//
// A layer's weights arrive as one buffer (read from a GGUF file or a store
// extent); a LayerLayout lists each tensor's name, byte offset in that
// buffer, ggml type and shape. Names are relative to the layer, in Hugging
// Face form:
//   input_layernorm.weight              [hidden]
//   self_attn.q_proj.weight             [n_heads * head_dim, hidden]
//   self_attn.k_proj.weight             [n_kv_heads * head_dim, hidden]
//   self_attn.v_proj.weight             [n_kv_heads * head_dim, hidden]
//   self_attn.{q,k,v}_proj.bias         [rows of the matching weight]  (optional: all or none)
//   self_attn.o_proj.weight             [hidden, n_heads * head_dim]
//   post_attention_layernorm.weight     [hidden]
//   mlp.gate_proj.weight, mlp.up_proj.weight   [intermediate, hidden]
//   mlp.down_proj.weight                [hidden, intermediate]
//   self_attn.{q,k}_norm.weight         [head_dim]  (when dims.qk_norm)
//   self_attn.post_norm.weight, mlp.post_norm.weight   [hidden]  (when dims.sandwich_norms)
// Shapes are outermost first (rows, columns), as torch writes them.
// Matrices may be any type weight_matmul accepts; vectors F32 / F16 / BF16.
//
// Units: offsets and sizes in bytes, shapes in elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lever {

struct TensorEntry {
  std::string name;
  size_t offset;  // bytes from the start of the layer's buffer
  int type;       // ggml type id
  std::vector<size_t> shape;  // outermost first
};

// The model dimensions a layer's tensors must match (elements), and which
// optional norms a layer has.
struct LayerDims {
  size_t hidden, n_heads, n_kv_heads, head_dim, intermediate;
  bool qk_norm = false;         // per-head q / k norms
  bool sandwich_norms = false;  // norms after attention and after the MLP
};

// A checked tensor of a layer: its bytes in the buffer, its type and shape.
struct TensorView {
  const uint8_t* data = nullptr;  // nullptr: absent (optional biases only)
  int type = 0;
  size_t rows = 0, cols = 0;      // vectors: rows = 1, cols = length
};

// The tensors decoder_layer uses, resolved against one buffer.
struct LayerTensors {
  TensorView input_norm, q, k, v, q_bias, k_bias, v_bias, o, post_norm, gate, up, down;
  TensorView q_norm, k_norm;              // dims.qk_norm only
  TensorView attn_out_norm, mlp_out_norm;  // dims.sandwich_norms only
  bool has_bias = false;  // the q/k/v biases are present
};

class LayerLayout {
 public:
  // Throws std::invalid_argument for an unknown or repeated name.
  explicit LayerLayout(std::vector<TensorEntry> entries);
  const std::vector<TensorEntry>& entries() const { return entries_; }

  // Checks every tensor against the model dims and a buffer of buffer_nbytes
  // bytes (types, shapes, byte sizes, bounds, missing tensors) and returns
  // them resolved against `buffer` (may be nullptr for a check only).
  // Throws std::invalid_argument naming the bad or missing tensor.
  LayerTensors resolve(const LayerDims& dims, const uint8_t* buffer, size_t buffer_nbytes) const;

 private:
  const TensorEntry* find(const std::string& name) const;
  std::vector<TensorEntry> entries_;
};

}  // namespace lever

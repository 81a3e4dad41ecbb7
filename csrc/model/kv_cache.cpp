// KV cache (see kv_cache.h).

#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/block_bytes.h"  // bf16_to_float, load_u16
#include "kernels/dequant.h"  // fp32_to_bf16

namespace lever {
namespace {

std::unique_ptr<uint8_t[]> alloc_bytes(size_t n) {
  return std::unique_ptr<uint8_t[]>(new uint8_t[n]);  // not zeroed: rows are written before use
}

// The lowest absolute row a pass after n committed rows may see through a
// window of w positions (cache row c holds position c; the pass starts at n).
size_t lowest_seen(size_t n, size_t w) { return n > w - 1 ? n - (w - 1) : 0; }

}  // namespace

KVCache::KVCache(size_t n_layers, size_t n_kv_heads, size_t head_dim, size_t capacity,
                 ElemType dtype, std::vector<size_t> windows)
    : n_kv_heads_(n_kv_heads), head_dim_(head_dim), capacity_(std::max<size_t>(1, capacity)),
      dtype_(dtype) {
  if (n_layers == 0 || n_kv_heads == 0 || head_dim == 0) {
    throw std::invalid_argument("KVCache: n_layers, n_kv_heads and head_dim must be positive");
  }
  if (!windows.empty() && windows.size() != n_layers) {
    throw std::invalid_argument("KVCache: " + std::to_string(windows.size()) + " layer windows for " +
                                std::to_string(n_layers) + " layers");
  }
  windows.resize(n_layers, 0);
  for (size_t w : windows) max_window_ = std::max(max_window_, w);
  keep_ = max_window_ ? max_window_ - 1 + std::max(max_window_, kMinRollback) : 0;
  local_cap_ = max_window_ ? std::min(capacity_, keep_ + max_window_ + 1) : 0;
  layers_.resize(n_layers);
  for (size_t l = 0; l < n_layers; ++l) {
    layers_[l].window = windows[l];
    const size_t bytes = n_kv_heads_ * layer_capacity(l) * row_bytes();
    layers_[l].k = alloc_bytes(bytes);
    layers_[l].v = alloc_bytes(bytes);
  }
}

size_t KVCache::nbytes() const {
  size_t rows = 0;
  for (size_t l = 0; l < layers_.size(); ++l) rows += layer_capacity(l);
  return 2 * n_kv_heads_ * rows * row_bytes();
}

uint8_t* KVCache::row_ptr(uint8_t* data, size_t layer, size_t head, size_t srow) const {
  return data + (head * layer_capacity(layer) + srow) * row_bytes();
}

void KVCache::check_keeps(size_t n, const char* what) const {
  if (max_window_ == 0 || n == 0 || base_ <= lowest_seen(n, max_window_)) return;
  throw std::runtime_error(std::string(what) + " the KV cache to " + std::to_string(n) +
                           " rows would need rows from " + std::to_string(lowest_seen(n, max_window_)) +
                           " on, but its sliding-window layers (window " + std::to_string(max_window_) +
                           ") dropped the rows below " + std::to_string(base_) +
                           ": start a new cache and prefill it instead");
}

void KVCache::truncate(size_t n) {
  if (n > length_) {
    throw std::invalid_argument("cannot truncate a cache of " + std::to_string(length_) +
                                " rows to " + std::to_string(n));
  }
  check_keeps(n, "cutting");
  if (n == 0) base_ = 0;
  length_ = n;
}

void KVCache::reserve(size_t n_rows) {
  if (n_rows <= capacity_) return;
  const size_t new_cap = std::max(n_rows, 2 * capacity_);
  const size_t rb = row_bytes();
  for (Layer& layer : layers_) {
    if (layer.window) continue;  // its storage does not follow capacity (prepare grows it)
    std::unique_ptr<uint8_t[]> k = alloc_bytes(n_kv_heads_ * new_cap * rb);
    std::unique_ptr<uint8_t[]> v = alloc_bytes(n_kv_heads_ * new_cap * rb);
    // Each head's committed rows are contiguous in both layouts.
    for (size_t h = 0; h < n_kv_heads_; ++h) {
      std::memcpy(k.get() + h * new_cap * rb, layer.k.get() + h * capacity_ * rb, length_ * rb);
      std::memcpy(v.get() + h * new_cap * rb, layer.v.get() + h * capacity_ * rb, length_ * rb);
    }
    layer.k = std::move(k);
    layer.v = std::move(v);
  }
  capacity_ = new_cap;
}

void KVCache::compact(const int64_t* keep, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (keep[i] < 0 || static_cast<size_t>(keep[i]) >= length_) {
      throw std::invalid_argument("compact: keep[" + std::to_string(i) + "] = " +
                                  std::to_string(keep[i]) + " is outside the " +
                                  std::to_string(length_) + " committed rows");
    }
    if (i > 0 && keep[i] <= keep[i - 1]) {
      throw std::invalid_argument("compact: keep must be strictly increasing (keep[" +
                                  std::to_string(i) + "] = " + std::to_string(keep[i]) + ")");
    }
  }
  check_keeps(n, "compacting");
  // keep[i] >= i, so a source row is never overwritten before it is read; a
  // windowed layer holds row i >= base, and keep[i] >= i with it.
  const size_t rb = row_bytes();
  for (size_t i = 0; i < n; ++i) {
    const auto src = static_cast<size_t>(keep[i]);
    if (src == i) continue;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const size_t b = base(l);
      if (i < b) continue;
      Layer& layer = layers_[l];
      for (size_t h = 0; h < n_kv_heads_; ++h) {
        std::memcpy(row_ptr(layer.k.get(), l, h, i - b), row_ptr(layer.k.get(), l, h, src - b), rb);
        std::memcpy(row_ptr(layer.v.get(), l, h, i - b), row_ptr(layer.v.get(), l, h, src - b), rb);
      }
    }
    ++rows_moved_;
  }
  if (n == 0) base_ = 0;
  length_ = n;
}

void KVCache::check_fits(size_t n_rows) const {
  if (n_rows > capacity_) {
    throw std::runtime_error("KV cache overflow: " + std::to_string(n_rows) + " rows > capacity " +
                             std::to_string(capacity_));
  }
}

void KVCache::prepare(size_t T, size_t keep_from) {
  check_fits(length_ + T);
  const size_t end = length_ + T;
  if (max_window_ == 0 || end - base_ <= local_cap_) return;
  const size_t low = std::min(keep_from, length_);
  const size_t floor = std::max(base_, low > keep_ ? low - keep_ : 0);
  const size_t need = end - floor;
  const size_t cap =
      need > local_cap_ ? std::min(capacity_, std::max(need, keep_ + max_window_ + T)) : local_cap_;
  const size_t rb = row_bytes(), kept = length_ - floor, from = floor - base_;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    if (!layer.window) continue;
    if (cap == local_cap_) {  // slide in place: rows [floor, length) to storage row 0
      for (size_t h = 0; h < n_kv_heads_; ++h) {
        uint8_t* k = layer.k.get() + h * local_cap_ * rb;
        uint8_t* v = layer.v.get() + h * local_cap_ * rb;
        if (from > 0 && kept > 0) {
          std::memmove(k, k + from * rb, kept * rb);
          std::memmove(v, v + from * rb, kept * rb);
        }
      }
      continue;
    }
    std::unique_ptr<uint8_t[]> k = alloc_bytes(n_kv_heads_ * cap * rb);
    std::unique_ptr<uint8_t[]> v = alloc_bytes(n_kv_heads_ * cap * rb);
    for (size_t h = 0; h < n_kv_heads_; ++h) {
      if (kept == 0) continue;
      std::memcpy(k.get() + h * cap * rb, layer.k.get() + (h * local_cap_ + from) * rb, kept * rb);
      std::memcpy(v.get() + h * cap * rb, layer.v.get() + (h * local_cap_ + from) * rb, kept * rb);
    }
    layer.k = std::move(k);
    layer.v = std::move(v);
  }
  if (from > 0) ++slides_;
  base_ = floor;
  local_cap_ = cap;
}

void KVCache::check_slot(size_t layer, size_t slot) const {
  check_fits(slot + 1);
  const size_t b = base(layer);
  if (slot < b || slot - b >= layer_capacity(layer)) {
    throw std::runtime_error("KV cache: row " + std::to_string(slot) + " is outside the rows [" +
                             std::to_string(b) + ", " + std::to_string(b + layer_capacity(layer)) +
                             ") sliding-window layer " + std::to_string(layer) +
                             " holds (a pass calls prepare first)");
  }
}

void KVCache::write_row(size_t layer, const float* k, const float* v, size_t slot) {
  Layer& lay = layers_[layer];
  const size_t srow = slot - base(layer);
  for (size_t h = 0; h < n_kv_heads_; ++h) {
    const float* ks = k + h * head_dim_;
    const float* vs = v + h * head_dim_;
    uint8_t* kd = row_ptr(lay.k.get(), layer, h, srow);
    uint8_t* vd = row_ptr(lay.v.get(), layer, h, srow);
    if (dtype_ == ElemType::kF32) {
      std::memcpy(kd, ks, head_dim_ * sizeof(float));
      std::memcpy(vd, vs, head_dim_ * sizeof(float));
    } else {
      auto* kb = reinterpret_cast<uint16_t*>(kd);
      auto* vb = reinterpret_cast<uint16_t*>(vd);
      for (size_t c = 0; c < head_dim_; ++c) {
        kb[c] = fp32_to_bf16(ks[c]);
        vb[c] = fp32_to_bf16(vs[c]);
      }
    }
  }
}

void KVCache::write(size_t layer, const float* k, const float* v, size_t T, size_t stride) {
  if (layer >= layers_.size()) throw std::invalid_argument("KVCache: layer index out of range");
  for (size_t t = 0; t < T; ++t) check_slot(layer, length_ + t);
  for (size_t t = 0; t < T; ++t) write_row(layer, k + t * stride, v + t * stride, length_ + t);
}

void KVCache::write_rows(size_t layer, const float* k, const float* v, const size_t* slots,
                         size_t n, size_t stride) {
  if (layer >= layers_.size()) throw std::invalid_argument("KVCache: layer index out of range");
  for (size_t t = 0; t < n; ++t) check_slot(layer, slots[t]);
  for (size_t t = 0; t < n; ++t) write_row(layer, k + t * stride, v + t * stride, slots[t]);
}

void KVCache::advance(size_t n) {
  check_fits(length_ + n);
  if (max_window_ && length_ + n - base_ > local_cap_) {
    throw std::runtime_error("KV cache overflow: rows up to " + std::to_string(length_ + n) +
                             " do not fit the sliding-window layers' rows [" + std::to_string(base_) +
                             ", " + std::to_string(base_ + local_cap_) + ") (a pass calls prepare first)");
  }
  length_ += n;
}

const void* KVCache::keys_at(size_t layer, size_t row) const {
  if (row < base(layer)) {
    throw std::invalid_argument("KVCache: layer " + std::to_string(layer) + " no longer holds row " +
                                std::to_string(row));
  }
  return layers_[layer].k.get() + (row - base(layer)) * row_bytes();
}

const void* KVCache::values_at(size_t layer, size_t row) const {
  if (row < base(layer)) {
    throw std::invalid_argument("KVCache: layer " + std::to_string(layer) + " no longer holds row " +
                                std::to_string(row));
  }
  return layers_[layer].v.get() + (row - base(layer)) * row_bytes();
}

void KVCache::read_rows(size_t layer, float* k_out, float* v_out) const {
  if (layer >= layers_.size()) throw std::invalid_argument("KVCache: layer index out of range");
  const Layer& lay = layers_[layer];
  const size_t b = base(layer), n = length_ - std::min(length_, b);
  for (size_t h = 0; h < n_kv_heads_; ++h) {
    for (size_t r = 0; r < n; ++r) {
      const uint8_t* ks = row_ptr(lay.k.get(), layer, h, r);
      const uint8_t* vs = row_ptr(lay.v.get(), layer, h, r);
      float* kd = k_out + (h * n + r) * head_dim_;
      float* vd = v_out + (h * n + r) * head_dim_;
      if (dtype_ == ElemType::kF32) {
        std::memcpy(kd, ks, head_dim_ * sizeof(float));
        std::memcpy(vd, vs, head_dim_ * sizeof(float));
      } else {
        for (size_t c = 0; c < head_dim_; ++c) {
          kd[c] = block_bytes::bf16_to_float(block_bytes::load_u16(ks + 2 * c));
          vd[c] = block_bytes::bf16_to_float(block_bytes::load_u16(vs + 2 * c));
        }
      }
    }
  }
}

}  // namespace lever

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

}  // namespace

KVCache::KVCache(size_t n_layers, size_t n_kv_heads, size_t head_dim, size_t capacity,
                 ElemType dtype)
    : n_layers_(n_layers), n_kv_heads_(n_kv_heads), head_dim_(head_dim),
      capacity_(std::max<size_t>(1, capacity)), dtype_(dtype) {
  if (n_layers == 0 || n_kv_heads == 0 || head_dim == 0) {
    throw std::invalid_argument("KVCache: n_layers, n_kv_heads and head_dim must be positive");
  }
  k_ = alloc_bytes(nbytes() / 2);
  v_ = alloc_bytes(nbytes() / 2);
}

uint8_t* KVCache::row_ptr(uint8_t* base, size_t layer, size_t head, size_t row) const {
  return base + (((layer * n_kv_heads_ + head) * capacity_ + row) * head_dim_) * elem_bytes();
}

void KVCache::truncate(size_t n) {
  if (n > length_) {
    throw std::invalid_argument("cannot truncate a cache of " + std::to_string(length_) +
                                " rows to " + std::to_string(n));
  }
  length_ = n;
}

void KVCache::reserve(size_t n_rows) {
  if (n_rows <= capacity_) return;
  const size_t new_cap = std::max(n_rows, 2 * capacity_);
  const size_t row_bytes = head_dim_ * elem_bytes();
  const size_t old_cap = capacity_;
  std::unique_ptr<uint8_t[]> k = alloc_bytes(n_layers_ * n_kv_heads_ * new_cap * row_bytes);
  std::unique_ptr<uint8_t[]> v = alloc_bytes(n_layers_ * n_kv_heads_ * new_cap * row_bytes);
  // Each (layer, head) block of committed rows is contiguous in both layouts.
  for (size_t lh = 0; lh < n_layers_ * n_kv_heads_; ++lh) {
    std::memcpy(k.get() + lh * new_cap * row_bytes, k_.get() + lh * old_cap * row_bytes,
                length_ * row_bytes);
    std::memcpy(v.get() + lh * new_cap * row_bytes, v_.get() + lh * old_cap * row_bytes,
                length_ * row_bytes);
  }
  k_ = std::move(k);
  v_ = std::move(v);
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
  // keep[i] >= i, so a source row is never overwritten before it is read.
  const size_t row_bytes = head_dim_ * elem_bytes();
  for (size_t i = 0; i < n; ++i) {
    const auto src = static_cast<size_t>(keep[i]);
    if (src == i) continue;
    for (size_t layer = 0; layer < n_layers_; ++layer) {
      for (size_t h = 0; h < n_kv_heads_; ++h) {
        std::memcpy(row_ptr(k_.get(), layer, h, i), row_ptr(k_.get(), layer, h, src), row_bytes);
        std::memcpy(row_ptr(v_.get(), layer, h, i), row_ptr(v_.get(), layer, h, src), row_bytes);
      }
    }
    ++rows_moved_;
  }
  length_ = n;
}

void KVCache::check_fits(size_t n_rows) const {
  if (n_rows > capacity_) {
    throw std::runtime_error("KV cache overflow: " + std::to_string(n_rows) + " rows > capacity " +
                             std::to_string(capacity_));
  }
}

void KVCache::write_row(size_t layer, const float* k, const float* v, size_t slot) {
  for (size_t h = 0; h < n_kv_heads_; ++h) {
    const float* ks = k + h * head_dim_;
    const float* vs = v + h * head_dim_;
    uint8_t* kd = row_ptr(k_.get(), layer, h, slot);
    uint8_t* vd = row_ptr(v_.get(), layer, h, slot);
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
  if (layer >= n_layers_) throw std::invalid_argument("KVCache: layer index out of range");
  check_fits(length_ + T);
  for (size_t t = 0; t < T; ++t) write_row(layer, k + t * stride, v + t * stride, length_ + t);
}

void KVCache::write_rows(size_t layer, const float* k, const float* v, const size_t* slots,
                         size_t n, size_t stride) {
  if (layer >= n_layers_) throw std::invalid_argument("KVCache: layer index out of range");
  for (size_t t = 0; t < n; ++t) check_fits(slots[t] + 1);
  for (size_t t = 0; t < n; ++t) write_row(layer, k + t * stride, v + t * stride, slots[t]);
}

void KVCache::advance(size_t n) {
  check_fits(length_ + n);
  length_ += n;
}

void KVCache::read_rows(size_t layer, float* k_out, float* v_out) const {
  if (layer >= n_layers_) throw std::invalid_argument("KVCache: layer index out of range");
  for (size_t h = 0; h < n_kv_heads_; ++h) {
    for (size_t r = 0; r < length_; ++r) {
      const uint8_t* ks = row_ptr(k_.get(), layer, h, r);
      const uint8_t* vs = row_ptr(v_.get(), layer, h, r);
      float* kd = k_out + (h * length_ + r) * head_dim_;
      float* vd = v_out + (h * length_ + r) * head_dim_;
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

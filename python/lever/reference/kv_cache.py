"""Key/value cache of one sequence, for every layer of a decoder.

Rows are cache positions (one per token seen).  The cache grows by
`reserve`, gains rows through `write` + `advance`, loses them with
`truncate` (drop the tail) or `compact` (keep rows by index -- the accepted
path of a token tree).  Storage: two tensors of shape
[n_layers, n_kv_heads, capacity, head_dim] in the model's dtype.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, capacity: int = 256):
        self.n_layers, self.n_kv_heads, self.head_dim, self.dtype = n_layers, n_kv_heads, head_dim, dtype
        self.length = 0                       # tokens committed to the cache
        self._k = self._alloc(max(1, capacity))
        self._v = self._alloc(max(1, capacity))

    def _alloc(self, capacity: int) -> torch.Tensor:
        # never an inference tensor, even when a forward (inference mode) grows
        # the cache: compact() and truncate() later run outside inference mode
        with torch.inference_mode(False):
            return torch.empty(self.n_layers, self.n_kv_heads, capacity, self.head_dim, dtype=self.dtype)

    @property
    def capacity(self) -> int:
        """Rows (tokens) the cache holds without reallocating."""
        return self._k.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values."""
        return self._k.numel() * self._k.element_size() * 2

    def reserve(self, n_rows: int) -> None:
        """Make room for at least `n_rows` rows in total (grows by doubling)."""
        if n_rows <= self.capacity:
            return
        new_cap = max(n_rows, 2 * self.capacity)
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = self._alloc(new_cap)
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `k`, `v` ([n_kv_heads, T, head_dim]) after the committed rows of `layer`.

        Returns views of all rows of the layer, committed and new:
        [n_kv_heads, length + T, head_dim].  The new rows count as committed
        only after `advance(T)`, which the decoder calls once per forward.
        """
        t = k.shape[1]
        end = self.length + t
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: {end} rows > capacity {self.capacity}; call reserve() first")
        self._k[layer, :, self.length:end] = k
        self._v[layer, :, self.length:end] = v
        return self._k[layer, :, :end], self._v[layer, :, :end]

    def advance(self, n: int) -> None:
        """Commit the `n` rows written by the last forward."""
        if self.length + n > self.capacity:
            raise RuntimeError("KV cache advanced past its capacity")
        self.length += n

    def truncate(self, n: int) -> None:
        """Keep the first `n` rows (tokens), drop the rest."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} rows to {n}")
        self.length = n

    def compact(self, keep: torch.Tensor) -> None:
        """Keep the rows at the strictly increasing indices `keep`, moved to the front.

        Used after tree verification: keep = committed prefix + accepted path.
        """
        keep = torch.as_tensor(keep, dtype=torch.long)
        if keep.numel():
            if int(keep[0]) < 0 or int(keep[-1]) >= self.length or bool((keep[1:] <= keep[:-1]).any()):
                raise ValueError("compact() needs strictly increasing row indices inside the cache")
        n = keep.numel()
        self._k[:, :, :n] = self._k.index_select(2, keep)
        self._v[:, :, :n] = self._v.index_select(2, keep)
        self.length = n

"""Decoder layers on a static-shape backend: the layer runner and its KV cache.

`StaticLayers` runs the decoder layers of `NativeDecoder` (embedding, final
norm and head stay on the native CPU core) through the bucket graphs of
lever.npu.graph.  For each pass over T rows with L rows cached:

1. `begin`: the native bucket planner (`_native.BucketPlanner`) splits the
   rows into chunks of at most the largest bucket's rows -- chunk c's
   past is L + its first row, since earlier chunks are in the cache by the
   time it runs -- chooses each chunk's (rows, context) bucket and packs
   its positions and additive mask; the rotary tables come from the
   padded positions.  Each kind of layer the model has gets its own inputs
   (one graph serves them all, lever.npu.graph): global layers the global
   RoPE tables and the pass's mask, sliding-window layers the local tables
   and the mask narrowed to the window (`window_mask`), NoPE layers cos = 1,
   sin = 0 (RoPE then leaves q and k exactly as they are) and the pass's mask.
2. `run(i, ...)`: layer i's weights are dequantised from the store's blocks
   into the graph's dtype as each extent arrives (and dropped after the
   layer: kept, they would cost 2-4x the quantised bytes of DRAM that no
   memory plan counts), then every chunk runs the
   bucket's graph: real rows go in, padding rows are zeros, the cache's
   first `context` rows are the past.  Unpacking keeps the real rows'
   outputs and writes their keys/values at their cache rows; padding rows'
   keys/values are discarded.  A real row's output that is not finite (a
   float16 graph's range exceeded) is refused in one line, never passed on.
3. `end`: the T rows are committed.

A tree larger than the largest bucket is *split* this way (exactly: it is
the same attention, run in pieces); `splits` counts such passes.  Probes
(a layer hook that prunes rows) need the native backend.
"""

from __future__ import annotations

import time

import numpy as np

from .. import _native
from ..errors import LeverError
from ..model_config import ModelConfig
from ..quant import in_ggml_layout
from .context import BucketGraphs
from .graph import TENSOR_INPUT, weight_shapes
from .runtime import NpuError


class StaticKVCache:
    """Keys and values of one sequence for a static backend: float arrays
    [n_layers, capacity, n_kv_heads * head_dim] (keys after RoPE) in the
    graph's dtype; rows [0, length) are committed.  A bucket's past is a
    view of the first `context` rows, so capacity never drops below the
    largest context bucket.  Units: rows = tokens, nbytes = bytes."""

    def __init__(self, n_layers: int, kv_cols: int, capacity: int, dtype: str, min_rows: int = 0):
        self.n_layers, self.kv_cols, self.dtype = n_layers, kv_cols, np.dtype(dtype)
        self.min_rows = int(min_rows)
        self.length = 0
        self.rows_moved = 0
        rows = max(int(capacity), self.min_rows, 1)
        self.k = np.zeros((n_layers, rows, kv_cols), dtype=self.dtype)
        self.v = np.zeros_like(self.k)

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def reserve(self, n_rows: int) -> None:
        """Room for at least n_rows rows (grows to max(n_rows, 2 * capacity))."""
        if n_rows <= self.capacity:
            return
        rows = max(int(n_rows), 2 * self.capacity)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = np.zeros((self.n_layers, rows, self.kv_cols), dtype=self.dtype)
            new[:, :self.length] = old[:, :self.length]
            setattr(self, name, new)

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate {self.length} rows to {n}")
        self.length = int(n)

    def compact(self, keep) -> None:
        """Keep rows `keep` (int64, strictly increasing, < length), moved to the front."""
        keep = np.asarray(keep, dtype=np.int64)
        if keep.size and (keep[0] < 0 or keep[-1] >= self.length or np.any(np.diff(keep) <= 0)):
            raise ValueError(f"keep must be strictly increasing rows below {self.length}")
        moved = np.nonzero(keep != np.arange(keep.size))[0]
        if moved.size:
            self.k[:, moved] = self.k[:, keep[moved]]
            self.v[:, moved] = self.v[:, keep[moved]]
            self.rows_moved += int(moved.size)
        self.length = int(keep.size)


def inv_freq(cfg: ModelConfig, local: bool = False) -> np.ndarray:
    """float32 [rotary_dims / 2]: `ModelConfig.inv_freq` as an array."""
    return np.asarray(cfg.inv_freq(local), dtype=np.float32)


def rope_tables(positions: np.ndarray, freqs: np.ndarray, attn_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Rotate-half rotary tables (cos, sin) float32 [N, 2 * len(freqs)] for `positions`
    (both halves of a row hold the same angles, position * freq in float32 as the
    native core), multiplied by `attn_factor`."""
    angles = positions.astype(np.float32)[:, None] * freqs[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    if attn_factor != 1.0:
        cos, sin = cos * np.float32(attn_factor), sin * np.float32(attn_factor)
    return np.concatenate([cos, cos], axis=1), np.concatenate([sin, sin], axis=1)


def window_mask(mask: np.ndarray, positions: np.ndarray, cached: int, window: int) -> np.ndarray:
    """`mask` (bool [T, cached + T]) with every key `window` or more positions
    behind its row hidden: a row at position p sees a key at position k only if
    p - k < window (cache row c < cached holds position c; new row j, positions[j])."""
    keys = np.concatenate([np.arange(cached, dtype=np.int64), positions.astype(np.int64)])
    return mask & ((positions.astype(np.int64)[:, None] - keys[None, :]) < window)


def kind_tables(cfg: ModelConfig, positions: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Layer kind -> its (cos, sin) float32 [N, rotary_dims] at `positions`, for the
    kinds `cfg` has: "g" global RoPE, "l" local RoPE, "n" cos = 1, sin = 0."""
    out = {}
    for kind in set(cfg.layer_kinds or "g"):
        if kind == "n":
            n = (positions.shape[0], cfg.rotary_dims)
            out[kind] = (np.ones(n, np.float32), np.zeros(n, np.float32))
        else:
            out[kind] = rope_tables(positions, inv_freq(cfg, local=kind == "l"), cfg.rope_attn_factor)
    return out


def layer_weights(cfg: ModelConfig, layout, buffer: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
    """Layer tensors as the graph's weight inputs: each dequantised from its
    blocks in `buffer` (uint8) to `dtype`, shaped as torch writes it."""
    shapes = weight_shapes(cfg)
    out = {}
    for name, offset, qtype, shape in layout.entries:
        key = TENSOR_INPUT.get(name)
        if key is None or key not in shapes:
            raise LeverError(f"layer tensor {name!r} has no input in the bucket graph")
        count = int(np.prod(shape))
        nbytes = count // _native.block_size(qtype) * _native.type_size(qtype)
        values = np.empty(count, dtype=dtype)           # float32 or float16: the native core rounds
        data, qtype = in_ggml_layout(buffer[offset:offset + nbytes], qtype, shape)
        _native.dequantize(data, qtype, values)
        out[key] = values.reshape(shapes[key])
    missing = sorted(set(shapes) - set(out))
    if missing:
        raise LeverError(f"the layer lacks tensors for graph inputs {', '.join(missing)}")
    return out


class StaticLayers:
    """The decoder layers on a static-shape backend (see the module docstring).

    graphs: the bucket sessions (lever.npu.context.BucketGraphs); planner:
    a `_native.BucketPlanner` over the compiled row and context buckets.
    keep_weights: keep each layer's dequantised weights after first use
    (tests and small models only: see the module docstring).  Counters:
    passes, chunk_runs (bucket runs, all layers), splits (passes over more
    rows than the largest bucket), rows and padded_rows (real and padding
    rows per layer run), dequant_s (seconds dequantising weights)."""

    fixed_shapes = True

    def __init__(self, cfg: ModelConfig, graphs: BucketGraphs, planner, keep_weights: bool = False):
        self.cfg, self.graphs, self.planner = cfg, graphs, planner
        self.backend = graphs.backend
        self.dtype = graphs.dtype
        self.keep_weights = keep_weights
        self._weights: dict[int, dict[str, np.ndarray]] = {}
        self._chunks: list[tuple] = []
        self._rows = 0
        self.passes = self.chunk_runs = self.splits = self.rows = self.padded_rows = 0
        self.dequant_s = 0.0
        self.used: set[tuple[int, int]] = set()       # (rows, context) buckets run

    def new_cache(self, capacity: int) -> StaticKVCache:
        """A full cache: every layer keeps every row, sliding-window layers too
        (the native cache keeps only their last rows)."""
        cfg = self.cfg
        return StaticKVCache(cfg.n_layers, cfg.n_kv_heads * cfg.head_dim, capacity, self.dtype,
                             min_rows=self.planner.max_context + self.planner.max_rows)

    def begin(self, tokens: np.ndarray, positions: np.ndarray, mask: np.ndarray, cache: StaticKVCache) -> None:
        """Plan and pack the pass's chunks (tokens, positions int64 [T]; mask bool [T, L+T])."""
        if not isinstance(cache, StaticKVCache):
            raise LeverError("a static backend needs the cache its decoder made (new_cache)")
        cfg = self.cfg
        t, past = tokens.shape[0], cache.length
        cache.reserve(max(past + t, self.planner.max_context + self.planner.max_rows))
        self._chunks = []
        try:
            chunks = self.planner.chunks(t, past)
        except ValueError as e:
            raise NpuError(f"a pass of {t} rows over {past} cached ones does not fit the context buckets: {e}") from None
        masks = {"full": mask}                           # the pass's mask, and for local layers the window's
        if "l" in cfg.layer_kinds:
            masks["window"] = window_mask(np.asarray(mask, dtype=bool), positions, past, cfg.sliding_window)
        for start, end, rows, context in chunks:
            ids = np.empty(rows, dtype=np.int64)
            pos = np.empty(rows, dtype=np.int64)
            adds = {}
            for name, m in masks.items():
                adds[name] = np.empty((rows, context + rows), dtype=np.float32)
                self.planner.pack(tokens, positions, m, past, start, end, rows, context, ids, pos, adds[name])
            feeds = {kind: {"cos": cos.astype(self.dtype), "sin": sin.astype(self.dtype),
                            "mask": adds["window" if kind == "l" else "full"].astype(self.dtype)}
                     for kind, (cos, sin) in kind_tables(cfg, pos).items()}     # layer kind -> its inputs
            self._chunks.append((start, end, rows, context, past + start, feeds))
            self.used.add((rows, context))
        self._rows = t
        self.passes += 1
        self.splits += len(self._chunks) > 1

    def run(self, i: int, x: np.ndarray, layout, buffer: np.ndarray, cache: StaticKVCache) -> np.ndarray:
        """Layer i over the pass's rows: x float32 [T, hidden] in, the new x out."""
        weights = self._layer_weights(i, layout, buffer)
        kind = self.cfg.kind(i)
        out = np.empty_like(x)
        for start, end, rows, context, first, feeds in self._chunks:
            n = end - start
            xb = np.zeros((rows, x.shape[1]), dtype=self.dtype)
            xb[:n] = x[start:end]
            y, k_new, v_new = self.graphs.session(rows, context).run(
                None, {"x": xb, **feeds[kind], "past_k": cache.k[i, :context], "past_v": cache.v[i, :context],
                       **weights})
            if not np.all(np.isfinite(y[:n])):
                raise NpuError(f"--backend {self.backend}: layer {i} gave a value outside the {self.dtype} range "
                               f"(not finite): this model's activations do not fit the graph's dtype")
            out[start:end] = y[:n]
            cache.k[i, first:first + n] = k_new[:n]      # padding rows' keys/values are dropped
            cache.v[i, first:first + n] = v_new[:n]
            self.chunk_runs += 1
            self.rows += n
            self.padded_rows += rows - n
        return out

    def end(self, cache: StaticKVCache) -> None:
        cache.length += self._rows
        self._chunks, self._rows = [], 0

    def _layer_weights(self, i: int, layout, buffer: np.ndarray) -> dict[str, np.ndarray]:
        if i in self._weights:
            return self._weights[i]
        t0 = time.perf_counter()
        w = layer_weights(self.cfg, layout, buffer, self.dtype)
        self.dequant_s += time.perf_counter() - t0
        if self.keep_weights:
            self._weights[i] = w
        return w

    @property
    def weight_bytes(self) -> int:
        """Bytes of dequantised weights kept (keep_weights)."""
        return sum(a.nbytes for w in self._weights.values() for a in w.values())

    def report(self) -> dict:
        """Counters for stats JSON."""
        return {"backend": self.backend, "dtype": self.dtype, "passes": self.passes,
                "bucket_runs": self.chunk_runs, "split_passes": self.splits, "rows": self.rows,
                "padded_rows": self.padded_rows, "dequant_s": round(self.dequant_s, 4),
                "buckets_used": [list(b) for b in sorted(self.used)],
                "contexts_compiled": self.graphs.compiled, "compile_s": round(self.graphs.compile_s, 3)}

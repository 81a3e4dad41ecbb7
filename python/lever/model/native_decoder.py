"""The decoder's forward pass in the native core, over any source of weights.

`NativeDecoder` implements the numpy model protocol (see `forward`): tokens,
positions and the attention mask go in as numpy arrays, float32 logits (or the
argmax token of each row, or each row's top-k tokens and log-probs) come
out; the KV cache is a `lever._native.KVCache`.
All arithmetic (embedding, attention, MLP, norms, head) runs in C++
(`lever._native.NativeModel`, `linear`, `argmax_update`, `topk_update`); activations are
float32, the KV cache float32 or bfloat16 (`dtype`).

One forward loop serves weights held in DRAM (`native_loader.ResidentWeights`)
and weights streamed from a flash store (`model.streamed_decoder.StreamedWeights`).
A weight source has:

- ``layouts``: one `_native.LayerLayout` per decoder layer;
- ``layer(i) -> (buffer, release)``: layer i's bytes (uint8, 1-D) and a
  function to call once the layer is computed (frees a streaming buffer);
- ``head_parts``: [(first row, end row, ggml type)] of the output head, whose
  rows are split in parts (one part when resident);
- ``head_part(k) -> (buffer, release)``: the bytes of part k's matrix;
- ``embed(native, ids, out)``: writes the embedding rows of `ids` into `out`
  (float32 [T, hidden]);
- ``norm``: the final norm's weight, float32 [hidden].

The decoder layers themselves run on a *layer runner*: `NativeLayers` (the
native CPU core, the default) or a static-shape backend's
(lever.npu.layers.StaticLayers: ONNX Runtime on the CPU or a QNN NPU),
set with `NativeDecoder.run_layers_on`.  A runner has `new_cache(capacity)`,
`begin(tokens, positions, mask, cache)`, `run(i, x, layout, buffer, cache)
-> x`, `end(cache)`, and `keep(x, rows) -> x` if it can prune rows mid-pass.
A runner that can run several sequences in one pass (`NativeLayers`) also has
`begin_segments(segments)`, `run_segments(i, x, layout, buffer, caches) -> x`
and `end_segments(caches)` (see `NativeDecoder.forward_batch`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass

import numpy as np

from .. import _native
from ..errors import LeverError
from ..model_config import ModelConfig, unsupported_feature
from ..store.residency import kv_layer_windows
from ..values import dtype_name
from ..topk_head import check_topk, topk_of_logits, topk_result, topk_state

HEADS = ("logits", "argmax", "topk")
KV_DTYPES = ("float32", "bfloat16")


@dataclass
class PassStats:
    """Counters since creation or `reset()`; times in seconds."""

    passes: int = 0
    tokens: int = 0                   # rows run through the model
    compute_s: float = 0.0            # native arithmetic: embed, layers, head

    def reset(self) -> None:
        self.__init__()


class NativeLayers:
    """Decoder layers on the native CPU core (`_native.NativeModel.layer`).
    The pass's state (rope tables, mask, cache slots) lives on `native`."""

    fixed_shapes = False
    backend = "native"

    def __init__(self, config: ModelConfig, native: "_native.NativeModel", dtype: str):
        self.config, self.native, self.dtype = config, native, dtype

    def new_cache(self, capacity: int) -> "_native.KVCache":
        """An empty cache with room for `capacity` tokens; its sliding-window layers
        keep only their last rows (`residency.kv_layer_windows`, csrc/model/kv_cache.h)."""
        cfg = self.config
        windows = kv_layer_windows(cfg) if cfg.local_layers() else []
        return _native.KVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, max(1, int(capacity)), self.dtype,
                               layer_windows=windows)

    def begin(self, tokens, positions, mask, cache) -> None:
        self.native.begin_pass(positions, mask, cache)

    def run(self, i: int, x: np.ndarray, layout, buffer, cache) -> np.ndarray:
        self.native.layer(x, layout, buffer, cache, i)
        return x

    def keep(self, x: np.ndarray, keep: np.ndarray) -> np.ndarray:
        self.native.keep_rows(x, keep)
        return x[:len(keep)]

    def end(self, cache) -> None:
        self.native.end_pass(cache)

    def begin_segments(self, segments) -> None:
        """segments: [(positions, mask, cache)], one per sequence of the pass."""
        self.native.begin_segments(segments)

    def run_segments(self, i: int, x: np.ndarray, layout, buffer, caches) -> np.ndarray:
        self.native.layer_segments(x, layout, buffer, caches, i)
        return x

    def end_segments(self, caches) -> None:
        self.native.end_segments(caches)


@dataclass
class Segment:
    """One sequence of a batched pass (`NativeDecoder.forward_batch`): its T new
    tokens and positions (int64 [T]), its mask (bool [T, cache.length + T],
    as `forward`'s) and its own KV cache."""

    tokens: np.ndarray
    positions: np.ndarray
    mask: np.ndarray
    cache: object


class SoloPass:
    """A pass over one cache, as the layer loop drives it (runner.begin/run/end)."""

    def __init__(self, runner, tokens, positions, mask, cache):
        self.runner, self.tokens, self.positions, self.mask, self.cache = runner, tokens, positions, mask, cache

    def begin(self) -> None:
        self.runner.begin(self.tokens, self.positions, self.mask, self.cache)

    def run(self, i: int, x: np.ndarray, layout, buffer) -> np.ndarray:
        return self.runner.run(i, x, layout, buffer, self.cache)

    def end(self) -> None:
        self.runner.end(self.cache)


class SegmentsPass:
    """A pass over several caches at once (runner.begin_segments/run_segments/end_segments)."""

    def __init__(self, runner, segments: list[Segment]):
        self.runner = runner
        self.inputs = [(s.positions, s.mask, s.cache) for s in segments]
        self.caches = [s.cache for s in segments]

    def begin(self) -> None:
        self.runner.begin_segments(self.inputs)

    def run(self, i: int, x: np.ndarray, layout, buffer) -> np.ndarray:
        return self.runner.run_segments(i, x, layout, buffer, self.caches)

    def end(self) -> None:
        self.runner.end_segments(self.caches)


def checked_segment(tokens, positions, mask, cache) -> "Segment":
    """The inputs of one sequence's pass as contiguous arrays (int64 tokens and
    positions [T], bool mask [T, cache.length + T]); ValueError for a bad shape."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1)
    positions = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
    mask = np.ascontiguousarray(mask, dtype=bool)
    t = tokens.shape[0]
    if positions.shape != (t,):
        raise ValueError(f"positions has shape {positions.shape}, expected ({t},)")
    if mask.shape != (t, cache.length + t):
        raise ValueError(f"mask has shape {mask.shape}, expected ({t}, {cache.length + t})")
    return Segment(tokens, positions, mask, cache)


# The block features the native decoder computes (all of lever.model_config's today).
BLOCK_FIELDS = frozenset({"qk_norm", "sandwich_norms", "activation", "rope_dims", "rope_theta_local",
                          "rope_scaling", "rope_linear", "rope_freq_factors", "rope_attn_factor",
                          "sliding_window", "layer_kinds", "attn_scale", "embed_scale", "logit_softcap"})


def native_model(cfg: ModelConfig) -> "_native.NativeModel":
    """The native layer arithmetic for the block `cfg` describes (LeverError
    naming a block feature the native decoder does not compute)."""
    problem = unsupported_feature(cfg, BLOCK_FIELDS)
    if problem:
        raise LeverError(f"the native decoder: {problem} is not supported")
    return _native.NativeModel(cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                               cfg.intermediate_size, cfg.rms_norm_eps, cfg.rope_theta,
                               qk_norm=cfg.qk_norm, sandwich_norms=cfg.sandwich_norms, activation=cfg.activation,
                               rope_dims=cfg.rope_dims, rope_theta_local=cfg.rope_theta_local,
                               rope_linear=cfg.rope_linear, rope_freq_factors=list(cfg.rope_freq_factors),
                               rope_attn_factor=cfg.rope_attn_factor, attn_scale=cfg.attn_scale,
                               sliding_window=cfg.sliding_window, layer_kinds=cfg.layer_kinds)


class NativeDecoder:
    """The model protocol over a weight source (see the module docstring).

    dtype: the KV cache's element type, "float32" or "bfloat16" (a torch
    dtype is accepted too).  stats: counters to add passes, tokens and
    compute seconds to (a `PassStats` or a subclass; default a new one).
    stage_times: None, or a list to which every forward appends (stage,
    seconds): "embed", each "layer.N" and "head" (final norm + all head
    parts).  A stage's seconds are its arithmetic only: time spent waiting
    for a weight source (flash reads) is excluded.
    """

    stage_times: list | None = None

    def __init__(self, config: ModelConfig, weights, dtype="bfloat16", stats: PassStats | None = None):
        self.config = config
        self.weights = weights
        self.dtype = dtype_name(dtype)
        self.stats = stats if stats is not None else PassStats()
        self.native = native_model(config)
        self.layers = NativeLayers(config, self.native, self.dtype)
        # One pass at a time per model: begin_pass/layer/end_pass keep the pass's
        # state (rope tables, mask, the cache it was given) on `self.native`, so
        # two threads forwarding this model at once would mix their passes.  A
        # pass already uses every core in the native kernels, so serialising
        # passes costs no throughput.
        self._pass_lock = threading.Lock()

    @property
    def resident_weight_bytes(self) -> int | None:
        """Bytes of weights held in DRAM by a resident source (its `weight_bytes`);
        None for a source without them (a streamed store)."""
        return getattr(self.weights, "weight_bytes", None)

    def run_layers_on(self, layers, max_context: int | None = None) -> None:
        """Run the decoder layers on `layers` (a layer runner, see the module
        docstring) from now on; caches made before belong to the old runner.
        max_context: the runner's token limit (its largest context bucket),
        which lowers `config.max_context`."""
        self.layers = layers
        if max_context is not None and max_context < self.config.max_context:
            self.config = dataclasses.replace(self.config, max_context=int(max_context))

    @property
    def tree_rows_take_context(self) -> bool:
        """True on a static-shape backend: a pass's rows all count against the
        context buckets (a split tree's later chunks see the earlier ones as
        past), so a tree needs its size, not just its depth, of room."""
        return bool(self.layers.fixed_shapes)

    def new_cache(self, capacity: int = 256):
        """An empty KV cache with room for `capacity` tokens (it grows on demand):
        a `_native.KVCache`, or the layer runner's own kind."""
        return self.layers.new_cache(capacity)

    def __call__(self, *args, **kwargs) -> np.ndarray:
        return self.forward(*args, **kwargs)

    def forward(self, tokens, positions, mask, cache, logits_rows=None, head: str = "logits",
                topk: int | None = None, layer_hook=None):
        """Run T new tokens through the model, appending (and committing) their
        keys/values to `cache`.

        tokens, positions: int64 [T].  mask: bool [T, cache.length + T], True
        where a new token attends to a cached row (first cache.length columns)
        or to a new token (last T columns).  logits_rows: int64 [R], the rows
        whose output is wanted (default all T).  head="logits": float32
        [R, vocab]; head="argmax": int64 [R], the first index of each row's
        maximum; head="topk" (with topk=K): (ids int64 [R, K], logprobs
        float32 [R, K]), each row's K best tokens (lever.topk_head).
        "argmax" and "topk" never make the [R, vocab] logits.

        layer_hook: None, or `hook(i, x) -> keep` called after decoder layer i
        with the live rows' residual stream x (float32 [T_live, hidden], a
        view: copy what you keep).  keep None keeps every row; otherwise it
        is int64 indices into the live rows, strictly increasing, row 0 first
        (lever.probe.prune: early-exit pruning), and layers i+1.. run those
        rows only: their keys/values still go to the cache rows of their
        original positions in the pass, so `cache.compact` by original row
        stays valid, and the output has one row per surviving row (in
        order).  A pruned row's cache rows in layers i+1.. are never written:
        it must not be committed.  logits_rows must be None with a hook.
        """
        n_top = self._check_head(head, topk)
        seg = checked_segment(tokens, positions, mask, cache)
        tokens, t = seg.tokens, seg.tokens.shape[0]
        if layer_hook is not None and logits_rows is not None:
            raise ValueError("logits_rows must be None when a layer_hook may prune rows")
        if layer_hook is not None and not hasattr(self.layers, "keep"):
            raise LeverError(f"the {self.layers.backend} backend cannot prune rows mid-pass (run without probes)")
        with self._pass_lock:                      # see __init__: one pass at a time per model
            cache.reserve(cache.length + t)        # grows by doubling when short of rows
            x = self._layers(tokens, SoloPass(self.layers, tokens, seg.positions, seg.mask, cache), layer_hook)
            if logits_rows is not None:
                x = x[np.asarray(logits_rows, dtype=np.int64)]
            out = self._head(np.ascontiguousarray(x), head, n_top)
            self.stats.passes += 1
            self.stats.tokens += t
        return out

    def forward_batch(self, segments, head="logits", topk: int | None = None) -> list:
        """Run several sequences' new tokens through the model in ONE pass,
        appending (and committing) each one's keys/values to its own cache.

        segments: `Segment`s (or (tokens, positions, mask, cache) tuples), each
        as `forward`'s arguments, each with a cache of its own.  head: one of
        HEADS for every segment, or a list of one per segment (greedy and
        sampled sequences in one pass).  Returns one output per segment, each
        exactly (bitwise) what `forward(tokens, positions, mask, cache,
        head=..., topk=topk)` returns for it alone: the embedding, norms,
        projections, MLP and head run over the rows of every segment together
        (the weights are read once per pass), and each segment's rows attend
        over its own cache and its own rows only.  Needs a layer runner that
        runs segments (the native core); a static-shape backend raises LeverError."""
        segs = [s if isinstance(s, Segment) else Segment(*s) for s in segments]
        if not segs:
            raise ValueError("forward_batch needs at least one segment")
        heads = [head] * len(segs) if isinstance(head, str) else list(head)
        if len(heads) != len(segs):
            raise ValueError(f"{len(heads)} heads for {len(segs)} segments")
        n_top = max(self._check_head(h, topk) for h in heads)
        if not hasattr(self.layers, "begin_segments"):
            raise LeverError(f"the {self.layers.backend} backend cannot run several sequences in one pass")
        segs = [checked_segment(s.tokens, s.positions, s.mask, s.cache) for s in segs]
        if len({id(s.cache) for s in segs}) != len(segs):
            raise ValueError("every segment of a batched pass needs a cache of its own")
        tokens = np.concatenate([s.tokens for s in segs])
        ends = np.cumsum([s.tokens.shape[0] for s in segs])
        rows = [np.arange(a, b) for a, b in zip(np.concatenate([[0], ends[:-1]]), ends)]
        outs: list = [None] * len(segs)
        with self._pass_lock:                      # see __init__: one pass at a time per model
            for s in segs:
                s.cache.reserve(s.cache.length + s.tokens.shape[0])
            x = self._layers(tokens, SegmentsPass(self.layers, segs))
            for h in dict.fromkeys(heads):         # one head call per kind of head, in first-use order
                idx = [i for i, hi in enumerate(heads) if hi == h]
                out = self._head(np.ascontiguousarray(x[np.concatenate([rows[i] for i in idx])]), h, n_top)
                at = 0
                for i in idx:
                    n = len(rows[i])
                    outs[i] = (out[0][at:at + n], out[1][at:at + n]) if h == "topk" else out[at:at + n]
                    at += n
            self.stats.passes += 1
            self.stats.tokens += tokens.shape[0]
        return outs

    def _check_head(self, head: str, topk: int | None) -> int:
        """Tokens per row of head "topk" (0 for the other heads); ValueError for a bad head."""
        if head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}, got {head!r}")
        return check_topk(topk, self.config.vocab_size) if head == "topk" else 0

    def _layers(self, tokens, run, layer_hook=None) -> np.ndarray:
        """Embedding and decoder layers over `run` (a SoloPass or SegmentsPass): the
        final hidden states, float32 [T_live, hidden] (T_live = T unless
        `layer_hook` pruned rows; see `forward`)."""
        x = np.empty((tokens.shape[0], self.config.hidden_size), dtype=np.float32)
        t0 = time.perf_counter()
        self.weights.embed(self.native, tokens, x)
        if self.config.embed_scale != 1.0:
            x *= np.float32(self.config.embed_scale)
        run.begin()
        self._lap("embed", time.perf_counter() - t0)
        for i, layout in enumerate(self.weights.layouts):
            buffer, release = self.weights.layer(i)
            try:
                t0 = time.perf_counter()
                x = run.run(i, x, layout, buffer)
                self._lap(f"layer.{i}", time.perf_counter() - t0)
            finally:
                release()
            if layer_hook is not None:
                x = self._keep(x, layer_hook(i, x))
        run.end()
        return x

    def _keep(self, x: np.ndarray, keep) -> np.ndarray:
        """x compacted to the rows `keep` (None: all) for the layers still to run."""
        if keep is None or len(keep) == x.shape[0]:
            return x
        t0 = time.perf_counter()
        x = self.layers.keep(x, np.ascontiguousarray(keep, dtype=np.int64))
        self._lap("prune", time.perf_counter() - t0)
        return x

    def _head(self, x: np.ndarray, head: str, n_top: int = 0):
        """Final norm and output head over the hidden states x [R, hidden]
        (n_top: tokens per row for head "topk").  With a logit soft-cap every
        head is taken from the capped logits (argmax / top-k of them), so all
        three heads agree on the same numbers."""
        cap = self.config.logit_softcap
        if cap > 0:
            logits = self._head_rows(x, "logits")
            logits = (np.tanh(logits / np.float32(cap)) * np.float32(cap)).astype(np.float32)
            if head == "logits":
                return logits
            if head == "argmax":
                return np.argmax(logits, axis=-1).astype(np.int64)
            return topk_of_logits(logits, n_top)
        return self._head_rows(x, head, n_top)

    def _head_rows(self, x: np.ndarray, head: str, n_top: int = 0):
        """`_head` without the soft-cap."""
        t0 = time.perf_counter()
        h = np.empty_like(x)
        self.native.rms_norm(x, self.weights.norm, h)
        seconds = time.perf_counter() - t0
        r = x.shape[0]
        if head == "logits":
            out = np.empty((r, self.config.vocab_size), dtype=np.float32)
        elif head == "argmax":
            best_val = np.full(r, -np.inf, dtype=np.float32)
            out = np.zeros(r, dtype=np.int64)
        else:
            state = topk_state(r, n_top)
        for k, (first, end, qtype) in enumerate(self.weights.head_parts):
            buffer, release = self.weights.head_part(k)
            try:
                t0 = time.perf_counter()
                if head == "logits":
                    _native.linear(h, buffer, qtype, end - first, out[:, first:end])
                elif head == "argmax":
                    _native.argmax_update(h, buffer, qtype, end - first, first, best_val, out)
                else:
                    _native.topk_update(h, buffer, qtype, end - first, first, *state)
                seconds += time.perf_counter() - t0
            finally:
                release()
        self._lap("head", seconds)
        return topk_result(*state) if head == "topk" else out

    def _lap(self, stage: str, seconds: float) -> None:
        self.stats.compute_s += seconds
        if self.stage_times is not None:
            self.stage_times.append((stage, seconds))

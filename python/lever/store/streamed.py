"""A decoder whose weights live in a flash store and stream in layer by layer.

`StreamedDecoder` has the forward interface of `lever.model.decoder.Decoder`
(tokens, positions, mask, cache, logits_rows), so plain decoding and tree
verification use it unchanged.  A pass walks the extents in order: decoder
layers, then the head parts.  Pinned extents come from DRAM; streamed ones
arrive through a ring of read buffers that the `FlashReader` keeps filled:
as soon as an extent's buffer is no longer needed (its tensors copied into
the workspace, or, when they are used in place, its layer computed) it is
resubmitted for the next streamed extent in cyclic order, so layers
l+1..l+k (and, near the end of a pass, the first layers of the next pass) are
in flight while layer l computes.

Matrices whose block type has a native matmul kernel (e.g. the Q4_K / Q6_K
of a `source` store) are used straight from the read buffer as `QuantTensor`
views; tensors stored in the compute dtype (a `bf16` store) are used in place
too; anything else is dequantised into one preallocated workspace.  They are
bound to a meta-device `DecoderLayer` (quantised ones as `Linear.qweight`,
dense ones through `torch.func.functional_call`), so the arithmetic is the
same code as the in-memory decoder.
"""

from __future__ import annotations

import collections
import os
import resource
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.func import functional_call

from .. import _native, quant
from ..errors import ChecksumError, StoreError
from ..model.decoder import Decoder, DecoderLayer, RMSNorm, rope_cos_sin
from ..model.kv_cache import KVCache
from ..model.linear import Linear, QuantTensor, has_kernel, linear
from ..model.threads import torch_threads
from ..model.weights import build_decoder
from .flash_reader import FlashReader, aligned_empty, crc32c
from .manifest import WEIGHTS, Extent, StoreManifest
from .residency import ResidencyPlan, plan_residency, used_in_place, workspace_elements

_ALIGN = 4096

# Weights used in place are read-only views of the read buffers; torch warns
# that it cannot write to them, which it never needs to.
warnings.filterwarnings("ignore", message="The given buffer is not writable")


@dataclass
class StreamStats:
    """Counters of a StreamedDecoder since creation or `reset()`; times in seconds."""

    passes: int = 0
    tokens: int = 0                   # rows run through the model
    stall_s: float = 0.0              # compute waiting on flash reads
    dequant_s: float = 0.0
    dequantized_bytes: int = 0        # written into the workspace (matrices used in place: none)
    compute_s: float = 0.0            # layer + head arithmetic
    embedding_bytes: int = 0          # embedding rows read on demand

    def reset(self) -> None:
        self.__init__()


class _Workspace:
    """One preallocated buffer that an extent's tensors are dequantised into."""

    def __init__(self, n_elements: int, dtype: torch.dtype):
        self.buf = torch.empty(n_elements, dtype=dtype)
        self.dtype = dtype
        self.written = 0                # bytes dequantised by the last dequantize()
        self._np = (self.buf.view(torch.int16).numpy().view(np.uint16) if dtype == torch.bfloat16
                    else self.buf.numpy())

    def dequantize(self, raw: np.ndarray, extent: Extent, quantized: bool = False) -> tuple[dict, bool]:
        """Tensors of `extent` (raw = its bytes): views of `raw` itself for the
        matrices `residency.used_in_place` names (stored in the compute dtype,
        or, with `quantized`, in a type the native kernels multiply: as
        `QuantTensor`); the rest dequantised into the workspace.  Returns
        (tensors, whether any view of `raw` was handed out)."""
        out, pos, in_place = {}, 0, False
        self.written = 0
        dtype_bytes = self.buf.element_size()
        for t in extent.tensors:
            n = int(np.prod(t.shape))
            src = raw[t.offset:t.offset + t.nbytes]
            if used_in_place(t, dtype_bytes, quantized):
                in_place = True
                if quantized and has_kernel(t.qtype):
                    out[t.name] = QuantTensor(src, t.qtype, tuple(t.shape))
                else:
                    out[t.name] = torch.frombuffer(src, dtype=self.dtype).view(t.shape)
                continue
            _native.dequantize(src, t.qtype, self._np[pos:pos + n])
            out[t.name] = self.buf[pos:pos + n].view(t.shape)
            pos += n
            self.written += n * self.buf.element_size()
        return out, in_place


class StreamedDecoder:
    """Decoder forward over a flash store under a DRAM budget (see module doc).

    max_read_bytes_per_s: pace flash reads to at most this many bytes per
    second (emulates slower flash); 0 = unlimited.
    stage_times: None, or a list to which every forward appends (stage,
    seconds) like `Decoder.stage_times`: "embed", each "layer.N" and one
    "head" (final norm + all head parts).  A stage's seconds are its
    dequantisation and arithmetic only; waiting on flash is excluded.
    """

    stage_times: list | None = None

    def __init__(self, store_dir: str | os.PathLike, dram_budget: int, dtype: torch.dtype = torch.bfloat16,
                 backend: str = "auto", prefetch_depth: int = 2, kv_tokens: int = 2048,
                 direct: bool = True, queue_depth: int = 8, quantized: bool = True,
                 max_read_bytes_per_s: float = 0.0):
        if max_read_bytes_per_s < 0:
            raise ValueError(f"max_read_bytes_per_s must be >= 0, got {max_read_bytes_per_s}")
        self.store_dir = Path(store_dir)
        self.max_read_bytes_per_s = float(max_read_bytes_per_s)
        self.manifest = StoreManifest.load(self.store_dir)
        self.config = self.manifest.config
        self.dtype = dtype
        self.quantized = quantized      # multiply quantised blocks natively (else dequantise)
        matrices = [t for e in self.manifest.layers for t in e.tensors if len(t.shape) == 2]
        # torch threads during forward: one when native kernels do all the matrix work (threads.py)
        self.torch_threads = 1 if quantized and all(has_kernel(t.qtype) for t in matrices) else None
        dtype_bytes = torch.empty(0, dtype=dtype).element_size()
        self.plan: ResidencyPlan = plan_residency(self.manifest, dram_budget, dtype_bytes, kv_tokens,
                                                  prefetch_depth, quantized=quantized)
        self.stats = StreamStats()
        n_slots = max(1, self.plan.prefetch_depth)
        slot_bytes = self.plan.slot_bytes or self.manifest.globals.length
        self.reader = FlashReader(self.store_dir / WEIGHTS, slot_bytes=slot_bytes, n_slots=n_slots,
                                  backend=backend, direct=direct, queue_depth=queue_depth,
                                  chunk_bytes=self.manifest.chunk_bytes,
                                  max_bytes_per_s=self.max_read_bytes_per_s)
        self._embed_fd = os.open(self.store_dir / WEIGHTS, os.O_RDONLY)
        self._pinned = {e.name: self._read_whole(e) for e in self.plan.pinned}
        with torch.device("meta"):
            self._layer = DecoderLayer(self.config)
        self._ws = _Workspace(workspace_elements(self.manifest, dtype_bytes, quantized), dtype)
        g = self.manifest.globals
        glob = _Workspace(sum(int(np.prod(t.shape)) for t in g.tensors), dtype)
        self.norm = RMSNorm(self.config.hidden_size, self.config.rms_norm_eps)
        self.norm.weight = torch.nn.Parameter(glob.dequantize(self._read_whole(g), g)[0]["norm.weight"].clone(),
                                              requires_grad=False)
        self._embed_rows: collections.OrderedDict[int, torch.Tensor] = collections.OrderedDict()
        self._verified_chunks: set[tuple[str, int]] = set()     # (extent, chunk) of embedding rows
        self._embed_cap = 4096
        self._streamed = self.plan.streamed
        self._inflight: collections.deque[tuple[Extent, int]] = collections.deque()
        self._free_slots = list(range(n_slots)) if self._streamed else []
        self._next = 0
        self._fill_ring()

    # -- reading ---------------------------------------------------------------

    def _read_whole(self, e: Extent) -> np.ndarray:
        buf = aligned_empty(e.length)
        self.reader.read(e.offset, e.length, buf, list(e.chunk_crc32c), e.name)
        return buf

    def _fill_ring(self) -> None:
        while self._free_slots and self._streamed:
            e = self._streamed[self._next % len(self._streamed)]
            self._next += 1
            slot = self._free_slots.pop()
            self.reader.submit(slot, e.offset, e.length, list(e.chunk_crc32c), e.name)
            self._inflight.append((e, slot))

    def settle(self, poll_s: float = 0.001) -> None:
        """Block until the reads in flight (the ring prefetching the next pass) have
        landed; they stay queued for the next forward.  poll_s: seconds between checks."""
        while not all(self.reader.ready(slot) for _, slot in self._inflight):
            time.sleep(poll_s)

    def _weights(self, e: Extent) -> tuple[dict[str, torch.Tensor], int | None]:
        """Tensors of `e` in the compute dtype, from DRAM or from the ring.

        Tensors already stored in the compute dtype are used in place (no
        copy); the rest are dequantised into the workspace.  Returns the ring
        slot to release once the tensors are no longer needed (None if none):
        a slot whose bytes were copied out is released here at once.
        """
        slot = None
        if e.name in self._pinned:
            raw = self._pinned[e.name]
        else:
            expected, slot = self._inflight.popleft()
            if expected.name != e.name:          # cannot happen unless the pass order changed
                raise StoreError(f"read ring out of order: expected {expected.name}, need {e.name}")
            t0 = time.perf_counter()
            raw = self.reader.wait(slot)
            self.stats.stall_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        weights, in_place = self._ws.dequantize(raw, e, quantized=self.quantized)
        self.stats.dequant_s += time.perf_counter() - t0
        self.stats.dequantized_bytes += self._ws.written
        if slot is not None and not in_place:
            self._release(slot)
            slot = None
        return weights, slot

    def _release(self, slot: int | None) -> None:
        if slot is not None:
            self._free_slots.append(slot)
            self._fill_ring()

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = []
        for tok in tokens.tolist():
            row = self._embed_rows.get(tok)
            if row is None:
                row = self._embed_row(tok)
                self._embed_rows[tok] = row
                if len(self._embed_rows) > self._embed_cap:
                    self._embed_rows.popitem(last=False)
            else:
                self._embed_rows.move_to_end(tok)
            rows.append(row)
        return torch.stack(rows)

    def _embed_row(self, tok: int) -> torch.Tensor:
        if not 0 <= tok < self.config.vocab_size:
            raise ValueError(f"token id {tok} is outside the vocabulary (0..{self.config.vocab_size - 1})")
        part = next(e for e in self.manifest.embedding_parts if e.rows[0] <= tok < e.rows[1])
        t = part.tensors[0]
        row_bytes = t.nbytes // t.shape[0]
        start = t.offset + (tok - part.rows[0]) * row_bytes
        if part.name in self._pinned:
            raw = self._pinned[part.name][start:start + row_bytes]
        else:
            self._verify_chunks(part, start, row_bytes)
            raw = np.frombuffer(os.pread(self._embed_fd, row_bytes, part.offset + start), dtype=np.uint8)
            self.stats.embedding_bytes += row_bytes
            if raw.nbytes != row_bytes:
                raise StoreError(f"{self.store_dir / WEIGHTS}: short read of embedding row {tok}")
        out = torch.empty(t.shape[1], dtype=self.dtype)
        dst = out.view(torch.int16).numpy().view(np.uint16) if self.dtype == torch.bfloat16 else out.numpy()
        _native.dequantize(np.ascontiguousarray(raw), t.qtype, dst)
        return out

    def _verify_chunks(self, e: Extent, start: int, nbytes: int) -> None:
        """Check (once per chunk) the CRC32C of the chunks of extent `e` that hold
        its bytes [start, start + nbytes): embedding rows are read on demand
        with pread, outside the reader that verifies everything else."""
        cb = self.manifest.chunk_bytes
        for k in range(start // cb, (start + nbytes - 1) // cb + 1):
            if (e.name, k) in self._verified_chunks:
                continue
            n = min(cb, e.length - k * cb)
            data = os.pread(self._embed_fd, n, e.offset + k * cb)
            self.stats.embedding_bytes += len(data)
            if len(data) != n or crc32c(data) != e.chunk_crc32c[k]:
                err = ChecksumError(f"{e.name}: checksum mismatch in {e.name} at offset {e.offset + k * cb} "
                                    f"of {self.store_dir / WEIGHTS} (the store is damaged; re-run `lever convert`)")
                err.label, err.path, err.offset, err.reason = e.name, str(self.store_dir / WEIGHTS), \
                    e.offset + k * cb, "checksum"
                raise err
            self._verified_chunks.add((e.name, k))

    # -- the Decoder interface ---------------------------------------------------

    def new_cache(self, capacity: int = 256) -> KVCache:
        cfg = self.config
        return KVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, self.dtype, capacity)

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        return self.forward(*args, **kwargs)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                cache: KVCache, logits_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Same contract as `Decoder.forward`: float32 logits of the (selected) new tokens."""
        with torch_threads(self.torch_threads):
            return self._forward(tokens, positions, mask, cache, logits_rows)

    def _forward(self, tokens, positions, mask, cache, logits_rows):
        t = tokens.shape[0]
        if mask.shape != (t, cache.length + t):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected ({t}, {cache.length + t})")
        cache.reserve(cache.length + t)
        times = self.stage_times
        t0 = time.perf_counter() if times is not None else 0.0
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, self.dtype)
        x = self._embed(tokens)
        if times is not None:
            times.append(("embed", time.perf_counter() - t0))
        for i, e in enumerate(self.manifest.layers):
            dq = self.stats.dequant_s
            w, slot = self._weights(e)
            t0 = time.perf_counter()
            x = functional_call(self._layer, _bind_quantized(self._layer, w), (x, cos, sin, mask, cache, i))
            dt = time.perf_counter() - t0
            self.stats.compute_s += dt
            if times is not None:
                times.append((f"layer.{i}", dt + self.stats.dequant_s - dq))
            self._release(slot)
        cache.advance(t)
        if logits_rows is not None:
            x = x[logits_rows]
        t0 = time.perf_counter()
        h = self.norm(x)
        head_s = time.perf_counter() - t0           # norm + projections (dequantisation not included)
        dq = self.stats.dequant_s
        logits = torch.empty(h.shape[0], self.config.vocab_size, dtype=torch.float32)
        for e in self.manifest.head_parts:
            w, slot = self._weights(e)
            t0 = time.perf_counter()
            logits[:, e.rows[0]:e.rows[1]] = linear(h, w["weight"])
            head_s += time.perf_counter() - t0
            self._release(slot)
        self.stats.compute_s += head_s
        if times is not None:
            times.append(("head", head_s + self.stats.dequant_s - dq))
        self.stats.passes += 1
        self.stats.tokens += t
        return logits

    # -- reporting -------------------------------------------------------------

    def report(self) -> dict:
        """Run statistics: bytes, seconds, bandwidth, reader backend, residency, peak RSS."""
        r = self.reader.stats()
        s = self.stats
        passes = max(1, s.passes)
        return {
            "reader": {k: r[k] for k in ("backend", "direct", "fallback_reason", "queue_depth", "chunk_bytes")},
            "passes": s.passes,
            "bytes_read": r["bytes_read"] + s.embedding_bytes,
            "bytes_read_per_pass": (r["bytes_read"] + s.embedding_bytes) / passes,
            "io_busy_s": r["busy_s"],
            "achieved_gib_s": r["bytes_read"] / r["busy_s"] / 2**30 if r["busy_s"] else None,
            "stall_s": s.stall_s,
            "dequant_s": s.dequant_s,
            "dequantized_bytes_per_pass": s.dequantized_bytes / passes,
            "compute_s": s.compute_s,
            "read_limit_bytes_per_s": self.max_read_bytes_per_s,
            "checksum_s": r.get("checksum_s"),
            "residency": self.plan.summary(),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }

    def reset_stats(self) -> None:
        self.stats.reset()
        self.reader.reset_stats()

    def close(self) -> None:
        self.reader.close()
        os.close(self._embed_fd)


def _bind_quantized(layer: torch.nn.Module, weights: dict) -> dict[str, torch.Tensor]:
    """Set each `Linear.qweight` of `layer` to its `QuantTensor` in `weights` (or
    None when the weight is dense); returns the dense tensors for functional_call."""
    dense = {}
    for name, w in weights.items():
        owner, leaf = name.rsplit(".", 1)
        module = layer.get_submodule(owner)
        if isinstance(module, Linear) and leaf == "weight":
            module.qweight = w if isinstance(w, QuantTensor) else None
        if not isinstance(w, QuantTensor):
            dense[name] = w
    return dense


def load_store_model(store_dir: str | os.PathLike, dtype: torch.dtype = torch.bfloat16,
                     backend: str = "auto", quantized: bool = False) -> Decoder:
    """The whole store read into an in-memory `Decoder` (the resident reference):
    dequantised, or with `quantized` its kernel-ready matrices kept as blocks."""
    m = StoreManifest.load(store_dir)
    reader = FlashReader(Path(store_dir) / WEIGHTS, slot_bytes=_ALIGN, n_slots=1, backend=backend,
                         chunk_bytes=m.chunk_bytes)
    try:
        def read(e: Extent) -> np.ndarray:
            buf = aligned_empty(e.length)
            reader.read(e.offset, e.length, buf, list(e.chunk_crc32c), e.name)
            return buf

        def matrix(parts: list[Extent]):
            """One matrix stored as row groups (head / embedding parts)."""
            t = parts[0].tensors[0]
            raws = [read(e)[e.tensors[0].offset:][:e.tensors[0].nbytes] for e in parts]
            rows = sum(e.tensors[0].shape[0] for e in parts)
            if quantized and has_kernel(t.qtype):
                return QuantTensor(np.concatenate(raws), t.qtype, (rows, t.shape[1]))
            return torch.cat([quant.dequantize(r, e.tensors[0].qtype, e.tensors[0].shape, dtype)
                              for r, e in zip(raws, parts)])

        def tensors():
            for e in m.layers:
                raw = read(e)
                for t in e.tensors:
                    yield f"layers.{e.index}.{t.name}", _tensor(raw, t, dtype, quantized)
            head = matrix(m.head_parts)
            if m.config.tie_word_embeddings:
                yield "embed_tokens.weight", head
            else:
                yield "lm_head.weight", head
                yield "embed_tokens.weight", matrix(m.embedding_parts)
            g = m.globals
            yield "norm.weight", _tensor(read(g), g.tensors[0], dtype, False)

        return build_decoder(m.config, tensors(), dtype, source=str(store_dir))
    finally:
        reader.close()


def _tensor(raw: np.ndarray, t, dtype: torch.dtype, quantized: bool):
    src = raw[t.offset:t.offset + t.nbytes]
    if quantized and len(t.shape) == 2 and has_kernel(t.qtype):
        return QuantTensor(np.array(src), t.qtype, tuple(t.shape))
    return quant.dequantize(src, t.qtype, t.shape, dtype)

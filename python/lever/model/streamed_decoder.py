"""A decoder whose weights live in a flash store and stream in layer by layer.

`StreamedDecoder` is a `NativeDecoder` (lever.model.native_decoder: the numpy
model protocol, all arithmetic in C++) over a `StreamedWeights` source.  A
pass walks the extents in order: decoder layers, then the head parts.  Pinned
extents come from DRAM; streamed ones arrive through a ring of read buffers
that the `FlashReader` keeps filled: as soon as an extent's layer (or head
part) is computed its buffer is resubmitted for the next streamed extent in
cyclic order, so layers l+1..l+k (and, near the end of a pass, the first
layers of the next pass) are in flight while layer l computes.

Every tensor is used in place, straight from its extent's buffer: the native
decoder multiplies the kernel block types (Q4_K, Q6_K, Q8_0, ...) of a
`source` store, in the GGUF layout or repacked into 8-row groups (the
manifest's type id says which), and the BF16 matrices of a `bf16` store
directly, so nothing is dequantised.  Embedding rows are read on demand with
pread (their chunks' CRC32C checked once) and kept in a small cache of rows
in the GGUF layout: a tied model's rows come from the head parts, and a row
of a repacked part is restored from its 8-row group (`_native.unpack_rows`).

A pass that fails part way (a checksum error, EIO, a short or timed-out
read, an exception in a layer's compute) leaves the target usable: every
slot it took is given back, and the next pass, finding the ring's reads
meant for other extents than the one it needs, sets them aside as stale
(their slots return once their reads land) and restarts the ring at its
first extent, so it reads everything afresh -- a store repaired between
the two passes is read as repaired.

This module does not import torch; the torch resident reference of a store
is `lever.reference.store_loader.load_store_model`.
"""

from __future__ import annotations

import collections
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import _native
from ..autoregressive import PREFILL_CHUNK
from ..errors import ChecksumError, FlashReadError, StoreError
from ..quant import base_type, is_repacked
from ..store.flash_reader import DEFAULT_QUEUE_DEPTH, FlashReader, aligned_empty, crc32c
from ..store.manifest import WEIGHTS, Extent, StoreManifest, TensorEntry
from ..store.residency import ResidencyPlan, plan_residency
from ..store.validate import REPACK_ROWS
from ..values import dtype_bytes, dtype_name
from .native_decoder import NativeDecoder, PassStats
from .native_loader import check_token_ids, check_type

EMBED_CACHE_ROWS = 4096           # embedding rows kept (their stored blocks, in the GGUF layout)
HEAD_CACHE_ROWS = 256             # output head rows kept for the early-exit probe (~320 KB for a 1.5B model)


@dataclass
class StreamStats(PassStats):
    """Counters of a StreamedDecoder since creation or `reset()`; times in seconds.
    (passes, tokens and compute_s: see `PassStats`.)"""

    stall_s: float = 0.0              # compute waiting on flash reads
    embedding_bytes: int = 0          # embedding rows (and their chunks, once) read on demand
    streamed_bytes: int = 0           # bytes of the streamed extents the passes took from the read ring

    @property
    def bytes_used(self) -> int:
        """Flash bytes the passes used: streamed extents + embedding reads.  Counted
        when a pass takes an extent, not when its read lands, so a window of passes
        counts exactly its own extents: the ring's prefetches for a next pass, landing
        before, inside or after the window, move no bytes between windows."""
        return self.streamed_bytes + self.embedding_bytes


class StreamedWeights:
    """The weight source of a StreamedDecoder (see native_decoder): pinned extents
    in DRAM, the rest through the reader's ring, embedding rows on demand."""

    def __init__(self, store_dir: Path, manifest: StoreManifest, plan: ResidencyPlan, reader: FlashReader,
                 stats: StreamStats):
        self.store_dir, self.manifest, self.plan, self.reader, self.stats = store_dir, manifest, plan, reader, stats
        self.config = manifest.config
        _check_types(manifest, store_dir)
        self.layouts = [_native.LayerLayout([(t.name, t.offset, t.qtype, tuple(t.shape)) for t in e.tensors])
                        for e in manifest.layers]
        self.head_parts = [(e.rows[0], e.rows[1], e.tensors[0].qtype) for e in manifest.head_parts]
        self._pinned = {e.name: self._read_whole(e) for e in plan.pinned}
        g = manifest.globals
        norm = g.tensor("norm.weight")
        self.norm = np.empty(self.config.hidden_size, dtype=np.float32)
        _native.dequantize(np.ascontiguousarray(self._read_whole(g)[norm.offset:norm.offset + norm.nbytes]),
                           norm.qtype, self.norm)
        embed = manifest.embedding_parts
        self.embed_qtype = base_type(embed[0].tensors[0].qtype)      # rows are restored to the GGUF layout
        self.embed_row_bytes = _row_bytes(embed[0])
        self._embed_rows: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._head_rows: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._verified_chunks: set[tuple[str, int]] = set()     # (extent, chunk) of embedding rows
        self._streamed = plan.streamed
        self._position = {e.name: k for k, e in enumerate(self._streamed)}
        self._inflight: collections.deque[tuple[Extent, int]] = collections.deque()
        n_slots = reader.n_slots if self._streamed else 0
        self._free_slots = list(range(n_slots))
        self._stale: list[int] = []       # slots of reads no pass will use (after a failure), until they land
        self._next = 0
        self._embed_fd = os.open(store_dir / WEIGHTS, os.O_RDONLY | os.O_CLOEXEC)
        self._fill_ring()

    # -- extents ------------------------------------------------------------------

    def pinned_extent(self, name: str) -> np.ndarray | None:
        """The bytes of extent `name` held in DRAM when the plan pins it, else None
        (a quick profile runs a pinned layer without reading it, lever.cost.quick)."""
        return self._pinned.get(name)

    def _read_whole(self, e: Extent) -> np.ndarray:
        buf = aligned_empty(e.length)
        self.reader.read(e.offset, e.length, buf, list(e.chunk_crc32c), e.name)
        return buf

    def _fill_ring(self) -> None:
        if self._stale:
            self._reclaim_stale()
        while self._free_slots and self._streamed:
            e = self._streamed[self._next % len(self._streamed)]
            self._next += 1
            slot = self._free_slots.pop()
            try:
                self.reader.submit(slot, e.offset, e.length, list(e.chunk_crc32c), e.name)
            except BaseException:
                self._free_slots.append(slot)
                raise
            self._inflight.append((e, slot))

    def _reclaim_stale(self) -> None:
        """Free the stale slots whose reads are over."""
        landed = [slot for slot in self._stale if self.reader.ready(slot)]
        self._stale = [slot for slot in self._stale if slot not in landed]
        self._free_slots.extend(landed)

    def _restart_at(self, e: Extent) -> None:
        """Point the ring at extent `e`: what it holds is for other extents (the last
        pass failed or stopped part way), so those reads become stale and the ring
        refills from `e` on.  If every slot is still busy with a stale read, wait
        for the oldest (the reader's timeout bounds the wait: FlashReadError)."""
        self._stale.extend(slot for _, slot in self._inflight)
        self._inflight.clear()
        self._next = self._position[e.name]
        self._fill_ring()
        while not self._inflight and self._stale:
            try:
                self.reader.wait(self._stale[0])
            except FlashReadError as err:    # a failed stale read is over all the same
                if err.reason == "timeout":
                    raise
            self._fill_ring()
        if not self._inflight:               # cannot happen: a pass holds at most one slot at a time
            raise StoreError(f"no read buffer free for {e.name}")

    def settle(self, poll_s: float = 0.001, timeout_s: float = 120.0) -> None:
        """Block until the reads in flight have landed (they stay queued for the next pass).
        poll_s: seconds between checks; StoreError after timeout_s seconds (a stuck device)."""
        deadline = time.monotonic() + timeout_s
        while not all(self.reader.ready(slot) for slot in [s for _, s in self._inflight] + self._stale):
            if time.monotonic() > deadline:
                raise StoreError(f"reads of the weights file still in flight after {timeout_s:g} s")
            time.sleep(poll_s)

    def _extent(self, e: Extent):
        """(bytes of extent `e`, release): from DRAM, or from the ring (waiting counts as stall).
        A failed wait leaves the slot stale (its read is over, or still in flight after a timeout)."""
        if e.name in self._pinned:
            return self._pinned[e.name], _no_release
        if not self._inflight or self._inflight[0][0].name != e.name:
            self._restart_at(e)              # the previous pass did not finish
        _, slot = self._inflight.popleft()
        t0 = time.perf_counter()
        try:
            raw = self.reader.wait(slot)
        except BaseException:
            self._stale.append(slot)
            raise
        finally:
            self.stats.stall_s += time.perf_counter() - t0
        self.stats.streamed_bytes += e.length
        return raw, lambda: self._release(slot)

    def _release(self, slot: int) -> None:
        self._free_slots.append(slot)
        self._fill_ring()

    def layer(self, i: int):
        return self._extent(self.manifest.layers[i])

    def head_part(self, k: int):
        e = self.manifest.head_parts[k]
        raw, release = self._extent(e)
        t = e.tensors[0]
        return raw[t.offset:t.offset + t.nbytes], release

    def close(self) -> None:
        if self._embed_fd >= 0:
            os.close(self._embed_fd)
            self._embed_fd = -1

    # -- embedding rows -----------------------------------------------------------

    def embed(self, native, ids: np.ndarray, out: np.ndarray) -> None:
        check_token_ids(ids, self.config.vocab_size)
        table = np.empty((len(ids), self.embed_row_bytes), dtype=np.uint8)
        for i, tok in enumerate(ids.tolist()):
            table[i] = self._row(tok, self.manifest.embedding_parts, self._embed_rows, EMBED_CACHE_ROWS)
        native.embed(table.reshape(-1), self.embed_qtype, len(ids), np.arange(len(ids), dtype=np.int64), out)

    def head_rows(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """(uint8 [len(ids), row bytes], ggml type): the output head's rows of token
        ids `ids` in the GGUF layout (restored where the store repacked them), read
        on demand like embedding rows (the early-exit probe's lens, lever.probe);
        the head parts streamed at the end of a pass are not touched."""
        check_token_ids(ids, self.config.vocab_size)
        parts = self.manifest.head_parts
        table = np.empty((len(ids), _row_bytes(parts[0])), dtype=np.uint8)
        for i, tok in enumerate(ids.tolist()):
            table[i] = self._row(tok, parts, self._head_rows, HEAD_CACHE_ROWS)
        return table, base_type(parts[0].tensors[0].qtype)

    def _row(self, tok: int, parts: list[Extent], cache: collections.OrderedDict, max_rows: int) -> np.ndarray:
        """Row `tok` of the matrix split over `parts` (embedding or head) in the GGUF
        layout, kept in `cache` (at most max_rows rows, least recently used dropped)."""
        row = cache.get(tok)
        if row is not None:
            cache.move_to_end(tok)
            return row
        part = next(e for e in parts if e.rows[0] <= tok < e.rows[1])
        t = part.tensors[0]
        row_bytes = _row_bytes(part)
        group = REPACK_ROWS if is_repacked(t.qtype) else 1      # a repacked part: read the 8-row group
        first = (tok - part.rows[0]) // group * group            # its first row, counted from the part's
        start, nbytes = t.offset + first * row_bytes, group * row_bytes
        if part.name in self._pinned:
            return _in_ggml_layout(self._pinned[part.name][start:start + nbytes], t, tok - part.rows[0] - first)
        row = _in_ggml_layout(self._pread(part, start, nbytes, tok), t, tok - part.rows[0] - first)
        cache[tok] = row
        if len(cache) > max_rows:
            cache.popitem(last=False)
        return row

    def _pread(self, part: Extent, start: int, nbytes: int, tok: int) -> np.ndarray:
        """Bytes [start, start + nbytes) of extent `part` (the rows holding row `tok`),
        read with pread, their chunks' checksums verified first."""
        self._verify_chunks(part, start, nbytes)
        data = np.frombuffer(os.pread(self._embed_fd, nbytes, part.offset + start), dtype=np.uint8)
        self.stats.embedding_bytes += data.nbytes
        if data.nbytes != nbytes:
            raise StoreError(f"{self.store_dir / WEIGHTS}: short read of row {tok} of {part.name}")
        return data

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
                path = self.store_dir / WEIGHTS
                err = ChecksumError(f"{e.name}: checksum mismatch in {e.name} at offset {e.offset + k * cb} "
                                    f"of {path} (the store is damaged; re-run `lever convert`)")
                err.label, err.path, err.offset, err.reason = e.name, str(path), e.offset + k * cb, "checksum"
                raise err
            self._verified_chunks.add((e.name, k))


def _check_types(m: StoreManifest, store_dir: Path) -> None:
    """UnsupportedModelError for a tensor the native decoder cannot use as stored
    (a repacked type is used wherever its base type is: the manifest's checks
    allow it only where it has a repacked form, lever.store.validate)."""
    for e in m.layers + m.head_parts + m.embedding_parts:
        for t in e.tensors:
            check_type(f"{store_dir} ({e.name})", t.name, base_type(t.qtype), len(t.shape) == 2,
                       "; convert the model with `lever convert --dtype bf16`")
    if len({base_type(e.tensors[0].qtype) for e in m.embedding_parts}) != 1:
        raise StoreError(f"{store_dir}: the embedding parts do not share one tensor type")


def _row_bytes(part: Extent) -> int:
    """Bytes of one row of the matrix an embedding or head part holds."""
    t = part.tensors[0]
    return t.nbytes // t.shape[0]


def _in_ggml_layout(data: np.ndarray, t: TensorEntry, r: int) -> np.ndarray:
    """Row r of `data`, the bytes of rows of tensor `t` as stored (one row, or
    for a repacked type the whole 8-row group holding it), in the GGUF layout."""
    if not is_repacked(t.qtype):
        return data
    return _native.unpack_rows(np.ascontiguousarray(data), t.qtype, REPACK_ROWS, t.shape[1], [r])[0]


def _no_release() -> None:
    pass


class StreamedDecoder(NativeDecoder):
    """The model protocol over a flash store under a DRAM budget (see module doc).

    dram_budget: bytes.  dtype: the KV cache's element type ("float32",
    "bfloat16" or the torch dtype of that name).  prefetch_depth: read buffers
    in the ring, or "auto": two (the greedy plan leaves less than a slot, see
    lever.store.residency), re-planned by mode lever from the profile (`replan`).  kv_tokens: tokens the budget reserves KV cache room for.
    max_read_bytes_per_s: pace flash reads to at most this many bytes per
    second (emulates slower flash); 0 = unlimited.  queue_depth: chunk reads
    (of the store's chunk_bytes, 1 MiB) in flight at most.  Matrices are always
    multiplied as stored (a type without a kernel needs a bf16 store).
    stage_times: as `NativeDecoder.stage_times` (waiting on flash excluded).
    manifest: the store's, when the caller has already read it (else read here).
    kv_pass_rows: rows of the largest pass, which with kv_tokens sizes the KV
    cache the budget reserves (its sliding-window layers: lever.store.residency.kv_bytes).
    """

    def __init__(self, store_dir: str | os.PathLike, dram_budget: int, dtype="bfloat16",
                 backend: str = "auto", prefetch_depth: int | str = "auto", kv_tokens: int = 2048,
                 direct: bool = True, queue_depth: int = DEFAULT_QUEUE_DEPTH,
                 max_read_bytes_per_s: float = 0.0, manifest: StoreManifest | None = None,
                 kv_pass_rows: int = PREFILL_CHUNK):
        if max_read_bytes_per_s < 0:
            raise ValueError(f"max_read_bytes_per_s must be >= 0, got {max_read_bytes_per_s}")
        dtype = dtype_name(dtype)
        self.store_dir = Path(store_dir)
        self.max_read_bytes_per_s = float(max_read_bytes_per_s)
        self.manifest = manifest if manifest is not None else StoreManifest.load(self.store_dir)
        self.kv_tokens = kv_tokens
        self._reader_options = {"backend": backend, "direct": direct, "queue_depth": queue_depth}
        plan = plan_residency(self.manifest, dram_budget, dtype_bytes(dtype), kv_tokens, prefetch_depth,
                              kv_pass_rows=kv_pass_rows)
        stats = StreamStats()
        weights = self._open(plan, stats)
        super().__init__(self.manifest.config, weights, dtype, stats)
        for i, e in enumerate(self.manifest.layers):
            try:
                self.native.check_layout(weights.layouts[i], e.length)
            except ValueError as err:
                self.close()
                raise StoreError(f"{self.store_dir}: extent {e.name}: {err}") from None

    def _open(self, plan: ResidencyPlan, stats: StreamStats) -> StreamedWeights:
        """The reader and the weight source of `plan` (pinned extents read now)."""
        self.plan = plan
        slot_bytes = plan.slot_bytes or self.manifest.globals.length
        self.reader = FlashReader(self.store_dir / WEIGHTS, slot_bytes=slot_bytes,
                                  n_slots=max(1, plan.prefetch_depth), chunk_bytes=self.manifest.chunk_bytes,
                                  max_bytes_per_s=self.max_read_bytes_per_s, **self._reader_options)
        try:
            return StreamedWeights(self.store_dir, self.manifest, plan, self.reader, stats)
        except ValueError as err:          # a layout the native core refuses
            self.reader.close()
            raise StoreError(f"{self.store_dir}: {err}") from None
        except BaseException:
            self.reader.close()
            raise

    def replan(self, prefetch_depth: int | str) -> None:
        """Re-plan the same DRAM budget with another ring depth (an integer trades
        pinned extents for read buffers; lever.cost.ring_depth chooses it): the
        old reader and pinned extents are released before the new ones are read,
        so memory never holds both.  KV caches made by `new_cache` stay valid."""
        plan = plan_residency(self.manifest, self.plan.budget, dtype_bytes(self.dtype), self.kv_tokens,
                              prefetch_depth, kv_pass_rows=self.plan.kv_pass_rows)
        self.close()
        self.weights = self.reader = None            # the old pinned extents are freed before the new load
        try:
            self.weights = self._open(plan, self.stats)
        except BaseException as e:
            raise StoreError(f"{self.store_dir}: re-planning the ring to {prefetch_depth} slots failed ({e}); "
                             f"this target is closed") from e

    def settle(self, poll_s: float = 0.001) -> None:
        """Block until the reads in flight (the ring prefetching the next pass) have
        landed; they stay queued for the next forward.  poll_s: seconds between checks."""
        self.weights.settle(poll_s)

    # -- reporting -------------------------------------------------------------

    def io_busy_s(self) -> float:
        """Seconds since creation or `reset_stats()` with at least one flash read in
        flight (the ring's prefetches included; embedding rows, read on demand, are
        not): sampled before and after an interval, the difference is the I/O that
        interval overlapped, e.g. the share of a draft's time hidden under reads."""
        return float(self.reader.stats()["busy_s"])

    def report(self) -> dict:
        """Run statistics: bytes, seconds, bandwidth, reader backend, residency, peak RSS.
        bytes_read: what the reader read (the ring's prefetches of a next pass included,
        settle() first for a count without reads in flight); bytes_used: what the passes
        used (StreamStats.bytes_used), so bytes_read_per_pass is exact."""
        r = self.reader.stats()
        s = self.stats
        passes = max(1, s.passes)
        return {
            "reader": {k: r[k] for k in ("backend", "direct", "fallback_reason", "queue_depth", "chunk_bytes",
                                            "slot_buffer_bytes", "huge_page_bytes")},
            "passes": s.passes,
            "bytes_read": r["bytes_read"] + s.embedding_bytes,
            "bytes_used": s.bytes_used,
            "bytes_read_per_pass": s.bytes_used / passes,
            "io_busy_s": r["busy_s"],
            "achieved_gib_s": r["bytes_read"] / r["busy_s"] / 2**30 if r["busy_s"] else None,
            "stall_s": s.stall_s,
            "dequant_s": 0.0,                   # nothing is dequantised (kept for report readers)
            "dequantized_bytes_per_pass": 0.0,
            "compute_s": s.compute_s,
            "read_limit_bytes_per_s": self.max_read_bytes_per_s,
            "checksum_s": r.get("checksum_s"),
            "residency": self.plan.summary(),
            "store_format_version": self.manifest.format_version,
            "weight_layout": self.manifest.weight_layout,    # "gguf": not repacked (version 2, or so converted)
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }

    def reset_stats(self) -> None:
        self.stats.reset()
        self.reader.reset_stats()

    def close(self) -> None:
        """Release the reader and the pinned extents (again: nothing)."""
        if self.reader is not None:
            self.reader.close()
        if self.weights is not None:
            self.weights.close()


"""Asynchronous, checksummed reads of large aligned extents from flash.

A thin wrapper over the native reader (`lever._native.FlashReader`, C++ in
csrc/io/). Typical use, streaming decoder layers through two slots::

    reader = FlashReader(store / "weights.bin", slot_bytes=max_layer_bytes, n_slots=2)
    reader.submit(0, offset0, length0, crcs0, label="layer 0")
    reader.submit(1, offset1, length1, crcs1, label="layer 1")
    layer0 = reader.wait(0)          # numpy uint8 view, verified
    ...                              # compute, then resubmit slot 0

Units: offsets, lengths and sizes are bytes; times are seconds; bandwidths
bytes per second.

Reads go through io_uring (registered buffers) or, where io_uring is missing
or blocked (or LEVER_IO_URING=0), a pread thread pool. On Android the pread
pool is the default and io_uring is not even tried unless LEVER_IO_URING=1
(the app seccomp filter kills a process calling io_uring_setup). The file is
opened with O_DIRECT, so the bytes come from the device and not from the
page cache, unless the file system refuses it; `stats()` says which backend
and mode are in use and why.

`wait()` never hangs: it fails with FlashReadError (reason "timeout") when
no read of its extent finished for LEVER_IO_TIMEOUT_S seconds (default 30,
at most 1e6). `read()` waits for the kernel without a deadline (it may still
be writing into the caller's memory). `close()` cancels the reads in flight
(io_uring) and waits for them at most LEVER_IO_TIMEOUT_S seconds; a read
still out then (a hung device) is abandoned: reported on stderr and in
stats()["abandoned_reads"], and the slot buffers are leaked rather than
freed. With the pread backend a blocked pread() cannot be cancelled, and
close() waits for it. For tests, LEVER_IO_FAULTS injects faults when a reader is made, e.g.
"eio@<offset>*1,short@<offset>,delay_ms=<n>[@<offset>],hang@<offset>,submit_err=<errno>,
no_io_uring,no_cancel" (file offsets in bytes; *K: the first K matching reads only;
grammar in csrc/io/fault_injection.h).
"""

from __future__ import annotations

import os
from typing import Iterable, Optional, Sequence

import numpy as np

from lever import _native
from lever.errors import ChecksumError, FlashReadError

__all__ = [
    "FlashReader",
    "FlashReadError",
    "ChecksumError",
    "ALIGNMENT",
    "DEFAULT_QUEUE_DEPTH",
    "aligned_empty",
    "chunk_checksums",
    "crc32c",
    "drop_page_cache",
]

ALIGNMENT = 4096
"""File offsets, lengths and (for O_DIRECT) memory must be multiples of this (bytes)."""

DEFAULT_QUEUE_DEPTH = 8
"""Chunk reads (1 MiB each) in flight by default.  On the development VM,
reading a 1.1 GB store pass by pass through 8 slots with 8, 16 and 32 reads in
flight gave the same speed within noise once each reader had been made in
a fair order (bench/reader_queue_depth.py); phone UFS queues hold 32
commands.  `--read-queue-depth` sets another depth for a device that wants one."""


class FlashReader:
    """Reads extents of one file into `n_slots` aligned buffers of `slot_bytes` bytes.

    path:            the file (e.g. a store's weights.bin; its size should be a
                     multiple of 4096 bytes so that the last extent can be read).
    slot_bytes:      bytes per slot buffer, a multiple of 4096 (>= the largest extent).
    n_slots:         number of slot buffers (0 if only `read()` is used).
    backend:         "auto" (io_uring, else pread), "io_uring" (error if
                     unavailable) or "pread".
    direct:          open with O_DIRECT (falls back to buffered reads if the
                     file system refuses; see stats()["direct_reason"]).
    queue_depth:     chunk reads in flight at most.
    chunk_bytes:     bytes per read, a power of two >= 4096; the unit of `chunk_crcs`.
    pread_threads:   threads of the pread backend (at most queue_depth are used).
    max_bytes_per_s: pace reads to emulate slower flash (bytes/s); 0 = unlimited.
    huge_pages:      put the slot buffers on transparent huge pages where the
                     kernel gives them (LEVER_HUGE_PAGES=0 or 1 overrides):
                     an O_DIRECT chunk of 1 MiB is then one device request
                     instead of two, and neighbouring chunks merge (see
                     csrc/io/slot_memory.h; on the development VM a store
                     pass read at 1.75 instead of 1.09 GiB/s, median).
                     stats() says what the kernel gave.

    Every slot page is touched when the reader is made: the slots hold
    stats()["slot_buffer_bytes"] of RSS from then on (slot_bytes each, or
    whole 2 MiB pages on the huge-page path; `_native.slot_memory_bytes`).

    Raises FlashReadError if the file cannot be opened or io_uring was
    requested but is unavailable, ValueError for bad arguments.
    """

    def __init__(self, path, slot_bytes: int, n_slots: int, backend: str = "auto",
                 direct: bool = True, queue_depth: int = DEFAULT_QUEUE_DEPTH, chunk_bytes: int = 1 << 20,
                 pread_threads: int = 4, max_bytes_per_s: float = 0.0, huge_pages: bool = True):
        self._native = _native.FlashReader(
            os.fspath(path), int(slot_bytes), int(n_slots), backend=backend, direct=bool(direct),
            queue_depth=int(queue_depth), chunk_bytes=int(chunk_bytes),
            pread_threads=int(pread_threads), max_bytes_per_s=float(max_bytes_per_s),
            huge_pages=bool(huge_pages))

    def submit(self, slot: int, offset: int, length: int,
               chunk_crcs: Optional[Sequence[int]] = None, label: str = "") -> None:
        """Start reading bytes [offset, offset + length) of the file into `slot`; returns at once.

        offset, length: bytes, multiples of 4096; length <= slot_bytes.
        chunk_crcs: None, or the expected CRC32C of each chunk_bytes chunk of
        the extent (the last may be shorter), as `chunk_checksums` computes
        them; each chunk is verified as soon as it arrives.
        label: names the extent in errors, e.g. "layer 7".
        The slot must not still be in flight (ValueError); a view returned by
        an earlier wait(slot) sees the new bytes as they arrive.
        """
        self._native.submit(slot, offset, length, _crc_list(chunk_crcs), label)

    def wait(self, slot: int) -> np.ndarray:
        """Block until the slot's extent is read and verified; return its bytes.

        Returns a read-only uint8 view of the slot buffer (`length` bytes),
        valid until the slot is submitted again. Raises FlashReadError (I/O
        error, short read; "timeout" if no read of the extent finished for
        LEVER_IO_TIMEOUT_S seconds -- its reads then stay in flight, see
        ready()) or ChecksumError; ValueError if nothing was submitted.
        """
        return self._native.wait(slot)

    def ready(self, slot: int) -> bool:
        """True if wait(slot) would return (or raise) without blocking."""
        return self._native.ready(slot)

    def read(self, offset: int, length: int, out=None,
             chunk_crcs: Optional[Sequence[int]] = None, label: str = "") -> np.ndarray:
        """Read bytes [offset, offset + length) synchronously into `out` and return it.

        out: a writable C-contiguous buffer of >= length bytes, or None for a
        new 4096-aligned uint8 array. With O_DIRECT an aligned `out` (see
        `aligned_empty`) is filled directly; other memory goes through
        staging buffers (one extra copy). Same checks and errors as wait().
        """
        if out is None:
            out = aligned_empty(length)
        self._native.read(offset, length, out, _crc_list(chunk_crcs), label)
        return out

    def stats(self) -> dict:
        """Configuration in use and counters since creation or reset_stats().

        backend ("io_uring"/"pread"), direct (bool), fallback_reason (str or
        None: what is not as requested, and why), backend_reason,
        direct_reason, registered_buffers, huge_pages_requested,
        slot_buffer_bytes (bytes of all slots), huge_page_bytes (of those, bytes
        the kernel backs with huge pages), huge_pages_reason (str or None: why
        none), queue_depth, chunk_bytes (bytes),
        pread_threads, max_bytes_per_s, crc32c_implementation; counters:
        bytes_read (bytes), reads (chunk reads), extents (submit() and read()
        calls), wait_s (seconds callers blocked in wait()/read()), busy_s
        (seconds with at least one read in flight: bandwidth = bytes_read /
        busy_s), checksum_s (CPU seconds spent in CRC32C); abandoned_reads
        (reads close() gave up on, see close(); 0 normally).
        """
        return self._native.stats()

    def reset_stats(self) -> None:
        """Zero the counters of stats()."""
        self._native.reset_stats()

    def close(self) -> None:
        """Cancel queued reads and those in flight, wait for them, stop the I/O threads, close the file.

        Waits at most LEVER_IO_TIMEOUT_S seconds (the read timeout) for the
        reads in flight with io_uring; reads still out then are abandoned
        (stderr line, stats()["abandoned_reads"]) and their slot buffers
        leaked. pread: waits until a blocked pread() returns (it cannot be
        cancelled). Views returned by wait() stay readable. Safe to call
        more than once.
        """
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def path(self) -> str:
        return self._native.path

    @property
    def slot_bytes(self) -> int:
        return self._native.slot_bytes

    @property
    def n_slots(self) -> int:
        return self._native.n_slots

    def __enter__(self) -> "FlashReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.stats()
        return (f"FlashReader({self.path!r}, backend={s['backend']}, direct={s['direct']}, "
                f"slots={self.n_slots}x{self.slot_bytes}, queue_depth={s['queue_depth']}, "
                f"chunk_bytes={s['chunk_bytes']})")


def _crc_list(chunk_crcs: Optional[Iterable[int]]) -> Optional[list]:
    return None if chunk_crcs is None else [int(c) for c in chunk_crcs]


def _as_bytes_view(data) -> memoryview:
    view = memoryview(data)
    if not view.c_contiguous:
        raise ValueError("data must be C-contiguous (use numpy.ascontiguousarray)")
    return view.cast("B")


def crc32c(data, value: int = 0) -> int:
    """CRC32C (Castagnoli) of the bytes of `data` (bytes, bytearray, numpy array, ...).

    `value` is the CRC of preceding bytes (zlib convention):
    crc32c(b, crc32c(a)) == crc32c(a + b); crc32c(b"123456789") == 0xE3069283.
    """
    return _native.crc32c(data, value)


def chunk_checksums(data, chunk_bytes: int = 1 << 20) -> list:
    """CRC32C of each `chunk_bytes`-byte chunk of `data` (the last one may be shorter).

    What the store writer records per extent and FlashReader.submit/read
    take as `chunk_crcs` (with the reader's chunk_bytes: a power of two >= 4096).
    """
    chunk_bytes = int(chunk_bytes)
    if chunk_bytes < ALIGNMENT or chunk_bytes & (chunk_bytes - 1):
        raise ValueError(f"chunk_bytes must be a power of two >= {ALIGNMENT}, got {chunk_bytes}")
    view = _as_bytes_view(data)
    return [_native.crc32c(view[i:i + chunk_bytes]) for i in range(0, len(view), chunk_bytes)]


def aligned_empty(nbytes: int, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialised uint8 array of `nbytes` bytes whose data starts on an `alignment`-byte boundary."""
    nbytes = int(nbytes)
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes]


def drop_page_cache(path=None) -> str:
    """Drop cached file pages so that the next reads come from the device; never raises.

    path=None: os.sync(), then write 3 to /proc/sys/vm/drop_caches (needs
    root) -- the whole page cache. With a path: os.sync(), then
    posix_fadvise(DONTNEED) on that file only (no root needed).
    Returns a statement of what happened: "dropped page cache ..." or
    "could not drop page cache: <reason>".
    """
    try:
        os.sync()
    except Exception as exc:  # noqa: BLE001 -- report, never raise
        return f"could not drop page cache: sync failed: {exc}"
    if path is not None:
        try:
            fd = os.open(os.fspath(path), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except Exception as exc:  # noqa: BLE001
            return f"could not drop page cache: {exc}"
        return f"dropped page cache for {os.fspath(path)} (posix_fadvise DONTNEED)"
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except Exception as exc:  # noqa: BLE001
        return f"could not drop page cache: {exc}"
    return "dropped page cache (echo 3 > /proc/sys/vm/drop_caches)"

"""The flash device's raw sequential read bandwidth, the I/O lower bound of
a streamed target: reading a store's weights.bin end to end through the
FlashReader (O_DIRECT where the filesystem allows it), with a few large
reads in flight.  Benchmarks divide bytes read per token by it."""

from __future__ import annotations

import time
from pathlib import Path

from .flash_reader import DEFAULT_QUEUE_DEPTH, FlashReader
from .manifest import WEIGHTS

SWEEP_EXTENT = 32 << 20      # bytes per read of the sweep
SWEEP_SLOTS = 4              # reads in flight


def sequential_read(store: str | Path, backend: str = "auto", max_bytes_per_s: float = 0.0,
                    extent_bytes: int = SWEEP_EXTENT, slots: int = SWEEP_SLOTS,
                    queue_depth: int = DEFAULT_QUEUE_DEPTH) -> tuple[float, dict]:
    """(bytes per second, the reader's stats) of one sequential read of the
    whole weights.bin of `store` (capped at max_bytes_per_s when > 0, as a
    throttled reader would be), with `queue_depth` chunk reads in flight, as
    the streamed target has."""
    path = Path(store) / WEIGHTS
    size = path.stat().st_size // 4096 * 4096
    reader = FlashReader(path, slot_bytes=extent_bytes, n_slots=slots, backend=backend,
                         max_bytes_per_s=max_bytes_per_s, queue_depth=queue_depth)
    try:
        t0 = time.perf_counter()
        pending = []
        for i, off in enumerate(range(0, size, extent_bytes)):
            slot = i % slots
            if len(pending) == slots:
                reader.wait(pending.pop(0))
            reader.submit(slot, off, min(extent_bytes, size - off), None, f"sweep@{off}")
            pending.append(slot)
        for slot in pending:
            reader.wait(slot)
        elapsed = time.perf_counter() - t0
        return size / elapsed, reader.stats()
    finally:
        reader.close()

"""Flash reader bandwidth: io_uring vs pread, by queue depth and chunk size.

    pytest bench/bench_reader.py --benchmark-only

A 256 MiB file of random bytes is written once to a directory on a real file
system (/var/tmp) and read with O_DIRECT (so from the device, not the page
cache) as 8 extents of 32 MiB through two slots, the next extent always in
flight while the previous one is waited for -- the way layers are streamed.

Grid: backend (io_uring, pread) x queue depth (1, 4, 8, 16) x chunk size
(256 KiB, 1 MiB, 4 MiB); the pread pool gets queue_depth threads so that
both backends have the same number of reads in flight. Two extra cases verify
CRC32C per chunk (queue depth 8, 1 MiB chunks).

Reported per case (benchmark.extra_info and a summary table at the end):
GiB/s from the median and from the fastest wall time of a whole-file pass,
and the reader's own device bandwidth bytes_read / busy_s over all passes
(busy_s: time with a read in flight). The disk of the development VM is noisy
(1.2-3 GiB/s from one second to the next): compare medians over repeated runs.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from lever.store.flash_reader import FlashReader, chunk_checksums

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
FILE_BYTES = 256 * MiB
EXTENT_BYTES = 32 * MiB
N_EXTENTS = FILE_BYTES // EXTENT_BYTES
BACKENDS = ["io_uring", "pread"]
QUEUE_DEPTHS = [1, 4, 8, 16]
CHUNKS = [256 * KiB, 1 * MiB, 4 * MiB]
ROUNDS = 5

# (backend, queue_depth, chunk_bytes, verify) -> (median s, min s, device GiB/s, direct)
_results: dict[tuple, tuple] = {}


class _Summary:
    """pytest plugin printing the bandwidth table after the run."""

    def pytest_terminal_summary(self, terminalreporter):
        if not _results:
            return
        tr = terminalreporter
        tr.section("flash reader bandwidth (256 MiB file, 32 MiB extents, 2 slots)")
        directs = {direct for *_, direct in _results.values()}
        tr.write_line(f"O_DIRECT: direct={'True' if directs == {True} else sorted(directs)} "
                      "(page cache bypassed; no drop needed)")
        tr.write_line("GiB/s from the median pass, best from the fastest; device: bytes_read / busy_s")
        tr.write_line(f"{'backend':9} {'qd':>3} {'chunk':>8} {'crc':>4} {'median ms':>10} "
                      f"{'GiB/s':>7} {'best':>6} {'device':>7}")
        for (backend, qd, chunk, verify), (t, t_min, device, _) in sorted(_results.items()):
            tr.write_line(f"{backend:9} {qd:3d} {chunk // KiB:6d}Ki {'yes' if verify else 'no':>4} "
                          f"{t * 1e3:10.1f} {FILE_BYTES / t / GiB:7.2f} "
                          f"{FILE_BYTES / t_min / GiB:6.2f} {device:7.2f}")


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    pm = request.config.pluginmanager
    if not pm.has_plugin("lever-reader-summary"):
        pm.register(_Summary(), "lever-reader-summary")
    yield


@pytest.fixture(scope="module")
def bench_file():
    """(path, bytes) of the 256 MiB file on a real file system."""
    d = Path(tempfile.mkdtemp(prefix="lever-bench-reader-", dir="/var/tmp"))
    path = d / "weights.bin"
    data = np.random.default_rng(0).integers(0, 256, FILE_BYTES, dtype=np.uint8)
    data.tofile(path)
    yield path, data
    shutil.rmtree(d, ignore_errors=True)


def _read_whole_file(reader: FlashReader, crcs) -> None:
    """All extents through slots 0 and 1: extent i + 1 is in flight while i is waited for."""
    reader.submit(0, 0, EXTENT_BYTES, crcs[0] if crcs else None, label="extent 0")
    for i in range(N_EXTENTS):
        if i + 1 < N_EXTENTS:
            reader.submit((i + 1) % 2, (i + 1) * EXTENT_BYTES, EXTENT_BYTES,
                          crcs[i + 1] if crcs else None, label=f"extent {i + 1}")
        reader.wait(i % 2)


def _run(benchmark, bench_file, backend, queue_depth, chunk_bytes, verify):
    path, data = bench_file
    crcs = None
    if verify:
        crcs = [chunk_checksums(data[i * EXTENT_BYTES:(i + 1) * EXTENT_BYTES], chunk_bytes)
                for i in range(N_EXTENTS)]
    with FlashReader(path, EXTENT_BYTES, 2, backend=backend, direct=True,
                     queue_depth=queue_depth, chunk_bytes=chunk_bytes,
                     pread_threads=queue_depth) as reader:
        _read_whole_file(reader, crcs)  # warm-up (threads, page tables of the slots)
        reader.reset_stats()
        passes = []  # one entry per timed pass (a single pass under --benchmark-disable)
        benchmark.pedantic(lambda: passes.append(_read_whole_file(reader, crcs)),
                           rounds=ROUNDS, iterations=1)
        s = reader.stats()
    assert s["backend"] == backend and s["bytes_read"] == len(passes) * FILE_BYTES
    if getattr(benchmark, "stats", None) is None:  # --benchmark-disable: nothing timed
        return
    median, fastest = benchmark.stats.stats.median, benchmark.stats.stats.min
    device = s["bytes_read"] / s["busy_s"] / GiB
    benchmark.extra_info.update({
        "gib_per_s": FILE_BYTES / median / GiB,
        "best_gib_per_s": FILE_BYTES / fastest / GiB,
        "device_gib_per_s": device,
        "direct": s["direct"],
        "backend": backend,
        "queue_depth": queue_depth,
        "chunk_bytes": chunk_bytes,
        "checksum_cpu_s_per_pass": s["checksum_s"] / len(passes),
    })
    _results[(backend, queue_depth, chunk_bytes, verify)] = (median, fastest, device, s["direct"])


@pytest.mark.parametrize("chunk_bytes", CHUNKS, ids=lambda c: f"{c // KiB}KiB")
@pytest.mark.parametrize("queue_depth", QUEUE_DEPTHS, ids=lambda q: f"qd{q}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_read_bandwidth(benchmark, bench_file, backend, queue_depth, chunk_bytes):
    benchmark.group = f"reader qd{queue_depth} {chunk_bytes // KiB}KiB"
    _run(benchmark, bench_file, backend, queue_depth, chunk_bytes, verify=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_bandwidth_with_checksums(benchmark, bench_file, backend):
    benchmark.group = "reader qd8 1024KiB crc32c"
    _run(benchmark, bench_file, backend, 8, MiB, verify=True)

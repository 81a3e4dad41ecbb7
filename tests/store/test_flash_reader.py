"""The native flash reader (csrc/io/) through lever.store.flash_reader.

Files of random bytes are written to a directory on a real file system
(/var/tmp, where O_DIRECT works: asserted) and read back through both
backends; corrupted, truncated and unreadable files must fail with errors
that name the label, the file and the offset.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import lever._native as native
from lever.errors import LeverError
from lever.store.flash_reader import (ALIGNMENT, ChecksumError, FlashReader, FlashReadError,
                                      aligned_empty, chunk_checksums, crc32c, drop_page_cache)
from waiting import deadline

KiB = 1 << 10
MiB = 1 << 20
BACKENDS = ["io_uring", "pread"]


# ---------------------------------------------------------------------------
# Helpers and fixtures

def crc32c_bitwise(data: bytes, value: int = 0) -> int:
    """Reference CRC32C: one bit at a time, reflected polynomial 0x82F63B78."""
    crc = value ^ 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def o_direct_works(directory) -> bool:
    probe = Path(directory) / ".o_direct_probe"
    probe.write_bytes(b"\0" * ALIGNMENT)
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)
    os.close(fd)
    return True


def write_random(path: Path, nbytes: int, seed: int) -> np.ndarray:
    data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    data.tofile(path)
    return data


@pytest.fixture(scope="module")
def disk_dir():
    """A directory on a real file system (not tmpfs): /var/tmp."""
    d = Path(tempfile.mkdtemp(prefix="lever-flash-test-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def data_file(disk_dir):
    """(path, bytes) of a 24 MiB + 12 KiB file of random bytes."""
    path = disk_dir / "weights.bin"
    return path, write_random(path, 24 * MiB + 12 * KiB, seed=1)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def random_extents(rng, file_bytes: int, max_bytes: int, n: int):
    """n random (offset, length) pairs, 4096-aligned, lengths up to max_bytes."""
    out = []
    for _ in range(n):
        length = int(rng.integers(1, max_bytes // ALIGNMENT + 1)) * ALIGNMENT
        offset = int(rng.integers(0, (file_bytes - length) // ALIGNMENT + 1)) * ALIGNMENT
        out.append((offset, length))
    return out


# ---------------------------------------------------------------------------
# CRC32C

def test_crc32c_known_values():
    assert crc32c(b"123456789") == 0xE3069283
    assert native.crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert crc32c(b"\0" * 32) == 0x8A9136AA  # RFC 3720 B.4 test vector
    assert crc32c(bytes(range(32))) == 0x46DD794E  # RFC 3720 B.4 test vector
    assert crc32c(np.frombuffer(b"123456789", dtype=np.uint8)) == 0xE3069283
    assert native.crc32c_implementation() in ("sse4.2", "armv8-crc", "slicing-by-8")


def test_crc32c_matches_bitwise_reference():
    rng = np.random.default_rng(7)
    blob = rng.integers(0, 256, 8192, dtype=np.uint8).tobytes()
    for n in list(range(0, 40)) + [63, 64, 65, 255, 1000, 4097, 8191 - 5]:
        start = int(rng.integers(0, 6))  # unaligned starts too
        chunk = blob[start:start + n]
        value = int(rng.integers(0, 2**32))
        assert crc32c(chunk) == crc32c_bitwise(chunk), n
        assert crc32c(chunk, value) == crc32c_bitwise(chunk, value), n


def test_crc32c_long_buffers_match_bitwise_reference():
    """Buffers long enough for the three-stream hardware loop (3 x 8 KiB rounds)."""
    blob = np.random.default_rng(8).integers(0, 256, 2 * 3 * 8192 + 1003, dtype=np.uint8).tobytes()
    assert crc32c(blob) == crc32c_bitwise(blob)
    assert crc32c(blob[5:], 0x12345678) == crc32c_bitwise(blob[5:], 0x12345678)


def test_crc32c_continues_across_pieces():
    data = np.random.default_rng(3).integers(0, 256, 3 * MiB + 123, dtype=np.uint8)
    whole = crc32c(data)
    for cut in (0, 1, 7, 4096, MiB + 5, len(data)):
        assert crc32c(data[cut:], crc32c(data[:cut])) == whole


def test_chunk_checksums():
    data = np.random.default_rng(4).integers(0, 256, 5 * MiB + 3 * KiB, dtype=np.uint8)
    crcs = chunk_checksums(data, MiB)
    assert len(crcs) == 6  # the last chunk holds 3 KiB
    for i, c in enumerate(crcs):
        assert c == crc32c(data[i * MiB:(i + 1) * MiB])
    assert chunk_checksums(data.tobytes(), MiB) == crcs
    assert chunk_checksums(b"", MiB) == []
    with pytest.raises(ValueError, match="power of two"):
        chunk_checksums(data, 3 * MiB)
    with pytest.raises(ValueError, match="power of two"):
        chunk_checksums(data, 512)


# ---------------------------------------------------------------------------
# Reading

def test_direct_on_real_file_system(data_file, backend):
    path, _ = data_file
    with FlashReader(path, MiB, 1, backend=backend) as reader:
        s = reader.stats()
    assert s["backend"] == backend
    assert s["direct"] is True
    assert s["direct_reason"] is None
    assert s["fallback_reason"] is None
    assert s["registered_buffers"] is (backend == "io_uring")


def test_many_extents_match_the_file(data_file, backend):
    """Random extents with odd chunk counts through 3 slots, reused, pipelined."""
    path, data = data_file
    rng = np.random.default_rng(11)
    slot_bytes = 5 * MiB + 12 * KiB  # extents of up to 6 chunks, the last one short
    with FlashReader(path, slot_bytes, 3, backend=backend, chunk_bytes=MiB) as reader:
        extents = random_extents(rng, len(data), slot_bytes, 45)
        # Three reads in flight at a time; each slot is resubmitted after wait.
        for first in range(0, len(extents), 3):
            group = extents[first:first + 3]
            for slot, (off, n) in enumerate(group):
                crcs = chunk_checksums(data[off:off + n], MiB)
                reader.submit(slot, off, n, crcs, label=f"layer {first + slot}")
            for slot, (off, n) in enumerate(group):
                view = reader.wait(slot)
                assert view.dtype == np.uint8 and view.shape == (n,)
                np.testing.assert_array_equal(view, data[off:off + n])
        assert reader.stats()["direct"] is True


def test_backends_give_identical_bytes(data_file):
    path, data = data_file
    extents = random_extents(np.random.default_rng(12), len(data), 4 * MiB, 12)
    extents.append((len(data) - 12 * KiB, 12 * KiB))  # the tail of the file
    results = {}
    for backend in BACKENDS:
        with FlashReader(path, 4 * MiB, 2, backend=backend, chunk_bytes=256 * KiB,
                         queue_depth=16) as reader:
            results[backend] = []
            for off, n in extents:
                reader.submit(0, off, n)
                results[backend].append(reader.wait(0).copy())
    for a, b, (off, n) in zip(results["io_uring"], results["pread"], extents):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, data[off:off + n])


def test_read_into_caller_buffers(data_file, backend):
    path, data = data_file
    n = len(data) - 12 * KiB  # 24 MiB: two 16 MiB staging windows when unaligned
    crcs = chunk_checksums(data[:n], MiB)
    with FlashReader(path, 0, 0, backend=backend) as reader:
        aligned = reader.read(0, n, chunk_crcs=crcs, label="pinned")  # allocates aligned
        assert aligned.ctypes.data % ALIGNMENT == 0
        np.testing.assert_array_equal(aligned, data[:n])

        unaligned = np.zeros(n + 1, dtype=np.uint8)[1:]  # O_DIRECT cannot target it directly
        assert unaligned.ctypes.data % ALIGNMENT != 0
        assert reader.read(0, n, unaligned, crcs, "pinned") is unaligned
        np.testing.assert_array_equal(unaligned, data[:n])

        small = bytearray(3 * MiB)
        reader.read(8 * KiB, 2 * MiB + 4 * KiB, small)
        assert bytes(small[:2 * MiB + 4 * KiB]) == data[8 * KiB:2 * MiB + 12 * KiB].tobytes()

        as_f32 = aligned_empty(MiB).view(np.float32)  # any dtype: bytes are bytes
        reader.read(MiB, MiB, as_f32)
        np.testing.assert_array_equal(as_f32.view(np.uint8), data[MiB:2 * MiB])

        with pytest.raises(ValueError, match="fewer than length"):
            reader.read(0, 2 * MiB, bytearray(MiB))


def test_wait_returns_read_only_view_that_keeps_the_reader_alive(data_file, backend):
    path, data = data_file
    reader = FlashReader(path, MiB, 1, backend=backend)
    reader.submit(0, 4 * MiB, 64 * KiB)
    view = reader.wait(0)
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0] = 1
    again = reader.wait(0)  # waiting twice is fine
    assert again.ctypes.data == view.ctypes.data
    assert reader.ready(0)
    del reader, again
    gc.collect()
    np.testing.assert_array_equal(view, data[4 * MiB:4 * MiB + 64 * KiB])


# ---------------------------------------------------------------------------
# Failures

def test_checksum_mismatch_names_label_file_and_offset(disk_dir, data_file, backend):
    src, data = data_file
    path = disk_dir / f"corrupt-{backend}.bin"
    shutil.copyfile(src, path)
    flip_at = 6 * MiB + 300 * KiB + 17  # inside the chunk that starts at 6 MiB
    with open(path, "r+b") as f:
        f.seek(flip_at)
        f.write(bytes([data[flip_at] ^ 0x01]))

    extent_off, extent_len = 4 * MiB, 4 * MiB  # chunks at 4, 5, 6, 7 MiB
    crcs = chunk_checksums(data[extent_off:extent_off + extent_len], MiB)
    with FlashReader(path, 4 * MiB, 2, backend=backend) as reader:
        reader.submit(0, extent_off, extent_len, crcs, label="layer 7")
        with pytest.raises(ChecksumError) as info:
            reader.wait(0)
        message = str(info.value)
        assert "checksum mismatch in layer 7 at offset 6291456 " in message
        assert f"expected 0x{crcs[2]:08x}" in message
        assert str(path) in message
        assert info.value.offset == 6 * MiB
        assert info.value.label == "layer 7"
        assert info.value.reason == "checksum"
        assert isinstance(info.value, FlashReadError) and isinstance(info.value, LeverError)

        # The same bytes without checksums read fine; untouched extents verify.
        reader.submit(1, extent_off, extent_len)
        assert reader.wait(1)[flip_at - extent_off] == data[flip_at] ^ 0x01
        reader.submit(1, 0, 4 * MiB, chunk_checksums(data[:4 * MiB], MiB), label="layer 6")
        np.testing.assert_array_equal(reader.wait(1), data[:4 * MiB])

        with pytest.raises(ChecksumError, match="checksum mismatch in pinned at offset 6291456"):
            reader.read(extent_off, extent_len, chunk_crcs=crcs, label="pinned")


@pytest.mark.parametrize("cut", [100, 0], ids=["mid-block", "block-boundary"])
def test_truncated_file_is_a_short_read(disk_dir, data_file, backend, cut):
    src, data = data_file
    path = disk_dir / f"truncated-{backend}-{cut}.bin"
    size = 3 * MiB + cut
    path.write_bytes(data[:size].tobytes())
    with FlashReader(path, 2 * MiB, 1, backend=backend) as reader:
        reader.submit(0, 2 * MiB, 2 * MiB, chunk_checksums(data[2 * MiB:4 * MiB], MiB),
                      label="layer 3")
        with pytest.raises(FlashReadError) as info:
            reader.wait(0)
    assert not isinstance(info.value, ChecksumError)
    message = str(info.value)
    assert message.startswith("layer 3: ")
    assert f"short read: got {cut} of 1048576 bytes at offset 3145728" in message
    assert str(path) in message and f"the file is {size} bytes" in message
    assert info.value.reason == "short_read" and info.value.offset == 3 * MiB


def test_errno_is_reported(disk_dir, backend):
    """Reading a directory fails with EISDIR: the errno path."""
    with FlashReader(disk_dir, MiB, 1, backend=backend) as reader:
        with pytest.raises(FlashReadError) as info:
            reader.read(0, 8 * KiB, label="layer 1")
    message = str(info.value)
    assert "layer 1: read failed at offset 0" in message
    assert os.strerror(21) in message and "errno 21" in message and str(disk_dir) in message
    assert info.value.reason == "io"


def test_missing_file():
    with pytest.raises(FlashReadError, match="cannot open /nonexistent/weights.bin: No such file"):
        FlashReader("/nonexistent/weights.bin", MiB, 1)


def test_bad_arguments(data_file, backend):
    path, _ = data_file
    with FlashReader(path, MiB, 2, backend=backend) as reader:
        with pytest.raises(ValueError, match="multiples of 4096"):
            reader.submit(0, 100, 4096)
        with pytest.raises(ValueError, match="multiples of 4096"):
            reader.submit(0, 0, 1000)
        with pytest.raises(ValueError, match="multiples of 4096"):
            reader.read(512, 4096)
        with pytest.raises(ValueError, match="exceeds slot_bytes"):
            reader.submit(0, 0, 2 * MiB)
        with pytest.raises(ValueError, match="expected 1 chunk checksums"):
            reader.submit(0, 0, MiB, [1, 2])
        with pytest.raises(ValueError, match="out of range"):
            reader.submit(2, 0, 4096)
        with pytest.raises(ValueError, match="out of range"):
            reader.wait(-1)
        with pytest.raises(ValueError, match="slot 1 has no read submitted"):
            reader.wait(1)
    with pytest.raises(ValueError, match="chunk_bytes must be a power of two"):
        FlashReader(path, MiB, 1, backend=backend, chunk_bytes=3 * MiB)
    with pytest.raises(ValueError, match="slot_bytes must be a positive multiple of 4096"):
        FlashReader(path, 1000, 1, backend=backend)
    with pytest.raises(ValueError, match="backend must be"):
        FlashReader(path, MiB, 1, backend="aio")


def test_submit_while_in_flight_is_refused(data_file, backend):
    path, _ = data_file
    # 2 MB/s: 8 MiB takes seconds, so the slot is surely still in flight
    # (and close() waits for one 64 KiB chunk only).
    reader = FlashReader(path, 8 * MiB, 1, backend=backend, queue_depth=1,
                         chunk_bytes=64 * KiB, max_bytes_per_s=2e6)
    reader.submit(0, 0, 8 * MiB)
    with pytest.raises(ValueError, match="slot 0 still has a read in flight"):
        reader.submit(0, 0, 4096)
    assert not reader.ready(0)
    reader.close()


# ---------------------------------------------------------------------------
# Backend and O_DIRECT selection

def test_auto_uses_io_uring_here(data_file):
    path, _ = data_file
    with FlashReader(path, MiB, 1) as reader:
        s = reader.stats()
    assert s["backend"] == "io_uring" and s["backend_reason"] is None


def test_io_uring_disabled_by_environment(data_file, monkeypatch):
    path, data = data_file
    monkeypatch.setenv("LEVER_IO_URING", "0")
    with FlashReader(path, MiB, 1, backend="auto") as reader:
        s = reader.stats()
        assert s["backend"] == "pread"
        assert "LEVER_IO_URING=0" in s["fallback_reason"]
        assert "LEVER_IO_URING=0" in s["backend_reason"]
        reader.submit(0, MiB, MiB)
        np.testing.assert_array_equal(reader.wait(0), data[MiB:2 * MiB])
    with pytest.raises(FlashReadError, match="io_uring was requested .* LEVER_IO_URING=0") as info:
        FlashReader(path, MiB, 1, backend="io_uring")
    assert info.value.reason == "unavailable"


def test_tmpfs(backend):
    """/dev/shm (tmpfs): O_DIRECT where the kernel allows it (Linux >= 6.6), else buffered."""
    d = Path(tempfile.mkdtemp(prefix="lever-flash-test-", dir="/dev/shm"))
    try:
        path = d / "weights.bin"
        data = write_random(path, 3 * MiB, seed=5)
        expected_direct = o_direct_works(d)
        with FlashReader(path, 3 * MiB, 1, backend=backend) as reader:
            s = reader.stats()
            assert s["direct"] is expected_direct
            if not expected_direct:
                assert "O_DIRECT" in s["fallback_reason"]
            reader.submit(0, 0, 3 * MiB, chunk_checksums(data, MiB))
            np.testing.assert_array_equal(reader.wait(0), data)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_o_direct_refused_falls_back_to_buffered(backend):
    """procfs refuses O_DIRECT (EINVAL): the reader reopens buffered and says why.

    /proc/version is shorter than one block, so a 4096-byte read is short.
    """
    content = Path("/proc/version").read_bytes()
    with FlashReader("/proc/version", ALIGNMENT, 1, backend=backend) as reader:
        s = reader.stats()
        assert s["direct"] is False
        assert "refused O_DIRECT" in s["fallback_reason"]
        assert "Invalid argument" in s["direct_reason"]
        out = bytearray(ALIGNMENT)
        with pytest.raises(FlashReadError,
                           match=f"short read: got {len(content)} of 4096 bytes at offset 0"):
            reader.read(0, ALIGNMENT, out, label="version")
        assert bytes(out[:len(content)]) == content


def test_buffered_on_request_is_not_a_fallback(data_file, backend):
    path, data = data_file
    with FlashReader(path, MiB, 1, backend=backend, direct=False) as reader:
        s = reader.stats()
        assert s["direct"] is False and s["fallback_reason"] is None
        assert "requested" in s["direct_reason"]
        reader.submit(0, 0, MiB)
        np.testing.assert_array_equal(reader.wait(0), data[:MiB])


# ---------------------------------------------------------------------------
# Slot buffers on huge pages

def thp_mode() -> str:
    """This kernel's transparent huge page mode ("always", "madvise", "never"), or "" if none."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return ""
    return text[text.index("[") + 1:text.index("]")] if "[" in text else ""


def smaps_huge_bytes(view: np.ndarray) -> int:
    """AnonHugePages of the mapping holding `view` (bytes), read from /proc/self/smaps here."""
    at = view.__array_interface__["data"][0]
    inside, total = False, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= at < hi
        elif inside and line.startswith("AnonHugePages:"):
            total += int(line.split()[1]) * 1024
    return total


def test_slot_buffers_on_huge_pages(data_file, backend):
    """Slots of >= 2 MiB get huge pages where the kernel offers them (THP "always" or
    "madvise"), the stats count them as smaps does, and reads into them are exact."""
    path, data = data_file
    with FlashReader(path, 4 * MiB, 3, backend=backend) as reader:
        s = reader.stats()
        assert s["huge_pages_requested"] is True and s["slot_buffer_bytes"] == 12 * MiB
        if thp_mode() in ("always", "madvise"):
            assert s["huge_page_bytes"] == 12 * MiB and s["huge_pages_reason"] is None
        else:
            assert s["huge_page_bytes"] == 0 and "huge pages" in s["fallback_reason"]
        for slot in range(3):
            reader.submit(slot, (slot + 1) * 4 * MiB, 4 * MiB, chunk_checksums(data[(slot + 1) * 4 * MiB:][:4 * MiB], MiB))
        views = [reader.wait(slot) for slot in range(3)]
        for slot, view in enumerate(views):
            np.testing.assert_array_equal(view, data[(slot + 1) * 4 * MiB:][:4 * MiB])
            assert view.__array_interface__["data"][0] % (2 * MiB) == 0
        assert sum(smaps_huge_bytes(v) for v in views) >= s["huge_page_bytes"]


def test_huge_pages_off_on_request(data_file, monkeypatch):
    """huge_pages=False, or LEVER_HUGE_PAGES=0, keeps 4 KiB pages; that is no fallback."""
    path, data = data_file
    with FlashReader(path, 4 * MiB, 2, huge_pages=False) as reader:
        s = reader.stats()
        assert s["huge_pages_requested"] is False and s["huge_page_bytes"] == 0
        assert "requested" in s["huge_pages_reason"] and s["fallback_reason"] is None
        reader.submit(1, 0, 4 * MiB)
        np.testing.assert_array_equal(reader.wait(1), data[:4 * MiB])
        assert smaps_huge_bytes(reader.wait(1)) == 0
    monkeypatch.setenv("LEVER_HUGE_PAGES", "0")
    with FlashReader(path, 4 * MiB, 2) as reader:
        assert reader.stats()["huge_pages_requested"] is False
    if thp_mode() in ("always", "madvise"):
        monkeypatch.setenv("LEVER_HUGE_PAGES", "1")
        with FlashReader(path, 4 * MiB, 2, huge_pages=False) as reader:
            assert reader.stats()["huge_page_bytes"] == 8 * MiB


@pytest.mark.parametrize("value", ["2", "yes", "on", " 1"])
def test_bad_huge_pages_variable(data_file, monkeypatch, value):
    monkeypatch.setenv("LEVER_HUGE_PAGES", value)
    with pytest.raises(ValueError, match="LEVER_HUGE_PAGES must be 0 or 1"):
        FlashReader(data_file[0], 4 * MiB, 1)


def test_small_slots_ask_for_no_huge_pages(data_file):
    """Slots under 2 MiB cannot hold a huge page: nothing is missing, nothing reported."""
    with FlashReader(data_file[0], MiB, 2) as reader:
        s = reader.stats()
    assert s["huge_page_bytes"] == 0 and s["huge_pages_reason"] is None and s["fallback_reason"] is None


# ---------------------------------------------------------------------------
# Statistics, pacing, shutdown

def test_stats_are_exact(data_file, backend):
    path, data = data_file
    chunk = 256 * KiB
    with FlashReader(path, 2 * MiB, 2, backend=backend, chunk_bytes=chunk,
                     queue_depth=8) as reader:
        reader.submit(0, 0, MiB)  # 4 chunks, no checksums
        reader.wait(0)
        s = reader.stats()
        assert (s["bytes_read"], s["reads"], s["extents"]) == (MiB, 4, 1)
        assert s["checksum_s"] == 0.0
        assert s["busy_s"] > 0 and s["wait_s"] >= 0
        assert s["queue_depth"] == 8 and s["chunk_bytes"] == chunk

        reader.reset_stats()
        sizes = [(0, 2 * MiB), (2 * MiB, 300 * KiB), (4 * MiB, 1 * MiB + 4 * KiB)]
        expected_reads = 0
        for i, (off, n) in enumerate(sizes):
            reader.submit(i % 2, off, n, chunk_checksums(data[off:off + n], chunk))
            reader.wait(i % 2)
            expected_reads += -(-n // chunk)
        reader.read(8 * MiB, 512 * KiB)  # 2 chunks
        s = reader.stats()
        assert s["bytes_read"] == sum(n for _, n in sizes) + 512 * KiB
        assert s["reads"] == expected_reads + 2
        assert s["extents"] == len(sizes) + 1
        assert s["checksum_s"] > 0
        assert 0 < s["busy_s"] < 10
        if backend == "pread":
            assert s["pread_threads"] == 4


def test_throttle_paces_reads(data_file, backend):
    path, _ = data_file
    rate = 50e6  # bytes/s
    with FlashReader(path, 4 * MiB, 1, backend=backend, max_bytes_per_s=rate) as reader:
        t0 = time.perf_counter()
        reader.submit(0, 0, 4 * MiB)
        reader.wait(0)
        elapsed = time.perf_counter() - t0
        s = reader.stats()
    assert elapsed >= 0.9 * 4 * MiB / rate
    assert s["bytes_read"] / s["busy_s"] <= 1.1 * rate
    assert s["max_bytes_per_s"] == rate


def test_close_with_reads_in_flight(data_file, backend):
    path, data = data_file
    # 20 MB/s: 3 x 4 MiB take ~0.6 s, so close() finds reads in flight and queued.
    reader = FlashReader(path, 4 * MiB, 3, backend=backend, queue_depth=2,
                         chunk_bytes=256 * KiB, max_bytes_per_s=20e6)
    for slot in range(3):
        reader.submit(slot, slot * 4 * MiB, 4 * MiB, label=f"layer {slot}")
    reader.close()                  # returns (a hang fails at the suite's own limit, not here)
    assert reader.closed
    reader.close()  # twice is fine
    with pytest.raises(FlashReadError, match="layer 2: the reader was closed") as info:
        reader.wait(2)
    assert info.value.reason == "cancelled"
    with pytest.raises(ValueError, match="closed"):
        reader.submit(0, 0, 4096)
    with pytest.raises(ValueError, match="closed"):
        reader.read(0, 4096)

    # Dropped without close(), reads in flight: the destructor cleans up.
    reader = FlashReader(path, 4 * MiB, 2, backend=backend, max_bytes_per_s=50e6)
    reader.submit(0, 0, 4 * MiB)
    reader.submit(1, 4 * MiB, 4 * MiB)
    del reader
    gc.collect()


def test_close_wakes_a_waiting_thread(data_file, backend):
    path, _ = data_file
    reader = FlashReader(path, 4 * MiB, 1, backend=backend, queue_depth=1,
                         chunk_bytes=64 * KiB, max_bytes_per_s=4e6)
    reader.submit(0, 0, 4 * MiB, label="layer 5")  # ~1 s at 4 MB/s
    errors = []

    def waiter():
        try:
            reader.wait(0)
        except FlashReadError as e:
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    reader.close()
    t.join(deadline(5))
    assert not t.is_alive()
    assert len(errors) == 1 and errors[0].reason == "cancelled"


def test_drop_page_cache_never_raises(data_file):
    path, _ = data_file
    message = drop_page_cache()
    assert message.startswith(("dropped page cache", "could not drop page cache: "))
    if os.geteuid() == 0:
        assert message.startswith("dropped page cache")
    assert drop_page_cache(path).startswith("dropped page cache for ")
    assert drop_page_cache("/nonexistent/file").startswith("could not drop page cache: ")

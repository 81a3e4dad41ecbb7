"""Flash I/O under faults (issue 15): each injected fault -- EIO, a short read,
a stuck read past the deadline, a damaged store, io_uring missing, an
exception inside a layer -- gives one clear error naming the extent, the
file and the offset (or a reported fallback), and the next pass on the same
streamed target works and gives exactly the clean run's logits. The
verifier server answers the next session exactly after a checksum error in
another one.

Faults come from LEVER_IO_FAULTS (csrc/io/fault_injection.h), read when a
FlashReader is made; "*1" makes a fault fire once, so the read after it is
clean. LEVER_IO_TIMEOUT_S sets the read deadline (seconds)."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest

from lever.errors import ChecksumError, FlashReadError
from lever.model.streamed_decoder import StreamedDecoder
from lever.store.convert import convert
from lever.store.flash_reader import FlashReader, aligned_empty, chunk_checksums
from lever.store.manifest import WEIGHTS, StoreManifest
from lever.store.residency import fixed_costs, pass_order, slot_size
from tiny_model import TOKENS, causal, write_tiny_gguf
from waiting import deadline, wait_until

BACKENDS = ["io_uring", "pread"]
FAULTED = "layer.2"          # not in the ring's first prefetch (two slots: layer.0, layer.1)


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    """(store, budget): a 4-layer tiny store and a DRAM budget that streams every extent through two slots."""
    d = tmp_path_factory.mktemp("io-faults")
    store = convert(str(write_tiny_gguf(d / "m.gguf", "llama", tied=False, layers=4)), d / "store", progress=False)
    m = StoreManifest.load(store)
    budget = sum(fixed_costs(m, 4, 64, 4096).values()) + 2 * slot_size(pass_order(m))
    return store, budget


def extent(store, name):
    return next(e for e in pass_order(StoreManifest.load(store)) if e.name == name)


def open_target(store, budget, monkeypatch, faults="", timeout_s=None, backend="auto") -> StreamedDecoder:
    """A streamed target whose reader injects `faults` (the environment is read at construction only)."""
    with monkeypatch.context() as env:
        env.setenv("LEVER_IO_FAULTS", faults)
        if timeout_s is not None:
            env.setenv("LEVER_IO_TIMEOUT_S", str(timeout_s))
        model = StreamedDecoder(store, budget, "float32", backend=backend, prefetch_depth=2, kv_tokens=64)
    assert not model.plan.pinned and model.reader.n_slots == 2
    return model


def logits(model) -> np.ndarray:
    n = len(TOKENS)
    return model(np.array(TOKENS), np.arange(n), causal(n), model.new_cache())


@pytest.fixture(scope="module")
def clean(tiny_store):
    store, budget = tiny_store
    model = StreamedDecoder(store, budget, "float32", prefetch_depth=2, kv_tokens=64)
    try:
        return logits(model)
    finally:
        model.close()


def check_names(err, store, label, offset):
    """The error names the extent, the file and the offset, in its message and attributes."""
    text = str(err)
    assert label in text and str(offset) in text and str(store / WEIGHTS) in text, text
    assert (err.label, err.offset, err.path) == (label, offset, str(store / WEIGHTS))


def next_passes_are_exact(model, clean, n=2):
    for _ in range(n):
        np.testing.assert_array_equal(logits(model), clean)


# -- read faults on the streamed target ------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["eio", "short"])
def test_a_failed_read_names_extent_and_offset_and_the_next_pass_is_exact(tiny_store, clean, monkeypatch,
                                                                         backend, kind):
    store, budget = tiny_store
    off = extent(store, FAULTED).offset
    faults = {"eio": f"eio@{off}*1", "short": f"short@{off + 4096}*1"}[kind]
    model = open_target(store, budget, monkeypatch, faults, backend=backend)
    try:
        assert model.report()["reader"]["backend"] == backend
        with pytest.raises(FlashReadError) as info:
            logits(model)
        check_names(info.value, store, FAULTED, off)
        if kind == "eio":
            assert info.value.reason == "io" and "Input/output error" in str(info.value)
        else:
            assert info.value.reason == "short_read" and "short read: got 4096 of" in str(info.value)
        next_passes_are_exact(model, clean)
    finally:
        model.close()


def test_a_fault_that_persists_fails_every_pass_the_same_way(tiny_store, monkeypatch):
    store, budget = tiny_store
    off = extent(store, "layer.3").offset
    model = open_target(store, budget, monkeypatch, f"eio@{off}", backend="pread")
    try:
        for _ in range(3):                  # never "read ring out of order"
            with pytest.raises(FlashReadError) as info:
                logits(model)
            check_names(info.value, store, "layer.3", off)
    finally:
        model.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stuck_read_times_out_naming_extent_and_offset(tiny_store, clean, monkeypatch, backend):
    store, budget = tiny_store
    off = extent(store, FAULTED).offset
    model = open_target(store, budget, monkeypatch, f"delay_ms=6000@{off}*1", timeout_s=0.5, backend=backend)
    try:
        with pytest.raises(FlashReadError) as info:     # the 0.5 s deadline, not the 6 s read: "timeout"
            logits(model)
        check_names(info.value, store, FAULTED, off)
        assert info.value.reason == "timeout" and "timed out" in str(info.value)
        next_passes_are_exact(model, clean)      # the stuck slot is set aside until its read lands
    finally:
        t0 = time.monotonic()
        model.close()                            # does not sit out the injected delay
        # sitting it out would take the rest of the 6 s; returning at once takes milliseconds
        assert time.monotonic() - t0 < 2.0


def test_a_slow_device_within_the_deadline_is_no_error(tiny_store, clean, monkeypatch):
    store, budget = tiny_store
    model = open_target(store, budget, monkeypatch, "delay_ms=30", timeout_s=5)
    try:
        next_passes_are_exact(model, clean, n=1)
    finally:
        model.close()


def test_a_damaged_store_fails_until_repaired_then_is_read_afresh(tiny_store, clean, monkeypatch, tmp_path):
    src, budget = tiny_store
    store = tmp_path / "store"
    shutil.copytree(src, store)
    e = extent(store, FAULTED)
    weights = store / WEIGHTS
    pos = e.offset + 100
    good = weights.read_bytes()[pos]
    with open(weights, "r+b") as f:             # flip a byte of layer.2
        f.seek(pos)
        f.write(bytes([good ^ 0x5A]))
    model = open_target(store, budget, monkeypatch)
    try:
        for _ in range(2):
            with pytest.raises(ChecksumError) as info:
                logits(model)
            check_names(info.value, store, FAULTED, e.offset)
            assert info.value.reason == "checksum"
        with open(weights, "r+b") as f:         # repaired
            f.seek(pos)
            f.write(bytes([good]))
        next_passes_are_exact(model, clean)
    finally:
        model.close()


class FailingLayer:
    """The decoder's layer runner, except that layer `i`'s compute raises once."""

    def __init__(self, layers, i):
        self._layers, self._i, self.raised = layers, i, False

    def run(self, i, x, layout, buffer, cache):
        if i == self._i and not self.raised:
            self.raised = True
            raise RuntimeError(f"injected failure in layer {i}")
        return self._layers.run(i, x, layout, buffer, cache)

    def __getattr__(self, name):
        return getattr(self._layers, name)


@pytest.mark.parametrize("i", [0, 2, 3])
def test_an_exception_inside_a_layer_leaves_the_target_usable(tiny_store, clean, monkeypatch, i):
    store, budget = tiny_store
    model = open_target(store, budget, monkeypatch)
    try:
        model.layers = FailingLayer(model.layers, i)
        with pytest.raises(RuntimeError, match=f"injected failure in layer {i}"):
            logits(model)
        next_passes_are_exact(model, clean)
    finally:
        model.close()


# -- backend choice ---------------------------------------------------------------------------

def test_io_uring_unavailable_falls_back_to_pread_and_says_why(tiny_store, clean, monkeypatch):
    store, budget = tiny_store
    model = open_target(store, budget, monkeypatch, "no_io_uring")
    try:
        reader = model.report()["reader"]
        assert reader["backend"] == "pread"
        assert "no_io_uring" in reader["fallback_reason"] and "pread thread pool" in reader["fallback_reason"]
        next_passes_are_exact(model, clean, n=1)
    finally:
        model.close()
    with pytest.raises(FlashReadError, match="io_uring was requested .* no_io_uring") as info:
        open_target(store, budget, monkeypatch, "no_io_uring", backend="io_uring")
    assert info.value.reason == "unavailable"


def test_lever_io_uring_must_be_0_or_1(tiny_store, monkeypatch):
    path = tiny_store[0] / WEIGHTS
    monkeypatch.setenv("LEVER_IO_URING", "0")
    with FlashReader(path, 1 << 20, 1) as reader:
        assert reader.stats()["backend"] == "pread"
        assert "LEVER_IO_URING=0" in reader.stats()["backend_reason"]
    monkeypatch.setenv("LEVER_IO_URING", "1")
    with FlashReader(path, 1 << 20, 1) as reader:
        assert reader.stats()["backend_reason"] is None     # tried (and available here)
    monkeypatch.setenv("LEVER_IO_URING", "yes")
    with pytest.raises(ValueError, match="LEVER_IO_URING must be 0 .* got 'yes'"):
        FlashReader(path, 1 << 20, 1)


@pytest.mark.parametrize("spec", ["eio@", "eio@12x", "short@-1", "delay_ms=fast", "flood@0", "eio@0*",
                                  "hang@", "submit_err=ENOMEM", "submit_err=0"])
def test_a_bad_fault_plan_is_refused_naming_the_item(tiny_store, monkeypatch, spec):
    monkeypatch.setenv("LEVER_IO_FAULTS", f"no_io_uring, {spec}")
    with pytest.raises(ValueError, match=f"bad item '{spec.replace('*', '[*]')}'"):
        FlashReader(tiny_store[0] / WEIGHTS, 1 << 20, 1)


def test_a_bad_timeout_is_refused(tiny_store, monkeypatch):
    monkeypatch.setenv("LEVER_IO_TIMEOUT_S", "-1")
    with pytest.raises(ValueError, match="LEVER_IO_TIMEOUT_S"):
        FlashReader(tiny_store[0] / WEIGHTS, 1 << 20, 1)


@pytest.mark.parametrize("value", ["inf", "1e10", "nan", "0"])
def test_an_infinite_or_huge_timeout_is_refused(tiny_store, monkeypatch, value):
    """A deadline too far to hold in nanoseconds would overflow into 'already past'."""
    monkeypatch.setenv("LEVER_IO_TIMEOUT_S", value)
    with pytest.raises(ValueError, match="LEVER_IO_TIMEOUT_S"):
        FlashReader(tiny_store[0] / WEIGHTS, 1 << 20, 1)


def test_injected_faults_and_the_deadline_are_in_the_stats(tiny_store, monkeypatch):
    """Faults never go unreported: the plan is in stats() and in the fallback
    reason every report prints; a clean reader reports neither."""
    path = tiny_store[0] / WEIGHTS
    monkeypatch.setenv("LEVER_IO_TIMEOUT_S", "12.5")
    with FlashReader(path, 1 << 20, 1, backend="pread") as reader:
        s = reader.stats()
        assert s["faults"] is None and s["read_timeout_s"] == 12.5
    monkeypatch.setenv("LEVER_IO_FAULTS", "delay_ms=1")
    with FlashReader(path, 1 << 20, 1, backend="pread") as reader:
        s = reader.stats()
        assert s["faults"] == "delay_ms=1" and "injected faults: delay_ms=1" in s["fallback_reason"]


# -- the reader alone ---------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_reader_faults_with_both_backends(tiny_store, monkeypatch, backend):
    """submit/wait and read() each fail clearly once, then read the right bytes."""
    path = tiny_store[0] / WEIGHTS
    data = np.fromfile(path, dtype=np.uint8)
    n = 64 * 1024
    crcs = chunk_checksums(data[n:2 * n], 16 * 1024)
    monkeypatch.setenv("LEVER_IO_FAULTS", f"eio@{n + 20000}*1,short@{n + 40000}*2")
    with FlashReader(path, n, 1, backend=backend, chunk_bytes=16 * 1024) as reader:
        assert reader.stats()["backend"] == backend
        reader.submit(0, n, n, crcs, "part")
        with pytest.raises(FlashReadError, match=f"part: read failed at offset {n + 16384} "):
            reader.wait(0)                           # the first failing chunk is reported
        out = aligned_empty(n)
        with pytest.raises(FlashReadError, match=f"part: short read: got 7232 of 16384 bytes at offset {n + 32768}"):
            reader.read(n, n, out, crcs, "part")
        reader.submit(0, n, n, crcs, "part")
        np.testing.assert_array_equal(reader.wait(0), data[n:2 * n])
        np.testing.assert_array_equal(reader.read(n, n, out, crcs, "part"), data[n:2 * n])


def test_reader_timeout_keeps_the_slot_until_its_read_lands(tiny_store, monkeypatch):
    path = tiny_store[0] / WEIGHTS
    monkeypatch.setenv("LEVER_IO_FAULTS", "delay_ms=2000*1")
    monkeypatch.setenv("LEVER_IO_TIMEOUT_S", "0.5")
    data = np.fromfile(path, dtype=np.uint8)
    with FlashReader(path, 4096, 1) as reader:
        reader.submit(0, 8192, 4096, None, "page 2")
        with pytest.raises(FlashReadError, match="page 2: read timed out at offset 8192 .* 0.5 s") as info:
            reader.wait(0)
        assert info.value.reason == "timeout" and not reader.ready(0)
        with pytest.raises(ValueError, match="still has a read in flight"):
            reader.submit(0, 0, 4096)
        wait_until(lambda: reader.ready(0), 10, "the late read to land")
        np.testing.assert_array_equal(reader.wait(0), data[8192:12288])    # the late read did land


# -- reads that never complete; failed submits -------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hung_read_times_out_and_close_abandons_it(tiny_store, monkeypatch, capfd, backend):
    """hang@: a read that never completes, not even when cancelled. wait() times out, and
    close() returns at once (< 5 s), reporting the read as abandoned (its slot buffer is leaked)."""
    path = tiny_store[0] / WEIGHTS
    monkeypatch.setenv("LEVER_IO_FAULTS", "hang@8192*1")
    monkeypatch.setenv("LEVER_IO_TIMEOUT_S", "0.5")
    reader = FlashReader(path, 4096, 1, backend=backend)
    assert reader.stats()["backend"] == backend and reader.stats()["abandoned_reads"] == 0
    reader.submit(0, 8192, 4096, None, "page 2")
    with pytest.raises(FlashReadError, match="page 2: read timed out at offset 8192") as info:
        reader.wait(0)
    assert info.value.reason == "timeout" and not reader.ready(0)
    t0 = time.monotonic()
    reader.close()
    assert time.monotonic() - t0 < deadline(5)     # returns (the read never would)
    assert reader.stats()["abandoned_reads"] == 1 and not reader.ready(0)
    err = capfd.readouterr().err
    assert f"abandoned 1 read(s) of {path}" in err and "leaked" in err, err


@pytest.fixture
def silent_fifo(tmp_path):
    """A FIFO with a writer that never writes: io_uring reads of it wait for ever (a real stuck read)."""
    fifo = tmp_path / "stuck.fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)   # a writer, so that the reader's open does not block
    try:
        yield fifo, fd
    finally:
        os.close(fd)


@pytest.mark.parametrize("cancellable", [True, False])
def test_close_cancels_a_real_stuck_io_uring_read_or_abandons_it(silent_fifo, monkeypatch, capfd, cancellable):
    """close() sends IORING_OP_ASYNC_CANCEL: the stuck read ends (cancelled) and nothing is abandoned.
    With no_cancel (a read the kernel cannot cancel) close() gives up after read_timeout_s and abandons it."""
    fifo, writer = silent_fifo
    monkeypatch.setenv("LEVER_IO_TIMEOUT_S", "0.5")
    monkeypatch.setenv("LEVER_IO_FAULTS", "" if cancellable else "no_cancel")
    try:
        reader = FlashReader(fifo, 4096, 1, backend="io_uring", direct=False)
    except FlashReadError as exc:
        if exc.reason != "unavailable":      # only a kernel without io_uring may skip this
            raise
        pytest.skip(f"no io_uring here: {exc}")
    reader.submit(0, 0, 4096, None, "fifo")
    with pytest.raises(FlashReadError, match="timed out"):
        reader.wait(0)
    t0 = time.monotonic()
    reader.close()
    assert time.monotonic() - t0 < deadline(5)     # returns (the read never would)
    if cancellable:
        assert reader.stats()["abandoned_reads"] == 0 and reader.ready(0)
        with pytest.raises(FlashReadError, match="closed while the read .* was in flight") as info:
            reader.wait(0)
        assert info.value.reason == "cancelled"
    else:
        assert reader.stats()["abandoned_reads"] == 1 and not reader.ready(0)
        assert "abandoned 1 read(s)" in capfd.readouterr().err
        del reader                                  # the slot buffer stays allocated (leaked)
        os.write(writer, b"x" * 4096)               # the abandoned read completes now; its result is dropped
        time.sleep(0.1)


def test_an_io_uring_submit_error_fails_the_chunks_naming_the_errno_then_reads_work(tiny_store, monkeypatch):
    """submit_err: io_uring_enter refuses the reads (ENOMEM here); they are taken back from the ring and fail
    naming the errno; the next submit, wait and read work. (io_uring only: pread has no submit.)"""
    path = tiny_store[0] / WEIGHTS
    data = np.fromfile(path, dtype=np.uint8)
    n = 64 * 1024
    monkeypatch.setenv("LEVER_IO_FAULTS", "submit_err=12*1")
    with FlashReader(path, n, 1, backend="io_uring", chunk_bytes=16 * 1024, queue_depth=2) as reader:
        reader.submit(0, n, n, None, "part")
        with pytest.raises(FlashReadError, match=rf"part: could not submit the read at offset {n} .*"
                                                 r"io_uring_enter failed: .*\(errno 12\)") as info:
            reader.wait(0)
        assert info.value.reason == "io" and info.value.offset == n
        reader.submit(0, n, n, None, "part")
        np.testing.assert_array_equal(reader.wait(0), data[n:2 * n])
        np.testing.assert_array_equal(reader.read(n, n, None, None, "part"), data[n:2 * n])
        assert reader.stats()["abandoned_reads"] == 0


# -- the verifier server ------------------------------------------------------------------------

def test_the_server_answers_the_next_session_exactly_after_a_checksum_error(tiny_store, tmp_path, monkeypatch):
    from lever.engine import SpecConfig, run_speculative
    from lever.remote.client import RemoteVerifier, RemoteVerifierError
    from lever.remote.protocol import Limits
    from lever.remote.server import ServerThread, VerifierServer
    from lever.sampling import SamplingParams

    src, budget = tiny_store
    store = tmp_path / "store"
    shutil.copytree(src, store)
    model = open_target(store, budget, monkeypatch)
    lines: list[str] = []
    server = VerifierServer(model, "tiny-store", Limits(max_sessions=2), log=lines.append)

    def session(url):
        verifier = RemoteVerifier(url, SamplingParams(), retry_deadline_s=2.0)
        try:
            result, _ = run_speculative(verifier, None, TOKENS, 12, SamplingParams(), SpecConfig("ar"))
            return result.token_ids
        finally:
            verifier.close()

    weights = store / WEIGHTS
    e = extent(store, FAULTED)
    original = weights.read_bytes()[e.offset:e.offset + 64]
    try:
        with ServerThread(server) as running:
            reference = session(running.url)
            with open(weights, "r+b") as f:         # damage layer.2: the next pass that reads it fails
                f.seek(e.offset)
                f.write(bytes(b ^ 0xFF for b in original))
            with pytest.raises(RemoteVerifierError, match="ChecksumError"):
                session(running.url)
            assert any("checksum mismatch in layer.2" in line for line in lines), lines
            with open(weights, "r+b") as f:         # repaired
                f.seek(e.offset)
                f.write(original)
            assert session(running.url) == reference
            assert session(running.url) == reference
    finally:
        model.close()

"""Helpers shared by the benchmark scripts: machine measurements and test data.

Imported as `machine` by the scripts in this folder (run from anywhere:
python puts a script's own folder on sys.path; pytest does the same for
bench files).
"""

from __future__ import annotations

import os
import resource
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

# Byte offsets of the fp16 scale fields within a block of each type.
SCALE_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q8_0: (0,), T.Q4_K: (0, 2), T.Q6_K: (208,)}


def dram_read_bytes_per_s() -> float:
    """Measured DRAM read bandwidth: best of 5 passes of np.max over a 1 GiB float32
    array, one slice per CPU scanned by its own thread (numpy releases the GIL;
    max is SIMD and lighter than a pairwise sum, so memory-bound), in bytes/s."""
    x = np.ones(256 * 1024 * 1024, dtype=np.float32)
    n = os.cpu_count() or 1
    parts = np.array_split(x, n)
    best = float("inf")
    with ThreadPoolExecutor(n) as pool:
        for _ in range(5):
            t0 = time.perf_counter()
            list(pool.map(np.max, parts))
            best = min(best, time.perf_counter() - t0)
    return x.nbytes / best


def random_blocks(qtype, rows: int, cols: int, seed: int | None = None) -> np.ndarray:
    """[rows, row bytes] uint8: a rows x cols matrix of random blocks of `qtype`
    with small positive fp16 scales (so every value is finite)."""
    rng = np.random.default_rng(int(qtype) if seed is None else seed)
    bs, ts = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // bs
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        scales = (rng.random(n_blocks, dtype=np.float32) * 0.01).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(rows, -1)


def embedding_bytes(model) -> int:
    """Bytes of the embedding table held by `model`: a NativeDecoder over resident
    weights (lever.model.native_loader.ResidentWeights), or the torch reference
    (lever.reference.torch_model.TorchModel)."""
    if hasattr(model, "weights"):
        from lever.model.native_loader import held_bytes
        return held_bytes(model.weights.embedding)
    emb = model.decoder.embed_tokens
    return emb.qweight.nbytes if emb.qweight is not None else emb.weight.numel() * emb.weight.element_size()


def weights_per_token(model) -> int:
    """Weight bytes one decoding step of an in-memory `model` reads: everything
    resident but the embedding table (one row of it), which the head reads in
    full only when tied."""
    touched = model.resident_weight_bytes
    if not model.config.tie_word_embeddings:
        touched -= embedding_bytes(model)
    return touched


class OtherLoad:
    """Share of the machine's CPU time used by other processes since creation (0..1):
    busy time from /proc/stat minus this process's own CPU time.  Other load on
    these 2 cores skews every timing here (torch's OpenMP regions suffer most)."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        r = resource.getrusage(resource.RUSAGE_SELF)
        return time.perf_counter(), (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK"), r.ru_utime + r.ru_stime

    def share(self) -> float:
        (w0, b0, m0), (w1, b1, m1) = self.start, self._sample()
        return max(0.0, (b1 - b0) - (m1 - m0)) / max(w1 - w0, 1e-9) / (os.cpu_count() or 1)

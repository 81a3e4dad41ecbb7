"""Microbenchmarks: native GGUF dequantisation vs gguf's numpy reference.

    pytest bench/bench_dequant.py --benchmark-only

Each tensor is 1536 x 8960 (13.76 M elements, a Qwen2.5-1.5B MLP matrix) of
random blocks with finite scales. Variants:

  numpy           gguf.quants.dequantize (the reference; allocates its result)
  native-f32      lever._native.dequantize into a preallocated float32 array
  native-f32-1t   the same on one thread
  native-bf16     into a preallocated uint16 (bf16) array
  quant-f32/bf16  lever.quant.dequantize: allocates and returns a numpy array (bf16 as uint16)

Throughput (elements/s, from the median time) goes into benchmark.extra_info
and a summary table with the speedup over numpy is printed at the end.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize as numpy_dequantize

import lever._native as native
from lever import quant
from machine import random_blocks

SHAPE = (8960, 1536)
N_ELEMENTS = SHAPE[0] * SHAPE[1]
TYPES = [T.Q4_K, T.Q6_K, T.Q8_0, T.Q5_0, T.Q4_1]
VARIANTS = ["numpy", "native-f32", "native-f32-1t", "native-bf16", "quant-f32", "quant-bf16"]


_results: dict[tuple[str, str], float] = {}  # (type, variant) -> median seconds


class _Summary:
    """pytest plugin printing the throughput table after the run."""

    def pytest_terminal_summary(self, terminalreporter):
        if not _results:
            return
        tr = terminalreporter
        tr.section("dequantisation throughput (1536 x 8960 tensors)")
        tr.write_line(f"threads: {native.get_num_threads()} (native pool)")
        tr.write_line(f"{'type':6} {'variant':14} {'median ms':>10} {'M elem/s':>10} {'vs numpy':>9}")
        for qtype in TYPES:
            base = _results.get((qtype.name, "numpy"))
            for variant in VARIANTS:
                t = _results.get((qtype.name, variant))
                if t is None:
                    continue
                speedup = f"{base / t:8.1f}x" if base else "        -"
                tr.write_line(f"{qtype.name:6} {variant:14} {t * 1e3:10.2f} "
                              f"{N_ELEMENTS / t / 1e6:10.0f} {speedup}")


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    pm = request.config.pluginmanager
    if not pm.has_plugin("lever-dequant-summary"):
        pm.register(_Summary(), "lever-dequant-summary")
    yield


@pytest.fixture(scope="module", params=TYPES, ids=lambda t: t.name)
def tensor(request):
    return request.param, random_blocks(request.param, *SHAPE)


def _record(benchmark, qtype, variant):
    stats = getattr(benchmark, "stats", None)
    if stats is None:  # --benchmark-disable
        return
    median = stats.stats.median
    _results[(qtype.name, variant)] = median
    benchmark.extra_info["elements"] = N_ELEMENTS
    benchmark.extra_info["elements_per_s"] = N_ELEMENTS / median


@pytest.mark.parametrize("variant", VARIANTS)
def test_dequantize(benchmark, tensor, variant):
    qtype, raw = tensor
    benchmark.group = qtype.name
    benchmark.name = f"{qtype.name}-{variant}"
    threads_before = native.get_num_threads()
    try:
        if variant == "numpy":
            result = benchmark.pedantic(numpy_dequantize, args=(raw, qtype), rounds=3, iterations=1)
            assert result.shape == SHAPE
        elif variant.startswith("native"):
            out = np.empty(N_ELEMENTS, np.uint16 if variant == "native-bf16" else np.float32)
            if variant == "native-f32-1t":
                native.set_num_threads(1)
            flat = raw.reshape(-1)
            benchmark(native.dequantize, flat, int(qtype), out)
        else:
            dtype = "float32" if variant == "quant-f32" else "bfloat16"
            result = benchmark(quant.dequantize, raw, qtype, SHAPE, dtype)
            assert result.shape == SHAPE and result.dtype == (np.float32 if dtype == "float32" else np.uint16)
    finally:
        native.set_num_threads(threads_before)
    _record(benchmark, qtype, variant)

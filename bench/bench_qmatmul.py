"""Microbenchmarks: native quantised matmul (`lever._native.quant_matmul`) per type, ISA and batch.

    pytest bench/bench_qmatmul.py --benchmark-only

The weight is an 8960 x 1536 matrix (N x K, a Qwen2.5-1.5B MLP matrix, 13.76 M
weights) of random ggml blocks with small finite fp16 scales, for each type
among Q4_K, Q6_K, Q8_0, Q5_0, Q4_1 that `_native.matmul_types()` lists, times
bf16 activations x [M, K] (what the decoder passes when computing in bf16),
into a preallocated bf16 [M, N] output, for every instruction set of
`_native.available_isas()` and M = 1 (matrix-vector: decoding), 16, 64, 256
(prefill, tree verification).  Also `_native.linear` per type and M (isa
"linear" in the table): float32 activations into a float32 output at the
process's kernel ISA -- the entry the native decoder (lever.model.native_decoder)
calls.  The reference is torch's bf16 matmul (`F.linear`) against a dense
[N, K] bf16 weight with the same M.

Each call takes the next of several copies of the weight (256 MiB of them
together, far more than the L3 cache), so that the weights come from DRAM as
when decoding a real model.  Each case is called once (warm-up, and a probe
of its time) and then timed over as many rounds as fit in about 0.4 s (1 to
50), so the slow scalar cases stay short.  Reported per case (benchmark.extra_info and a summary
table at the end): median time, GFLOP/s (2 M N K / t), and for M = 1 the
GB/s of weight bytes consumed next to this machine's DRAM read bandwidth
(machine.dram_read_bytes_per_s: multithreaded scans of a 1 GiB array; 1 GB = 1e9 bytes).
The table and the numbers also go to bench/results/bench_qmatmul.json and
a chart of GFLOP/s against M to bench/results/bench_qmatmul.png
($LEVER_BENCH_RESULTS names another folder).  Other
processes on the machine skew the numbers (torch's OpenMP matmul most); the
share of CPU time they used during the session is printed with the table.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf.constants import GGMLQuantizationType as T

import lever._native as native
from machine import OtherLoad, dram_read_bytes_per_s, random_blocks

if not hasattr(native, "quant_matmul"):
    pytest.skip("lever._native has no quant_matmul (rebuild the package)", allow_module_level=True)

N, K = SHAPE = (8960, 1536)
WANTED = [T.Q4_K, T.Q6_K, T.Q8_0, T.Q5_0, T.Q4_1]
TYPES = [t for t in WANTED if int(t) in set(native.matmul_types())]
ISAS = native.available_isas()
BATCHES = [1, 16, 64, 256]
TARGET_S = 0.4          # timed seconds per case, roughly
MAX_ROUNDS = 50
RING_BYTES = 256 << 20  # bytes of weight copies cycled through (defeats the caches)
OUT_DIR = Path(os.environ.get("LEVER_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")

# Byte offsets of the fp16 scale fields within a block.

# (type or "bf16", isa or "torch", M) -> (median s, weight bytes)
_results: dict[tuple[str, str, int], tuple[float, int]] = {}


_other = OtherLoad()


def _random_tensor(qtype) -> np.ndarray:
    return random_blocks(qtype, N, K)



def _ring(w):
    """Copies of the weight `w` (numpy array or torch tensor), RING_BYTES of them at least."""
    nbytes = w.nbytes if isinstance(w, np.ndarray) else w.numel() * w.element_size()
    return [w.copy() if isinstance(w, np.ndarray) else w.clone() for _ in range(-(-RING_BYTES // nbytes))]


def _cycling(call, weights):
    """A no-argument function calling call(w) for the next weight copy of each call."""
    it = itertools.cycle(weights)
    return lambda: call(next(it))


def _bf16_bits(x: torch.Tensor) -> np.ndarray:
    """A bf16 tensor's bits as a uint16 numpy array (what quant_matmul takes for bf16)."""
    return x.contiguous().view(torch.int16).numpy().view(np.uint16)


def _activations(m: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(m)
    return torch.randn(m, K, generator=g).to(torch.bfloat16)


def _gflop_s(m: int, t: float) -> float:
    return 2 * m * N * K / t / 1e9


class _Summary:
    """pytest plugin printing the throughput table after the run (and writing JSON + PNG)."""

    def pytest_terminal_summary(self, terminalreporter):
        if not _results:
            return
        tr = terminalreporter
        bw = dram_read_bytes_per_s() / 1e9
        tr.section(f"quantised matmul throughput ({N} x {K} weights, bf16 activations)")
        other = _other.share()
        tr.write_line(f"threads: {native.get_num_threads()} (native pool), {torch.get_num_threads()} (torch); "
                      f"kernel_isa (auto): {native.kernel_isa()}; DRAM read bandwidth {bw:.1f} GB/s; "
                      f"other processes used {other:.0%} of the CPUs during the run")
        tr.write_line("GB/s: weight bytes / median time (M = 1 only); vs torch: GFLOP/s over torch bf16's at that M")
        tr.write_line(f"{'type':6} {'isa':7} {'M':>4} {'median ms':>10} {'GB/s':>7} {'of DRAM':>8} "
                      f"{'GFLOP/s':>8} {'vs torch':>9}")
        rows = []
        order = [(t.name, isa) for t in TYPES for isa in ISAS + ["linear"]] + [("bf16", "torch")]
        for name, isa in order:
            for m in BATCHES:
                if (name, isa, m) not in _results:
                    continue
                t, wbytes = _results[(name, isa, m)]
                gbs = wbytes / t / 1e9 if m == 1 else None
                ref = _results.get(("bf16", "torch", m))
                vs = ref[0] / t if ref else None
                rows.append(dict(type=name, isa=isa, M=m, median_s=t, weight_bytes=wbytes,
                                 gb_per_s=gbs, fraction_of_dram=gbs / bw if gbs else None,
                                 gflop_per_s=_gflop_s(m, t), vs_torch_bf16=vs))
                tr.write_line(f"{name:6} {isa:7} {m:4d} {t * 1e3:10.3f} "
                              f"{f'{gbs:7.1f}' if gbs else '      -'} "
                              f"{f'{gbs / bw:7.0%}' if gbs else '       -'} "
                              f"{_gflop_s(m, t):8.1f} {f'{vs:8.2f}x' if vs else '        -'}")
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        result = dict(benchmark="bench_qmatmul", machine=platform.machine(), processor=platform.processor(),
                      shape=[N, K], activations="bf16", native_threads=native.get_num_threads(),
                      torch_threads=torch.get_num_threads(), available_isas=ISAS,
                      kernel_isa=native.kernel_isa(), dram_read_bw_gb_s=round(bw, 2),
                      other_processes_cpu_share=round(other, 3), weight_copies_bytes=RING_BYTES,
                      torch=torch.__version__, rows=rows)
        (OUT_DIR / "bench_qmatmul.json").write_text(json.dumps(result, indent=2))
        _plot(rows, OUT_DIR / "bench_qmatmul.png")
        tr.write_line(f"wrote {OUT_DIR / 'bench_qmatmul.json'} and {OUT_DIR / 'bench_qmatmul.png'}")


def _plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ISAS), figsize=(4.5 * len(ISAS), 4), sharey=True, squeeze=False)
    torch_rows = [r for r in rows if r["isa"] == "torch"]
    for ax, isa in zip(axes[0], ISAS):
        for qtype in TYPES:
            rs = [r for r in rows if r["type"] == qtype.name and r["isa"] == isa]
            ax.plot([r["M"] for r in rs], [r["gflop_per_s"] for r in rs], "o-", label=qtype.name)
        ax.plot([r["M"] for r in torch_rows], [r["gflop_per_s"] for r in torch_rows], "k--", label="torch bf16")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(BATCHES, [str(m) for m in BATCHES])
        ax.set_xlabel("M (rows of activations)")
        ax.set_title(isa)
    axes[0][0].set_ylabel("GFLOP/s")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"quant_matmul, {N} x {K} weights")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    pm = request.config.pluginmanager
    if not pm.has_plugin("lever-qmatmul-summary"):
        pm.register(_Summary(), "lever-qmatmul-summary")
    yield


@pytest.fixture(scope="module", params=TYPES, ids=lambda t: t.name)
def tensor(request):
    """(type, copies of one random [N, K] matrix of its blocks)."""
    return request.param, _ring(_random_tensor(request.param))


def _bench(benchmark, fn) -> None:
    """One warm-up call that also sizes the rounds, then the timed rounds."""
    t0 = time.perf_counter()
    fn()
    probe = time.perf_counter() - t0
    rounds = max(1, min(MAX_ROUNDS, int(TARGET_S / max(probe, 1e-6))))
    benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=0)


def _record(benchmark, key, m, weight_bytes) -> None:
    stats = getattr(benchmark, "stats", None)
    if stats is None:  # --benchmark-disable
        return
    median = stats.stats.median
    _results[key] = (median, weight_bytes)
    benchmark.extra_info["M"] = m
    benchmark.extra_info["weight_bytes"] = weight_bytes
    benchmark.extra_info["gflop_per_s"] = _gflop_s(m, median)
    if m == 1:
        benchmark.extra_info["gb_per_s"] = weight_bytes / median / 1e9


@pytest.mark.parametrize("m", BATCHES, ids=lambda m: f"M{m}")
@pytest.mark.parametrize("isa", ISAS)
def test_quant_matmul(benchmark, tensor, isa, m):
    qtype, copies = tensor
    benchmark.group = f"{qtype.name} M={m}"
    benchmark.name = f"{qtype.name}-{isa}-M{m}"
    x = _bf16_bits(_activations(m))
    out = np.empty((m, N), np.uint16)
    _bench(benchmark, _cycling(lambda w: native.quant_matmul(x, w, int(qtype), out, isa), copies))
    assert np.isfinite(torch.from_numpy(out.view(np.int16)).view(torch.bfloat16).float().numpy()).all()
    benchmark.extra_info["isa"] = isa
    _record(benchmark, (qtype.name, isa, m), m, copies[0].nbytes)


@pytest.mark.parametrize("m", BATCHES, ids=lambda m: f"M{m}")
def test_linear_f32(benchmark, tensor, m):
    """`_native.linear`: the native decoder's matmul (float32 in and out, auto ISA)."""
    qtype, copies = tensor
    benchmark.group = f"{qtype.name} M={m}"
    benchmark.name = f"{qtype.name}-linear-M{m}"
    x = _activations(m).float().numpy()
    out = np.empty((m, N), np.float32)
    _bench(benchmark, _cycling(lambda w: native.linear(x, w.reshape(-1), int(qtype), N, out), copies))
    assert np.isfinite(out).all()
    benchmark.extra_info["isa"] = native.kernel_isa()
    _record(benchmark, (qtype.name, "linear", m), m, copies[0].nbytes)


@pytest.mark.parametrize("m", BATCHES, ids=lambda m: f"M{m}")
def test_torch_bf16(benchmark, m):
    benchmark.group = f"torch M={m}"
    benchmark.name = f"torch-bf16-M{m}"
    w = (torch.randn(N, K, generator=torch.Generator().manual_seed(0)) * 0.02).to(torch.bfloat16)
    x = _activations(m)
    with torch.inference_mode():
        _bench(benchmark, _cycling(lambda wc: F.linear(x, wc), _ring(w)))
    _record(benchmark, ("bf16", "torch", m), m, w.numel() * w.element_size())

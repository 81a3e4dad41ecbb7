"""In-memory greedy decoding: the native decoder vs the torch bf16 reference vs llama.cpp.

Per model, on the same GGUF file, same prompt, greedy, no early stop, run
side by side and interleaved (repeat r of every engine before repeat r + 1):

  native         lever.load(kernels="native"): the whole forward pass in C++
                 (lever.model.native_decoder), matrices kept in the GGUF's
                 blocks, float32 activations, bf16 KV cache; no torch
  torch          lever.load(kernels="torch"): the torch reference, weights
                 dequantised to dense bf16, torch matmuls (skipped, with the
                 reason recorded, when torch is not installed)
  llama.cpp      llama-cpp-python on the GGUF (eval + greedy sample loop,
                 --llama-threads threads, weights loaded without mmap)

Decode rate = (N - 1) / (time for N new tokens - time for 1 new token),
median over the repeats (as bench/decode_speed.py).  Also printed per model:
resident weight bytes (native vs dense), weight bytes touched per token by
the native model and the DRAM lower bound on its time per token (measured
read bandwidth).  For --tree-model (1.5B, native kernels): the compute time
of one forward over a 64-token tree (causal mask after a prefill of the
prompt; cache truncated back after each run) against the time to stream
that model's weights (every GGUF tensor but token_embd) from flash at the
disk's measured O_DIRECT bandwidth (lever.store.flash_reader, whole GGUF
file in 32 MiB extents through two slots) or --flash-gib-s.
Other processes on the machine skew all of this; the share of CPU time they
used is printed and recorded.
Writes bench/results/kernel_decode.json and kernel_decode.png.

    python bench/kernel_decode.py [--models qwen2.5-coder-0.5b qwen2.5-coder-1.5b]
                                  [--new-tokens 32] [--repeats 3] [--threads N] [--llama-threads 2]
                                  [--tree-model qwen2.5-coder-1.5b] [--tree-tokens 64] [--tree-runs 5]
                                  [--flash-gib-s GIB_S] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from lever import _native
from lever.autoregressive import generate_tokens, prefill
from lever.gguf.file import GGUFFile
from lever.gguf.registry import resolve_model
from lever.masks import causal_mask
from lever.values import cache_root
import lever
from machine import OtherLoad, dram_read_bytes_per_s, weights_per_token

PROMPT = "Write a Python function that checks whether a number is prime."
ENGINES = ["native", "torch", "llama.cpp"]
MiB, GiB = 1 << 20, 1 << 30
FLASH_EXTENT = 32 * MiB


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def flash_bandwidth_gib_s(path: Path, passes: int = 3) -> dict:
    """O_DIRECT read bandwidth of the disk holding `path`: whole-file passes (median GiB/s)."""
    from lever.store.flash_reader import ALIGNMENT, FlashReader, drop_page_cache

    dropped = drop_page_cache(path)
    total = path.stat().st_size // ALIGNMENT * ALIGNMENT
    extents = [(off, min(FLASH_EXTENT, total - off)) for off in range(0, total, FLASH_EXTENT)]

    def one_pass(reader):
        reader.submit(0, *extents[0])
        for i in range(len(extents)):
            if i + 1 < len(extents):
                reader.submit((i + 1) % 2, *extents[i + 1])
            reader.wait(i % 2)

    times = []
    with FlashReader(path, FLASH_EXTENT, 2, direct=True, queue_depth=8, chunk_bytes=MiB) as reader:
        one_pass(reader)                                      # warm-up (threads, slot pages)
        reader.reset_stats()
        for _ in range(passes):
            t0 = time.perf_counter()
            one_pass(reader)
            times.append(time.perf_counter() - t0)
        s = reader.stats()
    return dict(gib_s=total / statistics.median(times) / GiB, best_gib_s=total / min(times) / GiB,
                device_gib_s=s["bytes_read"] / s["busy_s"] / GiB, direct=s["direct"], backend=s["backend"],
                bytes_per_pass=total, passes=passes, page_cache=dropped, source=f"measured on {path}")


def import_torch(threads: int):
    """(torch module with `threads` threads, None) or (None, why it is unavailable):
    torch only serves the reference engine."""
    try:
        import torch
    except ImportError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    torch.set_num_threads(threads)
    return torch, None


def time_lever(model, ids, n) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    out = generate_tokens(model, ids, n).token_ids
    dt = time.perf_counter() - t0
    assert len(out) == n
    return dt, out


def time_llama(llm, ids, n) -> tuple[float, list[int]]:
    """Prefill + n greedy tokens (eval + sample; EOS is not checked, so it never stops early)."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    out = [llm.sample(temp=0.0, repeat_penalty=1.0)]
    while len(out) < n:
        llm.eval([out[-1]])
        out.append(llm.sample(temp=0.0, repeat_penalty=1.0))
    return time.perf_counter() - t0, out


def gguf_stream_bytes(path) -> int:
    """Bytes of every tensor of the GGUF but token_embd: what streaming the layers + head reads."""
    g = GGUFFile(path)
    return sum(t.nbytes for t in g.tensors.values() if t.name != "token_embd.weight")


def tree_forward_ms(model, ids, n_tree: int, runs: int) -> float:
    """Median ms of one forward over `n_tree` new tokens (causal mask) after a prefill of `ids`."""
    cache = model.new_cache(capacity=len(ids) + n_tree)
    prefill(model, ids, cache)
    n0 = cache.length
    rng = np.random.default_rng(0)
    tokens = np.asarray(ids, dtype=np.int64)[rng.integers(len(ids), size=n_tree)]
    positions = np.arange(n0, n0 + n_tree, dtype=np.int64)
    mask = causal_mask(n_tree, n0)
    times = []
    for i in range(runs + 1):                                  # the first run is a warm-up
        t0 = time.perf_counter()
        model(tokens, positions, mask, cache)
        if i:
            times.append(time.perf_counter() - t0)
        cache.truncate(n0)
    return statistics.median(times) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=_native.get_num_threads(),
                    help="threads of the native pool and of torch (the reference engine)")
    ap.add_argument("--llama-threads", type=int, default=2)
    ap.add_argument("--tree-model", default="qwen2.5-coder-1.5b",
                    help="model (one of --models) for the tree forward; '' to skip it")
    ap.add_argument("--tree-tokens", type=int, default=64)
    ap.add_argument("--tree-runs", type=int, default=5)
    ap.add_argument("--flash-gib-s", type=float, default=None,
                    help="flash read bandwidth (GiB/s); default: measured with O_DIRECT on the tree model's GGUF")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    _native.set_num_threads(args.threads)
    torch, torch_error = import_torch(args.threads)
    torch_version = torch.__version__ if torch else None
    cache_dir = cache_root()                                  # $LEVER_CACHE_DIR, else ~/.cache/lever

    try:
        import llama_cpp
        llama_version, llama_error = llama_cpp.__version__, None
    except Exception as exc:  # noqa: BLE001 -- report and go on without it
        llama_cpp, llama_version, llama_error = None, None, f"{type(exc).__name__}: {exc}"

    other = OtherLoad()
    bw = dram_read_bytes_per_s() / GiB
    flash = None
    if args.tree_model in args.models:
        tree_path = resolve_model(args.tree_model, cache_dir=cache_dir)
        if args.flash_gib_s is None:
            log(f"measuring O_DIRECT read bandwidth on {tree_path} ...")
            flash = flash_bandwidth_gib_s(Path(tree_path))
        else:
            flash = dict(gib_s=args.flash_gib_s, source="--flash-gib-s")
    print(f"# kernel_decode: dtype=bfloat16 threads={args.threads} native_threads={_native.get_num_threads()} "
          f"kernel_isa={_native.kernel_isa()} llama_threads={args.llama_threads} new_tokens={args.new_tokens} "
          f"repeats={args.repeats} torch={torch_version or 'unavailable (' + torch_error + ')'} "
          f"llama_cpp={llama_version if llama_version else 'unavailable (' + llama_error + ')'} "
          f"dram_read_bw={bw:.1f} GiB/s", flush=True)
    if flash:
        extra = (f" (best {flash['best_gib_s']:.2f}, device {flash['device_gib_s']:.2f}; direct={flash['direct']}, "
                 f"{flash['backend']}; {flash['page_cache']})" if "direct" in flash else "")
        print(f"# flash read bw {flash['gib_s']:.2f} GiB/s, {flash['source']}{extra}", flush=True)

    rows, tree = [], None
    engines = [e for e in ENGINES if (e != "llama.cpp" or llama_cpp is not None) and (e != "torch" or torch)]
    for i, name in enumerate(args.models, 1):
        log(f"[{i}/{len(args.models)}] loading {name} ({', '.join(engines)}) ...")
        other_model = OtherLoad()
        native = lever.load(name, dtype="bfloat16", kernels="native", cache_dir=cache_dir)
        dense = lever.load(name, dtype="bfloat16", kernels="torch", cache_dir=cache_dir) if torch else None
        path = native.path
        llm = None
        if llama_cpp is not None:
            llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=args.llama_threads,
                                  n_threads_batch=args.llama_threads, use_mmap=False, verbose=False)
        ids = native.prompt_ids(PROMPT)
        timers = {
            "native": lambda n: time_lever(native.model, ids, n),
            "torch": lambda n: time_lever(dense.model, ids, n),
            "llama.cpp": lambda n: time_llama(llm, ids, n),
        }
        tokens = {}
        for e in engines:                                     # warm up all, as far as the timed runs go
            timers[e](args.new_tokens)
        rates = {e: [] for e in engines}
        for r in range(args.repeats):
            for e in engines:
                t1, _ = timers[e](1)
                tn, tokens[e] = timers[e](args.new_tokens)
                rates[e].append((args.new_tokens - 1) / max(tn - t1, 1e-9))
                log(f"  {name} repeat {r + 1}/{args.repeats} {e:14} {rates[e][-1]:7.2f} tok/s")
        tps = {e: statistics.median(v) for e, v in rates.items()}
        res_native = native.model.resident_weight_bytes
        res_dense = dense.model.resident_weight_bytes if dense else None
        touched = weights_per_token(native.model)
        touched_dense = weights_per_token(dense.model) if dense else None
        lower_bound_s = touched / (bw * GiB)
        agree = {e: next((k for k, (a, b) in enumerate(zip(tokens["native"], tokens[e])) if a != b),
                         args.new_tokens) for e in engines if e != "native"}
        llama_tps, torch_tps = tps.get("llama.cpp"), tps.get("torch")
        row = dict(model=name, path=str(path), prompt_tokens=len(ids),
                   tokens_per_s={e: round(v, 2) for e, v in tps.items()},
                   tokens_per_s_all_repeats={e: [round(x, 2) for x in v] for e, v in rates.items()},
                   native_over_torch=round(tps["native"] / torch_tps, 3) if torch_tps else None,
                   native_over_llama_cpp=round(tps["native"] / llama_tps, 3) if llama_tps else None,
                   resident_bytes_native=res_native, resident_bytes_dense=res_dense,
                   weight_bytes_per_token_native=touched, weight_bytes_per_token_dense=touched_dense,
                   dram_lower_bound_s_per_token=round(lower_bound_s, 5),
                   dram_bound_tokens_per_s=round(1 / lower_bound_s, 1),
                   greedy_tokens_equal_to_native_prefix=agree,
                   other_processes_cpu_share=round(other_model.share(), 3))
        rows.append(row)
        llama_txt = (f"llama.cpp {llama_tps:6.2f} tok/s   native/llama.cpp {tps['native'] / llama_tps:5.2f}x   "
                     if llama_tps else "llama.cpp unavailable   ")
        torch_txt = (f"torch bf16 {torch_tps:6.2f} tok/s   native/torch {tps['native'] / torch_tps:5.2f}x   "
                     f"resident {res_native / MiB:6.1f} MiB vs dense {res_dense / MiB:6.1f} MiB   "
                     if torch_tps else f"torch unavailable   resident {res_native / MiB:6.1f} MiB   ")
        print(f"{name:<20} native {tps['native']:6.2f} tok/s   {llama_txt}{torch_txt}"
              f"weights/token {touched / MiB:6.1f} MiB   DRAM bound {lower_bound_s * 1e3:5.1f} ms/token "
              f"({1 / lower_bound_s:5.1f} tok/s)   others {other_model.share():.0%} CPU", flush=True)

        if name == args.tree_model:
            log(f"  {name}: tree forward of {args.tree_tokens} tokens x {args.tree_runs} ...")
            ms = tree_forward_ms(native.model, ids, args.tree_tokens, args.tree_runs)
            stream_bytes = gguf_stream_bytes(path)
            stream_ms = stream_bytes / (flash["gib_s"] * GiB) * 1e3
            tree = dict(model=name, tree_tokens=args.tree_tokens, prefix_tokens=len(ids), runs=args.tree_runs,
                        compute_ms=round(ms, 2), stream_bytes=stream_bytes,
                        flash_gib_s=round(flash["gib_s"], 3), stream_ms=round(stream_ms, 1),
                        compute_over_stream=round(ms / stream_ms, 3))
            print(f"tree{args.tree_tokens} compute {ms:.1f} ms vs stream {stream_ms:.1f} ms   "
                  f"({name}, native; {stream_bytes / MiB:.1f} MiB at "
                  f"{flash['gib_s']:.2f} GiB/s; compute/stream {ms / stream_ms:.2f})", flush=True)
        del native, dense, llm, timers

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = dict(benchmark="kernel_decode", machine=platform.machine(), processor=platform.processor(),
                  dtype="bfloat16", threads=args.threads, native_threads=_native.get_num_threads(),
                  kernel_isa=_native.kernel_isa(), available_isas=_native.available_isas(),
                  llama_threads=args.llama_threads, new_tokens=args.new_tokens, repeats=args.repeats,
                  dram_read_bw_gib_s=round(bw, 2),
                  torch=dict(available=torch is not None, version=torch_version, error=torch_error),
                  llama_cpp=dict(available=llama_cpp is not None, version=llama_version, error=llama_error),
                  other_processes_cpu_share=round(other.share(), 3),
                  flash=flash, rows=rows, tree=tree)
    (out / "kernel_decode.json").write_text(json.dumps(result, indent=2))
    plot(rows, engines, out / "kernel_decode.png")
    print(f"# other processes used {other.share():.0%} of the CPUs during the run; "
          f"wrote {out / 'kernel_decode.json'} and {out / 'kernel_decode.png'}")
    return 0


def plot(rows, engines, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["model"] for r in rows]
    width = 0.8 / len(engines)
    fig, ax = plt.subplots(figsize=(8, 4))
    for j, e in enumerate(engines):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(rows))]
        ax.bar(xs, [r["tokens_per_s"][e] for r in rows], width, label=e)
    ax.set_xticks(list(range(len(rows))), names)
    ax.set_ylabel("decode tokens/s (in memory)")
    ax.set_title("Greedy decoding: native decoder vs torch bf16 reference vs llama.cpp")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

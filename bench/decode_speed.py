"""In-memory autoregressive decoding speed: Lever's decoder vs transformers' generate().

Three engines on one GGUF, same prompt, greedy, no early stop, run side by
side and interleaved in one process:

  lever        lever.load(kernels="native"): the native decoder (quantised
               matrices, float32 activations, a --dtype KV cache)
  lever-torch  lever.load(kernels="torch"): the torch reference, every weight
               dequantised to --dtype
  transformers transformers' generate() on exactly the torch reference's
               weights (lever.reference.hf_export.hf_from_ours), --dtype

Decode rate = (N - 1) / (time for N new tokens - time for 1 new token), which
removes prefill from all sides the same way.  Also prints the weight bytes
the native decoder touches per token and the DRAM lower bound on its time per
token (measured read bandwidth), writes JSON and a PNG chart.

    python bench/decode_speed.py [--models smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b]
                                 [--new-tokens 32] [--repeats 3] [--dtype bfloat16] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import lever
from lever import _native
from lever.autoregressive import generate_tokens
from lever.reference.hf_export import hf_from_ours
from machine import dram_read_bytes_per_s, weights_per_token

PROMPT = "Write a Python function that checks whether a number is prime."


def time_ours(model, ids, n) -> float:
    t0 = time.perf_counter()
    out = generate_tokens(model, ids, n).token_ids
    assert len(out) == n
    return time.perf_counter() - t0


def time_hf(hf, ids, n) -> float:
    x = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0)
    assert out.shape[1] == len(ids) + n
    return time.perf_counter() - t0


def decode_rate(timer, n: int, repeats: int) -> float:
    """Median over repeats of (n - 1) / (t(n) - t(1)) in tokens/s."""
    rates = []
    for _ in range(repeats):
        t1, tn = timer(1), timer(n)
        rates.append((n - 1) / max(tn - t1, 1e-9))
    return statistics.median(rates)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="threads of torch and of the native pool")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    _native.set_num_threads(args.threads)
    import transformers

    bw = dram_read_bytes_per_s() / 2**30
    print(f"# decode_speed: dtype={args.dtype} threads={args.threads} new_tokens={args.new_tokens} "
          f"repeats={args.repeats} torch={torch.__version__} transformers={transformers.__version__} "
          f"dram_read_bw={bw:.1f} GiB/s", flush=True)
    rows = []
    for i, name in enumerate(args.models, 1):
        print(f"[{i}/{len(args.models)}] loading {name} ...", file=sys.stderr, flush=True)
        m = lever.load(name, dtype=args.dtype, kernels="native")
        ref_model = lever.load(name, dtype=args.dtype, kernels="torch").model
        hf = hf_from_ours(ref_model.decoder)
        ids = m.prompt_ids(PROMPT)
        touched = weights_per_token(m.model)
        time_ours(m.model, ids, 2), time_ours(ref_model, ids, 2), time_hf(hf, ids, 2)   # warm up all
        ours = decode_rate(lambda n: time_ours(m.model, ids, n), args.new_tokens, args.repeats)
        ours_torch = decode_rate(lambda n: time_ours(ref_model, ids, n), args.new_tokens, args.repeats)
        ref = decode_rate(lambda n: time_hf(hf, ids, n), args.new_tokens, args.repeats)
        lower_bound_s = touched / (bw * 2**30)
        row = dict(model=name, dtype=args.dtype, prompt_tokens=len(ids), lever_tokens_per_s=round(ours, 2),
                   lever_torch_tokens_per_s=round(ours_torch, 2),
                   transformers_tokens_per_s=round(ref, 2), ratio=round(ours / ref, 3),
                   weight_bytes_per_token=touched, dram_lower_bound_s_per_token=round(lower_bound_s, 5),
                   dram_bound_tokens_per_s=round(1 / lower_bound_s, 1))
        rows.append(row)
        print(f"{name:<20} {args.dtype}  lever {ours:7.2f} tok/s   lever-torch {ours_torch:7.2f} tok/s   "
              f"transformers {ref:7.2f} tok/s   ratio {ours / ref:5.2f}x   weights/token "
              f"{touched / 2**20:7.1f} MiB   DRAM bound {1 / lower_bound_s:6.1f} tok/s", flush=True)
        del m, ref_model, hf

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = dict(benchmark="decode_speed", machine=platform.machine(), processor=platform.processor(),
                  threads=args.threads, kernel_isa=_native.kernel_isa(), new_tokens=args.new_tokens,
                  dram_read_bw_gib_s=round(bw, 2),
                  torch=torch.__version__, transformers=transformers.__version__, rows=rows)
    (out / "decode_speed.json").write_text(json.dumps(result, indent=2))
    plot(rows, out / "decode_speed.png")
    print(f"# wrote {out / 'decode_speed.json'} and {out / 'decode_speed.png'}")
    return 0


def plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["model"] for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(7, 4))
    for j, (key, label) in enumerate([("lever_tokens_per_s", "Lever (native)"),
                                      ("lever_torch_tokens_per_s", "Lever (torch reference)"),
                                      ("transformers_tokens_per_s", "transformers")]):
        ax.bar([i - 0.4 + 0.8 / 3 * (j + 0.5) for i in x], [r[key] for r in rows], 0.8 / 3, label=label)
    ax.set_xticks(list(x), names)
    ax.set_ylabel("decode tokens/s (in memory)")
    ax.set_title(f"Autoregressive decoding, {rows[0]['dtype'] if rows else ''}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

"""In-memory autoregressive decoding speed: Lever's decoder vs transformers' generate().

Same weights (dequantised from the model's GGUF), same dtype, same prompt,
greedy, no early stop, run side by side and interleaved in one process.
Decode rate = (N - 1) / (time for N new tokens - time for 1 new token), which
removes prefill from both sides the same way.  Also prints the weight bytes
touched per token and the DRAM lower bound on time per token (measured copy
bandwidth), writes JSON and a PNG chart.

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

import lever
import torch


from lever.autoregressive import generate_tokens
from lever.model.hf_export import hf_from_ours
from machine import dram_read_bytes_per_s

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
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    bw = dram_read_bytes_per_s() / 2**30
    print(f"# decode_speed: dtype={args.dtype} threads={args.threads} new_tokens={args.new_tokens} "
          f"repeats={args.repeats} torch={torch.__version__} transformers={transformers.__version__} "
          f"dram_read_bw={bw:.1f} GiB/s", flush=True)
    rows = []
    for i, name in enumerate(args.models, 1):
        print(f"[{i}/{len(args.models)}] loading {name} ...", file=sys.stderr, flush=True)
        m = lever.load(name, dtype=args.dtype)
        hf = hf_from_ours(m.model)
        ids = m.prompt_ids(PROMPT)
        weight_bytes = sum(p.numel() * p.element_size() for p in m.model.parameters())
        # per token, every weight but the embedding table is read once (one embedding row)
        emb = m.model.embed_tokens.weight
        touched = weight_bytes - (emb.numel() * emb.element_size() if not m.config.tie_word_embeddings else 0)
        time_ours(m.model, ids, 2), time_hf(hf, ids, 2)          # warm up both
        ours = decode_rate(lambda n: time_ours(m.model, ids, n), args.new_tokens, args.repeats)
        ref = decode_rate(lambda n: time_hf(hf, ids, n), args.new_tokens, args.repeats)
        lower_bound_s = touched / (bw * 2**30)
        row = dict(model=name, dtype=args.dtype, prompt_tokens=len(ids), lever_tokens_per_s=round(ours, 2),
                   transformers_tokens_per_s=round(ref, 2), ratio=round(ours / ref, 3),
                   weight_bytes_per_token=touched, dram_lower_bound_s_per_token=round(lower_bound_s, 5),
                   dram_bound_tokens_per_s=round(1 / lower_bound_s, 1))
        rows.append(row)
        print(f"{name:<20} {args.dtype}  lever {ours:7.2f} tok/s   transformers {ref:7.2f} tok/s   "
              f"ratio {ours / ref:5.2f}x   weights/token {touched / 2**20:7.1f} MiB   "
              f"DRAM bound {1 / lower_bound_s:6.1f} tok/s", flush=True)
        del m, hf

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = dict(benchmark="decode_speed", machine=platform.machine(), processor=platform.processor(),
                  threads=args.threads, new_tokens=args.new_tokens, dram_read_bw_gib_s=round(bw, 2),
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
    ax.bar([i - 0.2 for i in x], [r["lever_tokens_per_s"] for r in rows], 0.4, label="Lever")
    ax.bar([i + 0.2 for i in x], [r["transformers_tokens_per_s"] for r in rows], 0.4, label="transformers")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("decode tokens/s (in memory)")
    ax.set_title(f"Autoregressive decoding, {rows[0]['dtype'] if rows else ''}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

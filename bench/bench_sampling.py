"""Microbenchmark: what choosing one sampled token costs.

    python bench/bench_sampling.py [--repeats 200] [--out bench/results]

Side by side in one run, interleaved per repeat, on random logits of the
vocabulary sizes of SmolLM2 (49,152) and Qwen2.5 (151,936):

  position-keyed   lever.sampling.sample_at: the processed logits plus the
                   position's Gumbel noise (counter-based, from the seed and
                   the position), argmax -- what every mode now uses
  multinomial      the previous path: processed probabilities, then
                   torch.multinomial with a stateful generator

Prints milliseconds per token (median) and the ratio, and writes
sampling.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from lever.sampling import SamplingParams, processed_probs, sample_at

VOCABS = {"smollm2 (49,152)": 49152, "qwen2.5 (151,936)": 151936}
SETTINGS = {"T 0.8": SamplingParams(temperature=0.8, seed=1),
            "T 0.8, top-p 0.95": SamplingParams(temperature=0.8, top_p=0.95, seed=1),
            "T 0.8, top-k 40": SamplingParams(temperature=0.8, top_k=40, seed=1)}


def time_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def measure(vocab: int, params: SamplingParams, repeats: int) -> dict:
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(0)) * 3
    generator = torch.Generator().manual_seed(0)
    keyed, multi = [], []
    for position in range(repeats):
        keyed.append(time_ms(lambda: sample_at(logits, params, params.seed, position)))
        multi.append(time_ms(lambda: torch.multinomial(processed_probs(logits, params), 1, generator=generator)))
    k, m = statistics.median(keyed), statistics.median(multi)
    return {"position_keyed_ms": round(k, 4), "multinomial_ms": round(m, 4), "ratio": round(k / m, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    results = []
    print(f"{'vocabulary':<20}{'sampling':<20}{'keyed ms':>10}{'multinomial ms':>16}{'ratio':>8}")
    for vname, vocab in VOCABS.items():
        for sname, params in SETTINGS.items():
            r = {"vocabulary": vname, "vocab_size": vocab, "sampling": sname, **measure(vocab, params, args.repeats)}
            results.append(r)
            print(f"{vname:<20}{sname:<20}{r['position_keyed_ms']:>10.3f}{r['multinomial_ms']:>16.3f}"
                  f"{r['ratio']:>7.2f}x", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sampling.json").write_text(json.dumps({"repeats": args.repeats, "threads": torch.get_num_threads(),
                                                   "results": results}, indent=2))
    print(f"# wrote {out / 'sampling.json'}")


if __name__ == "__main__":
    main()

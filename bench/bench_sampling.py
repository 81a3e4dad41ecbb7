"""Microbenchmark: what choosing one sampled token costs.

    python bench/bench_sampling.py [--repeats 200] [--out bench/results]

Side by side in one run, interleaved per repeat, on random float32 logits of
the vocabulary sizes of SmolLM2 (49,152) and Qwen2.5 (151,936):

  position-keyed   lever.sampling.sample_at: the processed logits plus the
                   position's Gumbel noise (counter-based, from the seed and
                   the position), argmax, in the native core -- what every
                   mode uses
  keyed numpy      lever.sampling.sample_at_reference: the same draw in numpy
                   (its definition)
  multinomial      a stateful draw: processed probabilities (numpy), then
                   one uniform from a numpy Generator through their
                   cumulative sum (what torch.multinomial does)

Prints milliseconds per token (median) and the ratios keyed / multinomial and
keyed / keyed numpy, and writes sampling.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from lever import _native
from lever.sampling import SamplingParams, processed_probs, sample_at, sample_at_reference

VOCABS = {"smollm2 (49,152)": 49152, "qwen2.5 (151,936)": 151936}
SETTINGS = {"T 0.8": SamplingParams(temperature=0.8, seed=1),
            "T 0.8, top-p 0.95": SamplingParams(temperature=0.8, top_p=0.95, seed=1),
            "T 0.8, top-k 40": SamplingParams(temperature=0.8, top_k=40, seed=1)}


def time_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def multinomial(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One stateful draw from processed_probs(logits): inverse CDF of one uniform."""
    cdf = np.cumsum(processed_probs(logits, params), dtype=np.float64)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))


def measure(vocab: int, params: SamplingParams, repeats: int) -> dict:
    logits = np.random.default_rng(0).standard_normal(vocab, dtype=np.float32) * 3
    rng = np.random.default_rng(0)
    keyed, ref, multi = [], [], []
    for position in range(repeats):
        keyed.append(time_ms(lambda: sample_at(logits, params, params.seed, position)))
        ref.append(time_ms(lambda: sample_at_reference(logits, params, params.seed, position)))
        multi.append(time_ms(lambda: multinomial(logits, params, rng)))
    k, r, m = statistics.median(keyed), statistics.median(ref), statistics.median(multi)
    return {"position_keyed_ms": round(k, 4), "keyed_numpy_ms": round(r, 4), "multinomial_ms": round(m, 4),
            "ratio": round(k / m, 3), "ratio_vs_numpy": round(k / r, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    results = []
    print(f"{'vocabulary':<20}{'sampling':<20}{'keyed ms':>10}{'numpy ms':>10}{'multinomial ms':>16}"
          f"{'vs multi':>9}{'vs numpy':>9}")
    for vname, vocab in VOCABS.items():
        for sname, params in SETTINGS.items():
            r = {"vocabulary": vname, "vocab_size": vocab, "sampling": sname, **measure(vocab, params, args.repeats)}
            results.append(r)
            print(f"{vname:<20}{sname:<20}{r['position_keyed_ms']:>10.3f}{r['keyed_numpy_ms']:>10.3f}"
                  f"{r['multinomial_ms']:>16.3f}{r['ratio']:>8.2f}x{r['ratio_vs_numpy']:>8.2f}x", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sampling.json").write_text(json.dumps({"repeats": args.repeats,
                                                   "native_threads": _native.get_num_threads(),
                                                   "results": results}, indent=2))
    print(f"# wrote {out / 'sampling.json'}")


if __name__ == "__main__":
    main()

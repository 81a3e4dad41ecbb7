"""What refusing non-finite weights costs at load (issue 42, part 4).

    python bench/finite_check.py [--models smollm2-135m qwen2.5-coder-0.5b] [--repeats 5]

For each model, times (wall seconds, median of --repeats):
- check: `lever.gguf.finite.nonfinite_counts` over every tensor, its bytes
  already in memory (what the loader adds per tensor, and `lever convert`);
- check in load: the same check's calls timed where the in-memory load
  (`load_gguf_native`) makes them, against that whole load's seconds.
Prints one line per model.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from lever.gguf.file import GGUFFile
from lever.gguf.registry import resolve_model
from lever.model import native_loader
from lever.gguf.finite import nonfinite_counts


def check_seconds(g: GGUFFile, repeats: int) -> tuple[float, int]:
    """(median seconds of checking every tensor held in memory, bytes checked)."""
    tensors = [(np.array(g.raw(t.name)), t.qtype) for t in g.tensors.values()]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for raw, qtype in tensors:
            nonfinite_counts(raw, qtype)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), sum(raw.nbytes for raw, _ in tensors)


def load_seconds(path, repeats: int) -> tuple[float, float]:
    """(median seconds the check takes inside one in-memory load, median load
    seconds), the check's calls timed where the loader makes them."""
    real = native_loader.check_finite
    spent = [0.0]

    def timed(*args):
        t0 = time.perf_counter()
        real(*args)
        spent[0] += time.perf_counter() - t0

    inside, load = [], []
    native_loader.check_finite = timed
    try:
        for _ in range(repeats):
            spent[0] = 0.0
            t0 = time.perf_counter()
            native_loader.load_gguf_native(path)
            load.append(time.perf_counter() - t0)
            inside.append(spent[0])
    finally:
        native_loader.check_finite = real
    return statistics.median(inside), statistics.median(load)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    for name in args.models:
        path = resolve_model(name, progress=False)
        check_s, nbytes = check_seconds(GGUFFile(path), args.repeats)
        inside_s, load_s = load_seconds(path, args.repeats)
        print(f"{name:<20} {nbytes / 1e6:6.1f} MB  check alone {check_s * 1e3:5.1f} ms  "
              f"check in load {inside_s * 1e3:5.1f} ms of {load_s * 1e3:6.0f} ms ({inside_s / load_s:.1%})",
              flush=True)


if __name__ == "__main__":
    main()

"""A/B of the quantised matmul kernels of two builds of `lever._native`, side by side.

    python bench/ab_kernels.py --a OLD/_native.cpython-311-x86_64-linux-gnu.so \
                               --b NEW/_native.cpython-311-x86_64-linux-gnu.so

Each build runs in a worker process of its own (pybind11 lets one process
hold only one module that registers a class name) and the same timed calls
alternate between them: for each weight type, M (activation rows) and
round, build A then build B, or B then A on odd rounds, so that whatever
else the machine is doing slows both alike. The weight is
an 8960 x 1536 matrix of random ggml blocks (a Qwen2.5-1.5B MLP matrix),
cycled through several copies (256 MiB in all) so that it comes from DRAM.

Prints, per (type, M), the median seconds of each build, GB/s of weight bytes
(1 GB = 1e9 bytes) and the ratio B / A of their speeds, then the geometric
mean of the ratios; writes it all to JSON (--json, default
bench/results/ab_kernels.json). A ratio under 1 means B is slower.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import random_blocks  # noqa: E402

N, K = 8960, 1536
TYPES = {"Q4_K": 12, "Q6_K": 14, "Q8_0": 8, "Q5_0": 6, "Q4_0": 2, "Q4_1": 3}
BATCHES = (1, 4, 16, 64, 256)
RING_BYTES = 256 << 20


def load_build(path: str):
    """The extension module at `path`, imported as lever._native."""
    spec = importlib.util.spec_from_file_location("lever._native", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Case:
    """One (type, M) case in a worker: weight copies, activations, output."""

    def __init__(self, module, qtype: int, m: int):
        w = random_blocks(qtype, N, K)
        self.weights = [w.copy() for _ in range(max(2, -(-RING_BYTES // w.nbytes)))]
        self.weight_bytes = int(w.nbytes)
        self.x = np.random.default_rng(m).standard_normal((m, K)).astype(np.float32)
        self.out = np.empty((m, N), np.float32)
        self.module, self.qtype = module, qtype

    def seconds_per_call(self, calls: int) -> float:
        start = time.perf_counter()
        for i in range(calls):
            self.module.quant_matmul(self.x, self.weights[i % len(self.weights)], self.qtype,
                                     self.out, "auto")
        return (time.perf_counter() - start) / calls


def worker(path: str) -> None:
    """Answers one JSON request per stdin line: {"case": [qtype, m]} sets up a
    case, {"calls": n} times n calls of it; replies with one JSON line."""
    module = load_build(path)
    print(json.dumps({"isa": module.kernel_isa(), "types": list(module.matmul_types())}), flush=True)
    case = None
    for line in sys.stdin:
        request = json.loads(line)
        if "case" in request:
            case = Case(module, *request["case"])
            print(json.dumps({"weight_bytes": case.weight_bytes}), flush=True)
        else:
            print(json.dumps({"s": case.seconds_per_call(request["calls"])}), flush=True)


class Worker:
    """The main process's handle on one worker."""

    def __init__(self, path: str):
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("a benchmark worker exited early (see its error above)")
        return json.loads(line)

    def ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def measure(a: Worker, b: Worker, qtype: int, m: int, rounds: int) -> dict:
    """Median seconds per call of builds a and b, alternating which goes first."""
    weight_bytes = a.ask(case=[qtype, m])["weight_bytes"]
    b.ask(case=[qtype, m])
    calls = max(1, min(20, int(0.05 / max(a.ask(calls=1)["s"], 1e-6))))
    b.ask(calls=1)
    times = {"a": [], "b": []}
    for r in range(rounds):
        order = (("a", a), ("b", b)) if r % 2 == 0 else (("b", b), ("a", a))
        for key, w in order:
            times[key].append(w.ask(calls=calls)["s"])
    ta, tb = statistics.median(times["a"]), statistics.median(times["b"])
    return {"a_s": ta, "b_s": tb, "a_gb_s": weight_bytes / ta / 1e9,
            "b_gb_s": weight_bytes / tb / 1e9, "b_over_a": ta / tb, "weight_bytes": weight_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        return worker(sys.argv[2])
    parser.add_argument("--a", required=True, help="path of build A's _native extension module")
    parser.add_argument("--b", required=True, help="path of build B's _native extension module")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds per case")
    parser.add_argument("--types", nargs="+", default=list(TYPES), choices=list(TYPES))
    parser.add_argument("--batches", nargs="+", type=int, default=list(BATCHES), help="values of M")
    parser.add_argument("--json", default=str(Path(__file__).resolve().parent / "results" / "ab_kernels.json"))
    args = parser.parse_args()
    a, b = Worker(args.a), Worker(args.b)
    print(f"A: {args.a} (isa {a.hello['isa']})\nB: {args.b} (isa {b.hello['isa']})")
    print(f"{'type':<6}{'M':>5}{'A ms':>10}{'B ms':>10}{'A GB/s':>9}{'B GB/s':>9}{'B/A speed':>11}")
    rows = []
    for name in args.types:
        qtype = TYPES[name]
        if qtype not in a.hello["types"] or qtype not in b.hello["types"]:
            continue
        for m in args.batches:
            r = measure(a, b, qtype, m, args.rounds)
            rows.append({"type": name, "M": m, **r})
            print(f"{name:<6}{m:>5}{r['a_s'] * 1e3:>10.3f}{r['b_s'] * 1e3:>10.3f}"
                  f"{r['a_gb_s']:>9.2f}{r['b_gb_s']:>9.2f}{r['b_over_a']:>11.3f}", flush=True)
    a.close()
    b.close()
    geomean = math.exp(statistics.fmean(math.log(r["b_over_a"]) for r in rows))
    print(f"geometric mean of B/A speed over {len(rows)} cases: {geomean:.3f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"a": args.a, "b": args.b, "rounds": args.rounds,
                                           "shape": [N, K], "cases": rows,
                                           "geomean_b_over_a": geomean}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

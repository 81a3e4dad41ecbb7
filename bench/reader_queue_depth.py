"""Flash read bandwidth of a store by the reader's queue depth (chunk reads in flight).

    python bench/reader_queue_depth.py --store STORE [--depths 4 8 12 16 24 32]
                                       [--rounds 10] [--slots 8] [--out DIR]

Reads every layer extent of STORE's weights.bin in pass order through a ring
of --slots read buffers (the way a streamed target reads one pass), with
O_DIRECT and the store's chunk size (1 MiB), once per queue depth per round.
The depths take turns inside each round, in reverse order every other round,
so a disk whose speed drifts from one second to the next (the development VM's
reads between 1 and 2.4 GiB/s) slows every depth alike: compare the medians.
On that VM a reader's speed also depended on its slot buffers when they were
on 4 KiB pages: one reader could read at 0.8-1.2 GiB/s for all its passes
while another, made in the same process, read at 1.7-2.0, whatever their
depths.  The cause was the pages: a 1 MiB chunk of 4 KiB pages has more
segments than a request may (max_segments), so each chunk went out as two
requests, and how well the pieces merged depended on where the pages lay.
Readers now put their slots on huge pages (csrc/io/slot_memory.h;
bench/reader_buffers.py compares the two), which ended the slow readers;
the sweep still makes and closes a throwaway reader first.  Run it more
than once, with the depths in another order and with --fresh (a new
reader per pass), before trusting a difference between depths.

Prints GiB/s per depth (median, mean, min, max over rounds) and writes
reader_queue_depth.json and reader_queue_depth.png (median with min-max bars)
to --out.  `--read-queue-depth` of the `lever` commands sets the depth a
streamed target reads with (default lever.store.flash_reader.DEFAULT_QUEUE_DEPTH).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from lever.store.flash_reader import DEFAULT_QUEUE_DEPTH, FlashReader
from lever.store.manifest import WEIGHTS, StoreManifest

GiB = 1 << 30


def read_pass(reader: FlashReader, extents: list[tuple[int, int]], slots: int) -> float:
    """Seconds to read `extents` ((offset, length) bytes) through `slots` buffers,
    `slots` extents in flight ahead of the one waited for."""
    t0 = time.perf_counter()
    for i, (offset, length) in enumerate(extents[:slots]):
        reader.submit(i, offset, length, None, f"extent {i}")
    for i in range(len(extents)):
        reader.wait(i % slots)
        if i + slots < len(extents):
            offset, length = extents[i + slots]
            reader.submit(i % slots, offset, length, None, f"extent {i + slots}")
    return time.perf_counter() - t0


def sweep(store: Path, depths: list[int], rounds: int, slots: int, backend: str, fresh: bool) -> dict:
    """GiB/s of every round per queue depth, and what was read.  By default one
    reader per depth serves every round, as a streamed target's ring serves
    every pass; fresh=True makes a new reader (new slot buffers) for each pass."""
    manifest = StoreManifest.load(store)
    extents = [(e.offset, e.length) for e in manifest.layers]
    pass_bytes = sum(length for _, length in extents)
    slot_bytes = max(length for _, length in extents)

    def new_reader(q: int) -> FlashReader:
        reader = FlashReader(store / WEIGHTS, slot_bytes, slots, backend=backend, direct=True, queue_depth=q,
                             chunk_bytes=manifest.chunk_bytes)
        read_pass(reader, extents[:slots], slots)          # warm-up: threads, slot pages
        return reader

    new_reader(depths[0]).close()                      # takes the first reader's penalty (module doc)
    kept = {} if fresh else {q: new_reader(q) for q in depths}
    rates: dict[int, list[float]] = {q: [] for q in depths}
    stats = None
    try:
        for r in range(rounds):
            for q in (depths if r % 2 == 0 else depths[::-1]):
                reader = kept[q] if not fresh else new_reader(q)
                try:
                    rates[q].append(pass_bytes / read_pass(reader, extents, slots) / GiB)
                    stats = stats or reader.stats()
                finally:
                    if fresh:
                        reader.close()
            print(f"round {r + 1}/{rounds}: " + " ".join(f"qd{q} {rates[q][-1]:.2f}" for q in depths),
                  file=sys.stderr, flush=True)
    finally:
        for reader in kept.values():
            reader.close()
    return {"store": str(store), "pass_bytes": pass_bytes, "extents": len(extents), "slots": slots,
            "chunk_bytes": manifest.chunk_bytes, "backend": stats["backend"], "direct": stats["direct"],
            "rounds": rounds, "fresh_readers": fresh, "default_queue_depth": DEFAULT_QUEUE_DEPTH,
            "gib_per_s": {str(q): rates[q] for q in depths}}


def summary_rows(result: dict) -> list[dict]:
    rows = []
    for q, values in result["gib_per_s"].items():
        rows.append({"queue_depth": int(q), "median": statistics.median(values), "mean": statistics.fmean(values),
                     "min": min(values), "max": max(values)})
    return rows


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = [str(r["queue_depth"]) for r in rows]
    med = [r["median"] for r in rows]
    ax.bar(x, med, color="#4C72B0")
    ax.errorbar(x, med, yerr=[[m - r["min"] for m, r in zip(med, rows)], [r["max"] - m for m, r in zip(med, rows)]],
                fmt="none", ecolor="black", capsize=4)
    ax.set_xlabel("chunk reads in flight (queue depth)")
    ax.set_ylabel("GiB/s (median, min-max)")
    save_plot(fig, ax, title, path)


def save_plot(fig, ax, title: str, path: Path) -> None:
    """Titles the chart, writes it to `path` (PNG) and closes it."""
    import matplotlib.pyplot as plt

    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, required=True, help="a flash store directory (lever convert)")
    p.add_argument("--depths", type=int, nargs="+", default=[4, 8, 12, 16, 24, 32])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--slots", type=int, default=8, help="read buffers in the ring (extents in flight)")
    p.add_argument("--reader", default="io_uring", choices=["auto", "io_uring", "pread"])
    p.add_argument("--fresh", action="store_true",
                   help="a new reader (new slot buffers) for every pass instead of one per depth for all rounds")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args(argv)
    if any(q < 1 for q in args.depths) or args.rounds < 1 or args.slots < 1:
        p.error("depths, rounds and slots must be positive")
    result = sweep(args.store, args.depths, args.rounds, args.slots, args.reader, args.fresh)
    rows = summary_rows(result)
    result["summary"] = rows
    print(f"# {result['pass_bytes'] / 1e6:,.0f} MB per pass ({result['extents']} extents, {args.slots} slots, "
          f"{result['chunk_bytes'] >> 10} KiB chunks, {result['backend']} direct={result['direct']}), "
          f"{args.rounds} interleaved rounds, {'a new reader per pass' if args.fresh else 'one reader per depth'}")
    print(f"{'qd':>4} {'median':>7} {'mean':>6} {'min':>6} {'max':>6}  GiB/s")
    for r in rows:
        print(f"{r['queue_depth']:4d} {r['median']:7.2f} {r['mean']:6.2f} {r['min']:6.2f} {r['max']:6.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reader_queue_depth.json").write_text(json.dumps(result, indent=1))
    plot(rows, args.out / "reader_queue_depth.png", f"{args.store.name}: one pass of layer extents, "
         f"{args.slots} slots, {args.rounds} interleaved rounds")
    print(f"# wrote {args.out / 'reader_queue_depth.json'} and {args.out / 'reader_queue_depth.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Flash read bandwidth of a store with the reader's slot buffers on huge pages or on 4 KiB pages.

    python bench/reader_buffers.py --store STORE [--rounds 8] [--slots 8]
                                   [--queue-depth 8] [--out DIR]

Per round, and for each setting in turn (the order reversed every other
round, so a disk whose speed drifts slows both alike), makes a new reader
(`FlashReader(huge_pages=...)`: new slot buffers, which is what differs) and
reads every layer extent of STORE's weights.bin once through its --slots
buffers, with O_DIRECT and the store's chunk size, as a streamed target's
pass does (bench/reader_queue_depth.read_pass).  Where the store's block
device has a /sys/dev/block/<major>:<minor>/stat, it also counts the
requests the device completed during the pass and their mean size: with
4 KiB pages a 1 MiB chunk spans more pages than a request may have segments
(queue/max_segments), so it goes out as two requests; with huge pages
neighbouring chunks merge (see csrc/io/slot_memory.h).

Prints per setting the median, mean, min and max GiB/s, requests per pass
and KiB per request, and what the kernel gave (huge-page bytes of the slots);
writes reader_buffers.json and reader_buffers.png (GiB/s of every pass per
setting) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reader_queue_depth import read_pass, save_plot  # noqa: E402

from lever.store.flash_reader import DEFAULT_QUEUE_DEPTH, FlashReader  # noqa: E402
from lever.store.manifest import WEIGHTS, StoreManifest  # noqa: E402

GiB = 1 << 30
SETTINGS = {"huge pages": True, "4 KiB pages": False}


def device_stat_path(path: Path) -> Path | None:
    """/sys/dev/block/<major>:<minor>/stat of the block device holding `path`, if there is one."""
    dev = os.stat(path).st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    return stat if stat.exists() else None


def device_reads(stat: Path | None) -> tuple[int, int] | None:
    """(reads completed, bytes read) so far by the device (the stat file's fields 1 and 3)."""
    if stat is None:
        return None
    fields = stat.read_text().split()
    return int(fields[0]), int(fields[2]) * 512


def one_pass(store: Path, manifest: StoreManifest, huge: bool, slots: int, queue_depth: int,
             stat: Path | None) -> dict:
    """A new reader's one pass over the layer extents: GiB/s, device requests, huge-page bytes."""
    extents = [(e.offset, e.length) for e in manifest.layers]
    slot_bytes = max(length for _, length in extents)
    with FlashReader(store / WEIGHTS, slot_bytes, slots, backend="io_uring", direct=True,
                     queue_depth=queue_depth, chunk_bytes=manifest.chunk_bytes, huge_pages=huge) as reader:
        before = device_reads(stat)
        seconds = read_pass(reader, extents, slots)
        after = device_reads(stat)
        s = reader.stats()
    row = {"gib_per_s": sum(length for _, length in extents) / seconds / GiB,
           "huge_page_bytes": s["huge_page_bytes"], "slot_buffer_bytes": s["slot_buffer_bytes"]}
    if before and after and after[0] > before[0]:
        row["requests"] = after[0] - before[0]
        row["kib_per_request"] = (after[1] - before[1]) / row["requests"] / 1024
    return row


def summary(rows: list[dict]) -> dict:
    rates = [r["gib_per_s"] for r in rows]
    out = {"median": statistics.median(rates), "mean": statistics.fmean(rates), "min": min(rates), "max": max(rates),
           "huge_page_bytes": rows[-1]["huge_page_bytes"], "slot_buffer_bytes": rows[-1]["slot_buffer_bytes"]}
    if all("requests" in r for r in rows):
        out["requests_per_pass"] = statistics.median(r["requests"] for r in rows)
        out["kib_per_request"] = statistics.median(r["kib_per_request"] for r in rows)
    return out


def plot(result: dict, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, (name, rows) in enumerate(result["passes"].items()):
        ax.scatter([i] * len(rows), [r["gib_per_s"] for r in rows], alpha=0.6, label=name)
        ax.hlines(result["summary"][name]["median"], i - 0.25, i + 0.25, color="black")
    ax.set_xticks(range(len(result["passes"])), list(result["passes"]))
    ax.set_ylabel("GiB/s per pass (bar: median)")
    ax.set_ylim(bottom=0)
    save_plot(fig, ax, title, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, required=True, help="a flash store directory (lever convert)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--slots", type=int, default=8, help="read buffers in the ring (extents in flight)")
    p.add_argument("--queue-depth", type=int, default=DEFAULT_QUEUE_DEPTH, help="chunk reads in flight")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args(argv)
    if args.rounds < 1 or args.slots < 1 or args.queue_depth < 1:
        p.error("rounds, slots and queue depth must be positive")
    manifest = StoreManifest.load(args.store)
    stat = device_stat_path(args.store / WEIGHTS)
    passes: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for r in range(args.rounds):
        for name in (list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]):
            passes[name].append(one_pass(args.store, manifest, SETTINGS[name], args.slots, args.queue_depth, stat))
        print(f"round {r + 1}/{args.rounds}: " + " ".join(f"{n} {passes[n][-1]['gib_per_s']:.2f}" for n in SETTINGS),
              file=sys.stderr, flush=True)
    result = {"store": str(args.store), "slots": args.slots, "queue_depth": args.queue_depth,
              "chunk_bytes": manifest.chunk_bytes, "rounds": args.rounds,
              "device_stat": str(stat) if stat else None, "passes": passes,
              "summary": {name: summary(rows) for name, rows in passes.items()}}
    pass_mb = sum(e.length for e in manifest.layers) / 1e6
    print(f"# {pass_mb:,.0f} MB per pass, {args.slots} slots, queue depth {args.queue_depth}, "
          f"{manifest.chunk_bytes >> 10} KiB chunks, io_uring O_DIRECT, a new reader per pass, {args.rounds} rounds")
    print(f"{'slot buffers':>12} {'median':>7} {'mean':>6} {'min':>6} {'max':>6}  GiB/s  "
          f"{'requests':>8} {'KiB/req':>8}  huge-page MiB")
    for name, s in result["summary"].items():
        req = (f"{s['requests_per_pass']:8.0f} {s['kib_per_request']:8.0f}" if "requests_per_pass" in s
               else f"{'-':>8} {'-':>8}")
        print(f"{name:>12} {s['median']:7.2f} {s['mean']:6.2f} {s['min']:6.2f} {s['max']:6.2f}         {req}  "
              f"{s['huge_page_bytes'] / 2**20:,.0f} of {s['slot_buffer_bytes'] / 2**20:,.0f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reader_buffers.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "reader_buffers.png",
         f"{args.store.name}: one pass of layer extents per reader, {args.slots} slots, {args.rounds} rounds")
    print(f"# wrote {args.out / 'reader_buffers.json'} and {args.out / 'reader_buffers.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Command-line options shared by several subcommands (one definition each)."""

from __future__ import annotations


def add_target_choice(p) -> None:
    """--target-store DIR | --target NAME: a streamed or an in-memory target."""
    target = p.add_mutually_exclusive_group()
    target.add_argument("--target-store", default=None, metavar="DIR",
                        help="stream the target from this flash store (see `lever convert`)")
    target.add_argument("--target", default=None, metavar="NAME",
                        help="an in-memory target: registered model name, GGUF file or checkpoint dir "
                             "(default when no --target-store: smollm2-135m)")


def add_reader_options(p) -> None:
    """--reader, --prefetch-depth and --read-limit of a streamed target."""
    p.add_argument("--reader", default="auto", choices=["auto", "io_uring", "pread"],
                   help="flash reader backend (auto: io_uring, else a pread thread pool)")
    p.add_argument("--prefetch-depth", type=int, default=2, metavar="K",
                   help="extents kept in flight ahead of the computing layer (default 2)")
    p.add_argument("--read-limit", default="0", metavar="RATE",
                   help="cap flash reads to emulate slower flash, e.g. 200MB/s, 1.5GiB/s or bytes/s "
                        "(default 0 = unlimited)")

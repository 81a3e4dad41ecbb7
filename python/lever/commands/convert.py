"""`lever convert`: write a flash store (manifest.json + weights.bin) from a model."""

from __future__ import annotations

import argparse
import sys

from ..store.convert import STORAGE_FORMATS, convert
from ..store.manifest import DEFAULT_WEIGHT_LAYOUT, StoreManifest
from . import arg_types
from .options import add_cache_dir, add_hidden_alias


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("convert", help="convert a model into a flash store",
                              description="Write a flash store: one 4 KiB-aligned extent per decoder layer, "
                                          "checksummed, written atomically.")
    p.add_argument("model", type=arg_types.name, help="registered model name (see `lever models`) or GGUF file")
    p.add_argument("--out", type=arg_types.directory, required=True, metavar="DIR",
                   help="store directory to create")
    p.add_argument("--storage", default="source", choices=STORAGE_FORMATS,
                   help="storage format: the GGUF's own block types (source, default) or bf16")
    add_hidden_alias(p, "--dtype", "storage", choices=STORAGE_FORMATS)      # the old spelling
    p.add_argument("--weight-layout", type=arg_types.weight_layout, default=DEFAULT_WEIGHT_LAYOUT,
                   metavar="{repacked,gguf}",
                   help="repacked (default): matrices with a repacked form in 8-row groups for the batched "
                        "kernels (the same bytes permuted, the same results); gguf: the GGUF's row order, for a "
                        "CPU without repacked kernels (they run there through a slower fallback)")
    p.add_argument("--force", action="store_true", help="replace an existing directory")
    add_cache_dir(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = convert(args.model, args.out, storage=args.storage, force=args.force, progress=True,
                  cache_dir=args.cache_dir, weight_layout=args.weight_layout)
    m = StoreManifest.load(out)
    layer = m.layers[0]
    print(f"wrote {out}: {m.config.arch}, {m.config.n_layers} layers, storage {m.storage}, "
          f"{m.weight_layout} layout, "
          f"{m.weights_bytes / 1e6:,.1f} MB, {layer.length / 1e6:.1f} MB per layer, "
          f"{len(m.head_parts)} head parts", file=sys.stderr)
    return 0

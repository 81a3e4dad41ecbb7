"""The `lever` command: subcommands live in `lever.commands`; this file only dispatches
and turns every error the user can cause -- a bad command line included -- into
one `lever: error:` line on stderr with exit status 2."""

from __future__ import annotations

import argparse
import sys

from .errors import LeverError, UsageError
from .values import __version__


class LeverArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise UsageError (one line, naming the
    subcommand's help) instead of printing the usage and exiting."""

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")

    def parse_args(self, args=None, namespace=None):
        """As ArgumentParser's, but an unknown argument names the subcommand's help."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(parsed, "command", None)
            where = f"{self.prog} {command}" if command else self.prog
            raise UsageError(f"unrecognized arguments: {' '.join(extras)} (see `{where} --help`)")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    from .commands import bench, compile_npu, convert, generate, models, probe, profile, serve, serve_verifier

    parser = LeverArgumentParser(prog="lever", description="Speculative LLM inference with a flash-resident target.")
    parser.add_argument("--version", action="version", version=f"lever {__version__}",
                        help="print `lever VERSION` and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")   # subparsers are LeverArgumentParsers too
    sub.required = True
    for command in (generate, convert, models, bench, profile, probe, serve, serve_verifier, compile_npu):
        command.add_parser(sub)
    return parser


def one_line(message: object) -> str:
    """`message` on one line (a multi-line message would read as several errors)."""
    return " ".join(str(message).split("\n"))


def os_error_words(e: OSError) -> str:
    """An OSError as "<file>: <reason>" (the file first, where it is known),
    else its reason, without Python's "[Errno N]" prefix."""
    reason = e.strerror or str(e)
    if e.filename is None:
        return reason
    return f"{e.filename}: {reason}" + (f" (-> {e.filename2})" if e.filename2 is not None else "")


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except LeverError as e:
        print(f"lever: error: {one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:          # unreadable file, full disk, ...: still one line
        print(f"lever: error: {one_line(os_error_words(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lever: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

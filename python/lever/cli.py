"""The `lever` command: subcommands live in `lever.commands`; this file only dispatches
and turns every error the user can cause -- a bad command line included -- into
one `lever: error:` line on stderr with exit status 2.  SIGINT and SIGTERM stop
a command whatever dispositions the process inherited (lever.signals): exit
status 130 or 143 (a server drains first and exits 0, lever.http.shutdown)."""

from __future__ import annotations

import argparse
import re
import sys

from .errors import LeverError, UsageError
from .signals import exit_status, stop_handlers
from .values import __version__

# a value such as -1GB, -.5 or -inf is an option's value (checked, and refused, by the option's type), not
# an option: argparse alone takes only -1 and -1.5 for values, and says "expected one argument" otherwise
NEGATIVE_VALUE = re.compile(r"^-(\.?\d|inf|nan)", re.IGNORECASE)


class LeverArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise UsageError (one line, naming the
    subcommand's help) instead of printing the usage and exiting."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_VALUE      # no Lever option looks like a negative number

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")

    def parse_args(self, args=None, namespace=None):
        """As ArgumentParser's, but an unknown argument names the subcommand's
        help, and --version takes no other argument."""
        args = sys.argv[1:] if args is None else list(args)
        version_alone(args, self.prog)
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(parsed, "command", None)
            where = f"{self.prog} {command}" if command else self.prog
            raise UsageError(f"unrecognized arguments: {' '.join(extras)} (see `{where} --help`)")
        return parsed


def version_alone(args: list[str], prog: str) -> None:
    """UsageError when --version comes (before the command) with other arguments:
    argparse prints the version at --version and would ignore the rest."""
    top = []
    for arg in args:
        if not arg.startswith("-"):
            break
        top.append(arg)
    if "--version" in top and len(args) > 1:
        others = " ".join(a for a in args if a != "--version")
        raise UsageError(f"--version takes no other arguments, got {others!r} (see `{prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    from .commands import (bench, compile_npu, convert, generate, models, probe, profile, serve, serve_verifier,
                           tokenize)

    parser = LeverArgumentParser(prog="lever", description="Speculative LLM inference with a flash-resident target.")
    parser.add_argument("--version", action="version", version=f"lever {__version__}",
                        help="print `lever VERSION` and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")   # subparsers are LeverArgumentParsers too
    sub.required = True
    for command in (generate, convert, models, tokenize, bench, profile, probe, serve, serve_verifier, compile_npu):
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
    with stop_handlers():
        return run_command(argv)


def run_command(argv: list[str] | None) -> int:
    """Parse `argv` and run its command; every failure one line and an exit status."""
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except LeverError as e:
        print(f"lever: error: {one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:          # unreadable file, full disk, ...: still one line
        print(f"lever: error: {one_line(os_error_words(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:           # SIGINT, or SIGTERM (lever.signals.Stopped)
        status = exit_status(e)
        print("lever: interrupted" if status == 130 else f"lever: stopped by {e}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())

"""The prompt of `lever generate`: --prompt TEXT (or -p TEXT, as llama.cpp
spells it), --prompt - (stdin) or --prompt-file PATH, as UTF-8 text of at
most MAX_PROMPT_BYTES bytes."""

from __future__ import annotations

import sys

from ..errors import PromptError
from ..files import read_small_file
from .limits import MAX_PROMPT_BYTES


def add_prompt_options(p) -> None:
    """-p / --prompt TEXT | --prompt-file PATH (one of them required)."""
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--prompt", "-p", default=None, metavar="TEXT", help="prompt text ('-' reads it from stdin)")
    group.add_argument("--prompt-file", default=None, metavar="PATH",
                       help="read the prompt from this UTF-8 text file")


def read_prompt(args) -> str:
    """The prompt the options name; PromptError if it cannot be read, is not
    UTF-8, is larger than MAX_PROMPT_BYTES or is empty (whitespace only)."""
    if args.prompt_file is not None:
        source = f"--prompt-file {args.prompt_file}"
        text = decode(read_file(args.prompt_file, source), source)
    elif args.prompt == "-":
        source = "the prompt on stdin"
        text = decode(read_stdin(), source)
    else:
        source = "--prompt"
        text = args.prompt
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:       # argv bytes that are not UTF-8 arrive as surrogates
            raise PromptError(f"{source} is not UTF-8 text (character {e.start})") from None
    if not text.strip():
        raise PromptError(f"{source}: the prompt is empty")
    return text


def read_file(path: str, source: str) -> bytes:
    """The bytes of the regular file at `path`, at most MAX_PROMPT_BYTES; a
    FIFO, device or directory is refused before any read (a FIFO would block
    until a writer came; a pipe's text goes to --prompt -)."""
    return read_small_file(path, MAX_PROMPT_BYTES, source, PromptError,
                           fifo_hint=" (to read a pipe, use --prompt - with the pipe on standard input)")


def read_stdin() -> bytes:
    """Up to MAX_PROMPT_BYTES + 1 bytes of standard input, undecoded."""
    stream = getattr(sys.stdin, "buffer", None)
    try:
        if stream is None:                     # a text stream without bytes underneath (tests, embedding)
            return _bounded(sys.stdin.read(MAX_PROMPT_BYTES + 1).encode("utf-8", "surrogateescape"),
                            "the prompt on stdin")
        return _bounded(stream.read(MAX_PROMPT_BYTES + 1), "the prompt on stdin")
    except OSError as e:
        raise PromptError(f"the prompt on stdin cannot be read ({e.strerror or e})") from None


def _bounded(data: bytes, source: str) -> bytes:
    if len(data) > MAX_PROMPT_BYTES:
        raise PromptError(f"{source}: larger than {MAX_PROMPT_BYTES >> 20} MiB")
    return data


def decode(data: bytes, source: str) -> str:
    """`data` as UTF-8 (a leading byte order mark is dropped)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PromptError(f"{source} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None

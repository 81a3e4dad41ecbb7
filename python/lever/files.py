"""Opening untrusted input files without surprises: only regular files, and
opened non-blocking, so a FIFO or device in place of a model or store file
gives a clear error instead of a read that hangs."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import BinaryIO

from .errors import LeverError, ModelFormatError


def open_regular(path: str | os.PathLike, error: type[LeverError] = ModelFormatError) -> BinaryIO:
    """`path` opened for binary reading; `error` (one line naming the path)
    if it is missing, cannot be opened, or is not a regular file."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as e:
        raise error(f"{path}: cannot open ({e.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{path}: not a regular file ({file_kind(mode)})")
    return os.fdopen(fd, "rb")


def read_small_file(path: str | os.PathLike, limit_bytes: int, source: str,
                    error: type[LeverError] = LeverError, fifo_hint: str = "") -> bytes:
    """The whole content of the regular file at `path`, at most `limit_bytes`
    bytes.  `error`, one line starting with `source` (e.g. "--token-file F"),
    if it is missing or unreadable, is not a regular file -- a FIFO or device
    is opened non-blocking and refused without a read, so it can neither hang
    nor stream without end -- or holds more than `limit_bytes` bytes (only
    `limit_bytes` + 1 are ever read).  `fifo_hint` ends a FIFO's message."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{source}: cannot be read (no such file)") from None
    except (OSError, ValueError) as e:        # ValueError: a NUL character in the path
        raise error(f"{source}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            hint = fifo_hint if stat.S_ISFIFO(mode) else ""
            raise error(f"{source}: is {file_kind(mode)}, not a regular file{hint}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit_bytes + 1)
    except OSError as e:
        raise error(f"{source}: cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if len(data) > limit_bytes:
        raise error(f"{source}: larger than {size_words(limit_bytes)}")
    return data


def require_regular(path: str | os.PathLike, source: str, error: type[LeverError] = LeverError) -> None:
    """`error` (one line starting with `source`) unless `path` names a regular
    file, for files a library opens itself (TLS certificates), which would
    block on a FIFO; a missing file is left to the opener's own message."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(mode):
        raise error(f"{source}: is {file_kind(mode)}, not a regular file")


def size_words(n: int) -> str:
    """A byte limit in words: "16 MiB" for whole MiB, else "4,096 bytes"."""
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words, from its st_mode."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a plain file"


def file_sha256(path: str | os.PathLike, chunk_bytes: int = 8 << 20) -> str:
    """Hex SHA-256 of a file's bytes (a model or its source GGUF)."""
    h = hashlib.sha256()
    with open_regular(path) as f:                # a FIFO or device swapped in is refused, never read
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()

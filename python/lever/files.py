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
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()

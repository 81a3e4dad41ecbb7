"""Opening a store's files safely: only regular files inside the store directory.

A store is untrusted input.  Before a file of it is opened, its directory
entry is checked with `os.lstat`: it must be a regular file, or a symbolic
link that resolves to a regular file inside the store directory.  Files are
then opened non-blocking and checked again with `fstat`, so a FIFO or device
swapped in never makes a read hang.  Sizes are in bytes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import StoreError
from ..files import file_kind, open_regular


def store_file(directory: Path, name: str) -> Path:
    """Path of store file `name` after checking it is a regular file inside
    `directory` (symbolic links may not lead out of it); StoreError if not."""
    path = directory / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise StoreError(f"{directory}: {name} is missing (an interrupted conversion leaves none; "
                         f"re-run `lever convert`)") from None
    except OSError as e:
        raise StoreError(f"{path}: cannot inspect ({e.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = path.resolve()
        except (OSError, RuntimeError) as e:        # a symbolic link loop (RuntimeError before Python 3.13)
            reason = getattr(e, "strerror", None) or "a loop"
            raise StoreError(f"{path}: a symbolic link that cannot be resolved ({reason}); store files must be "
                             f"regular files inside the store") from None
        if directory.resolve() not in target.parents:
            raise StoreError(f"{path}: a symbolic link out of the store directory (to {target}); "
                             f"store files must lie inside the store")
        try:
            st = os.stat(target)
        except OSError as e:
            raise StoreError(f"{path}: broken symbolic link ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{path}: not a regular file ({file_kind(st.st_mode)})")
    return path


def read_store_file(path: Path, max_bytes: int) -> bytes:
    """The whole content of regular file `path` (at most `max_bytes` bytes),
    opened non-blocking; StoreError if it is not a regular file or too large."""
    with open_regular(path, StoreError) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise StoreError(f"{path}: {size:,} bytes is more than the {max_bytes:,} such a file can hold")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise StoreError(f"{path}: more than the {max_bytes:,} bytes such a file can hold")
    return data

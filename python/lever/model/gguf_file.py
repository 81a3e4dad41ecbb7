"""Read a GGUF file: metadata, tensor directory, and raw tensor bytes.

A small reader of our own rather than `gguf.GGUFReader`: it parses the header
with plain `struct` reads (the 151k-entry token arrays of a Qwen vocabulary
take well under a second instead of several), checks the file against the
size its header implies, and reports a damaged file as a `ModelFormatError`
instead of failing deep inside numpy.  Block sizes of the quantised types come
from the `gguf` package.  Tensor bytes are served from a read-only memory map.

Format (v2/v3, little endian): magic ``GGUF``, u32 version, u64 tensor count,
u64 metadata count, metadata pairs, tensor infos, padding to the alignment,
then the data section.  Shapes are stored innermost-first (ggml order);
`TensorInfo.shape` is outermost-first (torch order).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import ModelFormatError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# metadata value types -> struct format (scalars) ; 8 = string, 9 = array
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
                   7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_NUMPY_TYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
                7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
_MAX_DIMS = 8
_MAX_STRING = 1 << 30          # bytes; a longer string means a corrupt header


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file. `offset` is absolute in the file, in bytes."""

    name: str
    shape: tuple[int, ...]      # outermost first (torch order)
    qtype: int                  # ggml type id
    offset: int                 # bytes from the start of the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.qtype).name
        except ValueError:
            return f"type{self.qtype}"


def tensor_nbytes(qtype: int, n_elements: int, name: str = "?") -> int:
    """Bytes taken by `n_elements` values of ggml type `qtype`."""
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        raise ModelFormatError(f"tensor {name!r} has unknown ggml type id {qtype}") from None
    if n_elements % block:
        raise ModelFormatError(f"tensor {name!r}: {n_elements} elements is not a multiple of "
                               f"the {GGMLQuantizationType(qtype).name} block size {block}")
    return n_elements // block * size


class _HeaderReader:
    """Sequential little-endian reads that turn running out of bytes into a clear error."""

    def __init__(self, f: BinaryIO, path: Path, file_size: int):
        self.f, self.path, self.file_size = f, path, file_size

    def need(self, n: int) -> None:
        """Fail clearly unless `n` more bytes exist after the current position."""
        pos = self.f.tell()
        if pos + n > self.file_size:
            raise ModelFormatError(f"{self.path}: truncated GGUF header (needs {n:,} bytes at offset "
                                   f"{pos:,}, the file ends at byte {self.file_size:,})")

    def take(self, n: int) -> bytes:
        self.need(n)
        return self.f.read(n)

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > _MAX_STRING:
            raise ModelFormatError(f"{self.path}: corrupt GGUF header (string of {n:,} bytes)")
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar("<I"), self.scalar("<Q")
            if count >= 1 << 40:
                raise ModelFormatError(f"{self.path}: corrupt GGUF header (array of {count} items)")
            self.need(count * (8 if etype == _STRING else 1))   # lower bound on its bytes
            if etype in _NUMPY_TYPES:        # numbers: one read, then a list
                dt = np.dtype(_NUMPY_TYPES[etype])
                arr = np.frombuffer(self.take(dt.itemsize * count), dtype=dt)
                return (arr.astype(bool) if etype == 7 else arr).tolist()
            return [self.value(etype) for _ in range(count)]
        raise ModelFormatError(f"{self.path}: corrupt GGUF header (metadata value type {vtype})")


class GGUFFile:
    """A parsed GGUF file.

    `metadata` maps keys to Python values (str, int, float, bool, lists);
    `tensors` maps names to `TensorInfo` in file order.  `raw(name)` returns
    the tensor's bytes as a read-only uint8 array backed by the file mapping.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFormatError(f"{self.path}: no such file")
        self.file_size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            self._parse(_HeaderReader(f, self.path, self.file_size))
        self._check_size()
        self._mmap: mmap.mmap | None = None

    # -- parsing -------------------------------------------------------------

    def _parse(self, r: _HeaderReader) -> None:
        magic = r.f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFormatError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        self.version = r.scalar("<I")
        if self.version not in (2, 3):
            raise ModelFormatError(f"{self.path}: unsupported GGUF version {self.version} (supported: 2, 3)")
        n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
        if n_tensors > 1_000_000 or n_kv > 1_000_000:
            raise ModelFormatError(f"{self.path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            self.metadata[key] = r.value(r.scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar("<I")
            if n_dims > _MAX_DIMS:
                raise ModelFormatError(f"{self.path}: corrupt tensor info for {name!r} ({n_dims} dims)")
            dims = [r.scalar("<Q") for _ in range(n_dims)]
            qtype, rel_offset = r.scalar("<I"), r.scalar("<Q")
            infos.append((name, tuple(reversed(dims)), qtype, rel_offset))
        align = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if align <= 0 or align & (align - 1):
            raise ModelFormatError(f"{self.path}: corrupt GGUF header (alignment {align})")
        pos = r.f.tell()
        self.data_offset = (pos + align - 1) // align * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, qtype, rel in infos:
            n = 1
            for d in shape:
                n *= d
            self.tensors[name] = TensorInfo(name, shape, qtype, self.data_offset + rel,
                                            tensor_nbytes(qtype, n, name))

    def _check_size(self) -> None:
        if self.file_size < self.expected_size:
            raise ModelFormatError(
                f"{self.path}: truncated GGUF file: its header implies {self.expected_size:,} bytes, "
                f"the file has {self.file_size:,}")

    # -- queries -------------------------------------------------------------

    @property
    def expected_size(self) -> int:
        """Bytes the header implies: the end of the last tensor's data."""
        return max((t.offset + t.nbytes for t in self.tensors.values()), default=self.data_offset)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes (uint8, read-only, zero-copy from the file mapping)."""
        try:
            info = self.tensors[name]
        except KeyError:
            raise ModelFormatError(f"{self.path}: tensor {name!r} is missing") from None
        if self._mmap is None:
            with open(self.path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(self._mmap, dtype=np.uint8, count=info.nbytes, offset=info.offset)


def gguf_expected_size(path: str | os.PathLike) -> int:
    """Size in bytes that the GGUF header at `path` implies for the whole file.

    Works on a truncated file as long as its header is complete.
    """
    p = Path(path)
    with open(p, "rb") as f:
        obj = GGUFFile.__new__(GGUFFile)
        obj.path, obj.file_size = p, p.stat().st_size
        obj._parse(_HeaderReader(f, p, obj.file_size))
    return obj.expected_size

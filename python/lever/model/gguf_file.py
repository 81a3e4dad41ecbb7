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
from ..files import open_regular
from .gguf_checks import check_alignment, check_counts, check_tensor_ranges

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
_MAX_NESTING = 3               # arrays of arrays: deeper means a corrupt header
_ARRAY_HEADER = 12             # bytes: u32 element type + u64 count


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


def tensor_nbytes(qtype: int, n_elements: int, name: str = "?", path: str | os.PathLike = "",
                  row: int | None = None) -> int:
    """Bytes taken by `n_elements` values of ggml type `qtype` (of tensor `name`
    in file `path`); `row`: the innermost dimension, which must hold whole blocks."""
    where = f"{path}: tensor {name!r}" if path else f"tensor {name!r}"
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        raise ModelFormatError(f"{where} has unknown ggml type id {qtype}") from None
    if row is not None and row % block:
        raise ModelFormatError(f"{where}: rows of {row} elements are not whole "
                               f"{GGMLQuantizationType(qtype).name} blocks of {block}")
    if n_elements % block:
        raise ModelFormatError(f"{where}: {n_elements} elements is not a multiple of "
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

    def value(self, vtype: int, key: str = "?", depth: int = 0) -> Any:
        """One metadata value of type id `vtype` (of key `key`, for errors)."""
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array(key, depth)
        raise ModelFormatError(f"{self.path}: corrupt GGUF header (metadata {key!r} has value type {vtype})")

    def array(self, key: str, depth: int) -> list:
        etype, count = self.scalar("<I"), self.scalar("<Q")
        if etype not in _SCALAR_FORMATS and etype not in (_STRING, _ARRAY):
            raise ModelFormatError(f"{self.path}: corrupt GGUF header (metadata {key!r}: "
                                   f"array of value type {etype})")
        if etype == _ARRAY and depth + 1 >= _MAX_NESTING:
            raise ModelFormatError(f"{self.path}: corrupt GGUF header (metadata {key!r}: "
                                   f"arrays nested more than {_MAX_NESTING} deep)")
        min_item = {_STRING: 8, _ARRAY: _ARRAY_HEADER}.get(etype) or struct.calcsize(_SCALAR_FORMATS[etype])
        pos = self.f.tell()
        if count * min_item > self.file_size - pos:      # before anything is allocated
            raise ModelFormatError(f"{self.path}: corrupt GGUF header (metadata {key!r}: array of "
                                   f"{count:,} items at offset {pos:,} does not fit in the file)")
        if etype in _NUMPY_TYPES:        # numbers: one read, then a list
            dt = np.dtype(_NUMPY_TYPES[etype])
            arr = np.frombuffer(self.take(dt.itemsize * count), dtype=dt)
            return (arr.astype(bool) if etype == 7 else arr).tolist()
        return [self.value(etype, key, depth + 1) for _ in range(count)]


class GGUFFile:
    """A parsed GGUF file.

    `metadata` maps keys to Python values (str, int, float, bool, lists);
    `tensors` maps names to `TensorInfo` in file order.  `raw(name)` returns
    the tensor's bytes as a read-only uint8 array backed by the file mapping.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        with open_regular(self.path) as f:
            self.file_size = os.fstat(f.fileno()).st_size
            self._parse(_HeaderReader(f, self.path, self.file_size))
        self._check_size()
        check_tensor_ranges(self.path, list(self.tensors.values()), self.alignment, self.data_offset)
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
        check_counts(self.path, n_tensors, n_kv, self.file_size - r.f.tell())
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            if key in self.metadata:
                raise ModelFormatError(f"{self.path}: corrupt GGUF header (metadata key {key!r} appears twice)")
            self.metadata[key] = r.value(r.scalar("<I"), key)
        infos = [self._tensor_info(r) for _ in range(n_tensors)]
        self.alignment = check_alignment(self.path, self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        pos = r.f.tell()
        self.data_offset = (pos + self.alignment - 1) // self.alignment * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, qtype, rel in infos:
            if name in self.tensors:
                raise ModelFormatError(f"{self.path}: corrupt GGUF header (tensor {name!r} appears twice)")
            if rel % self.alignment:
                raise ModelFormatError(f"{self.path}: tensor {name!r}: data offset {rel:,} is not a "
                                       f"multiple of general.alignment {self.alignment}")
            n = 1
            for d in shape:
                n *= d
            self.tensors[name] = TensorInfo(name, shape, qtype, self.data_offset + rel,
                                            tensor_nbytes(qtype, n, name, self.path, shape[-1]))

    def _tensor_info(self, r: _HeaderReader) -> tuple[str, tuple[int, ...], int, int]:
        """(name, shape outermost first, ggml type id, data offset in bytes) of the next tensor info."""
        name = r.string()
        n_dims = r.scalar("<I")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise ModelFormatError(f"{self.path}: corrupt GGUF header (tensor info of {name!r}: {n_dims} dims)")
        dims = [r.scalar("<Q") for _ in range(n_dims)]
        if min(dims) < 1 or max(dims) > self.file_size * 8:     # 8 elements per byte at the most
            raise ModelFormatError(f"{self.path}: corrupt GGUF header (tensor info of {name!r}: dimensions {dims})")
        qtype, rel_offset = r.scalar("<I"), r.scalar("<Q")
        return name, tuple(reversed(dims)), qtype, rel_offset

    def _check_size(self) -> None:
        """The file ends where its last tensor does (padding to the alignment allowed)."""
        if self.file_size < self.expected_size:
            raise ModelFormatError(
                f"{self.path}: truncated GGUF file: its header implies {self.expected_size:,} bytes, "
                f"the file has {self.file_size:,}")
        padded = -(-self.expected_size // self.alignment) * self.alignment
        if self.file_size > padded:
            raise ModelFormatError(
                f"{self.path}: size {self.file_size} bytes is more than its GGUF header implies "
                f"({self.expected_size} bytes): data follows the last tensor (a damaged tensor type "
                f"or offset, or a wrong file)")

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
            with open_regular(self.path) as f:
                if os.fstat(f.fileno()).st_size != self.file_size:
                    raise ModelFormatError(f"{self.path}: the file changed size since its header was read")
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(self._mmap, dtype=np.uint8, count=info.nbytes, offset=info.offset)


def gguf_expected_size(path: str | os.PathLike) -> int:
    """Size in bytes that the GGUF header at `path` implies for the whole file.

    Works on a truncated file as long as its header is complete.
    """
    p = Path(path)
    with open_regular(p) as f:
        obj = GGUFFile.__new__(GGUFFile)
        obj.path, obj.file_size = p, os.fstat(f.fileno()).st_size
        obj._parse(_HeaderReader(f, p, obj.file_size))
    return obj.expected_size


"""Read a GGUF file: metadata, tensor directory, and raw tensor bytes.

A small reader of our own rather than `gguf.GGUFReader`: it parses the header
with plain `struct` reads (the 151k-entry token arrays of a Qwen vocabulary
take well under a second instead of several), checks the file against the
size its header implies, and reports a damaged file as a `ModelFormatError`
instead of failing deep inside numpy.  Block sizes of the quantised types come
are our own table (`GGML_TYPES`, checked against the `gguf` package by the
tests) so that reading a header imports neither `gguf` nor numpy.  Tensor
bytes are served from a read-only memory map.

Metadata arrays of more than `LAZY_ARRAY_MIN` items (a vocabulary's tokens,
token types and merges) are not decoded while the header is parsed: the
parser walks over them, checking every length against the file, and keeps
a `LazyArray` that decodes the list on first access.  `metadata_digest`
hashes the raw bytes of chosen key/values, so a cache keyed by the
tokenizer metadata never needs the lists.

Format (v2/v3, little endian): magic ``GGUF``, u32 version, u64 tensor count,
u64 metadata count, metadata pairs, tensor infos, padding to the alignment,
then the data section.  Shapes are stored innermost-first (ggml order);
`TensorInfo.shape` is outermost-first (torch order).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import ModelFormatError
from ..files import open_regular
from .checks import check_alignment, check_counts, check_tensor_ranges

if TYPE_CHECKING:
    import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# metadata value types -> struct format (scalars) ; 8 = string, 9 = array
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
                   7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 8
_MAX_STRING = 1 << 30          # bytes; a longer string means a corrupt header
_MAX_NESTING = 3               # arrays of arrays: deeper means a corrupt header
_ARRAY_HEADER = 12             # bytes: u32 element type + u64 count
LAZY_ARRAY_MIN = 4096          # items: longer arrays of numbers or strings are decoded on first use
_U64 = struct.Struct("<Q")

# ggml type id -> (name, elements per block, bytes per block); ggml's type_traits
# (the `gguf` package's GGML_QUANT_SIZES, which tests/model/test_tokenizer_memory.py compares).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}


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
        return ggml_type_name(self.qtype)


def ggml_type_name(qtype: int) -> str:
    """The ggml name of type id `qtype` ("Q4_K"), or "type<id>" for an unknown id."""
    entry = GGML_TYPES.get(qtype)
    return entry[0] if entry else f"type{qtype}"


def tensor_nbytes(qtype: int, n_elements: int, name: str = "?", path: str | os.PathLike = "",
                  row: int | None = None) -> int:
    """Bytes taken by `n_elements` values of ggml type `qtype` (of tensor `name`
    in file `path`); `row`: the innermost dimension, which must hold whole blocks."""
    where = f"{path}: tensor {name!r}" if path else f"tensor {name!r}"
    if qtype not in GGML_TYPES:
        raise ModelFormatError(f"{where} has unknown ggml type id {qtype}")
    type_name, block, size = GGML_TYPES[qtype]
    if row is not None and row % block:
        raise ModelFormatError(f"{where}: rows of {row} elements are not whole "
                               f"{type_name} blocks of {block}")
    if n_elements % block:
        raise ModelFormatError(f"{where}: {n_elements} elements is not a multiple of "
                               f"the {type_name} block size {block}")
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

    def array(self, key: str, depth: int) -> "list | LazyArray":
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
        if count > LAZY_ARRAY_MIN and etype != _ARRAY:
            self.skip_items(etype, count)
            return LazyArray(self.path, self.file_size, etype, count, pos, self.f.tell())
        if etype in _SCALAR_FORMATS:     # numbers: one read, then a list
            return _unpack_numbers(etype, count, self.take(count * struct.calcsize(_SCALAR_FORMATS[etype])))
        return [self.value(etype, key, depth + 1) for _ in range(count)]

    def skip_items(self, etype: int, count: int) -> None:
        """Move past `count` items of scalar or string type `etype`, checking each length."""
        if etype in _SCALAR_FORMATS:
            size = count * struct.calcsize(_SCALAR_FORMATS[etype])
            self.need(size)
            self.f.seek(size, os.SEEK_CUR)
            return
        f, pos, end = self.f, self.f.tell(), self.file_size
        for _ in range(count):
            head = f.read(8)
            if len(head) < 8:
                self.need(8)
            n = _U64.unpack(head)[0]
            if n > _MAX_STRING:
                raise ModelFormatError(f"{self.path}: corrupt GGUF header (string of {n:,} bytes)")
            pos += 8 + n
            if pos > end:
                self.need(n)
            f.seek(pos)


def _unpack_numbers(etype: int, count: int, data: bytes) -> list:
    """`count` little-endian numbers of scalar type `etype` from `data` (bool for type 7)."""
    return list(struct.unpack(f"<{count}{_SCALAR_FORMATS[etype][1]}", data))


def _decode_strings(count: int, data: bytes) -> list[str]:
    """`count` GGUF strings (u64 length, UTF-8 bytes) laid end to end in `data`."""
    out, pos, unpack = [], 0, _U64.unpack_from
    for _ in range(count):
        n = unpack(data, pos)[0]
        out.append(str(data[pos + 8:pos + 8 + n], "utf-8", "replace"))
        pos += 8 + n
    return out


class LazyArray:
    """A metadata array left in the file: `count` items of type id `etype` whose
    bytes span [`start`, `end`) of the file at `path` (after the array header).
    `load()` reads and decodes them once (the list is then kept)."""

    def __init__(self, path: Path, file_size: int, etype: int, count: int, start: int, end: int):
        self.path, self.file_size = path, file_size
        self.etype, self.count, self.start, self.end = etype, count, start, end
        self._items: list | None = None

    @property
    def loaded(self) -> bool:
        return self._items is not None

    def load(self) -> list:
        if self._items is None:
            with open_regular(self.path) as f:
                if os.fstat(f.fileno()).st_size != self.file_size:
                    raise ModelFormatError(f"{self.path}: the file changed size since its header was read")
                f.seek(self.start)
                data = f.read(self.end - self.start)
            if self.etype == _STRING:
                self._items = _decode_strings(self.count, data)
            else:
                self._items = _unpack_numbers(self.etype, self.count, data)
        return self._items

    def __repr__(self) -> str:
        return f"LazyArray(type {self.etype}, {self.count:,} items, bytes {self.start:,}..{self.end:,})"


class Metadata(Mapping):
    """A GGUF file's metadata: key -> value, in file order; big arrays (`LazyArray`)
    are decoded when first read through the mapping."""

    def __init__(self):
        self._values: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        value = self._values[key]
        return value.load() if isinstance(value, LazyArray) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def is_loaded(self, key: str) -> bool:
        """False while `key` is a big array not decoded yet."""
        value = self._values[key]
        return not isinstance(value, LazyArray) or value.loaded


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
        self.metadata = Metadata()
        self._spans: dict[str, tuple[int, int]] = {}      # key -> bytes [start, end) of its type + value
        for _ in range(n_kv):
            key = r.string()
            if key in self.metadata:
                raise ModelFormatError(f"{self.path}: corrupt GGUF header (metadata key {key!r} appears twice)")
            start = r.f.tell()
            self.metadata._values[key] = r.value(r.scalar("<I"), key)
            self._spans[key] = (start, r.f.tell())
        infos = [self._tensor_info(r) for _ in range(n_tensors)]
        self.alignment = check_alignment(self.path, self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        pos = self.header_end = r.f.tell()
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
        """Bytes the header implies: the end of the last tensor's data; for a file
        without tensors (llama.cpp's vocab-only GGUFs) the end of the header, as
        such files may stop before the padding to the alignment."""
        return max((t.offset + t.nbytes for t in self.tensors.values()), default=self.header_end)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def metadata_digest(self, keys: Iterable[str]) -> str:
        """SHA-256 (hex) of the raw file bytes of the `keys`' values (type id and
        encoded value; an absent key hashes as absent), read in 1 MiB pieces:
        nothing is decoded, so big arrays stay in the file."""
        h = hashlib.sha256()
        with open_regular(self.path) as f:
            if os.fstat(f.fileno()).st_size != self.file_size:
                raise ModelFormatError(f"{self.path}: the file changed size since its header was read")
            for key in keys:
                h.update(key.encode("utf-8") + b"\0")
                if key not in self._spans:
                    h.update(b"absent\0")
                    continue
                start, end = self._spans[key]
                h.update(_U64.pack(end - start))
                f.seek(start)
                while start < end:
                    piece = f.read(min(end - start, 1 << 20))
                    if not piece:
                        raise ModelFormatError(f"{self.path}: the file changed since its header was read")
                    h.update(piece)
                    start += len(piece)
        return h.hexdigest()

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes (uint8, read-only, zero-copy from the file mapping)."""
        import numpy as np

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


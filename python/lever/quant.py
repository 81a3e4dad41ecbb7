"""Dequantisation of GGUF tensor data, done by the native core (`lever._native`).

A GGUF tensor of a quantised type is stored as blocks: each block encodes
`block_size(qtype)` elements in `type_size(qtype)` bytes. `dequantize` turns
the raw bytes of such a tensor into a numpy array of fp32 values, or of bf16
values as their uint16 bit patterns, bit-identical to
`gguf.quants.dequantize` (bf16: those fp32 values rounded to nearest-even).
The work runs multithreaded without the GIL.  (The torch reference wraps it:
`lever.model.linear.dequantize_tensor`.)

Units: byte counts are bytes, element counts are tensor elements.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from . import _native
from .dtypes import dtype_name
from .errors import UnsupportedModelError

__all__ = ["dequantize", "is_supported", "block_size", "type_size", "type_name",
           "supported_types"]

_SUPPORTED = frozenset(_native.supported_types())

def supported_types() -> list[int]:
    """ggml type ids that `dequantize` accepts, ascending."""
    return sorted(_SUPPORTED)


def is_supported(qtype: int) -> bool:
    """True if tensors of ggml type id `qtype` can be dequantised."""
    return int(qtype) in _SUPPORTED


def type_name(qtype: int) -> str:
    """Name of a ggml type id ("Q4_K"), or "unknown type <id>"."""
    try:
        from gguf import GGMLQuantizationType
        return GGMLQuantizationType(int(qtype)).name
    except (ImportError, ValueError):
        return f"unknown type {int(qtype)}"


def _require_supported(qtype: int) -> int:
    if not is_supported(qtype):
        names = ", ".join(type_name(t) for t in sorted(_SUPPORTED))
        raise UnsupportedModelError(
            f"tensor type {type_name(qtype)} (ggml type id {int(qtype)}) cannot be dequantised "
            f"by Lever; supported types: {names}")
    return int(qtype)


def block_size(qtype: int) -> int:
    """Elements per block of a supported ggml type."""
    return _native.block_size(_require_supported(qtype))


def type_size(qtype: int) -> int:
    """Bytes per block of a supported ggml type."""
    return _native.type_size(_require_supported(qtype))


def _as_bytes(raw) -> np.ndarray:
    """The bytes of `raw` as a flat, C-contiguous uint8 array (a view where possible)."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return np.frombuffer(raw, dtype=np.uint8)
    arr = np.ascontiguousarray(raw)  # copies only a non-contiguous array
    return arr.reshape(-1).view(np.uint8)


def dequantize(raw: np.ndarray, qtype: int, shape: Sequence[int], dtype: str = "float32") -> np.ndarray:
    """Dequantise the raw bytes of a GGUF tensor into a new numpy array.

    raw:   the tensor's data, a numpy array (any dtype; its bytes are used, so
           GGUFReader's uint8/float16/float32 arrays all work) or a bytes-like
           object; it must hold a whole number of blocks. Not modified.
    qtype: ggml type id (GGMLQuantizationType), e.g. 12 for Q4_K.
    shape: shape of the result, outermost dimension first; its element count
           must equal the number of elements the bytes encode.
    dtype: "float32" (a float32 array), or "bfloat16" (a uint16 array of the
           bf16 bit patterns: the fp32 values rounded to nearest-even).
           Aliases as in `lever.dtypes.dtype_name`.

    Raises UnsupportedModelError for a type Lever cannot dequantise and
    ValueError for another dtype or a size mismatch (e.g. truncated data).
    """
    dtype = dtype_name(dtype)
    qtype = _require_supported(qtype)
    data = _as_bytes(raw)
    shape = tuple(int(d) for d in shape)
    n_elements = math.prod(shape)

    bsize, tsize = _native.block_size(qtype), _native.type_size(qtype)
    if data.nbytes % tsize != 0:
        raise ValueError(f"{data.nbytes} bytes is not a whole number of {type_name(qtype)} blocks "
                         f"({tsize} bytes each): the data is truncated or of another type")
    encoded = data.nbytes // tsize * bsize
    if encoded != n_elements:
        raise ValueError(f"shape {shape} has {n_elements} elements but {data.nbytes} bytes of "
                         f"{type_name(qtype)} encode {encoded} elements")

    # numpy advises transparent huge pages for large arrays, which makes the
    # first-touch page faults of a fresh array several times cheaper
    # (measured: a 1536x8960 Q4_K tensor in 4.4 ms instead of 18 ms).
    out = np.empty(n_elements, dtype=np.float32 if dtype == "float32" else np.uint16)
    _native.dequantize(data, qtype, out)
    return out.reshape(shape)

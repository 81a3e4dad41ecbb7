"""Dequantisation of GGUF tensor data, done by the native core (`lever._native`).

A GGUF tensor of a quantised type is stored as blocks: each block encodes
`block_size(qtype)` elements in `type_size(qtype)` bytes. `dequantize` turns
the raw bytes of such a tensor into a numpy array of fp32 values, or of bf16
values as their uint16 bit patterns, bit-identical to
`gguf.quants.dequantize` (bf16: those fp32 values rounded to nearest-even).
The work runs multithreaded without the GIL.  (The torch reference wraps it:
`lever.reference.linear.dequantize_tensor`.)

`quantize_q4_0` goes the other way for one type, in numpy, bit-identical to
ggml's reference quantiser: it re-quantises a draft model's output head at
load (`--draft-head q4_0`, lever.model.native_loader).

Units: byte counts are bytes, element counts are tensor elements.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from . import _native
from .errors import UnsupportedModelError
from .values import dtype_name

__all__ = ["dequantize", "is_supported", "block_size", "type_size", "type_name",
           "supported_types", "quantize_q4_0", "Q4_0", "REPACKABLE_TYPES", "repack_at_load_types",
           "base_type", "is_repacked", "repackable", "in_ggml_layout"]

_SUPPORTED = frozenset(_native.supported_types())

def supported_types() -> list[int]:
    """ggml type ids that `dequantize` accepts, ascending."""
    return sorted(_SUPPORTED)


def is_supported(qtype: int) -> bool:
    """True if tensors of ggml type id `qtype` can be dequantised."""
    return int(qtype) in _SUPPORTED


def type_name(qtype: int) -> str:
    """Name of a ggml type id ("Q4_K"; a repacked id "Q4_K_R8"), or "unknown type <id>".
    (The gguf package is imported here, not with lever.quant: `import lever.api` stays light.)"""
    base = base_type(qtype)
    try:
        from gguf import GGMLQuantizationType
        return GGMLQuantizationType(base).name + ("_R8" if base != int(qtype) else "")
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
           Aliases as in `lever.values.dtype_name`.

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


# Repacked weights (csrc/kernels/repack.h): groups of 8 interleaved rows, the
# same bytes permuted, under Lever's own type id (1000 + the ggml id).  The one
# list of the ggml types Lever repacks, for both users:
# - REPACKABLE_TYPES: every type with a repacked form; `lever convert` writes
#   matrices of these types repacked into a store (lever.store.convert);
# - repack_at_load_types(): the types a resident model repacks as it loads
#   (lever.model.native_loader).
Q6_K = 14                     # ggml type id
REPACKABLE_TYPES = frozenset({2, 3, 6, 8, 12, Q6_K})     # Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K


def repack_at_load_types() -> frozenset:
    """The ggml types a resident model repacks as it loads with this process's
    kernel isa: every repackable type on AVX-512 (its VNNI Q6_K kernel is level
    with the GGUF-layout one at one row and ahead from 8 rows, lever-kbench);
    all but Q6_K elsewhere (AVX2's repacked Q6_K kernel is slower below 32
    rows, and one-row decoding reads the Q6_K output head every token)."""
    if _native.kernel_isa() == "avx512":
        return REPACKABLE_TYPES
    return REPACKABLE_TYPES - {Q6_K}


def base_type(qtype: int) -> int:
    """The ggml type id a repacked type id was made from; `qtype` itself otherwise."""
    return _native.base_type(int(qtype))


def is_repacked(qtype: int) -> bool:
    """True for a repacked type id (kernels/repack.h)."""
    return base_type(qtype) != int(qtype)


def repackable(qtype: int, shape: Sequence[int], types=REPACKABLE_TYPES) -> bool:
    """True if a tensor of ggml `qtype` and `shape` (outermost first) is a
    matrix Lever repacks: 2-D, its type in `types`, its rows a multiple of 8
    and its columns whole blocks (`_native.can_repack`)."""
    return (len(shape) == 2 and int(qtype) in types
            and _native.can_repack(int(qtype), int(shape[0]), int(shape[1])))


def in_ggml_layout(data: np.ndarray, qtype: int, shape: Sequence[int]) -> tuple[np.ndarray, int]:
    """(bytes, ggml type) of a matrix as a GGUF stores it: `data` itself, or,
    for repacked weights (a resident model's, or a repacked store's;
    csrc/kernels/repack.h), its rows restored to their original blocks."""
    base = _native.base_type(int(qtype))
    if base == int(qtype):
        return data, base
    rows, cols = (int(v) for v in shape)
    restored = _native.unpack_rows(np.ascontiguousarray(data), int(qtype), rows, cols, list(range(rows)))
    return restored.reshape(-1), base


Q4_0 = 2                      # ggml type id
_Q4_0_BLOCK = 32              # elements per Q4_0 block
_Q4_0_BYTES = 18              # bytes per block: float16 scale d, then 16 bytes of 4-bit codes


def quantize_q4_0(values: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] (cols a multiple of 32) -> the Q4_0 bytes of those
    rows, uint8 [rows, cols / 32 * 18], as ggml's reference quantiser makes
    them: per block of 32 values, m = the value of largest magnitude (the
    first of equals), d = m / -8, codes q = min(15, trunc(x / d + 8.5)) so that
    x ~ d * (q - 8); byte j of the codes holds q[j] (low nibble) and q[j + 16]
    (high nibble)."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % _Q4_0_BLOCK:
        raise ValueError(f"Q4_0 needs a 2-d array with a multiple of {_Q4_0_BLOCK} columns, got {x.shape}")
    rows, cols = x.shape
    blocks = x.reshape(-1, _Q4_0_BLOCK)
    first_max = np.argmax(np.abs(blocks), axis=1)
    m = blocks[np.arange(len(blocks)), first_max]
    d = (m / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.minimum(15, (blocks * inv[:, None] + np.float32(8.5)).astype(np.int8)).astype(np.uint8)
    out = np.empty((len(blocks), _Q4_0_BYTES), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.reshape(rows, cols // _Q4_0_BLOCK * _Q4_0_BYTES)

"""Refusing weights that are not finite numbers.

A NaN or an infinity in a model's weights does not crash anything: a NaN in
the final norm gives blank output, a few NaNs in one layer's norm give
fluent but different text.  So every float a tensor holds is checked as it
is loaded -- the elements of F32 / F16 / BF16 tensors, and the F16 scale
fields (d, and dmin or m where the type has one) of the blocks of quantised
types, the only floats in a block -- and a tensor holding a non-finite one
is refused with one line naming the file and the tensor:

    <file>: tensor 'blk.5.attn_norm.weight' holds NaN (16 values); ...

The test looks at bits only (an all-ones exponent), vectorised in numpy over
the bytes already in memory, so it costs a pass over the scale fields, not a
dequantisation (docs/benchmarks.md has the measured cost).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFormatError


@dataclass(frozen=True)
class FloatFormat:
    """A float encoding seen as unsigned integers: `dtype` the little-endian
    integer type of its width, `exponent` the mask of its exponent bits,
    `mantissa` of its fraction bits (all-ones exponent: Inf if the fraction
    is zero, else NaN)."""

    dtype: str
    exponent: int
    mantissa: int


F32 = FloatFormat("<u4", 0x7F800000, 0x007FFFFF)
F16 = FloatFormat("<u2", 0x7C00, 0x03FF)
BF16 = FloatFormat("<u2", 0x7F80, 0x007F)

DENSE = {0: F32, 1: F16, 30: BF16}          # ggml type id -> element format
# ggml type id -> (bytes per block, byte offsets of its F16 fields); ggml's block structs
QUANT_SCALES: dict[int, tuple[int, tuple[int, ...]]] = {
    2: (18, (0,)),             # Q4_0: d, qs[16]
    3: (20, (0, 2)),           # Q4_1: d, m, qs[16]
    6: (22, (0,)),             # Q5_0: d, qh[4], qs[16]
    7: (24, (0, 2)),           # Q5_1: d, m, qh[4], qs[16]
    8: (34, (0,)),             # Q8_0: d, qs[32]
    10: (84, (80, 82)),        # Q2_K: scales[16], qs[64], d, dmin
    11: (110, (108,)),         # Q3_K: hmask[32], qs[64], scales[12], d
    12: (144, (0, 2)),         # Q4_K: d, dmin, scales[12], qs[128]
    13: (176, (0, 2)),         # Q5_K: d, dmin, scales[12], qh[32], qs[128]
    14: (210, (208,)),         # Q6_K: ql[128], qh[64], scales[16] (int8), d
}


def checked_types() -> frozenset[int]:
    """ggml type ids whose floats `nonfinite_counts` can check."""
    return frozenset(DENSE) | frozenset(QUANT_SCALES)


def _fields(raw: np.ndarray, fmt: FloatFormat, block_bytes: int, offset: int) -> np.ndarray:
    """The `fmt` floats at byte `offset` of every `block_bytes`-byte block of
    the bytes `raw`, as unsigned integers (a strided view: nothing is copied)."""
    return np.ndarray((raw.nbytes // block_bytes,), dtype=fmt.dtype, buffer=raw, offset=offset,
                      strides=(block_bytes,))


def _count(bits: np.ndarray, fmt: FloatFormat) -> tuple[int, int]:
    """(NaNs, infinities) among the floats `bits`; one max-reduction when there is none."""
    if bits.size == 0 or int(np.max(bits & (fmt.exponent | fmt.mantissa))) < fmt.exponent:
        return 0, 0
    special = bits[(bits & fmt.exponent) == fmt.exponent]
    nan = int(np.count_nonzero(special & fmt.mantissa))
    return nan, int(special.size) - nan


def nonfinite_counts(raw: np.ndarray, qtype: int) -> tuple[int, int]:
    """(NaN count, infinity count) among the floats of a tensor's bytes `raw`
    (uint8, in the GGUF block layout) of ggml type `qtype`: its elements for
    F32/F16/BF16, its blocks' F16 scales for a quantised type.  (0, 0) for a
    type with no float field we know (`checked_types`)."""
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    qtype = int(qtype)
    if qtype in DENSE:
        fmt = DENSE[qtype]
        width = np.dtype(fmt.dtype).itemsize
        return _count(data[:data.nbytes // width * width].view(fmt.dtype), fmt)
    if qtype in QUANT_SCALES:
        block_bytes, offsets = QUANT_SCALES[qtype]
        counts = [_count(_fields(data, F16, block_bytes, off), F16) for off in offsets]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)
    return 0, 0


def nonfinite_words(nan: int, inf: int, qtype: int) -> str:
    """"NaN (16 values)", "Inf in 1 block scale", "NaN (2 values) and Inf (1 value)"."""
    unit = ("value", "values") if int(qtype) in DENSE else ("block scale", "block scales")
    parts = [f"{name} ({n:,} {unit[n != 1]})" for name, n in (("NaN", nan), ("Inf", inf)) if n]
    return " and ".join(parts)


def refuse_nonfinite(path: str | os.PathLike, name: str, qtype: int, nan: int, inf: int) -> None:
    """ModelFormatError naming the file and tensor `name` if it holds `nan`
    NaNs or `inf` infinities; nothing if both are zero."""
    if nan or inf:
        raise ModelFormatError(f"{path}: tensor {name!r} holds {nonfinite_words(nan, inf, qtype)}: "
                               f"the file is damaged or was written wrongly; Lever refuses non-finite "
                               f"weights (use an intact copy of the model)")


def check_finite(path: str | os.PathLike, name: str, raw: np.ndarray, qtype: int) -> None:
    """ModelFormatError (one line naming `path` and tensor `name`) if the
    bytes `raw` of that tensor (ggml type `qtype`) hold a NaN or infinity."""
    refuse_nonfinite(path, name, qtype, *nonfinite_counts(raw, qtype))


def check_gguf_finite(g) -> None:
    """Check every tensor of the parsed GGUF file `g` (lever.gguf.file.GGUFFile,
    read through its memory map) with `check_finite`, in file order."""
    for info in g.tensors.values():
        if info.qtype in DENSE or info.qtype in QUANT_SCALES:
            check_finite(g.path, info.name, g.raw(info.name), info.qtype)

"""Checks of a GGUF file's header, made before anything is sized from it.

One short function per check; each raises `ModelFormatError` whose message
names the file and the field. Sizes and offsets are in bytes.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ModelFormatError

_MIN_KV_BYTES = 8 + 1 + 4 + 1          # key length, one key byte, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8   # name length, one byte, n_dims, one dim, type, offset
_MAX_ALIGNMENT = 1 << 24
_LAYER_RE = re.compile(r"blk\.(\d+)\.")


def check_counts(path: Path, n_tensors: int, n_kv: int, remaining: int) -> None:
    """The tensor and metadata counts must fit in the `remaining` bytes of the file."""
    if n_tensors > 1_000_000 or n_kv > 1_000_000:
        raise ModelFormatError(f"{path}: corrupt GGUF header ({n_tensors:,} tensors, {n_kv:,} metadata keys)")
    need = n_tensors * _MIN_TENSOR_INFO_BYTES + n_kv * _MIN_KV_BYTES
    if need > remaining:
        raise ModelFormatError(f"{path}: truncated GGUF header ({n_tensors:,} tensors and {n_kv:,} metadata "
                               f"keys need at least {need:,} bytes, {remaining:,} follow the counts; "
                               f"or the counts are corrupt)")


def check_alignment(path: Path, value) -> int:
    """general.alignment: an integer power of two (bytes) up to 16 MiB."""
    if type(value) is not int or value <= 0 or value & (value - 1) or value > _MAX_ALIGNMENT:
        raise ModelFormatError(f"{path}: corrupt GGUF header (general.alignment {value!r} is not "
                               f"a power of two up to {_MAX_ALIGNMENT:,})")
    return value


def check_tensor_ranges(path: Path, tensors: list, alignment: int, data_offset: int) -> None:
    """Tensor data lies packed in the data section, as GGUF writers lay it out:
    the first tensor at its start, each next one at the end of the one before
    rounded up to `alignment`, none sharing bytes (that all of it lies inside
    the file is `GGUFFile._check_size`). `tensors`: TensorInfo, absolute offsets."""
    ordered = sorted(tensors, key=lambda t: (t.offset, t.nbytes))
    for a, b in zip(ordered, ordered[1:]):
        if b.offset < a.offset + a.nbytes:
            raise ModelFormatError(f"{path}: tensors {a.name!r} and {b.name!r} overlap (bytes "
                                   f"{a.offset:,}+{a.nbytes:,} and {b.offset:,}+{b.nbytes:,})")
    expected, before = data_offset, None
    for t in ordered:
        if t.offset != expected:
            after = f"the end of tensor {before.name!r}" if before else "the start of the data section"
            raise ModelFormatError(f"{path}: tensor {t.name!r} starts at byte {t.offset:,}, not at {after} "
                                   f"({expected:,}): a damaged offset or tensor type")
        expected, before = -(-(t.offset + t.nbytes) // alignment) * alignment, t


def meta_int(path: Path, metadata: dict, key: str, default=None) -> int:
    """Integer metadata `key` (bools refused); `default` if absent and given."""
    value = metadata.get(key, default)
    if value is None:
        raise ModelFormatError(f"{path}: metadata key {key} is missing")
    if type(value) is not int:
        raise ModelFormatError(f"{path}: metadata key {key} must be an integer, got {value!r}")
    return value


def meta_float(path: Path, metadata: dict, key: str, default=None) -> float:
    """Floating-point metadata `key` (GGUF stores these as FLOAT32; an integer
    type there is a damaged header). Range checks: `config.config_problem`."""
    value = metadata.get(key, default)
    if value is None:
        raise ModelFormatError(f"{path}: metadata key {key} is missing")
    if type(value) is not float:
        raise ModelFormatError(f"{path}: metadata key {key} must be a floating-point number, got {value!r}")
    return float(value)


def check_layer_indices(path: Path, tensor_names, block_count: int) -> None:
    """The blk.N tensors must number exactly block_count layers, 0..block_count-1."""
    found = {int(m.group(1)) for n in tensor_names if (m := _LAYER_RE.match(n))}
    extra = sorted(i for i in found if i >= block_count)
    if extra:
        raise ModelFormatError(f"{path}: block_count {block_count} does not match the tensors "
                               f"(tensors of layer blk.{extra[0]} exist)")
    if len(found) < block_count:      # never builds a range as long as a corrupt count
        missing = next(i for i in range(block_count) if i not in found)
        raise ModelFormatError(f"{path}: block_count {block_count} does not match the tensors "
                               f"(layer blk.{missing} has none)")


def check_tensor_shapes(path: Path, tensors: dict, expected: dict) -> None:
    """Every GGUF tensor name in `expected` (name -> shape, outermost first) must
    exist with that shape. `tensors`: name -> TensorInfo."""
    for name, shape in expected.items():
        info = tensors.get(name)
        if info is None:
            raise ModelFormatError(f"{path}: tensor {name!r} is missing")
        if tuple(info.shape) != tuple(shape):
            raise ModelFormatError(f"{path}: tensor {name!r} has shape {tuple(info.shape)}, the "
                                   f"hyperparameters imply {tuple(shape)}")

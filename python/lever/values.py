"""Values every layer of Lever shares, and the one place each is normalised.

- Compute dtypes (`DTYPE_NAMES`, `dtype_name`, `dtype_bytes`): "float32" or
  "bfloat16", from any spelling (no torch).  bfloat16 halves the KV cache
  (and, on the torch reference, the dense weights and activations); float32
  is exact to the reference's rounding.
- The cache directory (`cache_root`): assembled models, stores, profiles,
  calibrations, probes, tokenizers.
- Byte sizes and rates (`parse_size`, `parse_rate`, `fmt_bytes`): '600MB'
  (10^6), '1.5GiB' (2^30), '512M' (2^20) -> bytes; bytes per second.
- The package version (`__version__`, re-exported as `lever.__version__`).

This module imports only the standard library and lever.errors: it is the
bottom layer (tests/cli/test_import_layers.py).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from .errors import DramBudgetError, ReadLimitError

__version__ = "0.1.0"

# -- compute dtypes -------------------------------------------------------------------

DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "f32": "float32",
               "bfloat16": "bfloat16", "bf16": "bfloat16"}


def dtype_name(dtype) -> str:
    """'bf16' / 'bfloat16' / 'fp32' / 'f32' / 'float32' (any case) -> "bfloat16" or "float32".

    A torch dtype (torch.float32 / torch.bfloat16) is accepted too, but only
    when torch is already imported: this never imports torch.  Anything else
    raises a one-line ValueError."""
    if isinstance(dtype, str):
        try:
            return DTYPE_NAMES[dtype.lower()]
        except KeyError:
            pass
    else:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(dtype, torch.dtype):
            name = str(dtype).removeprefix("torch.")
            if name in ("float32", "bfloat16"):
                return name
    raise ValueError(f"unsupported compute dtype {dtype!r} (use float32 or bfloat16)")


def dtype_bytes(dtype) -> int:
    """Bytes per element of a compute dtype (any name `dtype_name` accepts):
    "float32" -> 4, "bfloat16" -> 2."""
    return 4 if dtype_name(dtype) == "float32" else 2


# -- the cache directory ---------------------------------------------------------------

def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Lever's cache directory: `cache_dir`, else $LEVER_CACHE_DIR, else ~/.cache/lever."""
    return Path(cache_dir or os.environ.get("LEVER_CACHE_DIR") or Path.home() / ".cache" / "lever")


# -- byte sizes and rates --------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "k": 2**10, "m": 2**20, "g": 2**30}
"""Bytes per unit suffix (lower case): decimal kB..TB, binary KiB..TiB and K/M/G."""


def parse_size(text: str | int) -> int:
    """A size -> bytes: '600MB' (10^6), '1.5GiB' (2^30), '512M' (2^20) or a plain
    byte count (an int is returned as is).  DramBudgetError (one line) otherwise."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise DramBudgetError(f"cannot read the size {text!r} (examples: 600MB, 1.5GiB, 750000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_rate(text: str | float | int | None) -> float:
    """A read-bandwidth cap -> bytes per second; 0.0 = unlimited.

    '200MB/s' (10^6), '1.5GiB/s' (2^30), '512M/s' (2^20), the same without
    '/s', or a plain number of bytes per second; None, '' and '0' mean no cap.
    ReadLimitError (one line) otherwise.
    """
    if text is None or text == "":
        return 0.0
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*(?:/\s*s)?\s*", str(text))
        if not m or m.group(2).lower() not in _UNITS:
            raise ReadLimitError(f"cannot read the read limit {text!r} "
                                 f"(examples: 200MB/s, 1.5GiB/s, 250000000; 0 = unlimited)")
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not value >= 0 or value == float("inf"):
        raise ReadLimitError(f"the read limit must be a finite number of bytes/s >= 0, got {text!r}")
    return value


def fmt_bytes(n: int) -> str:
    """`n` bytes as decimal megabytes (10^6), one decimal: 600000000 -> '600.0 MB'."""
    return f"{n / 1e6:,.1f} MB"

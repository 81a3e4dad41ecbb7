"""Compute dtype names of the public API: "float32" or "bfloat16" (no torch).

bfloat16 halves the KV cache (and, on the torch reference, the dense
weights and activations); float32 is exact to the reference's rounding.
"""

from __future__ import annotations

import sys

DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "f32": "float32",
               "bfloat16": "bfloat16", "bf16": "bfloat16"}


def dtype_name(dtype) -> str:
    """'bf16' / 'bfloat16' / 'fp32' / 'f32' / 'float32' -> "bfloat16" or "float32".

    A torch dtype (torch.float32 / torch.bfloat16) is accepted too, but only
    when torch is already imported: this never imports torch.  Anything else
    raises ValueError."""
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

"""The linear operator: torch matmul for dense weights, native kernels for quantised ones.

A weight matrix is either a torch tensor (bf16 / fp32) or a `QuantTensor`:
the ggml blocks of a GGUF file or a store extent, kept as bytes.  `linear`
computes ``x @ W.T (+ b)`` for both; with a `QuantTensor` the native core
quantises the activations to 8 bits and multiplies against the blocks
directly (`lever._native.quant_matmul`), so the weights are never
dequantised into memory.  Buffers cross into C++ as numpy views (no copy).

`Linear` and `Embedding` are the modules the decoder is built from; each
holds a dense `weight` parameter or, once `set_quantized` was called, a
`qweight` and no dense parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import _native, quant
from ..values import dtype_name

_MATMUL_TYPES = frozenset(_native.matmul_types())


def has_kernel(qtype: int) -> bool:
    """True if weights of ggml type `qtype` can be multiplied without dequantising."""
    return int(qtype) in _MATMUL_TYPES


@dataclass(frozen=True, eq=False)
class QuantTensor:
    """A [rows, cols] matrix stored as ggml blocks of `qtype`, row after row.

    raw: uint8 bytes (rows * cols / block_size * type_size of them).  It may
    be a view of a read buffer; whoever made the view keeps the buffer alive.
    """

    raw: np.ndarray
    qtype: int
    shape: tuple[int, int]

    def __post_init__(self):
        rows, cols = self.shape
        bs, ts = quant.block_size(self.qtype), quant.type_size(self.qtype)
        if cols % bs or self.raw.nbytes != rows * cols // bs * ts:
            raise ValueError(f"{quant.type_name(self.qtype)} matrix {rows}x{cols} needs "
                             f"{rows * cols // bs * ts} bytes, got {self.raw.nbytes}")

    @property
    def nbytes(self) -> int:
        return self.raw.nbytes

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.shape[0]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_tensor(self.raw, self.qtype, self.shape, dtype)

    def permute_rows(self, order: np.ndarray) -> "QuantTensor":
        """A copy with row i taken from row order[i] (rows are whole blocks)."""
        rows = self.raw.reshape(self.shape[0], self.row_bytes)[np.asarray(order)]
        return QuantTensor(np.ascontiguousarray(rows).reshape(-1), self.qtype, self.shape)

    def embedding_rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` dequantised: [len(ids), cols] in `dtype`."""
        rows = self.raw.reshape(self.shape[0], self.row_bytes)
        out = torch.empty(len(ids), self.shape[1], dtype=dtype)
        dst = numpy_view(out)
        for i, tok in enumerate(ids.tolist()):
            _native.dequantize(rows[tok], self.qtype, dst[i])
        return out


def dequantize_tensor(raw, qtype: int, shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`lever.quant.dequantize` as a torch tensor of `dtype` (torch.float32 or
    torch.bfloat16), wrapping the numpy result without a copy."""
    out = quant.dequantize(raw, qtype, shape, dtype_name(dtype))
    if out.dtype == np.uint16:
        return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(out)


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """A numpy view (no copy, same strides) of an fp32 / bf16 tensor (bf16 as uint16 bits),
    the form in which activations cross into the native kernels."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype == torch.float32:
        return t.numpy()
    raise TypeError(f"native kernels take float32 or bfloat16 tensors, not {t.dtype}")


def quant_matmul(x: torch.Tensor, w: QuantTensor, isa: str = "auto") -> torch.Tensor:
    """x [..., K] @ w.T -> [..., N] in x's dtype (fp32 or bf16), by the native kernels."""
    rows, cols = w.shape
    if x.shape[-1] != cols:
        raise ValueError(f"x has {x.shape[-1]} features, the weight expects {cols}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, cols).contiguous()
    out = torch.empty(x2.shape[0], rows, dtype=x.dtype)
    if x2.shape[0]:
        _native.quant_matmul(numpy_view(x2), w.raw, w.qtype, numpy_view(out), isa)
    return out.view(*lead, rows)


def linear(x: torch.Tensor, weight: torch.Tensor | QuantTensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias, for a dense or a quantised weight."""
    if isinstance(weight, QuantTensor):
        y = quant_matmul(x, weight)
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)


class _MaybeQuantized:
    """Mixin: the module's `weight` parameter may be replaced by a `QuantTensor`."""

    qweight: QuantTensor | None = None

    def set_quantized(self, w: QuantTensor | None) -> None:
        """Use `w` as the weight and drop the dense parameter (None: keep it)."""
        self.qweight = w
        if w is not None:
            self.weight = None


class Linear(_MaybeQuantized, nn.Linear):
    """`nn.Linear` whose weight may instead be a `QuantTensor` (attribute `qweight`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.qweight if self.qweight is not None else self.weight, self.bias)


class Embedding(_MaybeQuantized, nn.Embedding):
    """`nn.Embedding` whose table may instead be a `QuantTensor` (rows dequantised on lookup)."""

    def table(self) -> torch.Tensor | QuantTensor:
        """The [vocab, hidden] table, dense or quantised (the head uses it when tied)."""
        return self.qweight if self.qweight is not None else self.weight

    def forward(self, ids: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        if self.qweight is not None:
            return self.qweight.embedding_rows(ids, dtype or torch.float32)
        return F.embedding(ids, self.weight)


def resident_bytes(module: nn.Module) -> int:
    """Bytes of weights `module` holds in memory: dense parameters plus quantised blocks."""
    dense = sum(p.numel() * p.element_size() for p in module.parameters() if p.device.type != "meta")
    blocks = {id(m.qweight.raw): m.qweight.nbytes for m in module.modules()
              if getattr(m, "qweight", None) is not None}
    return dense + sum(blocks.values())

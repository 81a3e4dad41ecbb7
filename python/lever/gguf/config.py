"""A GGUF file's `ModelConfig` and the place of each decoder tensor in it (torch-free).

`config_from_gguf` hands the file's metadata to its architecture's family
module (`lever.arch`), which maps it onto the block description, and checks
the result (types, ranges, head counts) against the tensors (layer count,
every shape).  `layer_parts` says which GGUF tensor (and which rows of it)
holds each decoder tensor of a layer; `qk_row_order` undoes the row
interleaving llama.cpp applies to the q / k projections of `llama` files
(the rotate-half RoPE layout the decoders use).  Used by the native loader,
the store converter and the torch reference loader alike.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import quant
from ..arch import Family, TensorPart, family
from ..arch.base import GLOBAL_TENSORS, common_fields
from ..errors import ModelFormatError, UnsupportedModelError
from ..model_config import ModelConfig, config_problem, layer_shapes
from .checks import check_layer_indices, check_tensor_shapes, meta_float, meta_int
from .file import GGUFFile, TensorInfo

# ModelConfig field -> the metadata key it comes from (after "<arch>.")
_FIELD_KEYS = {
    "hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
    "n_layers": "block_count", "n_heads": "attention.head_count",
    "n_kv_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon", "rope_theta": "rope.freq_base",
    "max_context": "context_length", "vocab_size": "vocab_size", "rope_dims": "rope.dimension_count",
    "sliding_window": "attention.sliding_window", "rope_theta_local": "rope.freq_base_swa",
}
_SMALL_TENSOR = 1 << 16          # elements: the most a metadata-like tensor (RoPE factors) may hold


class GGUFMeta:
    """A GGUF file's metadata as a family reads it (`lever.arch.base.Meta`):
    keys without the "<arch>." prefix, type-checked, ModelFormatError naming
    the file and key when one is missing or of the wrong type."""

    def __init__(self, g: GGUFFile):
        self.g, self.arch, self.source = g, g.architecture, g.path.name

    def _key(self, key: str) -> str:
        return f"{self.arch}.{key}"

    def has(self, key: str) -> bool:
        return self._key(key) in self.g.metadata

    def int(self, key: str, default=None) -> int:
        return meta_int(self.g.path, self.g.metadata, self._key(key), default)

    def float(self, key: str, default=None) -> float:
        return meta_float(self.g.path, self.g.metadata, self._key(key), default)

    def str(self, key: str, default=None) -> str:
        value = self.g.metadata.get(self._key(key), default)
        if not isinstance(value, str):
            raise ModelFormatError(f"{self.g.path}: metadata key {self._key(key)} must be a string, got {value!r}")
        return value

    def array(self, key: str) -> list | None:
        value = self.g.metadata.get(self._key(key))
        return value if isinstance(value, list) else None

    def has_tensor(self, name: str) -> bool:
        return name in self.g.tensors

    def tensor_values(self, name: str) -> list[float]:
        info = self.g.tensors[name]
        if info.n_elements > _SMALL_TENSOR or info.qtype not in (0, 1, 30):
            raise ModelFormatError(f"{self.g.path}: tensor {name!r} ({info.type_name}, {info.n_elements} "
                                   f"values) is not a small F32/F16/BF16 vector")
        values = quant.dequantize(self.g.raw(name), info.qtype, info.shape, "float32").reshape(-1)
        if not np.all(np.isfinite(values)):
            raise ModelFormatError(f"{self.g.path}: tensor {name!r} holds a NaN or infinity")
        return values.tolist()

    def refuse(self, what: str) -> Exception:
        return UnsupportedModelError(f"{self.source}: {what}")


def model_family(g: GGUFFile) -> Family:
    """The family of `g`'s architecture (UnsupportedModelError in one line if none)."""
    return family(g.architecture, g.path.name)


def config_from_gguf(g: GGUFFile) -> ModelConfig:
    """The decoder's block description from the metadata, checked (types,
    ranges, head counts) and checked against the tensors (layer count, every shape)."""
    fam = model_family(g)
    if "token_embd.weight" not in g.tensors:
        raise ModelFormatError(f"{g.path}: tensor 'token_embd.weight' is missing")
    meta = GGUFMeta(g)
    hidden, n_heads = meta.int("embedding_length"), meta.int("attention.head_count")
    if not meta.has("attention.key_length") and (n_heads <= 0 or hidden % n_heads):
        raise ModelFormatError(f"{g.path}: metadata {g.architecture}.attention.head_count {n_heads} does not "
                               f"divide {g.architecture}.embedding_length {hidden}")
    values = common_fields(meta)
    values.update(vocab_size=meta.int("vocab_size", g.tensors["token_embd.weight"].shape[0]),
                  tie_word_embeddings="output.weight" not in g.tensors,
                  attention_bias="blk.0.attn_q.bias" in g.tensors)
    values.update(fam.describe(meta))
    problem = config_problem(values)
    if problem:
        field = problem.split(" ")[0]
        key = f" (metadata {g.architecture}.{_FIELD_KEYS[field]})" if field in _FIELD_KEYS else ""
        raise ModelFormatError(f"{g.path}: {problem}{key}")
    cfg = ModelConfig(**values)
    check_layer_indices(g.path, g.tensors, cfg.n_layers)
    check_tensor_shapes(g.path, g.tensors, expected_gguf_shapes(cfg, g))
    return cfg


def layer_parts(cfg: ModelConfig, g: GGUFFile) -> list[TensorPart]:
    """Where each decoder tensor of a layer lies in `g` (`lever.arch.TensorPart`;
    the same for every layer)."""
    return model_family(g).layer_parts(cfg, lambda name: f"blk.0.{name}" in g.tensors)


def expected_gguf_shapes(cfg: ModelConfig, g: GGUFFile) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> shape (outermost first) of every tensor the decoder needs."""
    shapes = {"token_embd.weight": (cfg.vocab_size, cfg.hidden_size), "output_norm.weight": (cfg.hidden_size,)}
    if not cfg.tie_word_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, cfg.hidden_size)
    per_layer: dict[str, tuple[int, ...]] = {}
    decoder = layer_shapes(cfg)
    for part in layer_parts(cfg, g):
        shape = decoder[part.name]
        if part.rows is None:
            per_layer[part.gguf] = shape
        else:                               # a fused tensor: its rows are the parts' rows together
            rows = max(part.rows[1], per_layer.get(part.gguf, (0,))[0])
            per_layer[part.gguf] = (rows,) + shape[1:]
    for i in range(cfg.n_layers):
        for name, shape in per_layer.items():
            shapes[f"blk.{i}.{name}"] = shape
    return shapes


def decoder_name(gguf_name: str) -> str | None:
    """Decoder name of a GGUF tensor outside the layers (embedding, final norm,
    head), None for any other."""
    return GLOBAL_TENSORS.get(gguf_name)


def qk_row_order(rows: int, n_heads: int) -> np.ndarray:
    """int64 [rows]: row i of the rotate-half layout is row order[i] of llama.cpp's
    interleaved q/k layout (`n_heads` heads of rows // n_heads rows each)."""
    return np.arange(rows, dtype=np.int64).reshape(n_heads, rows // n_heads // 2, 2).transpose(0, 2, 1).reshape(-1)


def part_row_order(part: TensorPart, n_rows: int) -> np.ndarray | None:
    """The row order (`qk_row_order`) that puts part `part`'s `n_rows` rows (or
    elements, for a bias) in the decoder's layout, None when already there."""
    return qk_row_order(n_rows, part.permuted_heads) if part.permuted_heads else None


def part_info(g: GGUFFile, layer: int, part: TensorPart) -> TensorInfo:
    """The `TensorInfo` of part `part` of layer `layer`: the whole GGUF tensor,
    or, for a fused one, its rows (offset, shape and bytes of those rows;
    the name stays the GGUF tensor's)."""
    info = g.tensors[f"blk.{layer}.{part.gguf}"]
    if part.rows is None:
        return info
    first, end = part.rows
    row_bytes = info.nbytes // info.shape[0]
    return dataclasses.replace(info, shape=(end - first,) + tuple(info.shape[1:]),
                               offset=info.offset + first * row_bytes, nbytes=(end - first) * row_bytes)

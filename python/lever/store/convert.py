"""`lever convert`: write a flash store from a GGUF model.

Streamed (one extent in memory at a time) and atomic: everything is written
into a hidden temporary directory beside the destination, fsynced, and renamed
into place only when complete, so an interrupted conversion leaves no
directory that looks like a store.

Storage formats:
- ``source``: the GGUF's own block types (for the Qwen Q4_K_M files: Q4_K and
  Q6_K, ~4.5-6.5 bits per weight), dequantised natively as layers arrive;
- ``bf16``: dequantised once at conversion (2 bytes per weight).

Weight layouts (`weight_layout`, lever.store.manifest):
- ``repacked`` (default): the matrices of decoder layers and the output head
  whose type has a repacked form (`quant.REPACKABLE_TYPES`) and whose rows
  are a multiple of 8 are written in groups of 8 interleaved rows
  (`_native.repack_rows`, csrc/kernels/repack.h) under the repacked type id;
  embedding parts stay in the GGUF layout;
- ``gguf``: every tensor in the GGUF's row order, for CPUs without repacked
  kernels (elsewhere they run through a slower fallback).
The head is decided as one matrix: repacked only if all of its rows are whole
groups of 8, so every head part has the same layout.  A ``bf16`` store has no
type with a repacked form and records the layout ``gguf`` whatever was asked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .. import _native, quant
from ..atomic_write import SaveError, sweep_stale, write_atomic, writing
from ..errors import StoreError, UnsupportedModelError
from ..files import file_sha256
from ..gguf.config import config_from_gguf, layer_parts, qk_row_order
from ..gguf.file import GGUFFile
from ..gguf.finite import check_gguf_finite
from ..gguf.registry import resolve_model
from .flash_reader import chunk_checksums
from .manifest import (ALIGNMENT, CHUNK_BYTES, DEFAULT_WEIGHT_LAYOUT, STORAGE_FORMATS, TENSOR_ALIGNMENT, TOKENIZER,
                       WEIGHT_LAYOUTS, WEIGHTS, Extent, StoreManifest, TensorEntry)
from .validate import REPACK_ROWS

BF16 = 30                         # ggml type id
_TENSOR_ALIGN = TENSOR_ALIGNMENT  # bytes; tensors inside an extent start on this boundary


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class _StoreWriter:
    """Appends extents to weights.bin, padding each to the store alignment."""

    def __init__(self, path: Path, progress: tqdm):
        self.path = path
        self.f = open(path, "wb")
        self.offset = 0
        self.extents: list[Extent] = []
        self.progress = progress

    def add(self, name: str, tensors: list[tuple[str, int, tuple[int, ...], np.ndarray]],
            rows: tuple[int, int] | None = None) -> None:
        entries, parts, pos = [], [], 0
        for tname, qtype, shape, data in tensors:
            pad = _round_up(pos, _TENSOR_ALIGN) - pos
            if pad:
                parts.append(bytes(pad))
                pos += pad
            entries.append(TensorEntry(tname, qtype, tuple(shape), pos, data.nbytes))
            parts.append(data.tobytes())
            pos += data.nbytes
        data_bytes = pos
        parts.append(bytes(_round_up(pos, ALIGNMENT) - pos))    # pad to the alignment
        blob = b"".join(parts)
        crcs = chunk_checksums(blob, CHUNK_BYTES)                  # over the padded extent
        try:
            self.f.write(blob)
        except OSError as e:                                       # name the file (ENOSPC does not)
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        self.extents.append(Extent(name, self.offset, len(blob), data_bytes, tuple(crcs), tuple(entries), rows))
        length = len(blob)
        self.offset += length
        self.progress.update(length)

    def close(self) -> None:
        try:
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
        except OSError as e:
            try:
                self.f.close()              # unwritten bytes fail again: the first error is the one told
            except OSError:
                pass
            raise OSError(e.errno, e.strerror, str(self.path)) from None


def _stored(g: GGUFFile, gguf_name: str, storage: str, perm_heads: int | None,
            rows: tuple[int, int] | None = None) -> tuple[int, tuple[int, ...], np.ndarray]:
    """(qtype, shape, bytes) of one tensor in the store's format, rows optionally sliced."""
    info = g.tensors[gguf_name]
    if not quant.is_supported(info.qtype):
        raise UnsupportedModelError(f"{g.path.name}: tensor {gguf_name!r} uses {info.type_name}, "
                                    f"which Lever cannot dequantise")
    shape = info.shape
    n_rows = shape[0] if len(shape) > 1 else 1
    raw = g.raw(gguf_name).reshape(n_rows, -1) if len(shape) > 1 else g.raw(gguf_name)[None, :]
    if perm_heads is not None:
        if len(shape) == 1:     # a bias: permute its elements like rows
            vals = quant.dequantize(raw, info.qtype, shape, "float32")
            return 0, shape, vals[qk_row_order(shape[0], perm_heads)]
        raw = raw[qk_row_order(n_rows, perm_heads)]
    if rows is not None:
        raw = raw[rows[0]:rows[1]]
        shape = (rows[1] - rows[0],) + tuple(shape[1:])
    raw = np.ascontiguousarray(raw)
    if storage == "source" or info.qtype in (0, BF16) or len(shape) == 1:
        return info.qtype, tuple(shape), raw
    return BF16, tuple(shape), quant.dequantize(raw, info.qtype, shape, "bfloat16")


def _laid_out(qtype: int, shape: tuple[int, ...], data: np.ndarray, layout: str
              ) -> tuple[int, tuple[int, ...], np.ndarray]:
    """(qtype, shape, bytes) of one tensor in weight `layout`: under "repacked", a
    matrix Lever repacks (`quant.repackable`: 2-D, a type in REPACKABLE_TYPES,
    rows a multiple of 8) is repacked into a copy (the same number of bytes)
    under its repacked type id; anything else is returned as given."""
    if layout != "repacked" or not quant.repackable(qtype, shape):
        return qtype, shape, data
    packed = np.array(data, dtype=np.uint8).reshape(-1)     # a copy: `data` may be the GGUF's read-only map
    return _native.repack_rows(packed, int(qtype), int(shape[0]), int(shape[1])), shape, packed


_ROW_GROUP = 64   # head parts hold a multiple of this many rows: matrix-vector kernels
                  # treat a ragged tail of rows differently, and the streamed head must
                  # compute every logit exactly like one matmul over the whole matrix;
                  # a multiple of REPACK_ROWS, so a repacked head's parts are whole groups
assert _ROW_GROUP % REPACK_ROWS == 0


def _matrix_layout(kind: str, info, layout: str) -> str:
    """The layout of the head or embedding matrix `info` (parts split by rows):
    embedding rows are looked up one by one and stay in the GGUF layout; the
    head is repacked as a whole or not at all (its rows a multiple of 8)."""
    if kind == "embed" or not quant.repackable(info.qtype, info.shape):
        return "gguf"
    return layout


def _row_groups(n_rows: int, row_bytes: int, target_bytes: int) -> list[tuple[int, int]]:
    """[first, end) row ranges of about `target_bytes` each, multiples of 64 rows."""
    per = max(1, target_bytes // max(1, row_bytes))
    n = -(-n_rows // per)
    per = _round_up(-(-n_rows // n), _ROW_GROUP)          # even the parts out
    return [(i, min(n_rows, i + per)) for i in range(0, n_rows, per)]


def convert(model: str, out_dir: str | os.PathLike, storage: str = "source", force: bool = False,
            progress: bool = True, cache_dir=None, weight_layout: str = DEFAULT_WEIGHT_LAYOUT) -> Path:
    """Write a store for `model` (registered name or GGUF path) into `out_dir`;
    storage "source" or "bf16", weight_layout "repacked" or "gguf" (module doc)."""
    if storage not in STORAGE_FORMATS:
        raise StoreError(f"unknown storage format {storage!r} (choose from {', '.join(STORAGE_FORMATS)})")
    if weight_layout not in WEIGHT_LAYOUTS:
        raise StoreError(f"unknown weight layout {weight_layout!r} (choose from {', '.join(WEIGHT_LAYOUTS)})")
    out = Path(out_dir)
    if out.exists() and not force:
        raise StoreError(f"{out} already exists (use --force to replace it)")
    src = resolve_model(model, cache_dir=cache_dir, progress=progress)
    if not src.is_file():
        raise StoreError(f"{src}: converting a checkpoint directory is not supported; give a GGUF file")
    g = GGUFFile(src)
    cfg = config_from_gguf(g)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    with writing(tmp):                      # what a killed conversion leaves is swept by the next one
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            sweep_stale(out.parent)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        except OSError as e:
            raise StoreError(f"cannot create the output directory {out}: {e.strerror or e}") from None
        try:
            _write_store(g, cfg, storage, weight_layout, tmp, progress)
            if out.exists():
                old = out.parent / f".{out.name}.old-{os.getpid()}"
                with writing(old):
                    out.rename(old)
                    tmp.rename(out)
                    shutil.rmtree(old)
            else:
                tmp.rename(out)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, (OSError, SaveError)):   # a full disk, a vanished directory: one line
                raise StoreError(f"cannot write the store {out} ({_failure(e)})") from None
            raise
    return out


def _failure(e: OSError | SaveError) -> str:
    """What failed, in words: "<file name>: <reason>" where the file is known."""
    name = e.path.name if isinstance(e, SaveError) else Path(e.filename).name if e.filename else ""
    reason = e.reason if isinstance(e, SaveError) else e.strerror or str(e)
    return f"{name}: {reason}" if name else reason


def _write_store(g: GGUFFile, cfg, storage: str, layout: str, tmp: Path, progress: bool) -> None:
    """weights.bin, tokenizer_metadata.json and manifest.json of the store, into `tmp`.
    A tensor holding a NaN or infinity is refused before anything is written
    (lever.gguf.finite): a store is only made of finite weights, so its loader
    trusts them as its checksums vouch for the bytes."""
    check_gguf_finite(g)
    layout = layout if storage == "source" else "gguf"       # BF16 has no repacked form
    head_name = "token_embd.weight" if cfg.tie_word_embeddings else "output.weight"
    total = sum(t.nbytes for t in g.tensors.values()) * (1 if storage == "source" else 3)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"convert ({storage})", disable=not progress)
    writer = _StoreWriter(tmp / WEIGHTS, bar)
    try:
        for i in range(cfg.n_layers):
            tensors = []
            for part in layer_parts(cfg, g):
                stored = _stored(g, f"blk.{i}.{part.gguf}", storage, part.permuted_heads, part.rows)
                tensors.append((part.name, *_laid_out(*stored, layout)))
            writer.add(f"layer.{i}", tensors)
        layer_bytes = max(e.data_bytes for e in writer.extents)
        for kind, gname in (("head", head_name),) + ((("embed", "token_embd.weight"),)
                                                    if not cfg.tie_word_embeddings else ()):
            info = g.tensors[gname]
            row_bytes = info.nbytes // info.shape[0] * (1 if storage == "source" else 2)
            part_layout = _matrix_layout(kind, info, layout)
            for k, rows in enumerate(_row_groups(info.shape[0], row_bytes, layer_bytes)):
                part = _laid_out(*_stored(g, gname, storage, None, rows), part_layout)
                writer.add(f"{kind}.{k}", [("weight", *part)], rows=rows)
        writer.add("globals", [("norm.weight", *_stored(g, "output_norm.weight", storage, None))])
    finally:
        writer.close()
        bar.close()
    tokenizer_meta = {k: v for k, v in g.metadata.items() if k.startswith("tokenizer.")}
    tokenizer_bytes = json.dumps(tokenizer_meta).encode()
    write_atomic(tmp / TOKENIZER, tokenizer_bytes)
    source = {"path": str(g.path), "bytes": g.file_size, "name": g.metadata.get("general.name", ""),
              "file_type": g.metadata.get("general.file_type"), "sha256": file_sha256(g.path)}
    manifest = StoreManifest(config=cfg, storage=storage, weights_bytes=writer.offset,
                             extents=writer.extents, source=source,
                             tokenizer_sha256=hashlib.sha256(tokenizer_bytes).hexdigest(), weight_layout=layout)
    manifest.save(tmp)
    StoreManifest.load(tmp)       # what was written must pass the checks every load makes

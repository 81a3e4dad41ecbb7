"""Load a GGUF model for the native decoder: weights read straight into DRAM.

`load_gguf_native(path)` parses the header (`GGUFFile`, `config_from_gguf`)
and reads every weight with `os.preadv` straight into its final place, with no
memory map of the file and no intermediate copies:

- one 64-byte aligned uint8 buffer per decoder layer, its tensors at 64-byte
  aligned offsets described by a `_native.LayerLayout`;
- one buffer for the embedding table and, when the head is not tied to it,
  one for the output head;
- the final norm as float32.

Once every tensor is read, the file's page cache is dropped
(`os.posix_fadvise(..., POSIX_FADV_DONTNEED)`): those pages would otherwise
stay charged to the process's memory cgroup next to the weights' own copy,
doubling the model's footprint under a memory limit.

Tensors keep the file's block types (the native kernels multiply them
directly).  Where this process's kernels have repacked forms (AVX2, AVX-512:
`_native.should_repack()`), matrices of the types `quant.repack_at_load_types()`
names are repacked in
place into groups of 8 interleaved rows for the register-blocked batched
kernels (`repack_loaded`): the same bytes permuted, the same size, and the
same results bit for bit (csrc/kernels/repack.h).  llama.cpp stores the q/k projections (and biases) of *llama*
models with rows permuted for its interleaved RoPE: the rows are read into
their rotate-half positions (one iovec per row; rows are whole blocks).

Every tensor is checked for NaN and infinity as it arrives, before any
repacking (lever.gguf.finite: its floats, or its blocks' F16 scales): a
damaged file is refused with one line naming the tensor.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .. import _native
from ..errors import ModelFormatError, UnsupportedModelError
from ..files import open_regular
from ..gguf.config import config_from_gguf, layer_parts, part_info, part_row_order
from ..gguf.file import GGUFFile, TensorInfo, tensor_nbytes
from ..gguf.finite import check_finite, nonfinite_counts, refuse_nonfinite
from ..model_config import ModelConfig
from ..quant import Q4_0, dequantize, quantize_q4_0, repack_at_load_types, repackable, type_name
from ..store.flash_reader import aligned_empty
from .native_decoder import NativeDecoder

TENSOR_ALIGNMENT = 64                       # bytes; buffers and tensors inside them start on this boundary
DENSE_TYPES = {0: 4, 1: 2, 30: 2}           # F32, F16, BF16 ggml type ids -> bytes per element
_TORCH_HINT = "; the torch reference (--kernels torch) dequantises it"
_IOV_MAX = 1024                             # iovecs per preadv call (Linux's IOV_MAX)


def matrix_types() -> set[int]:
    """ggml type ids the native decoder multiplies: the quant kernels' and F32/F16/BF16."""
    return set(_native.matmul_types()) | set(DENSE_TYPES)


def check_type(where: str, name: str, qtype: int, matrix: bool, hint: str = "") -> None:
    """UnsupportedModelError unless tensor `name` (of `where`) has a type the native
    decoder uses: a matrix one with a kernel or dense, a vector a dense one.
    hint: appended to the message (what to do instead)."""
    allowed = matrix_types() if matrix else set(DENSE_TYPES)
    if int(qtype) not in allowed:
        names = ", ".join(type_name(t) for t in sorted(allowed))
        raise UnsupportedModelError(f"{where}: tensor {name!r} uses {type_name(qtype)}, which the native "
                                    f"decoder cannot use for a {'matrix' if matrix else 'vector'} "
                                    f"(supported: {names}){hint}")


def repack_loaded(buffer: np.ndarray, qtype: int, shape: tuple) -> int:
    """Repacks the [rows, cols] matrix of ggml `qtype` in `buffer` in place
    when this process uses repacked weights (`_native.should_repack`), the
    type is one it repacks at load (`quant.repack_at_load_types`, from the one
    list of repacked types shared with flash stores) and the matrix has a
    repacked form; returns its type id as loaded (the repacked id, or `qtype`)."""
    if _native.should_repack() and repackable(qtype, shape, repack_at_load_types()):
        return _native.repack_rows(buffer, int(qtype), int(shape[0]), int(shape[1]))
    return int(qtype)


def aligned_buffer(nbytes: int) -> np.ndarray:
    """A writable uint8 array of `nbytes` bytes starting on a TENSOR_ALIGNMENT boundary
    (a view of an allocation TENSOR_ALIGNMENT bytes larger)."""
    return aligned_empty(nbytes, TENSOR_ALIGNMENT)


def held_bytes(buffer: np.ndarray) -> int:
    """Bytes of the allocation behind `buffer` (an `aligned_buffer` or a plain array)."""
    return buffer.base.nbytes if isinstance(buffer.base, np.ndarray) else buffer.nbytes


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def preadv_exactly(fd: int, views: list[memoryview], offset: int, path: Path) -> None:
    """Fill `views` (writable byte memoryviews, in file order) from file bytes
    starting at `offset`, retrying short reads; ModelFormatError at end of file."""
    pending = [v for v in views if v.nbytes]
    while pending:
        batch = pending[:_IOV_MAX]
        n = os.preadv(fd, batch, offset)
        if n == 0:
            raise ModelFormatError(f"{path}: unexpected end of file at byte {offset:,}")
        offset += n
        done = 0
        while done < len(batch) and n >= batch[done].nbytes:
            n -= batch[done].nbytes
            done += 1
        rest = pending[done:]
        if n:
            rest[0] = rest[0][n:]
        pending = rest


def read_tensor(fd: int, info: TensorInfo, dst: np.ndarray, path: Path, row_order: np.ndarray | None = None) -> None:
    """Read tensor `info` into `dst` (uint8, info.nbytes).  row_order: destination
    row i receives the file's row row_order[i] (rows of a 1-D tensor are its elements)."""
    if row_order is None:
        preadv_exactly(fd, [memoryview(dst)], info.offset, path)
        return
    rows = dst.reshape(len(row_order), -1)
    target = np.empty_like(row_order)
    target[row_order] = np.arange(len(row_order))          # file row j -> destination row target[j]
    preadv_exactly(fd, [memoryview(rows[i]) for i in target.tolist()], info.offset, path)


HEAD_TYPES = ("stored", "q4_0")


def head_bytes_as_loaded(head: TensorInfo, head_type: str) -> int:
    """Bytes the output head `head` holds once loaded with `head_type`: as
    stored, or under "q4_0" its Q4_0 size where that is smaller (only then is
    it re-quantised).  The loader and the --memory-limit plan both use this."""
    if head_type == "q4_0":
        return min(head.nbytes, tensor_nbytes(Q4_0, head.n_elements))
    return head.nbytes


class ResidentWeights:
    """Every weight of a GGUF model in DRAM (see the module docstring): the weight
    source of a `NativeDecoder`.  weight_bytes: bytes held by all weight buffers
    (tensor bytes plus at most TENSOR_ALIGNMENT bytes of padding per tensor and
    buffer); tensor_bytes: the tensors' own bytes (the final norm as float32).

    head_type "q4_0" re-quantises an output head stored with more than Q4_0's
    4.5 bits per weight to Q4_0 as it loads (`_read_as_q4_0`); a tied model's
    one table then serves the embedding lookups as Q4_0 too.  For a draft
    model: its head is read in full by every draft forward (a third of
    Qwen2.5-0.5B's bytes per forward at Q8_0), and what the draft proposes
    never changes the target's output, only how often it is accepted."""

    def __init__(self, g: GGUFFile, cfg: ModelConfig, head_type: str = "stored"):
        if head_type not in HEAD_TYPES:
            raise ValueError(f"head_type must be one of {', '.join(HEAD_TYPES)}, got {head_type!r}")
        self.path = g.path
        self._check_types(g, cfg)
        with open_regular(g.path) as f:
            if os.fstat(f.fileno()).st_size != g.file_size:
                raise ModelFormatError(f"{g.path}: the file changed size since its header was read")
            fd = f.fileno()
            self.buffers, self.layouts = [], []
            for i in range(cfg.n_layers):
                buffer, layout = self._read_layer(fd, g, cfg, i)
                self.buffers.append(buffer)
                self.layouts.append(layout)
            embed = g.tensors["token_embd.weight"]
            head = embed if cfg.tie_word_embeddings else g.tensors["output.weight"]
            to_q4_0 = head_bytes_as_loaded(head, head_type) < head.nbytes
            head_qtype = Q4_0 if to_q4_0 else head.qtype
            if cfg.tie_word_embeddings:
                self.embedding = _read_as_q4_0(fd, head, g.path) if to_q4_0 else _read_whole(fd, embed, g.path)
                self.head, self.embedding_qtype = self.embedding, head_qtype
            else:
                self.embedding, self.embedding_qtype = _read_whole(fd, embed, g.path), embed.qtype
                self.head = _read_as_q4_0(fd, head, g.path) if to_q4_0 else _read_whole(fd, head, g.path)
            head_qtype = repack_loaded(self.head, head_qtype, (cfg.vocab_size, cfg.hidden_size))
            if cfg.tie_word_embeddings:
                self.embedding_qtype = head_qtype
            self.head_parts = [(0, cfg.vocab_size, head_qtype)]
            norm = g.tensors["output_norm.weight"]
            raw = np.empty(norm.nbytes, dtype=np.uint8)
            read_tensor(fd, norm, raw, g.path)
            check_finite(g.path, norm.name, raw, norm.qtype)
            drop_page_cache(fd)
        self.norm = np.empty(cfg.hidden_size, dtype=np.float32)
        _native.dequantize(raw, norm.qtype, self.norm)
        self.vocab_size, self.hidden_size = cfg.vocab_size, cfg.hidden_size
        held = self.buffers + [self.embedding] + ([] if cfg.tie_word_embeddings else [self.head])
        self.weight_bytes = sum(held_bytes(b) for b in held) + self.norm.nbytes
        parts = layer_parts(cfg, g)
        names = ["token_embd.weight"] + ([] if cfg.tie_word_embeddings else ["output.weight"])
        self.tensor_bytes = sum(g.tensors[n].nbytes for n in names) + self.norm.nbytes
        self.tensor_bytes += sum(part_info(g, i, p).nbytes for i in range(cfg.n_layers) for p in parts)
        self.tensor_bytes -= head.nbytes - self.head.nbytes            # a head read as Q4_0
    @staticmethod
    def _check_types(g: GGUFFile, cfg: ModelConfig) -> None:
        for i in range(cfg.n_layers):
            for part in layer_parts(cfg, g):
                info = part_info(g, i, part)
                check_type(g.path.name, info.name, info.qtype, len(info.shape) == 2, _TORCH_HINT)
        for name in ("token_embd.weight", "output.weight"):
            if name in g.tensors:
                check_type(g.path.name, name, g.tensors[name].qtype, True, _TORCH_HINT)
        check_type(g.path.name, "output_norm.weight", g.tensors["output_norm.weight"].qtype, False, _TORCH_HINT)

    @staticmethod
    def _read_layer(fd: int, g: GGUFFile, cfg: ModelConfig, i: int):
        """(buffer, LayerLayout) of decoder layer i, its tensors read from the file."""
        parts = layer_parts(cfg, g)
        infos = [part_info(g, i, part) for part in parts]
        offsets = np.cumsum([0] + [_round_up(t.nbytes, TENSOR_ALIGNMENT) for t in infos]).tolist()
        buffer = aligned_buffer(offsets[-1])
        entries = []
        for part, info, offset in zip(parts, infos, offsets):
            view = buffer[offset:offset + info.nbytes]
            read_tensor(fd, info, view, g.path, part_row_order(part, info.shape[0]))
            check_finite(g.path, info.name, view, info.qtype)          # before repacking moves the scales
            entries.append((part.name, offset, repack_loaded(view, info.qtype, tuple(info.shape)),
                            tuple(info.shape)))
        return buffer, _native.LayerLayout(entries)

    # -- the weight source interface (native_decoder) --------------------------

    def layer(self, i: int):
        return self.buffers[i], _no_release

    def head_part(self, k: int):
        return self.head, _no_release

    def embed(self, native, ids: np.ndarray, out: np.ndarray) -> None:
        check_token_ids(ids, self.vocab_size)
        native.embed(self.embedding, self.embedding_qtype, self.vocab_size, ids, out)

    def head_rows(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """(uint8 [len(ids), row bytes], ggml type): the output head's rows of
        token ids `ids` in their ggml layout, restored where the head is
        repacked (the early-exit probe's lens, lever.probe)."""
        check_token_ids(ids, self.vocab_size)
        qtype = self.head_parts[0][2]
        base = _native.base_type(qtype)
        if base != qtype:  # repacked: restore the rows' original blocks
            rows = _native.unpack_rows(self.head, qtype, self.vocab_size, self.hidden_size,
                                       np.asarray(ids, dtype=np.int64).tolist())
            return rows, base
        return self.head.reshape(self.vocab_size, -1)[ids], qtype


def check_token_ids(ids: np.ndarray, vocab_size: int) -> None:
    """ValueError naming the first id of `ids` outside 0..vocab_size-1."""
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise ValueError(f"token id {int(bad[0])} is outside the vocabulary (0..{vocab_size - 1})")


def drop_page_cache(fd: int) -> None:
    """Ask the kernel to drop the page cache of the whole file open as `fd`
    (its bytes are all copied out): page cache counts against the memory
    cgroup.  A no-op where posix_fadvise is missing (not Linux); advice only,
    so pages mapped or dirty elsewhere may stay."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _read_whole(fd: int, info: TensorInfo, path: Path) -> np.ndarray:
    """Tensor `info` of the file at `path` (open as `fd`) in a new aligned buffer;
    ModelFormatError if it holds a NaN or infinity (lever.gguf.finite)."""
    buffer = aligned_buffer(info.nbytes)
    read_tensor(fd, info, buffer, path)
    check_finite(path, info.name, buffer, info.qtype)
    return buffer


Q4_0_CHUNK_ROWS = 4096        # rows read, dequantised and re-quantised at a time by `_read_as_q4_0`


def _read_as_q4_0(fd: int, info: TensorInfo, path: Path) -> np.ndarray:
    """2-d tensor `info` of the file at `path`, re-quantised to Q4_0 into a new
    aligned buffer, Q4_0_CHUNK_ROWS rows at a time: the stored tensor is never
    held whole, so loading peaks at the Q4_0 buffer plus one chunk (stored
    bytes and float32 values), not at both copies."""
    rows, cols = info.shape
    stored_row = info.nbytes // rows
    out = aligned_buffer(tensor_nbytes(Q4_0, info.n_elements)).reshape(rows, -1)
    nan = inf = 0
    for first in range(0, rows, Q4_0_CHUNK_ROWS):
        n = min(Q4_0_CHUNK_ROWS, rows - first)
        raw = np.empty(n * stored_row, dtype=np.uint8)
        preadv_exactly(fd, [memoryview(raw)], info.offset + first * stored_row, path)
        counts = nonfinite_counts(raw, info.qtype)
        nan, inf = nan + counts[0], inf + counts[1]
        if not (nan or inf):
            out[first:first + n] = quantize_q4_0(dequantize(raw, info.qtype, (n, cols)))
    refuse_nonfinite(path, info.name, info.qtype, nan, inf)
    return out.reshape(-1)


def _no_release() -> None:
    pass


def load_gguf_native(path, dtype="bfloat16", head_type: str = "stored") -> tuple[NativeDecoder, GGUFFile]:
    """A `NativeDecoder` over every weight of the GGUF file at `path` (or an
    already parsed `GGUFFile`: its header is not read again), read into DRAM; dtype: its KV cache's element type ("float32" or "bfloat16");
    head_type: "stored" or "q4_0" (`ResidentWeights`).  Also
    returns the parsed file (metadata, tokenizer).  The file's page cache is
    released once its tensors are read (posix_fadvise DONTNEED: it would count
    against the memory cgroup)."""
    g = path if isinstance(path, GGUFFile) else GGUFFile(path)
    cfg = config_from_gguf(g)
    weights = ResidentWeights(g, cfg, head_type)
    model = NativeDecoder(cfg, weights, dtype)
    for i, layout in enumerate(weights.layouts):
        try:
            model.native.check_layout(layout, weights.buffers[i].nbytes)
        except ValueError as err:
            raise ModelFormatError(f"{g.path}: layer {i}: {err}") from None
    return model, g

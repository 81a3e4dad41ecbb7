"""Semantic checks of a parsed store manifest: layout, extents, tensors.

A converted store is fully determined by its tensors, so the checks demand
exactly what `convert` writes: extents in pass order (layers, head parts,
embedding parts when untied, globals) back to back from byte 0 to the end of
weights.bin, each padded to the alignment and checksummed per chunk; inside
an extent, the tensors its kind needs with the shapes the config implies,
back to back on TENSOR_ALIGNMENT boundaries.  A repacked type id (1000 +
the ggml id, csrc/kernels/repack.h) is allowed only where `convert` may
write one: in a ``repacked`` store, for a matrix with a repacked form (rows a
multiple of 8), not in an embedding part, and in a head part starting on a
multiple of 8 rows; sizes are those of its base type (the repacked bytes are
a permutation).  Each check raises a `StoreError` naming the manifest and the
field.  Sizes are in bytes.
"""

from __future__ import annotations

from pathlib import Path

from .. import quant
from ..errors import StoreError
from ..model_config import layer_shapes

MAX_CHUNK_BYTES = 1 << 30
MAX_ALIGNMENT = 1 << 20
READ_GRANULE = 4096                # the flash reader's offset / length granularity
REPACK_ROWS = 8                    # rows per interleaved group of a repacked matrix


def _fail(path: Path, problem: str):
    raise StoreError(f"{path}: {problem}; re-run `lever convert`")


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _power_of_two(n: int) -> bool:
    return n > 0 and not n & (n - 1)


def check_geometry(m, path: Path, storage_formats: tuple[str, ...], weight_layouts: tuple[str, ...]) -> None:
    """alignment and chunk_bytes: powers of two the reader accepts; a known storage
    format and weight layout."""
    if not (_power_of_two(m.alignment) and READ_GRANULE <= m.alignment <= MAX_ALIGNMENT):
        _fail(path, f"alignment {m.alignment} is not a power of two in {READ_GRANULE}..{MAX_ALIGNMENT}")
    if not (_power_of_two(m.chunk_bytes) and READ_GRANULE <= m.chunk_bytes <= MAX_CHUNK_BYTES):
        _fail(path, f"chunk_bytes {m.chunk_bytes} is not a power of two in {READ_GRANULE}..{MAX_CHUNK_BYTES}")
    if m.storage not in storage_formats:
        _fail(path, f"storage {m.storage!r} is not one of {', '.join(storage_formats)}")
    if m.weight_layout not in weight_layouts:
        _fail(path, f"weight_layout {m.weight_layout!r} is not one of {', '.join(weight_layouts)}")


def expected_extent_names(m) -> list[str]:
    """Extent names in the order convert writes them, head / embedding part
    counts taken from the manifest itself."""
    names = [e.name for e in m.extents]
    n_head = sum(n.startswith("head.") for n in names)
    n_embed = 0 if m.config.tie_word_embeddings else max(1, sum(n.startswith("embed.") for n in names))
    return ([f"layer.{i}" for i in range(m.config.n_layers)] + [f"head.{k}" for k in range(max(1, n_head))]
            + [f"embed.{k}" for k in range(n_embed)] + ["globals"])


def check_extent_names(m, path: Path) -> None:
    """Exactly the extents the config needs, each once, in pass order."""
    names = [e.name for e in m.extents]
    expected = expected_extent_names(m)
    missing = [n for n in expected if n not in names]
    if missing:
        raise StoreError(f"{path}: incomplete store (missing {', '.join(missing[:3])}); re-run `lever convert`")
    for i, name in enumerate(names):
        if name not in expected or names.index(name) != i:
            _fail(path, f"extents[{i}] {name!r} is not an extent this store can hold "
                        f"({'a duplicate' if name in expected else 'unknown'})")
    for i, (name, want) in enumerate(zip(names, expected)):
        if name != want:
            _fail(path, f"extents[{i}] is {name!r}, expected {want!r} (extents are listed in pass order)")


def check_layout(m, path: Path) -> None:
    """Extents back to back from byte 0 to weights_bytes, padded and chunk-checksummed."""
    pos = 0
    for i, e in enumerate(m.extents):
        where = f"extent {e.name} is inconsistent (extents[{i}]"
        if e.offset != pos:
            _fail(path, f"{where}.offset {e.offset:,}, expected {pos:,}: extents lie back to back)")
        if e.data_bytes < 1 or e.length != _round_up(e.data_bytes, m.alignment):
            _fail(path, f"{where}: length {e.length:,} is not data_bytes {e.data_bytes:,} padded to "
                        f"the alignment {m.alignment})")
        n_chunks = -(-e.length // m.chunk_bytes)
        if len(e.chunk_crc32c) != n_chunks:
            _fail(path, f"{where}.chunk_crc32c holds {len(e.chunk_crc32c)} checksums, "
                        f"its {e.length:,} bytes make {n_chunks} chunks)")
        pos += e.length
    if pos != m.weights_bytes:
        _fail(path, f"weights_bytes {m.weights_bytes:,} is not the extents' total {pos:,}")


def expected_tensors(m, e) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape (outermost first) that extent `e` must hold."""
    cfg = m.config
    if e.kind == "layer":
        return layer_shapes(cfg)
    if e.kind in ("head", "embed"):
        rows = e.rows[1] - e.rows[0] if e.rows else 0
        return {"weight": (rows, cfg.hidden_size)}
    return {"norm.weight": (cfg.hidden_size,)}


def check_rows(m, path: Path) -> None:
    """Head and embedding parts hold consecutive row ranges covering the vocabulary."""
    for i, e in enumerate(m.extents):
        if (e.kind in ("head", "embed")) != (e.rows is not None):
            _fail(path, f"extents[{i}].rows: {e.name} {'needs' if e.rows is None else 'cannot have'} a row range")
    for kind in ("head", "embed"):
        end = 0
        for e in m.by_kind(kind):
            if e.rows[0] != end or e.rows[1] <= e.rows[0]:
                _fail(path, f"extent {e.name}: rows {list(e.rows)} do not continue from row {end}")
            end = e.rows[1]
        if m.by_kind(kind) and end != m.config.vocab_size:
            _fail(path, f"the {kind} parts end at row {end:,}, not at vocab_size {m.config.vocab_size:,}")


def tensor_problem(t) -> str | None:
    """None if the tensor's type is one Lever reads and nbytes (bytes) matches its
    shape; a repacked type takes the bytes of its base type."""
    qtype = quant.base_type(t.qtype)
    if not quant.is_supported(qtype):
        return f"qtype {t.qtype} is not a type Lever can read"
    n = 1
    for d in t.shape:
        n *= d
    block, size = quant.block_size(qtype), quant.type_size(qtype)
    if t.shape[-1] % block:
        return f"rows of {t.shape[-1]} elements are not whole {quant.type_name(qtype)} blocks of {block}"
    if n % block:
        return f"{n} elements are not whole {quant.type_name(qtype)} blocks of {block}"
    if t.nbytes != n // block * size:
        return f"nbytes {t.nbytes:,} is not the {n // block * size:,} its shape and qtype take"
    return None


def layout_problem(m, e, t) -> str | None:
    """None unless tensor `t` of extent `e` has a repacked type id where `convert`
    never writes one (see the module doc)."""
    if not quant.is_repacked(t.qtype):
        return None
    base = quant.base_type(t.qtype)
    if m.weight_layout != "repacked":
        return f"qtype {t.qtype} is a repacked type in a store whose weight_layout is {m.weight_layout!r}"
    if not quant.repackable(base, t.shape):
        return (f"qtype {t.qtype} is a repacked {quant.type_name(base)}, which a tensor of shape "
                f"{list(t.shape)} cannot be (2-D, rows a multiple of 8)")
    if e.kind == "embed":
        return f"qtype {t.qtype} is a repacked type in an embedding part (kept in the GGUF layout)"
    if e.kind == "head" and e.rows[0] % REPACK_ROWS:
        return f"qtype {t.qtype} is a repacked type in a head part starting at row {e.rows[0]:,}, " \
               f"not a multiple of {REPACK_ROWS}"
    return None


def check_tensors(m, path: Path, tensor_alignment: int) -> None:
    """Each extent holds its tensors with the right shapes, sizes and offsets."""
    for i, e in enumerate(m.extents):
        expected = expected_tensors(m, e)
        names = [t.name for t in e.tensors]
        if sorted(names) != sorted(expected) or len(set(names)) != len(names):
            _fail(path, f"extent {e.name} holds tensors {names}, expected {sorted(expected)}")
        end = 0
        for j, t in enumerate(e.tensors):
            where = f"extents[{i}].tensors[{j}] ({e.name} {t.name})"
            if tuple(t.shape) != tuple(expected[t.name]):
                _fail(path, f"{where}: shape {list(t.shape)}, the config implies {list(expected[t.name])}")
            problem = tensor_problem(t) or layout_problem(m, e, t)
            if problem:
                _fail(path, f"{where}: {problem}")
            if t.offset != _round_up(end, tensor_alignment):
                _fail(path, f"{where}: offset {t.offset:,}, expected {_round_up(end, tensor_alignment):,} "
                            f"(tensors lie back to back on {tensor_alignment}-byte boundaries)")
            end = t.offset + t.nbytes
        if end != e.data_bytes:
            _fail(path, f"extent {e.name}: data_bytes {e.data_bytes:,} is not the end of its last tensor {end:,}")

"""The flash store's layout: `manifest.json` beside one `weights.bin`.

`weights.bin` is a sequence of *extents*, each starting on a 4 KiB boundary
and padded to a multiple of 4 KiB, so one extent is one large O_DIRECT read:

- ``layer.N``   every tensor of decoder layer N, back to back;
- ``head.K``    a group of rows of the output matrix (the head is split into
                parts of about one layer's size so streaming buffers stay small);
- ``embed.K``   rows of the embedding table (absent for tied models, whose
                embedding rows are read from the head parts);
- ``globals``   the final norm.

Each extent carries CRC32C checksums of its `chunk_bytes`-sized chunks (padding
included), which the reader verifies as the chunks arrive (over the bytes as
stored).  Offsets and sizes are in bytes.

Each tensor records its type id.  The storage format decides the blocks:
``source`` keeps the GGUF's (e.g. Q4_K), ``bf16`` dequantises.  The weight
layout (format version 3, `weight_layout`) decides their order:
``repacked`` (the default of `lever convert`) writes every matrix of a type in
`lever.quant.REPACKABLE_TYPES` whose rows are a multiple of 8 in groups of 8
interleaved rows (csrc/kernels/repack.h), recorded under the repacked type id
(1000 + the ggml id): a permutation of the GGUF bytes, the same size, the
same results from the kernels, read in place like any other matrix.
Embedding parts (``embed.K``, looked up row by row) keep the GGUF layout;
head parts start on multiples of 64 rows, so a repacked head part is whole
groups (a tied model's embedding rows are restored from them on lookup).
``gguf`` keeps the GGUF's row order everywhere, for CPUs without repacked
kernels (and is what a ``bf16`` store records: BF16 has no repacked form).

Integrity (since format version 2): `manifest_sha256` is the SHA-256 of the
manifest's own canonical content (`manifest_json.digest`) and
`tokenizer_sha256` that of tokenizer_metadata.json, so an edited manifest --
a changed hyperparameter, a moved offset, two layers swapped with their
checksums -- is refused at open, as is an edited tokenizer.  Loading also
checks every field (`manifest_json`, `validate`) and opens only regular files
inside the store (`safe_files`).

Versions: 3 is written; 2 (no `weight_layout`: every tensor in the GGUF
layout) is still read, as a ``gguf``-layout store; 1 (no checksum) and
versions newer than 3 are refused in one line with what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..atomic_write import write_atomic
from ..errors import StoreError
from ..files import file_kind
from ..model_config import ModelConfig, checked_config
from . import validate
from .manifest_json import CHECKSUM_FIELD, Fields, digest, parse_json
from .safe_files import read_store_file, store_file

STORE_FORMAT = "lever-store"
FORMAT_VERSION = 3                # the version `lever convert` writes
READABLE_VERSIONS = (2, 3)        # 2: no weight_layout field, every tensor in the GGUF layout
WEIGHT_LAYOUTS = ("repacked", "gguf")
DEFAULT_WEIGHT_LAYOUT = "repacked"
ALIGNMENT = 4096                  # bytes; extent start and length granularity
CHUNK_BYTES = 1 << 20             # bytes per checksummed chunk
TENSOR_ALIGNMENT = 64             # bytes; tensors inside an extent start on this boundary
STORAGE_FORMATS = ("source", "bf16")
MANIFEST = "manifest.json"
WEIGHTS = "weights.bin"
TOKENIZER = "tokenizer_metadata.json"
MAX_MANIFEST_BYTES = 64 << 20     # bytes; a real manifest is well under 1 MB
MAX_TOKENIZER_BYTES = 1 << 30     # bytes
_REBUILD = "re-run `lever convert` to rebuild the store"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor inside an extent; `offset` is relative to the extent start."""

    name: str                     # Decoder parameter name, layer prefix removed for layers
    qtype: int                    # type id of the stored bytes: ggml's, or a repacked id (1000 + ggml's)
    shape: tuple[int, ...]        # outermost first
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Extent:
    """A contiguous, aligned byte range of weights.bin read in one go."""

    name: str                     # "layer.3", "head.0", "embed.1", "globals"
    offset: int                   # bytes from the start of weights.bin, 4 KiB aligned
    length: int                   # bytes, a multiple of 4 KiB (includes padding)
    data_bytes: int               # bytes before the padding
    chunk_crc32c: tuple[int, ...]
    tensors: tuple[TensorEntry, ...]
    rows: tuple[int, int] | None = None    # [first, end) rows of the head / embedding

    @property
    def kind(self) -> str:
        return self.name.split(".")[0]

    @property
    def index(self) -> int:
        return int(self.name.split(".")[1]) if "." in self.name else 0

    def tensor(self, name: str) -> TensorEntry:
        for t in self.tensors:
            if t.name == name:
                return t
        raise StoreError(f"extent {self.name} has no tensor {name!r}")


@dataclass
class StoreManifest:
    config: ModelConfig
    storage: str                  # "source" (the GGUF's block types) or "bf16"
    weights_bytes: int            # exact size of weights.bin
    extents: list[Extent]
    source: dict = field(default_factory=dict)
    chunk_bytes: int = CHUNK_BYTES
    alignment: int = ALIGNMENT
    format: str = STORE_FORMAT
    format_version: int = FORMAT_VERSION
    tokenizer_sha256: str = ""    # hex SHA-256 of tokenizer_metadata.json
    weight_layout: str = DEFAULT_WEIGHT_LAYOUT    # "repacked" or "gguf" (version 2 stores: "gguf")

    # -- views ---------------------------------------------------------------

    def by_kind(self, kind: str) -> list[Extent]:
        return sorted((e for e in self.extents if e.kind == kind), key=lambda e: e.index)

    @property
    def layers(self) -> list[Extent]:
        return self.by_kind("layer")

    @property
    def head_parts(self) -> list[Extent]:
        return self.by_kind("head")

    @property
    def embedding_parts(self) -> list[Extent]:
        """Extents holding embedding rows: the head parts when the model is tied."""
        return self.head_parts if self.config.tie_word_embeddings else self.by_kind("embed")

    @property
    def globals(self) -> Extent:
        return self.by_kind("globals")[0]

    # -- (de)serialisation ---------------------------------------------------

    @property
    def repacked(self) -> bool:
        """True if the store's matrices are in the repacked layout (where they have one)."""
        return self.weight_layout == "repacked"

    def to_json(self) -> dict:
        """The manifest as JSON values, sealed with its checksum (`manifest_sha256`);
        a version 2 manifest without the field it lacks (`weight_layout`), so
        that its checksum is the one it was written with."""
        d = asdict(self)
        d["config"] = asdict(self.config)
        if self.format_version == 2:
            del d["weight_layout"]
        d = json.loads(json.dumps(d))              # tuples -> lists, as they will be read back
        d[CHECKSUM_FIELD] = digest(d)
        return d

    def save(self, directory: Path) -> None:
        """Write manifest.json atomically (lever.atomic_write: temp file, fsync,
        rename; SaveError naming it if it cannot be written)."""
        write_atomic(Path(directory) / MANIFEST, json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "StoreManifest":
        """Read a store's manifest and validate it (every field, its checksum)
        against the store's files; StoreError naming the field otherwise."""
        d = Path(directory)
        if not d.is_dir():
            raise StoreError(f"{d}: no such store directory")
        if not os.path.lexists(d / MANIFEST):
            raise StoreError(f"{d}: not a Lever store ({MANIFEST} is missing; "
                             f"an interrupted conversion leaves none)")
        path = store_file(d, MANIFEST)
        raw = parse_json(read_store_file(path, MAX_MANIFEST_BYTES), path)
        if raw.get("format") != STORE_FORMAT:
            raise StoreError(f"{path}: not a Lever store manifest (format {raw.get('format')!r})")
        version = _readable_version(raw.get("format_version"), path)
        manifest = _from_json(raw, path, version)
        manifest.validate(d)
        if raw[CHECKSUM_FIELD] != digest(raw):
            raise StoreError(f"{path}: {CHECKSUM_FIELD} does not match the manifest's content "
                             f"(the manifest was edited or damaged); {_REBUILD}")
        manifest.check_files(d)
        return manifest

    def validate(self, directory: Path) -> None:
        """Check that every field is consistent with the others and the config."""
        path = directory / MANIFEST
        validate.check_geometry(self, path, STORAGE_FORMATS, WEIGHT_LAYOUTS)
        validate.check_extent_names(self, path)
        validate.check_rows(self, path)
        validate.check_layout(self, path)
        validate.check_tensors(self, path, TENSOR_ALIGNMENT)

    def check_files(self, directory: Path) -> None:
        """weights.bin has the manifest's size; tokenizer_metadata.json its checksum."""
        weights = store_file(directory, WEIGHTS)
        size = weights.stat().st_size
        if size != self.weights_bytes:
            raise StoreError(f"{weights}: size {size:,} bytes does not match the manifest's "
                             f"{self.weights_bytes:,} (truncated or replaced file)")
        tok = store_file(directory, TOKENIZER)
        if hashlib.sha256(read_store_file(tok, MAX_TOKENIZER_BYTES)).hexdigest() != self.tokenizer_sha256:
            raise StoreError(f"{tok}: its SHA-256 does not match the manifest's tokenizer_sha256 "
                             f"(edited or damaged); {_REBUILD}")

    # -- sizes ---------------------------------------------------------------

    def bytes_per_pass(self, streamed: list[Extent]) -> int:
        """Bytes read from flash per forward pass when `streamed` extents are not pinned."""
        return sum(e.length for e in streamed)


_TOP_FIELDS = ("format", "format_version", "config", "storage", "weights_bytes", "extents", "source",
               "chunk_bytes", "alignment", "tokenizer_sha256", CHECKSUM_FIELD)
_V3_FIELDS = ("weight_layout",)   # top-level fields version 3 added


def _readable_version(version, path: Path) -> int:
    """`version` if this Lever reads it; StoreError (one line: what to do) otherwise."""
    readable = " and ".join(map(str, READABLE_VERSIONS))
    if type(version) is int and version > FORMAT_VERSION:
        raise StoreError(f"{path}: store format version {version} is newer than this Lever reads "
                         f"(versions {readable}); update Lever, or re-run `lever convert` with this one")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise StoreError(f"{path}: store format version {version!r} is not "
                         f"supported (this Lever reads versions {readable}); {_REBUILD}")
    return version


def _from_json(raw: dict, path: Path, version: int) -> StoreManifest:
    """A StoreManifest from the parsed JSON of format `version`, every field type-checked."""
    top = Fields(raw, "", path)
    top.only(*_TOP_FIELDS, *(_V3_FIELDS if version >= 3 else ()))
    for key in (CHECKSUM_FIELD, "tokenizer_sha256"):
        value = top.str(key)
        if len(value) != 64 or value.strip("0123456789abcdef"):
            top.fail("must be 64 lowercase hex digits", key)
    config = checked_config(top.sub("config").obj, f"{path}: config", StoreError)
    source = _source(top.sub("source"))
    return StoreManifest(config=config, storage=top.str("storage"), weights_bytes=top.int("weights_bytes"),
                         extents=[_extent(e, f"extents[{i}]", path) for i, e in enumerate(top.list("extents"))],
                         source=source, chunk_bytes=top.int("chunk_bytes", 1), alignment=top.int("alignment", 1),
                         format_version=version, tokenizer_sha256=top.str("tokenizer_sha256"),
                         weight_layout=top.str("weight_layout") if version >= 3 else "gguf")


def _source(f: Fields) -> dict:
    """The `source` record (the GGUF the store was converted from, kept for
    looking up shipped tables by its SHA-256).  Its `path`, when given, must be
    a string naming a regular file or nothing that exists any more (the GGUF
    may have been deleted): never a device, FIFO or directory, which a reader
    of the source would block on or read without end."""
    if "path" in f.obj:
        source_path = f.str("path")
        try:
            mode = os.stat(source_path).st_mode
        except (OSError, ValueError):        # gone (or unnamable: a NUL byte): not read, nothing to refuse
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            f.fail(f"{_short(source_path)} is {file_kind(mode)}, not a GGUF file", "path")
    return f.obj


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _extent(obj, where: str, path: Path) -> Extent:
    f = Fields(obj, where, path)
    f.only("name", "offset", "length", "data_bytes", "chunk_crc32c", "tensors", "rows")
    rows = f.get("rows")
    if rows is not None:
        rows = f.ints("rows")
        if len(rows) != 2:
            f.fail("must be [first, end] or null", "rows")
    return Extent(name=f.str("name"), offset=f.int("offset"), length=f.int("length"),
                  data_bytes=f.int("data_bytes"), chunk_crc32c=f.ints("chunk_crc32c", 0, 2**32 - 1),
                  tensors=tuple(_tensor(t, f"{where}.tensors[{j}]", path) for j, t in enumerate(f.list("tensors"))),
                  rows=rows)


def _tensor(obj, where: str, path: Path) -> TensorEntry:
    f = Fields(obj, where, path)
    f.only("name", "qtype", "shape", "offset", "nbytes")
    shape = f.ints("shape", 1, 1 << 32)
    if not 1 <= len(shape) <= 2:
        f.fail(f"must have 1 or 2 dimensions, has {len(shape)}", "shape")
    return TensorEntry(f.str("name"), f.int("qtype", 0, 1 << 16), shape, f.int("offset"), f.int("nbytes"))

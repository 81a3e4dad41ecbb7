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
included), which
the reader verifies as the chunks arrive.  Tensors keep a ggml type id: the
store's storage format decides whether that is the source's block format
(e.g. Q4_K) or BF16.  Offsets and sizes are in bytes.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import StoreError
from ..model.config import ModelConfig

STORE_FORMAT = "lever-store"
FORMAT_VERSION = 1
ALIGNMENT = 4096                  # bytes; extent start and length granularity
CHUNK_BYTES = 1 << 20             # bytes per checksummed chunk
MANIFEST = "manifest.json"
WEIGHTS = "weights.bin"
TOKENIZER = "tokenizer_metadata.json"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor inside an extent; `offset` is relative to the extent start."""

    name: str                     # Decoder parameter name, layer prefix removed for layers
    qtype: int                    # ggml type id of the stored bytes
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

    def to_json(self) -> dict:
        d = asdict(self)
        d["config"] = asdict(self.config)
        return d

    def save(self, directory: Path) -> None:
        """Write manifest.json atomically (temp file + rename)."""
        tmp = directory / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, directory / MANIFEST)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "StoreManifest":
        """Read and validate a store's manifest against its weights.bin."""
        d = Path(directory)
        path = d / MANIFEST
        if not d.is_dir():
            raise StoreError(f"{d}: no such store directory")
        if not path.is_file():
            raise StoreError(f"{d}: not a Lever store ({MANIFEST} is missing; "
                             f"an interrupted conversion leaves none)")
        try:
            raw = json.loads(path.read_text())
            if raw.get("format") != STORE_FORMAT:
                raise StoreError(f"{path}: not a Lever store manifest (format {raw.get('format')!r})")
            if raw.get("format_version") != FORMAT_VERSION:
                raise StoreError(f"{path}: store format version {raw.get('format_version')} is not "
                                 f"supported (this Lever reads version {FORMAT_VERSION}); convert again")
            extents = [Extent(name=e["name"], offset=e["offset"], length=e["length"],
                              data_bytes=e["data_bytes"], chunk_crc32c=tuple(e["chunk_crc32c"]),
                              tensors=tuple(TensorEntry(t["name"], t["qtype"], tuple(t["shape"]),
                                                        t["offset"], t["nbytes"]) for t in e["tensors"]),
                              rows=tuple(e["rows"]) if e.get("rows") else None)
                       for e in raw["extents"]]
            manifest = cls(config=ModelConfig(**raw["config"]), storage=raw["storage"],
                           weights_bytes=raw["weights_bytes"], extents=extents,
                           source=raw.get("source", {}), chunk_bytes=raw["chunk_bytes"],
                           alignment=raw["alignment"])
        except StoreError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise StoreError(f"{path}: malformed manifest ({type(e).__name__}: {e})") from None
        manifest.validate(d)
        return manifest

    def validate(self, directory: Path) -> None:
        """Check that the manifest is self-consistent and matches weights.bin."""
        weights = directory / WEIGHTS
        if not weights.is_file():
            raise StoreError(f"{directory}: {WEIGHTS} is missing")
        size = weights.stat().st_size
        if size != self.weights_bytes:
            raise StoreError(f"{weights}: size {size:,} bytes does not match the manifest's "
                             f"{self.weights_bytes:,} (truncated or replaced file)")
        cfg = self.config
        names = {e.name for e in self.extents}
        missing = [f"layer.{i}" for i in range(cfg.n_layers) if f"layer.{i}" not in names]
        if missing or not self.head_parts or "globals" not in names:
            raise StoreError(f"{directory / MANIFEST}: incomplete store "
                             f"(missing {', '.join(missing[:3]) or 'head or globals extents'})")
        for e in self.extents:
            n_chunks = -(-e.length // self.chunk_bytes)
            if (e.offset % self.alignment or e.length % self.alignment or e.offset + e.length > size
                    or e.data_bytes > e.length or len(e.chunk_crc32c) != n_chunks):
                raise StoreError(f"{directory / MANIFEST}: extent {e.name} is inconsistent "
                                 f"(offset {e.offset:,}, length {e.length:,}, file {size:,} bytes)")
            for t in e.tensors:
                if t.offset + t.nbytes > e.data_bytes:
                    raise StoreError(f"{directory / MANIFEST}: tensor {t.name} overruns extent {e.name}")

    # -- sizes ---------------------------------------------------------------

    def bytes_per_pass(self, streamed: list[Extent]) -> int:
        """Bytes read from flash per forward pass when `streamed` extents are not pinned."""
        return sum(e.length for e in streamed)

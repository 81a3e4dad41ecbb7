"""A GGUF file's tokenizer metadata (llama.cpp's key names) -> a `tokenizers.Tokenizer`.

`tokenizer.ggml.model` picks the kind (lever.model.tokenizer_recipe):

* ``gpt2``: byte-level BPE (Qwen2/3, Llama 3, SmolLM, GPT-2, StarCoder,
  DeepSeek-Coder, ...), with the merges of the file and the pre-tokenizer
  family `tokenizer.ggml.pre` names (lever.model.pretokenizers; a missing
  one is ``default``, GPT-2's regex); an unknown family is refused.
* ``llama``: SentencePiece (Llama 2, Mistral, Phi-3, Gemma 3): tokens,
  scores and token types; merges derived from the scores where the file
  has none (lever.model.tokenizer_spm); the dummy prefix space unless
  `tokenizer.ggml.add_space_prefix` is false (Gemma 3).
* ``gemma4``: SentencePiece-style BPE with the file's merges, no prefix.

Token types (`tokenizer.ggml.token_type`): control (3) and unknown (2)
tokens become special added tokens, user-defined ones (4, e.g. Qwen's
``<tool_call>``) non-special added tokens; both are matched whole in text,
the special ones only while special tokens are parsed.  `decode(...,
skip_special_tokens=True)` drops only the special ones, as Hugging Face does.

BOS / EOS: `tokenizer.ggml.add_bos_token` / `add_eos_token` when the file
has them, else llama.cpp's defaults: BOS for SentencePiece and the Llama 3
family, no EOS.  llama.cpp always adds BOS for gemma4 vocabularies
(the file's flag notwithstanding), and so does Lever.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO, Mapping

from tokenizers import Tokenizer as _RustTokenizer
from tokenizers import models

from ..errors import ModelFormatError, UnsupportedModelError
from ..files import open_regular
from . import tokenizer_spm
from .pretokenizers import FAMILIES, SUPPORTED, byte_alphabet
from .tokenizer_recipe import BYTE_LEVEL, SENTENCEPIECE, AddedSpec, Recipe

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
ADDED_TYPES = {TOKEN_UNKNOWN: True, TOKEN_CONTROL: True, TOKEN_USER_DEFINED: False}   # type -> special

# tokenizer.ggml.model -> the kind it is built as
MODELS = {"gpt2": BYTE_LEVEL, "llama": SENTENCEPIECE, "gemma4": SENTENCEPIECE}

# Phi-3's SentencePiece vocabulary: its chat markers eat the whitespace after
# them (rstrip, as in Phi-3's tokenizer.json and llama.cpp), except these.
PHI3_MARKERS = ("<|user|>", "<|assistant|>", "<|end|>")
PHI3_KEEP_WHITESPACE = ("<unk>", "<s>", "<|endoftext|>")

# Bump when the build changes, so that cached tokenizers are rebuilt.
BUILD_VERSION = 3
# Metadata keys the build depends on (all of them feed the cache key).
TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
)


@dataclass(frozen=True)
class SpecialInfo:
    """What `Tokenizer` keeps beside the tokenizer itself (the cache's sidecar file)."""

    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    add_bos: bool
    chat_template: str | None
    vocab_size: int
    extra_eos_ids: tuple[int, ...] = ()     # further EOS ids a config names (generation_config)
    add_eos: bool = False

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SpecialInfo":
        d = dict(d)
        d["extra_eos_ids"] = tuple(d.get("extra_eos_ids", ()))
        return cls(**d)


def cache_key(kind: str, digest: str) -> str:
    """The cache entry name: 32 hex digits over the build version, the kind of digest and the digest."""
    return hashlib.sha256(f"lever-tokenizer-v{BUILD_VERSION}\0{kind}\0{digest}".encode()).hexdigest()[:32]


def metadata_cache_key(md: Mapping[str, Any]) -> str:
    """Cache key of decoded metadata (a source that cannot hash its raw bytes):
    every value the build reads, as JSON."""
    h = hashlib.sha256()
    for key in TOKENIZER_KEYS:
        h.update(key.encode() + b"\0")
        h.update(json.dumps(md.get(key), ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return cache_key("json", h.hexdigest())


def source_cache_key(source) -> str:
    """Cache key of a tokenizer source without decoding its big arrays where it can:
    a GGUFFile hashes the raw bytes of the tokenizer key/values (`metadata_digest`),
    a metadata file its bytes (`file_digest`); anything else its decoded metadata."""
    if hasattr(source, "metadata_digest"):
        return cache_key("gguf", source.metadata_digest(TOKENIZER_KEYS))
    if hasattr(source, "file_digest"):
        return cache_key("file", source.file_digest())
    return metadata_cache_key(source.metadata)


def parse_merge(merge: str, index: int, source: str) -> tuple[str, str]:
    """A merge "LEFT RIGHT": split at the first space after the first
    character (as llama.cpp reads them), so a left part may start with one."""
    cut = merge.find(" ", 1)
    if cut < 0:
        raise ModelFormatError(f"{source}: malformed BPE merge #{index}: {merge!r} (no space between two tokens)")
    return merge[:cut], merge[cut + 1:]


class GGUFTokenizerBuilder:
    """Builds a `tokenizers.Tokenizer` from GGUF tokenizer metadata."""

    def __init__(self, metadata: Mapping[str, Any], source: str = "GGUF file"):
        self.md = metadata
        self.source = source
        self.model = metadata.get("tokenizer.ggml.model")
        if self.model is None:
            raise ModelFormatError(f"{source}: no tokenizer in the file (tokenizer.ggml.model is missing)")
        if self.model not in MODELS:
            raise UnsupportedModelError(
                f"{source}: tokenizer type {self.model!r} is not supported (supported: 'gpt2' byte-level BPE, "
                f"'llama' SentencePiece, 'gemma4')")
        self.kind = MODELS[self.model]
        self.family: str | None = None
        if self.kind == BYTE_LEVEL:
            self.family = metadata.get("tokenizer.ggml.pre", "default")
            if self.family not in FAMILIES:
                raise UnsupportedModelError(
                    f"{source}: pre-tokenizer {self.family!r} is not supported (supported: {', '.join(SUPPORTED)})")
        self.tokens: list[str] = list(metadata.get("tokenizer.ggml.tokens") or [])
        if not self.tokens:
            raise ModelFormatError(f"{source}: tokenizer.ggml.tokens is missing or empty")
        types = metadata.get("tokenizer.ggml.token_type")
        self.types: list[int] = list(types) if types is not None else [TOKEN_NORMAL] * len(self.tokens)
        if len(self.types) != len(self.tokens):
            raise ModelFormatError(f"{source}: {len(self.types)} token types for {len(self.tokens)} tokens")

    def cache_key(self) -> str:
        """The cache key of this builder's metadata (see `metadata_cache_key`)."""
        return metadata_cache_key(self.md)

    # ------------------------------------------------------------------ what is built

    def _token_id(self, key: str) -> int | None:
        v = self.md.get(key)
        return int(v) if v is not None and 0 <= int(v) < len(self.tokens) else None

    def _flag(self, key: str, default: bool) -> bool:
        v = self.md.get(key)
        return default if v is None else bool(v)

    def special_info(self) -> SpecialInfo:
        if self.model == "gemma4":
            add_bos = True                                   # llama.cpp overrides the file for gemma4
        elif self.kind == SENTENCEPIECE:
            add_bos = self._flag("tokenizer.ggml.add_bos_token", True)
        else:
            add_bos = self._flag("tokenizer.ggml.add_bos_token", FAMILIES[self.family].add_bos)
        return SpecialInfo(
            bos_token_id=self._token_id("tokenizer.ggml.bos_token_id"),
            eos_token_id=self._token_id("tokenizer.ggml.eos_token_id"),
            pad_token_id=self._token_id("tokenizer.ggml.padding_token_id"),
            add_bos=add_bos,
            add_eos=self._flag("tokenizer.ggml.add_eos_token", False),
            chat_template=self.md.get("tokenizer.chat_template"),
            vocab_size=len(self.tokens),
        )

    def recipe(self) -> Recipe:
        added = [(t, ADDED_TYPES[ty]) for t, ty in zip(self.tokens, self.types) if ty in ADDED_TYPES]
        if self.kind == BYTE_LEVEL:
            return Recipe(BYTE_LEVEL, family=self.family, added=tuple(AddedSpec(t, s) for t, s in added))
        texts = {t for t, special in added if special}
        phi3 = all(m in texts for m in PHI3_MARKERS)
        unk = self._token_id("tokenizer.ggml.unknown_token_id")
        if unk is None:
            unk = next((i for i, ty in enumerate(self.types) if ty == TOKEN_UNKNOWN), None)
        return Recipe(
            SENTENCEPIECE,
            space_prefix=self.model == "llama" and self._flag("tokenizer.ggml.add_space_prefix", True),
            unk_token=None if unk is None else self.tokens[unk],
            added=tuple(AddedSpec(t, s, rstrip=phi3 and t not in PHI3_KEEP_WHITESPACE) for t, s in added))

    def build(self) -> _RustTokenizer:
        recipe = self.recipe()
        try:
            bpe = models.BPE(vocab=self.vocab(), merges=self.merges, **recipe.bpe_options())
        except Exception as e:  # the Rust side rejects merges that name unknown tokens
            raise ModelFormatError(f"{self.source}: inconsistent BPE vocabulary/merges: {e}") from None
        tok = recipe.assemble(bpe)
        if tok.get_vocab_size(with_added_tokens=True) != len(self.tokens):
            raise ModelFormatError(f"{self.source}: built a vocabulary of "
                                   f"{tok.get_vocab_size(with_added_tokens=True)} tokens, expected {len(self.tokens)}")
        return tok

    def vocab(self) -> dict[str, int]:
        """token -> id.  Byte-level: ordinary tokens outside the byte alphabet (a
        mislabelled conversion) are respelled in it so BPE can reach them,
        unless the vocabulary has that spelling already (Command-R lists both
        "🇸" and its byte spelling: the literal one stays, unreachable by BPE
        as in llama.cpp); added tokens keep their literal text, as they are
        matched whole."""
        vocab = {}
        for i, t in enumerate(self.tokens):
            if t in vocab:
                raise ModelFormatError(f"{self.source}: token {t!r} appears twice (ids {vocab[t]} and {i})")
            vocab[t] = i
        if self.kind != BYTE_LEVEL:
            return vocab
        spelling = byte_alphabet()
        alphabet = set(spelling.values())
        for i, (t, ty) in enumerate(zip(self.tokens, self.types)):
            if ty not in ADDED_TYPES and not set(t) <= alphabet:
                respelled = "".join(spelling[b] for b in t.encode("utf-8"))
                if respelled not in vocab:
                    del vocab[t]
                    vocab[respelled] = i
        return vocab

    @cached_property
    def merges(self) -> list[tuple[str, str]]:
        """The file's merges; for a SentencePiece file without them, derived from the scores."""
        merges = self.md.get("tokenizer.ggml.merges")
        if merges:
            return [parse_merge(m, i, self.source) for i, m in enumerate(merges)]
        if self.model != "llama":
            raise ModelFormatError(f"{self.source}: a {self.model!r} tokenizer needs tokenizer.ggml.merges")
        scores = self.md.get("tokenizer.ggml.scores")
        if scores is None:
            raise ModelFormatError(f"{self.source}: a SentencePiece tokenizer needs tokenizer.ggml.scores "
                                   f"(or tokenizer.ggml.merges)")
        return tokenizer_spm.derive_merges(self.tokens, list(scores), self.types, self.source)


class MetadataFile:
    """GGUF tokenizer metadata kept as a JSON object in a file (a flash
    store's tokenizer_metadata.json): hashed as bytes (streamed,
    `file_digest`) and parsed only when `metadata` is first read."""

    MAX_BYTES = 1 << 30

    def __init__(self, path: Path):
        self.path = path
        self._metadata: dict | None = None

    def _open(self) -> BinaryIO:
        return open_regular(self.path)

    def file_digest(self) -> str:
        """SHA-256 (hex) of the file's bytes, read in pieces."""
        with self._open() as f:
            try:
                return hashlib.file_digest(f, "sha256").hexdigest()
            except OSError as e:
                raise ModelFormatError(f"{self.path}: cannot read the tokenizer metadata ({e})") from None

    @property
    def metadata(self) -> dict:
        if self._metadata is None:
            with self._open() as f:
                try:
                    size = os.fstat(f.fileno()).st_size
                    if size > self.MAX_BYTES:
                        raise ValueError(f"{size:,} bytes is more than {self.MAX_BYTES:,}")
                    value = json.loads(f.read())
                except (OSError, ValueError) as e:
                    raise ModelFormatError(f"{self.path}: cannot read the tokenizer metadata ({e})") from None
            if not isinstance(value, dict):
                raise ModelFormatError(f"{self.path}: the tokenizer metadata is not a JSON object")
            self._metadata = value
        return self._metadata

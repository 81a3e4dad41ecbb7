"""Text <-> token ids, chat templates, and streaming detokenisation.

`Tokenizer` wraps a `tokenizers.Tokenizer` (the Rust library behind Hugging
Face's fast tokenizers) and adds what the engine needs around it: the BOS/EOS
conventions of the model, its chat template, and a cache.  It is built offline
from one of three sources:

* a GGUF file (`Tokenizer.from_gguf`): the file stores the vocabulary, the BPE
  merges, the token types and a pre-tokenizer *name* (`tokenizer.ggml.pre`)
  under llama.cpp's key names.  `_GGUFTokenizerBuilder` turns that into a
  byte-level BPE tokenizer whose normaliser / pre-tokenizer is the one of the
  original Hugging Face `tokenizer.json` the GGUF was converted from.  Only
  byte-level BPE (`tokenizer.ggml.model == "gpt2"`) is supported.  The result
  is cached (`_TokenizerCache`: vocab.json, merges.txt and a sidecar with the
  special ids, chat template, pre-tokenizer and added tokens) under a key that
  hashes the *raw bytes* of the tokenizer metadata (`_source_cache_key`), so
  the build happens once per distinct tokenizer and a cache hit decodes no
  vocabulary or merges (GGUFFile leaves those arrays in the file until read).
* a flash store's tokenizer_metadata.json (`Tokenizer.from_metadata_file`):
  the same metadata as JSON; the key hashes the file, parsed only on a miss.
* a Hugging Face checkpoint directory (`Tokenizer.from_pretrained_dir`).

The pre-tokenizers (see `_PRE_TOKENIZERS`) follow the Hugging Face
`tokenizer.json` of each family, which llama.cpp's own regex lists for the same
names agree with:

* ``qwen2``: NFC normaliser, Qwen2's split regex (single digits, letters with
  one leading non-letter), byte-level without its own regex.
* ``smollm`` (also StarCoder): ``Digits(individual_digits=True)`` then the
  GPT-2 byte-level regex -- SmolLM2's tokenizer.json, and llama.cpp's
  ``["\\p{N}", <gpt2 regex>]``.  transformers' GGUF converter leaves the digit
  split out; that changes ids where whitespace precedes a digit
  (``"  5"``: ``["ĠĠ", "5"]`` here, ``["Ġ", "Ġ", "5"]`` without the split).
* ``llama-bpe`` / ``llama3``: Llama 3's split regex (digits in groups of 3)
  and BPE with ``ignore_merges`` as in Llama 3's tokenizer.json.
* ``default`` / ``gpt2``: plain GPT-2 byte-level.

Control tokens (type 3) become special added tokens and user-defined tokens
(type 4, e.g. Qwen's ``<tool_call>``) non-special added tokens, so either is
matched whole in text (``<|im_start|>`` is one id); `decode(...,
skip_special_tokens=True)` drops only the control ones, as Hugging Face does.

`IncrementalDecoder` turns a stream of ids into text pieces without ever
emitting half a UTF-8 character.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Iterable, Mapping, Sequence

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _RustTokenizer

from ..atomic_write import SaveError, remove_quietly, sweep_stale, temp_path, warn_unsaved, writing
from ..errors import LeverError, ModelFormatError, UnsupportedModelError
from ..files import open_regular
from .chat_template import default_renderer

if TYPE_CHECKING:
    from ..gguf.file import GGUFFile

log = logging.getLogger(__name__)

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Tokens that end a turn or a document in the common chat formats; those present
# in a vocabulary (as added/special tokens) join the model's EOS id as stop tokens.
END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
    "<end_of_turn>", "<|end|>", "<|return|>", "</s>",
)

# --------------------------------------------------------------------------- pre-tokenizers

_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
                r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
                 r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


@dataclass(frozen=True)
class _PreTokenizerSpec:
    """How one `tokenizer.ggml.pre` family splits text before BPE."""

    split: str | None = None        # regex applied (isolated) before byte-level, or None
    digits: bool = False            # split every digit on its own first (HF `Digits`)
    nfc: bool = False               # NFC-normalise the text first
    ignore_merges: bool = False     # BPE: take a pre-token found whole in the vocab as is

    def normalizer(self):
        return normalizers.NFC() if self.nfc else None

    def pre_tokenizer(self):
        if self.split is None:                   # GPT-2: the regex lives inside ByteLevel
            steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        else:
            steps = [pre_tokenizers.Split(Regex(self.split), behavior="isolated", invert=False),
                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        if self.digits:
            steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
        return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


_GPT2 = _PreTokenizerSpec()
_SMOLLM = _PreTokenizerSpec(digits=True)
_QWEN2 = _PreTokenizerSpec(split=_QWEN2_SPLIT, nfc=True)
_LLAMA3 = _PreTokenizerSpec(split=_LLAMA3_SPLIT, ignore_merges=True)

_PRE_TOKENIZERS: dict[str, _PreTokenizerSpec] = {
    "default": _GPT2, "gpt2": _GPT2, "gpt-2": _GPT2,
    "smollm": _SMOLLM, "starcoder": _SMOLLM,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3,
}
SUPPORTED_PRE_TOKENIZERS = tuple(sorted(_PRE_TOKENIZERS))


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# --------------------------------------------------------------------------- model facts


@dataclass(frozen=True)
class _SpecialInfo:
    """What `Tokenizer` keeps beside `tokenizer.json` (the cache's sidecar file)."""

    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    add_bos: bool
    chat_template: str | None
    vocab_size: int
    extra_eos_ids: tuple[int, ...] = ()     # further EOS ids a config names (generation_config)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "_SpecialInfo":
        d = dict(d)
        d["extra_eos_ids"] = tuple(d.get("extra_eos_ids", ()))
        return cls(**d)


# --------------------------------------------------------------------------- GGUF -> tokenizer


def _assemble(bpe, spec: _PreTokenizerSpec, added: Sequence[tuple[str, bool]]) -> _RustTokenizer:
    """A byte-level BPE tokenizer around `bpe`: `spec`'s normalizer and pre-tokenizer,
    the byte-level decoder, and the `added` (text, special) tokens matched whole."""
    tok = _RustTokenizer(bpe)
    normalizer = spec.normalizer()
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = spec.pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    control = [AddedToken(t, special=True, normalized=False) for t, special in added if special]
    user = [AddedToken(t, special=False, normalized=False) for t, special in added if not special]
    if control:
        tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)
    return tok


# Bump when the build changes, so that cached tokenizers are rebuilt.
_BUILD_VERSION = 2
# Metadata keys the build depends on (all of them feed the cache key).
_TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
)


def _cache_key(kind: str, digest: str) -> str:
    """The cache entry name: 32 hex digits over the build version, the kind of digest and the digest."""
    return hashlib.sha256(f"lever-tokenizer-v{_BUILD_VERSION}\0{kind}\0{digest}".encode()).hexdigest()[:32]


def _metadata_cache_key(md: Mapping[str, Any]) -> str:
    """Cache key of decoded metadata (a source that cannot hash its raw bytes):
    every value the build reads, as JSON."""
    h = hashlib.sha256()
    for key in _TOKENIZER_KEYS:
        h.update(key.encode() + b"\0")
        h.update(json.dumps(md.get(key), ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return _cache_key("json", h.hexdigest())


def _source_cache_key(source) -> str:
    """Cache key of a tokenizer source without decoding its big arrays where it can:
    a GGUFFile hashes the raw bytes of the tokenizer key/values (`metadata_digest`),
    a metadata file its bytes (`file_digest`); anything else falls back to its decoded metadata."""
    if hasattr(source, "metadata_digest"):
        return _cache_key("gguf", source.metadata_digest(_TOKENIZER_KEYS))
    if hasattr(source, "file_digest"):
        return _cache_key("file", source.file_digest())
    return _metadata_cache_key(source.metadata)


class _GGUFTokenizerBuilder:
    """Builds a byte-level BPE `tokenizers.Tokenizer` from GGUF tokenizer metadata."""

    def __init__(self, metadata: Mapping[str, Any], source: str = "GGUF file"):
        self.md = metadata
        self.source = source
        model = metadata.get("tokenizer.ggml.model")
        if model is None:
            raise ModelFormatError(f"{source}: no tokenizer in the file (tokenizer.ggml.model is missing)")
        if model != "gpt2":
            raise UnsupportedModelError(
                f"{source}: tokenizer type {model!r} is not supported; Lever builds byte-level BPE "
                f"tokenizers only (tokenizer.ggml.model 'gpt2')")
        self.pre_name = metadata.get("tokenizer.ggml.pre", "default")
        if self.pre_name not in _PRE_TOKENIZERS:
            raise UnsupportedModelError(
                f"{source}: pre-tokenizer {self.pre_name!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)})")
        self.spec = _PRE_TOKENIZERS[self.pre_name]
        self.tokens: list[str] = list(metadata.get("tokenizer.ggml.tokens") or [])
        if not self.tokens:
            raise ModelFormatError(f"{source}: tokenizer.ggml.tokens is missing or empty")
        types = metadata.get("tokenizer.ggml.token_type")
        self.types: list[int] = list(types) if types is not None else [TOKEN_NORMAL] * len(self.tokens)
        if len(self.types) != len(self.tokens):
            raise ModelFormatError(f"{source}: {len(self.types)} token types for {len(self.tokens)} tokens")

    def cache_key(self) -> str:
        """The cache key of this builder's metadata (see `_metadata_cache_key`)."""
        return _metadata_cache_key(self.md)

    def special_info(self) -> _SpecialInfo:
        def token_id(key: str) -> int | None:
            v = self.md.get(key)
            return int(v) if v is not None and 0 <= int(v) < len(self.tokens) else None

        return _SpecialInfo(
            bos_token_id=token_id("tokenizer.ggml.bos_token_id"),
            eos_token_id=token_id("tokenizer.ggml.eos_token_id"),
            pad_token_id=token_id("tokenizer.ggml.padding_token_id"),
            add_bos=bool(self.md.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=self.md.get("tokenizer.chat_template"),
            vocab_size=len(self.tokens),
        )

    def build(self) -> _RustTokenizer:
        vocab = self._vocab()
        merges = self._merges()
        try:
            bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                             ignore_merges=self.spec.ignore_merges)
        except Exception as e:  # the Rust side rejects merges that name unknown tokens
            raise ModelFormatError(f"{self.source}: inconsistent BPE vocabulary/merges: {e}") from None
        del vocab, merges
        tok = _assemble(bpe, self.spec, self.added_tokens())
        if tok.get_vocab_size(with_added_tokens=True) != len(self.tokens):
            raise ModelFormatError(f"{self.source}: built a vocabulary of "
                                   f"{tok.get_vocab_size(with_added_tokens=True)} tokens, expected {len(self.tokens)}")
        return tok

    def added_tokens(self) -> list[tuple[str, bool]]:
        """(text, special) of the control (special) and user-defined tokens, in id order."""
        return [(t, ty == TOKEN_CONTROL) for t, ty in zip(self.tokens, self.types)
                if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]

    def _vocab(self) -> dict[str, int]:
        """token -> id.  Ordinary tokens outside the byte alphabet (a mislabelled
        conversion) are respelled in it so BPE can reach them; control and
        user-defined tokens keep their literal text, as they are matched whole."""
        spelling = _byte_alphabet()
        alphabet = set(spelling.values())
        vocab: dict[str, int] = {}
        for i, (t, ty) in enumerate(zip(self.tokens, self.types)):
            if ty not in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and not set(t) <= alphabet:
                t = "".join(spelling[b] for b in t.encode("utf-8"))
            if t in vocab:
                raise ModelFormatError(f"{self.source}: token {t!r} appears twice (ids {vocab[t]} and {i})")
            vocab[t] = i
        return vocab

    def _merges(self) -> list[tuple[str, str]]:
        merges = self.md.get("tokenizer.ggml.merges")
        if not merges:
            raise ModelFormatError(f"{self.source}: a byte-level BPE tokenizer needs tokenizer.ggml.merges")
        out = []
        for i, m in enumerate(merges):
            parts = m.split(" ")
            if len(parts) != 2:
                raise ModelFormatError(f"{self.source}: malformed BPE merge #{i}: {m!r}")
            out.append((parts[0], parts[1]))
        return out


class _TokenizerCache:
    """`<cache_dir>/<key>/{vocab.json, merges.txt, lever_tokenizer.json}`, written atomically.

    The BPE model is kept as vocab.json + merges.txt and read with
    `models.BPE.from_file`: loading a whole `tokenizer.json` instead goes
    through serde's buffered untagged-enum path and peaks at about 2.5x the
    memory (for Qwen2.5's 151,646-token vocabulary: +131 MB against +55 MB).
    The sidecar holds the rest: special ids, chat template, the pre-tokenizer
    family and the added tokens.

    A directory is assembled under a temporary name and renamed into place, so
    a reader sees either no entry or a complete one.  An unreadable entry is
    treated as a miss and replaced.
    """

    VOCAB_FILE = "vocab.json"
    MERGES_FILE = "merges.txt"
    SIDECAR_FILE = "lever_tokenizer.json"
    FORMAT = 2

    def __init__(self, cache_dir: str | os.PathLike):
        self.root = Path(cache_dir)

    def entry(self, key: str) -> Path:
        return self.root / key

    def load(self, key: str) -> tuple[_RustTokenizer, _SpecialInfo] | None:
        d = self.entry(key)
        if not (d / self.SIDECAR_FILE).is_file():
            return None
        try:
            side = json.loads((d / self.SIDECAR_FILE).read_text(encoding="utf-8"))
            if side.get("format") != self.FORMAT:
                return None
            info = _SpecialInfo.from_json(side["info"])
            spec = _PRE_TOKENIZERS[side["pre"]]
            bpe = models.BPE.from_file(str(d / self.VOCAB_FILE), str(d / self.MERGES_FILE), fuse_unk=False,
                                       byte_fallback=False, ignore_merges=spec.ignore_merges)
            tok = _assemble(bpe, spec, [(str(t), bool(special)) for t, special in side["added"]])
            if tok.get_vocab_size(with_added_tokens=True) != info.vocab_size:
                raise ValueError(f"{tok.get_vocab_size(with_added_tokens=True)} tokens, expected {info.vocab_size}")
        except Exception as e:  # corrupt or foreign entry: rebuild
            log.warning("ignoring unreadable tokenizer cache entry %s: %s", d, e)
            return None
        return tok, info

    def store(self, key: str, tok: _RustTokenizer, info: _SpecialInfo, pre: str) -> None:
        """Best effort: a cache that cannot be written (full, read-only, ...) costs
        one warning line naming the entry and a rebuild next time, nothing more;
        no temporary directory is left.  `pre` names the pre-tokenizer family
        (a key of _PRE_TOKENIZERS)."""
        final = self.entry(key)
        tmp = temp_path(final)                      # .<key>.<pid>-<n>.tmp: swept if this process dies
        try:
            with writing(tmp):
                self.root.mkdir(parents=True, exist_ok=True)
                sweep_stale(self.root)
                tmp.mkdir(mode=0o755)
                tok.model.save(str(tmp))            # vocab.json, merges.txt
                added = [[t.content, t.special] for _, t in sorted(tok.get_added_tokens_decoder().items())]
                side = {"format": self.FORMAT, "info": info.to_json(), "pre": pre, "added": added}
                (tmp / self.SIDECAR_FILE).write_text(json.dumps(side, ensure_ascii=False, indent=1),
                                                     encoding="utf-8")
                if final.exists():                  # a stale/corrupt entry: move it aside first
                    old = temp_path(final.with_name(f"{key}.old"))
                    with writing(old):
                        os.rename(final, old)
                        shutil.rmtree(old, ignore_errors=True)
                os.rename(tmp, final)
        except Exception as e:                      # OSError, or the tokenizers library's own error
            if not (final.is_dir() and (final / self.SIDECAR_FILE).is_file()):   # else another process won
                error = e if isinstance(e, OSError) else OSError(None, str(e))
                warn_unsaved(SaveError(final, error), "the tokenizer is built again on the next load")
        finally:
            remove_quietly(tmp)


class _MetadataFile:
    """GGUF tokenizer metadata kept as a JSON object in a file: hashed as bytes
    (streamed, `file_digest`) and parsed only when `metadata` is first read."""

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


def default_cache_dir() -> Path:
    """`$LEVER_CACHE_DIR/tokenizers`, else `$XDG_CACHE_HOME/lever/tokenizers`, else ~/.cache/lever/tokenizers."""
    if os.environ.get("LEVER_CACHE_DIR"):
        return Path(os.environ["LEVER_CACHE_DIR"]) / "tokenizers"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lever" / "tokenizers"


# --------------------------------------------------------------------------- the tokenizer


class Tokenizer:
    """A model's tokenizer: encode/decode, special ids, chat template."""

    def __init__(self, tok: _RustTokenizer, info: _SpecialInfo):
        self._tok = tok
        self._info = info
        self.bos_token_id: int | None = info.bos_token_id
        self.eos_token_id: int | None = info.eos_token_id
        self.pad_token_id: int | None = info.pad_token_id
        self.add_bos: bool = info.add_bos
        self.chat_template: str | None = info.chat_template
        self.template_name = "the model's chat template"     # errors name it; the loaders name its file
        self.vocab_size: int = info.vocab_size
        added = tok.get_added_tokens_decoder()           # id -> AddedToken
        self.special_token_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        added_ids = {t.content: i for i, t in added.items()}
        eos = {i for i in (info.eos_token_id, *info.extra_eos_ids) if i is not None}
        eos.update(added_ids[t] for t in END_OF_TURN_TOKENS if t in added_ids)
        self.eos_token_ids: frozenset[int] = frozenset(eos)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_gguf(cls, gguf: "GGUFFile", cache_dir: str | os.PathLike | None = None) -> "Tokenizer":
        """Build from a `GGUFFile`'s metadata; with `cache_dir`, reuse / store the build there.

        A cache hit reads only the cache entry: the key hashes the raw bytes of
        the tokenizer metadata (`_source_cache_key`), so the vocabulary and
        merges are never decoded, and the checks of the metadata (which the
        same bytes passed when the entry was written) are not repeated."""
        source = str(getattr(gguf, "path", "GGUF file"))
        if cache_dir is None:
            builder = _GGUFTokenizerBuilder(gguf.metadata, source=source)
            return cls(builder.build(), builder.special_info())._named(source)
        cache = _TokenizerCache(cache_dir)
        key = _source_cache_key(gguf)
        hit = cache.load(key)
        if hit is not None:
            return cls(*hit)._named(source)
        builder = _GGUFTokenizerBuilder(gguf.metadata, source=source)
        info = builder.special_info()
        tok = builder.build()
        cache.store(key, tok, info, builder.pre_name)
        return cls(tok, info)._named(source)

    def _named(self, source: str) -> "Tokenizer":
        """This tokenizer, its chat template named after `source` (the model file) in errors."""
        self.template_name = f"the chat template of {source}"
        return self

    @classmethod
    def from_metadata_file(cls, path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> "Tokenizer":
        """Build from a JSON file of GGUF tokenizer metadata (a flash store's
        tokenizer_metadata.json); with `cache_dir`, the cache key hashes the
        file's bytes, so a hit never parses the JSON."""
        return cls.from_gguf(_MetadataFile(Path(path)), cache_dir=cache_dir)

    @classmethod
    def from_pretrained_dir(cls, path: str | os.PathLike) -> "Tokenizer":
        """Load a Hugging Face checkpoint's tokenizer (`tokenizer.json` plus configs)."""
        d = Path(path)
        tj = d / "tokenizer.json"
        if not tj.is_file():
            raise ModelFormatError(f"{d}: no tokenizer.json (Lever needs a fast-tokenizer checkpoint)")
        try:
            tok = _RustTokenizer.from_file(str(tj))
        except Exception as e:
            raise ModelFormatError(f"{tj}: cannot be read: {e}") from None
        cfg = _read_json(d / "tokenizer_config.json")
        gen = _read_json(d / "generation_config.json")

        def token_id(value) -> int | None:
            if isinstance(value, Mapping):               # {"content": "<s>", ...}
                value = value.get("content")
            return tok.token_to_id(value) if isinstance(value, str) else None

        bos = token_id(cfg.get("bos_token"))
        if bos is None and isinstance(gen.get("bos_token_id"), int):
            bos = gen["bos_token_id"]
        gen_eos = gen.get("eos_token_id")
        gen_eos = [gen_eos] if isinstance(gen_eos, int) else [i for i in (gen_eos or []) if isinstance(i, int)]
        eos = token_id(cfg.get("eos_token"))
        if eos is None and gen_eos:
            eos = gen_eos[0]
        if "add_bos_token" in cfg:
            add_bos = bool(cfg["add_bos_token"])
        else:  # no flag: does the post-processor add BOS (e.g. Llama 3's TemplateProcessing)?
            probe = tok.encode("", add_special_tokens=True).ids
            add_bos = bos is not None and probe[:1] == [bos]
        info = _SpecialInfo(
            bos_token_id=bos, eos_token_id=eos, pad_token_id=token_id(cfg.get("pad_token")),
            add_bos=add_bos, chat_template=_pretrained_chat_template(d, cfg),
            vocab_size=tok.get_vocab_size(with_added_tokens=True),
            extra_eos_ids=tuple(i for i in gen_eos if i != eos),
        )
        return cls(tok, info)._named(str(d))

    def fingerprint(self) -> str:
        """A digest of the id <-> token mapping (added tokens included): two
        tokenizers with the same fingerprint give every id the same meaning."""
        vocab = self._tok.get_vocab(with_added_tokens=True)
        pairs = sorted(((i, t) for t, i in vocab.items()))
        return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()[:32]

    # ------------------------------------------------------------------ ids <-> text

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; special tokens written in the text map to their ids.
        BOS is prepended when `add_bos` (default: the model's convention) and the model has one."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_token_id is not None:
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(int(token_id))

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_token_id is None else self.id_to_token(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_token_id is None else self.id_to_token(self.eos_token_id)

    @property
    def backend(self) -> _RustTokenizer:
        """The underlying `tokenizers.Tokenizer`."""
        return self._tok

    def incremental_decoder(self, skip_special_tokens: bool = False) -> "IncrementalDecoder":
        return IncrementalDecoder(self, skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ chat

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        """Render a conversation with the model's chat template (Jinja, sandboxed, as HF does),
        in a worker process under a time, memory and size budget (lever.model.chat_template).
        Extra keyword arguments (JSON values, e.g. `tools`) are passed to the template."""
        if self.chat_template is None:
            raise LeverError("this model has no chat template; use a plain prompt (chat=False)")
        variables = {
            "bos_token": self.bos_token or "", "eos_token": self.eos_token or "",
            "pad_token": (self.id_to_token(self.pad_token_id) if self.pad_token_id is not None else None) or "",
            **kwargs,
            "messages": [dict(m) for m in messages], "add_generation_prompt": add_generation_prompt,
        }
        return default_renderer().render(self.chat_template, variables, self.template_name)

    def format_prompt(self, prompt: str, chat: bool = True) -> str:
        """`prompt` as a single user turn of the model's chat format (when it has one and `chat`)."""
        if not chat or self.chat_template is None:
            return prompt
        return self.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token_id}, "
                f"eos={sorted(self.eos_token_ids)}, add_bos={self.add_bos})")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelFormatError(f"{path}: not valid JSON: {e}") from None
    return value if isinstance(value, dict) else {}


def _pretrained_chat_template(d: Path, cfg: Mapping[str, Any]) -> str | None:
    """The chat template of a HF checkpoint: chat_template.jinja, chat_template.json, or tokenizer_config."""
    if (d / "chat_template.jinja").is_file():
        return (d / "chat_template.jinja").read_text(encoding="utf-8")
    template = _read_json(d / "chat_template.json").get("chat_template", cfg.get("chat_template"))
    if isinstance(template, list):          # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


# --------------------------------------------------------------------------- streaming


class IncrementalDecoder:
    """Turns generated ids into text as they arrive, never splitting a character.

    A token may end in the middle of a multi-byte UTF-8 character; decoding it
    then ends in U+FFFD.  Text is only emitted up to the last complete
    character, and the rest waits for the next tokens (or `flush`).

    Only a small window of ids is decoded per token: it starts at a token
    boundary where the text was complete (so it begins on a character
    boundary), keeps the previous complete piece as left context (decoders
    such as SentencePiece's strip a leading space from the first token), and
    slides forward each time the text is complete again.  Concatenating every
    `push` and the final `flush` gives `tokenizer.decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        self._ids: list[int] = []       # the window
        self._emitted = 0               # characters of decode(window) already returned
        self._boundary = 0              # window index of the last complete point

    def push(self, token_id: int) -> str:
        """Add one id; return the text that it completes (may be empty)."""
        self._ids.append(int(token_id))
        text = self._decode(self._ids)
        complete = not text.endswith("\ufffd")
        # An incomplete character shows as one trailing U+FFFD; whatever precedes
        # it is final (UTF-8 is self-synchronising), so it can go out already.
        stable = text if complete else text.rstrip("\ufffd")
        out = stable[self._emitted:]
        self._emitted = max(self._emitted, len(stable))
        if complete:
            # Slide: keep the piece since the previous complete point as context.
            if self._boundary > 0:
                self._ids = self._ids[self._boundary:]
                self._emitted = len(self._decode(self._ids))
            self._boundary = len(self._ids)
        return out

    def flush(self) -> str:
        """Return whatever is left (an unfinished character comes out as U+FFFD) and reset."""
        rest = self._decode(self._ids)[self._emitted:] if self._ids else ""
        self._ids, self._emitted, self._boundary = [], 0, 0
        return rest

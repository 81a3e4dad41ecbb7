"""Text <-> token ids, chat templates, and streaming detokenisation.

`Tokenizer` wraps a `tokenizers.Tokenizer` (the Rust library behind Hugging
Face's fast tokenizers) and adds what the engine needs around it: the BOS/EOS
conventions of the model, special-token parsing on or off, its chat
template, and a cache.  It is built offline from one of three sources:

* a GGUF file (`Tokenizer.from_gguf`): the file stores the vocabulary (and
  merges or scores), the token types and the tokenizer's kind and
  pre-tokenizer under llama.cpp's key names; lever.model.tokenizer_gguf
  turns that into a byte-level BPE (`gpt2`) or SentencePiece-style (`llama`,
  `gemma4`) tokenizer that tokenises as llama.cpp does.  The result is cached
  (lever.model.tokenizer_cache) under a key that hashes the *raw bytes* of the
  tokenizer metadata, so the build happens once per distinct tokenizer and a
  cache hit decodes no vocabulary or merges (GGUFFile leaves those arrays in
  the file until read).
* a flash store's tokenizer_metadata.json (`Tokenizer.from_metadata_file`):
  the same metadata as JSON; the key hashes the file, parsed only on a miss.
* a Hugging Face checkpoint directory (`Tokenizer.from_pretrained_dir`).

`IncrementalDecoder` turns a stream of ids into text pieces without ever
emitting half a UTF-8 character.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from tokenizers import Tokenizer as _RustTokenizer

from ..errors import LeverError, ModelFormatError
from .chat_template import default_renderer
from .tokenizer_cache import TokenizerCache
from .tokenizer_gguf import GGUFTokenizerBuilder, MetadataFile, SpecialInfo, source_cache_key

if TYPE_CHECKING:
    from ..gguf.file import GGUFFile

# Tokens that end a turn or a document in the common chat formats; those present
# in a vocabulary (as added/special tokens) join the model's EOS id as stop tokens.
END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
    "<end_of_turn>", "<|end|>", "<|return|>", "</s>", "<turn|>",
)


def default_cache_dir() -> Path:
    """`$LEVER_CACHE_DIR/tokenizers`, else `$XDG_CACHE_HOME/lever/tokenizers`, else ~/.cache/lever/tokenizers."""
    if os.environ.get("LEVER_CACHE_DIR"):
        return Path(os.environ["LEVER_CACHE_DIR"]) / "tokenizers"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lever" / "tokenizers"


# --------------------------------------------------------------------------- the tokenizer


class Tokenizer:
    """A model's tokenizer: encode/decode, special ids, chat template."""

    def __init__(self, tok: _RustTokenizer, info: SpecialInfo):
        self._tok = tok
        self._info = info
        self._encode_lock = threading.Lock()
        self.bos_token_id: int | None = info.bos_token_id
        self.eos_token_id: int | None = info.eos_token_id
        self.pad_token_id: int | None = info.pad_token_id
        self.add_bos: bool = info.add_bos
        self.add_eos: bool = info.add_eos
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
        the tokenizer metadata (`source_cache_key`), so the vocabulary and
        merges are never decoded, and the checks of the metadata (which the
        same bytes passed when the entry was written) are not repeated."""
        source = str(getattr(gguf, "path", "GGUF file"))
        if cache_dir is None:
            builder = GGUFTokenizerBuilder(gguf.metadata, source=source)
            return cls(builder.build(), builder.special_info())._named(source)
        cache = TokenizerCache(cache_dir)
        key = source_cache_key(gguf)
        hit = cache.load(key)
        if hit is not None:
            return cls(*hit)._named(source)
        builder = GGUFTokenizerBuilder(gguf.metadata, source=source)
        info = builder.special_info()
        tok = builder.build()
        cache.store(key, tok, info, builder.recipe(), builder.merges)
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
        return cls.from_gguf(MetadataFile(Path(path)), cache_dir=cache_dir)

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
        info = SpecialInfo(
            bos_token_id=bos, eos_token_id=eos, pad_token_id=token_id(cfg.get("pad_token")),
            add_bos=add_bos, add_eos=bool(cfg.get("add_eos_token", False)),
            chat_template=_pretrained_chat_template(d, cfg),
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

    def encode(self, text: str, add_bos: bool | None = None, add_eos: bool | None = None,
               parse_special: bool = True) -> list[int]:
        """Token ids of `text`.  With `parse_special`, special (control) tokens
        written in the text map to their ids; without, their text is encoded as
        plain text (user-defined tokens are matched either way, as llama.cpp
        does).  BOS is prepended when `add_bos`, EOS appended when `add_eos`
        (default: the model's convention) and the model has one -- but not a
        second time: text that starts with the BOS token already (a chat
        template that writes `bos_token`: Llama, Gemma, Mistral) keeps the one
        it has, where llama.cpp would add another and warn."""
        with self._encode_lock:         # encode_special_tokens is the shared tokenizer's setting
            self._tok.encode_special_tokens = not parse_special
            try:
                ids = self._tok.encode(text, add_special_tokens=False).ids
            finally:
                self._tok.encode_special_tokens = False
        bos, eos = self.bos_token_id, self.eos_token_id
        if (self.add_bos if add_bos is None else add_bos) and bos is not None and ids[:1] != [bos]:
            ids.insert(0, bos)
        if (self.add_eos if add_eos is None else add_eos) and eos is not None and ids[-1:] != [eos]:
            ids.append(eos)
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

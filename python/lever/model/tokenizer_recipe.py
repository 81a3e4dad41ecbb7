"""How a `tokenizers.Tokenizer` is put together around a BPE model: the one
description that both a fresh build from GGUF metadata and a load from the
tokenizer cache follow (the cache keeps it as JSON beside the vocabulary).

Two kinds:

* ``byte-level``: GPT-2's byte alphabet; the pre-tokenizer family named by
  `tokenizer.ggml.pre` (lever.model.pretokenizers).
* ``sentencepiece``: ``▁`` for spaces, byte fallback to ``<0xNN>`` tokens, an
  optional dummy-prefix space (lever.model.tokenizer_spm).

Added tokens (control, unknown and user-defined tokens of the vocabulary)
are matched whole in the raw text before anything else; the special ones
(control, unknown) only while special tokens are parsed
(`Tokenizer.encode(parse_special=False)` reads their text as plain text),
the user-defined ones always, as llama.cpp and Hugging Face do.  `rstrip`
drops the whitespace after the token (Phi-3's chat markers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from tokenizers import AddedToken, decoders
from tokenizers import Tokenizer as _RustTokenizer

from . import tokenizer_spm
from .pretokenizers import FAMILIES

BYTE_LEVEL = "byte-level"
SENTENCEPIECE = "sentencepiece"
KINDS = (BYTE_LEVEL, SENTENCEPIECE)


@dataclass(frozen=True)
class AddedSpec:
    """One added token: its text, whether it is special (control / unknown),
    whether the whitespace after it is dropped."""

    text: str
    special: bool
    rstrip: bool = False


@dataclass(frozen=True)
class Recipe:
    """The kind, its settings, and the added tokens in id order."""

    kind: str
    family: str | None = None           # byte-level: a key of pretokenizers.FAMILIES
    space_prefix: bool = False          # sentencepiece: one ▁ before each piece of text
    unk_token: str | None = None        # sentencepiece: the unknown token (when no byte token fits)
    added: tuple[AddedSpec, ...] = field(default=())

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown tokenizer kind {self.kind!r}")
        if self.kind == BYTE_LEVEL and self.family not in FAMILIES:
            raise ValueError(f"unknown pre-tokenizer family {self.family!r}")

    def bpe_options(self) -> dict[str, Any]:
        """Keyword arguments of `tokenizers.models.BPE` (and `BPE.from_file`)."""
        if self.kind == BYTE_LEVEL:
            return {"fuse_unk": False, "byte_fallback": False, "ignore_merges": FAMILIES[self.family].ignore_merges}
        return {"fuse_unk": True, "byte_fallback": True, "unk_token": self.unk_token}

    def assemble(self, bpe) -> _RustTokenizer:
        """A tokenizer around the BPE model `bpe`: normaliser, pre-tokenizer,
        decoder and the added tokens."""
        tok = _RustTokenizer(bpe)
        if self.kind == BYTE_LEVEL:
            family = FAMILIES[self.family]
            if family.normalizer() is not None:
                tok.normalizer = family.normalizer()
            tok.pre_tokenizer = family.pre_tokenizer()
            tok.decoder = decoders.ByteLevel()
        else:
            tok.normalizer = tokenizer_spm.normalizer(self.space_prefix)
            tok.decoder = tokenizer_spm.decoder(self.space_prefix)
        special = [AddedToken(a.text, special=True, normalized=False, rstrip=a.rstrip) for a in self.added if a.special]
        user = [AddedToken(a.text, special=False, normalized=False, rstrip=a.rstrip)
                for a in self.added if not a.special]
        if special:
            tok.add_special_tokens(special)
        if user:
            tok.add_tokens(user)
        return tok

    def to_json(self) -> dict:
        return {"kind": self.kind, "family": self.family, "space_prefix": self.space_prefix,
                "unk_token": self.unk_token, "added": [[a.text, a.special, a.rstrip] for a in self.added]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Recipe":
        return cls(kind=d["kind"], family=d["family"], space_prefix=bool(d["space_prefix"]),
                   unk_token=d["unk_token"],
                   added=tuple(AddedSpec(str(t), bool(s), bool(r)) for t, s, r in d["added"]))

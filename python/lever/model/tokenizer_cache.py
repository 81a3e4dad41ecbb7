"""The tokenizer cache: one built tokenizer per distinct tokenizer metadata.

`<cache_dir>/<key>/{vocab.json, merges.txt | merges.json, lever_tokenizer.json}`,
written atomically.  The key hashes the raw bytes of the tokenizer metadata
(lever.model.tokenizer_gguf.source_cache_key), so a hit decodes no vocabulary.

The BPE model is kept as vocab.json + merges.txt and read with
`models.BPE.from_file`: loading a whole `tokenizer.json` instead goes
through serde's buffered untagged-enum path and peaks at about 2.5x the
memory (for Qwen2.5's 151,646-token vocabulary: +131 MB against +55 MB).
merges.txt holds one "LEFT RIGHT" pair a line, so a vocabulary whose merges
name a token with a space or a line break in it (Llama 2's tokens ending in
"\r", Gemma's runs of newlines) keeps them as merges.json (a JSON list of
pairs) instead, read through Python (for Gemma 4's 514,906 merges: a 324 MB
peak where merges.txt would take 155 MB).
The sidecar holds the rest: the special ids and flags, the chat template and
the recipe (kind, pre-tokenizer family, added tokens).

A directory is assembled under a temporary name and renamed into place, so
a reader sees either no entry or a complete one.  An unreadable entry is
treated as a miss and replaced.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer as _RustTokenizer
from tokenizers import models

from ..atomic_write import SaveError, remove_quietly, sweep_stale, temp_path, warn_unsaved, writing
from .tokenizer_gguf import SpecialInfo
from .tokenizer_recipe import Recipe

log = logging.getLogger(__name__)


def line_safe(merges: Sequence[tuple[str, str]]) -> bool:
    """Whether merges.txt can hold `merges`: no space or line break in a token,
    no line that reads as merges.txt's "#version" header."""
    return not any(" " in a or " " in b or "\n" in a or "\n" in b or "\r" in a or "\r" in b
                   or a.startswith("#version") for a, b in merges)


class TokenizerCache:
    """Built tokenizers under `cache_dir`, one directory per key."""

    VOCAB_FILE = "vocab.json"
    MERGES_FILE = "merges.txt"
    MERGES_JSON = "merges.json"
    SIDECAR_FILE = "lever_tokenizer.json"
    FORMAT = 3

    def __init__(self, cache_dir: str | os.PathLike):
        self.root = Path(cache_dir)

    def entry(self, key: str) -> Path:
        return self.root / key

    def load(self, key: str) -> tuple[_RustTokenizer, SpecialInfo] | None:
        d = self.entry(key)
        if not (d / self.SIDECAR_FILE).is_file():
            return None
        try:
            side = json.loads((d / self.SIDECAR_FILE).read_text(encoding="utf-8"))
            if side.get("format") != self.FORMAT:
                return None
            info = SpecialInfo.from_json(side["info"])
            recipe = Recipe.from_json(side["recipe"])
            tok = recipe.assemble(self._bpe(d, recipe))
            if tok.get_vocab_size(with_added_tokens=True) != info.vocab_size:
                raise ValueError(f"{tok.get_vocab_size(with_added_tokens=True)} tokens, expected {info.vocab_size}")
        except Exception as e:  # corrupt or foreign entry: rebuild
            log.warning("ignoring unreadable tokenizer cache entry %s: %s", d, e)
            return None
        return tok, info

    def _bpe(self, d: Path, recipe: Recipe):
        options = recipe.bpe_options()
        if (d / self.MERGES_FILE).is_file():
            return models.BPE.from_file(str(d / self.VOCAB_FILE), str(d / self.MERGES_FILE), **options)
        with open(d / self.VOCAB_FILE, encoding="utf-8") as f:
            vocab = json.load(f)
        with open(d / self.MERGES_JSON, encoding="utf-8") as f:
            merges = [(a, b) for a, b in json.load(f)]
        return models.BPE(vocab=vocab, merges=merges, **options)

    def store(self, key: str, tok: _RustTokenizer, info: SpecialInfo, recipe: Recipe,
              merges: Sequence[tuple[str, str]]) -> None:
        """Best effort: a cache that cannot be written (full, read-only, ...) costs
        one warning line naming the entry and a rebuild next time, nothing more;
        no temporary directory is left.  `merges`: those `tok` was built with."""
        final = self.entry(key)
        tmp = temp_path(final)                      # .<key>.<pid>-<n>.tmp: swept if this process dies
        try:
            with writing(tmp):
                self.root.mkdir(parents=True, exist_ok=True)
                sweep_stale(self.root)
                tmp.mkdir(mode=0o755)
                tok.model.save(str(tmp))            # vocab.json, merges.txt
                if not line_safe(merges):
                    (tmp / self.MERGES_FILE).unlink()
                    with open(tmp / self.MERGES_JSON, "w", encoding="utf-8") as f:
                        json.dump(merges, f, ensure_ascii=False, separators=(",", ":"))
                side = {"format": self.FORMAT, "info": info.to_json(), "recipe": recipe.to_json()}
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

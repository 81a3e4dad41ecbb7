"""Does a draft model give every token id the meaning the target gives it?

Speculative decoding hands the draft's token ids straight to the target, so
the two models must share one tokenizer: the same vocabulary (every id the
same token string) and the same special tokens (BOS, EOS and the other stop
tokens, padding, which ids are control tokens such as ``<|im_start|>``).
Chat templates may differ: only the target's is ever used.

`check_same_tokenizer` compares two `Tokenizer`s and raises one
`TokenizerMismatchError` line naming both models, what differs and what runs
instead.  `check_run_tokenizers` does it for a run (`lever.runtime.build`)
before any weights load: the tokenizers come from the GGUF headers (or a
store's tokenizer metadata), built through the tokenizer cache, whose hits
decode no vocabulary at all.  `check_drafter` does it for the Python API, the
first time `LoadedModel.generate` is handed a draft model, and remembers the
answer on the drafter (`accept_drafter` records a pair `build` already checked).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import LeverError
from ..gguf.file import GGUFFile
from ..gguf.registry import KNOWN_MODELS, model_status, resolve_model
from ..values import cache_root
from .tokenizer import Tokenizer

__all__ = ["TokenizerMismatchError", "accept_drafter", "check_drafter", "check_run_tokenizers",
           "check_same_tokenizer", "model_tokenizer", "tokenizer_difference"]

CLI_DRAFT = "--draft {}"                    # how a draft is named in a suggestion, on the command line
API_DRAFT = "make_drafter({!r})"            # ... and in the Python API

# GGUF keys that fix what every id means; files whose raw values of these agree share a tokenizer
_ID_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.padding_token_id")
_CHECKED = "_lever_tokenizer_checked"       # drafter attribute: the target Tokenizer it was checked against


class TokenizerMismatchError(LeverError):
    """A draft model whose token ids mean other tokens to the target."""


@dataclass(frozen=True)
class _Vocab:
    """A tokenizer's token string of every id (None for an id without one)."""

    tokens: tuple[str | None, ...]

    @classmethod
    def of(cls, tok: Tokenizer) -> "_Vocab":
        vocab = tok.backend.get_vocab(with_added_tokens=True)
        size = max(tok.vocab_size, max(vocab.values(), default=-1) + 1)
        tokens: list[str | None] = [None] * size
        for text, i in vocab.items():
            tokens[i] = text
        return cls(tuple(tokens))


def _token(text: str | None) -> str:
    return "no token" if text is None else repr(text)


def _special(tok: Tokenizer, token_id: int | None) -> str:
    return "none" if token_id is None else f"{_token(tok.id_to_token(token_id))} (id {token_id})"


def _ids(tok: Tokenizer, ids) -> str:
    return "{" + ", ".join(_special(tok, i) for i in sorted(ids)) + "}" if ids else "none"


def tokenizer_difference(target: Tokenizer, draft: Tokenizer) -> str | None:
    """None when the two tokenizers agree on every id and special token; else
    what differs first, as a phrase: the vocabulary sizes, the first id whose
    token strings differ (with both strings), or the special token that differs."""
    a, b = _Vocab.of(target).tokens, _Vocab.of(draft).tokens
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    where = "" if first is None else f"id {first} is {_token(a[first])} in the target, {_token(b[first])} in the draft"
    if len(a) != len(b):
        common = where or f"the first {min(len(a), len(b)):,} ids agree"
        return f"the target has {len(a):,} tokens, the draft {len(b):,}; {common}"
    if where:
        return f"both have {len(a):,} tokens, but {where}"
    for label, x, y in (("BOS token", target.bos_token_id, draft.bos_token_id),
                        ("EOS token", target.eos_token_id, draft.eos_token_id),
                        ("padding token", target.pad_token_id, draft.pad_token_id)):
        if x != y:
            return f"the {label} is {_special(target, x)} in the target, {_special(draft, y)} in the draft"
    if target.eos_token_ids != draft.eos_token_ids:
        return (f"the stop tokens are {_ids(target, target.eos_token_ids)} in the target, "
                f"{_ids(draft, draft.eos_token_ids)} in the draft")
    if target.special_token_ids != draft.special_token_ids:
        i = min(target.special_token_ids ^ draft.special_token_ids)
        which = "the target" if i in target.special_token_ids else "the draft"
        return f"{_special(target, i)} is a special (control) token in {which} only"
    return None


def check_same_tokenizer(target_tok: Tokenizer, draft_tok: Tokenizer, target_name: str, draft_name: str, *,
                         instead: str = "", draft_option: str = CLI_DRAFT) -> None:
    """Raise TokenizerMismatchError (one line) unless the draft's tokenizer is the
    target's (`tokenizer_difference`).  instead: further things that run,
    appended after "; use --draft ngram (prompt lookup, any tokenizer)";
    draft_option: how a draft is named (CLI_DRAFT or API_DRAFT)."""
    what = tokenizer_difference(target_tok, draft_tok)
    if what is None:
        return
    raise TokenizerMismatchError(
        f"the draft {draft_name} cannot draft for the target {target_name}: their tokenizers differ ({what}), "
        f"so the draft's token ids would mean other tokens to the target; "
        f"use {draft_option.format('ngram')} (prompt lookup, any tokenizer){instead}")


# -- tokenizers from model files, without loading weights -----------------------------

def model_tokenizer(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                    parsed=None) -> Tokenizer:
    """The tokenizer of a GGUF file (its header's metadata only; parsed: the
    GGUFFile when already parsed) or of a checkpoint directory, through the
    tokenizer cache under `cache_dir` (Lever's cache root)."""
    path = Path(path)
    if parsed is None and path.is_dir():
        return Tokenizer.from_pretrained_dir(path)
    if parsed is None:
        parsed = GGUFFile(path)
    return Tokenizer.from_gguf(parsed, cache_dir=cache_root(cache_dir) / "tokenizers")


def _size(path: Path | None) -> int | None:
    """Bytes of a model file, or of the files directly in a store or checkpoint directory."""
    try:
        if path is None:
            return None
        if path.is_dir():
            return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
        return path.stat().st_size
    except OSError:
        return None


def _same_file(a: Path | None, b: Path | None) -> bool:
    try:
        return a is not None and b is not None and os.path.samefile(a, b)
    except OSError:
        return False


def _alternatives(target_tok: Tokenizer, draft_tok: Tokenizer, *, target_path: Path | None,
                  draft_path: Path | None, cache_dir, draft_option: str) -> str:
    """What runs instead of the mismatched pair, among the installed registered
    models: drafts at most half the target's size (bytes) that share its
    tokenizer, and targets at least twice the draft's size that share the
    draft's ("" when none)."""
    target_size, draft_size = _size(target_path), _size(draft_path)
    drafts, targets = [], []
    for entry in KNOWN_MODELS.values():
        try:
            status = model_status(entry, cache_root(cache_dir))
            if status.path is None or not status.assembled:
                continue
            if _same_file(status.path, target_path) or _same_file(status.path, draft_path):
                continue
            tok = model_tokenizer(status.path, cache_dir)
        except (LeverError, OSError):
            continue                        # a suggestion only: a model that cannot be read is not offered
        if (target_size is None or 2 * entry.size <= target_size) and tokenizer_difference(target_tok, tok) is None:
            drafts.append(draft_option.format(entry.name))
        if (draft_size is None or entry.size >= 2 * draft_size) and tokenizer_difference(tok, draft_tok) is None:
            targets.append(entry.name)
    text = "".join(f" or {d} (the target's tokenizer)" for d in drafts)
    if targets:
        text += f", or keep this draft with the target {' or '.join(targets)} (the draft's tokenizer)"
    return text


def _draft_tokenizer(path: Path, cache_dir, parsed, draft_name: str, target_name: str,
                     draft_option: str = CLI_DRAFT) -> Tokenizer:
    """The draft's tokenizer (`model_tokenizer`); one that cannot be built cannot be
    shown to be the target's, which is then the error."""
    try:
        return model_tokenizer(path, cache_dir, parsed)
    except LeverError as e:
        raise TokenizerMismatchError(
            f"the draft {draft_name} cannot be checked against the target {target_name}: its tokenizer cannot "
            f"be read ({e}); use {draft_option.format('ngram')} (prompt lookup, any tokenizer)") from None


def _display_name(path: Path | None, cache_dir) -> str:
    """The registered name of the model at `path`, else the path."""
    for entry in KNOWN_MODELS.values():
        try:
            if _same_file(model_status(entry, cache_root(cache_dir)).path, path):
                return entry.name
        except (LeverError, OSError):
            continue
    return str(path)


def _check_pair(target_tok: Tokenizer, draft_tok: Tokenizer, target_name: str | None, draft_name: str | None, *,
                target_path: Path | None, draft_path: Path | None, cache_dir, draft_option: str) -> None:
    if tokenizer_difference(target_tok, draft_tok) is None:
        return
    instead = _alternatives(target_tok, draft_tok, target_path=target_path, draft_path=draft_path,
                            cache_dir=cache_dir, draft_option=draft_option)
    check_same_tokenizer(target_tok, draft_tok, target_name or _display_name(target_path, cache_dir),
                         draft_name or _display_name(draft_path, cache_dir), instead=instead,
                         draft_option=draft_option)


def check_run_tokenizers(config, store_tok: Tokenizer | None, target_gguf=None, draft_gguf=None):
    """Before a run loads anything (lever.runtime.build): refuse a draft model
    whose tokenizer is not the target's.  config: the RunConfig; store_tok: a
    streamed target's tokenizer (its store's metadata); target_gguf /
    draft_gguf: headers already parsed (the memory plan's), else parsed here.
    Returns (target GGUFFile or None, draft GGUFFile or None), for the loaders."""
    target, draft, cache_dir = config.target, config.draft, config.cache_dir
    if not draft.is_model:
        return target_gguf, draft_gguf

    def header(name, parsed):
        if parsed is not None:
            return Path(parsed.path), parsed
        path = Path(resolve_model(name, cache_dir=cache_root(cache_dir), progress=config.progress))
        return path, (GGUFFile(path) if path.is_file() else None)

    if target.streamed:
        target_path, target_name, target_tok = Path(target.store), str(target.store), store_tok
    else:
        target_path, target_gguf = header(target.model, target_gguf)
        target_name = target.model
    draft_path, draft_gguf = header(draft.name, draft_gguf)
    if not target.streamed and _same_file(target_path, draft_path):
        return target_gguf, draft_gguf                # one file: one tokenizer
    if target_gguf is not None and draft_gguf is not None and \
            target_gguf.metadata_digest(_ID_KEYS) == draft_gguf.metadata_digest(_ID_KEYS):
        return target_gguf, draft_gguf                # the same bytes: nothing to decode
    if not target.streamed:
        target_tok = model_tokenizer(target_path, cache_dir, target_gguf)
    draft_tok = _draft_tokenizer(draft_path, cache_dir, draft_gguf, draft.name, target_name)
    _check_pair(target_tok, draft_tok, target_name, draft.name, target_path=target_path, draft_path=draft_path,
                cache_dir=cache_dir, draft_option=CLI_DRAFT)
    return target_gguf, draft_gguf


# -- the Python API: a drafter handed to LoadedModel.generate ---------------------------

def accept_drafter(drafter, tokenizer: Tokenizer) -> None:
    """Record that `drafter` was checked against `tokenizer` (by `check_run_tokenizers`)."""
    if drafter is not None and getattr(drafter, "path", None) is not None:
        _remember(drafter, tokenizer)


def check_drafter(tokenizer: Tokenizer, drafter, target_path, cache_dir=None) -> None:
    """Refuse a draft model (a drafter with a `path`) whose tokenizer is not
    `tokenizer`, the target's (loaded from `target_path`); prompt lookup and
    other drafters without a model file pass.  Checked once per drafter and
    target tokenizer: the answer is kept on the drafter."""
    path = getattr(drafter, "path", None)
    if path is None or getattr(drafter, _CHECKED, None) is tokenizer:
        return
    path, target_path = Path(path), Path(target_path) if target_path is not None else None
    if not _same_file(path, target_path):
        draft_tok = _draft_tokenizer(path, cache_dir, None, str(path), str(target_path), API_DRAFT)
        _check_pair(tokenizer, draft_tok, None, None,
                    target_path=target_path, draft_path=path, cache_dir=cache_dir, draft_option=API_DRAFT)
    _remember(drafter, tokenizer)


def _remember(drafter, tokenizer: Tokenizer) -> None:
    try:
        setattr(drafter, _CHECKED, tokenizer)
    except AttributeError:              # a drafter that takes no attributes is checked each time
        pass

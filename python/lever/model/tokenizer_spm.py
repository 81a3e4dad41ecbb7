"""SentencePiece-style vocabularies: `tokenizer.ggml.model` "llama" (Llama 2,
Mistral, Phi-3, Gemma 3) and "gemma4".

Both spell a space as ``▁`` (U+2581) inside tokens, work on the text's
characters (not GPT-2's byte alphabet) and fall back to ``<0xNN>`` byte
tokens for characters the vocabulary lacks.  They become a Hugging Face BPE
model with byte fallback behind a normaliser that turns spaces into ``▁``
(and, with the dummy prefix, puts one ``▁`` in front of each piece of text
between added tokens); the decoder undoes both.

"llama" files carry scores instead of merges.  llama.cpp's SPM tokenizer
(like SentencePiece's BPE) starts from single characters and repeatedly
joins the adjacent pair whose joined text is a token with the highest score
(the leftmost on a tie), so the merges are every split of each normal token
into two normal tokens, ranked by the joined token's score (`derive_merges`):
BPE then applies exactly the joins SPM would.  Ties between different tokens
of equal score are ranked by token id, where SPM would take the leftmost
pair; the vocabularies checked (llama.cpp's llama-spm and phi-3 goldens, and
random text against a reference of the SPM loop in the tests) agree.
Control, unknown, byte, unused and user-defined tokens are never the result
of a join: SPM would otherwise turn the text ``<s>`` into BOS.

"gemma4" files carry merges; llama.cpp applies them to the text with spaces
escaped and no dummy prefix, which is this BPE model without the prefix.
"""

from __future__ import annotations

from typing import Sequence

from tokenizers import decoders, normalizers

from ..errors import ModelFormatError

SPACE = "\u2581"            # ▁, a space inside SentencePiece tokens
TOKEN_NORMAL = 1            # tokenizer.ggml.token_type of an ordinary token


def derive_merges(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int],
                  source: str = "GGUF file") -> list[tuple[str, str]]:
    """BPE merges equivalent to SPM's highest-score-first joins: each normal
    token's splits into two normal tokens, best score first (ties: lower id
    first, then the shorter left part)."""
    if len(scores) != len(tokens):
        raise ModelFormatError(f"{source}: {len(scores)} token scores for {len(tokens)} tokens")
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == TOKEN_NORMAL}
    ranked = []
    for token, i in normal.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in normal and right in normal:
                ranked.append((-float(scores[i]), i, cut, left, right))
    ranked.sort(key=lambda m: m[:3])
    return [(left, right) for *_, left, right in ranked]


def normalizer(space_prefix: bool):
    """Spaces -> ▁, and with `space_prefix` one ▁ before each piece of text."""
    steps = [normalizers.Replace(" ", SPACE)]
    if space_prefix:
        steps.insert(0, normalizers.Prepend(SPACE))
    return normalizers.Sequence(steps)


def decoder(space_prefix: bool):
    """▁ -> space, <0xNN> tokens -> their bytes, and with `space_prefix` the
    dummy prefix's space dropped from the start of the text."""
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    return decoders.Sequence(steps)

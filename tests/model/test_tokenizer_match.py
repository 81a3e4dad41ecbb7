"""A draft model must share the target's tokenizer (lever.model.tokenizer_match):
the comparison on small built tokenizers (each kind of difference and its
words), then every pair of registered models through `lever generate` (a
differing pair is one error line before anything loads, an equal pair runs),
a flash-store target, and the Python API's drafter."""

import json

import pytest

import lever
from lever.api import make_drafter
from lever.cli import main
from lever.config import DraftConfig, RunConfig, TargetConfig
from lever.engine import SpecConfig
from lever.errors import LeverError
from lever.model.tokenizer import Tokenizer
from lever.model.tokenizer_match import (TokenizerMismatchError, check_run_tokenizers, check_same_tokenizer,
                                         model_tokenizer, tokenizer_difference)
from lever.runtime import store_tokenizer

SMOL, Q05, Q15 = "smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
MODELS = (SMOL, Q05, Q15)
# registered models Lever does not run yet: gemma3 (and its SentencePiece vocabulary) joins MODELS
# with its support
NOT_YET_RUNNABLE = {"gemma-3-270m"}
FAMILY = {SMOL: "smollm", Q05: "qwen", Q15: "qwen"}


class FakeGGUF:
    """Just enough of a GGUFFile for `Tokenizer.from_gguf`."""

    def __init__(self, metadata, path="fake.gguf"):
        self.metadata, self.path = metadata, path


def tiny(tokens=("a", "b", "ab", "<|end|>"), types=(1, 1, 1, 3), merges=("a b",), **over) -> Tokenizer:
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": list(tokens),
          "tokenizer.ggml.token_type": list(types), "tokenizer.ggml.merges": list(merges),
          "tokenizer.ggml.eos_token_id": 3}
    md.update({f"tokenizer.ggml.{k}": v for k, v in over.items()})
    return Tokenizer.from_gguf(FakeGGUF(md))


# --------------------------------------------------------------------------- the comparison


def test_identical_tokenizers_agree():
    assert tokenizer_difference(tiny(), tiny()) is None
    check_same_tokenizer(tiny(), tiny(), "t", "d")
    # a chat template is the target's alone: it does not count
    assert tokenizer_difference(tiny(), tiny(**{"add_bos_token": True})) is None


@pytest.mark.parametrize("draft,what", [
    (dict(tokens=("a", "b", "ab", "<|end|>", "ba"), types=(1, 1, 1, 3, 1), merges=("a b", "b a")),
     "the target has 4 tokens, the draft 5; the first 4 ids agree"),
    (dict(tokens=("b", "a", "ab", "<|end|>")),
     "both have 4 tokens, but id 0 is 'a' in the target, 'b' in the draft"),
    (dict(tokens=("a", "b", "ba", "<|end|>"), merges=("b a",)),
     "both have 4 tokens, but id 2 is 'ab' in the target, 'ba' in the draft"),
    (dict(bos_token_id=3),
     "the BOS token is none in the target, '<|end|>' (id 3) in the draft"),
    (dict(eos_token_id=2),
     "the EOS token is '<|end|>' (id 3) in the target, 'ab' (id 2) in the draft"),
    (dict(padding_token_id=3),
     "the padding token is none in the target, '<|end|>' (id 3) in the draft"),
    (dict(types=(1, 1, 1, 4)),
     "'<|end|>' (id 3) is a special (control) token in the target only"),
], ids=["size", "first-id", "later-id", "bos", "eos", "pad", "control"])
def test_each_difference_is_named(draft, what):
    assert tokenizer_difference(tiny(), tiny(**draft)) == what
    with pytest.raises(TokenizerMismatchError) as e:
        check_same_tokenizer(tiny(), tiny(**draft), "big", "small")
    assert str(e.value) == (
        f"the draft small cannot draft for the target big: their tokenizers differ ({what}), so the draft's "
        f"token ids would mean other tokens to the target; use --draft ngram (prompt lookup, any tokenizer)")


def test_an_unprintable_token_keeps_the_error_on_one_line():
    draft = tiny(tokens=("a", "b", "ab", "Ċ"), types=(1, 1, 1, 1))      # 'Ċ': byte-level spelling of "\n"
    with pytest.raises(TokenizerMismatchError) as e:
        check_same_tokenizer(tiny(tokens=("a", "b", "ab", "\n\t"), types=(1, 1, 1, 3)), draft, "t", "d")
    assert "\n" not in str(e.value) and r"id 3 is '\n\t' in the target, 'Ċ' in the draft" in str(e.value)


def test_not_a_model_draft_needs_no_check():
    """ngram and no draft: nothing is resolved or read (the target need not even exist)."""
    for draft in (None, "ngram"):
        config = RunConfig(TargetConfig(model="/nonexistent/model.gguf"), DraftConfig(name=draft), progress=False)
        assert check_run_tokenizers(config, None) == (None, None)


def test_files_with_the_same_tokenizer_bytes_need_no_tokenizer_built(tmp_path):
    """Two GGUFs whose tokenizer metadata is byte for byte the same pass from the header
    alone (these tiny ones have no BPE merges: no tokenizer could be built from them)."""
    from tiny_model import write_tiny_gguf
    target = write_tiny_gguf(tmp_path / "target.gguf", seed=1)
    draft = write_tiny_gguf(tmp_path / "draft.gguf", seed=2)
    config = RunConfig(TargetConfig(model=str(target)), DraftConfig(name=str(draft)), cache_dir=str(tmp_path),
                       progress=False)
    target_gguf, draft_gguf = check_run_tokenizers(config, None)
    assert (target_gguf.path, draft_gguf.path) == (target, draft)


# --------------------------------------------------------------------------- every registered pair

def mismatch(target: str, draft: str, instead: str = "") -> str:
    sizes = {"smollm": ("49,152", "'<|endoftext|>'"), "qwen": ("151,936", "'!'")}
    (n_t, id0_t), (n_d, id0_d) = sizes[FAMILY.get(target, "smollm")], sizes[FAMILY[draft]]
    return (f"lever: error: the draft {draft} cannot draft for the target {target}: their tokenizers differ "
            f"(the target has {n_t} tokens, the draft {n_d}; id 0 is {id0_t} in the target, {id0_d} in the draft), "
            f"so the draft's token ids would mean other tokens to the target; "
            f"use --draft ngram (prompt lookup, any tokenizer){instead}")


KEEP_WITH_Q15 = f", or keep this draft with the target {Q15} (the draft's tokenizer)"


def keep_with_q15(cache: str) -> str:
    """The suggestion of the 1.5B target, made only where it is assembled in `cache`
    (the 1.5B model is installed for `-m slow` runs only)."""
    from lever.gguf.registry import KNOWN_MODELS, model_status
    return KEEP_WITH_Q15 if model_status(KNOWN_MODELS[Q15], cache).assembled else ""
MISMATCHES = {          # (target, draft) -> the error line, given the cache
    (Q05, SMOL): lambda cache: mismatch(Q05, SMOL),
    (Q15, SMOL): lambda cache: mismatch(Q15, SMOL, f" or --draft {Q05} (the target's tokenizer)"),
    (SMOL, Q05): lambda cache: mismatch(SMOL, Q05, keep_with_q15(cache)),
    (SMOL, Q15): lambda cache: mismatch(SMOL, Q15),
}
PAIRS = [(t, d) for t in MODELS for d in MODELS]


def pair_params(pairs):
    """Pairs as parameters; those with the 1.5B model are `slow` (its 22 parts are not in the test extra)."""
    return [pytest.param(t, d, id=f"{t}-{d}", marks=[pytest.mark.slow] if Q15 in (t, d) else [])
            for t, d in pairs]


@pytest.fixture(scope="module")
def installed(smollm2_path, qwen05_path, lever_cache):
    """The cache holding the registered models the default run installs (SmolLM2, the 0.5B)."""
    return str(lever_cache)


@pytest.fixture
def pair_installed(installed, request, target, draft):
    """`installed`, with the 1.5B model assembled too when the pair names it."""
    if Q15 in (target, draft):
        request.getfixturevalue("qwen15_path")
    return installed


def test_pairs_cover_the_registry():
    from lever.gguf.registry import KNOWN_MODELS
    assert set(MODELS) == set(KNOWN_MODELS) - NOT_YET_RUNNABLE
    assert {p for p in PAIRS if FAMILY[p[0]] != FAMILY[p[1]]} == set(MISMATCHES)


@pytest.mark.real
@pytest.mark.parametrize("target,draft", pair_params(sorted(MISMATCHES)))
def test_differing_pair_is_one_line_before_loading(pair_installed, capsys, monkeypatch, target, draft):
    """The error comes from the headers: loading a model at all would fail the test."""
    import lever.runtime as runtime

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the tokenizers were compared")
    monkeypatch.setattr(runtime, "load_model", no_load)
    monkeypatch.setattr(runtime, "load_in_memory", no_load)
    rc = main(["generate", "--model", target, "--draft", draft, "--prompt", "hi", "--max-new-tokens", "2",
               "--cache-dir", pair_installed])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [MISMATCHES[target, draft](pair_installed)]


@pytest.mark.real
@pytest.mark.parametrize("target,draft", pair_params([p for p in PAIRS if p not in MISMATCHES]))
def test_equal_pair_passes_the_check(pair_installed, target, draft):
    installed = pair_installed
    config = RunConfig(TargetConfig(model=target), DraftConfig(name=draft), cache_dir=installed, progress=False)
    target_gguf, draft_gguf = check_run_tokenizers(config, None)
    assert target_gguf is not None and draft_gguf is not None      # parsed once, handed to the loaders
    # the full comparison (not only the equal-bytes shortcut) agrees
    check_same_tokenizer(model_tokenizer(target_gguf.path, installed), model_tokenizer(draft_gguf.path, installed),
                         target, draft)


@pytest.mark.real
def test_equal_pair_generates(installed, capsys):
    rc = main(["generate", "--model", SMOL, "--draft", SMOL, "--prompt", "hi", "--max-new-tokens", "3",
               "--cache-dir", installed, "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    out = json.loads(captured.out.strip().splitlines()[-1])
    assert 1 <= out["new_tokens"] <= 3 and out["draft"] == SMOL and "speculative" in out


@pytest.mark.real
def test_a_draft_whose_tokenizer_cannot_be_read_is_refused(installed, tmp_path, capsys):
    from tiny_model import write_tiny_gguf
    draft = write_tiny_gguf(tmp_path / "tiny.gguf")
    rc = main(["generate", "--model", SMOL, "--draft", str(draft), "--prompt", "hi", "--cache-dir", installed])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"lever: error: the draft {draft} cannot be checked against the target {SMOL}: "
                             f"its tokenizer cannot be read (") and "tokenizer.ggml.merges" in err[0], err
    assert err[0].endswith("; use --draft ngram (prompt lookup, any tokenizer)"), err


# --------------------------------------------------------------------------- a store target, the Python API

@pytest.mark.real
def test_store_target_is_compared_with_its_tokenizer_metadata(installed, smol_store, capsys):
    rc = main(["generate", "--target-store", str(smol_store), "--draft", Q05, "--prompt", "hi",
               "--max-new-tokens", "2", "--cache-dir", installed])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip().splitlines() == [mismatch(str(smol_store), Q05, keep_with_q15(installed))]
    config = RunConfig(TargetConfig(store=smol_store), DraftConfig(name=SMOL), cache_dir=installed, progress=False)
    check_run_tokenizers(config, store_tokenizer(smol_store, installed))


@pytest.mark.real
def test_api_drafter_with_another_tokenizer(installed, monkeypatch):
    """`lever.load(...).generate(drafter=make_drafter(...))`: the same error in the
    API's words, at the first generate with that drafter, instead of a traceback."""
    monkeypatch.setenv("LEVER_CACHE_DIR", installed)
    smol = lever.load(SMOL, progress=False)
    drafter = make_drafter(Q05, progress=False)
    with pytest.raises(LeverError) as e:
        smol.generate("hi", max_new_tokens=2, drafter=drafter, spec=SpecConfig("chain", draft_len=2))
    assert str(e.value) == mismatch(SMOL, Q05, keep_with_q15(installed)).replace(
        "lever: error: ", "").replace("--draft ngram", "make_drafter('ngram')")
    same = make_drafter(SMOL, progress=False)
    out = smol.generate("hi", max_new_tokens=2, drafter=same, spec=SpecConfig("chain", draft_len=2))
    assert out.token_ids == smol.generate("hi", max_new_tokens=2).token_ids

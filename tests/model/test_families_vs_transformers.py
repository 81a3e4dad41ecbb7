"""Lever's native decoder on each family's tiny GGUF (tests/hf_tiny.py:
random weights, written by llama.cpp's converter and llama-quantize) against
transformers on the same GGUF's weights dequantised by the `gguf` package.

Families Lever does not load yet are strict xfails ("family not yet
supported"): a family that starts passing fails the run until its entry
joins SUPPORTED.  Only a LeverError (e.g. UnsupportedModelError) or a failed
comparison counts as the expected failure; a broken fixture is an error.

Bounds (logits here have std ~0.8):
- F32 / BF16 weights: Lever multiplies them with float32 activations (no
  activation quantisation: that is only for quantised matrices), so the
  two differ by float32 rounding and summation order only -- measured
  <= 4e-6; bound EXACT_BOUND = 1e-4.
- Q8_0 / Q6_K / Q4_K_M: both sides use the same quantised weights, but Lever
  quantises each activation block to 8 bits before the dot product, as
  llama.cpp does (tests/model/test_quantized_model.py: a few tenths on the
  real models).  Measured here (llama, mistral, qwen2): max 0.114, mean
  0.017; bounds QUANT_BOUND =
  0.3 and QUANT_MEAN_BOUND = 0.04.  A wrong feature moves these logits by
  0.2-4 (tests/model/test_hf_tiny.py's checks and GGUF_FAITHFUL's notes).
- Teacher-forced greedy: if every logit is within e of the reference, the
  token Lever picks is at most 2e below the reference's best, so each gap
  teacher_forced_gaps reports must be <= 2 * the logit bound.

Prompts (hf_tiny.PROMPT_LENGTHS): 24 tokens (inside LongRoPE's original
context: short factors) and 100 (past llama3's original context of 64);
both cross gemma3's sliding window of 8.

LongRoPE: transformers picks the factor set by the length of the sequence
in the pass, for every position, so a sequence that grows past the original
context re-rotates every cached key -- which no KV cache can follow.  Lever
runs the short factors and caps the context at the original one
(lever/arch/phi3.py); so phi3/longrope is checked within its original
context (32 tokens), and a longer generation must be refused in one line.
"""

from __future__ import annotations

import numpy as np
import pytest

from lever.autoregressive import generate_tokens
from lever.errors import LeverError
from lever.masks import causal_mask

hf_tiny = pytest.importorskip("hf_tiny")
pytest.importorskip("transformers")

# every recipe (mistral is GGUF arch llama)
SUPPORTED = set(hf_tiny.RECIPES)
FAST_OUTTYPES = ("f32", "q4_k_m")            # the rest are marked slow (each another conversion)
EXACT = ("f32", "bf16")
EXACT_BOUND = 1e-4
QUANT_BOUND = 0.3
QUANT_MEAN_BOUND = 0.04
NEW_TOKENS = 16


def bound(outtype: str) -> float:
    return EXACT_BOUND if outtype in EXACT else QUANT_BOUND


def cases():
    for family, variant in hf_tiny.RECIPES:
        for outtype in hf_tiny.OUTTYPES:
            marks = [] if outtype in FAST_OUTTYPES else [pytest.mark.slow]
            if (family, variant) not in SUPPORTED:
                marks.append(pytest.mark.xfail(strict=True, raises=(LeverError, AssertionError),
                                               reason="family not yet supported"))
            yield pytest.param(family, variant, outtype, marks=marks, id=f"{family}-{variant}-{outtype}")


@pytest.fixture
def gguf(family, variant, outtype):
    return hf_tiny.to_gguf(hf_tiny.make_checkpoint(family, variant), outtype)


def lever_model(path):
    from lever.model.loading import load_model
    model, _ = load_model(path, dtype="float32", kernels="native")
    return model


def lever_logits(model, ids: np.ndarray) -> np.ndarray:
    n = len(ids)
    return model.forward(ids.astype(np.int64), np.arange(n, dtype=np.int64), causal_mask(n, 0),
                         model.new_cache(n))


LONGROPE = ("phi3", "longrope")
LONGROPE_CONTEXT = 32                       # the recipe's original context: Lever's max_context for it


def prompt_lengths(family, variant) -> list[int]:
    return [n for n in hf_tiny.PROMPT_LENGTHS if (family, variant) != LONGROPE or n <= LONGROPE_CONTEXT]


@pytest.mark.parametrize("family,variant,outtype", list(cases()))
def test_logits_match_transformers(family, variant, outtype, gguf):
    ref = {n: hf_tiny.hf_logits(gguf, hf_tiny.prompt_ids(n)) for n in prompt_lengths(family, variant)}
    model = lever_model(gguf)
    for n, want in ref.items():
        got = lever_logits(model, hf_tiny.prompt_ids(n))
        assert got.shape == want.shape
        diff = np.abs(got.astype(np.float64) - want)
        print(f"{family}/{variant} {outtype} {n} tokens: max |diff| {diff.max():.2e}, mean {diff.mean():.2e}")
        assert diff.max() <= bound(outtype), f"{n} tokens: max |diff| {diff.max():.3g} at row {diff.max(1).argmax()}"
        if outtype not in EXACT:
            assert diff.mean() <= QUANT_MEAN_BOUND


@pytest.mark.parametrize("family,variant,outtype", list(cases()))
def test_greedy_tokens_are_transformers_argmax_up_to_near_ties(family, variant, outtype, gguf):
    prompt = hf_tiny.prompt_ids(prompt_lengths(family, variant)[-1], seed=1)
    model = lever_model(gguf)
    new = min(NEW_TOKENS, model.config.max_context - len(prompt))
    tokens = generate_tokens(model, prompt.tolist(), new).token_ids
    assert len(tokens) == new
    seq = np.concatenate([prompt, np.array(tokens[:-1], dtype=np.int64)])
    ref = hf_tiny.hf_logits(gguf, seq)[len(prompt) - 1:]
    gaps = hf_tiny.teacher_forced_gaps(ref, tokens)
    print(f"{family}/{variant} {outtype}: {len(gaps)} of {new} greedy tokens differ from the argmax: {gaps}")
    assert all(gap <= 2 * bound(outtype) for *_, gap in gaps), gaps


def test_longrope_past_the_original_context_is_refused_in_one_line():
    model = lever_model(hf_tiny.to_gguf(hf_tiny.make_checkpoint(*LONGROPE), "f32"))
    assert model.config.max_context == LONGROPE_CONTEXT and model.config.rope_scaling == "longrope"
    with pytest.raises(LeverError) as e:
        generate_tokens(model, hf_tiny.prompt_ids(24).tolist(), 16)
    assert "\n" not in str(e.value) and "context" in str(e.value)

"""The tiny-checkpoint fixture itself (tests/hf_tiny.py), no Lever involved:
every recipe converts to GGUF with llama.cpp's converter, and transformers
reading that GGUF gives the checkpoint's own logits; the prompts the family
comparisons use reach each recipe's feature.

Bounds.  An F32 GGUF holds the checkpoint's float32 weights bit for bit, so
transformers-from-GGUF runs the same float32 graph on the same numbers as
transformers-from-checkpoint: the logits agree to float rounding (measured:
exactly 0; bound 1e-5 absolute, logits have std ~0.8).  A config read from
the GGUF may round a float (rms eps 1e-5 is stored as float32), which moves
logits by ~1e-7.  A feature that is reached moves logits by far more than
the 0.05 its check asks (measured 0.2-4).
"""

from __future__ import annotations

import numpy as np
import pytest

hf_tiny = pytest.importorskip("hf_tiny")
pytest.importorskip("transformers")

F32_BOUND = 1e-5
FEATURE_MOVES = 0.05


@pytest.fixture(scope="module", params=list(hf_tiny.RECIPES), ids=lambda r: f"{r[0]}-{r[1]}")
def built(request):
    family, variant = request.param
    ckpt = hf_tiny.make_checkpoint(family, variant)
    return family, variant, ckpt, hf_tiny.to_gguf(ckpt, "f32")


def test_f32_gguf_gives_the_checkpoints_logits(built):
    family, variant, ckpt, gguf = built
    for n in hf_tiny.PROMPT_LENGTHS:
        ids = hf_tiny.prompt_ids(n)
        ref = hf_tiny.hf_logits(ckpt, ids)
        got = hf_tiny.hf_logits(gguf, ids)
        assert got.shape == ref.shape == (n, hf_tiny.VOCAB)
        assert np.abs(got - ref).max() <= F32_BOUND, f"{family}/{variant}, {n} tokens"
        assert ref.std() > 0.3                  # not a degenerate model: logits spread


def test_gguf_faithful_lists_exactly_what_transformers_reads_whole(built):
    """from_pretrained(gguf_file=...) rebuilds the architecture for GGUF_FAITHFUL
    recipes only; if transformers learns another one, move it into the set."""
    family, variant, ckpt, gguf = built
    ids = hf_tiny.prompt_ids(hf_tiny.PROMPT_LENGTHS[-1])
    ref = hf_tiny.hf_logits(ckpt, ids)
    try:
        got = hf_tiny.hf_logits(gguf, ids, gguf_config="gguf")
        diff = float(np.abs(got - ref).max())
    except ValueError as e:                     # smollm3: "GGUF model with architecture ... not supported"
        assert "not supported" in str(e)
        diff = None
    if (family, variant) in hf_tiny.GGUF_FAITHFUL:
        assert diff is not None and diff <= F32_BOUND
    else:
        assert diff is None or diff > FEATURE_MOVES, f"{family}/{variant} now loads whole from GGUF ({diff})"


@pytest.mark.parametrize("recipe", list(hf_tiny.FEATURE_OFF), ids=lambda r: f"{r[0]}-{r[1]}")
def test_the_prompts_reach_the_recipes_feature(recipe):
    """Each switchable feature changes the logits of both prompt lengths (the
    others -- head_dim != hidden / heads, q/k norms -- act on every row)."""
    family, variant = recipe
    ckpt = hf_tiny.make_checkpoint(family, variant)
    what, _ = hf_tiny.FEATURE_OFF[recipe]
    off = hf_tiny.load_hf_without_feature(ckpt)
    for n in hf_tiny.PROMPT_LENGTHS:
        ids = hf_tiny.prompt_ids(n)
        diff = np.abs(hf_tiny.hf_logits(ckpt, ids) - hf_tiny.hf_logits(off, ids)).max(axis=-1)
        assert diff.max() > FEATURE_MOVES, f"{family}/{variant}: {n} tokens never reach {what}"
        if family == "gemma3":
            window = hf_tiny.RECIPES[(family, variant)][2]["sliding_window"]
            assert diff[:window].max() <= F32_BOUND          # inside the window nothing is cut off
            assert diff[window:].min() > 0


def test_a_k_quant_gets_k_quant_types():
    """llama-quantize Q4_K_M on a 256-wide model: the matrices are Q4_K (a few
    Q6_K, as llama.cpp mixes them), norms stay F32; the sidecar records it."""
    ckpt = hf_tiny.make_checkpoint("llama", "base")
    types = hf_tiny.tensor_types(hf_tiny.to_gguf(ckpt, "q4_k_m"))
    matrices = {k: v for k, v in types.items() if not k.endswith("norm.weight")}
    assert set(matrices.values()) <= {"Q4_K", "Q6_K"} and "Q4_K" in matrices.values()
    assert {v for k, v in types.items() if k.endswith("norm.weight")} == {"F32"}


def test_teacher_forced_gaps_finds_and_measures_divergences():
    logits = np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.5, 0.4]], dtype=np.float32)
    assert hf_tiny.teacher_forced_gaps(logits, [1, 0, 1]) == []
    gaps = hf_tiny.teacher_forced_gaps(logits, [2, 0, 2])
    assert [(p, t, best) for p, t, best, _ in gaps] == [(0, 2, 1), (2, 2, 1)]
    assert [round(g, 6) for *_, g in gaps] == [1.0, 0.1]
    with pytest.raises(ValueError, match="one logits row per token"):
        hf_tiny.teacher_forced_gaps(logits, [1, 0])


def test_tiny_tokenizer_round_trips_text(tmp_path):
    from tokenizers import Tokenizer
    hf_tiny.tiny_tokenizer(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == hf_tiny.VOCAB
    text = "the quick brown fox: déjà vu 🦙\n\tdef f(x): return x"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text and max(ids) < hf_tiny.VOCAB - len(hf_tiny.SPECIAL)
    assert len(ids) < len(text.encode())          # the merges merge
    assert [tok.token_to_id(s) for s in hf_tiny.SPECIAL] == list(range(hf_tiny.VOCAB - 4, hf_tiny.VOCAB))

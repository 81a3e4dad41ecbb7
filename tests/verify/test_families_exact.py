"""Every registered family, resident and streamed from a flash store, in
every decoding mode, gives exactly the target's own greedy tokens.

Tiny GGUFs of each family come from tests/arch_gguf.py (each family's
metadata and tensor names as its module reads them: gemma3's sliding window
of 4 tokens and local RoPE base, phi3's fused tensors and partial rotary,
llama3's rope_freqs, smollm3's NoPE layers ...).  The target has F32
matrices; its draft is the same random model with Q8_0 matrices (a
lower-precision copy, as a phone keeps one: same vocabulary, most of its
tokens accepted).  Prompts are longer than gemma3's window and generation
runs well past it, so trees are verified across the window's edge (the tree
mask composed with the window mask).

On the native decoder every row of a pass is computed as if alone, so no
near-tie is tolerated: the tokens must be identical.
"""

from __future__ import annotations

import numpy as np
import pytest

from arch_gguf import write_arch_gguf
from lever.arch import FAMILIES
from lever.autoregressive import generate_tokens
from lever.draft.base import TreeShape
from lever.draft.gain_cost import CostCurves, GainCostPolicy
from lever.draft.model_drafter import ModelDrafter
from lever.draft.ngram import NgramDrafter
from lever.engine import SpecConfig, run_speculative, speculative_generate
from lever.model.native_loader import load_gguf_native
from lever.model.streamed_decoder import StreamedDecoder
from lever.remote.client import RemoteVerifier
from lever.remote.server import ServerThread, VerifierServer
from lever.sampling import SamplingParams
from lever.store.convert import convert

NEW_TOKENS = 20
# (family, write_arch_gguf keywords): every family, plus its scaled-RoPE variants
VARIANTS = [(arch, {}) for arch in FAMILIES] + [("llama", {"rope_freqs": True}), ("phi3", {"longrope": True})]


def lever_spec() -> SpecConfig:
    """Mode lever with synthetic I/O-bound costs (trees of several levels pay off)."""
    costs = CostCurves.linear(0.05, 0.0005, 0.002, 0.0002, overhead_s=0.001)
    return SpecConfig("lever", policy=GainCostPolicy(costs, max_nodes=16, max_depth=5, topk=3, adapt=False))


SPECS = {"chain4": SpecConfig("chain", draft_len=4),
         "tree12x3x4": SpecConfig("tree", tree=TreeShape(budget=12, topk=3, depth=4)),
         "lever": lever_spec()}


def variant_id(v) -> str:
    arch, kw = v
    return "-".join([arch] + sorted(kw))


def prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(5)
    out = []
    for length in (9, 14):
        ids = rng.integers(0, vocab, length).tolist()
        out.append(ids + ids[: length // 2])          # a repeated span: prompt lookup finds drafts
    return out


@pytest.fixture(scope="module", params=VARIANTS, ids=variant_id)
def family_files(request, tmp_path_factory):
    arch, kw = request.param
    d = tmp_path_factory.mktemp(variant_id(request.param))
    target = write_arch_gguf(d / "target.gguf", arch, seed=3, **kw)
    draft = write_arch_gguf(d / "draft.gguf", arch, seed=3, matrix_type="Q8_0", **kw)
    store = convert(str(target), d / "store", progress=False)
    return variant_id(request.param), target, draft, store


def check_modes(label, target, draft, reference):
    """Every mode with the model draft and prompt lookup gives `reference` (prompt -> tokens)."""
    accepted = 0
    for ids, want in reference.items():
        for name, spec in SPECS.items():
            drafters = [("model", ModelDrafter(draft))] + ([("ngram", NgramDrafter())] if name != "lever" else [])
            for dname, drafter in drafters:
                result, stats = speculative_generate(target, drafter, list(ids), len(want), spec=spec)
                assert result.token_ids == want, f"{label} {dname} {name} prompt {ids}"
                accepted += stats.accepted
    print(f"{label}: {accepted} draft tokens accepted")
    assert accepted > 0, f"{label}: no draft token was ever accepted (the check would mean little)"


def test_resident_and_streamed_every_mode_is_the_target_alone(family_files):
    label, target_path, draft_path, store = family_files
    target, _ = load_gguf_native(target_path, "float32")
    draft, _ = load_gguf_native(draft_path, "float32")
    context = target.config.max_context
    reference = {}
    for ids in prompts(target.config.vocab_size):
        n = min(NEW_TOKENS, context - len(ids) - 16)
        reference[tuple(ids)] = generate_tokens(target, ids, n).token_ids
        assert len(reference[tuple(ids)]) == n
    check_modes(f"{label} resident", target, draft, reference)
    streamed = StreamedDecoder(store, 64 << 20, "float32")
    try:
        for ids, want in reference.items():
            assert generate_tokens(streamed, list(ids), len(want)).token_ids == want, f"{label} store ar"
        check_modes(f"{label} store", streamed, draft, reference)
    finally:
        streamed.close()


# -- the SPADE setting: a Llama-3.2-style pair sharing one vocabulary, verified remotely --

@pytest.fixture(scope="module")
def llama3_pair(tmp_path_factory):
    """A llama3-scaled target (rope_freqs) and a smaller draft of the same
    family and vocabulary (fewer layers, Q8_0): Llama-3.2-1B drafting for
    Llama-3.1-8B in miniature."""
    d = tmp_path_factory.mktemp("llama3-pair")
    target = write_arch_gguf(d / "target.gguf", "llama", seed=3, rope_freqs=True)
    draft = write_arch_gguf(d / "draft.gguf", "llama", seed=3, rope_freqs=True, matrix_type="Q8_0", layers=2)
    return load_gguf_native(target, "float32")[0], load_gguf_native(draft, "float32")[0]


@pytest.mark.parametrize("mode", ["ar", "chain4", "tree12x3x4", "lever"])
def test_llama3_pair_remote_is_the_target_alone(llama3_pair, mode):
    target, draft = llama3_pair
    assert target.config.rope_scaling == "llama3" and draft.config.n_layers < target.config.n_layers
    spec = SpecConfig("ar") if mode == "ar" else SPECS[mode]
    server = VerifierServer(target, "llama3-tiny", verify_cost={"n": [1, 64], "s": [0.01, 0.1]},
                            log=lambda line: None)
    with ServerThread(server) as running:
        for ids in prompts(target.config.vocab_size):
            want = generate_tokens(target, ids, NEW_TOKENS).token_ids
            local, _ = speculative_generate(target, ModelDrafter(draft), ids, NEW_TOKENS, spec=spec)
            verifier = RemoteVerifier(running.url, SamplingParams())
            try:
                remote, _ = run_speculative(verifier, ModelDrafter(draft), ids, NEW_TOKENS, SamplingParams(), spec)
            finally:
                verifier.close()
            assert local.token_ids == want and remote.token_ids == want, (mode, ids)

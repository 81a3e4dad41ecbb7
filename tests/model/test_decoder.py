"""The torch decoder against Hugging Face transformers, and the KV cache paths."""

import pytest
import torch

from lever.reference.checkpoint_loader import load_checkpoint_model
from lever.reference.decoder import causal_mask

import transformers


def hf_model(arch: str, tie: bool, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(vocab_size=211, hidden_size=64, intermediate_size=112, num_hidden_layers=3,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5, tie_word_embeddings=tie)
    if arch == "llama":
        cfg = transformers.LlamaConfig(rope_theta=10000.0, **common)
        model = transformers.LlamaForCausalLM(cfg)
    elif arch == "qwen3":                   # q / k norms, a head size other than hidden / heads
        cfg = transformers.Qwen3Config(rope_theta=1e6, head_dim=16, **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(rope_theta=1e6, **common)
        model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():   # biases are zero at init; make them count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.fixture(scope="module", params=[("llama", False), ("llama", True), ("qwen2", False), ("qwen2", True),
                                        ("qwen3", True)],
                ids=lambda p: f"{p[0]}-{'tied' if p[1] else 'untied'}")
def pair(request, tmp_path_factory):
    arch, tie = request.param
    hf = hf_model(arch, tie)
    d = tmp_path_factory.mktemp(f"{arch}{tie}")
    hf.save_pretrained(d)
    ours = load_checkpoint_model(d, torch.float32)
    return hf, ours


def full_logits(model, tokens):
    cache = model.new_cache()
    t = len(tokens)
    return model(tokens, torch.arange(t), causal_mask(t, 0), cache)


def test_logits_match_transformers(pair):
    hf, ours = pair
    tokens = torch.randint(0, 211, (37,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(tokens[None]).logits[0].float()
    got = full_logits(ours, tokens)
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() < 1e-4


def test_incremental_decoding_equals_full_recompute(pair):
    _, ours = pair
    tokens = torch.randint(0, 211, (30,), generator=torch.Generator().manual_seed(2))
    ref = full_logits(ours, tokens)
    cache = ours.new_cache(capacity=4)          # forces the cache to grow
    out = [ours(tokens[:10], torch.arange(10), causal_mask(10, 0), cache)]
    for i in range(10, 30):
        out.append(ours(tokens[i:i + 1], torch.tensor([i]), causal_mask(1, i), cache))
    got = torch.cat(out)
    assert cache.length == 30
    assert (got - ref).abs().max().item() < 1e-4


def test_batch_with_tree_mask_equals_one_by_one(pair):
    """Two branches after a shared prefix, fed as one batch with a tree mask,
    equal each branch fed token by token."""
    _, ours = pair
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 211, (8,), generator=g)
    branch_a = torch.randint(0, 211, (3,), generator=g)
    branch_b = torch.randint(0, 211, (2,), generator=g)
    # tree rows: a0 a1 a2 b0 b1 ; b hangs off the prefix like a
    tokens = torch.cat([branch_a, branch_b])
    positions = torch.tensor([8, 9, 10, 8, 9])
    mask = torch.zeros(5, 8 + 5, dtype=torch.bool)
    mask[:, :8] = True
    for i, ancestors in enumerate([[0], [0, 1], [0, 1, 2], [3], [3, 4]]):
        mask[i, [8 + a for a in ancestors]] = True
    cache = ours.new_cache()
    ours(prefix, torch.arange(8), causal_mask(8, 0), cache)
    got = ours(tokens, positions, mask, cache)
    for branch, rows in ((branch_a, [0, 1, 2]), (branch_b, [3, 4])):
        ref = full_logits(ours, torch.cat([prefix, branch]))[8:]
        assert (got[rows] - ref).abs().max().item() < 1e-4


def test_cache_compact_keeps_accepted_path(pair):
    """After verifying a tree, compacting the cache to the accepted path equals
    having decoded that path directly."""
    _, ours = pair
    g = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, 211, (6,), generator=g)
    tree = torch.randint(0, 211, (4,), generator=g)    # rows: x0, y0 (sibling), x1 (child of x0), z
    positions = torch.tensor([6, 6, 7, 6])
    mask = torch.zeros(4, 10, dtype=torch.bool)
    mask[:, :6] = True
    for i, anc in enumerate([[0], [1], [0, 2], [3]]):
        mask[i, [6 + a for a in anc]] = True
    cache = ours.new_cache()
    ours(prefix, torch.arange(6), causal_mask(6, 0), cache)
    ours(tree, positions, mask, cache)
    cache.compact(torch.tensor([0, 1, 2, 3, 4, 5, 6, 8]))     # accept x0, x1
    nxt = torch.tensor([17])
    got = ours(nxt, torch.tensor([8]), causal_mask(1, 8), cache)
    ref = full_logits(ours, torch.cat([prefix, tree[[0, 2]], nxt]))[-1:]
    assert (got - ref).abs().max().item() < 1e-4


def test_cache_truncate_then_continue(pair):
    _, ours = pair
    tokens = torch.randint(0, 211, (12,), generator=torch.Generator().manual_seed(5))
    cache = ours.new_cache()
    ours(tokens, torch.arange(12), causal_mask(12, 0), cache)
    cache.truncate(7)
    got = ours(tokens[7:9], torch.arange(7, 9), causal_mask(2, 7), cache)
    ref = full_logits(ours, tokens[:9])[7:]
    assert (got - ref).abs().max().item() < 1e-4


def test_bad_mask_shape_is_rejected(pair):
    _, ours = pair
    with pytest.raises(ValueError, match="mask has shape"):
        ours(torch.tensor([1, 2]), torch.arange(2), causal_mask(2, 1), ours.new_cache())


def test_compact_rejects_bad_indices(pair):
    _, ours = pair
    cache = ours.new_cache()
    ours(torch.tensor([1, 2, 3]), torch.arange(3), causal_mask(3, 0), cache)
    with pytest.raises(ValueError, match="strictly increasing"):
        cache.compact(torch.tensor([2, 1]))
    with pytest.raises(ValueError, match="strictly increasing"):
        cache.compact(torch.tensor([0, 5]))


@pytest.mark.parametrize("model_type", ["smollm3", "gemma3_text", "phi3", "mistral"])
def test_checkpoints_of_undescribed_blocks_are_refused_in_one_line(model_type):
    """A checkpoint whose block config_from_hf does not describe (smollm3's NoPE
    layers, Gemma 3's sandwich norms, ...) is refused, never run as Llama's."""
    from lever.errors import UnsupportedModelError
    from lever.reference.checkpoint_loader import config_from_hf
    hf = dict(model_type=model_type, vocab_size=211, hidden_size=64, intermediate_size=112,
              num_hidden_layers=2, num_attention_heads=8)
    with pytest.raises(UnsupportedModelError) as e:
        config_from_hf(hf, "config.json")
    assert len(str(e.value).splitlines()) == 1 and repr(model_type) in str(e.value)


def test_export_refuses_a_block_transformers_classes_here_do_not_describe():
    from lever.errors import UnsupportedModelError
    from lever.reference.hf_export import hf_from_ours
    from block_model import block_config, random_tensors, reference_model
    cfg = block_config(sandwich_norms=True)
    model = reference_model(cfg, random_tensors(cfg)).decoder
    with pytest.raises(UnsupportedModelError, match="sandwich_norms is not exported"):
        hf_from_ours(model)

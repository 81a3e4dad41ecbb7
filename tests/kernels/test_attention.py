"""Native masked attention (`lever.reference.attention.attend`) against torch's SDPA,
and the property the decoder relies on: a row's output does not depend on the
other rows of the pass, nor on masked keys."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lever import _native
from lever.reference.attention import attend


def sdpa(q, k, v, mask):
    h, t, d = q.shape
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True)
    return out.transpose(0, 1).reshape(t, h * d)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads,kv_heads,d", [(14, 2, 64), (12, 2, 128), (9, 3, 64), (4, 4, 40)])
@pytest.mark.parametrize("t,length", [(1, 1), (1, 37), (8, 40), (64, 300)])
def test_matches_sdpa(dtype, tol, heads, kv_heads, d, t, length):
    g = torch.Generator().manual_seed(t * 1000 + length + d)
    q = torch.randn(heads, t, d, generator=g).to(dtype)
    k = torch.randn(kv_heads, length, d, generator=g).to(dtype)
    v = torch.randn(kv_heads, length, d, generator=g).to(dtype)
    mask = torch.rand(t, length, generator=g) < 0.7
    mask[:, 0] = True                              # every row sees at least one key
    got = attend(q, k, v, mask)
    assert got.dtype == dtype and got.shape == (t, heads * d)
    torch.testing.assert_close(got.float(), sdpa(q, k, v, mask), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_are_independent_of_the_batch_and_of_masked_keys(dtype):
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, d, length = 14, 2, 64, 120
    q = torch.randn(heads, 32, d, generator=g).to(dtype)
    k = torch.randn(kv_heads, length, d, generator=g).to(dtype)
    v = torch.randn(kv_heads, length, d, generator=g).to(dtype)
    mask = torch.ones(32, length, dtype=torch.bool).tril(length - 32)
    full = attend(q, k, v, mask)
    for i in (0, 7, 31):
        alone = attend(q[:, i:i + 1], k, v, mask[i:i + 1])
        assert torch.equal(alone, full[i:i + 1])
        # the same row over only the keys it can see (as when it is decoded alone)
        n = int(mask[i].sum())
        short = attend(q[:, i:i + 1], k[:, :n], v[:, :n], mask[i:i + 1, :n])
        assert torch.equal(short, full[i:i + 1])


def test_strided_inputs_and_fully_masked_rows():
    q = torch.randn(6, 4, 16)[:, :, :]            # from a [T, H, d] tensor, as in the decoder
    qt = torch.randn(4, 6, 16).transpose(0, 1)
    cache = torch.randn(2, 50, 16)                # capacity 50, 20 rows used
    k, v = cache[:, :20], torch.randn(2, 50, 16)[:, :20]
    mask = torch.ones(4, 20, dtype=torch.bool)
    mask[2] = False
    for qq in (q, qt):
        got = attend(qq, k, v, mask)
        assert torch.equal(got[2], torch.zeros(6 * 16))
        keep = [0, 1, 3]
        torch.testing.assert_close(got[keep], sdpa(qq, k, v, mask)[keep], rtol=2e-6, atol=2e-6)


def test_bad_arguments():
    q, k = np.zeros((4, 2, 8), np.float32), np.zeros((3, 5, 8), np.float32)
    mask, out = np.ones((2, 5), bool), np.zeros((2, 32), np.float32)
    with pytest.raises(ValueError, match="multiple of the kv heads"):
        _native.attention(q, k, k, mask, 1.0, out)
    k = np.zeros((2, 5, 8), np.float32)
    with pytest.raises(ValueError, match="mask"):
        _native.attention(q, k, k, np.ones((2, 4), bool), 1.0, out)
    with pytest.raises(ValueError, match="out must have shape"):
        _native.attention(q, k, k, mask, 1.0, np.zeros((2, 31), np.float32))
    with pytest.raises(ValueError, match="same dtype"):
        _native.attention(q, k, k.astype(np.uint16), mask, 1.0, out)
    with pytest.raises(ValueError, match="float32 or uint16"):
        _native.attention(q.astype(np.float64), k, k, mask, 1.0, out)

"""specdec.head_layers.attention with grouped-query heads: the query heads sharing a KV head packed as its query rows
give what SDPA gives over keys and values repeated per query head, for one and several query tokens, bool and
additive masks, a mask shared by the batch, no mask, and a mask per head or of three dimensions (which repeat the
keys instead)."""

import pytest
import torch
import torch.nn.functional as F

from specdec.head_layers import attention


def _repeated(q, k, v, mask, scale=None):
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                          attn_mask=mask, scale=scale)


@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize("kind", ["none", "bool", "additive", "batch-shared", "per-head", "3-d"])
def test_grouped_query_heads_are_packed_not_repeated(t, kind):
    g = torch.Generator().manual_seed(t)
    b, nh, nk, s, d = 2, 6, 2, 11, 16
    q = torch.randn(b, nh, t, d, generator=g)
    k, v = torch.randn(b, nk, s, d, generator=g), torch.randn(b, nk, s, d, generator=g)
    seen = torch.rand(b, 1, t, s, generator=g) > 0.3
    seen[..., 0] = True  # every query sees a key
    per_head = seen.expand(b, nh, t, s) & (torch.rand(b, nh, t, s, generator=g) > 0.2)
    per_head[..., 0] = True
    mask = {"none": None, "bool": seen, "additive": torch.where(seen, 0.0, float("-inf")), "batch-shared": seen[:1],
            "per-head": per_head, "3-d": seen[0]}[kind]
    got = attention(q, k, v, mask, scale=0.3)
    assert got.shape == (b, nh, t, d)
    torch.testing.assert_close(got, _repeated(q, k, v, mask, scale=0.3), atol=1e-6, rtol=1e-5)
    # a strided query (as a [b, t, heads, d] projection transposed) gives the same
    torch.testing.assert_close(attention(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, mask, scale=0.3), got)


def test_heads_that_do_not_share_kv_heads_evenly_are_refused():
    q, k = torch.randn(1, 5, 1, 8), torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="attention: 5 query heads do not share 2 KV heads evenly"):
        attention(q, k, k)

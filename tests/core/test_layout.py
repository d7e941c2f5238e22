"""pack_tokens / logit_rows: exact layouts, and the small-batch Python loops equal to the vectorised path."""

from __future__ import annotations

import random

import numpy as np
import pytest

import specdec.layout as layout


def test_exact_layout_of_a_small_step():
    out = layout.pack_tokens([2, 0], [[7, 8, 9], [5]], [3, 1], 3, 4)
    assert out.tolist() == [[5, 0, 0, 0], [0, 0, 0, 0], [7, 8, 9, 0]]
    assert layout.logit_rows([2, 0], 4, [3, 1], [2, 1]).tolist() == [9, 10, 0]
    assert layout.logit_rows([1], 6, [6], [0]).tolist() == []


@pytest.mark.parametrize("seed", range(4))
def test_small_batches_pack_as_the_vectorised_path(seed, monkeypatch):
    rng = random.Random(seed)
    for _ in range(100):
        b, q = rng.randint(1, layout.SMALL_BATCH + 3), rng.randint(1, 8)
        num_rows = b + rng.randint(0, 3)
        rows = rng.sample(range(num_rows), b)
        lens = [rng.randint(1, q) for _ in range(b)]
        tokens = [[rng.randint(0, 99) for _ in range(n)] for n in lens]
        wanted = [rng.randint(0, n) for n in lens]
        out = np.full((num_rows, q), 5, dtype=np.int64)  # stale values from an earlier step are cleared
        small = (layout.pack_tokens(rows, tokens, lens, num_rows, q, out=out).copy(),
                 layout.logit_rows(rows, q, lens, wanted))
        with monkeypatch.context() as m:
            m.setattr(layout, "SMALL_BATCH", 0)
            big = layout.pack_tokens(rows, tokens, lens, num_rows, q), layout.logit_rows(rows, q, lens, wanted)
        assert np.array_equal(small[0], big[0])
        assert np.array_equal(small[1], big[1]) and small[1].dtype == big[1].dtype == np.int64


@pytest.mark.parametrize("seed", range(3))
def test_device_tree_layout_equals_the_host_layout(seed):
    """tree_layout_device (in the tree graphs) gives tree_layout's depths and ancestor sets for real nodes; bad
    parents are clamped into a tree, never read out of range."""
    import torch
    rng = random.Random(seed)
    for _ in range(50):
        b, q = rng.randint(1, 4), rng.randint(1, 40)
        lens = [rng.randint(1, q) for _ in range(b)]
        parents = [[rng.randrange(j) for j in range(1, n)] for n in lens]
        depth, sees = layout.tree_layout(list(range(b)), parents, lens, b, q)
        dev_par = torch.zeros(b, q, dtype=torch.long)
        for i, par in enumerate(parents):
            dev_par[i, 1: lens[i]] = torch.tensor(par, dtype=torch.long)
        d, s = layout.tree_layout_device(dev_par)
        for i, n in enumerate(lens):
            assert d[i, :n].tolist() == depth[i, :n].tolist()
            assert s[i, :n, :n].numpy().tolist() == sees[i, :n, :n].tolist()
    d, s = layout.tree_layout_device(torch.tensor([[7, 5, -3, 2]]))  # parents past / before the node: clamped
    assert d.tolist() == [[0, 1, 1, 2]]
    assert s[0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]

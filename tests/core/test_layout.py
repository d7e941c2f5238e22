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

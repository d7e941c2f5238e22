"""EagleProposer's catch-up layout: the row-by-row version for small batches equals the vectorised one, and both
refuse a hand-over that skipped positions."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

import specdec_eagle.proposer as eagle


class _State:
    _catch_up = eagle.EagleProposer._catch_up
    _catch_up_small = eagle.EagleProposer._catch_up_small


def _batch(rng: random.Random, b: int) -> tuple[_State, SimpleNamespace]:
    state, qsl, last, n = _State(), [0], [], [rng.randint(3, 40) for _ in range(b)]
    state.committed = {}
    for i in range(b):
        handed = rng.randint(1, n[i] - 1)  # rows of the last forward, up to the request's last accepted one
        state.committed[str(i)] = rng.randint(n[i] - 1 - handed, n[i] - 1)
        last.append(qsl[-1] + handed - 1)
        qsl.append(qsl[-1] + handed + rng.randint(0, 2))  # rejected rows after it
    tokens = np.array([[rng.randint(0, 99) for _ in range(48)] for _ in range(b)], dtype=np.int32)
    batch = SimpleNamespace(batch_size=b, num_tokens=np.array(n, dtype=np.int64), req_ids=[str(i) for i in range(b)],
                            token_ids=tokens, hidden_offsets=lambda: (qsl, last))
    return state, batch


@pytest.mark.parametrize("seed", range(3))
def test_small_batches_lay_the_catch_up_out_as_the_vectorised_path(seed, monkeypatch):
    rng = random.Random(seed)
    for _ in range(300):
        state, batch = _batch(rng, rng.randint(1, eagle.SMALL_CATCH_UP))
        small = state._catch_up(batch)
        monkeypatch.setattr(eagle, "SMALL_CATCH_UP", 0)
        full = state._catch_up(batch)
        monkeypatch.undo()
        assert len(small) == len(full) == 7
        for x, y in zip(small, full):
            assert x.dtype == y.dtype and np.array_equal(x, y)


@pytest.mark.parametrize("small", [True, False])
def test_a_skipped_hand_over_is_refused(small, monkeypatch):
    state, batch = _batch(random.Random(5), 1)
    n = int(batch.num_tokens[0])
    qsl, last = batch.hidden_offsets()
    state.committed["0"] = n - 1 - (last[0] - qsl[0] + 1) - 1  # one position short of the first handed row
    if not small:
        monkeypatch.setattr(eagle, "SMALL_CATCH_UP", 0)
    with pytest.raises(RuntimeError, match=r"eagle: request '0' has head KV up to position \d+ but the target's "
                                           r"features start at \d+: the engine skipped a hand-over\."):
        state._catch_up(batch)

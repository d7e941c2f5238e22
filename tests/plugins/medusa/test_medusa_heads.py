"""Loading Medusa heads in every layout: logits equal the independent plain-torch reference (float32), and heads
that do not fit the target, or are not Medusa heads, are refused with messages naming the value and the fix."""

from __future__ import annotations

import pytest
import torch
from medusa_formats import H, random_fasterdecoding, random_vllm, reference_logits, write

from specdec_medusa.heads import MedusaConfig, MedusaHeads
from specdec_medusa.loader import load_medusa, read_medusa

V = 96

CASES = {
    "fd-safetensors": (lambda: random_fasterdecoding(V, heads=4, layers=1, seed=1), "safetensors", "fasterdecoding"),
    "fd-shared-blocks": (lambda: random_fasterdecoding(V, heads=3, layers=3, seed=2), "safetensors", "fasterdecoding"),
    "fd-own-blocks-pt": (lambda: random_fasterdecoding(V, heads=5, layers=2, seed=3, shared=False), "pt",
                         "fasterdecoding"),
    "fd-no-blocks": (lambda: random_fasterdecoding(V, heads=2, layers=0, seed=4), "safetensors", "fasterdecoding"),
    "medusa2-full-model": (lambda: random_fasterdecoding(V, heads=3, layers=1, seed=5), "medusa2", "fasterdecoding"),
    "vllm": (lambda: random_vllm(V, heads=4, layers=1, seed=6), "vllm", "vllm"),
    "vllm-bias-2-layers": (lambda: random_vllm(V, heads=3, layers=2, bias=True, seed=7), "vllm", "vllm"),
    "vllm-original-lm-head": (lambda: random_vllm(V, heads=3, original_lm_head=True, seed=8), "vllm", "vllm"),
    "vllm-truncated-prefixed": (lambda: random_vllm(V, heads=4, truncated=40, prefix="medusa_heads.", seed=9),
                                "vllm", "vllm"),
}


def _target_logits(heads: MedusaHeads, x: torch.Tensor) -> torch.Tensor:
    logits = heads(x)  # [n, M, Vd]
    if heads.token_map is None:
        return logits
    full = torch.full((*logits.shape[:2], heads.cfg.vocab_size), float("-inf"))
    full[..., heads.token_map] = logits
    return full


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_the_reference(tmp_path, case):
    make, how, layout = CASES[case]
    cfg, sd = make()
    loaded = load_medusa(write(tmp_path / case, cfg, sd, how), H, V)
    assert loaded.layout == layout
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(0))
    want = reference_logits(cfg, sd, x)
    # float32 sums in another order (the matmuls' blocking varies with the thread count): logits of size ~1 came out
    # 3.3e-6 apart in a full run, where a wrong layout moves them by ~1
    torch.testing.assert_close(_target_logits(loaded.heads, x), want, atol=1e-5, rtol=1e-5)
    for k in (1, want.shape[0] - 1):  # the first k heads alone
        if k:
            torch.testing.assert_close(loaded.heads(x, k), loaded.heads(x)[:k], atol=0, rtol=0)
    if how == "vllm" and "token_map" in {key.removeprefix("medusa_heads.") for key in sd}:
        ids = loaded.heads(x).argmax(-1)
        assert torch.equal(loaded.heads.to_target(ids), want.argmax(-1))


def test_shared_block_module_equals_per_block_weights():
    """The trainer's FasterDecoding heads apply one block L times; loading the L copies it saves computes the same."""
    torch.manual_seed(0)
    cfg = MedusaConfig(2, 3, H, V, shared_block=True)
    shared = MedusaHeads(cfg)
    with torch.no_grad():
        for p in shared.parameters():
            p.normal_(0, 0.1)
    own = MedusaHeads(MedusaConfig(2, 3, H, V))
    with torch.no_grad():
        own.weight.copy_(shared.weight.expand(-1, 3, -1, -1))
        own.bias.copy_(shared.bias.expand(-1, 3, -1))
        own.lm_head.copy_(shared.lm_head)
    x = torch.randn(5, H)
    torch.testing.assert_close(shared(x), own(x), atol=0, rtol=0)
    assert tuple(shared.weight.shape) == (2, 1, H, H)


def test_misfits_name_the_value_the_rule_and_the_fix(tmp_path):
    fix = "use heads trained for this target (specdec train --method medusa --target ...)."
    path = write(tmp_path / "fd", *random_fasterdecoding(V, heads=2, hidden=32))
    with pytest.raises(ValueError) as e:
        load_medusa(path, H, V)
    assert str(e.value) == (f"head {path!r} does not fit the target: its hidden size is 32 (key '0.1.weight') but the "
                            "target's hidden_size=64; Medusa heads read the target's last hidden state, so the two "
                            f"must be equal: {fix}")
    with pytest.raises(ValueError) as e:
        load_medusa(path, 32, 128)
    assert str(e.value) == (f"head {path!r} does not fit the target: its vocabulary has 96 tokens (rows of key "
                            "'0.1.weight') but the target's vocab_size=128; drafts are target token ids, so the two "
                            f"must be equal: {fix}")
    cfg, sd = random_vllm(V, heads=2, truncated=10)
    sd["token_map"] = sd["token_map"].clone()
    sd["token_map"][-1] = 200
    path = write(tmp_path / "tm", cfg, sd, "vllm")
    with pytest.raises(ValueError) as e:
        load_medusa(path, H, V)
    assert str(e.value) == (f"head {path!r} does not fit the target: its token_map holds ids "
                            f"{int(sd['token_map'].min())}..200 but the target's vocab_size=96; every draft id must "
                            f"map to a distinct target id in 0..95: {fix}")
    cfg, sd = random_vllm(V, heads=2, truncated=10)
    del sd["token_map"]
    path = write(tmp_path / "no-map", cfg, sd, "vllm")
    with pytest.raises(ValueError, match="truncated_vocab_size=10 < vocab_size=96 but no 'token_map' tensor"):
        read_medusa(path)


def test_incomplete_or_foreign_checkpoints_are_refused(tmp_path):
    cfg, sd = random_fasterdecoding(V, heads=3)
    del sd["2.0.linear.bias"]
    path = write(tmp_path / "missing", cfg, sd)
    with pytest.raises(ValueError) as e:
        read_medusa(path)
    assert str(e.value) == (f"head directory {path!r} lacks key '2.0.linear.bias' ([64] expected from "
                            "medusa_num_heads=3, medusa_num_layers=1, hidden size 64, vocabulary 96): the weights are "
                            "incomplete or belong to another architecture.")
    path = write(tmp_path / "eagle", {"hidden_size": 64}, {"fc.weight": torch.zeros(4, 8)})
    with pytest.raises(ValueError, match="is not a Medusa checkpoint"):
        read_medusa(path)
    with pytest.raises(FileNotFoundError, match="needs model= a local directory"):
        read_medusa(str(tmp_path / "nowhere"))


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickles_are_read_only_with_weights_only(tmp_path, capsys):
    cfg, sd = random_fasterdecoding(V, heads=1)
    path = write(tmp_path / "evil", cfg, sd, "pt")
    torch.save({**sd, "x": _Evil()}, tmp_path / "evil" / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match=r"could not be read with torch.load\(weights_only=True\)"):
        read_medusa(path)
    assert "pwned" not in capsys.readouterr().out

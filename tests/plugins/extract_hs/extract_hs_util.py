"""Helpers of the extract_hs tests (imported by them; pytest puts this directory on sys.path)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch


def parse(*argv: str) -> argparse.Namespace:
    from specdec_extract_hs import command

    parser = argparse.ArgumentParser(prog="specdec extract")
    command.add_arguments(parser)
    return parser.parse_args([*argv, "--no-progress"])


def extract(*argv: str) -> int:
    from specdec_extract_hs import command

    return command.run(parse(*argv))


def write_ids_jsonl(path: Path, seqs: list[list[int]], masks: list[list[int]] | None = None) -> str:
    with open(path, "w") as f:
        for i, s in enumerate(seqs):
            obj = {"input_ids": list(map(int, s))}
            if masks is not None:
                obj["loss_mask"] = list(map(int, masks[i]))
            f.write(json.dumps(obj) + "\n")
    return str(path)


def random_seqs(n: int, vocab: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, vocab, size=int(rng.integers(lo, hi))).tolist() for _ in range(n)]


def hf_hidden(path: str, ids: list[int]) -> tuple[torch.Tensor, ...]:
    """HF ``hidden_states`` of one sequence alone (batch 1, no padding): the reference."""
    from transformers import AutoModelForCausalLM

    model = _hf_models.get(path)
    if model is None:
        model = _hf_models[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return tuple(h[0] for h in model(torch.tensor([ids]), output_hidden_states=True).hidden_states)


_hf_models: dict[str, object] = {}


def dir_listing(path: Path) -> list[str]:
    return sorted(p.name for p in Path(path).iterdir())


def assert_rows_close(got: torch.Tensor, want: torch.Tensor, what: str, device: str = "cpu") -> None:
    """float32 rows equal up to rounding. Rounding error follows the size of the values around it, so the
    tolerance is 2e-6 of the tensor's largest value, and 1e-5 while that is at most 5: the wide-init test
    models reach |h| ~ 40 after a layer, where another summation order (a one-token step against a
    whole-sequence forward) moves small entries by up to ~3e-5 (measured). Rows computed on CUDA (TF32 off)
    against the CPU reference get 3x that: cuBLAS and SDPA kernels sum in other orders (1.5e-5 seen at |h| ~ 3)."""
    atol = 2e-6 * max(5.0, want.abs().max().item()) * (1 if device == "cpu" else 3)
    torch.testing.assert_close(got.cpu(), want, atol=atol, rtol=0, msg=lambda m: f"{what} ({device}): {m}")


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="needs a CUDA device (none here)"))]

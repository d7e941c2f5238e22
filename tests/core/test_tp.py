"""Tensor parallelism (issue 27, CPU part): a target sharded over 2 CPU processes (gloo, transformers' TP plan)
gives, under specdec's engine, exactly the output of the same target in one process (float32, greedy and seeded
sampled requests, baseline, ngram and draft_model, batch 1 and 3); launch errors name the rule and the fix."""

from __future__ import annotations

import importlib.util
import json
import os
import socket

import pytest
import torch.multiprocessing as mp

from specdec import LLM, SamplingParams

NEEDS_ACCELERATE = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                                      reason="transformers' TP loading needs accelerate (pip install accelerate)")
PROMPTS = [[3, 4, 5, 6, 3, 4, 7, 8, 3, 4, 5, 9], [10, 11, 12, 10, 11, 13, 10, 11, 12], [20, 21, 22, 23, 24]]
SPECS = [None, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
         "draft_model"]


def _params():
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    seeded = SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True, seed=7)
    return [greedy, seeded, greedy]


def _spec(spec, draft):
    if spec == "draft_model":
        return {"method": "draft_model", "model": draft, "num_speculative_tokens": 3}
    return spec


def _run(path, draft, batch, tp):
    out = {}
    for i, spec in enumerate(SPECS):
        llm = LLM(path, _spec(spec, draft), dtype="float32", device="cpu", max_num_seqs=batch,
                  tensor_parallel_size=tp)
        out[i] = [o.token_ids for o in llm.generate(PROMPTS, _params())]
        if tp > 1:
            assert llm.target.tp_size == tp and llm.target.fused is None and llm.target.graphs is None
            # each rank's cache holds its share of the KV heads
            assert llm.target.cache.keys[0].shape[1] == llm.target.config.num_key_value_heads // tp
    return out


def _worker(rank, world, port, path, draft, batch, result):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    torch.set_num_threads(1)
    out = _run(path, draft, batch, world)
    with open(f"{result}.{rank}", "w") as f:
        json.dump(out, f)
    # the group torn down on both ranks before the process exits (left to the exit, a rank aborted once in a CI run
    # of the suite: SIGABRT, "terminate called without an active exception")
    from specdec.tp import shutdown

    shutdown()
    shutdown()  # a second call (no process group left) does nothing


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@NEEDS_ACCELERATE
@pytest.mark.parametrize("batch", [1, 3])
def test_two_cpu_ranks_give_the_single_process_output(tiny_llama_path, tiny_llama_draft_path, tmp_path, batch,
                                                     monkeypatch):
    want = {str(k): v for k, v in _run(tiny_llama_path, tiny_llama_draft_path, batch, 1).items()}
    result = str(tmp_path / "out")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU ranks (gloo) on a GPU machine too: see check_tp_device
    mp.start_processes(_worker, args=(2, _free_port(), tiny_llama_path, tiny_llama_draft_path, batch, result),
                       nprocs=2, join=True, start_method="spawn")
    for rank in range(2):
        with open(f"{result}.{rank}") as f:
            assert json.load(f) == want, f"rank {rank}"


def test_launch_errors_name_the_rule_and_the_fix(tiny_llama_path, monkeypatch):
    for key in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=0 is invalid: it must be an int >= 1"):
        LLM(tiny_llama_path, device="cpu", tensor_parallel_size=0)
    with pytest.raises(RuntimeError, match=r"tensor_parallel_size=2 needs one process per rank: launch with "
                                           r"`torchrun --nproc-per-node 2 your_script.py`"):
        LLM(tiny_llama_path, device="cpu", tensor_parallel_size=2)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 does not match the launch: WORLD_SIZE=4"):
        LLM(tiny_llama_path, device="cpu", tensor_parallel_size=2)


@NEEDS_ACCELERATE
def test_cpu_ranks_beside_a_visible_accelerator_are_refused(tiny_llama_path, monkeypatch):
    """transformers' TP plan binds each rank to the machine's accelerator whenever one is visible, so device='cpu'
    there is refused before loading, naming both fixes (on a CPU-only machine the accelerator query is faked)."""
    import torch

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    if not torch.accelerator.is_available():
        monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
        monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cuda"))
    kind = torch.accelerator.current_accelerator().type
    with pytest.raises(RuntimeError, match=rf"tensor_parallel_size=2 with device='cpu' on a machine with a visible "
                                           rf"{kind} device: .* \(CUDA_VISIBLE_DEVICES=''\), or pass "
                                           rf"device='{kind}'"):
        LLM(tiny_llama_path, device="cpu", tensor_parallel_size=2)

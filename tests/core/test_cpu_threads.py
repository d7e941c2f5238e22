"""LLM(cpu_threads=...): a CPU engine runs its steps with the torch threads other processes leave free (issue 24's
contention: torch's pool of one thread per core ran 3.4x slower with one of two cores busy elsewhere), restores
torch's setting after each call, and refuses bad values naming the rule."""

from __future__ import annotations

import pytest
import torch

import specdec
import specdec.cpu_threads as ct
from specdec import LLM, SamplingParams
from specdec.cpu_threads import CpuSample, CpuThreads, free_threads, read_sample

STAT = """cpu  400 0 200 1000 50 0 0 0 0 0
cpu0 100 0 50 500 25 0 0 0 0 0
cpu1 300 0 150 500 25 10 5 5 0 0
intr 12345
"""


def test_read_sample_counts_busy_time_of_the_allowed_cores_only():
    tick = __import__("os").sysconf("SC_CLK_TCK")
    both, one = read_sample(STAT, {0, 1}), read_sample(STAT, {1})
    assert both.busy_s == pytest.approx((150 + 470) / tick)  # user+nice+system+irq+softirq+steal; idle, iowait not
    assert one.busy_s == pytest.approx(470 / tick)
    assert read_sample("cpu0 1 2\n", {0}) is None  # a line too short to read
    real = read_sample()  # this machine's /proc/stat (Linux)
    assert real is not None and real.busy_s > 0 and real.own_s > 0


def test_free_threads_takes_away_the_cores_other_processes_kept_busy():
    t0 = CpuSample(busy_s=10.0, own_s=5.0, wall_s=100.0)
    def after(busy, own, wall=1.0):
        return CpuSample(10.0 + busy, 5.0 + own, 100.0 + wall)
    assert free_threads(t0, after(busy=1.0, own=0.0), cores=2, ceiling=2) == 1  # one core busy elsewhere
    assert free_threads(t0, after(busy=2.0, own=1.0), cores=2, ceiling=2) == 1  # ours plus one other
    assert free_threads(t0, after(busy=1.0, own=1.0), cores=2, ceiling=2) == 2  # only our own work
    assert free_threads(t0, after(busy=0.3, own=0.0), cores=2, ceiling=2) == 2  # a light background rounds away
    assert free_threads(t0, after(busy=2.0, own=0.0), cores=2, ceiling=2) == 1  # never below one
    assert free_threads(t0, after(busy=0.0, own=0.0), cores=8, ceiling=3) == 3  # never above torch's count
    assert free_threads(t0, after(busy=1.0, own=0.0, wall=0.05), cores=2, ceiling=2) is None  # too short to tell


def _sampler(readings):
    it = iter(readings)
    return lambda: next(it)


def test_auto_runs_with_the_measured_count_and_restores_torchs():
    torch.set_num_threads(2)
    quiet, busy = CpuSample(0.0, 0.0, 0.0), CpuSample(1.0, 0.0, 1.0)  # one core busy elsewhere for 1 s
    threads = CpuThreads("auto", sample=_sampler([quiet, busy, CpuSample(1.5, 0.5, 2.0), CpuSample(1.6, 0.5, 2.01)]))
    threads.cores = 2
    with threads.running() as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with threads.running() as n:  # only our own work since: back to two
        assert n == 2 and torch.get_num_threads() == 2
    with threads.running() as n:  # 10 ms since the last reading: the last choice stands
        assert n == 2
    fixed, off = CpuThreads(1), CpuThreads(None)
    with fixed.running():
        assert torch.get_num_threads() == 1
    with off.running() as n:
        assert n is None and torch.get_num_threads() == 2
    assert torch.get_num_threads() == 2


def test_an_engine_steps_with_the_chosen_threads_and_gives_torch_back(monkeypatch):
    torch.set_num_threads(2)
    tiny = specdec.bundled_model("tiny")
    seen = []
    busy = [0.0, 1.0, 1.0, 2.0, 2.0, 3.0]  # cumulative: in the 1st and 3rd second one core was busy elsewhere
    readings = iter([CpuSample(b, 0.0, float(t)) for t, b in enumerate(busy)])
    monkeypatch.setattr(ct, "read_sample", lambda: next(readings))
    llm = LLM(tiny, {"method": "ngram", "num_speculative_tokens": 3}, dtype="float32", device="cpu", max_num_seqs=2)
    assert llm.cpu_threads.setting == "auto"
    llm.cpu_threads.cores = 2
    forward = llm.target.forward

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return forward(*args, **kwargs)

    monkeypatch.setattr(llm.target, "forward", spy)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    base = LLM(tiny, dtype="float32", device="cpu", max_num_seqs=2, cpu_threads=None).generate(["a b c a b"], params)
    out = llm.generate(["a b c a b"], params)
    assert out[0].token_ids == base[0].token_ids  # greedy output does not depend on the thread count
    assert seen and set(seen) == {1} and torch.get_num_threads() == 2
    seen.clear()
    llm.generate(["a b c a b"], params)
    assert set(seen) == {2}
    pinned = LLM(tiny, dtype="float32", device="cpu", max_num_seqs=1, cpu_threads=1)
    monkeypatch.setattr(pinned.target, "forward", spy)
    seen.clear()
    pinned.generate(["x y"], params)
    assert set(seen) == {1} and torch.get_num_threads() == 2


@pytest.mark.parametrize("bad", [0, -1, "fast", True, 1.5])
def test_bad_cpu_threads_are_refused_with_the_rule(bad):
    with pytest.raises(ValueError, match=r"cpu_threads=.* is invalid: it must be 'auto' .*an int >= 1 .*or None"):
        LLM(specdec.bundled_model("tiny"), dtype="float32", device="cpu", cpu_threads=bad)

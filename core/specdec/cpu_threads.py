"""Torch threads of a CPU engine: the cores other processes leave free (issue 24, ``LLM(cpu_threads=...)``).

torch's intra-op pool starts one thread per core. When another process keeps one of those cores busy, every
parallel region waits for the thread that shares its core with that process: on a 2-core machine with one core
taken, the bundled tiny model's greedy baseline ran 3.4x slower at 2 threads than at 1 (and every method with it),
where vLLM's CPU build, which pins its own threads, kept its speed.

``cpu_threads="auto"`` (the default) measures, before each run of the engine's loop, how many of the process's
allowed cores other processes kept busy since the last measurement (``/proc/stat``'s busy time of those cores, less
this process's own CPU time, over the wall time between the two readings), and runs the loop with that many fewer
threads (at least 1, never more than torch had when the engine was built); torch's setting is put back when the
loop returns. Where ``/proc/stat`` cannot be read (not Linux) or less than :data:`MIN_INTERVAL_S` passed since the
last reading, the last choice stands (at first: torch's own). An int fixes the count; None leaves torch alone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MIN_INTERVAL_S", "CpuSample", "CpuThreads", "check_cpu_threads", "free_threads", "read_sample"]

MIN_INTERVAL_S = 0.2  # shorter intervals between readings say too little about other processes' load


@dataclass(frozen=True)
class CpuSample:
    """One reading: busy seconds of the allowed cores (all processes), this process's CPU seconds, wall time."""
    busy_s: float
    own_s: float
    wall_s: float


def read_sample(stat_text: str | None = None, cpus: set[int] | None = None) -> CpuSample | None:
    """A :class:`CpuSample` of the cores in ``cpus`` (default: this process's affinity) from ``/proc/stat`` (or
    ``stat_text``); None where it cannot be read."""
    try:
        if stat_text is None:
            with open("/proc/stat") as f:
                stat_text = f.read()
        if cpus is None:
            cpus = set(os.sched_getaffinity(0))
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError):
        return None
    busy = 0
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        f = [int(x) for x in rest.split()[:8]]  # user nice system idle iowait irq softirq steal
        if len(f) < 5:
            return None
        busy += sum(f) - f[3] - f[4]
    t = os.times()
    return CpuSample(busy / tick, t.user + t.system, time.monotonic())


def free_threads(before: CpuSample, after: CpuSample, cores: int, ceiling: int) -> int | None:
    """Threads for the cores other processes left free between two readings: ``cores`` minus their busy cores
    (rounded to the nearest), clamped to ``[1, ceiling]``; None when the readings are too close together."""
    wall = after.wall_s - before.wall_s
    if wall < MIN_INTERVAL_S:
        return None
    others = max(0.0, (after.busy_s - before.busy_s) - (after.own_s - before.own_s)) / wall
    return max(1, min(ceiling, int(cores - others + 0.5)))


def check_cpu_threads(value: Any) -> None:
    """``LLM(cpu_threads=...)``: ``"auto"``, None or an int >= 1."""
    if value is None or value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"cpu_threads={value!r} is invalid: it must be 'auto' (the cores other processes leave "
                         "free, re-measured before each run), an int >= 1 (that many torch threads while the engine "
                         "runs) or None (leave torch's setting alone).")


class CpuThreads:
    """The torch thread count a CPU engine runs its loop with (see the module docstring). ``setting``: ``"auto"``,
    an int, or None; ``sample``: the reader (:func:`read_sample`; tests pass their own)."""

    def __init__(self, setting: str | int | None, sample: Any = None) -> None:
        check_cpu_threads(setting)
        self.setting = setting
        self._sample = sample if sample is not None else read_sample
        self.ceiling = torch.get_num_threads()
        self._last = self._sample() if setting == "auto" else None
        try:
            self.cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            self.cores = os.cpu_count() or 1
        self.threads: int | None = setting if isinstance(setting, int) else None  # the last choice

    def choose(self) -> int | None:
        """Threads for the next run of the loop (None: leave torch alone)."""
        if self.setting != "auto":
            return self.threads
        now = self._sample()
        if now is None or self._last is None:
            self._last = now
            return self.threads
        chosen = free_threads(self._last, now, self.cores, self.ceiling)
        if chosen is not None:
            self.threads, self._last = chosen, now
        return self.threads

    @contextmanager
    def running(self) -> Iterator[int | None]:
        """Run a block with :meth:`choose`'s thread count, torch's own restored after it."""
        threads = self.choose()
        before = torch.get_num_threads()
        if threads is None or threads == before:
            yield threads
            return
        torch.set_num_threads(threads)
        try:
            yield threads
        finally:
            torch.set_num_threads(before)

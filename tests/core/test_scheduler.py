"""The scheduler alone: admission order and groups, slot assignment and reuse, the max_num_seqs limit,
retiring and aborting. Plain requests and a real CallQueue; no model, no engine."""

from __future__ import annotations

import random

import pytest

from specdec.calls import Call, CallQueue
from specdec.requests import Request
from specdec.sampling import SamplingParams
from specdec.scheduler import Scheduler, StepPlan


def _requests(*ids: str) -> list[Request]:
    return [Request(i, None, [1, 2, 3], SamplingParams()) for i in ids]


def _submit(queue: CallQueue, *ids: str) -> list[Request]:
    reqs = _requests(*ids)
    call = Call(len(reqs), requests=reqs)
    for r in reqs:
        r.call = call
    queue.submit(call)
    return reqs


def _scheduler(max_num_seqs: int, admit_group: int, *ids: str) -> tuple[Scheduler, list[Request]]:
    queue = CallQueue()
    return Scheduler(max_num_seqs, admit_group, queue), _submit(queue, *ids)


def _names(reqs: list[Request]) -> list[str]:
    return [r.req_id for r in reqs]


def _finish(*reqs: Request) -> None:
    for r in reqs:
        r.finish_reason = "stop"


def test_first_step_admits_the_oldest_into_the_lowest_slots():
    s, reqs = _scheduler(4, 4, "a", "b", "c", "d", "e", "f")
    assert s.idle
    plan = s.schedule()
    assert _names(plan.prefill) == ["a", "b", "c", "d"] and plan.decode == []
    assert [r.slot for r in plan.prefill] == [0, 1, 2, 3]
    assert s.running == plan.prefill and s.free == [] and not s.idle
    assert len(s.waiting) == 2 and reqs[4].slot == -1  # max_num_seqs: the rest wait, with no slot


def test_a_step_with_nothing_to_admit_decodes_the_running_batch():
    s, _ = _scheduler(4, 1, "a", "b")
    s.schedule()
    plan = s.schedule()
    assert plan.prefill == [] and plan.decode is s.running and _names(plan.decode) == ["a", "b"]
    assert s.retire() == []  # nothing finished: nothing moves
    assert _names(s.running) == ["a", "b"] and s.free == [2, 3]


def test_nothing_waiting_and_nothing_running_is_an_empty_plan():
    s = Scheduler(2, 1, CallQueue())
    assert s.schedule() == StepPlan(prefill=[], decode=[]) and s.idle


def test_retire_frees_slots_and_they_are_reused_lowest_first():
    s, (a, b, c, d, e, f) = _scheduler(4, 1, "a", "b", "c", "d", "e", "f")
    s.schedule()
    _finish(c, a)
    assert s.retire() == [a, c]  # in slot order
    assert _names(s.running) == ["b", "d"] and s.free == [0, 2]
    plan = s.schedule()
    assert _names(plan.prefill) == ["e", "f"] and [e.slot, f.slot] == [0, 2]
    assert _names(s.running) == ["e", "b", "f", "d"]  # the running batch stays ordered by slot


def test_waiting_requests_join_in_groups():
    s, (a, b, c, d, e, f, g, h) = _scheduler(4, 2, "a", "b", "c", "d", "e", "f", "g", "h")
    s.schedule()
    _finish(b)
    s.retire()
    plan = s.schedule()  # one free slot, four waiting: fewer than admit_group=2, so no prefill yet
    assert plan.prefill == [] and _names(plan.decode) == ["a", "c", "d"] and e.slot == -1
    _finish(d)
    s.retire()
    plan = s.schedule()
    assert _names(plan.prefill) == ["e", "f"] and [e.slot, f.slot] == [1, 3]
    assert _names(s.running) == ["a", "e", "c", "f"] and len(s.waiting) == 2


def test_the_last_waiting_requests_join_without_a_full_group():
    s, (a, b, c, d, e) = _scheduler(4, 3, "a", "b", "c", "d", "e")
    s.schedule()
    _finish(c)
    s.retire()
    plan = s.schedule()  # one free slot < admit_group, but every waiting request fits
    assert _names(plan.prefill) == ["e"] and e.slot == 2


def test_an_idle_engine_admits_whatever_fits():
    s, (a, b, c) = _scheduler(4, 4, "a", "b", "c")
    _finish(a, b, c)
    s.schedule()
    s.retire()
    assert s.idle
    late = _submit(s.waiting, "x")
    assert _names(s.schedule().prefill) == ["x"] and late[0].slot == 0  # fewer than admit_group: nothing runs


def test_requests_of_later_calls_wait_behind_earlier_ones():
    queue = CallQueue()
    s = Scheduler(2, 1, queue)
    _submit(queue, "a1", "a2", "a3")
    _submit(queue, "b1")
    assert _names(s.schedule().prefill) == ["a1", "a2"]
    _finish(*s.running)
    s.retire()
    assert _names(s.schedule().prefill) == ["a3", "b1"]


def test_a_failed_call_leaves_the_queue_before_it_is_admitted():
    queue = CallQueue()
    s = Scheduler(1, 1, queue)
    (a,) = _submit(queue, "a")
    b = _submit(queue, "b")
    (c,) = _submit(queue, "c")
    s.schedule()
    queue.fail({b[0].call}, RuntimeError("b failed"))
    _finish(a)
    s.retire()
    assert s.schedule().prefill == [c] and c.slot == 0


def test_abort_frees_the_slots_of_failed_requests_once():
    s, (a, b, c, d, e) = _scheduler(4, 1, "a", "b", "c", "d", "e")
    s.schedule()
    _finish(b)
    retired = s.retire()
    plan = s.schedule()  # e takes b's slot; say its prefill fails
    assert plan.prefill == [e] and e.slot == 1 and s.free == []
    s.abort([*s.running, *retired])  # the engine's failed list: everything in the step
    assert s.running == [] and s.free == [0, 1, 2, 3] and s.idle


def test_abort_of_some_requests_keeps_the_others_running():
    s, (a, b, c) = _scheduler(4, 1, "a", "b", "c")
    s.schedule()
    unadmitted = _requests("x")[0]  # slot -1: holds no slot to free
    s.abort([b, unadmitted])
    assert _names(s.running) == ["a", "c"] and s.free == [1, 3]


class _Waiting:
    """A waiting queue that records how the scheduler uses it."""

    def __init__(self, reqs: list[Request]) -> None:
        self.reqs, self.taken = list(reqs), []

    def __len__(self) -> int:
        return len(self.reqs)

    def take(self, n: int) -> list[Request]:
        self.taken.append(n)
        out, self.reqs = self.reqs[:n], self.reqs[n:]
        return out


def test_takes_only_what_fits_and_only_when_admitting():
    waiting = _Waiting(_requests("a", "b", "c", "d", "e"))
    s = Scheduler(3, 2, waiting)
    s.schedule()
    s.schedule()
    _finish(s.running[0])
    s.retire()
    s.schedule()  # one free slot < admit_group: no take
    _finish(s.running[0])
    s.retire()
    s.schedule()
    assert waiting.taken == [3, 2] and waiting.reqs == []


@pytest.mark.parametrize("seed", range(5))
def test_random_runs_keep_the_invariants(seed):
    """Random finishes over many steps: FIFO admission, at most max_num_seqs running, every slot
    either free or held by exactly one running request, the batch ordered by slot."""
    rng = random.Random(seed)
    max_num_seqs, admit_group = rng.randint(1, 6), rng.randint(1, 4)
    queue = CallQueue()
    s = Scheduler(max_num_seqs, admit_group, queue)
    reqs = []
    for i in range(rng.randint(1, 5)):  # calls of 1-8 requests each
        reqs += _submit(queue, *(f"{i}.{j}" for j in range(rng.randint(1, 8))))
    admitted: list[Request] = []
    finished: list[Request] = []
    while len(finished) < len(reqs):
        plan = s.schedule()
        assert bool(plan.prefill) != bool(plan.decode)
        admitted += plan.prefill
        for r in plan.prefill or plan.decode:  # a prefill may finish a request too (max_tokens=1)
            if rng.random() < 0.3:
                _finish(r)
        finished += s.retire()
        slots = [r.slot for r in s.running]
        assert slots == sorted(slots) and len(s.running) <= max_num_seqs
        assert sorted(slots + s.free) == list(range(max_num_seqs)) and s.free == sorted(s.free)
    assert admitted == reqs and s.idle

"""Who runs each step: the waiting queue, the running batch and the free KV slots.

The scheduler only decides. :meth:`Scheduler.schedule` moves waiting requests into free slots and
returns a :class:`StepPlan`; the engine runs it (writes the prompts, resets the slots, runs the
forward) and then asks :meth:`Scheduler.retire` which requests leave. Nothing here calls a model or
the engine, so its decisions can be tested on plain request objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from specdec.requests import Request

__all__ = ["Scheduler", "StepPlan"]


class WaitingQueue(Protocol):
    """Where requests wait, oldest first (:class:`specdec.calls.CallQueue`)."""

    def __len__(self) -> int: ...

    def take(self, n: int) -> list[Request]: ...


@dataclass(slots=True)
class StepPlan:
    """One step: ``prefill`` the requests that joined (slots assigned, prompts not yet run), or
    ``decode`` the running batch one step. At most one of them is non-empty; both are empty when
    nothing waits and nothing runs."""

    prefill: list[Request]
    decode: list[Request]


class Scheduler:
    """The running batch (ordered by slot) and the free slots (ascending) of an engine with
    ``max_num_seqs`` slots; requests wait in ``waiting`` until they join.

    A prefill forward costs about a step whatever the number of prompts it carries, so waiting
    requests join in groups: when ``admit_group`` slots are free, or when all of the waiting ones
    fit, or at once when nothing runs. A step that admits runs only the prefill.
    """

    def __init__(self, max_num_seqs: int, admit_group: int, waiting: WaitingQueue) -> None:
        self.max_num_seqs = max_num_seqs
        self.admit_group = admit_group
        self.waiting = waiting
        self.running: list[Request] = []
        self.free: list[int] = list(range(max_num_seqs))

    @property
    def idle(self) -> bool:
        """Nothing runs and every slot is free."""
        return not self.running and len(self.free) == self.max_num_seqs

    def schedule(self) -> StepPlan:
        """This step's plan. Requests that join are taken from ``waiting`` oldest first, get the
        lowest free slots and count as running from now on."""
        admitted = self._admit()
        if admitted:
            self.running.extend(admitted)
            self.running.sort(key=_slot)
            return StepPlan(prefill=admitted, decode=[])
        return StepPlan(prefill=[], decode=self.running)

    def admits(self) -> bool:
        """Whether :meth:`schedule` would admit requests now (a prefill step): some wait, and ``admit_group``
        slots are free (or as many as wait, or the batch is empty)."""
        waiting = len(self.waiting)
        return bool(waiting and self.free and not (self.running and len(self.free) < min(self.admit_group, waiting)))

    def _admit(self) -> list[Request]:
        if not self.admits():
            return []
        admitted = self.waiting.take(len(self.free))
        for r in admitted:
            r.slot = self.free.pop(0)
        return admitted

    def retire(self) -> list[Request]:
        """The running requests that finished (``finish_reason`` set), out of the batch; their slots
        are free again."""
        finished = [r for r in self.running if r.finish_reason is not None]
        if finished:
            self.running = [r for r in self.running if r.finish_reason is None]
            self.free.extend(r.slot for r in finished)
            self.free.sort()
        return finished

    def abort(self, failed: list[Request]) -> None:
        """``failed`` requests leave the batch (those still running, or admitted this step) and free
        their slots (those that hold one)."""
        for r in failed:
            if r.slot >= 0 and r.slot not in self.free:
                self.free.append(r.slot)
        self.free.sort()
        self.running = [r for r in self.running if all(r is not f for f in failed)]


def _slot(r: Request) -> int:
    return r.slot

"""Concurrent ``LLM.generate`` calls: one queue of waiting requests, one thread at a time driving.

A call puts its requests at the back of the queue and waits. Whenever nobody drives the engine, one
waiting call's thread takes over and runs steps until its own requests are done, admitting any
call's waiting requests into free slots as it goes, then hands over. So requests from several
threads share the running batch, and no thread does work on behalf of a call that outlives it
without another call taking over.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Call", "CallQueue"]


@dataclass(eq=False)
class Call:
    """One ``generate`` call: how many of its requests are still unfinished, its progress bar, and the
    error that ended it (set when a step failed while one of its requests was in the batch)."""

    remaining: int
    bar: Any = None
    error: BaseException | None = None
    done: bool = False
    requests: list[Any] = field(default_factory=list)


class CallQueue:
    """Waiting requests of every call (FIFO) and the drive token, under one condition variable."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._waiting: deque[Any] = deque()
        self.driver: int | None = None  # ident of the thread running steps

    def submit(self, call: Call) -> None:
        """Queue ``call``'s requests (each has ``.call``) behind those already waiting."""
        with self._cv:
            self._waiting.extend(call.requests)
            if call.remaining == 0:
                call.done = True

    def run(self, call: Call, drive: Callable[[Call], None]) -> None:
        """Queue ``call`` and return once it is done, calling ``drive(call)`` (which runs steps until
        it is) whenever nobody else drives. Interrupted while waiting or between steps (Ctrl-C), its
        waiting requests leave the queue (running ones finish unread) and the error propagates."""
        self.submit(call)
        try:
            while self.acquire(call):
                try:
                    drive(call)
                finally:
                    self.release()
        except BaseException as exc:
            self.fail({call}, exc)
            raise

    def acquire(self, call: Call) -> bool:
        """Wait until ``call`` is done (False) or nobody drives (True: this thread drives now)."""
        with self._cv:
            while not call.done and self.driver is not None:
                self._cv.wait()
            if call.done:
                return False
            self.driver = threading.get_ident()
            return True

    def release(self) -> None:
        """Hand the drive over: a waiting call's thread takes it if it still has work."""
        with self._cv:
            self.driver = None
            self._cv.notify_all()

    def __len__(self) -> int:
        return len(self._waiting)

    def take(self, n: int) -> list[Any]:
        """Up to ``n`` waiting requests, oldest first."""
        with self._cv:
            return [self._waiting.popleft() for _ in range(min(n, len(self._waiting)))]

    def finish(self, request: Any) -> None:
        """``request`` finished: its call is done once all of its requests are."""
        call = request.call
        if call.bar is not None:
            call.bar.update(1)
        with self._cv:
            call.remaining -= 1
            if call.remaining == 0:
                call.done = True
                self._cv.notify_all()

    def fail(self, calls: set[Call], error: BaseException) -> None:
        """End ``calls`` with ``error``: their waiting requests leave the queue, their threads wake."""
        with self._cv:
            self._waiting = deque(r for r in self._waiting if r.call not in calls)
            for call in calls:
                call.error, call.done = error, True
            self._cv.notify_all()

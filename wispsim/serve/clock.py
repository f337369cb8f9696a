"""SimPy on the wall clock: the simulator's own devices, run against a real server.

:class:`WallClock` is a SimPy environment whose time is wall-clock seconds since it started
(``time.monotonic``). A timeout of 0.3 s really waits 0.3 s, so a simulated device that drafts,
sends and waits does so in real time; a reply from the real server (which arrives on another
thread) is handed in with :meth:`WallClock.post` and runs at the wall time it arrived. Between
events the environment sleeps on its inbox, so a reply wakes it at once.

Like ``simpy.rt.RealtimeEnvironment`` with ``strict=False``: when the process falls behind (an
event is due before the wall clock), it runs the event late rather than failing, and time stays
monotonic.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable
from typing import Any

import simpy

# the longest the environment sleeps without looking at the inbox (it also lets Ctrl-C through)
_POLL_S = 0.5


class WallClock(simpy.Environment):
    """A SimPy environment on the wall clock that other threads can post work to."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.origin = time.monotonic()
        self._inbox: queue.SimpleQueue[Callable[[], Any]] = queue.SimpleQueue()

    def wall(self) -> float:
        """Seconds since this environment started."""
        return time.monotonic() - self.origin

    def post(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` (say, ``event.succeed``) in the environment's thread, at the wall time it
        gets there. Safe to call from any thread."""
        self._inbox.put(fn)

    def _run_posted(self, fn: Callable[[], Any]) -> None:
        # catch up with the wall clock, but never past an event that is already due
        self._now = max(self._now, min(self.wall(), self.peek()))
        fn()

    def step(self) -> None:
        inbox = self._inbox
        while True:
            try:
                self._run_posted(inbox.get_nowait())
                continue
            except queue.Empty:
                pass
            wait = self.peek() - self.wall()
            if wait <= 0:
                break
            try:
                fn = inbox.get(timeout=_POLL_S if math.isinf(wait) else min(wait, _POLL_S))
            except queue.Empty:
                continue
            self._run_posted(fn)
        super().step()

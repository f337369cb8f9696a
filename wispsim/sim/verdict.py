"""A round's verdict, the event a device waits on: a batch succeeds its members' at once.

It stays interpreted beside the compiled verifier (:mod:`wispsim.native`): it is a SimPy event,
a subclass of an interpreted class, as SimPy's own loop is.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy
from simpy.events import PENDING, URGENT, Event


class Verdict(Event):
    """A round's verdict: the event its device waits on (``Request.done``).

    A finished batch succeeds every member's verdict at once (:meth:`succeed_all`), with one heap
    entry for all of them. SimPy would process them one right after the other anyway: they are
    scheduled back to back at the same time and priority, and nothing scheduled by their callbacks
    (processes resuming at this instant schedule NORMAL events) can come before the last of them.
    So the first one's place in the heap processes each event's callbacks in order, as
    ``Environment.step`` does, and a batch costs one heap push and pop instead of one per member.
    Written out here, in the event's own class, for speed (the one place that sets an event's
    fields by hand, as SimPy's ``events.py`` does in its own classes).

    Two limits, neither reached by the simulator: a callback that schedules an URGENT event
    (starting a process, an interrupt) would run it after the remaining events instead of
    before; and none of the verdicts may be the ``until`` event of ``env.run`` (its stop would
    drop the remaining callbacks)."""

    __slots__ = ()

    @staticmethod
    def succeed_all(env: simpy.Environment, verdicts: list[Verdict]) -> None:
        """``verdict.succeed()`` for every one of ``verdicts`` (a finished batch's), at once."""
        for ev in verdicts:
            if ev._value is not PENDING:
                raise RuntimeError(f"{ev} has already been triggered")
            ev._ok = True
            ev._value = None
        carrier = Event(env)
        carrier.callbacks.append(lambda _: Verdict._process(verdicts))
        carrier.succeed()

    @staticmethod
    def _process(verdicts: list[Verdict]) -> None:
        for ev in verdicts:
            callbacks, ev.callbacks = ev.callbacks, None
            for callback in callbacks:  # type: ignore[union-attr]
                callback(ev)


def call_at_start(env: simpy.Environment, callback: Callable[[Event], None]) -> None:
    """Call ``callback`` where a process made now would start: an URGENT event at the current time,
    as ``Environment.process`` schedules its ``Initialize`` (a loop run from callbacks, not a
    process, starts in the same place in the heap: :meth:`wispsim.sim.device.Device.start`)."""
    ev = Event(env)
    ev.callbacks.append(callback)  # type: ignore[union-attr]
    ev._ok = True
    ev._value = None
    env.schedule(ev, URGENT)

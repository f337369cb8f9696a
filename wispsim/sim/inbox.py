"""The rounds on their way to the run's only verification replica, as data (issue 44).

A replica nobody routes to takes its rounds as data instead of events: a round's arrival (its
uplink ends) and its hand-over to the engine (its API server is done with it) are times in two
heaps, which the verifier reads up to now whenever it looks -- before it forms a batch, when one
ends, when a response's prefix is freed -- and which wake it only while it is idle
(:class:`~wispsim.sim.verifier.Verifier`). The API servers do the same work in the same order
(arrival order, each at its arrival time, with the engine as it was then: nothing they read of
it changes between the verifier's looks), so a run's records are those of one SimPy event per
step, to the bit (tests/sim/test_events.py), and a busy replica's round costs two heap entries of
plain tuples instead of two events. Behind a router every round stays an event: the router picks
a replica when the round arrives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any, Protocol


class Front(Protocol):
    """The API servers in front of the replica (:class:`~wispsim.sim.front.RoundFront`)."""

    def accept(self, r: Any, t: float) -> float:
        """When the round that reached the server at ``t`` is handed to the engine."""
        ...


class Inbox:
    """The rounds on their way to one verification replica nobody routes to, as data (module text):
    ``arrivals``, whose uplink has ended by then, not yet through the API servers (``front``;
    None where the host is not modelled), and ``hands``, through them, not yet the engine's. Each
    a heap of ``(time, order, request)``; the order breaks ties as SimPy's event ids would."""

    def __init__(self, front: Front | None = None) -> None:
        self.front = front
        self.arrivals: list[tuple[float, int, Any]] = []
        self.hands: list[tuple[float, int, Any]] = []
        self.order = 0

    def post(self, r: Any) -> None:
        """A round that reaches the server at ``r.arrival``."""
        self.order += 1
        heappush(self.arrivals if self.front is not None else self.hands, (r.arrival, self.order, r))

    def catch_up(self, now: float, submit: Callable[[Any], object]) -> None:
        """Everything due by ``now``: the arrivals through the API servers, in arrival order, then
        ``submit(request)`` for each round handed over by now, in hand-over order."""
        arrivals, hands, front = self.arrivals, self.hands, self.front
        while arrivals and arrivals[0][0] <= now:
            t, _, r = heappop(arrivals)
            assert front is not None
            self.order += 1
            heappush(hands, (front.accept(r, t), self.order, r))
        while hands and hands[0][0] <= now:
            submit(heappop(hands)[2])

    def next_time(self) -> float:
        """When something is next due (inf: nothing is on its way)."""
        t = self.arrivals[0][0] if self.arrivals else math.inf
        return min(t, self.hands[0][0]) if self.hands else t

"""Routers: which verifier replica gets a request (SPEC 8).

With ``server.replicas`` > 1 the devices talk to a router in front of the replicas, each with its
own profile, KV memory, prefix cache, latency model and queue.

``round-robin``
    Request j goes to replica j mod R, whatever it holds; a response's rounds scatter, so most
    rounds miss the prefix cache (cold) unless R = 1 -- the cost of cache-blind routing.
``least-work``
    Each round goes to the replica where it would finish soonest by the estimator: the replica's
    outstanding work (the rest of the batch it runs plus the marginal cost of its queue) plus
    this request's marginal cost there -- cheap where its prefix is cached, a full prefill
    elsewhere. Cache-aware, but a round may move when another replica is much emptier.
``affinity`` (default)
    Session affinity: a response's first round goes where ``least-work`` would send it; every
    later round follows it to the same replica, which holds its prefix cache.

For centralized serving the router places whole responses (the server generates every token of a
response where it started): ``round-robin``, or the replica with the least outstanding work
(``least-work`` and ``affinity``, the same thing at response granularity).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import count
from typing import TYPE_CHECKING, Any

from wispsim.registry import Registry

if TYPE_CHECKING:
    import simpy

    from wispsim.sim.centralized import CentralizedServer, Generation
    from wispsim.sim.verifier import Request, Verifier

ROUTERS: Registry[Callable[..., Any]] = Registry("router")


class _Router:
    def __init__(self, replicas: list[Verifier]) -> None:
        self.replicas = replicas

    def drop(self, session: int) -> None:
        for r in self.replicas:
            r.drop(session)

    def _least_work(self, req: Request) -> Verifier:
        now = self.replicas[0].env.now
        return min(self.replicas, key=lambda v: v.outstanding(now) + v.cost(req))


@ROUTERS.register("round-robin")
class RoundRobin(_Router):
    """``round-robin``: request j to replica j mod R."""

    def __init__(self, replicas: list[Verifier]) -> None:
        super().__init__(replicas)
        self._next = count()

    def submit(self, req: Request) -> simpy.Event:
        return self.replicas[next(self._next) % len(self.replicas)].submit(req)


@ROUTERS.register("least-work")
class LeastWork(_Router):
    """``least-work``: each round where it would finish soonest by the estimator."""

    def submit(self, req: Request) -> simpy.Event:
        return self._least_work(req).submit(req)


@ROUTERS.register("affinity")
class Affinity(_Router):
    """``affinity``: a response's first round by least work, its later rounds to the same replica."""

    def __init__(self, replicas: list[Verifier]) -> None:
        super().__init__(replicas)
        self.home: dict[int, Verifier] = {}

    def submit(self, req: Request) -> simpy.Event:
        v = self.home.get(req.session)
        if v is None:
            v = self.home[req.session] = self._least_work(req)
        return v.submit(req)

    def drop(self, session: int) -> None:
        v = self.home.pop(session, None)
        if v is not None:
            v.drop(session)


class CentralRouter:
    """Places whole responses on centralized replicas."""

    def __init__(self, replicas: list[CentralizedServer], router: str) -> None:
        self.replicas = replicas
        self.round_robin = router == "round-robin"
        self._next = count()

    def submit(self, g: Generation) -> simpy.Event:
        if self.round_robin:
            target = self.replicas[next(self._next) % len(self.replicas)]
        else:
            target = min(self.replicas, key=lambda s: s.outstanding_tokens())
        return target.submit(g)

    @property
    def preemptions(self) -> int:
        return sum(s.preemptions for s in self.replicas)

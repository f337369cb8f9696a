"""The verifier's event shortcuts (issue 16): a batch's verdicts completed with one heap entry,
and a request that is the event of its own arrival, behave as the plain SimPy events did."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from wispsim.sim.verifier import Request, Verdict


def _trace(complete: Callable[[simpy.Environment, list[simpy.Event]], None]) -> list[tuple[float, str]]:
    """What happens, in order, when two replicas finish batches at the same instant while other
    events (a timeout at that instant, arrivals scheduled by the resumed devices) interleave."""
    env = simpy.Environment()
    log: list[tuple[float, str]] = []

    def device(name: str, done: simpy.Event) -> Generator[Any, Any, None]:
        yield done
        log.append((env.now, f"{name} resumed"))
        yield env.timeout(0)  # schedules at this very instant, after the verdicts
        log.append((env.now, f"{name} again"))

    def replica(name: str, members: int) -> Generator[Any, Any, None]:
        dones = [Verdict(env) for _ in range(members)]
        for i, d in enumerate(dones):
            env.process(device(f"{name}{i}", d))
        yield env.timeout(1.0)
        complete(env, dones)
        log.append((env.now, f"{name} next batch"))

    def bystander() -> Generator[Any, Any, None]:
        yield env.timeout(1.0)
        log.append((env.now, "bystander"))

    env.process(replica("a", 3))
    env.process(bystander())
    env.process(replica("b", 2))
    env.run()
    return log


def test_one_heap_entry_per_batch_keeps_the_order_of_separate_events() -> None:
    def one_by_one(env: simpy.Environment, events: list[simpy.Event]) -> None:
        for ev in events:
            ev.succeed()

    plain = _trace(one_by_one)
    assert _trace(Verdict.succeed_all) == plain  # type: ignore[arg-type]
    assert [w for _, w in plain][:4] == ["a next batch", "bystander", "b next batch", "a0 resumed"]


def test_a_request_is_the_event_of_its_arrival() -> None:
    env = simpy.Environment()
    got: list[tuple[float, int]] = []
    req = Request(7, 3, 2.5, 3.0, 2.0, 4, 100, 103, env.event())
    req.send(env, 2.5, lambda r: got.append((env.now, r.rid)))
    plain = env.timeout(2.5)  # scheduled after it for the same instant: fires after it
    plain.callbacks.append(lambda _: got.append((env.now, -1)))
    env.run()
    assert got == [(2.5, 7), (2.5, -1)]
    assert not req.done.triggered  # the verdict is a separate event

"""The verifier's event shortcuts (issue 16): a batch's verdicts answered from one heap entry,
callback-driven devices, and a request that is the event of its own arrival, behave as plain
SimPy events and processes did."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from wispsim.sim.verifier import Request, answer_together, processes


def _request(rid: int, done: Callable[[Request], object]) -> Request:
    return Request(rid, rid, 0.0, 1.0, 2.0, 3, 100, 103, done)


def _trace(complete: Callable[[simpy.Environment, list[Request]], None]) -> list[tuple[float, str]]:
    """What happens, in order, when two replicas finish batches at the same instant while other
    events (a timeout at that instant, arrivals scheduled by the answered devices) interleave.
    Replica a's members wait in processes (``processes`` of an event), replica b's are callbacks
    (as the simulator's devices are)."""
    env = simpy.Environment()
    log: list[tuple[float, str]] = []

    def waiting(name: str, verdict: simpy.Event) -> Generator[Any, Any, None]:
        yield verdict
        log.append((env.now, f"{name} resumed"))
        yield env.timeout(0)  # schedules at this very instant, after the verdicts
        log.append((env.now, f"{name} again"))

    def callback(name: str) -> Callable[[Request], None]:
        def done(_: Request) -> None:
            log.append((env.now, f"{name} resumed"))
            env.timeout(0).callbacks.append(lambda _: log.append((env.now, f"{name} again")))

        return done

    def replica(name: str, members: int) -> Generator[Any, Any, None]:
        batch = []
        for i in range(members):
            if name == "a":
                verdict = env.event()
                env.process(waiting(f"{name}{i}", verdict))
                batch.append(_request(i, processes(verdict)))
            else:
                batch.append(_request(i, callback(f"{name}{i}")))
        yield env.timeout(1.0)
        complete(env, batch)
        log.append((env.now, f"{name} next batch"))

    def bystander() -> Generator[Any, Any, None]:
        yield env.timeout(1.0)
        log.append((env.now, "bystander"))

    env.process(replica("a", 3))
    env.process(bystander())
    env.process(replica("b", 2))
    env.run()
    return log


def test_one_heap_entry_per_batch_keeps_the_order_of_separate_verdict_events() -> None:
    def one_by_one(env: simpy.Environment, batch: list[Request]) -> None:
        for r in batch:  # each verdict an event of its own
            ev = env.event()
            ev.callbacks.append(lambda _, r=r: r.done(r))
            ev.succeed()

    plain = _trace(one_by_one)
    assert _trace(answer_together) == plain
    assert [w for _, w in plain][:4] == ["a next batch", "bystander", "b next batch", "a0 resumed"]
    assert [w for _, w in plain][4:9] == ["a1 resumed", "a2 resumed", "b0 resumed", "b1 resumed", "a0 again"]


def test_a_request_is_the_event_of_its_arrival() -> None:
    env = simpy.Environment()
    got: list[tuple[float, int]] = []
    answered: list[Request] = []
    req = Request(7, 3, 2.5, 3.0, 2.0, 4, 100, 103, answered.append)
    req.send(env, 2.5, lambda r: got.append((env.now, r.rid)))
    plain = env.timeout(2.5)  # scheduled after it for the same instant: fires after it
    plain.callbacks.append(lambda _: got.append((env.now, -1)))
    env.run()
    assert got == [(2.5, 7), (2.5, -1)]
    assert answered == []  # arriving is not the verdict
    answer_together(env, [req])
    env.run()
    assert answered == [req]


def test_a_verdict_event_cannot_be_answered_twice() -> None:
    env = simpy.Environment()
    verdict = env.event()
    done = processes(verdict)
    done(None)
    assert verdict.processed and verdict.ok
    try:
        done(None)
    except RuntimeError as e:
        assert "already been triggered" in str(e)
    else:
        raise AssertionError("a second verdict went through")

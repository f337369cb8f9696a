"""The verifier's event shortcuts (issue 16, issue 44): a batch's verdicts completed with one heap
entry, a request sent as an event, and rounds posted as data to the run's only replica (its
inbox) behave as the plain SimPy events did."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pandas as pd
import pytest
import simpy

from wispsim import check, load_scenario
from wispsim.sim.front import RoundFront
from wispsim.sim.servers import SimulatedServers
from wispsim.sim.simulation import simulate
from wispsim.sim.verdict import Verdict
from wispsim.sim.verifier import Request, Verifier


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


def test_a_sent_request_reaches_the_server_at_its_arrival() -> None:
    env = simpy.Environment()
    got: list[tuple[float, int]] = []
    req = Request(7, 3, 2.5, 3.0, 2.0, 4, 100, 103, env.event())
    req.send(env, 2.5, lambda r: got.append((env.now, r.rid)))
    plain = env.timeout(2.5)  # scheduled after it for the same instant: fires after it
    plain.callbacks.append(lambda _: got.append((env.now, -1)))
    env.run()
    assert got == [(2.5, 7), (2.5, -1)]
    assert not req.done.triggered  # the verdict is a separate event


def _records(monkeypatch: pytest.MonkeyPatch, eager: bool, devices: int, **overrides: Any) -> list[int]:
    """Hashes of a run's round, batch and response records; ``eager``: every round an event (the
    inbox switched off, as behind a router)."""
    with monkeypatch.context() as m:
        if eager:
            m.setattr(Verifier, "post", None)
            m.setattr(RoundFront, "post", None)
        sc = load_scenario(
            overrides={
                "devices": {"classes": [4.0]},
                "workload": {"warmup_s": 5.0, "duration_s": 30.0},
                **overrides,
            }
        )
        res = simulate(check(sc), devices=devices, seed=5)
    return [
        int(pd.util.hash_pandas_object(df, index=False).sum())
        for df in (res.rounds, res.batches, res.responses)
    ]


@pytest.mark.parametrize(
    ("devices", "overrides"),
    [
        (60, {"policy": "wisp"}),  # the API servers in front (the default build's host)
        (3, {"policy": "wisp"}),  # a replica idle most of the time: woken by its inbox
        (60, {"policy": "wisp", "server": {"host": {"cpu": "off"}}}),  # no API servers: straight in
        (60, {"policy": "wisp-lru"}),  # LRU eviction, no admission control
        (20, {"policy": "sled"}),
        (60, {"policy": "wisp", "server": {"host": {"api_server_count": 1}}}),  # a queueing API server
    ],
)
def test_rounds_posted_as_data_give_the_records_of_one_event_each(
    monkeypatch: pytest.MonkeyPatch, devices: int, overrides: dict[str, Any]
) -> None:
    lazy = _records(monkeypatch, False, devices, **overrides)
    assert lazy == _records(monkeypatch, True, devices, **overrides)


def test_only_the_runs_only_replica_takes_rounds_as_data() -> None:
    """Behind a router every round is an event (the router picks its replica at its arrival)."""
    sc = check(load_scenario(overrides={"server": {"replicas": 2}}))
    ctx_servers: list[Any] = []
    real = SimulatedServers.build

    def spy(self: SimulatedServers, ctx: Any, resolved: Any) -> None:
        real(self, ctx, resolved)
        ctx_servers.append(ctx.server)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(SimulatedServers, "build", spy)
        simulate(sc, devices=4, seed=0)
    assert getattr(ctx_servers[0], "post", None) is None
    single = check(load_scenario())
    with pytest.MonkeyPatch.context() as m:
        m.setattr(SimulatedServers, "build", spy)
        simulate(single, devices=4, seed=0)
    assert callable(getattr(ctx_servers[1], "post", None))

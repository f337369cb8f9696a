"""The verification server: one GPU replica that verifies drafts in batches (SPEC 2.3).

Requests wait in a queue. Whenever the GPU is idle and the queue is not empty, the scheduler forms
a batch (a dispatch epoch); the server makes room in KV memory (evicting idle prefixes LRU-first),
runs the batch for the latency model's time, and completes every member at once -- the slowest
part sets everyone's finish time.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import simpy
from simpy.events import NORMAL, PENDING, Event

from wispsim.model.admission import Admission
from wispsim.model.batch import Batch
from wispsim.model.latency import Pricing
from wispsim.model.memory import KVMemory
from wispsim.model.schedulers import GpuState, Scheduler
from wispsim.model.verifier_kinds import VerifierKind
from wispsim.sim.records import BatchRecord, Holdings

T = TypeVar("T")


@dataclass(slots=True)
class VerifierParts(Generic[T]):
    """What one verification replica plans with: the scheduler's view of the GPU (the cost model
    it plans with, a batch's limits), the KV memory model, the scheduler, admission control."""

    gpu: GpuState
    memory: KVMemory
    scheduler: Scheduler
    admission: Admission[T] | None


class Request(Event):
    """One round's verification request, as the server and scheduler see it.

    It is also the SimPy event of its own arrival: a simulated device schedules it to fire when
    its uplink ends (:meth:`send`), with the server's ``submit`` as its callback -- one event per
    round instead of a timeout carrying the request. ``done`` is the event of its verdict. A
    request that is never sent (a replayed or remote round) is just data: its event state means
    nothing there.
    """

    __slots__ = (
        "_ok",
        "_value",
        "arrival",
        "batch",
        "callbacks",
        "cold",
        "deadline",
        "dispatch",
        "done",
        "env",
        "k",
        "l_cached",
        "l_new",
        "n_hat",
        "prefix",
        "prefix_after",
        "rid",
        "session",
        "verify_time",
        "work",
    )

    def __init__(
        self,
        rid: int,
        session: int,
        arrival: float,
        deadline: float,
        n_hat: float,
        k: int,
        prefix: int,
        prefix_after: int,
        done: simpy.Event,
    ) -> None:
        self.rid = rid
        self.session = session
        self.arrival = arrival
        self.deadline = deadline
        self.n_hat = n_hat
        self.k = k
        self.prefix = prefix
        self.prefix_after = prefix_after
        self.done = done
        self.l_new = prefix + k
        self.l_cached = 0
        self.cold = True
        self.dispatch = 0.0
        self.verify_time = 0.0
        self.batch = -1
        self.work = 0.0  # the estimator's marginal cost where it was queued (for routing)
        self._ok = True  # as an event (its arrival), it can only succeed
        self._value = None

    def send(self, env: simpy.Environment, delay: float, submit: Callable[[Request], object]) -> None:
        """Have ``submit(self)`` called when the request reaches the server, ``delay`` from now
        (what ``env.timeout(delay)`` with that callback does, in one event)."""
        self.env = env
        self.callbacks = [submit]
        env.schedule(self, NORMAL, delay)


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


def schedule(
    queue: list[Any], now: float, gpu: GpuState, scheduler: Scheduler, memory: KVMemory, bid: int
) -> tuple[Batch[Any], list[Any], int]:
    """A verification server's dispatch epoch, on either clock (the simulated :class:`Verifier`
    and the real server, :mod:`wispsim.serve.verify`): refresh every queued round's L_new /
    L_cached from the prefix cache, ask the scheduler for a batch with its estimate, mark its
    members with ``bid`` and make room for them in KV memory. Returns the batch, the rounds still
    queued, and how many prefixes were evicted."""
    memory.refresh(queue)
    batch = scheduler.select(queue, now, gpu)
    members = batch.members
    for r in members:
        r.batch = bid
    # the whole queue dispatched is the common case
    rest = [] if len(members) == len(queue) else [r for r in queue if r.batch != bid]
    evicted = memory.allocate([(r.session, r.l_new + r.l_cached) for r in members])
    return batch, rest, evicted


class Verifier:
    """One GPU replica running speculative verification."""

    def __init__(
        self,
        env: simpy.Environment,
        replica: int,
        parts: VerifierParts[Request],
        pricing: Pricing,
        batches: list[Any],
        batch_ids: Any,
        track_work: bool = False,
        kind: VerifierKind | None = None,
    ) -> None:
        gpu, scheduler, memory, admission = parts.gpu, parts.scheduler, parts.memory, parts.admission
        self.env = env
        self.admission = admission  # KV admission control (server.verifier.kv_policy: admission), or LRU
        self.track_work = track_work  # only routers read the outstanding work
        self.replica = replica
        self.gpu = gpu
        self.scheduler = scheduler
        self.memory = memory
        self.pricing = pricing  # a batch's time by its parts, at one point (wispsim.model.latency)
        # the scheduler plans with another profile than the one pricing the batches
        # (server.planning_profile): the recorded estimate is the planner's, and the batch is
        # priced once more, by the profile that prices it
        self._own_price = None if gpu.estimator is pricing.cost else pricing.cost.price
        self.batches = batches
        self._batch_ids = batch_ids
        self.kind = kind or VerifierKind()  # server.verifier.kind: how a round reaches the engine
        self.queue: list[Request] = []
        self._wake: simpy.Event | None = None
        self.busy_until = 0.0
        self.queued_work = 0.0
        self.holdings = Holdings()
        env.process(self.loop())

    def held_shares(self, window: tuple[float, float]) -> tuple[float, float]:
        """Mean KV and ``max_num_seqs`` shares, seconds of passes that left work waiting (Holdings)."""
        return self.holdings.shares(window)

    def cost(self, req: Request) -> float:
        """The estimator's marginal cost of ``req`` here: cheap on a cached prefix (the cache
        serves what :meth:`KVMemory.hit` says, as at dispatch)."""
        hit = self.memory.hit(req.session, req.prefix)
        return self.gpu.estimator.marginal(req.prefix - hit + req.k, hit)

    def held(self, session: int) -> int:
        """Tokens of ``session`` the engine holds now (what a resident round resumes)."""
        return self.memory.cached_tokens(session)

    def outstanding(self, now: float) -> float:
        """Seconds of work ahead of a new request: the running batch's rest plus the queue."""
        return max(self.busy_until - now, 0.0) + self.queued_work

    def drop(self, session: int) -> None:
        """A response finished: free its prefix (and, under admission control, its reservation:
        the waiting responses that now fit are admitted, their first rounds queued)."""
        self.memory.drop(session)
        if self.admission is not None:
            for req in self.admission.release(session):
                self._enqueue(req)

    def submit(self, req: Request) -> simpy.Event:
        adm = self.admission
        # an admitted response's rounds pass straight through (checked here: once per round)
        if (
            adm is not None
            and req.session not in adm.reserved
            and not adm.offer(req.session, req.prefix, req.arrival, req.deadline, req)
        ):
            return req.done  # waits for room; its deadline runs meanwhile
        if self.track_work:
            self._enqueue(req)
            return req.done
        self.queue.append(req)  # _enqueue, inlined
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None
        return req.done

    def _enqueue(self, req: Request) -> None:
        if self.track_work:
            req.work = self.cost(req)
            self.queued_work += req.work
        self.queue.append(req)
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    def loop(self) -> Generator[Any, Any, None]:
        env = self.env
        memory = self.memory
        adm = self.admission
        while True:
            if not self.queue:
                self._wake = env.event()
                yield self._wake
            now = env.now
            queue_len = len(self.queue)
            # schedule: the batch, with the estimate it was planned with
            bid = next(self._batch_ids)
            batch, self.queue, evicted = schedule(self.queue, now, self.gpu, self.scheduler, memory, bid)
            members = batch.members
            shape = batch.shape
            # run: the server's profile prices the batch (once more only if the planner's differs),
            # the engine core's CPU beside the GPU where the host is modelled
            t_hat = batch.estimate
            price = self.pricing
            gpu = price.gpu(shape, t_hat if self._own_price is None else self._own_price(shape))
            took = price.step(gpu, members, self.kind.engine_work)
            latency = took.total
            blocks_used = memory.used
            kv_held = adm.used / adm.limit if adm is not None else blocks_used / memory.total_blocks
            # the engine's request slots: a resident session holds one while admitted, a re-submitted
            # round only while it is verified
            held = len(adm.reserved) if adm is not None and adm.max_sessions is not None else len(members)
            self.holdings.log(now, latency, kv_held, held / self.gpu.max_requests, bool(self.queue))
            if self.track_work:
                self.queued_work = max(self.queued_work - sum(r.work for r in members), 0.0)
                self.busy_until = now + t_hat
            yield env.timeout(latency)
            # postprocess: each member's committed prefix stays cached, verdicts go out
            evicted += memory.finish_batch(members)
            for r in members:
                r.dispatch = now
                r.verify_time = latency
            if adm is not None:
                for r in members:
                    adm.grow(r.session, r.prefix_after)
            Verdict.succeed_all(env, [r.done for r in members])
            self.batches.append(
                BatchRecord(
                    bid,
                    self.replica,
                    "verify",
                    now,
                    env.now,
                    len(members),
                    queue_len,
                    shape.n_linear,
                    shape.n_interactions,
                    shape.n_cached,
                    t_hat,
                    latency,
                    blocks_used,
                    evicted,
                    took.gpu,
                    took.cpu,
                )
            )

"""The verification server: one GPU replica that verifies drafts in batches (SPEC 2.3).

Requests wait in a queue. Whenever the GPU is idle and the queue is not empty, the scheduler forms
a batch (a dispatch epoch); the server makes room in KV memory (evicting idle prefixes LRU-first),
runs the batch for the latency model's time, and completes every member at once -- the slowest
part sets everyone's finish time.

A request reaches the queue one of two ways: ``submit`` (an event per request: the router's
replicas, a real server's clients) or ``post`` (data in the replica's
:mod:`~wispsim.sim.inbox`, read whenever the verifier looks; the run's only replica).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import simpy

from wispsim.model.admission import Admission
from wispsim.model.batch import Batch
from wispsim.model.latency import Pricing
from wispsim.model.memory import KVMemory
from wispsim.model.schedulers import GpuState, Scheduler
from wispsim.model.verifier_kinds import VerifierKind
from wispsim.sim.inbox import Inbox
from wispsim.sim.records import BatchRecord, Holdings, RecordTable
from wispsim.sim.verdict import Verdict


@dataclass(slots=True)
class VerifierParts:
    """What one verification replica plans with: the scheduler's view of the GPU (the cost model
    it plans with, a batch's limits), the KV memory model, the scheduler, admission control."""

    gpu: GpuState
    memory: KVMemory
    scheduler: Scheduler
    admission: Admission | None


class Request:
    """One round's verification request, as the server and scheduler see it: data, which the run's
    only replica reads from its inbox (:meth:`Verifier.post`) and a routed replica or a real
    server's client is handed when its uplink ends (:meth:`send`). ``done`` is the event of its
    verdict.
    """

    __slots__ = (
        "arrival",
        "batch",
        "cold",
        "deadline",
        "dispatch",
        "done",
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

    def send(self, env: simpy.Environment, delay: float, submit: Callable[[Request], object]) -> None:
        """Have ``submit(self)`` called when the request reaches the server, ``delay`` from now."""

        def arrive(_: simpy.Event) -> None:
            submit(self)

        env.timeout(delay).callbacks.append(arrive)


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
        parts: VerifierParts,
        pricing: Pricing,
        batches: RecordTable,
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
        self._wake: simpy.Event | None = None  # what the idle loop waits on
        self._alarm_at = math.inf  # when the idle loop is woken for the inbox
        self.inbox = Inbox()  # rounds posted as data (a RoundFront puts its API servers in it)
        self.busy_until = 0.0
        self.queued_work = 0.0
        self.holdings = Holdings()
        env.process(self.loop())

    def held_shares(self, window: tuple[float, float]) -> tuple[float, float, float]:
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
        self.inbox.catch_up(self.env.now, self.submit)  # what arrived so far saw the prefix
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
            self._rouse()
        return req.done

    def post(self, req: Request) -> None:
        """``req`` reaches the server at ``req.arrival``, as data (the inbox; see the module text):
        an idle loop is woken for it."""
        self.inbox.post(req)
        if self._wake is not None and req.arrival < self._alarm_at:
            self._arm(req.arrival)

    def _rouse(self) -> None:
        assert self._wake is not None
        self._wake.succeed()
        self._wake = None
        self._alarm_at = math.inf

    def _arm(self, t: float) -> None:
        """Wake the idle loop at ``t`` (an earlier alarm still rings, and finds it awake)."""
        self._alarm_at = t
        self.env.timeout(t - self.env.now).callbacks.append(self._ring)

    def _ring(self, _: Any) -> None:
        if self._wake is not None and self.env.now >= self._alarm_at:
            self._rouse()

    def _enqueue(self, req: Request) -> None:
        if self.track_work:
            req.work = self.cost(req)
            self.queued_work += req.work
        self.queue.append(req)
        if self._wake is not None:
            self._rouse()

    def loop(self) -> Generator[Any, Any, None]:
        env = self.env
        memory = self.memory
        adm = self.admission
        inbox, submit = self.inbox, self.submit
        while True:
            inbox.catch_up(env.now, submit)
            if not self.queue:
                self._wake = env.event()
                t = inbox.next_time()
                if t < math.inf:
                    self._arm(t)
                yield self._wake
                continue
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
            inbox.catch_up(env.now, submit)  # what arrived meanwhile, before the batch's prefixes
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

"""The real verification server's core: sessions, the queue, and the dispatch loop.

The loop is the simulated verifier's (:class:`wispsim.sim.verifier.Verifier`) on the wall clock:
whenever the engine is idle and rounds are waiting, it refreshes every queued round's L_new /
L_cached from its model of the prefix cache (:meth:`wispsim.model.memory.KVMemory.refresh` over a
:class:`~wispsim.model.memory.KVMemory` sized to the engine's real KV cache and block), asks **the
same scheduler plug-in** (``wisp``, ``fcfs``) for a batch with the estimator of the engine's
measured profile, and runs the batch on the engine: every member's session tokens plus its draft,
one output token each, in one call. What the engine really served from its prefix cache is what
the reply and the batch log report (vLLM's ``num_cached_tokens``); the model's plan is logged
beside it.

A resident verifier (``server.verifier: resident``; ``resident`` given, e.g.
:class:`wispsim.engines.vllm_sessions.ResidentSessions`) keeps each session in the engine instead
of re-submitting it: a round sends the tokens the engine has not computed (the last bonus token)
and its drafts, over the session's KV; a closed session's request ends before the next batch.

Verdicts are replayed, not computed: the device sends how many draft tokens its acceptance trace
accepts and how many tokens the round commits (both sides replay the same trace, so the
validation isolates the serving model). vLLM's log-probabilities at every draft position are
only available through ``prompt_logprobs``, which turns its prefix cache off for the request, so a
verifier that computed the verdict on vLLM would not be the verifier under test. The server
commits the accepted draft tokens and the engine's own next token (the bonus token), so each
session's token sequence grows exactly as a real one does and its next round's prefix is cached
by vLLM the way a real session's is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from wispsim.errors import WispsimError
from wispsim.model.admission import Admission
from wispsim.model.batch import Shape
from wispsim.model.memory import KVMemory
from wispsim.model.schedulers import GpuState, Scheduler
from wispsim.sim.verifier import schedule


class ServeError(WispsimError):
    """A bad request: the HTTP layer answers it with its status and this one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Round:
    """One queued verification round, as the scheduler sees it (:class:`PendingLike`)."""

    rid: int
    session: int
    arrival: float
    deadline: float
    n_hat: float
    k: int
    prefix: int
    draft: list[int]
    accepted: int
    commit: int
    done: asyncio.Future[dict[str, Any]]
    l_new: int = 0
    l_cached: int = 0
    cold: bool = True
    batch: int = -1
    admitted: float = 0.0  # when admission control let it queue (its arrival under LRU)


@dataclass(slots=True)
class Session:
    tokens: list[int]
    rounds: int = 0
    busy: bool = False


@dataclass
class BatchLog:
    """What the server did: one row per batch and one per member of a batch."""

    batches: list[dict[str, Any]] = field(default_factory=list)
    members: list[dict[str, Any]] = field(default_factory=list)


class VerifyServer:
    """Sessions, the queue and the dispatch loop of one verification replica.

    ``run_batch(seqs) -> (bonus tokens, cached tokens per request or None)`` runs one batch on
    the engine (blocking; it is called in a worker thread). ``clock`` is the server's clock
    (``time.monotonic``), the one every logged time is on.

    ``admission`` (``server.kv_policy: admission``) gates each session's first round on the KV
    reservations of the sessions already admitted (:mod:`wispsim.model.admission`, the
    simulator's own), sized to the engine's real cache; a session waits until one ends.
    ``release(seqs)`` tells the engine which sessions ended, so that it reuses their blocks first
    and never has to evict an admitted session's prefix (vLLM's own LRU would evict whichever
    prefix was freed first); it runs in the batch thread, just before the next batch.

    ``resident`` (``run(items)``, ``end(sids)``, ``clear()``) keeps sessions in the engine
    (module docstring); ``run_batch`` is then unused.
    """

    def __init__(
        self,
        gpu: GpuState,
        scheduler: Scheduler,
        memory: KVMemory,
        run_batch: Callable[[list[list[int]]], tuple[list[int], tuple[int, ...] | None]],
        vocab: int,
        max_len: int,
        clock: Callable[[], float] = time.monotonic,
        admission: Admission[Round] | None = None,
        release: Callable[[list[list[int]]], int | None] | None = None,
        resident: Any = None,
    ) -> None:
        self.resident = resident
        self.admission = admission
        self.release = release
        self.gpu = gpu
        self.scheduler = scheduler
        self.memory = memory
        self.run_batch = run_batch
        self.vocab = vocab
        self.max_len = max_len
        self.clock = clock
        self.reset()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def reset(self) -> None:
        """Forget every session and the batch log (between the points of a validation)."""
        self.sessions: dict[int, Session] = {}
        self.queue: list[Round] = []
        self.log = BatchLog()
        self._session_ids = count()
        self._round_ids = count()
        self._batch_ids = count()
        self.memory.cache.clear()
        self.memory.used = 0
        self._ended: list[list[int]] = []  # token sequences of ended sessions, for release()
        self._ended_sessions: list[int] = []  # resident sessions to end before the next batch
        self.running = False  # a batch is on the engine
        if self.resident is not None:  # called while no batch runs (the reset endpoint checks)
            self.resident.clear()
        if self.admission is not None:
            # rounds still waiting for admission (devices that are gone) are answered, not kept
            self._refuse_waiting(None, "reset: the server was reset while this round waited")
            self.admission.clear()

    def _refuse_waiting(self, sid: int | None, message: str) -> None:
        """Answer (409) the rounds waiting for admission: of session ``sid``, or all (None)."""
        assert self.admission is not None
        for w in self.admission.waiting:
            if (sid is None or w.session == sid) and not w.item.done.done():
                w.item.done.set_exception(ServeError(409, message))

    def idle(self) -> bool:
        """No round queued or on the engine (rounds waiting for admission do not count: a reset
        answers them)."""
        return not self.queue and not self.running

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- the API -------------------------------------------------------------------------------

    def _check_tokens(self, tokens: list[int], what: str) -> None:
        bad = next((t for t in tokens if not 0 <= t < self.vocab), None)
        if bad is not None:
            raise ServeError(422, f"{what}: token id {bad} is outside the vocabulary [0, {self.vocab})")

    def open_session(self, prompt: list[int]) -> int:
        self._check_tokens(prompt, "prompt")
        if len(prompt) >= self.max_len:
            raise ServeError(
                422, f"prompt: {len(prompt)} tokens; the engine holds at most {self.max_len - 1}"
            )
        sid = next(self._session_ids)
        self.sessions[sid] = Session(list(prompt))
        return sid

    def close_session(self, sid: int) -> None:
        s = self.sessions.pop(sid, None)
        if s is None:
            raise ServeError(404, f"session {sid}: no such session (closed, or never opened)")
        self.memory.drop(sid)
        if self.resident is not None:
            self._ended_sessions.append(sid)
        if self.admission is not None:
            if self.release is not None and self.admission.admitted(sid):
                self._ended.append(s.tokens)
            # a round of it still waiting for room is answered
            self._refuse_waiting(sid, f"session {sid}: closed while its round waited")
            now = self.clock()
            for r in self.admission.release(sid):
                r.admitted = now
                self.queue.append(r)
            self._wake.set()

    async def verify(
        self, sid: int, draft: list[int], accepted: int, commit: int, budget_s: float, n_hat: float
    ) -> dict[str, Any]:
        """Queue one round and wait for its verdict."""
        s = self.sessions.get(sid)
        if s is None:
            raise ServeError(404, f"session {sid}: no such session (open one with POST /sessions)")
        if s.busy:
            raise ServeError(409, f"session {sid}: a round of it is already waiting for its verdict")
        self._check_tokens(draft, "draft")
        k = len(draft)
        if not 0 <= accepted <= k:
            raise ServeError(422, f"accepted: must be in [0, {k}] (the draft's length), got {accepted}")
        if not 1 <= commit <= accepted + 1:
            raise ServeError(422, f"commit: must be in [1, accepted + 1 = {accepted + 1}], got {commit}")
        if len(s.tokens) + k + 1 > self.max_len:
            raise ServeError(
                422, f"session {sid}: {len(s.tokens)} tokens + {k} drafted exceed the engine's {self.max_len}"
            )
        now = self.clock()
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        r = Round(
            next(self._round_ids),
            sid,
            now,
            now + budget_s,
            n_hat,
            k,
            len(s.tokens),
            list(draft),
            accepted,
            commit,
            fut,
        )
        s.busy = True
        r.admitted = now
        adm = self.admission
        if adm is None or adm.offer(sid, len(s.tokens), now, now + budget_s, r):
            self.queue.append(r)
            self._wake.set()
        try:
            return await fut
        finally:
            s.busy = False

    # -- the dispatch loop ---------------------------------------------------------------------

    def _run(self, seqs: list[list[int]], ended: list[list[int]]) -> tuple[list[int], tuple[int, ...] | None]:
        """In the batch thread: free the ended sessions' blocks first, then run the batch."""
        if ended and self.release is not None:
            self.release(ended)
        return self.run_batch(seqs)

    def _run_resident(
        self, items: list[tuple[int, list[int], list[int]]], ended: list[int]
    ) -> tuple[list[int], tuple[int, ...] | None]:
        """In the batch thread: end the closed sessions, then run the rounds over the others."""
        if ended:
            self.resident.end(ended)
        bonus, held = self.resident.run(items)
        return bonus, tuple(held)

    async def _loop(self) -> None:
        while True:
            if not self.queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._dispatch()

    async def _dispatch(self) -> None:
        memory = self.memory
        now = self.clock()
        # a round whose session was closed meanwhile is dropped
        self.queue = [r for r in self.queue if r.session in self.sessions and not r.done.done()]
        if not self.queue:
            return
        queue_len = len(self.queue)
        bid = next(self._batch_ids)
        # the simulated verifier's dispatch epoch, on the wall clock
        selected, self.queue, evicted = schedule(self.queue, now, self.gpu, self.scheduler, memory, bid)
        batch, plan_shape = selected.members, selected.shape
        t_hat = selected.estimate  # the scheduler's estimate: the batch is not priced again
        plan = [(r.l_new, r.l_cached) for r in batch]
        blocks_used = memory.used
        seqs = [self.sessions[r.session].tokens + r.draft for r in batch]
        ended, self._ended = self._ended, []
        t0 = self.clock()
        self.running = True
        try:
            if self.resident is None:
                bonus, cached = await asyncio.to_thread(self._run, seqs, ended)
            else:  # what the engine held of each sequence is its "cached" part
                items = [(r.session, self.sessions[r.session].tokens, r.draft) for r in batch]
                gone, self._ended_sessions = self._ended_sessions, []
                bonus, cached = await asyncio.to_thread(self._run_resident, items, gone)
        finally:
            self.running = False
        t1 = self.clock()
        real = [(len(q) - c, c) for q, c in zip(seqs, cached, strict=True)] if cached else plan
        served = Shape.of(real)  # what the engine served (vLLM caches whole blocks)
        for r, (l_new, l_cached), b in zip(batch, real, bonus, strict=True):
            s = self.sessions.get(r.session)
            if s is not None:
                s.tokens.extend(([*r.draft[: r.accepted], b])[: r.commit])
                s.rounds += 1
                evicted += memory.finish_round(r.session, len(s.tokens))
                if self.admission is not None:
                    self.admission.grow(r.session, len(s.tokens))
            self.log.members.append(
                {
                    "batch": bid,
                    "session": r.session,
                    "round": r.rid,
                    "k": r.k,
                    "prefix": r.prefix,
                    "l_new": l_new,
                    "l_cached": l_cached,
                    "l_new_plan": r.l_new,
                    "l_cached_plan": r.l_cached,
                    "admission_wait_s": r.admitted - r.arrival,
                }
            )
            if not r.done.done():
                r.done.set_result(
                    {
                        "accepted": r.accepted,
                        "committed": r.commit,
                        "bonus_token": b,
                        "t_arrival": r.arrival,
                        "t_dispatch": t0,
                        "t_done": t1,
                        "queue_s": t0 - r.arrival,
                        "verify_s": t1 - t0,
                        "batch": bid,
                        "batch_size": len(batch),
                        "l_new": l_new,
                        "l_cached": l_cached,
                        "l_new_plan": r.l_new,
                        "l_cached_plan": r.l_cached,
                    }
                )
        self.log.batches.append(
            {
                "batch": bid,
                "replica": 0,
                "kind": "verify",
                "t_dispatch": t0,
                "t_end": t1,
                "size": len(batch),
                "queue_len": queue_len,
                "n_linear": served.n_linear,
                "n_interactions": served.n_interactions,
                "n_cached": served.n_cached,
                "t_hat": t_hat,
                "latency": t1 - t0,
                "blocks_used": blocks_used,
                "evictions": evicted,
                "n_linear_plan": plan_shape.n_linear,
                "n_cached_plan": plan_shape.n_cached,
                "t_schedule": t0 - now,
            }
        )

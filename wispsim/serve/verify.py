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

A resident verifier (``server.verifier.kind: resident``; ``resident`` given, e.g.
:class:`wispsim.engines.vllm_sessions.ResidentSessions`) keeps each session in the engine instead
of re-submitting it: a round sends the tokens the engine has not computed (the last bonus token)
and its drafts, over the session's KV; a closed session's request ends before the next batch.

What a round carries and why its verdict is replayed: :mod:`wispsim.serve.rounds`.

What it promises (issue 42; docs/serve.md): every round it accepts is answered, with a verdict or
a one-line error -- a round whose session is closed while it waits gets a 409, one the engine
could not serve a 503 that leaves the session as it was (retry it), any other engine failure a
500 -- and the loop goes on. A session's id is 128 random bits, the capability to use it; drafts
are checked against the ``k_max + 1`` tokens admission reserved per round; an idle session is
closed after ``limits.session_idle_s``; sessions, waiting rounds and log rows are capped
(:class:`wispsim.serve.limits.Limits`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from itertools import count
from typing import Any

from wispsim.engines.vllm_steps import EngineStalled, EngineStopped
from wispsim.model.admission import Admission
from wispsim.model.batch import Shape
from wispsim.model.memory import KVMemory
from wispsim.model.schedulers import GpuState, Scheduler
from wispsim.serve import rounds
from wispsim.serve.limits import BatchLog, Limits, new_session_id
from wispsim.serve.rounds import RETRY_S, Round, ServeError, Session, batch_row, member_row, reply
from wispsim.sim.verifier import schedule

NOT_FOUND = "no such session (closed, expired, or never opened)"


class VerifyServer:
    """Sessions, the queue and the dispatch loop of one verification replica.

    ``run_batch(seqs) -> (bonus tokens, cached tokens per request or None)`` runs one batch on
    the engine (blocking; it is called in a worker thread). ``clock`` is the server's clock
    (``time.monotonic``), the one every logged time is on.

    ``admission`` (``server.verifier.kv_policy: admission``) gates each session's first round on the KV
    reservations of the sessions already admitted (:mod:`wispsim.model.admission`, the
    simulator's own), sized to the engine's real cache; a session waits until one ends.
    ``release(seqs)`` tells the engine which sessions ended, so that it reuses their blocks first
    and never has to evict an admitted session's prefix (vLLM's own LRU would evict whichever
    prefix was freed first); it runs in the batch thread, just before the next batch.

    ``resident`` (``run(items)``, ``end(sids)``, ``clear()``) keeps sessions in the engine
    (module docstring); ``run_batch`` is then unused. ``k_max`` is the longest draft a round may
    carry (admission reserves ``k_max + 1`` tokens per round); ``stop`` is set when the server
    shuts down (an engine batch ends between steps).
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
        admission: Admission | None = None,
        release: Callable[[list[list[int]]], int | None] | None = None,
        resident: Any = None,
        k_max: int | None = None,
        limits: Limits | None = None,
        stop: threading.Event | None = None,
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
        self.k_max = k_max if k_max is not None else max_len
        self.limits = limits or Limits()
        self.stop_event = stop or threading.Event()
        self.counts: Counter[str] = Counter()  # monotonic counters for /metrics
        self._engine_lock = threading.Lock()  # held by the thread working on the engine
        self._session_ids = count()  # never restarts: a reset does not reuse a number
        self.reset()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def reset(self) -> None:
        """Forget every session and the batch log (between the points of a validation)."""
        self.sessions: dict[str, Session] = {}  # by id (the capability)
        self.by_sid: dict[int, str] = {}  # the server's number -> id
        self.queue: list[Round] = []
        self.log = BatchLog(self.limits.log_rows)
        self._round_ids = count()
        self._batch_ids = count()
        self.memory.cache.clear()
        self.memory.used = 0
        self._ended: list[list[int]] = []  # token sequences of ended sessions, for release()
        self._ended_sessions: list[int] = []  # resident sessions to end before the next batch
        self.running = False  # a batch is on the engine
        self.batch_started = 0.0  # when the batch on the engine started (server clock)
        self.engine_cpu_s = 0.0  # CPU seconds of the engine's calls in the batch thread (load())
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
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._loop()), loop.create_task(self._reaper())]

    async def stop(self) -> None:
        """Stop the loops; a batch on the engine ends between two engine steps."""
        self.stop_event.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- what /health and /metrics report ------------------------------------------------------

    def load(self) -> dict[str, Any]:
        """The server's state now (:func:`wispsim.serve.rounds.server_load`)."""
        return rounds.server_load(self)

    # -- the API -------------------------------------------------------------------------------

    def _check_tokens(self, tokens: list[int], what: str) -> None:
        bad = next((t for t in tokens if not 0 <= t < self.vocab), None)
        if bad is not None:
            raise ServeError(422, f"{what}: token id {bad} is outside the vocabulary [0, {self.vocab})")

    def _session(self, token: str) -> Session:
        s = self.sessions.get(token)
        if s is None:
            raise ServeError(404, f"session: {NOT_FOUND}")
        return s

    def _refuse(self, reason: str, message: str) -> ServeError:
        self.counts[f"refused_{reason}"] += 1
        return ServeError(503, message, RETRY_S)

    def open_session(self, prompt: list[int]) -> str:
        """Open a session on ``prompt``; returns its id (the capability to use it)."""
        self._check_tokens(prompt, "prompt")
        if len(prompt) >= self.max_len:
            raise ServeError(
                422, f"prompt: {len(prompt)} tokens; the engine holds at most {self.max_len - 1}"
            )
        adm = self.admission
        if adm is not None and adm.reservation(len(prompt)) > adm.limit:
            raise ServeError(
                422,
                f"prompt: {len(prompt)} tokens need {adm.reservation(len(prompt))} KV blocks with their "
                f"expected output and a round; the cache admits {adm.limit}",
            )
        if len(self.sessions) >= self.limits.max_sessions:
            self.expire(self.clock())
            if len(self.sessions) >= self.limits.max_sessions:
                raise self._refuse(
                    "sessions",
                    f"sessions: {self.limits.max_sessions} open, the most this server holds; close "
                    "finished ones, or retry",
                )
        sid = next(self._session_ids)
        token = new_session_id()
        self.sessions[token] = Session(sid, list(prompt), self.clock())
        self.by_sid[sid] = token
        self.counts["sessions_opened"] += 1
        return token

    def close_session(self, token: str) -> None:
        s = self.sessions.get(token)
        if s is None:
            raise ServeError(404, f"session: {NOT_FOUND}")
        self._close(token, s, "closed")

    def _close(self, token: str, s: Session, why: str) -> None:
        """End session ``s``: its queued round and any waiting for admission are answered (409),
        its cache-model prefix and reservation go, a resident engine request ends before the
        next batch, and waiting sessions that now fit are admitted."""
        del self.sessions[token]
        self.by_sid.pop(s.sid, None)
        sid = s.sid
        message = f"session: {why} while its round waited"
        for r in self.queue:
            if r.session == sid and not r.done.done():
                r.done.set_exception(ServeError(409, message))
        self.queue = [r for r in self.queue if r.session != sid]
        self.memory.drop(sid)
        if self.resident is not None:
            self._ended_sessions.append(sid)
        if self.admission is not None:
            if self.release is not None and self.admission.admitted(sid):
                self._ended.append(s.tokens)
            self._refuse_waiting(sid, message)
            now = self.clock()
            for r in self.admission.release(sid):
                r.admitted = now
                self.queue.append(r)
        self._wake.set()

    def expire(self, now: float) -> int:
        """Close every session idle (no round waiting, none finished) for longer than
        ``limits.session_idle_s``; returns how many."""
        limit = self.limits.session_idle_s
        stale = [(t, s) for t, s in self.sessions.items() if not s.busy and now - s.last > limit]
        for token, s in stale:
            self._close(token, s, "expired")
        self.counts["sessions_expired"] += len(stale)
        return len(stale)

    async def _reaper(self) -> None:
        every = min(5.0, self.limits.session_idle_s / 4)
        while True:
            await asyncio.sleep(every)
            self.expire(self.clock())

    async def verify(
        self, token: str, draft: list[int], accepted: int, commit: int, budget_s: float, n_hat: float
    ) -> dict[str, Any]:
        """Queue one round and wait for its verdict."""
        s = self._session(token)
        if s.busy:
            raise ServeError(409, "session: a round of it is already waiting for its verdict")
        self._check_tokens(draft, "draft")
        k = len(draft)
        if k > self.k_max:
            raise ServeError(
                422, f"draft: {k} tokens; this server verifies at most k_max = {self.k_max} per round"
            )
        if not 0 <= accepted <= k:
            raise ServeError(422, f"accepted: must be in [0, {k}] (the draft's length), got {accepted}")
        if not 1 <= commit <= accepted + 1:
            raise ServeError(422, f"commit: must be in [1, accepted + 1 = {accepted + 1}], got {commit}")
        if len(s.tokens) + k + 1 > self.max_len:
            raise ServeError(
                422, f"session: {len(s.tokens)} tokens + {k} drafted exceed the engine's {self.max_len}"
            )
        adm = self.admission
        waiting = len(self.queue) + (len(adm.waiting) if adm is not None else 0)
        if waiting >= self.limits.max_waiting:
            raise self._refuse("waiting", f"rounds: {waiting} waiting, the most this server queues; retry")
        now = self.clock()
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        sid = s.sid
        r = Round(next(self._round_ids), sid, now, now + budget_s, n_hat, k, len(s.tokens), list(draft),
                  accepted, commit, fut)  # fmt: skip
        s.busy = True
        r.admitted = now
        if adm is None or adm.offer(sid, len(s.tokens), now, now + budget_s, r):
            self.queue.append(r)
            self._wake.set()
        try:
            return await fut
        finally:
            s.busy = False
            s.last = self.clock()

    # -- the dispatch loop ---------------------------------------------------------------------

    def _run(self, seqs: list[list[int]], ended: list[list[int]]) -> tuple[list[Any], tuple[int, ...] | None]:
        """In the batch thread: free the ended sessions' blocks first, then run the batch."""
        with self._engine_lock, self._engine_time():
            if ended and self.release is not None:
                self.release(ended)
            return self.run_batch(seqs)

    def _run_resident(
        self, items: list[tuple[int, list[int], list[int]]], ended: list[int]
    ) -> tuple[list[Any], tuple[int, ...] | None]:
        """In the batch thread: end the closed sessions, then run the rounds over the others."""
        with self._engine_lock, self._engine_time():
            if ended:
                self.resident.end(ended)
            bonus, held = self.resident.run(items)
        return bonus, tuple(held)

    @contextlib.contextmanager
    def _engine_time(self) -> Any:
        """Count the CPU the calls inside take in this (the batch) thread as the engine's."""
        t0 = time.thread_time()
        try:
            yield
        finally:
            self.engine_cpu_s += time.thread_time() - t0

    async def _loop(self) -> None:
        while True:
            if not self.queue:
                if self._ended or self._ended_sessions:
                    await self._tidy()
                    continue
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._dispatch()

    async def _tidy(self) -> None:
        """With no batch to run, free what ended sessions still hold in the engine (a resident
        session's request and blocks, a re-submitted session's cached blocks) now rather than
        before the next batch, which may be long in coming."""
        ended, self._ended = self._ended, []
        gone, self._ended_sessions = self._ended_sessions, []

        def work() -> None:
            with self._engine_lock, self._engine_time():
                if ended and self.release is not None:
                    self.release(ended)
                if gone and self.resident is not None:
                    self.resident.end(gone)

        self.running = True
        try:
            await asyncio.to_thread(work)
        except Exception:  # the engine failed freeing: counted; the next batch will tell
            self.counts["engine_errors"] += 1
        finally:
            self.running = False

    def close(self) -> None:
        """After :meth:`stop`: end every session still held in the engine (leave it clean), once
        a batch still in its thread has ended (it stops at its next engine step)."""
        if self.resident is not None and self._engine_lock.acquire(timeout=60):
            try:
                self.resident.clear()
            finally:
                self._engine_lock.release()

    def _token_of(self, sid: int) -> Session | None:
        token = self.by_sid.get(sid)
        return None if token is None else self.sessions.get(token)

    async def _dispatch(self) -> None:
        memory = self.memory
        now = self.clock()
        self.queue = [r for r in self.queue if not r.done.done()]  # closed sessions' are answered
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
        tokens = {r.session: self._token_of(r.session) for r in batch}
        seqs = [tokens[r.session].tokens + r.draft for r in batch]  # type: ignore[union-attr]
        ended, self._ended = self._ended, []
        t0 = self.clock()
        self.running, self.batch_started = True, t0
        try:
            if self.resident is None:
                bonus, cached = await asyncio.to_thread(self._run, seqs, ended)
            else:  # what the engine held of each sequence is its "cached" part
                items = [(r.session, tokens[r.session].tokens, r.draft) for r in batch]  # type: ignore[union-attr]
                gone, self._ended_sessions = self._ended_sessions, []
                bonus, cached = await asyncio.to_thread(self._run_resident, items, gone)
        except EngineStopped:
            self._fail(batch, ServeError(503, "the server is shutting down", RETRY_S))
            return
        except EngineStalled as e:
            self.counts["engine_stalls"] += 1
            self._fail(batch, self._refuse("engine", f"engine: {e}; the round was not run, retry"))
            return
        except Exception as e:  # an engine failure answers the batch; the loop goes on
            self.counts["engine_errors"] += 1
            self._fail(batch, ServeError(500, f"engine: {type(e).__name__}: {e}"))
            return
        finally:
            self.running = False
        t1 = self.clock()
        real = [(len(q) - c, c) for q, c in zip(seqs, cached, strict=True)] if cached else plan
        served = Shape.of(real)  # what the engine served (vLLM caches whole blocks)
        for r, (l_new, l_cached), b in zip(batch, real, bonus, strict=True):
            s = self._token_of(r.session)
            if b is None:  # the engine could not fit this round: nothing of it was kept
                self.counts["rounds_unserved"] += 1
                memory.drop(r.session)
                if not r.done.done():
                    r.done.set_exception(
                        self._refuse("engine", "engine: no KV room for this round now; it was not run, retry")
                    )
                continue
            if s is not None:
                s.tokens.extend(([*r.draft[: r.accepted], b])[: r.commit])
                s.rounds += 1
                evicted += memory.finish_round(r.session, len(s.tokens))
                if self.admission is not None:
                    self.admission.grow(r.session, len(s.tokens))
            self.counts["rounds"] += 1
            self.log.members.append(member_row(bid, r, l_new, l_cached))
            if not r.done.done():
                r.done.set_result(reply(r, b, bid, len(batch), (t0, t1), (l_new, l_cached)))
        self.log.batches.append(
            batch_row(
                bid, (now, t0, t1), len(batch), queue_len, served, plan_shape, t_hat, blocks_used, evicted
            )
        )

    def _fail(self, batch: list[Round], error: ServeError) -> None:
        """Answer every round of a batch the engine did not run with ``error``; their sessions
        stay as they were (the cache model forgets their prefixes: the engine may have too)."""
        for r in batch:
            self.memory.drop(r.session)
            if not r.done.done():
                r.done.set_exception(error)

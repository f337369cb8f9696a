"""What the verification server's protocol is made of: a refused request (:class:`ServeError`),
a queued round (:class:`Round`), a session (:class:`Session`), and what is said of a served
round -- its reply (:func:`reply`) and its rows in the batch log (:func:`member_row`,
:func:`batch_row`). The dispatch loop that fills them is :mod:`wispsim.serve.verify`.

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
from dataclasses import dataclass
from typing import Any

from wispsim.errors import WispsimError
from wispsim.model.batch import Shape

RETRY_S = 1.0  # what a 503 asks a client to wait before it tries again (Retry-After)


class ServeError(WispsimError):
    """A bad request: the HTTP layer answers it with its status and this one-line message
    (and, for 429/503, a ``Retry-After`` of ``retry_after`` seconds)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[type[ServeError], tuple[int, str, float | None]]:
        return type(self), (self.status, str(self), self.retry_after)


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
    sid: int  # the server's own number for it (logs, admission, the cache model)
    tokens: list[int]
    last: float  # when it last opened or finished a round (idle expiry)
    rounds: int = 0
    busy: bool = False


def reply(
    r: Round, bonus: int, batch: int, size: int, times: tuple[float, float], served: tuple[int, int]
) -> dict[str, Any]:
    """A served round's reply: its verdict and what the server did (``times``: dispatch and end
    of its batch; ``served``: L_new and L_cached as the engine served them)."""
    t0, t1 = times
    return {
        "accepted": r.accepted,
        "committed": r.commit,
        "bonus_token": bonus,
        "t_arrival": r.arrival,
        "t_dispatch": t0,
        "t_done": t1,
        "queue_s": t0 - r.arrival,
        "verify_s": t1 - t0,
        "batch": batch,
        "batch_size": size,
        "l_new": served[0],
        "l_cached": served[1],
        "l_new_plan": r.l_new,
        "l_cached_plan": r.l_cached,
    }


def member_row(batch: int, r: Round, l_new: int, l_cached: int) -> dict[str, Any]:
    """A served round's row in the batch log (as served, and as the scheduler planned it)."""
    return {
        "batch": batch,
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


def batch_row(
    batch: int, times: tuple[float, float, float], size: int, queue_len: int, served: Shape, plan: Shape,
    t_hat: float, blocks_used: int, evictions: int,
) -> dict[str, Any]:  # fmt: skip
    """A batch's row in the batch log (``times``: when it was scheduled, dispatched and ended)."""
    now, t0, t1 = times
    return {
        "batch": batch,
        "replica": 0,
        "kind": "verify",
        "t_dispatch": t0,
        "t_end": t1,
        "size": size,
        "queue_len": queue_len,
        "n_linear": served.n_linear,
        "n_interactions": served.n_interactions,
        "n_cached": served.n_cached,
        "t_hat": t_hat,
        "latency": t1 - t0,
        "blocks_used": blocks_used,
        "evictions": evictions,
        "n_linear_plan": plan.n_linear,
        "n_cached_plan": plan.n_cached,
        "t_schedule": t0 - now,
    }


def server_load(self: Any) -> dict[str, Any]:
    """A verification server's (:class:`wispsim.serve.verify.VerifyServer`, ``self``) state now:
    sessions, rounds queued and waiting for admission, what admission holds, the batch on the
    engine, the engine's CPU in the batch thread, and the counters."""
    adm = self.admission
    return {
        "sessions": len(self.sessions),
        "rounds_queued": len(self.queue),
        "batch_running_s": self.clock() - self.batch_started if self.running else 0.0,
        "admission_waiting": len(adm.waiting) if adm is not None else 0,
        "admission_sessions": len(adm.reserved) if adm is not None else 0,
        "admission_reserved_blocks": adm.used if adm is not None else 0,
        "admission_limit_blocks": adm.limit if adm is not None else 0,
        "resident_sessions": len(getattr(self.resident, "sessions", ())),
        "resident_evictions": getattr(self.resident, "evictions", 0),
        "log_rows": len(self.log.batches) + len(self.log.members),
        "engine_cpu_s": self.engine_cpu_s,  # the rest of the process's CPU: API and loop
        "log_dropped": self.log.batches.dropped + self.log.members.dropped,
        **{f"{k}_total": v for k, v in sorted(self.counts.items())},
    }

"""What a verification scheduler sees and returns.

A scheduler is a pure function of (queue, now, GPU state) -> batch: no SimPy, no clock, no
randomness, so it is testable with plain lists. The queue is in arrival order. Each queued request
exposes the fields of :class:`PendingLike`; its ``l_new`` / ``l_cached`` are computed by the server
at the dispatch epoch from the prefix cache's state at that moment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from wispsim.model.estimator import Cost
from wispsim.registry import Registry


class PendingLike(Protocol):
    rid: int
    arrival: float
    deadline: float
    n_hat: float
    l_new: int
    l_cached: int


P = TypeVar("P", bound=PendingLike)


@dataclass(slots=True)
class Pending:
    """A plain queued request, for tests and for callers outside the simulator."""

    rid: int
    arrival: float
    deadline: float = math.inf
    n_hat: float = 1.0
    l_new: int = 1
    l_cached: int = 0


@dataclass(frozen=True, slots=True)
class GpuState:
    """The GPU replica as the scheduler sees it at a dispatch epoch.

    Memory: a batch fits when the KV blocks of all its requests' L_total fit in ``total_blocks``;
    everything else held in memory is idle prefix cache that the server may evict (LRU).
    """

    estimator: Cost
    total_blocks: int
    block_size: int = 16
    max_requests: int = 256
    max_new_tokens: int = 16384
    delta: float = 0.005

    def blocks(self, r: PendingLike) -> int:
        return -(-(r.l_new + r.l_cached) // self.block_size)


class Scheduler(Protocol):
    def select(self, queue: Sequence[P], now: float, gpu: GpuState) -> list[P]:
        """The batch to dispatch now: distinct members of ``queue``, non-empty if ``queue`` is."""
        ...


SCHEDULERS: Registry[type] = Registry("scheduler")


class BatchBuilder:
    """Tracks a growing batch's memory and size limits."""

    __slots__ = ("blocks", "gpu", "members", "new_tokens")

    def __init__(self, gpu: GpuState) -> None:
        self.gpu = gpu
        self.members: list[PendingLike] = []
        self.blocks = 0
        self.new_tokens = 0

    def fits(self, r: PendingLike) -> bool:
        g = self.gpu
        return (
            len(self.members) < g.max_requests
            and self.new_tokens + r.l_new <= g.max_new_tokens
            and self.blocks + g.blocks(r) <= g.total_blocks
        )

    def add(self, r: PendingLike) -> None:
        self.members.append(r)
        self.blocks += self.gpu.blocks(r)
        self.new_tokens += r.l_new

"""What a verification scheduler sees and returns.

A scheduler is a pure function of (queue, now, GPU state) -> batch: no SimPy, no clock, no
randomness, so it is testable with plain lists. The queue is in arrival order. Each queued request
exposes the fields of :class:`PendingLike`; its ``l_new`` / ``l_cached`` are computed by the server
at the dispatch epoch from the prefix cache's state at that moment.

It returns a :class:`~wispsim.model.batch.Batch`: the members, their shape, and ``estimate``, the
T_hat it planned with, priced by ``gpu.estimator`` (any cost form: :mod:`wispsim.model.cost`).
A scheduler never prices a batch another way, and the server never prices it again to plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from wispsim.model.batch import Batch, Limits
from wispsim.model.cost import CostModel
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
    """The GPU replica as the scheduler sees it at a dispatch epoch: the cost model it plans with
    and a batch's limits.

    Memory: a batch fits when the KV blocks of all its requests' L_total fit in ``total_blocks``;
    everything else held in memory is idle prefix cache that the server may evict (LRU).
    """

    estimator: CostModel
    total_blocks: int
    block_size: int = 16
    max_requests: int = 256
    max_new_tokens: int = 16384
    delta: float = 0.005
    # the engine's attention backend's (the cost that prices the batch, which the estimator may
    # not be): members with more new tokens are its prefills (wispsim.model.batch.Shape)
    prefill_above: int = 1
    limits: Limits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        limits = Limits(
            self.total_blocks, self.block_size, self.max_requests, self.max_new_tokens, self.prefill_above
        )
        object.__setattr__(self, "limits", limits)

    def batch(self) -> Batch[P]:
        """An empty batch under this replica's limits."""
        return Batch(self.limits)


class Scheduler(Protocol):
    def select(self, queue: Sequence[P], now: float, gpu: GpuState) -> Batch[P]:
        """The batch to dispatch now, with its estimate: distinct members of ``queue``, non-empty
        if ``queue`` is."""
        ...


SCHEDULERS: Registry[type] = Registry("scheduler")

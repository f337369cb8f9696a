"""First come, first served (SPEC 3.2): the oldest requests while memory and limits allow."""

from __future__ import annotations

from collections.abc import Sequence

from wispsim.model.schedulers.base import SCHEDULERS, BatchBuilder, GpuState, P


@SCHEDULERS.register("fcfs")
class FCFSScheduler:
    """Take requests in arrival order; stop at the first that does not fit (never reorders)."""

    def select(self, queue: Sequence[P], now: float, gpu: GpuState) -> list[P]:
        b = BatchBuilder(gpu)
        for r in queue:
            if not b.fits(r):
                break
            b.add(r)
        if not b.members and queue:
            return [queue[0]]
        return b.members  # type: ignore[return-value]

"""First come, first served (SPEC 3.2): the oldest requests while memory and limits allow."""

from __future__ import annotations

from collections.abc import Sequence

from wispsim.model.batch import Batch
from wispsim.model.schedulers.base import SCHEDULERS, GpuState, P


@SCHEDULERS.register("fcfs")
class FCFSScheduler:
    """Take requests in arrival order; stop at the first that does not fit (never reorders).
    Deadline-blind: the batch is priced once, when it is formed."""

    def select(self, queue: Sequence[P], now: float, gpu: GpuState) -> Batch[P]:
        b: Batch[P] = gpu.batch()
        if not queue:
            return b
        for r in queue:
            if not b.fits(r):
                break
            b.add(r)
        if not b.members:
            b.add(queue[0])  # never empty: the oldest alone, even if it breaks a limit
        b.estimate = gpu.estimator.price(b.shape)
        return b

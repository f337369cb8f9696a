"""Verification schedulers, chosen by name (``server.scheduler``): ``fcfs`` and ``wisp``.

``continuous`` (centralized serving's continuous batching) is not a verification scheduler; it is
the centralized server's own step loop (:mod:`wispsim.sim.centralized`).
"""

from wispsim.model.schedulers import fcfs, wisp  # noqa: F401  (registers the schedulers)
from wispsim.model.schedulers.base import SCHEDULERS, GpuState, Pending, PendingLike, Scheduler

__all__ = ["SCHEDULERS", "GpuState", "Pending", "PendingLike", "Scheduler"]

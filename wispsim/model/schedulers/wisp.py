"""WISP's SLO-aware batch scheduler (SPEC 3.1).

At a dispatch epoch t each pending request i has value g_i = N_hat_i (expected committed tokens),
marginal cost v_i (``cost.marginal``: a*L_new + b_compute*L_new*L_total + b_read*L_cached + d in
the linear forms; with the physical ``roofline`` form what the request adds to a large batch),
utility U_i = g_i / v_i and latest start time LST_i = d_i - T_hat({i}) - delta, where T_hat({i})
is the request alone (``cost.alone``: v_i + c in the linear forms). Requests with t >= LST_i are
critical. FeasibleAdd prices B + {i} as a whole with the one cost interface
(``cost.price_with``, :mod:`wispsim.model.cost`), whatever the form: the batch's estimate is
the price of its last feasible growth, so it is never priced another way.

The batch grows in three phases; each phase stops at its first request that fails FeasibleAdd:

1. critical requests, earliest deadline first. If one fails, phase 3 is skipped (no non-critical
   fill: the batch must stay short for the urgent ones);
2. late requests -- those that cannot meet their deadline even alone, t + v_i + c > d_i -- oldest
   first. Their own deadline is left out of the check (it is lost anyway), so they ride along
   only while every other member stays feasible;
3. non-critical requests by decreasing utility.

FeasibleAdd(B, i): memory and batch limits hold for B + {i}, and
t + T_hat(B + {i}) <= min over non-late j in B + {i} of d_j.
A batch is never empty while the queue is not: if nothing could be added, the single most urgent
request (earliest deadline, then oldest) is dispatched alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from wispsim.model.batch import Batch
from wispsim.model.schedulers.base import SCHEDULERS, GpuState, P

MEMO_LIMIT = 1 << 16  # (L_new, L_cached) pairs remembered per scheduler before it starts over


@SCHEDULERS.register("wisp")
class WispScheduler:
    """The scheduler of the module text. It remembers each (L_new, L_cached)'s costs under the
    cost model it last planned with: a cache, not state (the same queue gives the same batch),
    because every queued round is priced at every dispatch epoch and rounds repeat their shapes."""

    def __init__(self) -> None:
        self._cost: object = None
        self._memo: dict[int, tuple[float, float]] = {}

    def select(self, queue: Sequence[P], now: float, gpu: GpuState) -> Batch[P]:
        batch: Batch[P] = gpu.batch()
        if not queue:
            return batch
        cost = gpu.estimator
        if cost is not self._cost or len(self._memo) > MEMO_LIMIT:
            self._cost, self._memo = cost, {}
        memo = self._memo
        request_costs = cost.request_costs
        delta = gpu.delta
        critical: list[tuple[float, float, int, float]] = []
        late: list[tuple[float, float, int, float]] = []  # (arrival, 0, index, v): oldest first
        other: list[tuple[float, float, int, float]] = []
        for idx, r in enumerate(queue):
            l_new, l_cached = r.l_new, r.l_cached
            key = l_new << 32 | l_cached
            costs = memo.get(key)
            if costs is None:
                costs = memo[key] = request_costs(l_new, l_cached)
            v, single = costs
            if now + single > r.deadline:
                late.append((r.arrival, 0, idx, v))
            elif now >= r.deadline - single - delta:
                critical.append((r.deadline, r.arrival, idx, v))
            else:
                utility = r.n_hat / v if v > 0 else math.inf
                other.append((-utility, r.arrival, idx, v))

        # the three phases in order, each stopping at its first request that fails FeasibleAdd;
        # dmin: the earliest deadline of the batch's non-late members
        price_with = cost.price_with
        shape = batch.shape
        total = 0.0
        dmin = math.inf
        critical_failed = False
        phases: tuple[list[tuple[float, float, int, float]], ...] = (critical, late, other)
        for phase, candidates in enumerate(phases):
            if phase == 2 and critical_failed:
                break  # a critical request did not fit: no non-critical fill
            is_late = phase == 1
            for _, _, idx, _ in sorted(candidates):
                r = queue[idx]
                need = batch.need(r)
                if not batch.fits(r, need):
                    break
                d = dmin if is_late or r.deadline >= dmin else r.deadline
                t_next = price_with(shape, r.l_new, r.l_cached)
                if now + t_next > d:
                    break
                batch.add(r, need)
                total = t_next
                dmin = d
            else:
                continue
            critical_failed = critical_failed or phase == 0
        if not batch.members:
            # never empty: the most urgent request alone (earliest deadline, then oldest)
            urgent = min((q.deadline, q.arrival, i) for i, q in enumerate(queue))[2]
            batch.add(queue[urgent])
            total = cost.price(shape)
        batch.estimate = total
        return batch

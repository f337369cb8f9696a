"""WISP's SLO-aware batch scheduler (SPEC 3.1).

At a dispatch epoch t each pending request i has value g_i = N_hat_i (expected committed tokens),
marginal cost v_i = a*L_new + b_compute*L_new*L_total + b_read*L_cached, utility U_i = g_i / v_i
and latest start time LST_i = d_i - (v_i + c) - delta. Requests with t >= LST_i are critical.
With the physical ``roofline`` form, v_i is what the request adds to a large batch
(:meth:`~wispsim.model.roofline.Roofline.marginal`), v_i + c becomes T_hat of the request alone,
and FeasibleAdd prices B + {i} as a whole from its aggregates (the weights are read once).

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

from wispsim.model.schedulers.base import SCHEDULERS, GpuState, P


@SCHEDULERS.register("wisp")
class WispScheduler:
    def select(self, queue: Sequence[P], now: float, gpu: GpuState) -> list[P]:
        if not queue:
            return []
        est = gpu.estimator
        additive = est.additive
        if additive:  # the linear forms: T_hat = c + sum of v_i (the fast path, inlined)
            a, b_c, b_r, c = est.a, est.b_compute, est.b_read, est.c
        else:  # the roofline: T_hat from the batch's aggregates (weights once per pass)
            price, batch_cost = est.price, est.batch
            c = 0.0
        delta = gpu.delta
        critical: list[tuple[float, float, int, float]] = []
        late: list[tuple[float, int, int, float]] = []  # (arrival, 0, index, v): oldest first
        other: list[tuple[float, float, int, float]] = []
        for idx, r in enumerate(queue):
            l_new, l_cached = r.l_new, r.l_cached
            if additive:
                v = l_new * (a + b_c * (l_new + l_cached)) + b_r * l_cached  # est.marginal, inlined
                single = v + c
            else:
                v, single = price(l_new, l_cached)
            if now + single > r.deadline:
                late.append((r.arrival, 0, idx, v))
            elif now >= r.deadline - single - delta:
                critical.append((r.deadline, r.arrival, idx, v))
            else:
                utility = r.n_hat / v if v > 0 else math.inf
                other.append((-utility, r.arrival, idx, v))

        # the growing batch: members, T_hat so far, earliest non-late deadline, memory, limits
        # (and its aggregates, for a form that prices the batch as a whole)
        members: list[P] = []
        total = c
        n_lin = n_int = n_cac = 0
        dmin = math.inf
        blocks = new_tokens = 0
        bs, max_blocks = gpu.block_size, gpu.total_blocks
        max_req, max_new = gpu.max_requests, gpu.max_new_tokens

        # the three phases in order, each stopping at its first request that fails FeasibleAdd
        # (inlined: this runs once per queued request and dispatch epoch)
        critical_failed = False
        for phase, candidates in enumerate((critical, late, other)):
            if phase == 2 and critical_failed:
                break  # a critical request did not fit: no non-critical fill
            is_late = phase == 1
            for _, _, idx, v in sorted(candidates):
                r = queue[idx]
                l_new = r.l_new
                nb = -(-(l_new + r.l_cached) // bs)
                if len(members) >= max_req or new_tokens + l_new > max_new or blocks + nb > max_blocks:
                    break
                d = dmin if is_late or r.deadline >= dmin else r.deadline
                if additive:
                    t_next = total + v
                else:
                    l_cached = r.l_cached
                    n = len(members) + 1
                    t_next = batch_cost(
                        n_lin + l_new, n_int + (l_new + l_cached) * l_new, n_cac + l_cached, n, n
                    )
                if now + t_next > d:
                    break
                members.append(r)
                total = t_next
                if not additive:
                    n_lin += l_new
                    n_int += (l_new + l_cached) * l_new
                    n_cac += l_cached
                dmin = d
                blocks += nb
                new_tokens += l_new
            else:
                continue
            critical_failed = critical_failed or phase == 0
        if not members:
            urgent = min(range(len(queue)), key=lambda i: (queue[i].deadline, queue[i].arrival, i))
            return [queue[urgent]]
        return members

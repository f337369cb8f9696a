"""Verification schedulers as pure functions: ``select(queue, now, gpu) -> batch`` (SPEC 3.1, 3.2).

Hand-made cases use a toy estimator with a = 1 ms per new token and nothing else but the batch
constant c = 10 ms, so a request with L_new = n costs v = n ms and a batch costs 10 ms + sum v.
With delta = 5 ms a request is, at now = 0:
  late      if v + c > d                      (cannot make it even alone),
  critical  if not late and 0 >= d - (v + c) - delta, i.e. d <= v + 15 ms,
  otherwise non-critical, with utility n_hat / v.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings

from tests.support import scheduler_cases
from wispsim.errors import ConfigError
from wispsim.model.estimator import Estimator
from wispsim.model.schedulers import SCHEDULERS, GpuState, Pending
from wispsim.model.schedulers.fcfs import FCFSScheduler
from wispsim.model.schedulers.wisp import WispScheduler

TOY = Estimator(a=1e-3, b_compute=0.0, b_read=0.0, c=0.01)
PUBLISHED = Estimator(a=3.314e-5, b_compute=3.450e-8, b_read=4.620e-6, c=1.486e-2)


def gpu(**kw: float) -> GpuState:
    args = {"estimator": TOY, "total_blocks": 1000, "block_size": 16, "delta": 0.005, **kw}
    return GpuState(**args)  # type: ignore[arg-type]


def rids(batch: list[Pending]) -> list[int]:
    return [r.rid for r in batch]


wisp = WispScheduler()
fcfs = FCFSScheduler()


def test_registry_names_and_unknown_scheduler_lists_known_names() -> None:
    assert {"fcfs", "wisp"} <= set(SCHEDULERS.names())
    with pytest.raises(ConfigError, match=r"fcfs.*wisp"):
        SCHEDULERS.get("round-robin", field="server.scheduler")


@pytest.mark.parametrize("sched", [wisp, fcfs], ids=["wisp", "fcfs"])
def test_empty_queue_gives_empty_batch(sched: WispScheduler | FCFSScheduler) -> None:
    assert sched.select([], 0.0, gpu()).members == []


def members(result: Any) -> list[Pending]:
    """A scheduler's batch as a list (a Batch since issue 34; this test also runs on the tree
    before it, where it fails)."""
    return list(getattr(result, "members", result))


# ---------------------------------------------------------------------------------------------
# WISP with a per-request cost (issue 34: an inlined pricing path left d out)
# ---------------------------------------------------------------------------------------------


def test_wisp_counts_the_per_request_cost_when_it_checks_deadlines() -> None:
    """d = 5 ms, c = 15 ms, ten rounds of 15 new tokens (0.15 ms each) due at 50 ms: all ten take
    15 + 10 x 5.15 = 66.5 ms, so admitting all of them makes every one miss. WISP may take at most
    six (15 + 6 x 5.15 = 45.9 ms), and its estimate says what the batch costs."""
    est = Estimator(a=1e-5, b_compute=0.0, b_read=0.0, c=0.015, d=0.005, form="per-request")
    queue = [Pending(i, arrival=0.0, deadline=0.05, n_hat=3.0, l_new=15, l_cached=0) for i in range(10)]
    assert est.of([(15, 0)] * 10) == pytest.approx(0.0665)
    result = WispScheduler().select(queue, 0.0, GpuState(estimator=est, total_blocks=1000))
    batch = members(result)
    assert est.of((r.l_new, r.l_cached) for r in batch) <= 0.05
    assert len(batch) == 6
    assert result.estimate == pytest.approx(0.015 + 6 * 0.00515)


# ---------------------------------------------------------------------------------------------
# WISP: critical path
# ---------------------------------------------------------------------------------------------


def test_critical_requests_go_earliest_deadline_first() -> None:
    # Three critical requests (v = 1 ms each, so critical iff 11 ms <= d <= 16 ms), queued in
    # reverse deadline order. With room for two, the two earliest deadlines win, in EDF order:
    # T(B) = 10 + 1 + 1 = 12 ms <= min d = 13.2 ms.
    q = [
        Pending(0, arrival=-0.03, deadline=0.0155),
        Pending(1, arrival=-0.02, deadline=0.0140),
        Pending(2, arrival=-0.01, deadline=0.0132),
    ]
    assert rids(wisp.select(q, 0.0, gpu(max_requests=2)).members) == [2, 1]
    # with room for all three: T = 13 ms <= 13.2 ms still holds, EDF order kept
    assert rids(wisp.select(q, 0.0, gpu()).members) == [2, 1, 0]


def test_critical_failure_stops_the_batch_no_noncritical_fill() -> None:
    # X: critical, d = 12.5 ms (v+c = 11 ms <= d, and 12.5 - 11 - 5 < 0).
    # Y: critical, d = 13 ms, but L_total = 1001 tokens = 63 blocks > 10 blocks: cannot be added.
    # Z: non-critical (d = 1 s), 1 block; X + Z would take 12 ms <= 12.5 ms and fit.
    x = Pending(0, arrival=-0.3, deadline=0.0125)
    y = Pending(1, arrival=-0.2, deadline=0.013, l_new=1, l_cached=1000)
    z = Pending(2, arrival=-0.1, deadline=1.0)
    g = gpu(total_blocks=10)
    # EDF: X added, Y fails FeasibleAdd -> stop growing: Z must not ride along.
    assert rids(wisp.select([x, y, z], 0.0, g).members) == [0]
    # Control: without the failing critical request Z is added, so it was Y's failure that
    # stopped the fill.
    assert rids(wisp.select([x, z], 0.0, g).members) == [0, 2]


def test_critical_failure_on_deadline_also_stops_the_batch() -> None:
    # A: critical, v = 1 ms, d = 12.5 ms. B: critical, v = 3 ms, d = 14 ms (13 <= 14 <= 18).
    # EDF: A -> T = 11 ms. B -> T = 14 ms > min(12.5, 14): fails, stop.
    # Z (non-critical, v = 1 ms) would fit: A + Z = 12 ms <= 12.5 (see the control).
    a = Pending(0, arrival=-0.2, deadline=0.0125)
    b = Pending(1, arrival=-0.3, deadline=0.014, l_new=3)
    z = Pending(2, arrival=-0.4, deadline=5.0, n_hat=100.0)
    assert rids(wisp.select([z, b, a], 0.0, gpu()).members) == [0]
    assert rids(wisp.select([z, a], 0.0, gpu()).members) == [0, 2]


def test_late_requests_join_after_critical_oldest_first_without_constraining() -> None:
    # L1, L2: late (d < now + v + c = 11 ms); L2 is older. X: critical (d = 12.5 ms). Z: not.
    # Phase 1: X -> T = 11 ms <= 12.5.
    # Phase 2, oldest first: L2 -> T = 12 ms <= min over non-late = 12.5 (L2's own 2 ms is
    #   ignored, else it could never join); L1 -> T = 13 ms > 12.5 -> stop.
    # Phase 3: Z -> 13 ms > 12.5 -> stop.
    l1 = Pending(0, arrival=-0.5, deadline=0.005)
    l2 = Pending(1, arrival=-0.9, deadline=0.002)
    x = Pending(2, arrival=-0.1, deadline=0.0125)
    z = Pending(3, arrival=-0.05, deadline=1.0)
    assert rids(wisp.select([l1, l2, x, z], 0.0, gpu()).members) == [2, 1]


def test_late_request_deadline_does_not_constrain_noncritical() -> None:
    # No critical request: the late L joins (no deadline to respect yet), then Z joins although
    # now + T = 12 ms is far past L's deadline of 5 ms.
    late = Pending(0, arrival=-0.5, deadline=0.005)
    z = Pending(1, arrival=-0.1, deadline=1.0)
    assert rids(wisp.select([late, z], 0.0, gpu()).members) == [0, 1]


def test_noncritical_by_decreasing_utility() -> None:
    # U = n_hat / v: N1 = 2 / 4 ms = 500, N2 = 3 / 2 ms = 1500, N3 = 1 / 1 ms = 1000 (per s).
    n1 = Pending(0, arrival=-0.3, deadline=1.0, n_hat=2.0, l_new=4)
    n2 = Pending(1, arrival=-0.2, deadline=1.0, n_hat=3.0, l_new=2)
    n3 = Pending(2, arrival=-0.1, deadline=1.0, n_hat=1.0, l_new=1)
    assert rids(wisp.select([n1, n2, n3], 0.0, gpu()).members) == [1, 2, 0]
    assert rids(wisp.select([n1, n2, n3], 0.0, gpu(max_requests=2)).members) == [1, 2]


def test_noncritical_fill_stops_at_first_failure() -> None:
    # Highest utility first: BIG (U = 50 / 2 ms) needs 63 blocks > 10 -> the fill stops there,
    # even though SMALL (U = 1 / 1 ms) would fit. Nothing was added, so the never-empty rule
    # dispatches the most urgent request alone: SMALL (d = 0.5 s < BIG's 1 s).
    big = Pending(0, arrival=-0.2, deadline=1.0, n_hat=50.0, l_new=2, l_cached=999)
    small = Pending(1, arrival=-0.1, deadline=0.5, n_hat=1.0, l_new=1)
    assert rids(wisp.select([big, small], 0.0, gpu(total_blocks=10)).members) == [1]


def test_batch_respects_deadline_of_every_member() -> None:
    # Non-critical requests (d = 40.5 ms > v + c + delta = 25 ms) with v = 10 ms each and equal
    # utility (taken oldest first): 10 + 10k ms <= 40.5 -> k = 3 fit.
    q = [Pending(i, arrival=-0.1 + i * 1e-3, deadline=0.0405, l_new=10) for i in range(5)]
    batch = wisp.select(q, 0.0, gpu()).members
    assert rids(batch) == [0, 1, 2]
    assert TOY.of((r.l_new, r.l_cached) for r in batch) <= 0.0405


def test_never_empty_picks_earliest_deadline_then_oldest() -> None:
    # Every request alone needs 2 blocks of a 1-block GPU, so nothing can be added.
    # Earliest deadline is 0.3 (rids 1 and 2); of those rid 2 is older.
    q = [
        Pending(0, arrival=0.0, deadline=0.5, l_new=20),
        Pending(1, arrival=0.02, deadline=0.3, l_new=20),
        Pending(2, arrival=0.01, deadline=0.3, l_new=20),
    ]
    assert rids(wisp.select(q, 0.05, gpu(total_blocks=1)).members) == [2]


def test_memory_limit_counts_blocks_of_l_total() -> None:
    # Each request: L_total = 5 + 15 = 20 tokens = 2 blocks of 16. 5 blocks hold two of them.
    q = [Pending(i, arrival=i * 0.001, deadline=10.0, l_new=5, l_cached=15) for i in range(4)]
    assert len(wisp.select(q, 0.0, gpu(total_blocks=5)).members) == 2
    assert rids(fcfs.select(q, 0.0, gpu(total_blocks=5)).members) == [0, 1]
    # 6 blocks hold three
    assert rids(fcfs.select(q, 0.0, gpu(total_blocks=6)).members) == [0, 1, 2]


@pytest.mark.parametrize("sched", [wisp, fcfs], ids=["wisp", "fcfs"])
def test_max_new_tokens_limit(sched: WispScheduler | FCFSScheduler) -> None:
    # L_new = 3 each; at most 7 new tokens per batch -> two requests (6 tokens).
    q = [Pending(i, arrival=i * 0.001, deadline=10.0, l_new=3) for i in range(4)]
    batch = sched.select(q, 0.0, gpu(max_new_tokens=7)).members
    assert len(batch) == 2
    assert sum(r.l_new for r in batch) == 6


# ---------------------------------------------------------------------------------------------
# FCFS
# ---------------------------------------------------------------------------------------------


def test_fcfs_takes_oldest_and_never_skips() -> None:
    # The second request does not fit (63 blocks); FCFS stops there instead of taking the third.
    q = [
        Pending(0, arrival=0.0, l_new=10),
        Pending(1, arrival=0.1, l_new=10, l_cached=990),
        Pending(2, arrival=0.2, l_new=10),
    ]
    assert rids(fcfs.select(q, 1.0, gpu(total_blocks=10)).members) == [0]


def test_fcfs_fallback_is_queue_head() -> None:
    q = [Pending(0, arrival=0.0, l_new=100), Pending(1, arrival=0.1, l_new=1)]
    assert rids(fcfs.select(q, 1.0, gpu(total_blocks=2)).members) == [0]


def test_fcfs_ignores_deadlines() -> None:
    q = [Pending(0, arrival=0.0, deadline=9.0), Pending(1, arrival=0.1, deadline=0.0)]
    assert rids(fcfs.select(q, 0.0, gpu(max_requests=1)).members) == [0]


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------


CASES = scheduler_cases([PUBLISHED])


def fits(batch: list[Pending], g: GpuState) -> bool:
    blocks = sum(math.ceil((r.l_new + r.l_cached) / g.block_size) for r in batch)
    return (
        blocks <= g.total_blocks
        and len(batch) <= g.max_requests
        and sum(r.l_new for r in batch) <= g.max_new_tokens
    )


def check_common(batch: list[Pending], q: list[Pending], g: GpuState) -> None:
    assert bool(batch) == bool(q)  # never empty while the queue is not
    ids = [id(r) for r in batch]
    assert len(set(ids)) == len(ids)
    assert set(ids) <= {id(r) for r in q}
    if not fits(batch, g):
        # only the single never-empty fallback may break the limits, and only when it breaks
        # them on its own
        assert len(batch) == 1
        assert not fits(batch, g)


@settings(max_examples=300, deadline=None)
@given(CASES)
def test_fcfs_batch_fits_and_is_a_prefix(case: tuple[list[Pending], float, GpuState]) -> None:
    q, now, g = case
    batch = fcfs.select(q, now, g).members
    check_common(batch, q, g)
    assert batch == q[: len(batch)]  # never reorders, never skips
    if len(batch) < len(q) and fits(batch, g):
        assert not fits(q[: len(batch) + 1], g)  # stopped only because the next did not fit


def classify(r: Pending, now: float, g: GpuState) -> str:
    v = g.estimator.marginal(r.l_new, r.l_cached)
    if now + v + g.estimator.c > r.deadline:
        return "late"
    if now >= r.deadline - (v + g.estimator.c) - g.delta:
        return "critical"
    return "other"


@settings(max_examples=300, deadline=None)
@given(CASES)
def test_wisp_batch_fits_meets_deadlines_and_follows_phases(
    case: tuple[list[Pending], float, GpuState],
) -> None:
    q, now, g = case
    batch = wisp.select(q, now, g).members
    check_common(batch, q, g)
    if not batch:
        return
    kinds = {id(r): classify(r, now, g) for r in q}
    most_urgent = min(q, key=lambda r: (r.deadline, r.arrival))
    if len(batch) == 1 and batch[0] is most_urgent:
        return  # possibly the never-empty fallback, which may break any rule
    # anything else is a regular batch: it fits, and FeasibleAdd held for every member
    assert fits(batch, g)
    t_hat = g.estimator.of((r.l_new, r.l_cached) for r in batch)
    on_time = [r.deadline for r in batch if kinds[id(r)] != "late"]
    assert now + t_hat <= min(on_time, default=math.inf) + 1e-12
    # phases in order: critical (EDF), then late (oldest first), then the rest by utility
    order = {"critical": 0, "late": 1, "other": 2}
    phases = [order[kinds[id(r)]] for r in batch]
    assert phases == sorted(phases)
    crit = sorted((r for r in q if kinds[id(r)] == "critical"), key=lambda r: (r.deadline, r.arrival))
    chosen_crit = [r for r in batch if kinds[id(r)] == "critical"]
    assert chosen_crit == crit[: len(chosen_crit)]  # an EDF prefix of the critical requests
    late = sorted((r for r in q if kinds[id(r)] == "late"), key=lambda r: r.arrival)
    chosen_late = [r for r in batch if kinds[id(r)] == "late"]
    assert chosen_late == late[: len(chosen_late)]  # an oldest-first prefix of the late ones
    if len(chosen_crit) < len(crit):
        # a critical request failed: no non-critical fill
        assert all(kinds[id(r)] != "other" for r in batch)
    others = [r for r in batch if kinds[id(r)] == "other"]
    utilities = [r.n_hat / g.estimator.marginal(r.l_new, r.l_cached) for r in others]
    assert utilities == sorted(utilities, reverse=True)

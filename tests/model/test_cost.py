"""One batch value, one cost interface (wispsim.model.batch, wispsim.model.cost).

Every cost form -- the paper's ``additive``, ``per-request``, the physical ``roofline`` and a
``measured`` table -- prices a batch's shape; the price of a batch grown one member at a time
equals the price of the whole batch, and a scheduler returns its batch with the estimate it
planned with, which is that price. WISP never admits a batch its own estimate says misses the
deadline of a member that could make it, with every form (``d`` of the per-request form included:
tests/model/test_schedulers.py has the case where WISP's old inlined pricing path left it out).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import scheduler_cases
from wispsim.model.archs import load_arch, load_gpu
from wispsim.model.batch import Batch, Limits, Shape, blocks
from wispsim.model.cost import CostModel
from wispsim.model.estimator import Estimator
from wispsim.model.measured import MeasuredCost, MeasuredTable
from wispsim.model.physical import physical_profile
from wispsim.model.profiles import parse_profile
from wispsim.model.schedulers import GpuState, Pending
from wispsim.model.schedulers.fcfs import FCFSScheduler
from wispsim.model.schedulers.wisp import WispScheduler

ADDITIVE = Estimator(a=3.314e-5, b_compute=3.450e-8, b_read=4.620e-6, c=1.486e-2)
PER_REQUEST = Estimator(
    a=3.314e-5, b_compute=3.450e-8, b_read=4.620e-6, c=1.486e-2, d=2e-3, form="per-request"
)
ROOFLINE = parse_profile(physical_profile(load_arch("qwen3-32b"), load_gpu("h100-80gb")), "t").estimator


def _measured() -> MeasuredCost:
    rows = []
    for i, (size, l_new, l_cached) in enumerate(
        [(1, 5, 0), (1, 5, 500), (4, 5, 300), (8, 6, 1000), (16, 5, 200), (32, 8, 800), (2, 300, 0)]
    ):
        shape = Shape.of([(l_new, l_cached)] * size)
        rows.append(
            {
                "config_id": str(i),
                "n_linear": shape.n_linear,
                "n_interactions": shape.n_interactions,
                "n_cached": shape.n_cached,
                "batch_size": size,
                "latency_s": 1.1 * ADDITIVE.price(shape),
            }
        )
    return MeasuredCost(ADDITIVE, MeasuredTable(pd.DataFrame(rows)))


MEASURED = _measured()
FORMS: dict[str, CostModel] = {
    "additive": ADDITIVE,
    "per-request": PER_REQUEST,
    "roofline": ROOFLINE,
    "measured": MEASURED,
}


# ---------------------------------------------------------------------------------------------
# the batch value
# ---------------------------------------------------------------------------------------------


def test_shape_sums_and_block_arithmetic() -> None:
    shape = Shape.of([(5, 1000), (100, 0)])
    assert shape.as_tuple() == (105, 15025, 1000, 2, 2, 105)  # verification: logits at every new token
    step = Shape()
    step.add(1, 500, arriving=False)  # a decode
    step.add(64, 0, logits=1)  # a first prefill chunk arrives anew; vLLM's logit row: its last token
    assert step.as_tuple() == (65, 501 + 64 * 64, 500, 2, 1, 2)
    assert [blocks(t, 16) for t in (0, 1, 16, 17)] == [0, 1, 1, 2]


@given(
    st.lists(st.integers(0, 100_000), max_size=50),
    st.integers(1, 8),
    st.booleans(),
)
def test_members_alike_add_up_as_one_at_a_time(cached: list[int], l_new: int, arriving: bool) -> None:
    """An engine step's decodes added at once (``add_alike``) give the sums of adding each."""
    one_by_one, at_once = Shape(3, 7, 11, 1, 1), Shape(3, 7, 11, 1, 1)
    for c in cached:
        one_by_one.add(l_new, c, arriving)
    at_once.add_alike(len(cached), l_new, sum(cached), arriving)
    assert at_once == one_by_one


def test_batch_checks_its_limits_when_a_member_is_added() -> None:
    b: Batch[Pending] = Batch(Limits(total_blocks=3, block_size=16, max_requests=2, max_new_tokens=40))
    first = Pending(0, 0.0, l_new=20, l_cached=12)  # 32 tokens: 2 blocks
    assert b.fits(first)
    b.add(first)
    assert (b.blocks, b.new_tokens, len(b.members)) == (2, 20, 1)
    assert not b.fits(Pending(1, 0.0, l_new=21, l_cached=0))  # 41 new tokens > 40
    assert not b.fits(Pending(2, 0.0, l_new=1, l_cached=16))  # 2 more blocks > 3
    assert b.fits(Pending(3, 0.0, l_new=1, l_cached=15))  # 1 block
    b.add(Pending(3, 0.0, l_new=1, l_cached=15))
    assert not b.fits(Pending(4, 0.0, l_new=1, l_cached=0))  # 2 requests already
    assert b.shape == Shape.of([(20, 12), (1, 15)])


# ---------------------------------------------------------------------------------------------
# properties over every form
# ---------------------------------------------------------------------------------------------

pairs = st.lists(
    st.tuples(st.integers(1, 400), st.sampled_from([0, 1, 17, 50, 300, 1500, 4000])), min_size=1, max_size=40
)


@pytest.mark.parametrize("form", list(FORMS))
@settings(max_examples=150, deadline=None)
@given(batch=pairs)
def test_incremental_price_equals_full_price(form: str, batch: list[tuple[int, int]]) -> None:
    cost = FORMS[form]
    shape = Shape()
    for l_new, l_cached in batch:
        grown = cost.price_with(shape, l_new, l_cached)
        shape.add(l_new, l_cached)
        assert grown == cost.price(shape)  # exactly: the sums are integers
    assert cost.price(shape) == cost.of(batch)
    assert cost.price(Shape.of(batch[:1])) == cost.alone(*batch[0]) or form in ("additive", "per-request")
    v, alone = cost.request_costs(*batch[0])
    assert (v, alone) == (cost.marginal(*batch[0]), cost.alone(*batch[0]))


CASES = scheduler_cases(list(FORMS.values()), queue=14, blocks=300, requests=16, new_tokens=2000)


@settings(max_examples=400, deadline=None)
@given(CASES)
def test_schedulers_return_their_batch_priced_once(case: tuple[list[Pending], float, GpuState]) -> None:
    q, now, g = case
    for sched in (FCFSScheduler(), WispScheduler()):
        b = sched.select(q, now, g)
        if q:
            assert b.estimate == g.estimator.price(b.shape)
        assert b.shape == Shape.of((r.l_new, r.l_cached) for r in b.members)


@settings(max_examples=400, deadline=None)
@given(CASES)
def test_wisp_never_admits_a_batch_its_estimate_says_misses_a_deadline(
    case: tuple[list[Pending], float, GpuState],
) -> None:
    q, now, g = case
    b = WispScheduler().select(q, now, g)
    if not q:
        assert b.members == []
        return
    cost = g.estimator
    most_urgent = min(q, key=lambda r: (r.deadline, r.arrival))
    if b.members == [most_urgent]:
        return  # possibly the never-empty fallback, which may miss
    # a member that could make its deadline alone must make it in the batch, by the estimate
    on_time = [r.deadline for r in b.members if now + cost.alone(r.l_new, r.l_cached) <= r.deadline]
    assert now + b.estimate <= min(on_time, default=math.inf)
    assert math.isfinite(b.estimate)

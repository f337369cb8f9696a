"""What a pass costs: the one interface every cost form implements.

A form prices a batch's :class:`~wispsim.model.batch.Shape` and nothing else: the paper's
``additive`` and the ``per-request`` estimators (:mod:`wispsim.model.estimator`), the physical
``roofline`` (:mod:`wispsim.model.roofline`), a ``measured`` table (:mod:`wispsim.model.measured`),
and whatever comes next. The scheduler asks three more things, all derived from the same
prices: the price of a shape with one more member (FeasibleAdd), what one request adds to a
large batch (its utility's cost ``v_i``) and what it costs alone (its latest start time).

Forms that price a shape from its sums implement :meth:`AggregateCost.batch` and inherit the
rest, so the price of a batch grown one member at a time equals the price of the whole batch,
exactly (the sums are integers; property-tested over every form).
*(Vidur's execution-time predictor prices a ``Batch``; BLIS's ``StepTime(batch)``.)*
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from mypy_extensions import mypyc_attr

from wispsim.model.batch import Shape


class CostModel(Protocol):
    """Prices a pass (seconds of GPU time, ``T_hat``)."""

    form: str

    def batch(self, n_linear: float, n_interactions: float, n_cached: float, n_requests: float = 0,
              n_arrivals: float = 0, n_logits: float | None = None, n_prefill_interactions: float = 0,
              n_prefill_cached: float = 0) -> float:  # fmt: skip
        """``T_hat`` of a pass from its shape's sums (``n_logits`` unsaid: ``n_linear``; the
        prefill sums unsaid: every member decodes)."""
        ...

    @property
    def prefill_above(self) -> int:
        """The most new tokens a member the attention backend runs as a decode has (vLLM's
        ``reorder_batch_threshold``; :class:`~wispsim.model.batch.Shape`)."""
        ...

    def price(self, shape: Shape) -> float:
        """``T_hat`` of a pass of this shape."""
        ...

    def price_with(self, shape: Shape, l_new: int, l_cached: int) -> float:
        """``T_hat`` of ``shape`` with one more member arriving anew (``shape`` is unchanged)."""
        ...

    def marginal(self, l_new: int, l_cached: int) -> float:
        """What one request adds to a large batch (the scheduler's ``v_i``)."""
        ...

    def alone(self, l_new: int, l_cached: int) -> float:
        """``T_hat`` of a batch holding only this request, arriving anew."""
        ...

    def request_costs(self, l_new: int, l_cached: int) -> tuple[float, float]:
        """(:meth:`marginal`, :meth:`alone`) in one call: the scheduler asks both of every queued
        request at every dispatch epoch."""
        ...

    @property
    def fastest(self) -> float:
        """The cheapest pass there is."""
        ...


@mypyc_attr(allow_interpreted_subclasses=True)  # the estimator forms subclass it (wispsim.native)
class AggregateCost:
    """A form that prices a shape from its sums: subclasses implement :meth:`batch` (and
    :meth:`marginal`); pricing a shape, a shape plus one member and a lone request follow."""

    __slots__ = ()

    def batch(self, n_linear: float, n_interactions: float, n_cached: float, n_requests: float = 0,
              n_arrivals: float = 0, n_logits: float | None = None, n_prefill_interactions: float = 0,
              n_prefill_cached: float = 0) -> float:  # fmt: skip
        raise NotImplementedError

    @property
    def prefill_above(self) -> int:
        return 1

    def price(self, shape: Shape) -> float:
        return self.batch(
            shape.n_linear,
            shape.n_interactions,
            shape.n_cached,
            shape.n_requests,
            shape.n_arrivals,
            shape.n_logits,
            shape.n_prefill_interactions,
            shape.n_prefill_cached,
        )

    def price_with(self, shape: Shape, l_new: int, l_cached: int) -> float:
        # a verification round joins: logits at every one of its new tokens
        pairs = (l_new + l_cached) * l_new
        prefill = l_new > shape.prefill_above
        return self.batch(
            shape.n_linear + l_new,
            shape.n_interactions + pairs,
            shape.n_cached + l_cached,
            shape.n_requests + 1,
            shape.n_arrivals + 1,
            shape.n_logits + l_new,
            shape.n_prefill_interactions + (pairs if prefill else 0),
            shape.n_prefill_cached + (l_cached if prefill else 0),
        )

    def alone(self, l_new: int, l_cached: int) -> float:
        pairs = (l_new + l_cached) * l_new
        if l_new > self.prefill_above:
            return self.batch(l_new, pairs, l_cached, 1, 1, None, pairs, l_cached)
        return self.batch(l_new, pairs, l_cached, 1, 1)

    def marginal(self, l_new: int, l_cached: int) -> float:
        raise NotImplementedError

    def request_costs(self, l_new: int, l_cached: int) -> tuple[float, float]:
        return self.marginal(l_new, l_cached), self.alone(l_new, l_cached)

    def of(self, requests: Iterable[tuple[int, int]]) -> float:
        """``T_hat`` of a verification batch given its (L_new, L_cached) pairs."""
        return self.price(Shape.of(requests, prefill_above=self.prefill_above))

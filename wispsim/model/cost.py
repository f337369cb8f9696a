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
              n_arrivals: float = 0, n_logits: float | None = None) -> float:  # fmt: skip
        """``T_hat`` of a pass from its shape's sums (``n_logits`` unsaid: ``n_linear``)."""
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
              n_arrivals: float = 0, n_logits: float | None = None) -> float:  # fmt: skip
        raise NotImplementedError

    def price(self, shape: Shape) -> float:
        return self.batch(
            shape.n_linear,
            shape.n_interactions,
            shape.n_cached,
            shape.n_requests,
            shape.n_arrivals,
            shape.n_logits,
        )

    def price_with(self, shape: Shape, l_new: int, l_cached: int) -> float:
        # a verification round joins: logits at every one of its new tokens
        return self.batch(
            shape.n_linear + l_new,
            shape.n_interactions + (l_new + l_cached) * l_new,
            shape.n_cached + l_cached,
            shape.n_requests + 1,
            shape.n_arrivals + 1,
            shape.n_logits + l_new,
        )

    def alone(self, l_new: int, l_cached: int) -> float:
        return self.batch(l_new, (l_new + l_cached) * l_new, l_cached, 1, 1)

    def marginal(self, l_new: int, l_cached: int) -> float:
        raise NotImplementedError

    def request_costs(self, l_new: int, l_cached: int) -> tuple[float, float]:
        return self.marginal(l_new, l_cached), self.alone(l_new, l_cached)

    def of(self, requests: Iterable[tuple[int, int]]) -> float:
        """``T_hat`` of a verification batch given its (L_new, L_cached) pairs."""
        return self.price(Shape.of(requests))

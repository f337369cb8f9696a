"""The verification-time estimator of SPEC section 4, and its forms.

The WISP paper's *additive* form: ``T_hat(B) = a*N_linear + b_compute*N_interactions +
b_read*N_cached + c`` where, over the batch's requests, N_linear = sum L_new, N_interactions =
sum L_total*L_new and N_cached = sum L_cached. The scheduler uses the estimate; the server's
"true" batch time is the estimate times a log-normal noise factor (see
:mod:`wispsim.model.latency`).

Other forms are plug-ins (:data:`FORMS`): a form names its coefficients and the batch quantity
each multiplies, so ``wispsim profile fit`` fits every form on the same training rows and
compares them on the same held-out rows, a profile can carry several, and a scenario picks one
(``server.estimator_form``; the paper's ``additive`` unless it says otherwise). ``per-request``
adds ``d`` seconds per request in the batch: what a serving engine spends on each request
besides its tokens (scheduling it, gathering its logits, sampling, returning its output).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from wispsim.model.batch import Shape
from wispsim.model.cost import AggregateCost
from wispsim.registry import Registry


@dataclass(frozen=True, slots=True)
class Estimator(AggregateCost):
    """The linear forms (module docstring): a cost model (:mod:`wispsim.model.cost`)."""

    a: float
    b_compute: float
    b_read: float
    c: float
    d: float = 0.0  # seconds per request in the batch (``per-request`` form; 0 in the paper's)
    form: str = "additive"

    def marginal(self, l_new: int, l_cached: int) -> float:
        """One request's cost without the batch constant: ``v_i`` of SPEC 3.1 (with ``d``, what
        the ``per-request`` form charges every member)."""
        return l_new * (self.a + self.b_compute * (l_new + l_cached)) + self.b_read * l_cached + self.d

    def batch(self, n_linear: float, n_interactions: float, n_cached: float, n_requests: float = 0,
              n_arrivals: float = 0, n_logits: float | None = None, n_prefill_interactions: float = 0,
              n_prefill_cached: float = 0) -> float:  # fmt: skip
        """``T_hat`` from the three aggregates (and the number of requests, for ``d``; these forms
        have no arrival term, ``n_logits`` is not theirs: ``a`` was measured with logits at every
        new token, and they price a prefill's interactions as a decode's)."""
        return (
            self.a * n_linear
            + self.b_compute * n_interactions
            + self.b_read * n_cached
            + self.c
            + self.d * n_requests
        )

    def price_with(self, shape: Shape, l_new: int, l_cached: int) -> float:
        """:meth:`batch` of ``shape`` plus one member, written out (the scheduler asks it per
        candidate request; the same operations in the same order, so the same float)."""
        return (
            self.a * (shape.n_linear + l_new)
            + self.b_compute * (shape.n_interactions + (l_new + l_cached) * l_new)
            + self.b_read * (shape.n_cached + l_cached)
            + self.c
            + self.d * (shape.n_requests + 1)
        )

    def alone(self, l_new: int, l_cached: int) -> float:
        """``T_hat`` of a batch holding only this request: ``v_i + c`` of SPEC 3.1."""
        return self.c + self.marginal(l_new, l_cached)

    @property
    def fastest(self) -> float:
        """The cheapest pass there is: the batch constant (the paper's form has nothing else)."""
        return self.c


@dataclass(frozen=True, slots=True)
class Form:
    """An estimator form: its coefficients, and the column of a measurement table (or 1) that
    each multiplies, in the same order."""

    name: str
    terms: tuple[str, ...]
    columns: tuple[str, ...]
    description: str


FORMS: Registry[Form] = Registry("estimator form")
FORMS.register("additive")(
    Form(
        "additive",
        ("a", "b_compute", "b_read", "c"),
        ("n_linear", "n_interactions", "n_cached", "1"),
        "the WISP paper's: a*N_linear + b_compute*N_interactions + b_read*N_cached + c",
    )
)
FORMS.register("per-request")(
    Form(
        "per-request",
        ("a", "b_compute", "b_read", "c", "d"),
        ("n_linear", "n_interactions", "n_cached", "1", "batch_size"),
        "the additive form plus d per request in the batch (a serving engine's per-request work)",
    )
)
FORMS.register("roofline")(
    Form(
        "roofline",
        ("bandwidth", "compute", "attention", "step", "request", "arrival", "allreduce"),
        (),
        "physical: weights once per pass, KV per cached token, FLOPs at fitted fractions of the "
        "GPU's peaks, TP all-reduces, per-step/request/arrival overheads (wispsim.model.roofline)",
    )
)
DEFAULT_FORM = "additive"
LINEAR_FORMS = ("additive", "per-request")  # fitted by least squares on a measurement table


def aggregates(requests: Iterable[tuple[int, int]]) -> tuple[int, int, int]:
    """(N_linear, N_interactions, N_cached) of a batch given (L_new, L_cached) pairs."""
    shape = Shape.of(requests)
    return shape.n_linear, shape.n_interactions, shape.n_cached

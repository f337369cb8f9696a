"""The additive verification-time estimator of SPEC section 4.

``T_hat(B) = a*N_linear + b_compute*N_interactions + b_read*N_cached + c`` where, over the batch's
requests, N_linear = sum L_new, N_interactions = sum L_total*L_new and N_cached = sum L_cached.
The scheduler uses the estimate; the server's "true" batch time is the estimate times a
log-normal noise factor (see :mod:`wispsim.model.latency`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Estimator:
    a: float
    b_compute: float
    b_read: float
    c: float

    def marginal(self, l_new: int, l_cached: int) -> float:
        """One request's cost without the batch constant: ``v_i`` of SPEC 3.1."""
        return l_new * (self.a + self.b_compute * (l_new + l_cached)) + self.b_read * l_cached

    def batch(self, n_linear: float, n_interactions: float, n_cached: float) -> float:
        """``T_hat`` from the three aggregates."""
        return self.a * n_linear + self.b_compute * n_interactions + self.b_read * n_cached + self.c

    def of(self, requests: Iterable[tuple[int, int]]) -> float:
        """``T_hat`` of a batch given its (L_new, L_cached) pairs."""
        return self.c + sum(self.marginal(n, c) for n, c in requests)


def aggregates(requests: Iterable[tuple[int, int]]) -> tuple[int, int, int]:
    """(N_linear, N_interactions, N_cached) of a batch given (L_new, L_cached) pairs."""
    n_lin = n_int = n_cac = 0
    for l_new, l_cached in requests:
        n_lin += l_new
        n_int += (l_new + l_cached) * l_new
        n_cac += l_cached
    return n_lin, n_int, n_cac

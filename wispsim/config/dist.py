"""Field checks and scalar distributions, the building blocks of every config section."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np


class FieldError(ValueError):
    """Raised by a dataclass's checks; the loader adds the file and the path prefix."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem

    def __reduce__(self) -> tuple[type[FieldError], tuple[str, str]]:
        return type(self), (self.field, self.problem)


def require(cond: bool, fld: str, problem: str) -> None:
    if not cond:
        raise FieldError(fld, problem)


def require_count(value: int, fld: str, low: int, high: int, unit: str = "") -> None:
    """``value`` a whole number in ``[low, high]`` (``unit``: what it counts), else a FieldError
    naming the range."""
    if not low <= value <= high:
        raise FieldError(fld, f"must be in [{low:,}, {high:,}]{' ' + unit if unit else ''}, got {value:,}")


DistKind = Literal["constant", "uniform", "lognormal", "exponential", "normal"]


@dataclass(frozen=True, slots=True)
class Dist:
    """A scalar distribution, clipped to [min, max].

    ``lognormal`` and ``exponential`` are parameterised by their mean (and ``cv``, the coefficient
    of variation, for lognormal) because that is what people know about their workloads.
    """

    dist: DistKind = "constant"
    value: float = 0.0
    mean: float = 0.0
    cv: float = 0.0
    std: float = 0.0
    low: float = 0.0
    high: float = 0.0
    min: float = field(default=0.0, metadata={"inf": True})  # -.inf: unclipped below
    max: float = field(default=math.inf, metadata={"inf": True})  # .inf: unclipped above

    def __post_init__(self) -> None:
        require(self.min <= self.max, "min", f"must be <= max ({self.max}), got {self.min}")
        if self.dist == "constant":
            require(self.value >= 0, "value", f"must be >= 0, got {self.value}")
        elif self.dist == "uniform":
            require(0 <= self.low <= self.high, "low", "needs 0 <= low <= high")
        elif self.dist in ("lognormal", "exponential"):
            require(self.mean > 0, "mean", f"must be > 0, got {self.mean}")
            require(self.cv >= 0, "cv", f"must be >= 0, got {self.cv}")
        elif self.dist == "normal":
            require(self.std >= 0, "std", f"must be >= 0, got {self.std}")

    def sample(self, rng: np.random.Generator, size: int | None = None) -> Any:
        d = self.dist
        if d == "constant":
            x = np.full(size, self.value) if size is not None else self.value
        elif d == "uniform":
            x = rng.uniform(self.low, self.high, size)
        elif d == "lognormal":
            s2 = math.log1p(self.cv**2)
            x = rng.lognormal(math.log(self.mean) - s2 / 2, math.sqrt(s2), size)
        elif d == "exponential":
            x = rng.exponential(self.mean, size)
        else:
            x = rng.normal(self.mean, self.std, size)
        return np.clip(x, self.min, self.max) if size is not None else min(max(x, self.min), self.max)

    def support(self) -> tuple[float, float]:
        """Smallest and largest values a sample can take."""
        if self.dist == "constant":
            v = min(max(self.value, self.min), self.max)
            return v, v
        if self.dist == "uniform":
            return max(self.low, self.min), min(self.high, self.max)
        if self.dist in ("lognormal", "exponential"):
            return max(self.min, 0.0), self.max
        return self.min if self.min > -math.inf else -math.inf, self.max

    def nominal(self) -> float:
        """The distribution's centre, used where one representative number is needed."""
        c = {
            "constant": self.value,
            "uniform": (self.low + self.high) / 2,
        }.get(self.dist, self.mean)
        return float(min(max(c, self.min), self.max))

    def quantile(self, q: float) -> float:
        """The value a share ``q`` of samples fall below (clipping included): at q <= 0 the smallest
        a sample can take, at q >= 1 the largest (:meth:`support`; epsilon 0 asks for every one)."""
        from statistics import NormalDist

        if not 0.0 < q < 1.0:
            return float(self.support()[0 if q <= 0.0 else 1])
        d = self.dist
        if d == "constant":
            x = self.value
        elif d == "uniform":
            x = self.low + q * (self.high - self.low)
        elif d == "lognormal":
            s2 = math.log1p(self.cv**2)
            x = math.exp(math.log(self.mean) - s2 / 2 + math.sqrt(s2) * NormalDist().inv_cdf(q))
        elif d == "exponential":
            x = -self.mean * math.log1p(-q)
        else:
            x = self.mean + self.std * NormalDist().inv_cdf(q)
        return float(min(max(x, self.min), self.max))

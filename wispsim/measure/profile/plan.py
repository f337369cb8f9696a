"""The profiling plan: which batches to time to fit the verification-time estimator (SPEC 4).

A configuration is one batch: per request, the new tokens L_new and the cached tokens L_cached.
The default plan follows the WISP paper's design, 123 training configurations in five regimes
and 50 held-out test configurations:

- ``compute-bound`` (25): 1200, 1400, ..., 2000 new tokens in total, nothing cached, as one
  request, split in 2, split in 4, and two varied splits (random compositions of 2-6 parts);
- ``memory-bound`` (48): every combination of L_new in {1, 5, 10, 20, 50, 100}, L_total in
  {500, 1000, 1500, 2000} and batch size 1 or 4, the rest of L_total cached;
- ``random-compute-bound`` (15): 1-4 requests sharing 1200-2000 new tokens, each with a small
  cached prefix (0-25% of its new tokens);
- ``random-memory-bound`` (15): 1-8 requests, each with 1-100 new tokens and 500-2000 in total;
- ``mixed`` (20): 2-6 requests, some cold (100-1000 new tokens, nothing cached), the rest warm
  (1-20 new tokens on a 200-2000 token cached prefix), at least one of each.

The test set draws every regime at random (10 each by default) from a generator seeded
differently from the training set's, and no test batch repeats a training batch. Options scale
the token counts for small hardware: ``scale`` multiplies every count, ``max_context`` shrinks a
request whose L_total is longer (keeping its new/cached proportion), ``max_batch`` drops the
requests past it. A plan is a CSV file with one row per configuration.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise, product
from pathlib import Path

import numpy as np
import pandas as pd

from wispsim.config.limits import MAX_SEED
from wispsim.errors import WispsimError
from wispsim.model.estimator import aggregates
from wispsim.model.measured import PLAN_COLUMNS
from wispsim.tabular import read_table

CATEGORIES = ("compute-bound", "memory-bound", "random-compute-bound", "random-memory-bound", "mixed")
DEFAULT_COUNTS = (25, 48, 15, 15, 20)
DEFAULT_TEST = 50
SPLITS = ("train", "test")

Requests = list[tuple[int, int]]  # (L_new, L_cached) per request


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """How many configurations of each regime, and how to fit them to the hardware."""

    counts: tuple[int, ...] = DEFAULT_COUNTS
    test: int = DEFAULT_TEST
    seed: int = 0
    scale: float = 1.0
    max_context: int | None = None
    max_batch: int | None = None

    def __post_init__(self) -> None:
        if len(self.counts) != len(CATEGORIES) or any(c < 0 for c in self.counts):
            raise WispsimError(
                f"--counts: expected {len(CATEGORIES)} counts >= 0 ({', '.join(CATEGORIES)}), "
                f"got {self.counts}"
            )
        if self.test < 0:
            raise WispsimError(f"--test: must be >= 0, got {self.test}")
        if not self.scale > 0:
            raise WispsimError(f"--scale: must be > 0, got {self.scale}")
        if self.max_context is not None and self.max_context < 2:
            raise WispsimError(f"--max-context: must be >= 2, got {self.max_context}")
        if self.max_batch is not None and self.max_batch < 1:
            raise WispsimError(f"--max-batch: must be >= 1, got {self.max_batch}")
        if self.seed < 0:
            raise WispsimError(f"--seed: must be >= 0, got {self.seed}")


@dataclass(frozen=True, slots=True)
class Configuration:
    """One batch to time."""

    config_id: str
    split: str
    category: str
    seed: int
    requests: tuple[tuple[int, int], ...] = field(default=())

    @property
    def l_new(self) -> list[int]:
        return [n for n, _ in self.requests]

    @property
    def l_cached(self) -> list[int]:
        return [c for _, c in self.requests]

    @property
    def aggregates(self) -> tuple[int, int, int]:
        return aggregates(self.requests)

    def row(self) -> dict[str, object]:
        n_lin, n_int, n_cac = self.aggregates
        return {
            "config_id": self.config_id,
            "split": self.split,
            "category": self.category,
            "seed": self.seed,
            "batch_size": len(self.requests),
            "l_new": join_ints(self.l_new),
            "l_cached": join_ints(self.l_cached),
            "n_linear": n_lin,
            "n_interactions": n_int,
            "n_cached": n_cac,
            "max_l_total": max(n + c for n, c in self.requests),
        }


def join_ints(values: Sequence[int]) -> str:
    return ";".join(str(int(v)) for v in values)


def split_ints(text: object, where: str) -> list[int]:
    try:
        return [int(x) for x in str(text).split(";") if x != ""]
    except ValueError:
        raise WispsimError(f"{where}: expected integers separated by ';', got {text!r}") from None


def split_seeds(seed: int) -> tuple[int, int]:
    """Two different 32-bit seeds for the training and the test set, both from the plan seed."""
    train, test = (int(np.random.SeedSequence([seed, i]).generate_state(1)[0]) for i in range(2))
    return train, test if test != train else test ^ 1


# ---------------------------------------------------------------------------------------------
# the regimes, in the paper's token units (before scaling)
# ---------------------------------------------------------------------------------------------


def _composition(rng: np.random.Generator, total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` positive random integers."""
    parts = max(1, min(parts, total))
    cuts = (
        np.sort(rng.choice(np.arange(1, total), size=parts - 1, replace=False)).tolist() if parts > 1 else []
    )
    edges = [0, *(int(c) for c in cuts), total]
    return [b - a for a, b in pairwise(edges)]


def compute_bound_grid(rng: np.random.Generator) -> list[Requests]:
    out: list[Requests] = []
    for total in (1200, 1400, 1600, 1800, 2000):
        out.append([(total, 0)])
        out.append([(total // 2, 0)] * 2)
        out.append([(total // 4, 0)] * 4)
        out.append([(n, 0) for n in _composition(rng, total, 3)])
        out.append([(n, 0) for n in _composition(rng, total, int(rng.integers(2, 7)))])
    return out


def compute_bound_random(rng: np.random.Generator) -> Requests:
    total = int(rng.integers(1200, 2001))
    shape = int(rng.integers(0, 4))
    if shape == 0:
        return [(total, 0)]
    if shape in (1, 2):
        parts = 2 * shape
        return [(total // parts, 0)] * parts
    return [(n, 0) for n in _composition(rng, total, int(rng.integers(2, 7)))]


def memory_bound_grid(rng: np.random.Generator) -> list[Requests]:
    out: list[Requests] = []
    for l_new, l_total, batch in product((1, 5, 10, 20, 50, 100), (500, 1000, 1500, 2000), (1, 4)):
        out.append([(l_new, l_total - l_new)] * batch)
    return out


def memory_bound_random(rng: np.random.Generator) -> Requests:
    l_new = int(rng.integers(1, 101))
    l_total = int(rng.integers(500, 2001))
    return [(l_new, l_total - l_new)] * int(rng.choice([1, 4]))


def random_compute_bound(rng: np.random.Generator) -> Requests:
    total = int(rng.integers(1200, 2001))
    parts = _composition(rng, total, int(rng.integers(1, 5)))
    return [(n, int(rng.integers(0, n // 4 + 1))) for n in parts]


def random_memory_bound(rng: np.random.Generator) -> Requests:
    out = []
    for _ in range(int(rng.integers(1, 9))):
        l_new = int(rng.integers(1, 101))
        out.append((l_new, int(rng.integers(500, 2001)) - l_new))
    return out


def mixed(rng: np.random.Generator) -> Requests:
    size = int(rng.integers(2, 7))
    cold = rng.random(size) < 0.4
    cold[0], cold[-1] = True, False  # at least one of each
    out = []
    for c in rng.permutation(cold):
        if c:
            out.append((int(rng.integers(100, 1001)), 0))
        else:
            out.append((int(rng.integers(1, 21)), int(rng.integers(200, 2001))))
    return out


Grid = Callable[[np.random.Generator], list[Requests]]
Draw = Callable[[np.random.Generator], Requests]
# per regime: the training design (a grid, or None for random draws) and the random draw
REGIMES: dict[str, tuple[Grid | None, Draw]] = {
    "compute-bound": (compute_bound_grid, compute_bound_random),
    "memory-bound": (memory_bound_grid, memory_bound_random),
    "random-compute-bound": (None, random_compute_bound),
    "random-memory-bound": (None, random_memory_bound),
    "mixed": (None, mixed),
}


# ---------------------------------------------------------------------------------------------
# scaling to the hardware
# ---------------------------------------------------------------------------------------------


def fit_to_hardware(requests: Requests, opts: PlanOptions) -> tuple[tuple[int, int], ...]:
    """Scale token counts, shrink requests longer than ``max_context``, drop requests past
    ``max_batch``. Every request keeps at least one new token."""
    out = []
    for l_new, l_cached in requests[: opts.max_batch or None]:
        n = max(1, round(l_new * opts.scale))
        c = round(l_cached * opts.scale)
        if opts.max_context is not None and n + c > opts.max_context:
            f = opts.max_context / (n + c)
            n = max(1, math.floor(n * f))
            c = min(opts.max_context - n, math.floor(c * f))
        out.append((n, c))
    return tuple(out)


def _take(rng: np.random.Generator, designs: list[Requests], count: int, draw: Draw) -> list[Requests]:
    """``count`` designs: a seeded subset of the grid if it is larger, random draws added if smaller."""
    if count <= len(designs):
        keep = sorted(rng.choice(len(designs), size=count, replace=False)) if count < len(designs) else None
        return designs if keep is None else [designs[i] for i in keep]
    return designs + [draw(rng) for _ in range(count - len(designs))]


def make_plan(opts: PlanOptions | None = None) -> list[Configuration]:
    """The training and test configurations, in that order."""
    opts = opts or PlanOptions()
    train_seed, test_seed = split_seeds(opts.seed)
    configs: list[Configuration] = []
    rng = np.random.default_rng(train_seed)
    seen: set[tuple[tuple[int, int], ...]] = set()
    for category, count in zip(CATEGORIES, opts.counts, strict=True):
        grid, draw = REGIMES[category]
        designs = _take(rng, grid(rng), count, draw) if grid else [draw(rng) for _ in range(count)]
        for reqs in designs:
            batch = fit_to_hardware(reqs, opts)
            seen.add(tuple(sorted(batch)))
            configs.append(Configuration(f"train-{len(configs):03d}", "train", category, train_seed, batch))
    rng = np.random.default_rng(test_seed)
    per = [opts.test // len(CATEGORIES) + (i < opts.test % len(CATEGORIES)) for i in range(len(CATEGORIES))]
    n_test = 0
    for category, count in zip(CATEGORIES, per, strict=True):
        draw = REGIMES[category][1]
        for _ in range(count):
            for _attempt in range(100):  # a held-out batch must not repeat a training batch
                batch = fit_to_hardware(draw(rng), opts)
                if tuple(sorted(batch)) not in seen:
                    break
            seen.add(tuple(sorted(batch)))
            configs.append(Configuration(f"test-{n_test:03d}", "test", category, test_seed, batch))
            n_test += 1
    return configs


def plan_frame(configs: Sequence[Configuration]) -> pd.DataFrame:
    return pd.DataFrame([c.row() for c in configs], columns=PLAN_COLUMNS)


def write_plan(
    configs: Sequence[Configuration], path: Path, opts: PlanOptions | None = None, command: str = ""
) -> None:
    """The plan CSV, and with ``opts`` a ``PATH.meta.json`` with the options and the command."""
    path.parent.mkdir(parents=True, exist_ok=True)
    plan_frame(configs).to_csv(path, index=False)
    if opts is not None:
        meta = {
            "command": command,
            **asdict(opts),
            "seeds": dict(zip(SPLITS, split_seeds(opts.seed), strict=True)),
        }
        Path(str(path) + ".meta.json").write_text(json.dumps(meta, indent=1))


def read_plan(path: Path) -> list[Configuration]:
    """Read and check a plan CSV (as :func:`write_plan` writes it)."""
    if not path.is_file():
        raise WispsimError(f"{path}: plan file not found (make one with `wispsim profile plan`)")
    df = read_table(path, kind="csv", dtype={"l_new": str, "l_cached": str, "config_id": str, "seed": str})
    missing = [c for c in ("config_id", "split", "category", "seed", "l_new", "l_cached") if c not in df]
    if missing:
        raise WispsimError(f"{path}: not a plan: missing columns {', '.join(missing)}")
    if df.config_id.duplicated().any():
        raise WispsimError(f"{path}: config_id {df.config_id[df.config_id.duplicated()].iloc[0]!r} repeats")
    out = []
    for i, row in enumerate(df.itertuples(index=False)):
        where = f"{path}: row {i + 2}"
        new = split_ints(row.l_new, f"{where}: l_new")
        cached = split_ints(row.l_cached, f"{where}: l_cached")
        if not new or len(new) != len(cached):
            raise WispsimError(f"{where}: l_new and l_cached must list the same number of requests")
        if min(new) < 1 or min(cached) < 0:
            raise WispsimError(f"{where}: every request needs L_new >= 1 and L_cached >= 0")
        if row.split not in SPLITS:
            raise WispsimError(f"{where}: split {row.split!r}; allowed: {', '.join(SPLITS)}")
        reqs = tuple(zip(new, cached, strict=True))
        if not str(row.seed).strip().isdigit() or int(str(row.seed)) > MAX_SEED:
            raise WispsimError(f"{where}: seed must be an integer in [0, {MAX_SEED}], got {row.seed!r}")
        out.append(
            Configuration(str(row.config_id), str(row.split), str(row.category), int(str(row.seed)), reqs)
        )
    return out

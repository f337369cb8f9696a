"""Labels for rejection predictors: which drafted positions verification accepts, and splits.

Labels follow verification, not the raw per-position flags: each sample is walked in windows of
K drafted positions. A window starting at t covers t..t+K-1; positions up to and including the
first rejection get labels (accepted = 1, the first rejection = 0); later positions are dropped
because verification never reaches them; the next window starts right after the first rejection
(the target commits its own token there) or after the window when all were accepted.

Splits are by sample, never by token (neighbouring positions of one generation are strongly
correlated): a seeded 20 % of the samples is the test set, and 20 % of the remaining samples is
the validation set (:func:`split_set`).

The features are :data:`wispsim.model.acceptance.FEATURES`, optionally plus the position in the
window (``window_position``). The simulator cannot supply that position (it is unknown before
drafting), so models meant for ``drafting.predictor: {name: npz}`` are trained without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from wispsim.errors import WispsimError
from wispsim.model.acceptance import FEATURES, Trace, accept_runs, find_trace, load_trace

LabelFrom = Literal["accept", "greedy", "beta"]
LABEL_SOURCES: tuple[str, ...] = ("accept", "greedy", "beta")
WINDOW_FEATURE = "window_position"


def window_labels(accept: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels of one sample's positions under verification windows of ``k``.

    Returns ``(positions, labels, offsets)``: the labelled positions in order, their labels (1
    accepted, 0 first rejection of its window) and their offsets in the window (0..k-1).
    Positions after a window's first rejection are absent.
    """
    if k < 1:
        raise WispsimError(f"--k: must be >= 1, got {k}")
    acc = np.asarray(accept, dtype=bool)
    n = len(acc)
    run = accept_runs(acc)
    pos: list[np.ndarray] = []
    t = 0
    while t < n:
        span = min(k, n - t)
        accepted = min(int(run[t]), span)
        labelled = accepted + 1 if accepted < span else span
        pos.append(np.arange(t, t + labelled))
        t += labelled if accepted < span else k
    positions = np.concatenate(pos) if pos else np.zeros(0, dtype=np.int64)
    starts = np.concatenate([np.full(len(p), p[0]) for p in pos]) if pos else positions
    return positions, acc[positions].astype(np.int8), positions - starts


@dataclass(frozen=True, slots=True)
class LabeledSet:
    """Labelled positions of one or more traces: features, labels, and which sample each came from."""

    x: np.ndarray  # (n, features)
    y: np.ndarray  # int8, 1 = accepted
    group: np.ndarray  # int64, one id per (trace, sample)
    row: np.ndarray  # int64, row of the (sorted) trace the position came from
    offset: np.ndarray  # int64, position in its verification window
    features: tuple[str, ...]

    def take(self, mask: np.ndarray) -> LabeledSet:
        return LabeledSet(
            self.x[mask], self.y[mask], self.group[mask], self.row[mask], self.offset[mask], self.features
        )


def trace_accepts(trace: Trace, label_from: str, seed: int) -> np.ndarray:
    """Which positions of ``trace`` count as accepted: the realized flag, greedy agreement, or a
    seeded Bernoulli(beta) draw."""
    if label_from == "accept":
        return trace.flag
    if label_from == "greedy":
        return trace.greedy
    if label_from == "beta":
        return np.random.default_rng(seed).random(len(trace.beta)) < trace.beta
    raise WispsimError(f"--label-from: unknown source {label_from!r}; allowed: {', '.join(LABEL_SOURCES)}")


def label_trace(
    trace: Trace,
    k: int = 8,
    label_from: str = "accept",
    seed: int = 0,
    window_position: bool = False,
    group_base: int = 0,
) -> LabeledSet:
    """Labelled positions of every sample of ``trace`` (groups numbered from ``group_base``)."""
    acc = trace_accepts(trace, label_from, seed)
    rows, ys, groups, offs = [], [], [], []
    for i, (s, n) in enumerate(zip(trace.starts, trace.lengths, strict=True)):
        pos, y, off = window_labels(acc[s : s + n], k)
        rows.append(pos + s)
        ys.append(y)
        offs.append(off)
        groups.append(np.full(len(pos), group_base + i, dtype=np.int64))
    row = np.concatenate(rows)
    offset = np.concatenate(offs)
    x = trace.features[row]
    names: tuple[str, ...] = FEATURES
    if window_position:
        x = np.column_stack([x, offset.astype(np.float64)])
        names = (*FEATURES, WINDOW_FEATURE)
    return LabeledSet(x, np.concatenate(ys), np.concatenate(groups), row, offset, names)


def label_traces(
    paths: list[str], k: int, label_from: str, seed: int, window_position: bool
) -> tuple[LabeledSet, list[Trace]]:
    """Label several traces into one set; sample ids are made unique across traces."""
    if not paths:
        raise WispsimError("--trace: give at least one trace file")
    traces = [load_trace(str(find_trace(p))) for p in paths]
    parts, base = [], 0
    for i, tr in enumerate(traces):
        parts.append(label_trace(tr, k, label_from, seed + 1000 * i, window_position, base))
        base += tr.samples
    joined = LabeledSet(
        np.concatenate([p.x for p in parts]),
        np.concatenate([p.y for p in parts]),
        np.concatenate([p.group for p in parts]),
        np.concatenate([p.row for p in parts]),
        np.concatenate([p.offset for p in parts]),
        parts[0].features,
    )
    return joined, traces


def split_groups(groups: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of the rows whose group falls in a seeded ``fraction`` of the groups."""
    ids = np.unique(groups)
    if len(ids) < 2:
        raise WispsimError(f"need at least 2 samples to split by sample, got {len(ids)}")
    n_held = min(len(ids) - 1, max(1, round(fraction * len(ids))))
    held = np.random.default_rng(seed).permutation(ids)[:n_held]
    return np.isin(groups, held)


@dataclass(frozen=True, slots=True)
class Split:
    """The three by-sample parts of a labelled set."""

    fit: LabeledSet
    val: LabeledSet
    test: LabeledSet


def split_set(data: LabeledSet, seed: int, test_fraction: float = 0.2, val_fraction: float = 0.2) -> Split:
    """Seeded by-sample split: ``test_fraction`` of the samples for test, then ``val_fraction`` of
    the rest for validation, the remainder to fit on."""
    test = split_groups(data.group, test_fraction, seed)
    rest = data.take(~test)
    val = split_groups(rest.group, val_fraction, seed + 1)
    return Split(rest.take(~val), rest.take(val), data.take(test))

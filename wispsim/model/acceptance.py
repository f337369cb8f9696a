"""Acceptance models: which drafted tokens the target accepts (SPEC 1 and 5).

Acceptance is a property of the *position along the committed text*, not of the draft window, so
every model produces, per response, a per-position stream: ``accept[t]`` (would the draft's token
at position t be accepted) and the draft-distribution ``features[t]`` the rejection predictor sees.
A round that starts at position t drafts t, t+1, ...; its accepted length is the run of accepts
from t. Because the stream is drawn per response from the device's acceptance generator, it is the
same whatever drafting policy or scheduler runs, which keeps policy comparisons fair.

Models (registry ``ACCEPTANCE``):

- ``bernoulli``: every position accepted independently with probability ``mean``; features carry
  no information.
- ``latent``: each position's acceptance probability is drawn from Beta(mean, spread); the token is
  accepted with that probability; features are a noisy monotone function of it.
- ``trace``: replay of a recorded per-position acceptance trace (Parquet; see ``traces/``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from wispsim.config import AcceptanceConfig
from wispsim.config.limits import MAX_TOKENS
from wispsim.errors import TraceError
from wispsim.paths import resolve_named, traces_dir
from wispsim.registry import Registry
from wispsim.tabular import bool_column, check_file, numeric_column, reading

FEATURES = ("top1_prob", "entropy", "margin", "logit_std")
TRACE_COLUMNS = ("sample_id", "position", *FEATURES, "beta", "greedy_agree", "accept")


class ResponseStream:
    """One response's acceptance along its positions, with its lengths.

    ``accept`` (bool, one per position, padded past ``output_len`` with False); ``run[t]`` is
    the number of consecutive accepted positions starting at t (precomputed so a round's
    accepted length is ``min(run[t], k)``); ``features`` (float, positions x ``FEATURES``) the
    draft features the predictor sees. In trace replay ``trace`` and ``rows`` (the trace row
    behind each position, -1 for padding) let predictor decisions be computed once per trace
    instead of once per response, and ``features`` is gathered from the trace only when read.
    """

    __slots__ = ("_features", "accept", "output_len", "prompt_len", "rows", "run", "trace")

    def __init__(
        self,
        prompt_len: int,
        output_len: int,
        accept: np.ndarray,
        features: np.ndarray | None,
        run: np.ndarray,
        trace: Trace | None = None,
        rows: np.ndarray | None = None,
    ) -> None:
        if features is None and (trace is None or rows is None):
            raise ValueError("a response stream needs features, or a trace and its rows")
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.accept = accept
        self._features = features
        self.run = run
        self.trace = trace
        self.rows = rows

    @property
    def features(self) -> np.ndarray:
        if self._features is None:
            assert self.trace is not None and self.rows is not None
            feats = self.trace.features[self.rows]
            feats[self.rows < 0] = 0.0  # padding
            self._features = feats
        return self._features


def accept_runs(accept: np.ndarray) -> np.ndarray:
    """``run[t]`` = number of consecutive True values of ``accept`` starting at t."""
    n = len(accept)
    idx = np.arange(n)
    reject_at = np.where(accept, n, idx)
    next_reject = np.minimum.accumulate(reject_at[::-1])[::-1]
    return next_reject - idx


def _stream(
    prompt_len: int, output_len: int, accept: np.ndarray, feats: np.ndarray, pad: int
) -> ResponseStream:
    if pad:
        accept = np.concatenate([accept, _padding(pad)[0]])
        feats = np.concatenate([feats, np.zeros((pad, feats.shape[1]))])
    return ResponseStream(prompt_len, output_len, accept, feats, accept_runs(accept))


@functools.cache
def _padding(pad: int) -> tuple[np.ndarray, np.ndarray]:
    """``pad`` positions of padding: rejected, behind no trace row (read-only; copied when used)."""
    reject, rows = np.zeros(pad, dtype=bool), np.full(pad, -1)
    reject.flags.writeable = rows.flags.writeable = False
    return reject, rows


def _trace_stream(
    prompt_len: int, trace: Trace, accepts: list[np.ndarray], rows: list[np.ndarray], cut: int, pad: int
) -> ResponseStream:
    """A replayed response: its pieces of recorded samples (verdicts and trace rows) end to end,
    less the last ``cut`` positions, then ``pad`` positions of padding."""
    last = len(accepts[-1]) - cut
    reject, no_row = _padding(pad)
    accept = np.concatenate([*accepts[:-1], accepts[-1][:last], reject])
    where = np.concatenate([*rows[:-1], rows[-1][:last], no_row])
    return ResponseStream(prompt_len, len(accept) - pad, accept, None, accept_runs(accept), trace, where)


class AcceptanceModel(Protocol):
    """Makes one :class:`ResponseStream` per response from the device's acceptance generator."""

    def nominal_rate(self) -> float:
        """Mean per-token acceptance probability (seeds the devices' acceptance estimate)."""
        ...

    def new_response(
        self, rng: np.random.Generator, prompt_len: int, output_len: int, pad: int
    ) -> ResponseStream: ...


ACCEPTANCE: Registry[type] = Registry("acceptance model")


def synthetic_features(p: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """Draft features as a noisy monotone function of the per-token acceptance probability p.

    top-1 probability = sigmoid(logit(p) + noise*Z); the other features follow from it the way
    they do for a peaked distribution whose remaining mass spreads over ~10 tokens: entropy falls,
    margin and the logits' spread rise as top-1 rises.
    """
    n = len(p)
    pc = np.clip(p, 1e-4, 1 - 1e-4)
    z = rng.standard_normal((n, 3))
    top1 = 1.0 / (1.0 + np.exp(-(np.log(pc / (1 - pc)) + noise * z[:, 0])))
    rest = 1.0 - top1
    top2 = rest * (0.3 + 0.4 / (1.0 + np.exp(-z[:, 1])))
    top2 = np.minimum(top2, top1)
    entropy = -(top1 * np.log(top1)) - rest * np.log(np.maximum(rest, 1e-12) / 10.0)
    logit_std = 1.5 + 3.0 * top1 + 0.3 * z[:, 2]
    return np.column_stack([top1, entropy, top1 - top2, logit_std])


@ACCEPTANCE.register("bernoulli")
class BernoulliAcceptance:
    """Independent per-token acceptance at a fixed rate; features are uninformative."""

    def __init__(self, cfg: AcceptanceConfig) -> None:
        self.mean = cfg.mean
        self.noise = cfg.feature_noise

    def nominal_rate(self) -> float:
        return self.mean

    def new_response(
        self, rng: np.random.Generator, prompt_len: int, output_len: int, pad: int
    ) -> ResponseStream:
        accept = rng.random(output_len) < self.mean
        feats = synthetic_features(np.full(output_len, self.mean), self.noise, rng)
        return _stream(prompt_len, output_len, accept, feats, pad)


@ACCEPTANCE.register("latent")
class LatentAcceptance:
    """Per-token acceptance probability ~ Beta(mean, spread); features track it noisily."""

    def __init__(self, cfg: AcceptanceConfig) -> None:
        self.mean = cfg.mean
        self.noise = cfg.feature_noise
        if cfg.spread == 0:
            self.ab: tuple[float, float] | None = None
        else:
            kappa = cfg.mean * (1 - cfg.mean) / cfg.spread**2 - 1
            self.ab = (cfg.mean * kappa, (1 - cfg.mean) * kappa)

    def nominal_rate(self) -> float:
        return self.mean

    def new_response(
        self, rng: np.random.Generator, prompt_len: int, output_len: int, pad: int
    ) -> ResponseStream:
        if self.ab is None:
            p = np.full(output_len, self.mean)
        else:
            p = rng.beta(self.ab[0], self.ab[1], output_len)
        accept = rng.random(output_len) < p
        feats = synthetic_features(p, self.noise, rng)
        return _stream(prompt_len, output_len, accept, feats, pad)


@dataclass(frozen=True, slots=True)
class Trace:
    """A loaded acceptance trace, one contiguous block of rows per sample, in position order."""

    path: str
    starts: np.ndarray
    lengths: np.ndarray
    prompt_lens: np.ndarray
    beta: np.ndarray
    flag: np.ndarray
    greedy: np.ndarray
    features: np.ndarray
    metadata: dict[str, str]

    @property
    def samples(self) -> int:
        return len(self.starts)

    def mean_rate(self, accept_from: str = "beta") -> float:
        col = {"beta": self.beta, "flag": self.flag, "greedy": self.greedy}[accept_from]
        return float(np.mean(col))


def find_trace(name_or_path: str) -> Path:
    path = resolve_named(name_or_path, traces_dir(), (".parquet",))
    if path is None:
        known = ", ".join(sorted(p.name for p in traces_dir().glob("*.parquet"))) or "none"
        raise TraceError(f"acceptance.trace: no trace {name_or_path!r}; shipped traces: {known}")
    return path


@functools.lru_cache(maxsize=8)
def load_trace(path: str) -> Trace:
    """Read and check a trace file (cached: sweeps reuse it across runs).

    Every column the simulator uses is checked (one-line :class:`TraceError` naming the column,
    the row and the value): ``sample_id`` integers, ``position`` integers in [0, MAX_TOKENS]
    (consecutive within a sample), ``context_length`` (optional) integers in [0, MAX_TOKENS],
    ``beta``, ``top1_prob`` and ``margin`` in [0, 1], ``entropy`` and ``logit_std`` finite and
    >= 0, ``accept`` and ``greedy_agree`` booleans or the integers 0 and 1.
    """
    check_file(path, error=TraceError)
    with reading(path, "Parquet trace", TraceError, failed="not a readable {what}"):
        table = pq.read_table(path)
        df: pd.DataFrame = table.to_pandas()
    missing = [c for c in TRACE_COLUMNS if c not in table.column_names]
    if missing:
        raise TraceError(f"{path}: missing columns {', '.join(missing)}; need {', '.join(TRACE_COLUMNS)}")
    if len(df) == 0:
        raise TraceError(f"{path}: the trace has no rows")
    df = df.reset_index(drop=True)

    def num(col: str, **rule: Any) -> np.ndarray:
        return numeric_column(df, col, path, text_numbers=False, error=TraceError, **rule)

    # checked in file order (row numbers as in the file), then sorted
    sid_raw = num("sample_id", integer=True)
    pos_raw = num("position", integer=True, lo=0, hi=MAX_TOKENS)
    beta_raw = num("beta")
    out = np.flatnonzero((beta_raw < 0) | (beta_raw > 1))
    if out.size:
        i = int(out[0])
        raise TraceError(f"{path}: column beta must lie in [0, 1]; row {i + 1} has {beta_raw[i]:g}")
    checked = {
        "beta": beta_raw,
        "top1_prob": num("top1_prob", lo=0, hi=1),
        "entropy": num("entropy", lo=0),
        "margin": num("margin", lo=0, hi=1),
        "logit_std": num("logit_std", lo=0),
    }
    ctx = num("context_length", integer=True, lo=0, hi=MAX_TOKENS) if "context_length" in df else None
    accept = bool_column(df, "accept", path, error=TraceError)
    greedy = bool_column(df, "greedy_agree", path, error=TraceError)
    order = np.lexsort((pos_raw, sid_raw))
    sid = sid_raw[order]
    pos = pos_raw[order]
    beta = checked["beta"][order]
    feats = np.column_stack([checked[f][order] for f in FEATURES])
    change = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
    lengths = np.diff(np.r_[change, len(df)])
    expected = np.arange(len(df)) - np.repeat(change, lengths)
    if not np.array_equal(pos - np.repeat(pos[change], lengths), expected):
        bad = np.flatnonzero(pos - np.repeat(pos[change], lengths) != expected)[0]
        raise TraceError(
            f"{path}: position: positions of a sample must be consecutive integers; sample "
            f"{sid[bad]:g} has position {pos[bad]:g} after {pos[bad - 1]:g}"
        )
    prompt = ctx[order][change].astype(int) if ctx is not None else np.full(len(change), 256)
    raw_meta = table.schema.metadata or {}
    meta = {
        k.decode(errors="replace"): v.decode(errors="replace")
        for k, v in raw_meta.items()
        if not k.startswith(b"pandas")
    }
    return Trace(
        path=path,
        starts=change,
        lengths=lengths,
        prompt_lens=np.maximum(prompt, 1),
        beta=beta,
        flag=accept[order],
        greedy=greedy[order],
        features=feats,
        metadata=meta,
    )


@ACCEPTANCE.register("trace")
class TraceAcceptance:
    """Replays a recorded trace position by position.

    ``accept_from`` chooses what decides acceptance at a position: ``beta`` (a fresh
    Bernoulli(beta) draw, so replay is a sample of the same process), ``flag`` (the recorded
    realized verdict) or ``greedy`` (argmax agreement). ``lengths`` chooses where a response's
    lengths come from: ``trace`` (one recorded sample, drawn at random, sets the prompt and
    output lengths) or ``workload`` (the workload's lengths; the output's positions are filled
    with randomly drawn recorded samples one after another, so long responses replay real
    acceptance even when the recordings are short).
    """

    def __init__(self, cfg: AcceptanceConfig) -> None:
        if not cfg.trace:
            raise TraceError("acceptance.trace: the trace model needs a trace file or name")
        self.trace = load_trace(str(find_trace(cfg.trace)))
        self.accept_from = cfg.accept_from
        self.lengths = cfg.lengths

    def nominal_rate(self) -> float:
        return self.trace.mean_rate(self.accept_from)

    def _sample(self, rng: np.random.Generator) -> tuple[int, slice]:
        tr = self.trace
        i = int(rng.integers(tr.samples))
        s = int(tr.starts[i])
        return i, slice(s, s + int(tr.lengths[i]))

    def _verdicts(self, rng: np.random.Generator, sl: slice) -> np.ndarray:
        tr = self.trace
        if self.accept_from == "beta":
            return rng.random(sl.stop - sl.start) < tr.beta[sl]
        if self.accept_from == "flag":
            return tr.flag[sl].copy()
        return tr.greedy[sl].copy()

    def new_response(
        self, rng: np.random.Generator, prompt_len: int, output_len: int, pad: int
    ) -> ResponseStream:
        tr = self.trace
        if self.lengths == "trace":
            i, sl = self._sample(rng)
            verdicts = self._verdicts(rng, sl)
            return _trace_stream(
                int(tr.prompt_lens[i]), tr, [verdicts], [np.arange(sl.start, sl.stop)], 0, pad
            )
        accepts, rows, have = [], [], 0
        while have < output_len:
            _, sl = self._sample(rng)
            accepts.append(self._verdicts(rng, sl))
            rows.append(np.arange(sl.start, sl.stop))
            have += sl.stop - sl.start
        return _trace_stream(prompt_len, tr, accepts, rows, have - output_len, pad)


def make_acceptance(cfg: AcceptanceConfig) -> AcceptanceModel:
    model: AcceptanceModel = ACCEPTANCE.get(cfg.model, field="acceptance.model")(cfg)
    return model


def expected_accept_ratio(rate: float, k: int) -> float:
    """E[L]/k for i.i.d. acceptance at ``rate`` and a window of k (seeds alpha_hat)."""
    if k <= 0:
        return rate
    if math.isclose(rate, 1.0):
        return 1.0
    return rate * (1 - rate**k) / (1 - rate) / k

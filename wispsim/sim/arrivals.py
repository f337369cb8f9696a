"""Arrival processes: who asks for a response, and when (SPEC 5 and 7).

``closed`` (the default)
    N devices, each looping forever: a response, its think time, the next response.
``poisson``
    Open sessions: new responses arrive as a Poisson process of ``arrivals.rate`` per second;
    each arrival is a fresh device (index 0, 1, 2, ... in arrival order, so its class, draft
    speed and link follow :func:`wispsim.model.fleet.device_specs` cyclically) that asks for one
    response and leaves.
``trace``
    A CSV of ``time_s,value`` rows, read as a step function (a value holds from its time until
    the next row; the last value holds on). ``arrivals.kind: concurrency``: ``value`` devices are
    active at time t -- devices 0..value-1 of a pool as large as the trace's peak; a device
    finishes the response it is in and then waits while its index is at or above the target, so
    a drop in the target takes effect as responses end, as it does in a real deployment.
    ``arrivals.kind: rate``: new responses arrive as a Poisson process with that time-varying
    rate, each on a fresh device as in ``poisson``. ``arrivals.scale`` multiplies
    the values.
``requests``
    A request-level workload: a CSV or Parquet file of ``time_s, prompt_tokens, output_tokens``
    rows (one per request, times non-decreasing; production traces such as Azure's LLM inference
    traces have this shape). Each request is a fresh device (index = row, in time order) that asks
    for one response of exactly those lengths and leaves. ``arrivals.scale`` multiplies the
    arrival rate (times are divided by it), so one trace can be replayed at several loads.

Every process draws from its own random stream (spawn key ``ARRIVAL_STREAM``), so arrivals do not
disturb the devices' streams.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import simpy

from wispsim.config.limits import MAX_ARRIVAL_RATE, MAX_DEVICES, MAX_RESPONSES, MAX_SIM_SECONDS, MAX_TOKENS
from wispsim.errors import ConfigError
from wispsim.paths import traces_dir
from wispsim.registry import Registry
from wispsim.tabular import numeric_column, read_table

if TYPE_CHECKING:
    from wispsim.config import Scenario
    from wispsim.sim.context import RunContext

ARRIVAL_STREAM = 1_000_000_009

# (ctx, devices, start) -> None; ``start(index, once)`` creates device ``index`` and runs it
Starter = Callable[[int, bool], None]
ARRIVALS: Registry[Callable[..., Arrivals]] = Registry("arrival process")


@dataclass(frozen=True)
class ArrivalTrace:
    """A step function of time: ``values[i]`` holds on [times[i], times[i+1])."""

    times: np.ndarray
    values: np.ndarray
    source: str

    def at(self, t: float) -> float:
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        return float(self.values[max(i, 0)])

    @property
    def end(self) -> float:
        return float(self.times[-1])


def find_arrival_trace(name: str) -> Path:
    """The CSV file ``name`` names: a path, else a shipped trace (with or without .csv)."""
    p = Path(name)
    if p.is_file():
        return p
    for cand in (traces_dir() / name, traces_dir() / f"{name}.csv"):
        if cand.is_file():
            return cand
    return p


@cache
def _read(path: str, mtime: float) -> ArrivalTrace:
    df = read_table(path, kind="csv", columns=("time_s", "value"), comment="#")
    if df.empty:
        raise ConfigError(path, "", "no rows; an arrival trace has time_s,value rows")
    t = numeric_column(df, "time_s", path, lo=0, hi=MAX_SIM_SECONDS)
    v = numeric_column(df, "value", path, lo=0, hi=max(MAX_DEVICES, MAX_ARRIVAL_RATE))
    back = np.flatnonzero(np.diff(t) <= 0)
    if back.size:
        i = int(back[0]) + 1
        raise ConfigError(
            path, "time_s", f"row {i + 1}: times must increase strictly, got {t[i]:g} after {t[i - 1]:g}"
        )
    return ArrivalTrace(t, v, path)


def check_values(trace: ArrivalTrace, kind: str, scale: float = 1.0) -> np.ndarray:
    """The trace's values times ``scale``, checked for ``kind``: a concurrency is a whole number
    of devices (after scaling) up to MAX_DEVICES; a rate is at most MAX_ARRIVAL_RATE responses/s.
    Errors name the trace's file, the row and the scaled value."""
    v = trace.values * scale
    by = f" (value {{}} x arrivals.scale {scale:g})" if scale != 1 else ""
    if kind == "concurrency":
        near = np.round(v)
        frac = np.flatnonzero(np.abs(v - near) > 1e-9 * np.maximum(1.0, np.abs(v)))
        if frac.size:
            i = int(frac[0])
            raise ConfigError(
                trace.source,
                "value",
                f"row {i + 1}: a concurrency trace gives whole devices, got {v[i]:g}"
                + by.format(f"{trace.values[i]:g}"),
            )
        v, limit, what = near, float(MAX_DEVICES), "devices"
    else:
        limit, what = MAX_ARRIVAL_RATE, "responses/s"
    over = np.flatnonzero(v > limit)
    if over.size:
        i = int(over[0])
        raise ConfigError(
            trace.source,
            "value",
            f"row {i + 1}: at most {limit:,.0f} {what} for a {kind} trace, got {v[i]:g}"
            + by.format(f"{trace.values[i]:g}"),
        )
    return v


def load_arrival_trace(
    name: str, source: str = "scenario", kind: str | None = None, scale: float = 1.0
) -> ArrivalTrace:
    """An arrival trace by path or shipped name (``traces/NAME.csv``); errors name the file.

    Times must be finite, >= 0, strictly increasing and at most MAX_SIM_SECONDS; values finite,
    >= 0 and at most MAX_DEVICES. With ``kind`` the values times ``scale`` are also checked by
    :func:`check_values`."""
    p = find_arrival_trace(name)
    if not p.is_file():
        raise ConfigError(
            source, "arrivals.trace", f"arrival trace {name!r} not found (a CSV path or a name in traces/)"
        )
    trace = _read(str(p.resolve()), p.stat().st_mtime)
    if kind is not None:
        check_values(trace, kind, scale)
    return trace


class Arrivals:
    """Base: starts devices. ``n`` is the pool: how many distinct device indices a closed run uses."""

    open = False

    def __init__(self, ctx: RunContext, n: int) -> None:
        self.ctx = ctx
        self.n = n
        self.rng = np.random.default_rng(np.random.SeedSequence(ctx.seed, spawn_key=(ARRIVAL_STREAM,)))

    def start(self, launch: Starter) -> None:
        raise NotImplementedError

    def gate(self, index: int) -> simpy.Event | None:
        """None if device ``index`` may start a response now, else an event to wait for."""
        return None

    @property
    def gates(self) -> bool:
        """Whether :meth:`gate` may ever hold a device back: a process that overrides it."""
        return type(self).gate is not Arrivals.gate

    def lengths(self, index: int) -> tuple[int, int] | None:
        """(prompt, output) tokens of device ``index``'s response where the arrival process sets
        them (``requests``), else None: the workload's distributions draw them."""
        return None


@ARRIVALS.register("closed")
class Closed(Arrivals):
    """``closed``: N devices, all started at once, each looping forever."""

    def start(self, launch: Starter) -> None:
        for i in range(self.n):
            launch(i, False)


class _Open(Arrivals):
    open = True

    def start(self, launch: Starter) -> None:
        self.ctx.env.process(self._spawn(launch))

    def _times(self) -> Generator[float, None, None]:
        raise NotImplementedError

    def _spawn(self, launch: Starter) -> Generator[Any, Any, None]:
        env = self.ctx.env
        for i, t in enumerate(map(float, self._times())):  # the clock runs on Python floats
            if t > env.now:
                yield env.timeout(t - env.now)
            launch(i, True)


@ARRIVALS.register("poisson")
class Poisson(_Open):
    """``poisson``: one-response sessions arriving at ``arrivals.rate`` per second."""

    def _times(self) -> Generator[float, None, None]:
        rate = self.ctx.scenario.arrivals.rate
        t = 0.0
        while True:
            t += float(self.rng.exponential(1.0 / rate))
            yield t


class _Traced(Arrivals):
    def __init__(self, ctx: RunContext, n: int) -> None:
        super().__init__(ctx, n)
        a = ctx.scenario.arrivals
        assert a.trace is not None
        self.trace = load_arrival_trace(a.trace)
        self.values = check_values(self.trace, a.kind, a.scale)


@ARRIVALS.register("trace")
def traced(ctx: RunContext, n: int) -> Arrivals:
    """``trace``: a concurrency or a rate trace, by ``arrivals.kind``."""
    kind = ctx.scenario.arrivals.kind
    return TracedConcurrency(ctx, n) if kind == "concurrency" else TracedRate(ctx, n)


class TracedConcurrency(_Traced):
    """Devices 0..target-1 active; the pool is as large as the trace's peak."""

    def __init__(self, ctx: RunContext, n: int) -> None:
        super().__init__(ctx, n)
        self.n = max(1, math.ceil(float(self.values.max()) - 1e-9))
        self.target = 0
        self._waiting: dict[int, simpy.Event] = {}

    def start(self, launch: Starter) -> None:
        self.target = round(float(self.values[0])) if self.trace.times[0] <= 0 else 0
        for i in range(self.n):
            launch(i, False)
        self.ctx.env.process(self._follow())

    def gate(self, index: int) -> simpy.Event | None:
        if index < self.target:
            return None
        ev = self._waiting.get(index)
        if ev is None:
            ev = self._waiting[index] = self.ctx.env.event()
        return ev

    def _follow(self) -> Generator[Any, Any, None]:
        env = self.ctx.env
        for t, v in zip(self.trace.times.tolist(), self.values.tolist(), strict=True):
            if t > env.now:
                yield env.timeout(t - env.now)
            self.target = round(float(v))
            for i in [i for i in self._waiting if i < self.target]:
                self._waiting.pop(i).succeed()


class TracedRate(_Traced, _Open):
    """Poisson arrivals whose rate is the trace's step function: within each step a homogeneous
    Poisson process at that step's rate (exact, by memorylessness); steps at rate 0 are skipped,
    and nothing arrives after the trace's end when its last value is 0."""

    def _times(self) -> Generator[float, None, None]:
        times, values = self.trace.times, self.values
        for i, rate in enumerate(values):
            start = float(times[i])
            end = float(times[i + 1]) if i + 1 < len(times) else math.inf
            if rate <= 0:
                continue
            t = start
            while True:
                t += float(self.rng.exponential(1.0 / float(rate)))
                if t >= end:
                    break
                yield t


@dataclass(frozen=True)
class RequestTrace:
    """A request-level workload: arrival time and lengths of each request, in time order."""

    times: np.ndarray
    prompts: np.ndarray
    outputs: np.ndarray
    source: str

    @property
    def end(self) -> float:
        return float(self.times[-1])


REQUEST_COLUMNS = ("time_s", "prompt_tokens", "output_tokens")


@cache
def _read_requests(path: str, mtime: float) -> RequestTrace:
    csv = not path.endswith((".parquet", ".pq"))
    extra = {"comment": "#"} if csv else {}
    df = read_table(path, kind="csv" if csv else "parquet", columns=REQUEST_COLUMNS, **extra)
    if df.empty:
        raise ConfigError(path, "", "no rows; a request trace has time_s,prompt_tokens,output_tokens rows")
    if len(df) > MAX_RESPONSES:
        raise ConfigError(path, "", f"{len(df):,} requests; allowed: <= {MAX_RESPONSES:,}")
    t = numeric_column(df, "time_s", path, lo=0, hi=MAX_SIM_SECONDS)
    p = numeric_column(df, "prompt_tokens", path, integer=True, lo=1, hi=MAX_TOKENS)
    o = numeric_column(df, "output_tokens", path, integer=True, lo=1, hi=MAX_TOKENS)
    back = np.flatnonzero(np.diff(t) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise ConfigError(
            path, "time_s", f"row {i + 1}: times must not decrease, got {t[i]:g} after {t[i - 1]:g}"
        )
    return RequestTrace(t, p.astype(np.int64), o.astype(np.int64), path)


def load_request_trace(name: str, source: str = "scenario") -> RequestTrace:
    """A request trace by path or shipped name (``traces/NAME.csv``); errors name the file."""
    p = find_arrival_trace(name)
    if not p.is_file():
        raise ConfigError(
            source,
            "arrivals.trace",
            f"request trace {name!r} not found (a CSV/Parquet path or a name in traces/)",
        )
    return _read_requests(str(p.resolve()), p.stat().st_mtime)


@ARRIVALS.register("requests")
class Requests(_Open):
    """``requests``: one fresh device per row of a request trace, with that row's lengths."""

    def __init__(self, ctx: RunContext, n: int) -> None:
        super().__init__(ctx, n)
        a = ctx.scenario.arrivals
        assert a.trace is not None
        self.requests = load_request_trace(a.trace)
        self.scale = a.scale

    def _times(self) -> Generator[float, None, None]:
        for t in self.requests.times:
            yield float(t) / self.scale

    def lengths(self, index: int) -> tuple[int, int] | None:
        r = self.requests
        return int(r.prompts[index]), int(r.outputs[index])


def make_arrivals(ctx: RunContext, n: int) -> Arrivals:
    """The scenario's arrival process for a run with ``n`` devices."""
    factory = ARRIVALS.get(ctx.scenario.arrivals.process, field="arrivals.process")
    return factory(ctx, n)


# --------------------------------------------------------------------------------------------
# The bursty stress trace of SPEC 7
# --------------------------------------------------------------------------------------------


def bursty_trace(
    duration_s: float = 1800.0,
    step_s: float = 5.0,
    low: float = 10.0,
    high: float = 55.0,
    period_s: float = 1800.0,
    peaks: tuple[tuple[float, float], ...] = ((420.0, 110.0), (960.0, 155.0), (1440.0, 215.0)),
    rise_s: float = 30.0,
    hold_s: float = 60.0,
    decay_s: float = 90.0,
    noise: float = 0.05,
    seed: int = 0,
) -> pd.DataFrame:
    """A diurnal baseline between ``low`` and ``high`` concurrent requests (one cosine period of
    ``period_s``, lowest at t = 0) with bursts: each rises linearly over ``rise_s`` to its peak
    (total concurrency, baseline included), holds ``hold_s``, and decays exponentially back to
    the baseline with time constant ``decay_s / 3``. ``noise`` is the relative std of a
    multiplicative jitter on the baseline. Values are rounded to whole devices."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, duration_s + 1e-9, step_s)
    base = low + (high - low) * 0.5 * (1 - np.cos(2 * np.pi * t / period_s))
    base = base * np.clip(1 + noise * rng.standard_normal(t.size), 0.5, 1.5)
    total = base.copy()
    for t_peak, peak in peaks:
        t0 = t_peak - rise_s
        extra = np.zeros_like(t)
        ramp = (t >= t0) & (t < t_peak)
        extra[ramp] = (t[ramp] - t0) / rise_s
        extra[(t >= t_peak) & (t < t_peak + hold_s)] = 1.0
        tail = t >= t_peak + hold_s
        extra[tail] = np.exp(-(t[tail] - t_peak - hold_s) / (decay_s / 3))
        # blend from the baseline to the peak value, so the plateau sits exactly at ``peak``
        total = np.maximum(total, base + extra * (peak - base))
    return pd.DataFrame({"time_s": t, "value": np.maximum(np.round(total), 0).astype(int)})


def driven_by_trace(sc: Scenario, process: str, path: str, kind: str, tail: float, source: str) -> Scenario:
    """``sc`` with its arrivals read from a trace (``process`` trace: ``kind`` concurrency or
    rate; ``process`` requests: a request trace), measured from the trace's start over its span
    plus ``tail`` seconds (the last value holding). ``source`` names the option or file."""
    if process == "requests":
        end = load_request_trace(path, source).end / sc.arrivals.scale
        arr = dataclasses.replace(sc.arrivals, process="requests", trace=path)
    else:
        end = load_arrival_trace(path, source).end
        arr = dataclasses.replace(sc.arrivals, process="trace", trace=path, kind=kind)  # type: ignore[arg-type]
    return sc.with_arrivals(arr, end + tail)

"""Option values: every numeric option is parsed by one of these (typer's ``parser=``), so each
rejects text, NaN, infinities and out-of-range values the same way, in one line naming itself; and
the parsers of the option strings (``2,4,6,8``, ``10:200:10``, ``2:500,4:500``) and the checks
that options fit together. Each raises a one-line :class:`~wispsim.errors.ConfigError`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from wispsim.config import POLICY_NAMES, DeviceGroup
from wispsim.config.limits import (
    MAX_DEVICES,
    MAX_REPLICAS,
    MAX_SEED,
    MAX_SIM_SECONDS,
    finite,
)
from wispsim.errors import ConfigError

#: Parallel simulations (local processes or Ray tasks in flight) one command may ask for.
MAX_JOBS = 1024
#: Seeds per point (common random numbers) and N values in one grid.
MAX_SEEDS = 10_000
MAX_GRID = 10_000
#: Repetitions a measurement command may ask for (bootstrap resamples, timed calls, runs ...).
MAX_REPEATS = 10_000_000


def _show(value: Any) -> str:
    """A value as the message quotes it: text in quotes, numbers plainly."""
    if isinstance(value, str):
        return repr(value.strip())
    return f"{value:g}" if isinstance(value, float) else str(value)


def _to_float(value: Any) -> float:
    """``value`` (option text or a default) as a finite float, or ValueError with the reason."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    try:
        x = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"expected a number, got {_show(value)}") from None
    if not finite(x):
        raise ValueError(f"must be a finite number, got {_show(value)}")
    return x


def _to_int(value: Any) -> int:
    """``value`` as an int: ``12``, ``1e3`` and ``4.0`` are whole numbers; ``1.5``, ``nan`` are not."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())  # exact, however large
        except ValueError:
            pass
    try:
        x = _to_float(value)
    except ValueError as e:
        raise ValueError(str(e).replace("a number", "a whole number")) from None
    if not x.is_integer():
        raise ValueError(f"must be a whole number, got {_show(value)}")
    return int(x)


def _check_range(
    x: float, lo: float | None, hi: float | None, lo_open: bool, hi_open: bool, why: str, interval: bool
) -> None:
    """ValueError ``must be >= lo, got x`` (or ``in [lo, hi)``) when ``x`` is out of bounds."""
    low_bad = lo is not None and (x <= lo if lo_open else x < lo)
    high_bad = hi is not None and (x >= hi if hi_open else x > hi)
    if not (low_bad or high_bad):
        return
    if interval and lo is not None and hi is not None:
        lb, rb = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ValueError(f"must be in {lb}{_show(lo)}, {_show(hi)}{rb}, got {_show(x)}")
    if low_bad:
        raise ValueError(f"must be {'>' if lo_open else '>='} {_show(lo)}, got {_show(x)}")
    note = f" ({why})" if why else ""
    raise ValueError(f"must be {'<' if hi_open else '<='} {_show(hi)}{note}, got {_show(x)}")


def whole(lo: int | None = None, hi: int | None = None, why: str = "") -> Callable[[Any], int]:
    """A parser for an integer option in ``[lo, hi]`` (``why``: what the upper bound is): accepts
    ``12``, ``1e3``, ``4.0``; refuses other text, fractions, NaN and infinities with a ValueError,
    which typer reports as a bad value of that option (one line through ``main``)."""

    def parse(value: Any) -> int:
        n = _to_int(value)
        _check_range(n, lo, hi, False, False, why, interval=False)
        return n

    return parse


def real(
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    why: str = "",
) -> Callable[[Any], float]:
    """A parser for a float option within the bounds (``lo_open``: ``> lo``); refuses text, NaN and
    infinities. Scientific notation (``1e3``) is a number."""

    def parse(value: Any) -> float:
        x = _to_float(value)
        _check_range(x, lo, hi, lo_open, hi_open, why, interval=not why)
        return x

    return parse


#: The parsers the commands share, by meaning.
SEED = whole(0, MAX_SEED, "NumPy seeds")
SEEDS = whole(1, MAX_SEEDS)
JOBS = whole(1, MAX_JOBS)
DEVICES = whole(1, MAX_DEVICES, "the most devices one run may simulate")
REPLICAS = whole(1, MAX_REPLICAS, "the most verifier replicas one run may have")
FRACTION_OPEN = real(0, 1, hi_open=True)  # epsilon: [0, 1)
FRACTION = real(0, 1)
POSITIVE = real(0, lo_open=True)
NON_NEGATIVE = real(0)
SECONDS = real(0, MAX_SIM_SECONDS, lo_open=True, why="the longest simulated time")
TAIL_SECONDS = real(0, MAX_SIM_SECONDS, why="the longest simulated time")
ScenarioArg = Annotated[
    Path | None, typer.Argument(help="Scenario YAML (merged over the default scenario).", show_default=False)
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Override a scenario field, e.g. --set server.verifier.delta_ms=3 (repeatable)."
    ),
]
OutOpt = Annotated[
    Path | None, typer.Option("--out", "-o", help="Output folder (default: a new folder under results/).")
]
JobsOpt = Annotated[
    int,
    typer.Option(
        "--jobs", "-j", help="Parallel simulations (local processes, or Ray tasks in flight).", parser=JOBS
    ),
]
BackendOpt = Annotated[str, typer.Option(help="Where simulations run: local (process pool) or ray.")]
AddressOpt = Annotated[
    str | None, typer.Option(help="Ray cluster address (with --backend ray; default: a local Ray instance).")
]
PolicyOpt = Annotated[str | None, typer.Option(help=f"Policy preset: {', '.join(POLICY_NAMES)}.")]
RouterOpt = Annotated[str | None, typer.Option(help="round-robin, least-work or affinity.")]
StartOpt = Annotated[
    int,
    typer.Option(
        help="First N of the doubling bracket where the fluid model gives no first estimate (the "
        "search starts at the estimate otherwise: the table's estimate column).",
        parser=DEVICES,
    ),
]
MaxDevicesOpt = Annotated[int, typer.Option(help="Largest N the search tries.", parser=DEVICES)]
SeedsOpt = Annotated[int, typer.Option(help="Seeds per N (common random numbers across N).", parser=SEEDS)]
FirstSeedOpt = Annotated[int | None, typer.Option("--seed", help="First seed.", parser=SEED)]
EpsilonOpt = Annotated[float | None, typer.Option(help="Allowed violation rate.", parser=FRACTION_OPEN)]


def parse_classes(text: str | None, option: str = "--classes") -> tuple[float, ...] | None:
    """``2,4,6,8`` -> SLO classes in tokens/s; None when the option was not given."""
    if text is None:
        return None
    vals = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        try:
            v = float(tok)
        except ValueError:
            raise ConfigError(
                option, "", f"expected comma-separated token speeds like 2,4,6,8, got {text!r}"
            ) from None
        if not finite(v) or v <= 0:
            raise ConfigError(option, "", f"token speeds must be finite numbers > 0, got {tok!r}")
        if v in vals:  # a run would count its devices and responses twice
            raise ConfigError(option, "", f"{tok} is given twice; each class once, e.g. 2,4,6,8")
        vals.append(v)
    if not vals:
        raise ConfigError(option, "", f"expected comma-separated token speeds like 2,4,6,8, got {text!r}")
    return tuple(vals)


def parse_devices(text: str | None, option: str = "--devices") -> tuple[int, ...]:
    """``10:200:10`` (inclusive range) or ``10,20,50``; each N in ``1 .. MAX_DEVICES``."""
    if text is None or not text.strip():
        if text is not None:
            raise ConfigError(option, "", "expected LO:HI:STEP or a list like 10,20,50, got ''")
        return ()
    usage = f"expected LO:HI:STEP or a list like 10,20,50 with values >= 1, got {text!r}"
    try:
        if ":" in text:
            parts = [_to_int(p) for p in text.split(":")]
            if len(parts) == 2:
                parts.append(1)
            if len(parts) != 3:
                raise ValueError
            lo, hi, step = parts
            if lo < 1 or hi < lo or step < 1:
                raise ValueError
            vals: tuple[int, ...] = ()
            count = (hi - lo) // step + 1
        else:
            vals = tuple(sorted({_to_int(p) for p in text.split(",") if p.strip()}))
            if not vals or vals[0] < 1:
                raise ValueError
            lo, hi, count = vals[0], vals[-1], len(vals)
    except ValueError:
        raise ConfigError(option, "", usage) from None
    if hi > MAX_DEVICES:
        raise ConfigError(
            option, "", f"N must be <= {MAX_DEVICES} (the most devices one run may simulate), got {hi}"
        )
    if count > MAX_GRID:
        raise ConfigError(option, "", f"a grid of at most {MAX_GRID} values, got {count} from {text!r}")
    return vals or tuple(range(lo, hi + 1, step))


def parse_policies(text: str, option: str = "--policies") -> list[str]:
    """``wisp,sled`` -> policy preset names, each checked; errors name ``option``."""
    pols = [p.strip() for p in text.split(",") if p.strip()]
    for p in pols:
        if p not in POLICY_NAMES:
            raise ConfigError(option, "", f"unknown policy {p!r}; allowed: {', '.join(POLICY_NAMES)}")
    if not pols:
        raise ConfigError(option, "", f"needs at least one policy; allowed: {', '.join(POLICY_NAMES)}")
    twice = sorted({p for p in pols if pols.count(p) > 1})
    if twice:
        raise ConfigError(option, "", f"{twice[0]!r} is named twice; give each policy once")
    return pols


def parse_fleet(text: str, option: str = "--fleet") -> tuple[DeviceGroup, ...]:
    """``2:500,4:500`` -> device groups (class:count)."""
    groups = []
    for part in text.split(","):
        try:
            slo_s, cnt_s = part.split(":")
            slo, cnt = float(slo_s), _to_int(cnt_s)
            if not finite(slo) or slo <= 0 or cnt < 0 or cnt > MAX_DEVICES:
                raise ValueError
            g = DeviceGroup(count=cnt, slo=slo, name=f"{slo:g} tok/s")
        except (ValueError, ConfigError):
            raise ConfigError(
                option,
                "",
                f"expected CLASS:COUNT pairs like 2:500,4:500 (class a finite number > 0, "
                f"count 0 .. {MAX_DEVICES}), got {part!r}",
            ) from None
        groups.append(g)
    total = sum(g.count for g in groups)
    if total < 1:
        raise ConfigError(option, "", "needs at least one device")
    if total > MAX_DEVICES:
        raise ConfigError(option, "", f"{total} devices; at most {MAX_DEVICES} in one run")
    return tuple(groups)

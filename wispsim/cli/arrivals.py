"""``wispsim arrivals generate|show``: arrival traces (time_s,value CSVs) for ``run --arrivals``."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from wispsim.cli.common import console, table
from wispsim.cli.options import NON_NEGATIVE, SECONDS, SEED, TAIL_SECONDS, real
from wispsim.config.limits import MAX_DEVICES, MAX_SIM_SECONDS, finite
from wispsim.errors import ConfigError
from wispsim.provenance import command_line
from wispsim.results import check_output_file, writing
from wispsim.runs.resolve import check_series_step

arrivals_app = typer.Typer(help="Generate and inspect arrival traces.", no_args_is_help=True)
SPEC_PEAKS = "420:110,960:155,1440:215"  # SPEC 7: bursts peaking at about 110, 155 and 215
CONCURRENCY = real(0, MAX_DEVICES, why="the most devices one run may simulate")


def parse_peaks(text: str) -> tuple[tuple[float, float], ...]:
    """``420:110,960:155`` -> ((420, 110), (960, 155)); empty for ``none``."""
    if text.strip().lower() in ("", "none"):
        return ()
    out = []
    for part in text.split(","):
        try:
            t, v = (float(x) for x in part.split(":"))
        except ValueError:
            raise ConfigError(
                "--peaks", "", f"expected TIME:VALUE pairs like 420:110,960:155, got {part!r}"
            ) from None
        if not (finite(t) and finite(v)) or t < 0 or v < 0:
            raise ConfigError("--peaks", "", f"times and values must be finite numbers >= 0, got {part!r}")
        if t > MAX_SIM_SECONDS or v > MAX_DEVICES:
            raise ConfigError(
                "--peaks", "", f"times <= {MAX_SIM_SECONDS:g} s and values <= {MAX_DEVICES}, got {part!r}"
            )
        out.append((t, v))
    return tuple(out)


@arrivals_app.command("generate")
def generate(
    out: Annotated[Path, typer.Option("--out", "-o", help="CSV to write (time_s,value).")],
    duration: Annotated[float, typer.Option(help="Length of the trace (s).", parser=SECONDS)] = 1800.0,
    step: Annotated[float, typer.Option(help="Time between rows (s).", parser=SECONDS)] = 5.0,
    low: Annotated[
        float, typer.Option(help="Diurnal baseline minimum (concurrent requests).", parser=CONCURRENCY)
    ] = 10.0,
    high: Annotated[float, typer.Option(help="Diurnal baseline maximum.", parser=CONCURRENCY)] = 55.0,
    period: Annotated[float, typer.Option(help="Period of the diurnal cosine (s).", parser=SECONDS)] = 1800.0,
    peaks: Annotated[
        str, typer.Option(help="Bursts as TIME:PEAK pairs, or none.")
    ] = "420:110,960:155,1440:215",
    rise: Annotated[float, typer.Option(help="Ramp-up of each burst (s).", parser=SECONDS)] = 30.0,
    hold: Annotated[
        float, typer.Option(help="Time each burst holds its peak (s).", parser=TAIL_SECONDS)
    ] = 60.0,
    decay: Annotated[
        float, typer.Option(help="Decay back to the baseline (s, about 3 time constants).", parser=SECONDS)
    ] = 90.0,
    noise: Annotated[
        float, typer.Option(help="Relative jitter of the baseline.", parser=NON_NEGATIVE)
    ] = 0.05,
    seed: Annotated[int, typer.Option(help="Seed of the jitter.", parser=SEED)] = 0,
) -> None:
    """A diurnal baseline with bursts (SPEC 7's stress trace by default) as a concurrency trace."""
    from wispsim.sim.arrivals import bursty_trace

    check_output_file(out, "--out")  # before any work
    if not low <= high:
        raise ConfigError("--low", "", f"needs 0 <= low <= high, got {low:g} and {high:g}")
    check_series_step(step, duration, "--step")
    bursts = parse_peaks(peaks)
    df = bursty_trace(duration, step, low, high, period, bursts, rise, hold, decay, noise, seed)
    meta = {
        "what": "concurrency trace: value = concurrent requests (active devices) from time_s on (a step)",
        "generator": "wispsim.sim.arrivals.bursty_trace",
        "command": command_line(),
        "parameters": {
            "duration_s": duration,
            "step_s": step,
            "low": low,
            "high": high,
            "period_s": period,
            "peaks": [list(p) for p in bursts],
            "rise_s": rise,
            "hold_s": hold,
            "decay_s": decay,
            "noise": noise,
            "seed": seed,
        },
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "rows": len(df),
        "min": int(df.value.min()),
        "max": int(df.value.max()),
    }
    with writing("--out", out):
        out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out, index=False)
        Path(str(out) + ".meta.json").write_text(json.dumps(meta, indent=1))
    console.print(
        f"{out}: {len(df)} rows, {duration:g} s, {int(df.value.min())}-{int(df.value.max())} concurrent"
    )


@arrivals_app.command("show")
def show(trace: Annotated[str, typer.Argument(help="A time_s,value CSV or a name in traces/.")]) -> None:
    """Span, range and bursts of an arrival trace."""
    from wispsim.analysis.timeseries import trace_peaks
    from wispsim.sim.arrivals import load_arrival_trace

    tr = load_arrival_trace(trace, "arrivals show")
    v = tr.values
    console.print(
        f"{tr.source}: {len(v)} rows over {tr.end:g} s; value min {v.min():g}, "
        f"mean {v.mean():.1f} (by row), max {v.max():g}"
    )
    peaks = trace_peaks(tr)
    rows = [
        (str(i), f"{pt:g}", f"{pv:g}")
        for i, (pt, pv) in enumerate(zip(peaks.peak_t, peaks.peak_value, strict=True), 1)
    ]
    bursts = pd.DataFrame(rows, columns=["peak", "time (s)", "value"])
    console.print(table(bursts, "bursts (prominence >= a quarter of the range)"))

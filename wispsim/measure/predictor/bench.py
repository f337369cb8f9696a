"""Single-sample latency of rejection predictors (``wispsim predictor bench``).

A device asks its predictor once per drafted token, one feature row at a time, so what matters is
the latency of one call, not throughput. Each exported predictor is timed as the simulator runs
it (NumPy, :mod:`wispsim.model.predictor`) and, when its native library model was saved beside
it, as the library runs it, single-threaded as an edge device would.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.measure.predictor.export import native_path, require_ml
from wispsim.model.predictor import load_exported


def cpu_name() -> str:
    """The CPU's model name (for benchmark reports)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_calls(fn: Any, calls: int = 1000, warmup: int = 50) -> dict[str, float]:
    """Latency statistics of ``fn()`` over ``calls`` calls, in microseconds."""
    for _ in range(warmup):
        fn()
    t = np.empty(calls)
    for i in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        t[i] = time.perf_counter_ns() - t0
    us = t / 1e3
    return {
        "mean_us": float(us.mean()),
        "median_us": float(np.median(us)),
        "std_us": float(us.std()),
        "min_us": float(us.min()),
        "max_us": float(us.max()),
        "p95_us": float(np.percentile(us, 95)),
        "p99_us": float(np.percentile(us, 99)),
    }


def bench(paths: list[Path], calls: int = 1000, native: bool = True) -> pd.DataFrame:
    """Single-sample latency of each exported predictor (NumPy) and, if saved, its native model.

    The input is one realistic feature row (confident draft: top-1 0.7, entropy 1.0, margin 0.4,
    logit std 4.0); a device asks the predictor once per drafted token, one row at a time. Native
    models run single-threaded (``n_jobs=1``), as an edge device would run them.
    """
    rows = []
    for path in paths:
        model = load_exported(str(path))
        x = np.array([[0.7, 1.0, 0.4, 4.0, 0.0][: len(model.features)]])
        rows.append(
            {
                "predictor": path.name,
                "kind": model.kind,
                "impl": "numpy",
                **time_calls(lambda m=model, x=x: m.predict_accept(x), calls),
            }
        )
        nat = native_path(path)
        if native and nat.is_file():
            lib = require_ml("joblib").load(nat)
            if "n_jobs" in lib.get_params():  # one row: thread start-up would dominate
                lib.set_params(n_jobs=1)
            rows.append(
                {
                    "predictor": path.name,
                    "kind": model.kind,
                    "impl": "native",
                    **time_calls(lambda m=lib, x=x: m.predict_proba(x), calls),
                }
            )
    return pd.DataFrame(rows)

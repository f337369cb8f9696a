"""``wispsim bench --compare REAL.json``: a real ``vllm bench serve --save-result`` file re-created
on the simulated server, and the figures set side by side.

The file gives the workload: the requests (``num_prompts``, or ``completed`` where some failed),
their lengths (``input_lens``/``output_lens`` of a ``--save-detailed`` file, else every request at
the mean, ``total_input_tokens`` and ``total_output_tokens`` over ``completed``), the
``request_rate``, ``burstiness``, ``max_concurrency`` and any ramp-up. The server is the one the
command's flags describe (a result file does not say how its server ran). Every figure both have
is printed real, simulated and the error (simulated / real - 1).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from wispsim.errors import ConfigError
from wispsim.runs.bench_flags import ramp_up

FIGURES = (
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p99")),
)


@dataclass(frozen=True)
class RealRun:
    source: str
    data: dict[str, Any]

    def client(self, base: Any) -> Any:
        """``base`` (a :class:`wispsim.runs.bench.Client`) with the real run's workload."""
        d, src = self.data, self.source
        n = _count(d, "completed", src)
        lengths = None
        if isinstance(d.get("input_lens"), list) and isinstance(d.get("output_lens"), list):
            ins, outs = d["input_lens"], d["output_lens"]
            if len(ins) != len(outs) or not all(isinstance(x, int) and x >= 1 for x in ins + outs):
                raise ConfigError(
                    src, "input_lens", "input_lens and output_lens must be equal-length positive integers"
                )
            lengths = (tuple(ins), tuple(outs))
            n = len(ins)
        rate = d.get("request_rate", "inf")
        if not (rate == "inf" or _positive(rate)):
            raise ConfigError(src, "request_rate", f'got {rate!r}; allowed: a number > 0 or "inf"')
        burst = d.get("burstiness", 1.0)
        if not _positive(burst):
            raise ConfigError(src, "burstiness", f"got {burst!r}; allowed: a number > 0")
        conc = d.get("max_concurrency")
        if conc is not None and (isinstance(conc, bool) or not isinstance(conc, int) or conc < 1):
            raise ConfigError(src, "max_concurrency", f"got {conc!r}; allowed: an integer >= 1 or null")
        ramp = None
        if d.get("ramp_up_strategy") is not None:
            ramp = ramp_up(d["ramp_up_strategy"], d.get("ramp_up_start_rps"), d.get("ramp_up_end_rps"), src)
        return replace(
            base,
            dataset_name="random",
            dataset_path=None,
            num_prompts=n,
            random_input_len=max(round(_count(d, "total_input_tokens", src) / n), 1),
            random_output_len=max(round(_count(d, "total_output_tokens", src) / n), 1),
            random_prefix_len=0,
            random_range_ratio=0.0,
            request_rate=str(rate),
            burstiness=float(burst),
            max_concurrency=conc,
            ramp_up=ramp,
            lengths=lengths,
        )

    def side_by_side(self, sim: dict[str, Any]) -> str:
        lines = ["{s:{c}^{n}}".format(s=f" Real ({Path(self.source).name}) vs simulated ", n=66, c="=")]
        lines.append(f"{'figure':<28} {'real':>11} {'simulated':>11} {'error':>10}")
        for k in FIGURES:
            real, s = self.data.get(k), sim.get(k)
            if not isinstance(real, int | float) or isinstance(real, bool) or not isinstance(s, int | float):
                continue
            err = f"{s / real - 1:+.1%}" if real and math.isfinite(real) else "-"
            lines.append(f"{k:<28} {real:>11.2f} {s:>11.2f} {err:>10}")
        lines.append("=" * 66)
        return "\n".join(lines)


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf


def _count(d: dict[str, Any], key: str, src: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(
            src, key, f"got {v!r}; allowed: a positive integer (a vllm bench serve result file)"
        )
    return v


def real_run(path: Path) -> RealRun:
    src = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError("--compare", src, f"cannot be read ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(src, "", f"not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(src, "", "a vllm bench serve result file is a JSON object")
    return RealRun(src, data)

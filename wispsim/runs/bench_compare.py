"""``wispsim bench --compare REAL.json``: a real ``vllm bench serve --save-result`` file re-created
on the simulated server, and the figures set side by side.

The file gives the workload, and the command may not set it too (:data:`WORKLOAD_FLAGS`): the
requests that completed (``completed``; failed ones are left out, and said), their lengths
(``input_lens``/``output_lens`` of a ``--save-detailed`` file, checked against ``completed``,
``failed`` and the token totals, and sent at its ``start_times``; else every request at the mean,
rounded so that the totals are the file's, and said), the ``request_rate`` (required: vLLM always
writes it), ``burstiness`` and ``max_concurrency`` (an older file without them: 1 and none, and
said) and any ramp-up. ``--random-prefix-len``, which no result file records, is the command's.
The server is the one the command's flags describe (a result file does not say how its server
ran). Every figure both have -- throughputs, goodput and each statistic of each percentile metric
-- is printed real, simulated and the error (simulated / real - 1). Beside them: vLLM's default
result file name, and whether a file's model is the command's.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from wispsim.config.limits import finite
from wispsim.errors import ConfigError
from wispsim.runs.bench_flags import Extras, ramp_up

THROUGHPUTS = (
    "duration",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
)
# mean_ttft_ms, std_itl_ms, p99.9_e2el_ms, ...: every statistic vLLM writes of a percentile metric
STATISTIC = re.compile(r"^(mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
# what a user may not set beside --compare: the file gives the workload (not --random-prefix-len,
# which a result file does not record: the tokens every prompt shares, the head of its input)
WORKLOAD_FLAGS = (
    "dataset_name",
    "dataset_path",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
)


@dataclass(frozen=True)
class RealRun:
    source: str
    data: dict[str, Any]

    def figures(self) -> list[str]:
        """The figures of the file to set beside the simulation's: throughputs, then every
        statistic of a percentile metric, each a number (else a one-line error)."""
        keys = [k for k in THROUGHPUTS if k in self.data]
        keys += [k for k in self.data if STATISTIC.match(k)]
        for k in keys:
            v = self.data[k]
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise ConfigError(self.source, k, f"got {v!r}; allowed: a number")
        return keys

    def client(self, base: Any) -> tuple[Any, list[str]]:
        """``base`` (a :class:`wispsim.runs.bench.Client`) with the real run's workload, and notes
        on what the file left to assumption."""
        d, src = self.data, self.source
        self.figures()
        notes: list[str] = []
        n = _count(d, "completed", src)
        failed = d.get("failed", 0)
        if isinstance(failed, bool) or not isinstance(failed, int) or failed < 0:
            raise ConfigError(src, "failed", f"got {failed!r}; allowed: an integer >= 0")
        lengths = _lengths(d, n, failed, src)
        prefix = base.random_prefix_len  # the command's: a result file does not record it
        total_in, total_out = (_count(d, k, src) for k in ("total_input_tokens", "total_output_tokens"))
        mean_in = round(total_in / n)
        shortest = min(lengths[0]) if lengths is not None else total_in // n
        if prefix and shortest <= prefix:
            raise ConfigError(
                "--random-prefix-len", "random_prefix_len",
                f"{prefix} is not shorter than the file's shortest prompt ({shortest} tokens)",
            )  # fmt: skip
        arrivals = _arrivals(d, src) if lengths is not None else None
        if arrivals is not None:
            notes.append("each request sent at the real run's start_times")
        if lengths is None:
            notes.append(
                f"{n} requests at the file's mean lengths (no input_lens/output_lens: a --save-detailed "
                "file gives each request's)"
            )
            # each at the mean, rounded so that the totals are the file's to the token
            lengths = (_even(total_in, n), _even(total_out, n))
        if failed:
            notes.append(
                f"{failed} of {n + failed} requests failed in the real run: the {n} completed are simulated"
            )
        if "request_rate" not in d:
            raise ConfigError(src, "request_rate", "is missing (vllm bench serve writes it)")
        rate = d["request_rate"]
        if not (rate == "inf" or _positive(rate)):
            raise ConfigError(src, "request_rate", f'got {rate!r}; allowed: a number > 0 or "inf"')
        for key, assumed in (("burstiness", "1 (Poisson)"), ("max_concurrency", "none")):
            if key not in d:
                notes.append(f"{key} not in the file (an older vLLM's): taken as {assumed}")
        burst = d.get("burstiness", 1.0)
        if not _positive(burst):
            raise ConfigError(src, "burstiness", f"got {burst!r}; allowed: a number > 0")
        conc = d.get("max_concurrency")
        if conc is not None and (isinstance(conc, bool) or not isinstance(conc, int) or conc < 1):
            raise ConfigError(src, "max_concurrency", f"got {conc!r}; allowed: an integer >= 1 or null")
        ramp = None
        if d.get("ramp_up_strategy") is not None:
            ramp = ramp_up(d["ramp_up_strategy"], d.get("ramp_up_start_rps"), d.get("ramp_up_end_rps"), src)
        client = replace(
            base,
            dataset_name="random",
            dataset_path=None,
            num_prompts=n,
            random_input_len=max(mean_in - prefix, 1),
            random_output_len=max(round(total_out / n), 1),
            random_range_ratio=0.0,
            request_rate=str(rate),
            burstiness=float(burst),
            max_concurrency=conc,
            ramp_up=ramp,
            lengths=lengths,
            arrivals=arrivals,
            self_timed=True if arrivals is not None else base.self_timed,
        )
        return client, notes

    def side_by_side(self, sim: dict[str, Any]) -> str:
        lines = ["{s:{c}^{n}}".format(s=f" Real ({Path(self.source).name}) vs simulated ", n=66, c="=")]
        lines.append(f"{'figure':<28} {'real':>11} {'simulated':>11} {'error':>10}")
        for k in self.figures():
            real, s = self.data.get(k), sim.get(k)
            if not isinstance(real, int | float) or isinstance(real, bool) or not isinstance(s, int | float):
                continue
            err = f"{s / real - 1:+.1%}" if real and math.isfinite(real) else "-"
            lines.append(f"{k:<28} {real:>11.2f} {s:>11.2f} {err:>10}")
        lines.append("=" * 66)
        return "\n".join(lines)


def _lengths(
    d: dict[str, Any], completed: int, failed: int, src: str
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The completed requests' (input, output) lengths of a --save-detailed file, checked against its
    counts and totals (vLLM lists every request sent; a failed one has output length 0), or None."""
    ins, outs = d.get("input_lens"), d.get("output_lens")
    if ins is None and outs is None:
        return None
    if not isinstance(ins, list) or not isinstance(outs, list):
        raise ConfigError(
            src, "input_lens" if outs is not None else "output_lens", "is missing: give both lists"
        )
    for key, xs, least in (("input_lens", ins, 1), ("output_lens", outs, 0)):
        bad = next(
            (i for i, x in enumerate(xs) if isinstance(x, bool) or not isinstance(x, int) or x < least), None
        )
        if bad is not None:
            raise ConfigError(src, f"{key}[{bad}]", f"got {xs[bad]!r}; allowed: an integer >= {least}")
    if not len(ins) == len(outs) == completed + failed:
        raise ConfigError(
            src,
            "input_lens",
            f"lists {len(ins)} and {len(outs)} requests; completed + failed is {completed + failed}",
        )
    done = [(i, o) for i, o in zip(ins, outs, strict=True) if o > 0]
    if len(done) != completed:
        raise ConfigError(src, "output_lens", f"{len(done)} requests have output, completed is {completed}")
    for key, total in (
        ("total_input_tokens", sum(i for i, _ in done)),
        ("total_output_tokens", sum(o for _, o in done)),
    ):
        if key in d and d[key] != total:
            raise ConfigError(src, key, f"got {d[key]!r}; the completed requests' lengths add up to {total}")
    return tuple(i for i, _ in done), tuple(o for _, o in done)


def _even(total: int, n: int) -> tuple[int, ...]:
    """``n`` whole lengths summing to ``total``, none more than one apart (at least 1 each)."""
    base, extra = divmod(total, n)
    return tuple(max(base + (i < extra), 1) for i in range(n))


def _arrivals(d: dict[str, Any], src: str) -> tuple[float, ...] | None:
    """The completed requests' send times from zero (a detailed file's ``start_times``), or None."""
    starts = d.get("start_times")
    if starts is None:
        return None
    outs = d["output_lens"]
    if not isinstance(starts, list) or len(starts) != len(outs):
        raise ConfigError(src, "start_times", f"must list one time per request ({len(outs)})")
    bad = next((i for i, t in enumerate(starts) if isinstance(t, bool) or not finite(t)), None)
    if bad is not None:
        raise ConfigError(src, f"start_times[{bad}]", f"got {starts[bad]!r}; allowed: a number (seconds)")
    t0 = min(starts)
    return tuple(float(t - t0) for t, o in zip(starts, outs, strict=True) if o > 0)


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


def vllm_file_name(label: str, client: Any, model: str) -> str:
    """vLLM's default result file name (``compute_result_filename``), ``{date}`` filled in later:
    LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json, or LABEL-ramp-up-STRATEGY-STARTqps-ENDqps... with a
    ramp-up; the rate as vLLM's float prints it (10.0, inf)."""
    conc = f"-concurrency{client.max_concurrency}" if client.max_concurrency is not None else ""
    base = model.rstrip("/").split("/")[-1]
    if client.ramp_up is not None:
        strategy, lo, hi = client.ramp_up
        lo_s, hi_s = (str(int(x)) if float(x).is_integer() else str(x) for x in (lo, hi))
        return f"{label}-ramp-up-{strategy}-{lo_s}qps-{hi_s}qps{conc}-{base}-{{date}}.json"
    rate = client.request_rate.strip().lower()
    word = "inf" if rate == "inf" else str(float(rate))
    return f"{label}-{word}qps{conc}-{base}-{{date}}.json"


def workload_extras(ex: Extras) -> list[tuple[str, Any]]:
    """vLLM's other flags that set the workload, and what they were given (None, False: not)."""
    return [
        ("--input-len", ex.input_len),
        ("--output-len", ex.output_len),
        ("--sharegpt-output-len", ex.sharegpt_output_len),
        ("--ramp-up-strategy", ex.ramp_up),
    ]


def same_model(served: str, model: str) -> bool:
    """Whether a result file's ``model_id`` and ``--model`` name one architecture (by name, hub id
    or a shipped architecture's hub id), as far as either can be resolved."""
    from wispsim.model.archs import find_arch

    names = []
    for m in (served, model):
        try:
            a = find_arch(m)
            names.append({a.name.lower(), a.hf_name.lower()})
        except ConfigError:
            names.append({m.lower(), m.rstrip("/").split("/")[-1].lower()})
    return bool(names[0] & names[1])

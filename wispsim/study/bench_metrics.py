"""What ``vllm bench serve`` reports of a benchmark, computed as vLLM 0.32 computes it
(``vllm/benchmarks/serve.py``: ``calculate_metrics`` and the result JSON), from a simulated one
(:class:`~wispsim.study.bench.BenchResult`).

- TTFT, TPOT (``(E2E - TTFT) / (output - 1)`` of the requests with more than one token), ITL
  (every gap between a request's consecutive chunks, pooled) and E2EL: mean, median, std and the
  ``--metric-percentiles`` of the ``--percentile-metrics`` (vLLM's keys: ``p99_itl_ms``,
  ``p99.9_ttft_ms``).
- ``request_goodput``: the requests that meet every ``--goodput`` SLO (``ttft``, ``tpot``,
  ``e2el`` in ms; a one-token request's TPOT counts as 0) per second of the benchmark.
- ``max_output_tokens_per_s`` ("Peak output token throughput") and ``max_concurrent_requests``
  ("Peak concurrent requests"): over one-second buckets from the first request sent, the chunks
  that arrived in a bucket and the requests running in it (vLLM counts a chunk as a token).
- ``client_queue_time`` and ``e2el_including_client_queue`` (``--percentile-metrics``): the wait
  for a ``--max-concurrency`` slot, and E2EL with it.
- ``--save-detailed`` keeps the per-request lists (``input_lens``, ``output_lens``, ``ttfts``,
  ``itls``, ``start_times``, ``generated_texts``, ``errors``); ``latencies`` and ``queue_times``
  (waiting for a ``--max-concurrency`` slot) are always written, as vLLM writes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wispsim.errors import ConfigError

METRICS = ("ttft", "tpot", "itl", "e2el")
EXTRA_METRICS = ("client_queue_time", "e2el_including_client_queue")
TITLES = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
    "client_queue_time": ("Client Queue Time", "Client Queue Time"),
    "e2el_including_client_queue": ("E2EL incl. Queue", "E2EL Including Client Queue"),
}
GOODPUT_SLOS = ("ttft", "tpot", "e2el")
DETAILED = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors")


@dataclass(frozen=True)
class Reporting:
    """What the client reports: ``--percentile-metrics`` and ``--metric-percentiles``, the
    ``--goodput`` SLOs (ms) and ``--save-detailed``."""

    percentile_metrics: tuple[str, ...] = METRICS
    percentiles: tuple[float, ...] = (99.0,)
    goodput: Mapping[str, float] = field(default_factory=dict)
    detailed: bool = False


def percentile_metrics(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in METRICS + EXTRA_METRICS]
    if bad or not names:
        raise ConfigError(
            "--percentile-metrics",
            "percentile_metrics",
            f"got {text!r}; allowed: a comma-separated subset of {','.join(METRICS + EXTRA_METRICS)}",
        )
    return names


def metric_percentiles(text: str) -> tuple[float, ...]:
    try:
        ps = tuple(float(x) for x in text.split(","))
    except ValueError:
        ps = ()
    if not ps or not all(0 <= p <= 100 for p in ps):
        raise ConfigError(
            "--metric-percentiles",
            "metric_percentiles",
            f"got {text!r}; allowed: comma-separated percentiles in [0, 100], e.g. 50,90,99",
        )
    return ps


def goodput_slos(pairs: Sequence[str]) -> dict[str, float]:
    """``--goodput ttft:500 tpot:50``: SLOs in ms, as vLLM parses them."""
    out: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        try:
            v = float(value) if sep else -1.0
        except ValueError:
            v = -1.0
        if name not in GOODPUT_SLOS or not v >= 0:
            raise ConfigError(
                "--goodput",
                "goodput",
                f"got {pair!r}; allowed: KEY:VALUE in ms, KEY one of {', '.join(GOODPUT_SLOS)}",
            )
        out[name] = v
    return out


def _word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def _peaks(
    start: np.ndarray, ttft: np.ndarray, e2el: np.ndarray, itls: list[np.ndarray]
) -> tuple[float, int]:
    """vLLM's peak output token throughput and peak concurrent requests (module text)."""
    if not len(start):
        return 0.0, 0
    t0 = start.min()
    n = int(np.ceil((start + e2el).max() - t0)) + 1
    chunk_t = np.concatenate(
        [np.cumsum(np.concatenate([[s + f], g])) for s, f, g in zip(start, ttft, itls, strict=True)]
    )
    buckets = (chunk_t - t0).astype(int)
    tokens = np.bincount(buckets[(buckets >= 0) & (buckets < n)], minlength=n)
    first, last = (start - t0).astype(int), (start + e2el - t0).astype(int)
    running = np.zeros(n + 1)
    np.add.at(running, first, 1)
    np.add.at(running, last + 1, -1)
    return float(tokens.max()), int(np.cumsum(running)[:n].max())


def vllm_result(res: Any, run: Any, rate: float | None, concurrency: int | None,
                rep: Reporting | None = None) -> dict[str, Any]:  # fmt: skip
    """The result keys ``vllm bench serve --save-result`` writes (module text) for a simulated
    benchmark ``res`` of ``run``; with ``rep`` None, every latency family at P99."""
    rep = rep or Reporting()
    r = res.responses
    start = r.t_start.to_numpy(float)
    ttft = (r.t_first - r.t_start).to_numpy(float)
    e2el = (r.t_end - r.t_start).to_numpy(float)
    outs = r.output_len.to_numpy()
    itls = res.itls() if res.chunk_times else [np.zeros(0)] * len(r)
    sent = res.sent if res.sent is not None else start
    queue = start - sent  # waiting for a --max-concurrency slot
    tpot_all = np.where(outs > 1, (e2el - ttft) / np.maximum(outs - 1, 1), 0.0)
    values = {
        "ttft": ttft,
        "tpot": tpot_all[outs > 1],
        "itl": np.concatenate(itls) if itls else np.zeros(0),
        "e2el": e2el,
        "client_queue_time": queue,
        "e2el_including_client_queue": e2el + queue,
    }
    ins = [int(x) for x in r.prompt_len] if "prompt_len" in r else list(run.input_lens[: len(r)])
    dur = res.duration
    good = np.ones(len(r), dtype=bool)
    for name, slo in rep.goodput.items():
        x = {"ttft": ttft, "tpot": tpot_all, "e2el": e2el}[name]
        good &= x <= slo / 1e3
    peak_tokens, peak_running = _peaks(start, ttft, e2el, itls)
    out: dict[str, Any] = {
        "duration": dur,
        "completed": len(r),
        "failed": 0,
        "total_input_tokens": int(sum(ins)),
        "total_output_tokens": int(outs.sum()),
        "request_throughput": len(r) / dur,
        "request_goodput": float(good.sum() / dur) if rep.goodput else None,
        "output_throughput": float(outs.sum()) / dur,
        "total_token_throughput": (float(outs.sum()) + sum(ins)) / dur,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_running,
        "max_concurrency": concurrency,
        "latencies": e2el.tolist(),
        "queue_times": queue.tolist(),
    }
    if rep.detailed:
        out |= {
            "input_lens": ins,
            "output_lens": outs.tolist(),
            "ttfts": ttft.tolist(),
            "itls": [g.tolist() for g in itls],
            "start_times": start.tolist(),
            "generated_texts": [""] * len(r),  # a simulated server generates no text
            "errors": [""] * len(r),
        }
    if "frontend_s" in r:  # wispsim's own: the mean TTFT by its parts
        from wispsim.study.bench import TTFT_PARTS

        out["ttft_parts_mean_ms"] = {p: float(r[f"{p}_s"].mean() * 1e3) for p in TTFT_PARTS}
    for name in rep.percentile_metrics:
        x = values[name]
        x = x[~np.isnan(x)] * 1e3
        some = len(x) > 0
        out[f"mean_{name}_ms"] = float(x.mean()) if some else 0.0  # vLLM: np.mean(values or 0)
        out[f"median_{name}_ms"] = float(np.median(x)) if some else 0.0
        out[f"std_{name}_ms"] = float(x.std()) if some else 0.0
        for p in rep.percentiles:
            out[f"p{_word(p)}_{name}_ms"] = float(np.percentile(x, p)) if some else 0.0
    return out

"""``GET /metrics``: a server's load in Prometheus' text format, as vLLM's ``/metrics`` gives it.

The figures are read from the server's state at scrape time (:meth:`VerifyServer.load`,
:meth:`CentralServer.load`): gauges for what is held now (sessions, rounds queued and waiting for
admission, the KV blocks admission reserves, the engine's KV use as ``kv_cache_usage_perc``, the
name vLLM uses), counters for what happened (``*_total``). Names carry a ``wispsim:`` prefix, as
vLLM's carry ``vllm:``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

HELP = {
    "sessions": "open verification sessions",
    "rounds_queued": "rounds waiting in the scheduler's queue",
    "batch_running_s": "seconds the batch now on the engine has run (0: none)",
    "admission_waiting": "rounds waiting for a KV reservation",
    "admission_sessions": "sessions holding a KV reservation",
    "admission_reserved_blocks": "KV blocks reserved by admitted sessions",
    "admission_limit_blocks": "KV blocks admission may reserve",
    "resident_sessions": "sessions kept in the engine (resident verifier)",
    "resident_evictions": "idle resident sessions ended to make room in the engine",
    "responses_live": "responses being generated (centralized)",
    "kv_cache_usage_perc": "share of the engine's KV blocks in use (vLLM's kv_cache_usage_perc)",
    "log_rows": "rows kept in the batch log",
    "log_dropped": "batch-log rows dropped from the ring",
}


def prometheus_text(load: Mapping[str, Any], mode: str, policy: str) -> tuple[str, str]:
    """The exposition text of ``load`` (gauges, and counters for ``*_total`` keys) and its media
    type; every sample is labelled with the server's mode and policy."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    labels = ["mode", "policy"]

    class _Load:
        def collect(self) -> Iterator[Any]:
            for key, value in load.items():
                if value is None or isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                if key.endswith("_total"):
                    name = key[: -len("_total")]
                    family: Any = CounterMetricFamily(f"wispsim:{name}", _help(name), labels=labels)
                else:
                    family = GaugeMetricFamily(f"wispsim:{key}", _help(key), labels=labels)
                family.add_metric([mode, policy], float(value))
                yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Load())  # type: ignore[arg-type]
    return generate_latest(registry).decode(), CONTENT_TYPE_LATEST


def _help(name: str) -> str:
    if name in HELP:
        return HELP[name]
    words = name.replace("_", " ")
    return f"{words} (count since the server started)"

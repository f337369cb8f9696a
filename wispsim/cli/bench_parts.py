"""``wispsim bench``'s printed parts: vLLM's result block, its default file name, and what
``--compare`` checks of the command beside the file."""

from __future__ import annotations

from typing import Any

from wispsim.cli.common import make_console
from wispsim.errors import ConfigError
from wispsim.runs.bench_flags import Extras

console = make_console()


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


def print_table(r: dict[str, Any], ex: Extras) -> None:
    """The block ``vllm bench serve`` prints, and the mean TTFT by its parts."""
    from wispsim.study.bench_metrics import TITLES

    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result (simulated) ", n=50, c="=")]

    def row(label: str, v: Any, fmt: str = "{:<10.2f}") -> None:
        lines.append(f"{label:<40} " + (fmt.format(v) if v is not None else "None"))

    row("Successful requests:", r["completed"], "{:<10}")
    row("Failed requests:", r["failed"], "{:<10}")
    if r.get("max_concurrency") is not None:
        row("Maximum request concurrency:", r["max_concurrency"], "{:<10}")
    if r.get("request_rate") not in (None, "inf"):
        row("Request rate configured (RPS):", r["request_rate"])
    row("Benchmark duration (s):", r["duration"])
    row("Total input tokens:", r["total_input_tokens"], "{:<10}")
    row("Total generated tokens:", r["total_output_tokens"], "{:<10}")
    row("Request throughput (req/s):", r["request_throughput"])
    if r.get("request_goodput") is not None:
        row("Request goodput (req/s):", r["request_goodput"])
    row("Output token throughput (tok/s):", r["output_throughput"])
    row("Peak output token throughput (tok/s):", r["max_output_tokens_per_s"])
    row("Peak concurrent requests:", r["max_concurrent_requests"])
    row("Total token throughput (tok/s):", r["total_token_throughput"])
    for name in ex.reporting.percentile_metrics:
        short, title = TITLES[name]
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        row(f"Mean {short} (ms):", r[f"mean_{name}_ms"])
        row(f"Median {short} (ms):", r[f"median_{name}_ms"])
        for p in ex.reporting.percentiles:
            word = str(int(p)) if int(p) == p else str(p)
            row(f"P{word} {short} (ms):", r[f"p{word}_{name}_ms"])
    if "ttft_parts_mean_ms" in r:
        lines.append("{s:{c}^{n}}".format(s="Mean TTFT by parts (simulated)", n=50, c="-"))
        for part, label in (
            ("frontend", "API server (front end)"),
            ("step_wait", "Wait for the next step"),
            ("queue", "Queueing (admission, token budget)"),
            ("prefill", "Prefill chunks"),
        ):
            row(f"{label} (ms):", r["ttft_parts_mean_ms"][part])
    lines.append("=" * 50)
    console.print("\n".join(lines), highlight=False, markup=False)


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

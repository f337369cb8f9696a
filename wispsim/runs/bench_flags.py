"""The rest of ``vllm bench serve``'s flags (vLLM 0.32), so that a pasted command line runs.

``wispsim bench`` declares the flags that shape the simulated server and the workload as typer
options; every other flag ``vllm bench serve`` takes is read here from the command line's extra
arguments, with vLLM's arity (``--goodput ttft:500 tpot:50``, ``--metadata k=v ...``,
``--flag=value``):

- :data:`HONOURED`: they change what is simulated or reported (the reporting flags, the result
  file's name and folder, the datasets' own flags, the ramp-up);
- :data:`CLIENT_ONLY`: they concern only the real client (where the server is, sampling
  parameters that do not change the lengths, tokenizer modes, plots): accepted and ignored, and
  the help says so;
- :data:`REFUSED`: they would change the workload in a way the simulator does not model (beam
  search, LoRA adapters, probe requests, reranker batches): refused by name when set.

An unknown flag is a one-line error, as vLLM's argparse would give.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wispsim.config.server import ATTENTION_BACKENDS
from wispsim.errors import ConfigError
from wispsim.study.bench_metrics import Reporting, goodput_slos, metric_percentiles, percentile_metrics

# flag -> number of values: 0 (a switch), 1, "*" (any) or "+" (one or more)
HONOURED: dict[str, int | str] = {
    "--percentile-metrics": 1,
    "--metric-percentiles": 1,
    "--goodput": "+",
    "--save-detailed": 0,
    "--append-result": 0,
    "--result-dir": 1,
    "--label": 1,
    "--metadata": "*",
    "--backend": 1,
    "--endpoint": 1,
    "--tokenizer": 1,
    "--input-len": 1,
    "--output-len": 1,
    "--sharegpt-output-len": 1,
    "--custom-output-len": 1,
    "--prefix-repetition-prefix-len": 1,
    "--prefix-repetition-suffix-len": 1,
    "--prefix-repetition-num-prefixes": 1,
    "--prefix-repetition-output-len": 1,
    "--disable-shuffle": 0,
    "--no-oversample": 0,
    "--self-timed": 0,
    "--no-self-timed": 0,
    "--ramp-up-strategy": 1,
    "--ramp-up-start-rps": 1,
    "--ramp-up-end-rps": 1,
    "--ignore-eos": 0,  # simulated outputs always run to their length, as with it
    "--skip-chat-template": 0,
    # vllm serve's: the latent-attention backend (wispsim.model.attention; server.engine.attention_backend)
    "--attention-backend": 1,
}
CLIENT_ONLY: dict[str, int | str] = {
    **dict.fromkeys(
        (
            "--trust-remote-code",
            "--no-stream",  # vLLM: do not load a hub dataset in streaming mode
            "--enable-multimodal-chat",
            "--custom-ensure-client-side-data",
            "--no-reranker",
            "--disable-tqdm",
            "--insecure",
            "--skip-tokenizer-init",
            "--plot-timeline",
            "--plot-dataset-stats",
        ),
        0,
    ),
    **dict.fromkeys(
        (
            "--host",
            "--port",
            "--base-url",
            "--served-model-name",
            "--tokenizer-mode",
            "--logprobs",
            "--temperature",
            "--top-p",
            "--top-k",
            "--min-p",
            "--frequency-penalty",
            "--presence-penalty",
            "--repetition-penalty",
            "--request-id-prefix",
            "--ready-check-timeout-sec",
            "--chat-template-kwargs",
            "--extra-body",
            "--timeline-itl-thresholds",
            "--num-warmups",
            "--lora-assignment",
            "--timed-trace-chunk-hash-size",
            "--timed-trace-sec-multiplier",
            "--timed-trace-label-timestamp",
            "--timed-trace-label-input-length",
            "--timed-trace-label-output-length",
            "--timed-trace-label-hash-ids",
            "--blazedit-min-distance",
            "--blazedit-max-distance",
            "--asr-max-audio-len-sec",
            "--asr-min-audio-len-sec",
            "--random-mm-base-items-per-request",
            "--random-mm-num-mm-items-range-ratio",
            "--random-mm-limit-mm-per-prompt",
            "--random-mm-bucket-config",
            "--hf-subset",
            "--hf-split",
            "--hf-name",
            "--hf-output-len",
            "--bfcl-categories",
            "--spec-bench-output-len",
            "--spec-bench-category",
            "--speed-bench-dataset-subset",
            "--speed-bench-output-len",
            "--speed-bench-category",
        ),
        1,
    ),
    "--header": "*",
}
# flag -> (arity, the value that is allowed (its default), why another is refused)
REFUSED: dict[str, tuple[int | str, Any, str]] = {
    "--use-beam-search": (0, None, "beam search is not modelled"),
    "--lora-modules": ("+", None, "LoRA adapters are not modelled"),
    "--probe-request-rate": (1, "0", "probe requests beside the benchmark are not modelled; allowed: 0"),
    "--random-batch-size": (1, "1", "batched reranker requests are not modelled; allowed: 1"),
    # vllm serve's: every profile prices steps run as CUDA graphs (kernels launched one by one from the
    # host, as eager mode runs them, are not timed anywhere here)
    "--enforce-eager": (0, None, "eager mode (no CUDA graphs) is not modelled"),
}
GENERATION_BACKENDS = ("vllm", "openai", "openai-chat", "openai-responses")
OTHER_BACKENDS = (
    "openai-audio",
    "openai-embeddings",
    "openai-embeddings-chat",
    "openai-embeddings-clip",
    "openai-embeddings-vlm2vec",
    "infinity-embeddings",
    "infinity-embeddings-clip",
    "vllm-pooling",
)
RAMP_UP = ("linear", "exponential")


def arity(flag: str) -> int | str | None:
    if flag in HONOURED:
        return HONOURED[flag]
    if flag in CLIENT_ONLY:
        return CLIENT_ONLY[flag]
    if flag in REFUSED:
        return REFUSED[flag][0]
    return None


def parse_extra(args: list[str]) -> dict[str, Any]:
    """The extra arguments as ``{flag: True | value | [values]}`` (the last of a repeated flag)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--"):
            raise ConfigError("wispsim bench", tok, "unexpected argument (every option is --name [value])")
        flag, eq, inline = tok.partition("=")
        n = arity(flag)
        if n is None:
            raise ConfigError(
                "wispsim bench", flag, "no such option; allowed: vllm bench serve's flags (see --help)"
            )
        i += 1
        if n == 0:
            if eq:
                raise ConfigError("wispsim bench", flag, "takes no value")
            out[flag] = True
            continue
        values = [inline] if eq else []
        if not eq:
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
                if n == 1:
                    break
        if (n in (1, "+") and not values) or (n == 1 and len(values) > 1):
            raise ConfigError("wispsim bench", flag, "expects a value" if n == 1 else "expects values")
        out[flag] = values[0] if n == 1 else values
    return out


def _int(flags: dict[str, Any], flag: str, default: int | None, low: int = 1) -> int | None:
    """An integer flag's value (``default`` when absent), at least ``low`` (``--custom-output-len``
    may also be -1: each record's own length)."""
    if flag not in flags:
        return default
    name = flag[2:].replace("-", "_")
    special = flag == "--custom-output-len"  # -1: each record's own output_tokens
    try:
        v = int(flags[flag])
    except ValueError:
        raise ConfigError(
            flag, name, f"got {flags[flag]!r}; allowed: an integer >= {low}" + (" or -1" if special else "")
        ) from None
    if v < low and not (special and v == -1):
        raise ConfigError(
            flag, name, f"got {v}; allowed: an integer >= {low}" + (" or -1" if special else "")
        )
    return v


def _rps(flags: dict[str, Any], flag: str) -> float:
    try:
        v = float(flags[flag])
    except (KeyError, ValueError):
        raise ConfigError(
            flag, flag[2:].replace("-", "_"), "allowed: a number >= 0 with --ramp-up-strategy"
        ) from None
    if not v >= 0:
        raise ConfigError(flag, flag[2:].replace("-", "_"), f"got {v}; allowed: >= 0")
    return v


def ramp_up(strategy: Any, lo: Any, hi: Any, source: str) -> tuple[str, float, float]:
    """A checked ramp-up: linear or exponential, 0 < start <= end requests/s (vLLM asserts every
    request's rate is positive)."""
    if strategy not in RAMP_UP:
        raise ConfigError(source, "ramp_up_strategy", f"got {strategy!r}; allowed: linear, exponential")
    ok = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (lo, hi))
    if not ok or not 0 < lo <= hi < float("inf"):
        raise ConfigError(source, "ramp_up_start_rps", f"got {lo!r} to {hi!r}; allowed: 0 < start <= end")
    return str(strategy), float(lo), float(hi)


@dataclass(frozen=True)
class Extras:
    """What the extra flags ask for (module text)."""

    reporting: Reporting = field(default_factory=Reporting)
    label: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    result_dir: Path | None = None
    append_result: bool = False
    backend: str = "openai"
    endpoint: str = "completions"  # the API server's: completions or chat (server.host.endpoint)
    tokenizer: str | None = None
    input_len: int | None = None
    output_len: int | None = None
    sharegpt_output_len: int | None = None
    custom_output_len: int | None = 256  # vLLM's default; None: each record's output_tokens (-1)
    chat_template: bool = True  # --skip-chat-template turns it off
    prefix_repetition: tuple[int, int, int, int] = (256, 256, 10, 128)
    disable_shuffle: bool = False
    no_oversample: bool = False
    self_timed: bool | None = None
    ramp_up: tuple[str, float, float] | None = None
    attention_backend: str | None = None  # vllm serve's --attention-backend (MLA's backends only)
    ignored: tuple[str, ...] = ()


def _endpoint(backend: str, path: str | None) -> str:
    """Which of the API server's endpoints the benchmark calls: ``chat`` for ``--backend
    openai-chat`` or an ``--endpoint`` ending in ``/chat/completions``, else ``completions``."""
    if path is not None:
        p = str(path).rstrip("/")
        if p.endswith("chat/completions"):
            return "chat"
        if not p.endswith("/completions"):
            raise ConfigError(
                "--endpoint", "endpoint", f"got {path!r}; allowed: /v1/completions, /v1/chat/completions"
            )
        return "completions"
    return "chat" if backend == "openai-chat" else "completions"


def extras_of(args: list[str]) -> Extras:
    """Parse and check the extra flags (one-line errors naming the flag)."""
    f = parse_extra(args)
    for flag, (_, allowed, why) in REFUSED.items():
        if flag in f and f[flag] is not True and str(f[flag]).strip() in (str(allowed), f"{allowed}.0"):
            continue
        if flag in f:
            raise ConfigError(flag, flag[2:].replace("-", "_"), why)
    backend = str(f.get("--backend", "openai"))
    if backend not in GENERATION_BACKENDS:
        known = backend in OTHER_BACKENDS
        raise ConfigError(
            "--backend",
            "backend",
            f"got {backend!r}{' (not text generation: not modelled)' if known else ''}; "
            f"allowed: {', '.join(GENERATION_BACKENDS)}",
        )
    metadata = {}
    for item in f.get("--metadata", []):
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError("--metadata", "metadata", f"got {item!r}; allowed: KEY=VALUE")
        metadata[key.strip()] = val.strip()
    ramp = None
    if "--ramp-up-strategy" in f:
        lo, hi = _rps(f, "--ramp-up-start-rps"), _rps(f, "--ramp-up-end-rps")
        ramp = ramp_up(f["--ramp-up-strategy"], lo, hi, "--ramp-up-strategy")
    elif "--ramp-up-start-rps" in f or "--ramp-up-end-rps" in f:
        raise ConfigError(
            "--ramp-up-start-rps", "ramp_up_strategy", "needs --ramp-up-strategy linear|exponential"
        )
    if "--self-timed" in f and "--no-self-timed" in f:
        raise ConfigError("--self-timed", "self_timed", "give --self-timed or --no-self-timed, not both")
    rep = Reporting(
        percentile_metrics(f["--percentile-metrics"])
        if "--percentile-metrics" in f
        else Reporting().percentile_metrics,
        metric_percentiles(f["--metric-percentiles"]) if "--metric-percentiles" in f else (99.0,),
        goodput_slos(f.get("--goodput", [])),
        "--save-detailed" in f,
    )
    out_len = _int(f, "--output-len", None)
    custom = _int(f, "--custom-output-len", 256)
    attention = f.get("--attention-backend")
    if attention is not None and attention not in ATTENTION_BACKENDS:
        raise ConfigError(
            "--attention-backend",
            "attention_backend",
            f"got {attention!r}; allowed (latent attention's, the only ones priced apart): "
            f"{', '.join(ATTENTION_BACKENDS)}",
        )
    return Extras(
        reporting=rep,
        label=f.get("--label"),
        metadata=metadata,
        result_dir=Path(f["--result-dir"]) if "--result-dir" in f else None,
        append_result="--append-result" in f,
        backend=backend,
        endpoint=_endpoint(backend, f.get("--endpoint")),
        tokenizer=f.get("--tokenizer"),
        input_len=_int(f, "--input-len", None),
        output_len=out_len,
        sharegpt_output_len=out_len or _int(f, "--sharegpt-output-len", None),
        custom_output_len=out_len or (None if custom == -1 else custom),
        chat_template="--skip-chat-template" not in f,
        prefix_repetition=(
            _int(f, "--prefix-repetition-prefix-len", 256, 0) or 0,
            _int(f, "--prefix-repetition-suffix-len", 256) or 256,
            _int(f, "--prefix-repetition-num-prefixes", 10) or 10,
            out_len or _int(f, "--prefix-repetition-output-len", 128) or 128,
        ),
        disable_shuffle="--disable-shuffle" in f,
        no_oversample="--no-oversample" in f,
        self_timed=True if "--self-timed" in f else False if "--no-self-timed" in f else None,
        ramp_up=ramp,
        attention_backend=attention,
        ignored=tuple(k for k in f if k in CLIENT_ONLY),
    )


def _paragraph(text: str) -> str:
    """Wrapped here at 78 columns without splitting a flag at its hyphens; click leaves a
    paragraph that opens with \\b as it is."""
    return "\b\n" + "\n".join(textwrap.wrap(text, 78, break_on_hyphens=False, break_long_words=False))


EPILOG = "\n\n".join(
    _paragraph(t)
    for t in (
        "vLLM's other flags. Honoured: "
        + ", ".join(sorted(HONOURED))
        + " (--ignore-eos: simulated outputs always run to their length; --percentile-metrics "
        "defaults to ttft,tpot,itl,e2el; custom prompts are counted through the tokenizer's chat "
        "template unless --skip-chat-template, as vLLM's; --backend openai-chat or --endpoint "
        "/v1/chat/completions: the API server applies the chat template to each request).",
        "Accepted and ignored (they concern only the real client: where the server is, sampling, "
        "tokenizer modes, plots, warm-ups): " + ", ".join(sorted(CLIENT_ONLY)) + ".",
        "Refused when set (not modelled): "
        + ", ".join(f"{k} ({v[2].split(';')[0]})" for k, v in REFUSED.items())
        + ".",
    )
)

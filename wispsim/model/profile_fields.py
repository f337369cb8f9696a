"""Reading a profile's values: numbers within their bounds, whole numbers, sections.

Every reader names the profile and the dotted field in its one-line error (``ConfigError``), and
the upper bounds of the hardware and model facts live in one table, :data:`PROFILE_MAXIMA`.
"""

from __future__ import annotations

import math
from typing import Any

from wispsim.config.limits import MAX_BLOCK_SIZE, MAX_MEMORY_GIB
from wispsim.errors import ConfigError

#: Upper bounds on a profile's hardware and model facts, by field (docs/profiles.md lists them).
#: Each is far above any GPU, host or model that exists, and together they keep the KV-cache
#: arithmetic (:meth:`Profile.kv_capacity_tokens`) finite: a bigger value is a typo, refused.
PROFILE_MAXIMA: dict[str, float] = {
    "hardware.count": 1024,  # GPUs holding one model
    "hardware.memory_gib": MAX_MEMORY_GIB,  # per GPU (a CPU profile: the host's memory)
    "hardware.hbm_bandwidth_gbs": 100_000,  # GB/s per GPU
    "hardware.bf16_tflops": 100_000,  # per GPU
    "hardware.fp8_tflops": 100_000,  # per GPU
    "hardware.nvlink_gbs": 100_000,  # GB/s per GPU, one direction (the older spelling of link_gbs)
    "hardware.link_gbs": 100_000,  # GB/s per GPU, one direction, over hardware.interconnect
    "hardware.price_per_gpu_hour": 10_000,  # dollars
    "model.parameters": 1e14,
    "model.weight_bytes": 1e15,  # over all the GPUs
    "model.layers": 10_000,
    "model.kv_heads": 1_000_000,
    "model.head_dim": 1_000_000,
    "model.attention_heads": 1_000_000,
    "model.hidden_size": 1_000_000,
    "model.intermediate_size": 1_000_000,
    "model.vocab_size": 10_000_000,
    "model.kv_dtype_bytes": 8,
    "model.sliding_window": 10_000_000,  # tokens (model.windowed_layers: at most model.layers)
    "kv_block_size": MAX_BLOCK_SIZE,  # tokens
}


def number(
    d: dict[str, Any],
    key: str,
    source: str,
    path: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    if key not in d:
        raise ConfigError(source, f"{path}{key}", "is missing")
    return value(d[key], source, f"{path}{key}", minimum=minimum, maximum=maximum)


def value(
    v: Any, source: str, where: str, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise ConfigError(source, where, f"must be a number, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(source, where, f"must be a number, got {' '.join(repr(v).split())[:60]}")
    try:
        v = float(v)
    except OverflowError:
        raise ConfigError(
            source, where, f"must be a finite number, got a {len(str(v))}-digit integer"
        ) from None
    if not math.isfinite(v):
        raise ConfigError(source, where, f"must be a finite number, got {v}")
    if minimum is not None and v < minimum:
        raise ConfigError(source, where, f"must be >= {minimum:g}, got {v:g}")
    if maximum is not None and v > maximum:
        raise ConfigError(source, where, f"must be <= {maximum:g}, got {v:g}")
    return v


def whole(
    d: dict[str, Any], key: str, source: str, path: str, *, minimum: int = 1, maximum: float | None = None
) -> int:
    v = number(d, key, source, path, minimum=minimum, maximum=maximum)
    if v != int(v):
        raise ConfigError(source, f"{path}{key}", f"must be a whole number, got {v:g}")
    return int(v)


def opt_whole(d: dict[str, Any], key: str, source: str, path: str) -> int | None:
    return bounded_whole(d, key, source, path) if d.get(key) is not None else None


def opt_number(d: dict[str, Any], key: str, source: str, path: str) -> float | None:
    maximum = PROFILE_MAXIMA.get(f"{path}{key}")
    return number(d, key, source, path, minimum=0.0, maximum=maximum) if d.get(key) is not None else None


def bounded_whole(d: dict[str, Any], key: str, source: str, path: str) -> int:
    """A whole number >= 1 and within its :data:`PROFILE_MAXIMA` bound."""
    return whole(d, key, source, path, maximum=PROFILE_MAXIMA[f"{path}{key}"])


# the fields a profile's sections may hold (a typo is refused, not read as absent)
SECTION_FIELDS = {
    "hardware": (
        "gpu", "gpu_key", "generation", "count", "memory_gib", "hbm_bandwidth_gbs", "bf16_tflops",
        "fp8_tflops", "bf16_maf_tflops", "fp8_maf_tflops", "link_gbs", "nvlink_gbs", "interconnect",
        "parallelism", "price_per_gpu_hour",
    ),
    "model": (
        "name", "arch", "config", "parameters", "layers", "attention_heads", "kv_heads", "head_dim",
        "hidden_size", "intermediate_size", "vocab_size", "kv_dtype", "kv_dtype_bytes", "weight_bytes",
        "sliding_window", "windowed_layers",
    ),
    "noise": ("model", "sigma", "basis"),
}  # fmt: skip


def section(d: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    v = d.get(key)
    if not isinstance(v, dict):
        raise ConfigError(source, key, "is missing or not a mapping")
    known_fields(v, key, source)
    return v


def known_fields(v: dict[str, Any], key: str, source: str) -> None:
    """Every field of section ``key`` is one :data:`SECTION_FIELDS` allows."""
    extra = sorted(str(k) for k in set(v) - set(SECTION_FIELDS.get(key, v)))
    if extra:
        raise ConfigError(
            source, f"{key}.{extra[0]}", f"unknown field; allowed: {', '.join(SECTION_FIELDS[key])}"
        )


ENGINE_LAYOUTS = ("in-process", "multiprocess")


def engine_layout(data: dict[str, Any], src: str) -> str | None:
    v = data.get("engine_layout")
    if v is not None and v not in ENGINE_LAYOUTS:
        raise ConfigError(src, "engine_layout", f"got {v!r}; allowed: {', '.join(ENGINE_LAYOUTS)}")
    return None if v is None else str(v)


def window_facts(m: dict[str, Any], src: str) -> dict[str, int]:
    """``model.sliding_window`` and ``model.windowed_layers`` (given together; at most
    ``model.layers`` windowed), or none."""
    given = [k for k in ("sliding_window", "windowed_layers") if m.get(k) is not None]
    if len(given) == 1:
        missing = "windowed_layers" if given == ["sliding_window"] else "sliding_window"
        raise ConfigError(src, f"model.{missing}", f"is missing (model.{given[0]} needs it)")
    if not given:
        return {"sliding_window": 0, "windowed_layers": 0}
    layers = bounded_whole(m, "layers", src, "model.")
    return {
        "sliding_window": bounded_whole(m, "sliding_window", src, "model."),
        "windowed_layers": whole(m, "windowed_layers", src, "model.", maximum=layers),
    }

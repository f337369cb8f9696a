"""Verification-latency profiles: estimator coefficients for one (GPU, model, precision, engine).

A profile is a YAML file under ``profiles/`` (see ``profiles/a100-qwen3-32b.yaml``). Besides the
coefficients it carries the noise model, the hardware, and the target model's memory facts that
the paged KV-cache model needs. :func:`load_profile` finds a profile by name or path and checks it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wispsim.config import read_yaml
from wispsim.errors import ConfigError
from wispsim.estimator import Estimator
from wispsim.resources import profiles_dir, resolve_named

GIB = 1024**3
COEFFICIENTS = ("a", "b_compute", "b_read", "c")
PROVENANCE_KINDS = ("published", "measured", "derived")


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the memory model needs to know about the target model."""

    name: str
    parameters: float
    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    weight_bytes: float
    vocab_size: int = 151936

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) x layers x KV heads x head dim x dtype bytes (SPEC 2.3)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    source: str
    estimator: Estimator
    ci95: dict[str, tuple[float, float]]
    noise_sigma: float
    gpu: str
    gpu_count: int
    gpu_memory_gib: float
    engine: str
    precision: str
    model: ModelFacts
    provenance: dict[str, Any]
    fit: dict[str, Any] = field(default_factory=dict)

    def kv_capacity_tokens(self, utilization: float, reserve_gib: float) -> int:
        """Tokens of KV cache that fit: GPU memory x utilization - weights - activation reserve."""
        total = self.gpu_memory_gib * GIB * self.gpu_count * utilization
        free = total - self.model.weight_bytes - reserve_gib * GIB * self.gpu_count
        return max(0, int(free // self.model.kv_bytes_per_token))


def _num(d: dict[str, Any], key: str, source: str, path: str, *, minimum: float | None = None) -> float:
    if key not in d:
        raise ConfigError(source, f"{path}{key}", "is missing")
    v = d[key]
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise ConfigError(source, f"{path}{key}", f"must be a number, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
        raise ConfigError(source, f"{path}{key}", f"must be a number, got {v!r}")
    if minimum is not None and v < minimum:
        raise ConfigError(source, f"{path}{key}", f"must be >= {minimum:g}, got {v:g}")
    return float(v)


def _section(d: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    v = d.get(key)
    if not isinstance(v, dict):
        raise ConfigError(source, key, "is missing or not a mapping")
    return v


def parse_profile(data: dict[str, Any], source: str) -> Profile:
    """Validate a profile mapping (as read from YAML) and build a :class:`Profile`."""
    name = str(data.get("name") or Path(source).stem)
    src = f"profile '{name}' ({source})"
    coefs = _section(data, "coefficients", src)
    values: dict[str, float] = {}
    ci95: dict[str, tuple[float, float]] = {}
    for k in COEFFICIENTS:
        entry = coefs.get(k)
        if entry is None:
            raise ConfigError(src, f"coefficients.{k}", "is missing")
        if not isinstance(entry, dict):
            entry = {"value": entry}
        values[k] = _num(entry, "value", src, f"coefficients.{k}.", minimum=0.0)
        ci = entry.get("ci95")
        if ci is not None:
            if not (isinstance(ci, list) and len(ci) == 2):
                raise ConfigError(src, f"coefficients.{k}.ci95", "must be [low, high]")
            lo, hi = float(ci[0]), float(ci[1])
            if not lo <= values[k] <= hi:
                raise ConfigError(
                    src, f"coefficients.{k}.ci95", f"[{lo:g}, {hi:g}] must contain {values[k]:g}"
                )
            ci95[k] = (lo, hi)
    hw = _section(data, "hardware", src)
    m = _section(data, "model", src)
    model = ModelFacts(
        name=str(m.get("name", "?")),
        parameters=_num(m, "parameters", src, "model.", minimum=1),
        layers=int(_num(m, "layers", src, "model.", minimum=1)),
        kv_heads=int(_num(m, "kv_heads", src, "model.", minimum=1)),
        head_dim=int(_num(m, "head_dim", src, "model.", minimum=1)),
        kv_dtype_bytes=int(_num(m, "kv_dtype_bytes", src, "model.", minimum=1)),
        weight_bytes=_num(m, "weight_bytes", src, "model.", minimum=0),
        vocab_size=int(m.get("vocab_size", 151936)),
    )
    noise = data.get("noise") or {}
    sigma = _num(noise, "sigma", src, "noise.", minimum=0.0) if "sigma" in noise else 0.0
    prov = _section(data, "provenance", src)
    kind = prov.get("kind")
    if kind not in PROVENANCE_KINDS:
        raise ConfigError(src, "provenance.kind", f"got {kind!r}; allowed: {', '.join(PROVENANCE_KINDS)}")
    needs = {"published": "citation", "measured": "data", "derived": "rule"}[kind]
    if not prov.get(needs):
        raise ConfigError(src, f"provenance.{needs}", f"is required for a {kind} profile")
    profile = Profile(
        name=name,
        source=source,
        estimator=Estimator(**values),
        ci95=ci95,
        noise_sigma=sigma,
        gpu=str(hw.get("gpu", "?")),
        gpu_count=int(_num(hw, "count", src, "hardware.", minimum=1)),
        gpu_memory_gib=_num(hw, "memory_gib", src, "hardware.", minimum=1),
        engine=str(data.get("engine", "?")),
        precision=str(data.get("precision", "?")),
        model=model,
        provenance=dict(prov),
        fit=dict(data.get("fit") or {}),
    )
    if profile.kv_capacity_tokens(1.0, 0.0) <= 0:
        raise ConfigError(
            src, "model.weight_bytes", "the weights do not fit in the GPUs' memory (hardware.count)"
        )
    return profile


def find_profile(name_or_path: str) -> Path:
    path = resolve_named(name_or_path, profiles_dir(), (".yaml", ".yml"))
    if path is None:
        known = ", ".join(available_profiles()) or "none"
        raise ConfigError(
            "scenario", "server.profile", f"no profile {name_or_path!r}; shipped profiles: {known}"
        )
    return path


def load_profile(name_or_path: str) -> Profile:
    path = find_profile(name_or_path)
    return parse_profile(read_yaml(path), str(path))


def available_profiles() -> list[str]:
    d = profiles_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []

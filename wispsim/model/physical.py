"""Profiles from physics: any architecture on any GPU, priced by the calibrated roofline.

A grounded profile is the ``roofline`` form (:mod:`wispsim.model.roofline`) of an architecture
(``wispsim/data/archs``: config.json facts) on ``count`` GPUs of one kind (``wispsim/data/gpus.yaml``:
datasheet facts) at a precision, with the engine's efficiencies and overheads taken from a
calibration (``wispsim/data/roofline.yaml``: fitted on public measurements of real vLLM
deployments, see experiments/REPORT.md "public GPU measurements"). :func:`physical_profile` builds
the profile mapping (the same YAML ``wispsim profile derive --form roofline`` writes), so latency
and memory describe one deployment: the weights the roofline reads are the weights the KV model
subtracts from the GPU's memory.
"""

from __future__ import annotations

import functools
from typing import Any

import yaml

from wispsim.errors import ConfigError
from wispsim.model.archs import GPU, Arch, dtype_bytes
from wispsim.paths import data_dir

PRECISIONS = ("bf16", "fp8")  # weights (and activations) at 16 or 8 bits; fp8 needs fp8 tensor cores
KV_DTYPES = ("bf16", "fp8")


@functools.cache
def calibration(name: str = "vllm") -> dict[str, Any]:
    """A calibrated parameter set of ``wispsim/data/roofline.yaml`` (efficiencies, overheads,
    and where they come from)."""
    table = yaml.safe_load((data_dir() / "roofline.yaml").read_text())
    if name not in table:
        raise ConfigError("roofline calibration", name, f"unknown; known: {', '.join(table)}")
    entry: dict[str, Any] = table[name]
    return entry


def _g(v: float) -> float:
    return float(f"{v:.6g}")


def physical_profile(
    arch: Arch,
    gpu: GPU,
    *,
    count: int = 1,
    precision: str = "bf16",
    kv_dtype: str = "bf16",
    params: dict[str, Any] | None = None,
    calibration_name: str = "vllm",
    name: str | None = None,
    command: str = "",
    noise_sigma: float | None = None,
) -> dict[str, Any]:
    """The profile mapping of ``arch`` on ``count`` x ``gpu`` at ``precision`` (module docstring).
    ``params`` (efficiency and overhead_ms mappings) overrides the calibration's."""
    if precision not in PRECISIONS:
        raise ConfigError("--dtype", precision, f"allowed: {', '.join(PRECISIONS)}")
    if kv_dtype not in KV_DTYPES:
        raise ConfigError("--kv-dtype", kv_dtype, f"allowed: {', '.join(KV_DTYPES)}")
    if precision == "fp8" and gpu.fp8_tflops is None:
        raise ConfigError("--dtype", precision, f"{gpu.name} has no fp8 tensor cores; allowed: bf16")
    if count > 1 and gpu.nvlink_gbs is None:
        raise ConfigError(
            "--count", str(count), f"{gpu.key}: gpus.yaml gives no nvlink_gbs for tensor parallelism"
        )
    cal = calibration(calibration_name)
    chosen = params if params is not None else {k: cal[k] for k in ("efficiency", "overhead_ms")}
    wbytes = dtype_bytes(precision)
    tp = "" if count == 1 else f"{count}x"
    name = name or f"{tp}{gpu.key}-{arch.name}{'' if precision == 'bf16' else '-' + precision}"
    hardware: dict[str, Any] = {
        "gpu": gpu.name,
        "gpu_key": gpu.key,
        "count": count,
        "memory_gib": gpu.memory_gib,
        "hbm_bandwidth_gbs": gpu.hbm_bandwidth_gbs,
        "bf16_tflops": gpu.bf16_tflops,
    }
    if gpu.fp8_tflops is not None:
        hardware["fp8_tflops"] = gpu.fp8_tflops
    if gpu.nvlink_gbs is not None:
        hardware["nvlink_gbs"] = gpu.nvlink_gbs
    model = arch.model_facts("bf16")
    model["kv_dtype_bytes"] = dtype_bytes(kv_dtype)
    model["weight_bytes"] = float(arch.weight_bytes(wbytes))
    sigma = cal.get("noise_sigma", 0.05) if noise_sigma is None else noise_sigma
    return {
        "name": name,
        "description": (
            f"{arch.hf_name} {precision} (KV {kv_dtype}) on {count}x {gpu.name}, vLLM: physical roofline "
            f"with the '{calibration_name}' calibration (not measured on this pair)"
        ),
        "hardware": hardware,
        "engine": "vllm",
        "precision": precision,
        "kv_block_size": 16,
        "model": model,
        "estimator": "roofline",
        "roofline": {
            "efficiency": {k: _g(v) for k, v in chosen["efficiency"].items()},
            "overhead_ms": {k: _g(v) for k, v in chosen["overhead_ms"].items()},
            "fit": dict(cal.get("fit", {})),
        },
        "noise": {"model": "lognormal", "sigma": sigma, "basis": cal.get("noise_basis", "")},
        "provenance": {
            "kind": "derived",
            "rule": (
                "roofline form (wispsim.model.roofline): architecture facts from "
                f"wispsim/data/archs/{arch.name}.yaml, GPU facts from wispsim/data/gpus.yaml ({gpu.key}), "
                f"engine efficiencies and overheads from the '{calibration_name}' calibration "
                "(wispsim/data/roofline.yaml)"
            ),
            "command": command,
            "inputs": {
                "arch": arch.name,
                "gpu": gpu.key,
                "count": count,
                "precision": precision,
                "kv_dtype": kv_dtype,
                "calibration": calibration_name,
                "calibrated_on": cal.get("calibrated_on", ""),
            },
        },
    }

"""The server ``wispsim bench`` simulates, from ``vllm serve``'s flags: the model as vLLM holds it
(``--model``, ``--quantization``), and its physical profile on ``--gpu`` (``--tensor-parallel-size``,
``--dtype``, ``--kv-cache-dtype``), or a measured ``--profile``."""

from __future__ import annotations

from typing import Any

from wispsim.errors import ConfigError
from wispsim.model.archs import Arch, find_arch, load_gpu
from wispsim.model.physical import physical_profile
from wispsim.model.profiles import Profile, load_profile, parse_profile
from wispsim.model.weight_only import ONLINE_QUANTIZATION, online_quantized
from wispsim.runs.resolve import blaming

# --dtype: 16-bit weights (float16 has bfloat16's bytes and tensor-core rate on every GPU priced), or
# fp8: vLLM's --quantization fp8 (model.weight_only.weights_at)
PRECISION = {"auto": "bf16", "bfloat16": "bf16", "bf16": "bf16", "half": "bf16", "float16": "bf16"}
PRECISION["fp8"] = "fp8"
# vllm serve --kv-cache-dtype -> the KV cache's element type
KV_CACHE_DTYPES = {"auto": "bf16", "bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}


def arch_of(model: str, quantization: str | None = None) -> Arch:
    """``--model``: :func:`wispsim.model.archs.find_arch`; ``--quantization``: vLLM's, the method
    the checkpoint's ``quantization_config`` names (a no-op, as in vLLM) or, for an unquantized
    checkpoint, what vLLM quantizes online (:data:`ONLINE_QUANTIZATION`)."""
    arch = find_arch(model, "--model")
    if quantization is None:
        return arch
    q = quantization.lower()
    if arch.quant_method:
        if q in (arch.quant_method, f"{arch.quant_method}_marlin"):
            return arch
        raise ConfigError(
            "--quantization",
            "quantization",
            f"got {quantization!r}: {arch.name}'s checkpoint is quantized with {arch.quant_method} "
            f"(vLLM refuses a different method); allowed: {arch.quant_method}",
        )
    if q not in ONLINE_QUANTIZATION:
        raise ConfigError(
            "--quantization",
            "quantization",
            f"got {quantization!r}: {arch.name} is not quantized, and vLLM quantizes a checkpoint at "
            f"load only to {', '.join(ONLINE_QUANTIZATION)}; allowed: {', '.join(ONLINE_QUANTIZATION)}",
        )
    return online_quantized(arch, q, "--quantization")


def physical_of(
    model: str,
    gpu: str,
    tp: int,
    dtype: str,
    name: str | None = None,
    command: str = "",
    gpu_memory_utilization: float = 0.9,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
) -> dict[str, Any]:
    """The physical profile mapping of ``model`` on ``tp`` x ``gpu`` (flags as ``vllm serve`` takes
    them)."""
    precision = PRECISION.get(dtype)
    if precision is None:
        raise ConfigError("--dtype", "dtype", f"got {dtype!r}; allowed: {', '.join(PRECISION)}")
    kv = KV_CACHE_DTYPES.get(kv_cache_dtype)
    if kv is None:
        raise ConfigError(
            "--kv-cache-dtype",
            "kv_cache_dtype",
            f"got {kv_cache_dtype!r}; allowed: {', '.join(KV_CACHE_DTYPES)}",
        )
    if tp < 1:
        raise ConfigError(
            "--tensor-parallel-size", "tensor_parallel_size", f"got {tp}; allowed: an integer >= 1"
        )
    arch = arch_of(model, quantization)
    with blaming({"precision": "--dtype"}):  # fp8 of a quantized checkpoint: weight_only.weights_at
        return physical_profile(
            arch,
            load_gpu(gpu),
            count=tp,
            precision=precision,
            kv_dtype=kv,
            noise_sigma=0.0,
            name=name,
            command=command,
            gpu_memory_utilization=gpu_memory_utilization,
        )


def profile_of(
    model: str | None,
    gpu: str | None,
    tp: int,
    dtype: str,
    profile: str | None,
    gpu_memory_utilization: float = 0.9,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
) -> Profile:
    if profile is not None:
        if model is not None or gpu is not None:
            raise ConfigError("--profile", "profile", "give --profile, or --model with --gpu, not both")
        if quantization is not None or kv_cache_dtype != "auto":
            raise ConfigError(
                "--profile", "profile", "a measured profile is one deployment: --quantization and "
                "--kv-cache-dtype go with --model and --gpu",
            )  # fmt: skip
        return load_profile(profile, "--profile", "profile")
    if model is None or gpu is None:
        raise ConfigError("wispsim bench", "--model/--gpu", "give --model and --gpu (or --profile)")
    return parse_profile(
        physical_of(
            model, gpu, tp, dtype, gpu_memory_utilization=gpu_memory_utilization,
            quantization=quantization, kv_cache_dtype=kv_cache_dtype,
        ),
        f"--model {model} --gpu {gpu}",
    )  # fmt: skip

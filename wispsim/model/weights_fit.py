"""Whether a model's weights fit its GPUs: vLLM's refusal to start, said before any simulation.

The weights counted are the ones the engine stores: quantized layers at their bits, mxfp4 experts
padded to the MoE kernel's tiles (:func:`wispsim.model.weight_only.padded_experts`), on each of the
tensor-parallel GPUs; less the activation reserve each GPU keeps.
"""

from __future__ import annotations

from wispsim.errors import ConfigError
from wispsim.model.archs import Arch, dtype_bytes, parallel_sizes
from wispsim.model.gpus import GPU
from wispsim.model.weight_only import padded_experts, weights_said

ACTIVATION_RESERVE_GIB = 1.5  # per GPU, the server's default (server.engine.activation_reserve_gib)


def check_fit(
    arch: Arch, gpu: GPU, count: int, precision: str, utilization: float = 0.9,
    flag: str = "--tensor-parallel-size",
) -> None:  # fmt: skip
    """The weights must fit: weight bytes / count below memory x ``gpu_memory_utilization`` less
    the activation reserve on each GPU, else a one-line refusal naming the tensor-parallel size
    that fits (the smallest :func:`parallel_sizes` does)."""

    def weights(t: int) -> float:  # as the engine stores them on t GPUs (padded experts)
        return padded_experts(arch, gpu.generation, t).weight_bytes(dtype_bytes(precision))

    holds = gpu.memory_gib * 2**30 * utilization
    usable = holds - ACTIVATION_RESERVE_GIB * 2**30
    if weights(count) / count <= usable:
        return
    what = weights_said(arch, precision)
    fits = [t for t in parallel_sizes(arch) if weights(t) / t <= usable]
    advice = f"use {flag} >= {fits[0]}" if fits else "no tensor-parallel size holds them"
    raise ConfigError(
        flag,
        "tensor_parallel_size",
        f"{arch.hf_name} needs {weights(count) / 1e9:.0f} GB of weights ({what}); {count} x {gpu.name} holds "
        f"{count * holds / 1e9:.0f} GB at gpu_memory_utilization {utilization:g} (less "
        f"{ACTIVATION_RESERVE_GIB:g} GiB per GPU for activations): {advice}",
    )

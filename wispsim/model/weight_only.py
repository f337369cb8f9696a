"""Weight-only quantized GEMMs: which kernel vLLM runs them with, and what converting weights costs.

A checkpoint's quantized weights either have a tensor-core path of their own on the GPU (fp8 on
Ada, Hopper and Blackwell, whose activations vLLM quantizes too; mxfp4 experts on Blackwell) or
they are converted to the activations' 16-bit type inside each GEMM: a *mixed-input* kernel. vLLM
picks it by GPU generation (vLLM 0.32's ``model_executor/kernels/linear``: Machete on Hopper, Marlin
elsewhere; ``layers/quantization/fp8.py``: FP8 Marlin below Ada; ``mxfp4.py``: Marlin below Hopper,
OpenAI's Triton kernels on Hopper and ROCm, FlashInfer's on Blackwell; fused Marlin MoE for 4-bit
experts).

Memory-bound, a mixed-input kernel streams the quantized bytes at the dense bandwidth figure: the
whole point of the format. Compute-bound, each weight tile is converted once per tile of tokens on
the CUDA cores beside the tensor cores' work, and the kernel runs at ``compute_ratio`` of the dense
GEMM: a published kernel measurement per kernel family (``wispsim/data/efficiency.yaml``,
``weight_only``), applied on the generations it was measured on. Elsewhere the conversion is priced
at nothing, and the profile's ``kernel_basis`` says so.

Layers whose activations are quantized too (W8A8: fp8 checkpoints, compressed-tensors with
``input_activations``) need no conversion where the GPU has tensor cores of their type: they
multiply at that type's peak, twice the 16-bit one (:func:`quantized_rate`; measured on the lent
H200, Qwen3-32B's layer GEMMs in e4m3 ran 1.84-1.85x faster than bf16 at 8,192 tokens,
``experiments/data/gpu/h200/shapes_2026.csv``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import yaml

from wispsim.errors import ConfigError
from wispsim.model.archs import Arch, arch_from_dict, load_gpu
from wispsim.model.gpus import GENERATIONS, GPU
from wispsim.paths import data_dir

# vllm serve --quantization of an unquantized checkpoint: what vLLM quantizes at load (fp8: weights
# per tensor, activations dynamically; embeddings and the LM head stay 16-bit), as a config.json says it
ONLINE_QUANTIZATION = {"fp8": {"quant_method": "fp8", "activation_scheme": "dynamic"}}


def online_quantized(arch: Arch, method: str, source: str) -> Arch:
    """An unquantized ``arch`` as vLLM holds it after ``--quantization method`` quantized it at load."""
    config = {**arch.hf, "model_type": arch.model_type, "quantization_config": ONLINE_QUANTIZATION[method]}
    meta = {"name": arch.name, "hf_name": arch.hf_name, "source": arch.source}
    return arch_from_dict({**config, **meta, "extra_matmul_params": arch.extra_matmul_params}, source)


def weights_at(arch: Arch, precision: str, source: str = "profile") -> Arch:
    """The architecture as the engine holds it at a profile's ``precision``, its unquantized weights
    16-bit: fp8 is vLLM's ``--quantization fp8`` of a 16-bit checkpoint (its embeddings and LM head
    stay 16-bit, :data:`ONLINE_QUANTIZATION`), refused for a checkpoint quantized already (vLLM
    refuses a second method); at bf16 a checkpoint keeps its own weights."""
    if precision != "fp8":
        return arch
    if arch.quant_method:
        raise ConfigError(
            source,
            "precision",
            f"fp8: {arch.name}'s checkpoint is quantized with {arch.quant_method} already (vLLM "
            "refuses to quantize it again); allowed: bf16 (the checkpoint's own weights)",
        )
    return online_quantized(arch, "fp8", source)


def weights_said(arch: Arch, base: str) -> str:
    """The weights in words: ``bf16``; ``fp8 linear layers, the rest bf16``."""
    if not arch.quant_method:
        return base
    part = "experts" if arch.quant_scope == "experts" else "linear layers"
    return f"{arch.quant_method} {part}, the rest {base}"


@dataclass(frozen=True, slots=True)
class Conversion:
    """What converting quantized weights costs a GEMM on one GPU: ``kernel`` vLLM runs ("" where
    the weights need no conversion), and the fraction of the dense compute figure it reaches
    compute-bound (1.0 where nothing converts, or where the kernel was not measured on the GPU's
    generation: ``measured`` False)."""

    kernel: str = ""
    compute_ratio: float = 1.0
    measured: bool = False

    def says(self, part: str, generation: str) -> str:
        if not self.kernel:
            return ""
        if self.measured:
            return f"{part}: {self.kernel}, compute-bound at {self.compute_ratio:g} of a dense GEMM"
        return f"{part}: {self.kernel}, not measured on {generation} (its conversion is not priced)"


@functools.cache
def _figures() -> dict[str, Any]:
    table = yaml.safe_load((data_dir() / "efficiency.yaml").read_text())
    figures: dict[str, Any] = table.get("weight_only") or {}
    return figures


def _kernel(arch: Arch, gpu: GPU, experts: bool) -> str:
    """The mixed-input kernel vLLM runs for ``arch``'s quantized linear layers (``experts``: its
    routed experts) on ``gpu`` ("" where none converts: native fp8 or fp4, or no quantization)."""
    gen, method = gpu.generation, arch.quant_method
    if not method or (gen == "cdna3" and method != "mxfp4"):
        return ""  # ROCm's own kernels: not modelled apart from the bytes
    if arch.quant_act:  # W8A8 on the GPU's own fp8 (or int8) tensor cores; fp8 below Ada: FP8 Marlin
        return "marlin" if arch.quant_float and gpu.fp8_tflops is None else ""
    if method == "mxfp4":
        return {"blackwell": "", "hopper": "triton", "cdna3": "triton"}.get(gen, "marlin")
    if experts:
        return "marlin"  # vLLM's fused Marlin MoE for 4- and 8-bit integer experts
    return "machete" if gen == "hopper" else "marlin"


def conversion(arch: Arch, gpu: GPU, experts: bool = False) -> Conversion:
    """What converting ``arch``'s quantized weights costs its linear layers (``experts``: its routed
    experts) on ``gpu`` (module text)."""
    scope = arch.quant_scope
    if (experts and not arch.moe_layers) or (not experts and scope == "experts"):
        return Conversion()  # not quantized: the dense layers of an experts-only format
    name = _kernel(arch, gpu, experts)
    if not name:
        return Conversion()
    entry = _figures().get(name)
    if not isinstance(entry, dict) or gpu.generation not in entry.get("measured_on", []):
        return Conversion(name)
    return Conversion(name, float(entry["compute_ratio"]), True)


# vLLM pads mxfp4 experts to its MoE kernel's tiles when it creates their weights (0.32's
# ``fused_moe/oracle/mxfp4.py``, ``mxfp4_round_up_hidden_size_and_intermediate_size``): (the hidden
# size's multiple, the multiple of each GPU's share of an expert's width) by the kernel it picks.
# gpt-oss (``GptOssMxfp4MoEMethod``, ``_get_priority_backends_for_gpt_oss``): FlashInfer's TRT-LLM
# kernels on datacenter Blackwell; OpenAI's Triton kernels on Hopper (the width to 64, the hidden
# size as it is) and ROCm (gpt-oss's SwiGLU is not a SiLU: both to 256); Marlin everywhere else,
# consumer Blackwell (SM120) included, where vLLM puts Marlin before Triton. Other mxfp4 mixtures
# (``select_deepseek_v4_mxfp4_moe_backend``): TRT-LLM on Blackwell, Marlin on Hopper and below,
# AITER with a SiLU on ROCm (both to 128). The rules have moved between versions (0.10-0.11 padded
# TRT-LLM's width to 256 and ran Marlin on Hopper where OpenAI's kernels were not installed); these
# are 0.32's.
MARLIN_TILES = (256, 128)  # Marlin MoE: n % 256 and k % 128 in both GEMMs
TRTLLM_TILES = (256, 128)
GPT_OSS_TILES = {"hopper": (1, 64), "cdna3": (256, 256), "blackwell": TRTLLM_TILES}
OTHER_MXFP4_TILES = {"cdna3": (128, 128), "blackwell": TRTLLM_TILES}


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def mxfp4_experts(arch: Arch) -> bool:
    """Whether ``arch``'s routed experts are mxfp4 (stored padded by the GPU's kernel)."""
    return arch.quant_method == "mxfp4" and arch.moe_layers > 0 and arch.experts > 1


def padded_experts(arch: Arch, generation: str, tp: int) -> Arch:
    """``arch`` with its routed experts as vLLM stores them on each of ``tp`` GPUs of
    ``generation`` (module ``GPT_OSS_TILES``): padded to the MoE kernel's tiles, which every pass
    reads and multiplies and the weights' memory holds. gpt-oss-120b on an A100 (Marlin): hidden
    2,880 -> 3,072 and width 2,880 -> 2,944, 9% more expert bytes (vLLM logged 65.965 GiB loading
    it, this gives 65.90); on one H100 nothing. Unchanged for anything but mxfp4 experts (the other
    formats' kernels take the checkpoint's shapes). Computed from the checkpoint's shapes, so an
    architecture padded for one GPU can be padded again for another."""
    if not mxfp4_experts(arch):
        return arch
    table = GPT_OSS_TILES if arch.model_type == "gpt_oss" else OTHER_MXFP4_TILES
    hidden_tile, width_tile = table.get(generation, MARLIN_TILES)
    checkpoint = arch.moe_intermediate_size or arch.intermediate_size
    hidden = _round_up(arch.hidden_size, hidden_tile)
    width = tp * _round_up(checkpoint // tp, width_tile)  # each GPU's share, as vLLM divides it
    pads = (
        hidden if hidden != arch.hidden_size else 0,
        width if width != checkpoint else 0,
    )
    if pads == (arch.expert_hidden_pad, arch.expert_width_pad):
        return arch
    return dataclasses.replace(arch, expert_hidden_pad=pads[0], expert_width_pad=pads[1])


def padding_says(arch: Arch, stored: Arch) -> str:
    """What a profile's ``kernel_basis`` says of ``arch``'s experts stored as ``stored``."""
    return (
        f"mxfp4 experts stored padded to the MoE kernel's tiles: hidden {arch.hidden_size:,} -> "
        f"{stored.expert_hidden_pad or arch.hidden_size:,}, width {arch.expert_width:,} -> "
        f"{stored.expert_width:,} over the GPUs (wispsim.model.weight_only.padded_experts)"
    )


def profile_generation(hardware: dict[str, Any], src: str) -> str | None:
    """A profile's GPU generation: its ``hardware.generation`` (or, where an older profile gives
    none, its ``gpu_key``'s); None where it says neither. An unknown generation is refused."""
    gen = hardware.get("generation")
    if gen is None and hardware.get("gpu_key") is not None:
        try:
            gen = load_gpu(str(hardware["gpu_key"])).generation
        except ConfigError:
            gen = None
    if gen is not None and gen not in GENERATIONS:
        raise ConfigError(src, "hardware.generation", f"got {gen!r}; allowed: {', '.join(GENERATIONS)}")
    return None if gen is None else str(gen)


def profile_experts(arch: Arch, hardware: dict[str, Any], tp: int, src: str) -> Arch:
    """:func:`padded_experts` for a profile's ``hardware`` section (:func:`profile_generation`); a
    profile of mxfp4 experts that gives no generation is refused (their tiles depend on it)."""
    gen = profile_generation(hardware, src)
    if gen is None:
        allowed = f"allowed: {', '.join(GENERATIONS)}"
        if mxfp4_experts(arch):  # their tiles depend on the generation
            raise ConfigError(
                src, "hardware.generation", f"is missing (mxfp4 experts are padded by generation); {allowed}"
            )
        return arch
    return padded_experts(arch, str(gen), tp)


INT8_RATE = 2.0  # int8 tensor cores: twice the dense 16-bit rate (A100 624 / 312, H100 1979 / 989 TOPS)


def quantized_rate(
    arch: Arch, bf16_tflops: float, fp8_tflops: float | None, maf: tuple[float, float] | None = None
) -> float:
    """How much faster than a 16-bit profile's dense GEMMs ``arch``'s W8A8 layers multiply on the
    GPU's own 8-bit tensor cores: fp8 at ``fp8_tflops`` over ``bf16_tflops`` (1 without fp8 tensor
    cores: FP8 Marlin converts them, :func:`conversion`), at most the card's max-achievable fp8
    over bf16 FLOPs where it publishes both (``maf``: no fp8 GEMM beats them either); int8 at
    :data:`INT8_RATE`; 1 for weight-only formats. (An older fp8 profile's dense GEMMs are at the
    fp8 peak already: its caller asks only for a 16-bit profile.)"""
    if not arch.quant_act or not 7.5 <= arch.quant_bits <= 8.5:
        return 1.0
    if arch.quant_float:
        rate = fp8_tflops / bf16_tflops if fp8_tflops else 1.0
        return min(rate, maf[1] / maf[0]) if maf and fp8_tflops else rate
    return INT8_RATE

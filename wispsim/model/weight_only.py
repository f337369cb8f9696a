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

from wispsim.model.archs import Arch
from wispsim.model.gpus import GPU
from wispsim.paths import data_dir


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
# ``fused_moe/oracle/mxfp4.py``, ``mxfp4_round_up_hidden_size_and_intermediate_size``; the same
# rules in ``quantization/mxfp4.py`` since 0.10): (the hidden size's multiple, the multiple of each
# GPU's share of an expert's width) by the kernel it picks for the generation (``_kernel``).
MXFP4_TILES = {
    "hopper": (1, 64),  # OpenAI's Triton kernels: the width to 64, the hidden size as it is
    "cdna3": (256, 256),  # ROCm's Triton kernels (gpt-oss's SwiGLU is not a SiLU: 256 both)
    "blackwell": (256, 128),  # FlashInfer's TRT-LLM kernels (0.10-0.11 padded the width to 256)
}
MARLIN_TILES = (256, 128)  # Marlin MoE, every other generation: n % 256 and k % 128 in both GEMMs


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def padded_experts(arch: Arch, generation: str, tp: int) -> Arch:
    """``arch`` with its routed experts as vLLM stores them on each of ``tp`` GPUs of
    ``generation`` (module ``MXFP4_TILES``): padded to the MoE kernel's tiles, which every pass
    reads and multiplies and the weights' memory holds. gpt-oss-120b on an A100 (Marlin): hidden
    2,880 -> 3,072 and width 2,880 -> 2,944, 9% more expert bytes; on one H100 nothing. Unchanged
    for anything but mxfp4 experts (the other formats' kernels take the checkpoint's shapes)."""
    if arch.quant_method != "mxfp4" or not arch.moe_layers or arch.experts <= 1:
        return arch
    hidden_tile, width_tile = MXFP4_TILES.get(generation, MARLIN_TILES)
    share = arch.expert_width // tp  # each GPU's share (whole at the sizes check_parallel accepts)
    hidden = _round_up(arch.hidden_size, hidden_tile)
    width = tp * _round_up(share, width_tile)
    if hidden == arch.hidden_size and width == arch.expert_width:
        return arch
    return dataclasses.replace(arch, expert_hidden_pad=hidden, expert_width_pad=width)


INT8_RATE = 2.0  # int8 tensor cores: twice the dense 16-bit rate (A100 624 / 312, H100 1979 / 989 TOPS)


def quantized_rate(arch: Arch, bf16_tflops: float, fp8_tflops: float | None) -> float:
    """How much faster than a 16-bit profile's dense GEMMs ``arch``'s W8A8 layers multiply on the
    GPU's own 8-bit tensor cores: fp8 at ``fp8_tflops`` over ``bf16_tflops`` (1 without fp8 tensor
    cores: FP8 Marlin converts them, :func:`conversion`), int8 at :data:`INT8_RATE`; 1 for
    weight-only formats. (An fp8 profile's dense GEMMs are at the fp8 peak already: its caller
    asks only for a 16-bit profile.)"""
    if not arch.quant_act or not 7.5 <= arch.quant_bits <= 8.5:
        return 1.0
    if arch.quant_float:
        return fp8_tflops / bf16_tflops if fp8_tflops else 1.0
    return INT8_RATE

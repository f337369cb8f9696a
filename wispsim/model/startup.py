"""What a vLLM server keeps on each GPU outside its weights and its KV cache: the peak of its
start-up memory profile (docs/defaults.md, "Activation reserve").

vLLM sizes the KV cache as total memory x ``gpu_memory_utilization`` - weights - the torch peak of a
profile run - memory allocated outside torch during it (vllm/v1/worker/gpu_worker.py,
``determine_available_memory``), per GPU. The profile run (gpu_model_runner.py ``profile_run``) is

- a forward pass over ``max_num_batched_tokens`` dummy tokens: the residual stream and its normed
  copy, plus the widest transient of a layer (the fused QKV and attention outputs; a dense MLP's
  gate-up and activation outputs; a fused-MoE layer's three per-(token, expert) caches and its fp32
  router logits), activations in bf16; then
- the sampler's warm-up (``_dummy_sampler_run``) over ``max_num_seqs`` rows of logits over the whole
  vocabulary (all-gathered, so every GPU holds them), with top-k and top-p set so that the PyTorch
  sort path runs: at the sort, the bf16 logits (2 B per logit), their fp32 copy (4), the sorted
  values (4) and int64 indices (8), the int64 reverse indices PyTorch's segmented sort fills (8) and
  CUB's alternate key and value buffers (4 + 8): 38 B per logit (torch's
  aten/src/ATen/native/cuda/SortStable.cu ``segmented_sort_pairs``; vLLM's
  v1/sample/ops/topk_topp_sampler.py ``apply_top_k_top_p_pytorch``), while the forward's hidden
  states are still held.

The two do not overlap (the forward's transients are freed before the sampler runs), so the torch
peak is the larger one. Memory allocated outside torch (cuBLAS workspaces, NCCL's buffers) is a flat
0.2 GiB per GPU, a choice: the ``non_torch_memory`` that vLLM's memory-profiling log line prints in
the public logs found is 0.02-0.62 GiB at TP 1 without LoRA (median 0.08 over 19, most of them
consumer cards), 0.26 and 0.34 GiB on the H100s among them (docs/defaults.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from wispsim.errors import ConfigError
from wispsim.model.archs import Arch, available_archs, load_arch
from wispsim.model.profiles import GIB, Profile
from wispsim.model.weight_only import padded_experts

SAMPLER_BYTES_PER_LOGIT = 2 + 4 + 4 + 8 + 8 + 4 + 8
ACTIVATION_BYTES = 2  # bf16 activations, whatever the weights' format
ROUTER_BYTES = 4  # fp32 router logits per (token, expert)
NON_TORCH_GIB = 0.2


@dataclass(frozen=True, slots=True)
class StartupMemory:
    """One GPU's start-up memory profile (bytes): the forward pass, the sampler's warm-up, and what
    is allocated outside torch. ``reserve`` is what the KV cache cannot use."""

    forward: float
    sampler: float
    non_torch: float

    @property
    def peak(self) -> float:
        return max(self.forward, self.sampler)

    @property
    def reserve(self) -> float:
        return self.peak + self.non_torch

    @property
    def reserve_gib(self) -> float:
        return self.reserve / GIB

    def describe(self) -> str:
        return (
            f"{self.reserve_gib:.2f} GiB/GPU (profile run: forward {self.forward / GIB:.2f}, "
            f"sampler {self.sampler / GIB:.2f}; outside torch {self.non_torch / GIB:.2f})"
        )


def arch_startup(arch: Arch, tp: int, max_num_seqs: int, max_num_batched_tokens: int) -> StartupMemory:
    """The start-up profile of ``arch`` on each of ``tp`` GPUs (module docstring)."""
    t, a = max_num_batched_tokens, ACTIVATION_BYTES
    h = arch.hidden_size
    dense = arch.dense_layers > 0 or arch.experts <= 1
    m = _startup(
        t,
        max_num_seqs,
        h,
        arch.vocab_size,
        arch.heads,
        arch.kv_heads,
        arch.head_dim,
        arch.intermediate_size if dense else 0,
        tp,
    )
    if arch.moe_layers and arch.experts > 1:
        routed = arch.experts_per_token * (3 * arch.expert_width / tp + (arch.expert_hidden_pad or h))
        shared = 3 * arch.shared_intermediate_size / tp
        moe = t * a * (2 * h + routed + shared) + t * arch.experts * ROUTER_BYTES
        m = StartupMemory(forward=max(m.forward, moe), sampler=m.sampler, non_torch=m.non_torch)
    return m


def profile_startup(profile: Profile, max_num_seqs: int, max_num_batched_tokens: int) -> StartupMemory:
    """The start-up profile of a profile's model on each of its GPUs: from its architecture where
    the profile names one the package can read, else from its ``model:`` facts (a dense model; a
    profile that gives no ``hidden_size`` / ``intermediate_size`` prices the sampler only)."""
    arch = _arch_of(profile)
    if arch is not None:
        return arch_startup(arch, profile.gpu_count, max_num_seqs, max_num_batched_tokens)
    m = profile.model
    return _startup(
        max_num_batched_tokens,
        max_num_seqs,
        m.hidden_size or 0,
        m.vocab_size,
        m.attention_heads or 0,
        m.kv_heads,
        m.head_dim,
        m.intermediate_size or 0,
        profile.gpu_count,
    )


def _startup(
    t: int, s: int, h: int, vocab: int, heads: int, kv_heads: int, head_dim: int, mlp: int, tp: int
) -> StartupMemory:
    """A dense layer's profile run: the residual stream and the wider of the attention's and the
    MLP's transients over ``t`` tokens, then the sampler over ``s`` rows of ``vocab`` logits."""
    a = ACTIVATION_BYTES
    widest = max((2 * heads + 2 * kv_heads) * head_dim, 3 * mlp) / tp
    forward = t * a * (2 * h + widest) if h else 0.0
    sampler = s * vocab * SAMPLER_BYTES_PER_LOGIT + t * h * a
    return StartupMemory(forward=forward, sampler=sampler, non_torch=NON_TORCH_GIB * GIB)


def _arch_of(profile: Profile) -> Arch | None:
    arch = getattr(profile.forms.get("roofline"), "arch", None)
    if isinstance(arch, Arch):
        return arch
    name = profile.model.arch
    if not name:
        return None
    if name not in available_archs():
        return None
    try:
        arch = load_arch(name)
    except ConfigError:
        return None
    # its experts as the engine stores them, where the profile says on which GPUs
    return padded_experts(arch, profile.generation, profile.gpu_count) if profile.generation else arch

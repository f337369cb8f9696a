"""Model architectures: the facts that profiles are measured on and scaled by.

An architecture is a YAML file under ``wispsim/data/archs/`` holding a model's real
``config.json`` values (hidden size, layers, heads, KV heads, head dim, MLP width, vocabulary; the
experts, latent attention, sliding windows and quantization of :mod:`wispsim.model.arch_config`),
or a user's config.json itself. From them :class:`Arch` computes what the verification-time
estimator's terms stand for:

- parameters, and weight bytes at a dtype (quantized layers at their bits): what a pass reads
  once (the batch constant c; of a mixture, the experts its tokens are routed to);
- linear FLOPs per token: 2 x the weights a token passes through (projections, MLP or routed and
  shared experts, LM head); what ``a`` (seconds per new token) pays for;
- attention FLOPs per query-key interaction: 4 x layers x heads x head dim (QK^T and AV, a
  multiply-add each; MLA: its absorbed form, prefills its expanded one); what ``b_compute`` pays for;
- KV bytes per token: 2 x layers x KV heads x head dim x dtype bytes (MLA: the compressed latent
  and rope key); what ``b_read`` reads.

:func:`check_parallel` holds vLLM's tensor-parallel checks. The GPU datasheets are
:mod:`wispsim.model.gpus` (importable from here too).

The recorder builds random-weight models of these architectures (``--arch``: the engines get the
``config.json`` values, :attr:`Arch.hf`), and derived profiles scale published coefficients by
their ratios (see :mod:`wispsim.measure.profile.derive`). Nothing here imports torch or
transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from wispsim.errors import ConfigError
from wispsim.model.arch_config import arch_fields, quant_tp_problem, read_config_json
from wispsim.model.gpus import (
    GENERATIONS,
    GPU,
    GPU_FIELDS,
    INTERCONNECTS,
    available_gpus,
    gpu_from_dict,
    load_gpu,
)
from wispsim.paths import data_dir

# the GPU datasheets live in wispsim.model.gpus; their names stay importable from here
__all__ = ["GENERATIONS", "GPU", "GPU_FIELDS", "INTERCONNECTS", "Arch", "arch_from_dict", "available_archs"]
__all__ += ["available_gpus", "check_parallel", "dtype_bytes", "gpu_from_dict", "load_arch", "load_gpu"]
__all__ += ["parallel_sizes"]

_DATA = data_dir()

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
DTYPE_BYTES |= {"float8": 1, "fp8": 1, "int8": 1}


def dtype_bytes(dtype: str, source: str = "dtype") -> int:
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise ConfigError(source, "", f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


@dataclass(frozen=True, slots=True)
class Arch:
    """A decoder-only transformer's shape: the fields of its HF ``config.json`` that matter, read by
    :func:`arch_from_dict` (:mod:`wispsim.model.arch_config` says which keys and models). Its
    methods are the one place weights, FLOPs and KV bytes are counted."""

    name: str
    hf_name: str
    model_type: str
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int  # the MLP width of a dense layer
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool
    hf: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    # mixture of experts: routed experts per MoE layer, how many a token passes through, one
    # expert's width (0: intermediate_size), the shared experts' width (all of them), MoE layers
    experts: int = 1
    experts_per_token: int = 1
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    moe_layers: int = 0
    # the routed experts as the engine stores them, where its MoE kernel pads them to its tiles
    # (wispsim.model.weight_only.padded_experts): the hidden size they read and write, and one
    # expert's width summed over the tensor-parallel GPUs (0: the checkpoint's)
    expert_hidden_pad: int = 0
    expert_width_pad: int = 0
    # an EAGLE-3 head: its LM head covers a smaller draft vocabulary (``draft_vocab_size``) than its
    # embedding, and it has matmul weights outside its layers (the fusion of three target layers'
    # hidden states, its first layer's wider QKV input: ``extra_matmul_params``)
    lm_head_vocab: int | None = None
    extra_matmul_params: int = 0
    # multi-head latent attention (DeepSeek): ranks of the compressed KV and query, head widths
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # sliding-window attention: the window (tokens) and how many layers attend only within it
    sliding_window: int = 0
    windowed_layers: int = 0
    # quantized weights: bits per weight (scales included) of the linear layers ``quant_scope``
    # names ("linear" or "experts"), whether the LM head is one of them, and whether the
    # activations are quantized too (else the weights are converted inside each GEMM)
    quant_method: str = ""
    quant_bits: float = 0.0
    quant_scope: str = ""
    quant_head: bool = False
    quant_act: bool = False
    quant_float: bool = False  # floating-point weights (fp8, mxfp4), not integers

    @property
    def head_vocab(self) -> int:
        return self.lm_head_vocab or self.vocab_size

    @property
    def qkv_bias(self) -> bool:
        """Qwen2 has biases on q, k, v (not o); Llama and Qwen3 follow ``attention_bias``."""
        return self.model_type in ("qwen2", "qwen2_moe") or self.attention_bias

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def _attention_matmul(self) -> int:
        h = self.hidden_size
        if self.mla:  # DeepSeek's projections: q (through its LoRA rank), kv_a, kv_b, o
            n, qk = self.heads, self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * n * qk) if self.q_lora_rank else h * n * qk
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv += self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + n * self.v_head_dim * h
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return h * q + 2 * h * kv + q * h

    @property
    def expert_width(self) -> int:
        """One routed expert's width as the engine stores it (module field notes)."""
        return self.expert_width_pad or self.moe_intermediate_size or self.intermediate_size

    @property
    def expert_params(self) -> int:
        """One routed expert (SwiGLU gate, up and down projections), as the engine stores it."""
        return 3 * (self.expert_hidden_pad or self.hidden_size) * self.expert_width

    def _moe_fixed(self) -> int:
        """An MoE layer's weights every token passes through: the router and the shared experts
        (and Qwen2-MoE's shared-expert gate)."""
        h = self.hidden_size
        gate = h if self.shared_intermediate_size and self.model_type == "qwen2_moe" else 0
        return h * self.experts + 3 * h * self.shared_intermediate_size + gate

    def _weights(self, experts_each: float) -> tuple[float, float, float]:
        """Matmul weights with ``experts_each`` routed experts per MoE layer, in three parts:
        (the layers' projections, dense MLPs and shared experts; the routed experts; routers,
        LM head and extra weights)."""
        body = self.layers * self._attention_matmul() + self.dense_layers * 3 * self.hidden_size * (
            self.intermediate_size
        )
        body += self.moe_layers * 3 * self.hidden_size * self.shared_intermediate_size
        routed = self.moe_layers * experts_each * self.expert_params
        rest = self.moe_layers * (self._moe_fixed() - 3 * self.hidden_size * self.shared_intermediate_size)
        return body, routed, rest + self.head_vocab * self.hidden_size + self.extra_matmul_params

    def kernel_latency(self, matmul: float, elementwise: float, routed_apart: bool = False) -> float:
        """The fixed latencies a pass's kernels add, over all layers: a layer launches ``matmul``-
        latency GEMMs and ``elementwise``-floor groups of small kernels, counted as vLLM's model
        code launches them. A dense GQA layer: 4 GEMMs (qkv, o, gate_up, down) and one group
        (norms, rotary, activation, residuals). Multi-head latent attention adds 3 GEMMs (q_a/q_b
        or q, kv_a, the absorbed W_UK and W_UV products, against qkv alone) and a group (its two
        latent norms, the rope split). An MoE layer adds the router GEMM, 2 GEMMs for shared
        experts, and a group for routing (top-k softmax, alignment of tokens to experts, the
        weighted sum of expert outputs); its routed experts are 2 grouped GEMMs in place of a dense
        MLP's 2 (left out with ``routed_apart``: the roofline prices them with the experts)."""
        gemms, groups = 4.0, 1.0
        if self.mla:
            gemms, groups = gemms + 3, groups + 1
        moe_gemms = 1 + (2 if self.shared_intermediate_size else 0)
        total = self.layers * (gemms * matmul + groups * elementwise)
        moe_gemms -= 2 if routed_apart else 0
        return total + self.moe_layers * (moe_gemms * matmul + elementwise)

    def touched_experts(self, tokens: float) -> float:
        """Routed experts per MoE layer that ``tokens`` tokens reach, in expectation (uniform routing)."""
        e, k = self.experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** max(tokens, 1.0))

    def matmul_params_per_token(self) -> int:
        """Weights a token is multiplied with: every layer's projections, its dense MLPs, the
        shared experts and routed experts it is sent to, and the LM head."""
        return int(sum(self._weights(self.experts_per_token)))

    def matmul_weights_read(self, tokens: float) -> float:
        """Matmul weights a forward pass over ``tokens`` tokens reads (once each): all of a dense
        model; of a mixture, the experts its tokens are routed to, in expectation under uniform
        routing: ``E * (1 - (1 - k/E)^tokens)`` experts per MoE layer."""
        return float(sum(self._weights(self.touched_experts(tokens) if self.moe_layers else 1)))

    def _bytes(self, parts: tuple[float, float, float], dtype_bytes_: int) -> float:
        """Bytes of weights in :meth:`_weights`'s parts: the quantized ones at ``quant_bits``, the
        rest at ``dtype_bytes_`` (module :mod:`wispsim.model.arch_config`, ``quantization``)."""
        body, routed, rest = parts
        if not self.quant_method:
            return (body + routed + rest) * dtype_bytes_
        quantized = routed if self.quant_scope == "experts" else body + routed
        if self.quant_head:
            quantized += self.head_vocab * self.hidden_size
        return quantized * self.quant_bits / 8 + (body + routed + rest - quantized) * dtype_bytes_

    def matmul_bytes_read(self, tokens: float, dtype_bytes_: int) -> float:
        """Bytes of :meth:`matmul_weights_read`: quantized layers at their bits, the rest at
        ``dtype_bytes_``."""
        experts = self.touched_experts(tokens) if self.moe_layers else 1
        return self._bytes(self._weights(experts), dtype_bytes_)

    def routed_bytes_read(self, tokens: float, dtype_bytes_: int) -> float:
        """The routed experts' part of :meth:`matmul_bytes_read` (their grouped GEMMs' bytes)."""
        if not self.moe_layers:
            return 0.0
        body, routed, rest = self._weights(self.touched_experts(tokens))
        return self._bytes((body, routed, rest), dtype_bytes_) - self._bytes((body, 0.0, rest), dtype_bytes_)

    @property
    def routed_params_per_token(self) -> int:
        """Routed-expert weights one token is multiplied with (top-k experts per MoE layer)."""
        return self.moe_layers * self.experts_per_token * self.expert_params

    @property
    def parameters(self) -> int:
        """Parameter count, as ``model.num_parameters()`` reports it (of a checkpoint; of an
        architecture with padded experts, what the engine stores)."""
        h = self.hidden_size
        per_layer = 2 * h  # two RMSNorms
        if self.mla:
            per_layer += self.q_lora_rank + self.kv_lora_rank  # the LoRA ranks' norms
        else:
            q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
            per_layer += q + 2 * kv if self.qkv_bias else 0
            per_layer += 2 * self.head_dim if self.model_type in ("qwen3", "qwen3_moe") else 0  # q/k norm
        per_layer += h if self.attention_bias else 0  # o_proj bias
        moe_bias = 0
        if self.model_type == "gpt_oss":  # biased experts and router, a sink logit per head
            per_layer += self.heads
            moe_bias = self.experts * (2 * self.expert_width + (self.expert_hidden_pad or h) + 1)
        elif self.model_type == "deepseek_v3":
            moe_bias = self.experts  # the router's score-correction bias
        body, routed, rest = self._weights(self.experts if self.moe_layers else 1)
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.head_vocab * h  # ``rest`` counts it as a matmul
        norms = self.layers * per_layer + self.moe_layers * moe_bias + h  # + the final norm
        return int(body + routed + rest) - self.head_vocab * h + head + embed + norms

    @property
    def active_parameters(self) -> int:
        """Parameters a token uses: all but the routed experts it is not sent to (embedding
        included, as Qwen, Mistral and DeepSeek count; OpenAI leaves the embedding out)."""
        idle = self.moe_layers * (self.experts - self.experts_per_token) * self.expert_params
        return self.parameters - idle

    @property
    def mlp_width_per_token(self) -> float:
        """MLP width a token's activations pass through, averaged over the layers."""
        moe = self.experts_per_token * self.expert_width + self.shared_intermediate_size
        return (self.dense_layers * self.intermediate_size + self.moe_layers * moe) / self.layers

    @property
    def linear_flops_per_token(self) -> int:
        return 2 * self.matmul_params_per_token()

    @property
    def attention_flops_per_interaction(self) -> int:
        """4 x layers x heads x head dim (QK^T and AV, a multiply-add each). Under MLA, the
        absorbed form vLLM's MLA backends decode with: every head's query meets the cached latent
        and rope key and its output is a latent: 2 x layers x heads x (2 kv_lora_rank +
        qk_rope_head_dim). Requests vLLM runs as prefills: :attr:`prefill_attention`."""
        if self.mla:
            return 2 * self.layers * self.heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return 4 * self.layers * self.heads * self.head_dim

    @property
    def prefill_attention(self) -> tuple[int, int, int]:
        """(FLOPs per query-key pair, FLOPs and values per cached token) of a request vLLM's MLA
        backends run as a prefill (query length above 1, ``mla/common.py``): multi-head attention
        at key width qk_nope + qk_rope and value width v_head, after kv_b_proj projects its cached
        latents up to every head's key and value (values written, then read). Else as decode."""
        if not self.mla:
            return self.attention_flops_per_interaction, 0, 0
        n, qk, v = self.heads, self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim
        up = 2 * self.layers * self.kv_lora_rank * n * (self.qk_nope_head_dim + v)
        return 2 * self.layers * n * (qk + v), up, self.layers * n * (qk + v)

    def _kv_row(self, tp: int = 1) -> int:
        """Values one layer caches per token on one of ``tp`` GPUs: K and V of its KV heads
        (heads replicated where tp exceeds them, as vLLM does); MLA's compressed latent and rope
        key, which every GPU holds whole."""
        if self.mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * max(self.kv_heads // tp, 1) * self.head_dim

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        """KV bytes a token of context holds, all layers (GQA: 2 x layers x KV heads x head dim
        x bytes; MLA: layers x (kv_lora_rank + qk_rope_head_dim) x bytes). Windowed layers count
        in full: this is the most a token costs (a context within the window), and what vLLM's
        reported KV cache size divides by (the engine's :class:`~wispsim.model.batch.Window`
        caps them per sequence)."""
        return self.layers * self._kv_row() * kv_dtype_bytes

    def kv_bytes_per_gpu(self, kv_dtype_bytes: int, tp: int) -> int:
        """:meth:`kv_bytes_per_token` on one of ``tp`` GPUs (replicated heads, MLA's latent whole)."""
        return self.layers * self._kv_row(tp) * kv_dtype_bytes

    def weight_bytes(self, dtype_bytes_: int) -> int:
        """Bytes of all weights: quantized layers at their bits, the rest at ``dtype_bytes_``."""
        matmul = self._weights(self.experts if self.moe_layers else 1)
        return int(self._bytes(matmul, dtype_bytes_) + (self.parameters - sum(matmul)) * dtype_bytes_)

    def model_facts(self, dtype: str, tp: int = 1) -> dict[str, Any]:
        """The ``model:`` section of a profile for this architecture at ``dtype`` on ``tp`` GPUs;
        its 2 x layers x kv_heads x head_dim x bytes is what all ``tp`` GPUs hold per token: heads
        replicated over more GPUs than there are count once per GPU; MLA's latent row is one
        "head" per GPU of half its width (K and V are one tensor)."""
        nbytes = dtype_bytes(dtype)
        row = self._kv_row(tp) * tp  # values per token per layer, all GPUs
        kv_heads = tp if self.mla or self.kv_heads < tp else self.kv_heads
        return {
            "name": self.hf_name,
            "arch": self.name,
            "parameters": float(self.parameters),
            "layers": self.layers,
            "attention_heads": self.heads,
            "kv_heads": kv_heads,
            "head_dim": -(-row // (2 * kv_heads)),
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "kv_dtype_bytes": nbytes,
            "weight_bytes": float(self.weight_bytes(nbytes)),
            # sliding-window layers, as the engine keeps their KV (wispsim.model.batch.Window)
            **({"sliding_window": self.sliding_window, "windowed_layers": self.windowed_layers}
               if self.windowed_layers else {}),
        }  # fmt: skip


def arch_from_dict(data: dict[str, Any], source: str) -> Arch:
    """An architecture from a config.json's values (the whole file: nested ``quantization_config``,
    ``text_config`` and lists such as ``layer_types`` are read), or a one-line refusal."""
    return Arch(**arch_fields(data, source))


def parallel_sizes(arch: Arch, expert_parallel: bool = False) -> list[int]:
    """The tensor-parallel sizes vLLM accepts for ``arch`` (:func:`check_parallel`)."""
    return [t for t in range(1, arch.heads + 1) if not _parallel_problem(arch, t, expert_parallel)]


def _parallel_problem(arch: Arch, tp: int, expert_parallel: bool) -> str:
    if arch.heads % tp:
        return (
            f"Total number of attention heads ({arch.heads}) must be divisible by tensor parallel size ({tp})"
        )
    kv = arch.kv_heads
    if not arch.mla and (kv % tp if kv >= tp else tp % kv):  # MLA's one latent is on every GPU
        return (
            f"Total number of KV heads ({kv}) must be divisible by tensor parallel size ({tp}), "
            "or tensor parallel size by it (vLLM replicates KV heads)"
        )
    if expert_parallel and arch.moe_layers and arch.experts % tp:
        return f"Number of experts ({arch.experts}) must be divisible by the expert parallel size ({tp})"
    widths = {"intermediate_size": arch.intermediate_size} if arch.moe_layers < arch.layers else {}
    if arch.moe_layers and not expert_parallel:
        widths["moe_intermediate_size"] = arch.moe_intermediate_size or arch.intermediate_size
    return quant_tp_problem(arch.hf.get("quantization_config"), widths, tp)


def check_parallel(
    arch: Arch, tp: int, source: str = "--tensor-parallel-size", expert_parallel: bool = False
) -> None:
    """vLLM's checks of a tensor-parallel size, in its words: attention heads divisible by it
    (``ModelConfig.verify_with_parallel_config``); KV heads divisible by it, or it by them
    (``QKVParallelLinear`` replicates KV heads over more GPUs than there are); with
    ``enable_expert_parallel``, experts divisible by the expert-parallel size (tp here)."""
    problem = _parallel_problem(arch, tp, expert_parallel)
    if problem:
        sizes = ", ".join(map(str, parallel_sizes(arch, expert_parallel)))
        raise ConfigError(source, "tensor_parallel_size", f"{problem}; allowed for {arch.name}: {sizes}")


def available_archs() -> list[str]:
    return sorted(p.stem for p in (_DATA / "archs").glob("*.yaml"))


@cache
def load_arch(name_or_path: str) -> Arch:
    """A shipped architecture by name (``qwen3-32b``) or an architecture YAML file by path."""
    p = Path(name_or_path)
    if not p.is_file():
        p = _DATA / "archs" / f"{name_or_path}.yaml"
    if not p.is_file():
        raise ConfigError(
            "profile",
            "model.arch",
            f"unknown architecture {name_or_path!r}; known: {', '.join(available_archs())}",
        )
    data = yaml.safe_load(p.read_text())
    if not isinstance(data, dict):
        raise ConfigError(str(p), "", "an architecture file must be a mapping")
    return arch_from_dict(data, str(p))


def find_arch(model: str, source: str = "--model") -> Arch:
    """What a user names a model by: a shipped architecture (``qwen3-32b``), a Hugging Face
    ``config.json`` or the folder holding one (named after the folder), an architecture YAML, or a
    hub id whose shipped architecture names it (``Qwen/Qwen3-32B``)."""
    p = Path(model)
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise ConfigError(source, "model", f"{model} holds no config.json")
    if p.is_file():
        if p.suffix != ".json":
            return load_arch(str(p))  # an architecture YAML in wispsim's format
        data = read_config_json(p)
        name = p.resolve().parent.name if p.name == "config.json" else p.stem
        return arch_from_dict({**data, "name": name or "model"}, str(p))
    names = available_archs()
    if model in names:
        return load_arch(model)
    for n in names:
        a = load_arch(n)
        if model.lower() in (a.hf_name.lower(), a.hf_name.split("/")[-1].lower()):
            return a
    raise ConfigError(
        source,
        "model",
        f"unknown model {model!r}: give a config.json (or its folder), or one of {', '.join(names)}",
    )

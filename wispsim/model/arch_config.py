"""Reading a Hugging Face ``config.json`` (or an architecture YAML of its values) into the fields of
:class:`wispsim.model.archs.Arch`: which decoder-only transformers are modelled and how, and a
one-line refusal, by name, for the rest.

Modelled, from the keys the public 2025-2026 configs use:

- dense decoders (Llama, Qwen2/3, Mistral, ...): ``hidden_size``, ``num_hidden_layers``, heads,
  KV heads (``num_key_value_heads``, default: one per head, as transformers does), ``head_dim``;
- mixtures of experts: experts from ``num_experts`` (Qwen) | ``num_local_experts`` (Mixtral,
  gpt-oss) | ``n_routed_experts`` (DeepSeek), top-k ``num_experts_per_tok``, expert width
  ``moe_intermediate_size`` (else ``intermediate_size``), shared experts (Qwen2-MoE
  ``shared_expert_intermediate_size``; DeepSeek ``n_shared_experts`` x ``moe_intermediate_size``),
  dense layers with ``intermediate_size`` MLPs (DeepSeek ``first_k_dense_replace`` /
  ``moe_layer_freq``; Qwen ``mlp_only_layers`` / ``decoder_sparse_step``);
- multi-head latent attention (DeepSeek-V2/V3, Kimi K2): ``kv_lora_rank``, ``q_lora_rank``,
  ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``;
- sliding-window attention: ``layer_types`` ("sliding_attention" / "full_attention": gpt-oss,
  Gemma 3), Qwen2's ``use_sliding_window`` + ``max_window_layers``, Gemma 2's alternation, or a
  bare ``sliding_window`` on every layer (Mistral-7B-v0.1). Kept on the architecture and in its
  profile's ``model`` section; vLLM's engine (continuous batching) holds, reads and attends to only
  the window in those layers (:class:`wispsim.model.batch.Window`), while the speculative verifier
  still counts every layer in full (an upper bound on its KV traffic, a lower bound on capacity);
- quantized weights (``quantization_config``): see :func:`quantization`;
- a wrapper's ``text_config`` without a vision or audio tower (its decoder's keys).

Refused by name: state-space and recurrent models (no KV cache), hybrids of attention with
state-space or linear-attention layers, encoder-decoder and encoder-only models (vision encoders
too), vision-language and audio-language models (their towers and their image or audio tokens;
their ``text_config`` alone, as a config.json of its own, sizes text-only serving without the
tower's weights), Llama 4, and a config without the decoder keys above (GPT-2's ``n_embd``...),
named by its ``model_type``. Values of the wrong type or out of range are one-line errors too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from wispsim.errors import ConfigError

MODELLED = "decoder-only transformers (dense, MoE, MLA, sliding window)"
META_KEYS = ("name", "hf_name", "description", "source", "extra_matmul_params")

_SSM = "a state-space model has no KV cache"
_RNN = "a recurrent model has no KV cache"
_HYBRID = "a hybrid of attention and state-space or linear-attention layers"
_ENC_DEC = "an encoder-decoder model"
_ENC = "an encoder-only model generates no tokens"
NOT_MODELLED: dict[str, str] = {
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba"), _SSM),
    **dict.fromkeys(("rwkv", "rwkv5", "rwkv6", "rwkv7", "xlstm", "recurrent_gemma"), _RNN),
    **dict.fromkeys(
        (
            "jamba",
            "zamba",
            "zamba2",
            "bamba",
            "falcon_h1",
            "nemotron_h",
            "granitemoehybrid",
            "lfm2",
            "plamo2",
            "qwen3_next",
            "minimax",
            "minimax_m1",
        ),
        _HYBRID,
    ),
    **dict.fromkeys(
        (
            "t5",
            "mt5",
            "umt5",
            "longt5",
            "switch_transformers",
            "bart",
            "mbart",
            "pegasus",
            "marian",
            "whisper",
            "m2m_100",
            "nllb-moe",
            "led",
            "prophetnet",
            "fsmt",
            "blenderbot",
        ),
        _ENC_DEC,
    ),
    **dict.fromkeys(
        (
            "bert",
            "roberta",
            "xlm-roberta",
            "distilbert",
            "deberta",
            "deberta-v2",
            "electra",
            "albert",
            "modernbert",
            "camembert",
            "mpnet",
        ),
        _ENC,
    ),
    **dict.fromkeys(
        ("clip", "clip_vision_model", "siglip", "siglip_vision_model", "vit", "dinov2", "owlvit", "blip"),
        "a vision encoder generates no tokens",
    ),
    **dict.fromkeys(("llama4", "llama4_text"), "chunked local attention and interleaved MoE layers"),
}
TOWERS = ("vision_config", "audio_config")  # a multimodal wrapper's encoders beside its text_config
DECODER_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
HYBRID_KEYS = ("layers_block_type", "hybrid_override_pattern", "attn_layer_indices", "attn_layer_period")
LAYER_TYPES = ("full_attention", "sliding_attention")

#: ``quant_method`` -> what the weights are: see :func:`quantization`
QUANT_METHODS = ("fp8", "mxfp4", "awq", "gptq", "compressed-tensors")


def read_config_json(path: Path) -> dict[str, Any]:
    """A config.json's object: valid JSON, an object, no key twice in one object."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ConfigError(str(path), twice[0], "appears twice in one object (which value is meant?)")
        return dict(pairs)

    try:
        data = json.loads(path.read_text(), object_pairs_hook=unique)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), "", f"not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), "", "a config.json must be a JSON object")
    return data


def refuse(source: str, field: str, what: str) -> ConfigError:
    return ConfigError(source, field, f"{what} is not modelled; modelled: {MODELLED}")


def _named(data: dict[str, Any], source: str) -> str | None:
    """The config's ``model_type``, refused where it names what is not modelled."""
    mt = data.get("model_type")
    if mt is not None and not isinstance(mt, str):
        raise ConfigError(source, "model_type", f"must be a string, got {mt!r}")
    if mt is not None and mt.lower() in NOT_MODELLED:
        raise refuse(source, "model_type", f"{mt} ({NOT_MODELLED[mt.lower()]})")
    return mt


def unwrap(data: dict[str, Any], source: str) -> dict[str, Any]:
    """The decoder's keys: a vision-language wrapper's ``text_config`` (its quantization and the
    meta keys kept), refusals for what has no KV cache or no decoder."""
    mt = _named(data, source)
    tower = next((k for k in TOWERS if k in data), None)
    if tower is not None:
        what = "vision" if tower == "vision_config" else "audio"
        raise refuse(
            source,
            tower,
            f"model_type {mt} (a {what}-language model: its {what} tower and {what} tokens; its "
            "text_config alone, as a config.json of its own, sizes text-only serving without the tower)",
        )
    text = data.get("text_config")
    if isinstance(text, dict):
        kept = {k: data[k] for k in (*META_KEYS, "quantization_config") if k in data and k not in text}
        data = {**text, **kept}
        data.setdefault("model_type", "text_config")
    mt = _named(data, source)  # the decoder's own, once unwrapped
    for key in HYBRID_KEYS:
        if key in data:
            raise refuse(source, key, f"model_type {mt} ({_HYBRID})")
    if data.get("is_encoder_decoder") is True:
        raise refuse(source, "is_encoder_decoder", f"model_type {mt} ({_ENC_DEC})")
    return data


def whole(data: dict[str, Any], key: str, source: str, default: int | None = None, least: int = 1) -> int:
    v = data.get(key)
    if v is None:
        if default is None:
            raise ConfigError(source, key, "is missing")
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise ConfigError(source, key, f"must be an integer >= {least}, got {v!r}")
    return v


def flag(data: dict[str, Any], key: str, source: str) -> bool:
    v = data.get(key, False)
    if not isinstance(v, bool):
        raise ConfigError(source, key, f"must be true or false, got {v!r}")
    return v


def moe_fields(data: dict[str, Any], layers: int, source: str) -> dict[str, int]:
    """Experts, top-k, expert and shared-expert widths and how many layers are MoE layers."""
    key = next((k for k in ("num_experts", "num_local_experts", "n_routed_experts") if data.get(k)), "")
    experts = whole(data, key, source) if key else 1
    if experts <= 1:
        return {"experts": 1, "experts_per_token": 1, "moe_layers": 0}
    k = whole(data, "num_experts_per_tok", source, data.get("experts_per_token"))
    if k > experts:
        raise ConfigError(source, "num_experts_per_tok", f"must be <= {key} ({experts}), got {k}")
    width = whole(data, "moe_intermediate_size", source, whole(data, "intermediate_size", source))
    shared = whole(data, "shared_expert_intermediate_size", source, 0, least=0)
    shared += whole(data, "n_shared_experts", source, 0, least=0) * width
    if "first_k_dense_replace" in data or "moe_layer_freq" in data:  # DeepSeek
        first = whole(data, "first_k_dense_replace", source, 0, least=0)
        if first > layers:
            raise ConfigError(
                source, "first_k_dense_replace", f"must be <= num_hidden_layers ({layers}), got {first}"
            )
        freq = whole(data, "moe_layer_freq", source, 1)
        moe = [i >= first and i % freq == 0 for i in range(layers)]
    else:  # Qwen2/3-MoE (transformers' rule); Mixtral and gpt-oss have no such keys: every layer
        only = data.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in only
        ):
            raise ConfigError(source, "mlp_only_layers", f"must be a list of layer indices, got {only!r}")
        step = whole(data, "decoder_sparse_step", source, 1)
        moe = [i not in only and (i + 1) % step == 0 for i in range(layers)]
    return {
        "experts": experts,
        "experts_per_token": k,
        "moe_intermediate_size": width,
        "shared_intermediate_size": shared,
        "moe_layers": sum(moe),
    }


def mla_fields(data: dict[str, Any], source: str) -> dict[str, int]:
    """Multi-head latent attention's ranks and head widths (DeepSeek-V2/V3), or nothing."""
    if data.get("kv_lora_rank") is None:
        return {}
    return {
        "kv_lora_rank": whole(data, "kv_lora_rank", source),
        "q_lora_rank": whole(data, "q_lora_rank", source, 0, least=0),  # null: q projected directly
        "qk_rope_head_dim": whole(data, "qk_rope_head_dim", source),
        "qk_nope_head_dim": whole(data, "qk_nope_head_dim", source),
        "v_head_dim": whole(data, "v_head_dim", source),
    }


def window_fields(data: dict[str, Any], layers: int, source: str) -> dict[str, int]:
    """The sliding window and how many layers use it (none: no key)."""
    types = data.get("layer_types")
    window = data.get("sliding_window")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ConfigError(source, "layer_types", f"must list one type per layer ({layers})")
        bad = sorted({str(t) for t in types} - set(LAYER_TYPES))
        if bad:
            raise refuse(source, "layer_types", f"a layer of type {bad[0]!r}")
        windowed = types.count("sliding_attention")
    elif "use_sliding_window" in data:  # Qwen2/3: layers from max_window_layers on, if enabled
        on = data.get("use_sliding_window") is True and window is not None
        windowed = (
            layers - min(whole(data, "max_window_layers", source, layers, least=0), layers) if on else 0
        )
    elif "sliding_window_pattern" in data:  # Gemma 3 before layer_types: every n-th layer is global
        windowed = layers - layers // whole(data, "sliding_window_pattern", source)
    elif data.get("model_type") == "gemma2":  # alternating, local first
        windowed = (layers + 1) // 2
    else:
        windowed = layers if window is not None else 0
    if not windowed or window is None:
        return {}
    w = whole(data, "sliding_window", source)
    if w >= whole(data, "max_position_embeddings", source, 2**62):
        return {}  # a window no context reaches (Phi-3-128k): every layer attends to everything
    return {"sliding_window": w, "windowed_layers": windowed}


def quantization(data: dict[str, Any], experts: int, source: str) -> dict[str, Any]:
    """Bits per weight of the quantized linear layers, and which they are (``quant_scope``:
    "linear": every layer's projections, MLPs and experts, routers excepted; "experts": the experts
    only). Embeddings and the LM head stay at the model dtype unless compressed-tensors quantizes
    ``lm_head`` (not in its ``ignore``).

    - fp8: 8 bits, plus an fp32 scale per ``weight_block_size`` block (DeepSeek-V3: 128 x 128);
    - mxfp4 (gpt-oss): 4 bits plus an 8-bit shared exponent per 32 values = 4.25 bits, on the
      experts (``modules_to_not_convert`` keeps attention, router, embeddings and LM head in bf16);
    - awq, gptq, compressed-tensors: ``bits`` (or ``num_bits`` of the weights' scheme) plus a
      16-bit scale per ``group_size`` weights, and a zero point of ``bits`` per group when the
      scheme is asymmetric (awq ``zero_point``, gptq ``sym: false``): 4-bit, group 128 = 4.16 bits.

    ``quant_act``: the activations are quantized too (fp8 checkpoints, which vLLM runs as W8A8
    where the GPU has fp8 tensor cores; compressed-tensors with ``input_activations``): the GEMM
    runs on the quantized type's tensor cores. Without it the weights are converted to the
    activations' 16-bit type inside the GEMM, whose cost where it is measured is the kernel's
    (:mod:`wispsim.model.weight_only`). ``quant_float``: the weights are floating point (fp8,
    mxfp4; compressed-tensors ``type: float``), not integers."""
    q = data.get("quantization_config")
    if q is None:
        return {}
    if not isinstance(q, dict):
        raise ConfigError(source, "quantization_config", "must be a mapping with quant_method")
    method = str(q.get("quant_method", "")).lower()
    where = "quantization_config.quant_method"
    if method not in QUANT_METHODS:
        raise ConfigError(
            source, where, f"{method or 'none'!r} is not modelled; known: {', '.join(QUANT_METHODS)}"
        )
    head, acts, floats = False, method == "fp8", method in ("fp8", "mxfp4")
    if method == "fp8":
        block = q.get("weight_block_size")
        if block is not None and not (
            isinstance(block, list)
            and len(block) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)
        ):
            raise ConfigError(
                source,
                "quantization_config.weight_block_size",
                f"got {block!r}; allowed: [rows, columns] >= 1",
            )
        bits = 8.0 + (32.0 / (block[0] * block[1]) if block else 0.0)
        scope = "linear"
    elif method == "mxfp4":
        bits, scope = 4.25, "experts" if experts > 1 else "linear"
    else:
        scheme = q
        if method == "compressed-tensors":
            groups = q.get("config_groups") or {}
            first: Any = next(iter(groups.values()), {}) if isinstance(groups, dict) else {}
            scheme = first.get("weights") or {} if isinstance(first, dict) else {}
            if not isinstance(scheme, dict):
                raise ConfigError(
                    source, "quantization_config.config_groups", "each group's weights must be a mapping"
                )
            ignore = q.get("ignore") or []
            head = "lm_head" not in (ignore if isinstance(ignore, list) else [])
            acts = isinstance(first, dict) and first.get("input_activations") is not None
            floats = scheme.get("type") == "float"
        n = scheme.get("bits", scheme.get("num_bits"))
        if n not in (4, 8):
            raise ConfigError(source, "quantization_config.bits", f"got {n!r}; allowed: 4, 8")
        group = scheme.get("group_size") or -1
        if isinstance(group, bool) or not isinstance(group, int) or group == 0 or group < -1:
            raise ConfigError(
                source, "quantization_config.group_size", f"got {group!r}; allowed: an integer >= 1, or -1"
            )
        asym = (
            bool(scheme.get("zero_point")) or scheme.get("sym") is False or scheme.get("symmetric") is False
        )
        bits = float(n) + ((16.0 + (n if asym else 0)) / group if group > 0 else 0.0)
        scope = "linear"
    return {
        "quant_method": method,
        "quant_bits": bits,
        "quant_scope": scope,
        "quant_head": head,
        "quant_act": acts,
        "quant_float": floats,
    }


def quant_tp_problem(q: Any, widths: dict[str, int], tp: int) -> str:
    """vLLM's refusal of a quantized checkpoint's layer widths at tensor-parallel size ``tp``, in its
    words, or "": a block-fp8 checkpoint's gate/up widths per GPU must be whole blocks
    (``weight_block_size``; ``Fp8LinearMethod``) and a grouped int4 one's down-projection input per
    GPU whole groups (``group_size``; AWQ/GPTQ). ``widths``: name -> MLP or expert width."""
    if not isinstance(q, dict) or tp <= 1:
        return ""
    block, group = q.get("weight_block_size"), q.get("group_size")
    for name, width in widths.items():
        if width % tp:
            return f"{name} ({width}) is not divisible by tensor parallel size ({tp})"
        part = width // tp
        if isinstance(block, list) and len(block) == 2 and part % block[0]:
            return (
                f"The output_size of gate's and up's weight = {part} is not divisible by weight "
                f"quantization block_n = {block[0]}"
            )
        if isinstance(group, int) and group > 0 and part % group:
            return (
                f"The input size is not aligned with the quantized weight shape ({name} {part} per GPU, "
                f"group_size {group})"
            )
    return ""


def arch_fields(data: dict[str, Any], source: str) -> dict[str, Any]:
    """The keyword arguments of :class:`wispsim.model.archs.Arch` for a config.json's values."""
    if not isinstance(data, dict):
        raise ConfigError(source, "", "a config.json must be a mapping")
    data = unwrap(data, source)
    if "model_type" not in data:
        raise ConfigError(source, "model_type", "is missing")
    missing = [k for k in DECODER_KEYS if data.get(k) is None]
    if missing:  # a truncated config, or not a Llama-style decoder's (GPT-2's n_embd, a ViT's)
        raise ConfigError(
            source,
            missing[0],
            f"is missing: model_type {data['model_type']} without {', '.join(missing)} is not modelled; "
            f"modelled: {MODELLED} with Hugging Face's Llama-style keys",
        )
    hidden = whole(data, "hidden_size", source)
    layers = whole(data, "num_hidden_layers", source)
    heads = whole(data, "num_attention_heads", source)
    kv_heads = whole(data, "num_key_value_heads", source, heads)
    if heads % kv_heads:
        raise ConfigError(source, "num_key_value_heads", f"must divide num_attention_heads ({heads})")
    intermediate = whole(data, "intermediate_size", source)
    vocab = whole(data, "vocab_size", source)
    head_dim = whole(data, "head_dim", source, hidden // heads)
    if "max_position_embeddings" in data:
        whole(data, "max_position_embeddings", source)
    moe = moe_fields(data, layers, source)
    mla = mla_fields(data, source)
    hf = {k: v for k, v in data.items() if k not in META_KEYS}
    if not mla:
        hf.setdefault("head_dim", head_dim)
    name = str(data.get("name") or Path(source).stem)
    return {
        "name": name,
        "hf_name": str(data.get("hf_name", name)),
        "model_type": str(data["model_type"]),
        "hidden_size": hidden,
        "layers": layers,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "tie_word_embeddings": flag(data, "tie_word_embeddings", source),
        "attention_bias": flag(data, "attention_bias", source),
        "hf": hf,
        "source": str(data.get("source", source)),
        "lm_head_vocab": whole(data, "draft_vocab_size", source) if "draft_vocab_size" in data else None,
        "extra_matmul_params": whole(data, "extra_matmul_params", source, 0, least=0),
        **moe,
        **mla,
        **window_fields(data, layers, source),
        **quantization(data, moe["experts"], source),
    }

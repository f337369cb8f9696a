"""Model architectures and GPU datasheets: the facts that profiles are measured on and scaled by.

An architecture is a YAML file under ``wispsim/data/archs/`` holding a model's real
``config.json`` values (hidden size, layers, heads, KV heads, head dim, MLP width, vocabulary).
From them :class:`Arch` computes what the verification-time estimator's terms stand for:

- parameters, and weight bytes at a dtype (read once per forward pass: the batch constant c);
- linear FLOPs per token: 2 x the weights a token passes through (projections, MLP, LM head);
  what ``a`` (seconds per new token) pays for;
- attention FLOPs per query-key interaction: 4 x layers x heads x head dim (QK^T and AV, a
  multiply-add each); what ``b_compute`` pays for;
- KV bytes per token: 2 x layers x KV heads x head dim x dtype bytes; what ``b_read`` reads.

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
from wispsim.paths import data_dir

_DATA = data_dir()

DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "float8": 1,
    "fp8": 1,
    "int8": 1,
}


def dtype_bytes(dtype: str, source: str = "dtype") -> int:
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise ConfigError(source, "", f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


_META_KEYS = ("name", "hf_name", "description", "source", "extra_matmul_params")


@dataclass(frozen=True, slots=True)
class Arch:
    """A decoder-only transformer's shape (the fields of its HF ``config.json`` that matter)."""

    name: str
    hf_name: str
    model_type: str
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool
    hf: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    experts: int = 1  # mixture of experts: MLP experts per layer (``num_local_experts``)
    experts_per_token: int = 1  # experts each token passes through (``num_experts_per_tok``)
    # an EAGLE-3 head: its LM head covers a smaller draft vocabulary (``draft_vocab_size``) than its
    # embedding, and it has matmul weights outside its layers (the fusion of three target layers'
    # hidden states, its first layer's wider QKV input: ``extra_matmul_params``)
    lm_head_vocab: int | None = None
    extra_matmul_params: int = 0

    @property
    def head_vocab(self) -> int:
        return self.lm_head_vocab or self.vocab_size

    @property
    def qkv_bias(self) -> bool:
        """Qwen2 has biases on q, k, v (not o); Llama and Qwen3 follow ``attention_bias``."""
        return self.model_type == "qwen2" or self.attention_bias

    def _attention_matmul(self) -> int:
        h, q, kv = self.hidden_size, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return h * q + 2 * h * kv + q * h

    @property
    def expert_params(self) -> int:
        """One MLP (one expert of a mixture): gate, up and down projections (SwiGLU)."""
        return 3 * self.hidden_size * self.intermediate_size

    def _router(self) -> int:
        return self.hidden_size * self.experts if self.experts > 1 else 0

    def _per_layer_matmul(self) -> int:
        """Every matmul weight of one layer (all experts of a mixture)."""
        return self._attention_matmul() + self.experts * self.expert_params + self._router()

    def matmul_params_per_token(self) -> int:
        """Weights a token is multiplied with: every layer's projections and the MLP experts it is
        routed to, and the LM head."""
        per_layer = self._attention_matmul() + self.experts_per_token * self.expert_params + self._router()
        return self.layers * per_layer + self.head_vocab * self.hidden_size + self.extra_matmul_params

    def matmul_weights_read(self, tokens: float) -> float:
        """Matmul weights a forward pass over ``tokens`` tokens reads (once each): all of a dense
        model; of a mixture, the experts its tokens are routed to, in expectation under uniform
        routing: ``E * (1 - (1 - k/E)^tokens)`` experts per layer."""
        dense = (
            self.layers * (self._attention_matmul() + self._router())
            + self.head_vocab * self.hidden_size
            + self.extra_matmul_params
        )
        if self.experts <= 1:
            return float(dense + self.layers * self.expert_params)
        e, k = self.experts, self.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** max(tokens, 1.0))
        return float(dense + self.layers * touched * self.expert_params)

    @property
    def parameters(self) -> int:
        """Parameter count, as ``model.num_parameters()`` reports it."""
        h, q, kv = self.hidden_size, self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = self._per_layer_matmul() + 2 * h  # two RMSNorms
        if self.qkv_bias:
            per_layer += q + 2 * kv
        if self.attention_bias:
            per_layer += h  # o_proj bias
        if self.model_type == "qwen3":
            per_layer += 2 * self.head_dim  # q_norm and k_norm
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.head_vocab * h
        return self.layers * per_layer + embed + head + self.extra_matmul_params + h  # + final norm

    @property
    def linear_flops_per_token(self) -> int:
        return 2 * self.matmul_params_per_token()

    @property
    def attention_flops_per_interaction(self) -> int:
        return 4 * self.layers * self.heads * self.head_dim

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_dtype_bytes

    def weight_bytes(self, dtype_bytes_: int) -> int:
        return self.parameters * dtype_bytes_

    def model_facts(self, dtype: str) -> dict[str, Any]:
        """The ``model:`` section of a profile for this architecture at ``dtype``."""
        nbytes = dtype_bytes(dtype)
        return {
            "name": self.hf_name,
            "arch": self.name,
            "parameters": float(self.parameters),
            "layers": self.layers,
            "attention_heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "kv_dtype_bytes": nbytes,
            "weight_bytes": float(self.weight_bytes(nbytes)),
        }


def arch_from_dict(data: dict[str, Any], source: str) -> Arch:
    required = (
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
    )
    for key in required:
        if key not in data:
            raise ConfigError(source, key, "is missing")
    for key in required[1:]:
        v = data[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(source, key, f"must be an integer >= 1, got {v!r}")
    heads = int(data["num_attention_heads"])
    kv_heads = int(data["num_key_value_heads"])
    if heads % kv_heads:
        raise ConfigError(source, "num_key_value_heads", f"must divide num_attention_heads ({heads})")
    head_dim = int(data.get("head_dim") or data["hidden_size"] // heads)
    hf = {k: v for k, v in data.items() if k not in _META_KEYS}
    hf.setdefault("head_dim", head_dim)
    name = str(data.get("name") or Path(source).stem)
    return Arch(
        name=name,
        hf_name=str(data.get("hf_name", name)),
        model_type=str(data["model_type"]),
        hidden_size=int(data["hidden_size"]),
        layers=int(data["num_hidden_layers"]),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(data["intermediate_size"]),
        vocab_size=int(data["vocab_size"]),
        tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        attention_bias=bool(data.get("attention_bias", False)),
        hf=hf,
        source=str(data.get("source", source)),
        experts=_count(data, "num_local_experts", source),
        experts_per_token=_count(data, "num_experts_per_tok", source),
        lm_head_vocab=_count(data, "draft_vocab_size", source) if "draft_vocab_size" in data else None,
        extra_matmul_params=_count(data, "extra_matmul_params", source)
        if "extra_matmul_params" in data
        else 0,
    )


def _count(data: dict[str, Any], key: str, source: str) -> int:
    v = data.get(key, 1)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(source, key, f"must be an integer >= 1, got {v!r}")
    return v


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


GENERATIONS = ("ampere", "ada", "hopper", "blackwell", "cdna3")
INTERCONNECTS = ("nvlink3", "nvlink4", "nvlink5", "pcie4", "pcie5", "infinity-fabric")
GPU_FIELDS = {
    "name": "a display name",
    "generation": f"one of {', '.join(GENERATIONS)}",
    "memory_gib": "usable memory per GPU (GiB)",
    "hbm_bandwidth_gbs": "memory bandwidth per GPU (GB/s)",
    "bf16_tflops": "dense bf16 tensor-core peak (TFLOP/s)",
    "fp8_tflops": "dense fp8 peak (TFLOP/s), null without fp8 tensor cores",
    "interconnect": f"one of {', '.join(INTERCONNECTS)}",
    "link_gbs": "interconnect bandwidth per GPU, one direction (GB/s)",
    "source": "the datasheet the figures come from",
}


@dataclass(frozen=True, slots=True)
class GPU:
    """Datasheet facts of one GPU model (wispsim/data/gpus.yaml, or a user's file of entries in its
    format)."""

    key: str
    name: str
    memory_gib: float
    hbm_bandwidth_gbs: float
    bf16_tflops: float
    source: str = ""
    link_gbs: float | None = None  # per GPU, one direction: what tensor-parallel all-reduces use
    fp8_tflops: float | None = None  # dense; None where the GPU has no fp8 tensor cores
    generation: str = "hopper"  # whose measured kernel efficiencies it takes (efficiency.yaml)
    interconnect: str = "nvlink4"  # what all-reduces run over (interconnects.yaml)


@cache
def _gpu_table() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load((_DATA / "gpus.yaml").read_text())
    assert isinstance(data, dict)
    return data


def available_gpus() -> list[str]:
    return sorted(_gpu_table())


def load_gpu(key: str) -> GPU:
    """A shipped GPU by name (``h100-80gb``), or the one entry of a YAML file of entries in
    gpus.yaml's format (``my-cards.yaml``, or ``my-cards.yaml:key`` where it holds several)."""
    path, entry = key, ""
    if not Path(key).is_file() and ":" in key:
        path, _, entry = key.rpartition(":")
    if Path(path).suffix in (".yaml", ".yml") or Path(path).is_file():
        return _gpu_from_file(Path(path), entry)
    table = _gpu_table()
    if key not in table:
        raise ConfigError(
            "--gpu",
            "gpu",
            f"unknown GPU {key!r}; known: {', '.join(sorted(table))}, or a YAML file of entries",
        )
    return gpu_from_dict(key, table[key], "wispsim/data/gpus.yaml")


def _gpu_from_file(path: Path, entry: str) -> GPU:
    from wispsim.config.parse import read_yaml

    src = str(path)
    if not path.is_file():
        raise ConfigError(src, "", "no such GPU file (a YAML mapping of entries in gpus.yaml's format)")
    data = read_yaml(path)  # strict: duplicate keys, bad UTF-8, malformed YAML are one line
    if not isinstance(data, dict) or not data:
        raise ConfigError(src, "", "must be a mapping of GPU entries (key: {name, generation, ...})")
    if "hbm_bandwidth_gbs" in data:  # one bare entry
        return gpu_from_dict(path.stem, data, src)
    if not entry:
        if len(data) > 1:
            raise ConfigError(
                src, "", f"holds {len(data)} GPUs; name one as {src}:KEY ({', '.join(map(str, data))})"
            )
        entry = str(next(iter(data)))
    if entry not in data:
        raise ConfigError(src, entry, f"no such entry; known: {', '.join(map(str, data))}")
    return gpu_from_dict(entry, data[entry], src)


def gpu_from_dict(key: str, d: Any, src: str) -> GPU:
    """One GPU entry, checked: every field named, numbers positive, kinds known."""
    if not isinstance(d, dict):
        raise ConfigError(src, key, "must be a mapping of " + ", ".join(GPU_FIELDS))
    extra = sorted(set(d) - set(GPU_FIELDS) - {"nvlink_gbs"})
    if extra:
        raise ConfigError(src, f"{key}.{extra[0]}", f"unknown field; allowed: {', '.join(GPU_FIELDS)}")

    def num(field: str, required: bool = True) -> float | None:
        v = d.get(field)
        if v is None:
            if required:
                raise ConfigError(src, f"{key}.{field}", f"is missing ({GPU_FIELDS[field]})")
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < 1e6:
            raise ConfigError(
                src, f"{key}.{field}", f"got {v!r}; allowed: a positive number ({GPU_FIELDS[field]})"
            )
        return float(v)

    gen = d.get("generation", "hopper")
    if gen not in GENERATIONS:
        raise ConfigError(src, f"{key}.generation", f"got {gen!r}; allowed: {', '.join(GENERATIONS)}")
    link = d.get("interconnect")
    if "nvlink_gbs" in d and "link_gbs" not in d:  # the older spelling: an NVLink bandwidth
        d = {**d, "link_gbs": d["nvlink_gbs"]}
        link = link or "nvlink4"
    link = link or "nvlink4"
    if link not in INTERCONNECTS:
        raise ConfigError(src, f"{key}.interconnect", f"got {link!r}; allowed: {', '.join(INTERCONNECTS)}")
    return GPU(
        key=key,
        name=str(d.get("name", key)),
        memory_gib=num("memory_gib"),  # type: ignore[arg-type]
        hbm_bandwidth_gbs=num("hbm_bandwidth_gbs"),  # type: ignore[arg-type]
        bf16_tflops=num("bf16_tflops"),  # type: ignore[arg-type]
        source=str(d.get("source", "")),
        link_gbs=num("link_gbs", required=False),
        fp8_tflops=num("fp8_tflops", required=False),
        generation=str(gen),
        interconnect=str(link),
    )

"""Derived profiles: scale a measured or published profile to another model or GPU (SPEC 4).

Each coefficient of the estimator is the time of one resource per unit of work, so it is scaled
by how much more work the target does per unit and how much faster its hardware does it:

- ``a`` (s per new token) x [linear FLOPs per token of the target / of the source]
  x [peak bf16 FLOP/s x GPUs of the source / of the target];
- ``b_compute`` (s per query-key interaction) x [attention FLOPs per interaction
  (4 x layers x heads x head dim) of target / source] x the same compute-speed ratio;
- ``b_read`` (s per cached token) x [KV bytes per token of target / source]
  x [HBM bandwidth x GPUs of the source / of the target];
- ``c`` (s per batch): with ``c_rule="weights"`` x [weight bytes of target / source] x the same
  bandwidth ratio (a forward pass reads every weight once; this is the batch's fixed cost);
  with ``c_rule="keep"`` unchanged (the fixed cost is taken to be launch and scheduling overhead).

The 95% intervals are scaled by the same factors: they carry the source fit's uncertainty, not
the rule's. The noise sigma is the source's. Tensor parallelism over ``count`` GPUs is taken to
divide compute and memory traffic ideally; its all-reduce cost is not modelled, so multi-GPU
derived profiles are optimistic. Peak-ratio scaling between GPU generations is optimistic too
(real kernels reach a smaller fraction of a newer GPU's peak). Architecture numbers come from
:mod:`wispsim.model.archs` (the models' config.json values), GPU numbers from datasheets
(``wispsim/data/gpus.yaml``). See ``docs/profiles.md``.
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from wispsim.errors import WispsimError
from wispsim.model.archs import GPU, Arch, dtype_bytes, find_arch, load_arch, load_gpu
from wispsim.model.estimator import LINEAR_FORMS
from wispsim.model.physical import sig6
from wispsim.model.profiles import COEFFICIENTS, Profile
from wispsim.model.weight_only import profile_experts

C_RULES = ("weights", "keep")
RULE = (
    "Each coefficient scaled by the target/source ratio of its work per unit and of the hardware "
    "speed for that work: a by linear FLOPs per token (2 x matmul weights incl. LM head) and by "
    "peak bf16 FLOP/s x GPUs; b_compute by attention FLOPs per query-key interaction (4 x layers x "
    "heads x head_dim) and by peak bf16 FLOP/s x GPUs; b_read by KV bytes per token and by HBM "
    "bandwidth x GPUs; c {c_text}. 95% intervals scaled by the same factors; noise sigma kept. "
    "Tensor parallelism assumed ideal (no all-reduce cost). See docs/profiles.md."
)
C_TEXT = {
    "weights": "by weight bytes and by HBM bandwidth x GPUs (one read of the weights per forward pass)",
    "keep": "kept as in the source (fixed launch and scheduling overhead)",
}


def _source_hardware(src: Profile) -> dict[str, Any]:
    if src.bf16_tflops is None or src.hbm_bandwidth_gbs is None:
        raise WispsimError(
            f"profile {src.name!r}: hardware.bf16_tflops and hardware.hbm_bandwidth_gbs are needed to "
            "derive from it"
        )
    hw: dict[str, Any] = {
        "gpu": src.gpu,
        "count": src.gpu_count,
        "bf16_tflops": src.bf16_tflops,
        "hbm_bandwidth_gbs": src.hbm_bandwidth_gbs,
    }
    return hw


def derive(
    src: Profile,
    target: Arch,
    *,
    gpu: GPU | None = None,
    count: int | None = None,
    name: str,
    c_rule: str = "weights",
    dtype: str = "bfloat16",
    source_arch: Arch | None = None,
    command: str = "",
) -> dict[str, Any]:
    """The derived profile as a mapping for ``profiles/NAME.yaml``."""
    if c_rule not in C_RULES:
        raise WispsimError(f"--c-rule: got {c_rule!r}; allowed: {', '.join(C_RULES)}")
    if src.estimator.form not in LINEAR_FORMS:
        raise WispsimError(
            f"--source: profile {src.name!r} is a {src.estimator.form} profile; --form additive scales "
            "coefficients (e.g. --source a100-qwen3-32b-paper); for physics use --form roofline"
        )
    if src.model.arch is None and source_arch is None:
        raise WispsimError(f"profile {src.name!r} has no model.arch: give --source-arch")
    s_arch = source_arch or load_arch(str(src.model.arch))
    s_hw = _source_hardware(src)
    n = count or src.gpu_count
    if n < 1:
        raise WispsimError(f"--count: must be >= 1, got {n}")
    t_hw: dict[str, Any] = (
        {
            "gpu": gpu.name,
            "count": n,
            "bf16_tflops": gpu.bf16_tflops,
            "hbm_bandwidth_gbs": gpu.hbm_bandwidth_gbs,
        }
        if gpu
        else {**s_hw, "count": n}
    )
    mem = gpu.memory_gib if gpu else src.gpu_memory_gib
    # both models' experts as the engine stores them on their GPUs (mxfp4: padded to the kernel's tiles)
    s_gen = {"generation": src.generation, "gpu_key": src.gpu_key}
    s_arch = profile_experts(s_arch, s_gen, src.gpu_count, f"profile {src.name!r}")
    target = profile_experts(target, {"generation": gpu.generation} if gpu else s_gen, n, "--gpu")
    nbytes = dtype_bytes(dtype)
    src_kv = src.model.kv_dtype_bytes
    work = {
        "linear_flops_per_token": (s_arch.linear_flops_per_token, target.linear_flops_per_token),
        "attention_flops_per_interaction": (
            s_arch.attention_flops_per_interaction,
            target.attention_flops_per_interaction,
        ),
        "kv_bytes_per_token": (s_arch.kv_bytes_per_token(src_kv), target.kv_bytes_per_token(nbytes)),
        "weight_bytes": (s_arch.weight_bytes(src_kv), target.weight_bytes(nbytes)),
    }
    compute = (s_hw["bf16_tflops"] * s_hw["count"]) / (t_hw["bf16_tflops"] * t_hw["count"])
    bandwidth = (s_hw["hbm_bandwidth_gbs"] * s_hw["count"]) / (t_hw["hbm_bandwidth_gbs"] * t_hw["count"])

    def ratio(key: str) -> float:
        s, t = work[key]
        return t / s

    factors = {
        "a": ratio("linear_flops_per_token") * compute,
        "b_compute": ratio("attention_flops_per_interaction") * compute,
        "b_read": ratio("kv_bytes_per_token") * bandwidth,
        "c": ratio("weight_bytes") * bandwidth if c_rule == "weights" else 1.0,
    }
    coefficients: dict[str, Any] = {}
    for k in COEFFICIENTS:
        v = getattr(src.estimator, k)
        entry: dict[str, Any] = {"value": sig6(v * factors[k])}
        if k in src.ci95:
            lo, hi = src.ci95[k]
            entry["ci95"] = [sig6(lo * factors[k]), sig6(hi * factors[k])]
        coefficients[k] = entry
    facts = target.model_facts(dtype)
    return {
        "name": name,
        "description": (
            f"{target.hf_name} {dtype} on {n}x {t_hw['gpu']}"
            f"{' (tensor parallel)' if n > 1 else ''}, derived from {src.name} (not measured)"
        ),
        "hardware": {
            "gpu": t_hw["gpu"],
            "count": n,
            "memory_gib": mem,
            "hbm_bandwidth_gbs": t_hw["hbm_bandwidth_gbs"],
            "bf16_tflops": t_hw["bf16_tflops"],
            **({"parallelism": "tensor"} if n > 1 else {}),
        },
        "engine": src.engine,
        "precision": src.precision,
        "model": facts,
        "coefficients": coefficients,
        "fit": {"note": f"not fitted: derived from {src.name}, whose fit quality does not carry over"},
        "noise": {
            "model": src.noise_model,
            "sigma": src.noise_sigma,
            "basis": f"kept from {src.name}",
        },
        "provenance": {
            "kind": "derived",
            "source": src.name,
            "rule": RULE.format(c_text=C_TEXT[c_rule]),
            "c_rule": c_rule,
            "command": command,
            "inputs": {
                "source_profile": src.name,
                "source_arch": s_arch.name,
                "target_arch": target.name,
                "source_coefficients": {k: getattr(src.estimator, k) for k in COEFFICIENTS},
                "source_hardware": s_hw,
                "target_hardware": t_hw,
                "dtype_bytes": {"source": src_kv, "target": nbytes},
                **{k: {"source": float(s), "target": float(t)} for k, (s, t) in work.items()},
                "compute_speed_ratio": sig6(compute),
                "bandwidth_ratio": sig6(bandwidth),
                "factors": {k: sig6(v) for k, v in factors.items()},
            },
        },
    }


def render(profile: dict[str, Any]) -> str:
    """YAML text of a derived profile, with a header saying how to regenerate it."""
    cmd = profile["provenance"].get("command") or "wispsim profile derive"
    head = (
        f"# Derived verification-time profile (not measured): {profile['description']}.\n"
        f"# Generated by: {cmd}\n# (scripts/derive_profiles.py regenerates every shipped derived profile; "
        "rule: docs/profiles.md)\n"
    )
    return head + yaml.safe_dump(profile, sort_keys=False, width=100)


def derive_named(
    source: str,
    arch: str,
    *,
    gpu: str | None = None,
    count: int | None = None,
    name: str,
    c_rule: str = "weights",
    dtype: str = "bfloat16",
    out: str | None = None,
) -> dict[str, Any]:
    """:func:`derive` from names, recording the equivalent ``wispsim profile derive`` command
    (writing ``out``; default ``profiles/NAME.yaml``)."""
    from wispsim.model.profiles import load_profile

    parts = ["wispsim profile derive --form additive", f"--source {source}", f"--arch {arch}"]
    if gpu:
        parts.append(f"--gpu {gpu}")
    if count:
        parts.append(f"--count {count}")
    parts += [
        f"--c-rule {c_rule}",
        f"--dtype {dtype}",
        f"--out {shlex.quote(out or f'profiles/{name}.yaml')}",
    ]
    return derive(
        load_profile(source),
        find_arch(arch, "--arch"),
        gpu=load_gpu(gpu) if gpu else None,
        count=count,
        name=name,
        c_rule=c_rule,
        dtype=dtype,
        command=" ".join(parts),
    )


# The derived profiles shipped in profiles/ (scripts/derive_profiles.py writes them).
SHIPPED: dict[str, dict[str, Any]] = {
    "a100-qwen3-14b-paper": {
        "source": "a100-qwen3-32b-paper",
        "arch": "qwen3-14b",
        "gpu": "a100-80gb",
        "count": 1,
    },
    "2xa100-llama-3.1-70b-paper": {
        "source": "a100-qwen3-32b-paper",
        "arch": "llama-3.1-70b",
        "gpu": "a100-80gb",
        "count": 2,
    },
    "h100-qwen3-32b-paper": {
        "source": "a100-qwen3-32b-paper",
        "arch": "qwen3-32b",
        "gpu": "h100-80gb",
        "count": 1,
    },
}


def roofline_named(
    arch: str,
    gpu: str,
    count: int,
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    name: str | None = None,
    out: str | None = None,
) -> dict[str, Any]:
    """A physical (roofline) profile of ``arch`` on ``count`` x ``gpu`` with the calibrated vLLM
    parameters (:func:`wispsim.model.physical.physical_profile`), recording its command."""
    from wispsim.model.physical import physical_profile

    precision = {"bfloat16": "bf16", "float8": "fp8"}.get(dtype, dtype)
    kv = {"bfloat16": "bf16", "float8": "fp8"}.get(kv_dtype, kv_dtype)
    cmd = (
        f"wispsim profile derive --form roofline --arch {shlex.quote(arch)} --gpu {shlex.quote(gpu)} "
        f"--count {count} "
        f"--dtype {precision} --kv-dtype {kv} --out {shlex.quote(out or f'profiles/{name}.yaml')}"
    )
    return physical_profile(
        find_arch(arch, "--arch"),
        load_gpu(gpu),
        count=count,
        precision=precision,
        kv_dtype=kv,
        name=name,
        command=cmd,
        count_flag="--count",
    )


# the shipped grounded profiles: the headline targets on A100 and H100 (scripts/derive_profiles.py)
GROUNDED: dict[str, dict[str, Any]] = {
    "a100-qwen3-32b": {"arch": "qwen3-32b", "gpu": "a100-80gb", "count": 1},
    "h100-qwen3-32b": {"arch": "qwen3-32b", "gpu": "h100-80gb", "count": 1},
    "h100-qwen3-32b-fp8": {"arch": "qwen3-32b", "gpu": "h100-80gb", "count": 1, "dtype": "fp8"},
    "a100-qwen3-14b": {"arch": "qwen3-14b", "gpu": "a100-80gb", "count": 1},
    "h100-qwen3-14b": {"arch": "qwen3-14b", "gpu": "h100-80gb", "count": 1},
    "2xa100-llama-3.1-70b": {"arch": "llama-3.1-70b", "gpu": "a100-80gb", "count": 2},
    "2xh100-llama-3.1-70b": {"arch": "llama-3.1-70b", "gpu": "h100-80gb", "count": 2},
    "h200-qwen3-32b": {"arch": "qwen3-32b", "gpu": "h200", "count": 1},
}

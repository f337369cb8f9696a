"""Profiles from physics: any architecture on any GPU, priced by the calibrated roofline.

A grounded profile is the ``roofline`` form (:mod:`wispsim.model.roofline`) of an architecture
(``wispsim/data/archs``: config.json facts) on ``count`` GPUs of one kind (``wispsim/data/gpus.yaml``:
datasheet facts) at a precision, with the engine's efficiencies and overheads taken from a
calibration (``wispsim/data/roofline.yaml``: fitted on public measurements of real vLLM
deployments, see experiments/REPORT.md "public GPU measurements"). :func:`physical_profile` builds
the profile mapping (the same YAML ``wispsim profile derive --form roofline`` writes), so latency
and memory describe one deployment: the weights the roofline reads are the weights the KV model
subtracts from the GPU's memory. :func:`parse_roofline` reads a profile's ``roofline`` section.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import yaml

from wispsim.errors import ConfigError
from wispsim.model.archs import (
    GPU,
    Arch,
    arch_from_dict,
    available_archs,
    check_parallel,
    dtype_bytes,
    load_arch,
)
from wispsim.model.attention import decode_threshold
from wispsim.model.host_cpu import HostFacts
from wispsim.model.interconnects import allreduce_facts, allreduce_ms, check_domain
from wispsim.model.profile_fields import PROFILE_MAXIMA, bounded_whole, number, value
from wispsim.model.roofline import (
    ALLREDUCE_LATENCY_S,
    EFFICIENCIES,
    OVERHEADS,
    OVERLAP_RANGE,
    Roofline,
)
from wispsim.model.weight_only import (
    conversion,
    padded_experts,
    padding_says,
    profile_experts,
    profile_generation,
    quantized_rate,
    weights_at,
    weights_said,
)
from wispsim.model.weights_fit import check_fit
from wispsim.paths import data_dir

PRECISIONS = ("bf16", "fp8")  # 16-bit weights, or vLLM's --quantization fp8 of them (weight_only.weights_at)
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


@functools.cache
def _yaml(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((data_dir() / name).read_text())
    return data


def generation_efficiency(generation: str) -> dict[str, Any]:
    """A GPU generation's kernel figures (wispsim/data/efficiency.yaml): bandwidth, compute,
    attention, overlap, kernel_us and the elementwise terms, with ``basis`` saying where they come
    from (a generation without data inherits another's, and says so)."""
    table = _yaml("efficiency.yaml")
    if generation not in table:
        raise ConfigError("efficiency.yaml", generation, f"unknown generation; known: {', '.join(table)}")
    entry = dict(table[generation])
    basis = f"measured on {', '.join(entry.get('measured_on', []))}" if "measured_on" in entry else ""
    if "inherits" in entry:
        parent = generation_efficiency(str(entry["inherits"]))
        basis = f"inherited from {entry['inherits']} ({parent['basis']}): {entry.get('basis', '')}"
        entry = {**parent, **{k: v for k, v in entry.items() if k not in ("inherits", "basis")}}
    ew = table["elementwise"]
    ex = table.get("experts") or {"bandwidth_ratio": 1.0, "compute_ratio": 1.0}
    return {
        "bandwidth": float(entry["bandwidth"]),
        "compute": float(entry["compute"]),
        "attention": float(entry.get("attention", entry["compute"])),
        "overlap": float(entry["overlap"]),
        "kernel_us": float(entry.get("kernel_us", 0.0)),
        "elementwise_floor_us": float(ew["floor_us"]),
        "activation_passes": float(ew["activation_passes"]),
        # routed experts' grouped GEMMs: measured fractions of the dense figures (study.expert_kernels)
        "expert_bandwidth": min(1.0, float(entry["bandwidth"]) * float(ex["bandwidth_ratio"])),
        "expert_compute": min(1.0, float(entry["compute"]) * float(ex["compute_ratio"])),
        "expert_kernel_us": float(ex.get("kernel_us", entry.get("kernel_us", 0.0))),
        "basis": basis,
    }


def sig6(v: float) -> float:
    """Six significant digits: stable YAML, more precision than any input has."""
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
    gpu_memory_utilization: float = 0.9,
    count_flag: str = "--tensor-parallel-size",
) -> dict[str, Any]:
    """The profile mapping of ``arch`` on ``count`` x ``gpu`` at ``precision`` (module docstring;
    fp8: vLLM's ``--quantization fp8`` of a 16-bit checkpoint, :func:`weights_at`). ``params``
    (efficiency and overhead_ms mappings) overrides the calibration's. ``count`` is the
    tensor-parallel size (the option ``count_flag`` sets): vLLM's checks of it
    (:func:`check_parallel`) and of the weights' fit (:func:`check_fit`) refuse what vLLM would
    refuse to start."""
    if precision not in PRECISIONS:
        raise ConfigError("profile", "precision", f"got {precision!r}; allowed: {', '.join(PRECISIONS)}")
    if kv_dtype not in KV_DTYPES:
        raise ConfigError("profile", "kv_dtype", f"got {kv_dtype!r}; allowed: {', '.join(KV_DTYPES)}")
    if count > 1 and gpu.link_gbs is None:
        raise ConfigError(
            "profile",
            "gpu_count",
            f"got {count}: the GPU entry {gpu.key} gives no link_gbs for tensor parallelism",
        )
    arch = weights_at(arch, precision)  # fp8: the linear layers; the other weights stay bf16
    wbytes = dtype_bytes("bf16")
    check_parallel(arch, count, count_flag)
    check_domain(gpu.interconnect, count, count_flag)
    check_fit(arch, gpu, count, "bf16", gpu_memory_utilization, count_flag)
    cal = calibration(calibration_name)
    gen = generation_efficiency(gpu.generation)
    # kernel figures are the GPU generation's (measured); the engine's overheads are the
    # calibration's (fitted end to end); ``params`` overrides either
    chosen: dict[str, Any] = {
        "efficiency": {k: gen[k] for k in ("bandwidth", "compute", "attention")},
        "overlap": gen["overlap"],
        "kernels": {k: gen[k] for k in ("kernel_us", "elementwise_floor_us", "activation_passes")},
        "overhead_ms": {**cal.get("overhead_ms", {}), "allreduce": allreduce_ms(gpu.interconnect)},
    }
    ar = allreduce_facts(gpu.interconnect, count)  # by message size, where measured
    if ar:
        chosen["overhead_ms"]["allreduce_nccl"] = ar["allreduce_nccl"]
        chosen["efficiency"]["link"] = ar["link"]
        chosen["kernels"]["allreduce_fast_mb"] = ar["allreduce_fast_mb"]
    if arch.moe_layers and arch.experts > 1:  # routed experts run as grouped GEMMs
        chosen["efficiency"].update({k: gen[k] for k in ("expert_bandwidth", "expert_compute")})
        chosen["kernels"]["expert_kernel_us"] = gen["expert_kernel_us"]
    maf, peak = gpu.bf16_maf_tflops, gpu.bf16_tflops  # W8A8 layers: quant_rate, parse_roofline
    cap = maf / peak if maf is not None and peak else math.inf
    capped = cap < chosen["efficiency"]["compute"]
    if capped:  # no GEMM beats the card's max-achievable FLOPs (the clock it holds under them)
        for k in ("compute", "attention", "expert_compute"):
            if k in chosen["efficiency"]:
                chosen["efficiency"][k] = min(chosen["efficiency"][k], cap)
    converts = [(part, conversion(arch, gpu, part == "experts")) for part in ("linear layers", "experts")]
    for part, conv in converts:  # weight-only quantized GEMMs convert their weights (measured kernels)
        if conv.measured and conv.compute_ratio < 1.0:
            chosen["efficiency"]["expert_dequant" if part == "experts" else "dequant"] = conv.compute_ratio
    if cal.get("host_cpu_speed") is not None:  # calibrated beside the host-CPU model
        chosen["host_cpu_speed"] = cal["host_cpu_speed"]
    params = dict(params or {})
    if isinstance(params.get("overhead_ms"), dict):  # the all-reduce latencies are the interconnect's
        params["overhead_ms"] = {
            k: v for k, v in params["overhead_ms"].items() if k not in ("allreduce", "allreduce_nccl")
        }
    for key, v in params.items():
        chosen[key] = {**chosen[key], **v} if isinstance(v, dict) and isinstance(chosen.get(key), dict) else v
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
    if gpu.bf16_maf_tflops is not None and gpu.fp8_maf_tflops is not None:  # W8A8 layers' ceiling
        hardware |= {"bf16_maf_tflops": gpu.bf16_maf_tflops, "fp8_maf_tflops": gpu.fp8_maf_tflops}
    hardware["generation"] = gpu.generation
    hardware["interconnect"] = gpu.interconnect
    if gpu.link_gbs is not None:
        hardware["link_gbs"] = gpu.link_gbs
    model = arch.model_facts("bf16", tp=count)
    if arch.name not in available_archs() or load_arch(arch.name) != arch:
        # not a shipped architecture (a user's file or config.json): the profile carries its facts
        model["config"] = {"model_type": arch.model_type, **arch.hf}
    model["kv_dtype_bytes"] = dtype_bytes(kv_dtype)
    stored = padded_experts(arch, gpu.generation, count)  # the experts as the engine stores them
    model["weight_bytes"] = float(stored.weight_bytes(wbytes))
    sigma = cal.get("noise_sigma", 0.05) if noise_sigma is None else noise_sigma
    return {
        "name": name,
        "description": (
            f"{arch.hf_name} {weights_said(arch, 'bf16')} (KV {kv_dtype}) on {count}x {gpu.name}, vLLM: "
            "physical roofline "
            f"with the '{calibration_name}' calibration (not measured on this pair)"
        ),
        "hardware": hardware,
        "engine": "vllm",
        "precision": arch.quant_method or "bf16",  # the weights' format (the unquantized ones bf16)
        "kv_block_size": 16,
        "model": model,
        "estimator": "roofline",
        "roofline": {
            "efficiency": {k: sig6(v) for k, v in chosen["efficiency"].items()},
            "overhead_ms": {k: sig6(v) for k, v in chosen["overhead_ms"].items()},
            **({"overlap": sig6(chosen["overlap"])} if chosen.get("overlap") is not None else {}),
            **(
                {"host_cpu_speed": sig6(chosen["host_cpu_speed"])}
                if chosen.get("host_cpu_speed") is not None
                else {}
            ),
            "kernels": {k: sig6(v) for k, v in chosen.get("kernels", {}).items()},
            "kernel_basis": "; ".join(
                [f"{gpu.generation}: {gen['basis']}"]
                + (
                    [f"compute at most {gpu.name}'s max-achievable {maf:g} of {peak:g} TFLOPs"]
                    if capped
                    else []
                )
                + [f"weight-only {c.says(p, gpu.generation)}" for p, c in converts if c.kernel]
                + ([padding_says(arch, stored)] if stored is not arch else [])
            ),
            "fit": dict(cal.get("fit", {})),
        },
        "noise": {"model": "lognormal", "sigma": sigma, "basis": cal.get("noise_basis", "")},
        "provenance": {
            "kind": "derived",
            "rule": (
                "roofline form (wispsim.model.roofline): architecture facts of "
                f"{arch.hf_name} ({arch.name}), "
                f"GPU facts ({gpu.key}: {gpu.source or 'wispsim/data/gpus.yaml'}), "
                f"kernel efficiencies of the {gpu.generation} generation (wispsim/data/efficiency.yaml), "
                f"all-reduce by message size over {gpu.interconnect} (wispsim/data/interconnects.yaml), "
                "engine "
                f"overheads from the '{calibration_name}' calibration (wispsim/data/roofline.yaml)"
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


def _maf(hw: dict[str, Any], src: str) -> tuple[float, float] | None:
    """(bf16, fp8) max-achievable TFLOPs a profile's hardware section gives, or None."""
    keys = ("bf16_maf_tflops", "fp8_maf_tflops")
    if any(hw.get(k) is None for k in keys):
        return None
    top = PROFILE_MAXIMA["hardware.fp8_tflops"]
    lo, hi = (number(hw, k, src, "hardware.", minimum=1e-3, maximum=top) for k in keys)
    return lo, hi


# the roofline's kernel figures (wispsim/data/efficiency.yaml) and their largest allowed values
KERNELS = {
    "kernel_us": 1000.0,
    "elementwise_floor_us": 1000.0,
    "activation_passes": 100.0,
    "expert_kernel_us": 1000.0,
    "allreduce_fast_mb": 1e6,
}
# roofline parameters: allowed ranges (efficiencies are fractions of a datasheet peak)
ROOFLINE_EFFICIENCY_RANGE = (0.01, 1.0)
ROOFLINE_OVERHEAD_MAX_MS = 1000.0


def parse_host(data: dict[str, Any], src: str) -> HostFacts:
    """What a profile's ``roofline`` section says of its serving host (stored there, fitted with the
    overheads, but not GPU time): the front end's latency (``overhead_ms.frontend``) and the host
    CPU's speed (``host_cpu_speed``; absent: calibrated without the host-CPU model)."""
    sec = data.get("roofline")
    if not isinstance(sec, dict):
        return HostFacts()
    speed = None
    if sec.get("host_cpu_speed") is not None:
        speed = value(sec["host_cpu_speed"], src, "roofline.host_cpu_speed", minimum=0.01, maximum=100.0)
    over = sec.get("overhead_ms") or {}
    frontend = 0.0
    if isinstance(over, dict) and "frontend" in over:
        frontend = number(
            over, "frontend", src, "roofline.overhead_ms.", minimum=0.0, maximum=ROOFLINE_OVERHEAD_MAX_MS
        )
    return HostFacts(frontend=frontend / 1e3, cpu_speed=speed)


def parse_roofline(
    data: dict[str, Any], src: str, hw: dict[str, Any], model: Any, precision: str
) -> Roofline | None:
    """A profile's ``roofline`` section: the physical form's fitted parameters, on the hardware
    and the architecture the profile names (``model.arch``, ``hardware.*``), or None without one.
    The profile's weight bytes must be the architecture's at the precision."""
    sec = data.get("roofline")
    arch_name, weight_bytes_total, kv_dtype_bytes = model.arch, model.weight_bytes, model.kv_dtype_bytes
    arch_config = (data.get("model") or {}).get("config")  # an architecture the package does not ship
    if sec is None:
        return None
    if not isinstance(sec, dict):
        raise ConfigError(src, "roofline", "must be a mapping with efficiency, overhead_ms (and fit)")
    if not isinstance(sec.get("fit") or {}, dict):
        raise ConfigError(src, "roofline.fit", "must be a mapping of fit facts")
    allowed_fields = ("efficiency", "overhead_ms", "overlap", "host_cpu_speed", "kernels", "kernel_basis")
    allowed_fields += ("fit",)
    extra = sorted(set(sec) - set(allowed_fields))
    if extra:
        raise ConfigError(src, f"roofline.{extra[0]}", f"unknown field; allowed: {', '.join(allowed_fields)}")
    kern = sec.get("kernels") or {}
    if not isinstance(kern, dict):
        raise ConfigError(src, "roofline.kernels", f"must be a mapping of {', '.join(KERNELS)}")
    bad = sorted(set(kern) - set(KERNELS))
    if bad:
        raise ConfigError(
            src, f"roofline.kernels.{bad[0]}", f"unknown parameter; allowed: {', '.join(KERNELS)}"
        )
    kn = {key: number(kern, key, src, "roofline.kernels.", minimum=0.0, maximum=KERNELS[key]) for key in kern}
    lo_p, hi_p = OVERLAP_RANGE
    overlap = math.inf  # absent: the ideal roofline (the slower of memory and math)
    if sec.get("overlap") is not None:
        overlap = value(sec["overlap"], src, "roofline.overlap", minimum=lo_p, maximum=hi_p)
    eff = sec.get("efficiency") or {}
    over = sec.get("overhead_ms") or {}
    for key, part, allowed in (("efficiency", eff, EFFICIENCIES), ("overhead_ms", over, OVERHEADS)):
        if not isinstance(part, dict):
            raise ConfigError(src, f"roofline.{key}", f"must be a mapping of {', '.join(allowed)}")
        bad = sorted(set(part) - set(allowed))
        if bad:
            raise ConfigError(
                src, f"roofline.{key}.{bad[0]}", f"unknown parameter; allowed: {', '.join(allowed)}"
            )
    lo, hi = ROOFLINE_EFFICIENCY_RANGE
    e = {
        k: number(eff, k, src, "roofline.efficiency.", minimum=lo, maximum=hi)
        for k in EFFICIENCIES
        if k in eff
    }
    for k in ("bandwidth", "compute"):
        if k not in e:
            raise ConfigError(src, f"roofline.efficiency.{k}", "is missing")
    o = {
        k: number(over, k, src, "roofline.overhead_ms.", minimum=0.0, maximum=ROOFLINE_OVERHEAD_MAX_MS)
        for k in OVERHEADS
        if k in over
    }
    if not arch_name:
        raise ConfigError(
            src, "model.arch", "a roofline profile must name its architecture (wispsim/data/archs)"
        )
    if arch_config is not None:  # an architecture the package does not ship: its config.json values
        if not isinstance(arch_config, dict):
            raise ConfigError(src, "model.config", "must be a mapping of config.json values")
        arch = arch_from_dict({**arch_config, "name": arch_name}, f"{src} model.config")
    else:
        try:
            arch = load_arch(arch_name)
        except ConfigError as err:
            raise ConfigError(src, "model.arch", err.problem) from None
    arch = profile_experts(arch, hw, bounded_whole(hw, "count", src, "hardware."), src)  # as stored
    # a quantized checkpoint's other weights are 16-bit (weight_only.weights_at); an older profile
    # of an unquantized one at fp8 held every weight at 8 bits
    weight_bytes = 2 if arch.quant_method else dtype_bytes(precision, f"{src} precision")
    flops_key = "fp8_tflops" if weight_bytes == 1 else "bf16_tflops"
    facts: dict[str, float] = {}
    link_key = "link_gbs" if hw.get("link_gbs") is not None else "nvlink_gbs"  # the older spelling
    for key in ("hbm_bandwidth_gbs", flops_key, link_key):
        if hw.get(key) is not None:
            facts[key] = number(
                hw, key, src, "hardware.", minimum=1e-3, maximum=PROFILE_MAXIMA[f"hardware.{key}"]
            )
        elif key != link_key:
            raise ConfigError(
                src, f"hardware.{key}", f"is needed by the roofline form at precision {precision}"
            )
    fp8 = None  # a 16-bit profile's W8A8 layers multiply at the fp8 peak (weight_only.quantized_rate)
    if weight_bytes == 2 and hw.get("fp8_tflops") is not None:
        fp8 = number(
            hw, "fp8_tflops", src, "hardware.", minimum=1e-3, maximum=PROFILE_MAXIMA["hardware.fp8_tflops"]
        )
    count = bounded_whole(hw, "count", src, "hardware.")
    if count > 1 and link_key not in facts:
        raise ConfigError(
            src, "hardware.link_gbs", "is needed by the roofline form with tensor parallelism (count > 1)"
        )
    expected = arch.weight_bytes(weight_bytes)
    if abs(weight_bytes_total - expected) > 0.05 * expected:
        raise ConfigError(
            src,
            "model.weight_bytes",
            f"{weight_bytes_total:.4g} disagrees with {arch.name} at {precision} ({expected:.4g} bytes): "
            "latency and memory must describe one deployment",
        )
    return Roofline(
        arch=arch,
        tp=count,
        weight_dtype_bytes=weight_bytes,
        kv_dtype_bytes=kv_dtype_bytes,
        bandwidth=facts["hbm_bandwidth_gbs"] * 1e9,
        peak_flops=facts[flops_key] * 1e12,
        link_bandwidth=facts[link_key] * 1e9 if link_key in facts else math.inf,
        bandwidth_eff=e["bandwidth"],
        compute_eff=e["compute"],
        attention_eff=e.get("attention", e["compute"]),
        overlap=overlap,
        step=o.get("step", 0.0) / 1e3,
        request=o.get("request", 0.0) / 1e3,
        arrival=o.get("arrival", 0.0) / 1e3,
        allreduce=o.get("allreduce", ALLREDUCE_LATENCY_S * 1e3) / 1e3,
        allreduce_nccl=o["allreduce_nccl"] / 1e3 if "allreduce_nccl" in o else None,
        link_eff=e.get("link", 1.0),
        allreduce_fast_bytes=kn["allreduce_fast_mb"] * 2**20 if "allreduce_fast_mb" in kn else math.inf,
        matmul_kernel=kn.get("kernel_us", 0.0) / 1e6,
        elementwise_floor=kn.get("elementwise_floor_us", 0.0) / 1e6,
        activation_passes=kn.get("activation_passes", 0.0),
        expert_bandwidth_eff=e.get("expert_bandwidth"),
        expert_compute_eff=e.get("expert_compute"),
        expert_kernel=kn["expert_kernel_us"] / 1e6 if "expert_kernel_us" in kn else None,
        dequant_eff=e.get("dequant", 1.0),
        expert_dequant_eff=e.get("expert_dequant", 1.0),
        quant_rate=quantized_rate(arch, facts[flops_key], fp8, _maf(hw, src)) if weight_bytes == 2 else 1.0,
        reorder_batch_threshold=decode_threshold(arch, profile_generation(hw, src)),
    )

"""Verification-latency profiles: estimator coefficients for one (GPU, model, precision, engine).

A profile is a YAML file under ``profiles/`` (see ``profiles/a100-qwen3-32b.yaml`` and
``docs/profiles.md``). Besides the coefficients (with their 95% intervals and the fit's quality)
it carries the noise model, the hardware, the engine and precision, the target model's memory
facts that the paged KV-cache model needs, and its provenance: ``published`` (with the citation),
``measured`` (with the raw data file, the command and the date) or ``derived`` (with the rule,
its inputs and the source profile). :func:`load_profile` finds a profile by name or path and
checks all of it, naming the profile and the field in every error.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from wispsim.config import read_yaml
from wispsim.errors import ConfigError
from wispsim.model.archs import DTYPE_BYTES
from wispsim.model.cost import CostModel
from wispsim.model.estimator import DEFAULT_FORM, FORMS, Estimator
from wispsim.model.host_cpu import HostFacts
from wispsim.model.physical import parse_host, parse_roofline
from wispsim.model.profile_fields import (
    PROFILE_MAXIMA,
    bounded_whole,
    engine_layout,
    known_fields,
    number,
    opt_number,
    opt_whole,
    section,
    value,
    window_facts,
)
from wispsim.paths import profiles_dir, resolve_named

GIB = 1024**3
COEFFICIENTS = FORMS.get(DEFAULT_FORM).terms  # the paper's: a, b_compute, b_read, c
PROVENANCE_KINDS = ("published", "measured", "derived", "calibrated")
# what each kind of provenance must say
PROVENANCE_NEEDS = {
    "published": ("citation",),
    "measured": ("data", "command", "date"),
    "derived": ("rule", "inputs"),
    "calibrated": ("rule", "inputs"),  # engine overheads fitted by `wispsim profile calibrate`
}
NOISE_MODELS = ("lognormal",)
TOP_LEVEL = (
    "name",
    "description",
    "hardware",
    "engine",
    "precision",
    "model",
    "coefficients",
    "kv_block_size",
    "engine_layout",
    "estimator",
    "roofline",
    "forms",
    "fit",
    "noise",
    "provenance",
)


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the memory model needs to know about the target model (plus its shape, if known)."""

    name: str
    parameters: float
    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    weight_bytes: float
    vocab_size: int = 151936
    arch: str | None = None
    attention_heads: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    sliding_window: int = 0  # tokens the windowed layers keep (0: no sliding-window layers)
    windowed_layers: int = 0  # of the layers (wispsim.model.memory.kv_window)

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) x layers x KV heads x head dim x dtype bytes (SPEC 2.3)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes


@dataclass(frozen=True, slots=True)
class Profile:
    """One validated profile. ``gpu_memory_gib`` is per GPU; ``gpu_count`` GPUs hold the model
    (tensor parallel), so memory, weights and KV cache are totals over all of them."""

    name: str
    source: str
    estimator: CostModel
    ci95: dict[str, tuple[float, float]]
    noise_sigma: float
    gpu: str
    gpu_count: int
    gpu_memory_gib: float
    engine: str
    precision: str
    model: ModelFacts
    provenance: dict[str, Any]
    fit: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    noise_model: str = "lognormal"
    hbm_bandwidth_gbs: float | None = None
    bf16_tflops: float | None = None
    fp8_tflops: float | None = None
    nvlink_gbs: float | None = None
    price_per_gpu_hour: float | None = None  # hardware.price_per_gpu_hour, for `wispsim plan`
    gpu_key: str | None = None  # hardware.gpu_key: the GPU's key in wispsim/data/gpus.yaml (its public price)
    generation: str | None = None  # hardware.generation (checked by the roofline form, which needs it)
    # every estimator form the profile carries, by name (``coefficients`` is ``additive``)
    forms: dict[str, CostModel] = field(default_factory=dict)
    form_fits: dict[str, dict[str, Any]] = field(default_factory=dict)
    kv_block_size: int | None = None  # tokens per KV block of the engine it was measured on
    # where vLLM's engine core ran when it was measured: "in-process" (the server's process) or
    # "multiprocess" (its own): about 2x apart per batch on a small host (REPORT.md, KV section)
    engine_layout: str | None = None
    # the serving host it was calibrated on: front-end latency, CPU speed (not GPU time)
    host: HostFacts = field(default_factory=HostFacts)

    def check_layout(self, in_process: bool | None, source: str, where: str = "server.profile") -> None:
        """A one-line error when a real server's engine layout (``in_process``; None: unknown) is
        not the one this profile was measured in: its times would not be that server's."""
        if self.engine_layout is None or in_process is None:
            return
        served = "in-process" if in_process else "multiprocess"
        if served != self.engine_layout:
            text = {"in-process": "in the server's process", "multiprocess": "in a process of its own"}
            match = ", ".join(n for n in available_profiles() if _layout_of(n) == served) or "none shipped"
            raise ConfigError(
                source,
                where,
                f"profile '{self.name}' was measured with vLLM's engine core {text[self.engine_layout]}, "
                f"but the server ran it {text[served]}; use a profile measured so ({match})",
            )

    def with_form(
        self, form: str | None, source: str = "scenario", where: str = "server.estimator_form"
    ) -> Profile:
        """This profile with the estimator of ``form`` (one-line error if it does not carry it);
        None keeps the profile's own."""
        if form is None or form == self.estimator.form:
            return self
        if form not in self.forms:
            raise ConfigError(
                source,
                where,
                f"profile '{self.name}' carries no {form!r} estimator; it has: {', '.join(self.forms)} "
                "(fit a linear form with `wispsim profile fit`; a roofline with `wispsim profile derive`)",
            )
        return replace(self, estimator=self.forms[form])

    def kv_capacity_tokens(
        self, utilization: float, reserve_gib: float, draft_weights: float = 0.0, draft_kv: int = 0
    ) -> int:
        """Tokens of KV cache that fit: GPU memory x utilization - weights - activation reserve,
        over the KV bytes per token; a server-side draft model's weights and KV per token
        (``draft_weights``, ``draft_kv``) share the memory."""
        total = self.gpu_memory_gib * GIB * self.gpu_count * utilization
        free = total - self.model.weight_bytes - draft_weights - reserve_gib * GIB * self.gpu_count
        tokens = free // (self.model.kv_bytes_per_token + draft_kv)
        if not math.isfinite(tokens):  # PROFILE_MAXIMA and the scenario's limits rule this out
            raise ConfigError(
                f"profile '{self.name}' ({self.source})",
                "hardware.memory_gib",
                f"the KV cache (hardware.memory_gib x hardware.count x utilization {utilization:g} - "
                f"model.weight_bytes - activation reserve {reserve_gib:g} GiB x hardware.count) "
                "is not a finite number of bytes",
            )
        return max(0, int(tokens))

    @property
    def kind(self) -> str:
        return str(self.provenance["kind"])

    @property
    def data_path(self) -> Path | None:
        """A measured profile's raw data (``provenance.data``, relative to the profile's folder)."""
        data = self.provenance.get("data")
        if not data:
            return None
        p = Path(str(data))
        return p if p.is_absolute() else Path(self.source).parent / p


def _coefficients(
    data: dict[str, Any], src: str, terms: tuple[str, ...] = COEFFICIENTS, where: str = "coefficients"
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    coefs = section(data, "coefficients", src)
    extra = sorted(set(coefs) - set(terms))
    if extra:
        raise ConfigError(src, f"{where}.{extra[0]}", f"unknown coefficient; allowed: {', '.join(terms)}")
    values: dict[str, float] = {}
    ci95: dict[str, tuple[float, float]] = {}
    for k in terms:
        entry = coefs.get(k)
        if entry is None:
            raise ConfigError(src, f"{where}.{k}", "is missing")
        if not isinstance(entry, dict):
            entry = {"value": entry}
        values[k] = number(entry, "value", src, f"{where}.{k}.", minimum=0.0)
        ci = entry.get("ci95")
        if ci is not None:
            if not (isinstance(ci, list) and len(ci) == 2):
                raise ConfigError(src, f"{where}.{k}.ci95", "must be [low, high]")
            lo = value(ci[0], src, f"{where}.{k}.ci95[0]")
            hi = value(ci[1], src, f"{where}.{k}.ci95[1]")
            if not lo <= values[k] <= hi:
                raise ConfigError(src, f"{where}.{k}.ci95", f"[{lo:g}, {hi:g}] must contain {values[k]:g}")
            ci95[k] = (lo, hi)
    return values, ci95


def _estimator(values: dict[str, float], form: str) -> Estimator:
    v = values
    return Estimator(v["a"], v["b_compute"], v["b_read"], v["c"], v.get("d", 0.0), form)


def _forms(
    data: dict[str, Any], src: str, additive: Estimator
) -> tuple[dict[str, Estimator], dict[str, dict[str, Any]]]:
    """The estimator forms a profile carries: ``coefficients`` (the paper's additive form) and,
    under ``forms``, others fitted on the same data (each with its coefficients and fit)."""
    forms = {DEFAULT_FORM: additive}
    fits: dict[str, dict[str, Any]] = {}
    extra = data.get("forms") or {}
    if not isinstance(extra, dict):
        raise ConfigError(src, "forms", "must be a mapping of form name to its coefficients and fit")
    for name, part in extra.items():
        where = f"forms.{name}"
        if name not in FORMS or name == DEFAULT_FORM:
            allowed = ", ".join(n for n in FORMS.names() if n != DEFAULT_FORM)
            raise ConfigError(src, where, f"unknown estimator form; allowed: {allowed}")
        if not isinstance(part, dict):
            raise ConfigError(src, where, "must be a mapping with coefficients (and fit)")
        values, _ = _coefficients(part, src, FORMS.get(name).terms, f"{where}.coefficients")
        forms[str(name)] = _estimator(values, str(name))
        fit = part.get("fit") or {}
        if not isinstance(fit, dict):
            raise ConfigError(src, f"{where}.fit", "must be a mapping of fit metrics")
        fits[str(name)] = dict(fit)
    return forms, fits


def _model(data: dict[str, Any], src: str) -> ModelFacts:
    m = section(data, "model", src)
    if "kv_dtype_bytes" in m:
        kv_bytes = bounded_whole(m, "kv_dtype_bytes", src, "model.")
    elif "kv_dtype" in m:
        kv_bytes = DTYPE_BYTES.get(str(m["kv_dtype"]).lower(), 0)
        if not kv_bytes:
            known = ", ".join(DTYPE_BYTES)
            raise ConfigError(src, "model.kv_dtype", f"got {m['kv_dtype']!r}; known: {known}")
    else:
        raise ConfigError(src, "model.kv_dtype_bytes", "is missing (or give model.kv_dtype, e.g. bfloat16)")
    if "kv_dtype" in m and DTYPE_BYTES.get(str(m["kv_dtype"]).lower()) != kv_bytes:
        raise ConfigError(
            src, "model.kv_dtype", f"{m['kv_dtype']!r} disagrees with kv_dtype_bytes {kv_bytes}"
        )
    facts = ModelFacts(
        name=str(m.get("name", "?")),
        parameters=number(
            m, "parameters", src, "model.", minimum=1, maximum=PROFILE_MAXIMA["model.parameters"]
        ),
        layers=bounded_whole(m, "layers", src, "model."),
        kv_heads=bounded_whole(m, "kv_heads", src, "model."),
        head_dim=bounded_whole(m, "head_dim", src, "model."),
        kv_dtype_bytes=kv_bytes,
        weight_bytes=number(
            m, "weight_bytes", src, "model.", minimum=0, maximum=PROFILE_MAXIMA["model.weight_bytes"]
        ),
        vocab_size=bounded_whole(m, "vocab_size", src, "model.") if "vocab_size" in m else 151936,
        arch=str(m["arch"]) if m.get("arch") else None,
        attention_heads=opt_whole(m, "attention_heads", src, "model."),
        hidden_size=opt_whole(m, "hidden_size", src, "model."),
        intermediate_size=opt_whole(m, "intermediate_size", src, "model."),
        **window_facts(m, src),
    )
    if facts.attention_heads is not None and facts.attention_heads % facts.kv_heads:
        raise ConfigError(src, "model.kv_heads", f"must divide attention_heads ({facts.attention_heads})")
    return facts


def _provenance(data: dict[str, Any], src: str, source: str) -> dict[str, Any]:
    prov = section(data, "provenance", src)
    kind = prov.get("kind")
    if kind not in PROVENANCE_KINDS:
        raise ConfigError(src, "provenance.kind", f"got {kind!r}; allowed: {', '.join(PROVENANCE_KINDS)}")
    for needs in PROVENANCE_NEEDS[kind]:
        if not prov.get(needs):
            raise ConfigError(src, f"provenance.{needs}", f"is required for a {kind} profile")
    if kind in ("derived", "calibrated") and not isinstance(prov["inputs"], dict):
        raise ConfigError(src, "provenance.inputs", "must be a mapping of the rule's inputs")
    if kind == "measured":
        p = Path(str(prov["data"]))
        p = p if p.is_absolute() else Path(source).parent / p
        if not p.is_file():
            raise ConfigError(
                src, "provenance.data", f"raw data file {str(prov['data'])!r} not found (looked for {p})"
            )
    return dict(prov)


def _noise(data: dict[str, Any], src: str) -> tuple[str, float]:
    noise = data.get("noise") or {}
    if not isinstance(noise, dict):
        raise ConfigError(src, "noise", "must be a mapping with model and sigma")
    known_fields(noise, "noise", src)
    model = str(noise.get("model", "lognormal"))
    if model not in NOISE_MODELS:
        raise ConfigError(src, "noise.model", f"got {model!r}; allowed: {', '.join(NOISE_MODELS)}")
    sigma = number(noise, "sigma", src, "noise.", minimum=0.0) if "sigma" in noise else 0.0
    if sigma > 2:
        raise ConfigError(src, "noise.sigma", f"must be <= 2 (a log-normal spread), got {sigma:g}")
    return model, sigma


def _fit(data: dict[str, Any], src: str) -> dict[str, Any]:
    fit = data.get("fit") or {}
    if not isinstance(fit, dict):
        raise ConfigError(src, "fit", "must be a mapping of fit metrics")
    r2 = fit.get("r2")
    if isinstance(r2, dict):
        for split, v in r2.items():
            if v is not None and value(v, src, f"fit.r2.{split}") > 1:
                raise ConfigError(src, f"fit.r2.{split}", f"must be <= 1, got {v}")
    configs = fit.get("configurations")
    if isinstance(configs, dict):
        for split, v in configs.items():
            value(v, src, f"fit.configurations.{split}", minimum=0)
    return dict(fit)


def parse_profile(data: dict[str, Any], source: str) -> Profile:
    """Validate a profile mapping (as read from YAML) and build a :class:`Profile`."""
    if not isinstance(data, dict):
        raise ConfigError(source, "", "a profile must be a mapping")
    name = str(data.get("name") or Path(source).stem)
    src = f"profile '{name}' ({source})"
    unknown = sorted(set(data) - set(TOP_LEVEL))
    if unknown:
        raise ConfigError(src, unknown[0], f"unknown field; allowed: {', '.join(TOP_LEVEL)}")
    hw = section(data, "hardware", src)
    model = _model(data, src)
    precision = str(data.get("precision", "bf16"))
    roofline = parse_roofline(data, src, hw, model, precision)
    if "coefficients" in data or roofline is None:
        values, ci95 = _coefficients(data, src)
        estimator: CostModel = _estimator(values, DEFAULT_FORM)
        forms, form_fits = _forms(data, src, estimator)
    else:
        ci95, forms, form_fits = {}, {}, {}
        if data.get("forms"):
            raise ConfigError(src, "forms", "needs the additive form's coefficients too")
    if roofline is not None:
        forms["roofline"] = roofline
        form_fits["roofline"] = dict((data.get("roofline") or {}).get("fit") or {})
    own = str(data.get("estimator") or ("roofline" if "coefficients" not in data else DEFAULT_FORM))
    if own not in forms:
        raise ConfigError(
            src, "estimator", f"names {own!r}, which the profile does not carry; it has: {', '.join(forms)}"
        )
    estimator = forms[own]
    noise_model, sigma = _noise(data, src)
    profile = Profile(
        name=name,
        source=source,
        estimator=estimator,
        ci95=ci95,
        noise_sigma=sigma,
        gpu=str(hw.get("gpu", "?")),
        gpu_count=bounded_whole(hw, "count", src, "hardware."),
        gpu_memory_gib=number(
            hw, "memory_gib", src, "hardware.", minimum=1e-3, maximum=PROFILE_MAXIMA["hardware.memory_gib"]
        ),
        engine=str(data.get("engine", "?")),
        precision=str(data.get("precision", "?")),
        fp8_tflops=opt_number(hw, "fp8_tflops", src, "hardware."),
        nvlink_gbs=opt_number(hw, "link_gbs" if "link_gbs" in hw else "nvlink_gbs", src, "hardware."),
        model=model,
        provenance=_provenance(data, src, source),
        fit=_fit(data, src),
        description=str(data.get("description", "")),
        noise_model=noise_model,
        hbm_bandwidth_gbs=opt_number(hw, "hbm_bandwidth_gbs", src, "hardware."),
        bf16_tflops=opt_number(hw, "bf16_tflops", src, "hardware."),
        price_per_gpu_hour=opt_number(hw, "price_per_gpu_hour", src, "hardware."),
        gpu_key=str(hw["gpu_key"]) if hw.get("gpu_key") else None,
        generation=str(hw["generation"]) if hw.get("generation") else None,
        forms=forms,
        form_fits=form_fits,
        kv_block_size=opt_whole(data, "kv_block_size", src, ""),
        engine_layout=engine_layout(data, src),
        host=parse_host(data, src),
    )
    if profile.kv_capacity_tokens(1.0, 0.0) <= 0:
        raise ConfigError(
            src, "model.weight_bytes", "the weights do not fit in the GPUs' memory (hardware.count)"
        )
    return profile


def _layout_of(name: str) -> str | None:
    try:
        return load_profile(name).engine_layout
    except ConfigError:
        return None


def find_profile(name_or_path: str, source: str = "scenario", where: str = "server.profile") -> Path:
    """A profile's file by name or path; a one-line error naming ``source`` and ``where`` (the
    scenario field, or the option that named it) and the shipped profiles if there is none."""
    path = resolve_named(name_or_path, profiles_dir(), (".yaml", ".yml"))
    if path is None:
        known = ", ".join(available_profiles()) or "none"
        raise ConfigError(source, where, f"no profile {name_or_path!r}; shipped profiles: {known}")
    return path


def load_profile(name_or_path: str, source: str = "scenario", where: str = "server.profile") -> Profile:
    path = find_profile(name_or_path, source, where)
    try:
        st = path.stat()
    except OSError:
        return parse_profile(read_yaml(path), str(path))  # read_yaml names the problem
    return _load_profile(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=32)
def _load_profile(path: str, mtime_ns: int, size: int) -> Profile:
    """A parsed profile file (cached while the file is unchanged: every run of a sweep reads it)."""
    return parse_profile(read_yaml(Path(path)), path)


def available_profiles() -> list[str]:
    d = profiles_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []

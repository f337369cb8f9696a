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
from wispsim.config.limits import MAX_BLOCK_SIZE, MAX_MEMORY_GIB
from wispsim.errors import ConfigError
from wispsim.model.archs import DTYPE_BYTES, dtype_bytes, load_arch
from wispsim.model.estimator import DEFAULT_FORM, FORMS, Cost, Estimator
from wispsim.model.roofline import ALLREDUCE_LATENCY_S, EFFICIENCIES, OVERHEADS, Roofline
from wispsim.paths import profiles_dir, resolve_named

GIB = 1024**3
COEFFICIENTS = FORMS.get(DEFAULT_FORM).terms  # the paper's: a, b_compute, b_read, c
PROVENANCE_KINDS = ("published", "measured", "derived")
# what each kind of provenance must say
PROVENANCE_NEEDS = {
    "published": ("citation",),
    "measured": ("data", "command", "date"),
    "derived": ("rule", "inputs"),
}
NOISE_MODELS = ("lognormal",)
#: Upper bounds on a profile's hardware and model facts, by field (docs/profiles.md lists them).
#: Each is far above any GPU, host or model that exists, and together they keep the KV-cache
#: arithmetic (:meth:`Profile.kv_capacity_tokens`) finite: a bigger value is a typo, refused.
PROFILE_MAXIMA: dict[str, float] = {
    "hardware.count": 1024,  # GPUs holding one model
    "hardware.memory_gib": MAX_MEMORY_GIB,  # per GPU (a CPU profile: the host's memory)
    "hardware.hbm_bandwidth_gbs": 100_000,  # GB/s per GPU
    "hardware.bf16_tflops": 100_000,  # per GPU
    "hardware.price_per_gpu_hour": 10_000,  # dollars
    "model.parameters": 1e14,
    "model.weight_bytes": 1e15,  # over all the GPUs
    "model.layers": 10_000,
    "model.kv_heads": 1_000_000,
    "model.head_dim": 1_000_000,
    "model.attention_heads": 1_000_000,
    "model.hidden_size": 1_000_000,
    "model.intermediate_size": 1_000_000,
    "model.vocab_size": 10_000_000,
    "model.kv_dtype_bytes": 8,
    "kv_block_size": MAX_BLOCK_SIZE,  # tokens
}
TOP_LEVEL = (
    "name",
    "description",
    "hardware",
    "engine",
    "precision",
    "model",
    "coefficients",
    "kv_block_size",
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
    estimator: Cost
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
    # every estimator form the profile carries, by name (``coefficients`` is ``additive``)
    forms: dict[str, Cost] = field(default_factory=dict)
    form_fits: dict[str, dict[str, Any]] = field(default_factory=dict)
    kv_block_size: int | None = None  # tokens per KV block of the engine it was measured on

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

    def kv_capacity_tokens(self, utilization: float, reserve_gib: float) -> int:
        """Tokens of KV cache that fit: GPU memory x utilization - weights - activation reserve."""
        total = self.gpu_memory_gib * GIB * self.gpu_count * utilization
        free = total - self.model.weight_bytes - reserve_gib * GIB * self.gpu_count
        tokens = free // self.model.kv_bytes_per_token
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


def _num(
    d: dict[str, Any],
    key: str,
    source: str,
    path: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    if key not in d:
        raise ConfigError(source, f"{path}{key}", "is missing")
    return _value(d[key], source, f"{path}{key}", minimum=minimum, maximum=maximum)


def _value(
    v: Any, source: str, where: str, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise ConfigError(source, where, f"must be a number, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(source, where, f"must be a number, got {' '.join(repr(v).split())[:60]}")
    try:
        v = float(v)
    except OverflowError:
        raise ConfigError(
            source, where, f"must be a finite number, got a {len(str(v))}-digit integer"
        ) from None
    if not math.isfinite(v):
        raise ConfigError(source, where, f"must be a finite number, got {v}")
    if minimum is not None and v < minimum:
        raise ConfigError(source, where, f"must be >= {minimum:g}, got {v:g}")
    if maximum is not None and v > maximum:
        raise ConfigError(source, where, f"must be <= {maximum:g}, got {v:g}")
    return v


def _int(
    d: dict[str, Any], key: str, source: str, path: str, *, minimum: int = 1, maximum: float | None = None
) -> int:
    v = _num(d, key, source, path, minimum=minimum, maximum=maximum)
    if v != int(v):
        raise ConfigError(source, f"{path}{key}", f"must be a whole number, got {v:g}")
    return int(v)


def _opt_int(d: dict[str, Any], key: str, source: str, path: str) -> int | None:
    return _bounded_int(d, key, source, path) if d.get(key) is not None else None


def _opt_num(d: dict[str, Any], key: str, source: str, path: str) -> float | None:
    maximum = PROFILE_MAXIMA.get(f"{path}{key}")
    return _num(d, key, source, path, minimum=0.0, maximum=maximum) if d.get(key) is not None else None


def _bounded_int(d: dict[str, Any], key: str, source: str, path: str) -> int:
    """A whole number >= 1 and within its :data:`PROFILE_MAXIMA` bound."""
    return _int(d, key, source, path, maximum=PROFILE_MAXIMA[f"{path}{key}"])


def _section(d: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    v = d.get(key)
    if not isinstance(v, dict):
        raise ConfigError(source, key, "is missing or not a mapping")
    return v


def _coefficients(
    data: dict[str, Any], src: str, terms: tuple[str, ...] = COEFFICIENTS, where: str = "coefficients"
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    coefs = _section(data, "coefficients", src)
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
        values[k] = _num(entry, "value", src, f"{where}.{k}.", minimum=0.0)
        ci = entry.get("ci95")
        if ci is not None:
            if not (isinstance(ci, list) and len(ci) == 2):
                raise ConfigError(src, f"{where}.{k}.ci95", "must be [low, high]")
            lo = _value(ci[0], src, f"{where}.{k}.ci95[0]")
            hi = _value(ci[1], src, f"{where}.{k}.ci95[1]")
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
    for name, section in extra.items():
        where = f"forms.{name}"
        if name not in FORMS or name == DEFAULT_FORM:
            allowed = ", ".join(n for n in FORMS.names() if n != DEFAULT_FORM)
            raise ConfigError(src, where, f"unknown estimator form; allowed: {allowed}")
        if not isinstance(section, dict):
            raise ConfigError(src, where, "must be a mapping with coefficients (and fit)")
        values, _ = _coefficients(section, src, FORMS.get(name).terms, f"{where}.coefficients")
        forms[str(name)] = _estimator(values, str(name))
        fit = section.get("fit") or {}
        if not isinstance(fit, dict):
            raise ConfigError(src, f"{where}.fit", "must be a mapping of fit metrics")
        fits[str(name)] = dict(fit)
    return forms, fits


# roofline parameters: allowed ranges (efficiencies are fractions of a datasheet peak)
ROOFLINE_EFFICIENCY_RANGE = (0.01, 1.0)
ROOFLINE_OVERHEAD_MAX_MS = 1000.0


def _roofline(
    data: dict[str, Any], src: str, hw: dict[str, Any], model: ModelFacts, precision: str
) -> Roofline | None:
    """The ``roofline`` section: the physical form's fitted parameters, on the hardware and the
    architecture the profile names (``model.arch``, ``hardware.*``; wispsim.model.roofline)."""
    sec = data.get("roofline")
    if sec is None:
        return None
    if not isinstance(sec, dict):
        raise ConfigError(src, "roofline", "must be a mapping with efficiency, overhead_ms (and fit)")
    extra = sorted(set(sec) - {"efficiency", "overhead_ms", "fit"})
    if extra:
        raise ConfigError(src, f"roofline.{extra[0]}", "unknown field; allowed: efficiency, overhead_ms, fit")
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
    e = {k: _num(eff, k, src, "roofline.efficiency.", minimum=lo) for k in EFFICIENCIES if k in eff}
    for k, v in e.items():
        if v > hi:
            raise ConfigError(
                src, f"roofline.efficiency.{k}", f"is a fraction of the GPU's peak: must be <= 1, got {v:g}"
            )
    for k in ("bandwidth", "compute"):
        if k not in e:
            raise ConfigError(src, f"roofline.efficiency.{k}", "is missing")
    o = {k: _num(over, k, src, "roofline.overhead_ms.", minimum=0.0) for k in OVERHEADS if k in over}
    for k, v in o.items():
        if v > ROOFLINE_OVERHEAD_MAX_MS:
            raise ConfigError(
                src, f"roofline.overhead_ms.{k}", f"must be <= {ROOFLINE_OVERHEAD_MAX_MS:g}, got {v:g}"
            )
    if not model.arch:
        raise ConfigError(
            src, "model.arch", "a roofline profile must name its architecture (wispsim/data/archs)"
        )
    try:
        arch = load_arch(model.arch)
    except ConfigError as err:
        raise ConfigError(src, "model.arch", err.problem) from None
    weight_bytes = dtype_bytes(precision, f"{src} precision")
    flops_key = "fp8_tflops" if weight_bytes == 1 else "bf16_tflops"
    for key in ("hbm_bandwidth_gbs", flops_key):
        if hw.get(key) is None:
            raise ConfigError(
                src, f"hardware.{key}", f"is needed by the roofline form at precision {precision}"
            )
    count = int(hw.get("count", 1))
    link = hw.get("nvlink_gbs")
    if count > 1 and link is None:
        raise ConfigError(
            src, "hardware.nvlink_gbs", "is needed by the roofline form with tensor parallelism (count > 1)"
        )
    expected = arch.weight_bytes(weight_bytes)
    if abs(model.weight_bytes - expected) > 0.05 * expected:
        raise ConfigError(
            src,
            "model.weight_bytes",
            f"{model.weight_bytes:.4g} disagrees with {arch.name} at {precision} ({expected:.4g} bytes): "
            "latency and memory must describe one deployment",
        )
    return Roofline(
        arch=arch,
        tp=count,
        weight_dtype_bytes=weight_bytes,
        kv_dtype_bytes=model.kv_dtype_bytes,
        bandwidth=_value(hw["hbm_bandwidth_gbs"], src, "hardware.hbm_bandwidth_gbs", minimum=1e-3) * 1e9,
        peak_flops=_value(hw[flops_key], src, f"hardware.{flops_key}", minimum=1e-3) * 1e12,
        link_bandwidth=_value(link, src, "hardware.nvlink_gbs", minimum=1e-3) * 1e9
        if link is not None
        else math.inf,
        bandwidth_eff=e["bandwidth"],
        compute_eff=e["compute"],
        attention_eff=e.get("attention", e["compute"]),
        step=o.get("step", 0.0) / 1e3,
        request=o.get("request", 0.0) / 1e3,
        arrival=o.get("arrival", 0.0) / 1e3,
        allreduce=o.get("allreduce", ALLREDUCE_LATENCY_S * 1e3) / 1e3,
        frontend=o.get("frontend", 0.0) / 1e3,
        mixed=o.get("mixed", 0.0) / 1e3,
    )


def _model(data: dict[str, Any], src: str) -> ModelFacts:
    m = _section(data, "model", src)
    if "kv_dtype_bytes" in m:
        kv_bytes = _bounded_int(m, "kv_dtype_bytes", src, "model.")
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
        parameters=_num(
            m, "parameters", src, "model.", minimum=1, maximum=PROFILE_MAXIMA["model.parameters"]
        ),
        layers=_bounded_int(m, "layers", src, "model."),
        kv_heads=_bounded_int(m, "kv_heads", src, "model."),
        head_dim=_bounded_int(m, "head_dim", src, "model."),
        kv_dtype_bytes=kv_bytes,
        weight_bytes=_num(
            m, "weight_bytes", src, "model.", minimum=0, maximum=PROFILE_MAXIMA["model.weight_bytes"]
        ),
        vocab_size=_bounded_int(m, "vocab_size", src, "model.") if "vocab_size" in m else 151936,
        arch=str(m["arch"]) if m.get("arch") else None,
        attention_heads=_opt_int(m, "attention_heads", src, "model."),
        hidden_size=_opt_int(m, "hidden_size", src, "model."),
        intermediate_size=_opt_int(m, "intermediate_size", src, "model."),
    )
    if facts.attention_heads is not None and facts.attention_heads % facts.kv_heads:
        raise ConfigError(src, "model.kv_heads", f"must divide attention_heads ({facts.attention_heads})")
    return facts


def _provenance(data: dict[str, Any], src: str, source: str) -> dict[str, Any]:
    prov = _section(data, "provenance", src)
    kind = prov.get("kind")
    if kind not in PROVENANCE_KINDS:
        raise ConfigError(src, "provenance.kind", f"got {kind!r}; allowed: {', '.join(PROVENANCE_KINDS)}")
    for needs in PROVENANCE_NEEDS[kind]:
        if not prov.get(needs):
            raise ConfigError(src, f"provenance.{needs}", f"is required for a {kind} profile")
    if kind == "derived" and not isinstance(prov["inputs"], dict):
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
    model = str(noise.get("model", "lognormal"))
    if model not in NOISE_MODELS:
        raise ConfigError(src, "noise.model", f"got {model!r}; allowed: {', '.join(NOISE_MODELS)}")
    sigma = _num(noise, "sigma", src, "noise.", minimum=0.0) if "sigma" in noise else 0.0
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
            if v is not None and _value(v, src, f"fit.r2.{split}") > 1:
                raise ConfigError(src, f"fit.r2.{split}", f"must be <= 1, got {v}")
    configs = fit.get("configurations")
    if isinstance(configs, dict):
        for split, v in configs.items():
            _value(v, src, f"fit.configurations.{split}", minimum=0)
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
    hw = _section(data, "hardware", src)
    model = _model(data, src)
    precision = str(data.get("precision", "bf16"))
    roofline = _roofline(data, src, hw, model, precision)
    if "coefficients" in data or roofline is None:
        values, ci95 = _coefficients(data, src)
        estimator: Cost = _estimator(values, DEFAULT_FORM)
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
        gpu_count=_bounded_int(hw, "count", src, "hardware."),
        gpu_memory_gib=_num(
            hw, "memory_gib", src, "hardware.", minimum=1e-3, maximum=PROFILE_MAXIMA["hardware.memory_gib"]
        ),
        engine=str(data.get("engine", "?")),
        precision=str(data.get("precision", "?")),
        fp8_tflops=_opt_num(hw, "fp8_tflops", src, "hardware."),
        nvlink_gbs=_opt_num(hw, "nvlink_gbs", src, "hardware."),
        model=model,
        provenance=_provenance(data, src, source),
        fit=_fit(data, src),
        description=str(data.get("description", "")),
        noise_model=noise_model,
        hbm_bandwidth_gbs=_opt_num(hw, "hbm_bandwidth_gbs", src, "hardware."),
        bf16_tflops=_opt_num(hw, "bf16_tflops", src, "hardware."),
        price_per_gpu_hour=_opt_num(hw, "price_per_gpu_hour", src, "hardware."),
        forms=forms,
        form_fits=form_fits,
        kv_block_size=_opt_int(data, "kv_block_size", src, ""),
    )
    if profile.kv_capacity_tokens(1.0, 0.0) <= 0:
        raise ConfigError(
            src, "model.weight_bytes", "the weights do not fit in the GPUs' memory (hardware.count)"
        )
    return profile


def find_profile(name_or_path: str) -> Path:
    path = resolve_named(name_or_path, profiles_dir(), (".yaml", ".yml"))
    if path is None:
        known = ", ".join(available_profiles()) or "none"
        raise ConfigError(
            "scenario", "server.profile", f"no profile {name_or_path!r}; shipped profiles: {known}"
        )
    return path


def load_profile(name_or_path: str) -> Profile:
    path = find_profile(name_or_path)
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

"""The products of ``wispsim profile fit``: the profile YAML, its markdown report, the fit folder.

:func:`fit_command` fits a measurement CSV (:mod:`~wispsim.measure.profile.fit`) and writes,
beside the profile ``NAME.yaml``: ``NAME.report.md`` (coefficients with their intervals, train
and test metrics, cross-validation, noise, errors by regime) and ``NAME.fit/`` (per-configuration
predictions, errors by regime, and the actual-vs-predicted and residual figures drawn by
:mod:`wispsim.plots.profile_fit`). The profile records where it came from: the data, the
recording's command, host and versions, and the fit's settings.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from pathlib import Path
from typing import Any

from wispsim.errors import ConfigError, WispsimError
from wispsim.measure.profile.fit import FitResult, fit
from wispsim.model.estimator import DEFAULT_FORM, FORMS, LINEAR_FORMS
from wispsim.model.measured import read_measurements
from wispsim.plots.profile_fit import plot_fit
from wispsim.tabular import read_json


def _r(v: float | None, digits: int = 4) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(f"{v:.{digits}g}")


def read_meta(data: Path) -> dict[str, Any]:
    """The recording's sidecar ``DATA.meta.json`` (empty if absent): a JSON object whose
    ``model_facts``, ``host`` and ``plan_meta`` are objects where present."""
    p = Path(str(data) + ".meta.json")
    if not p.is_file():
        return {}
    doc = read_json(p)
    if not isinstance(doc, dict):
        raise ConfigError(str(p), "", f"must be a JSON object, got {type(doc).__name__}")
    for key in ("model_facts", "host", "plan_meta"):
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise ConfigError(str(p), key, f"must be a JSON object, got {type(doc[key]).__name__}")
    return doc


def _coefficients(res: FitResult) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for k, v in res.coef.items():
        value = float(f"{v:.6g}")
        out[k] = {"value": value}
        if k in res.ci95:  # rounding must not push the value out of its interval
            lo, hi = (float(f"{x:.6g}") for x in res.ci95[k])
            out[k]["ci95"] = [min(lo, value), max(hi, value)]
    return out


def _engine_label(meta: dict[str, Any]) -> str:
    """What timed the data: the engine, and what about it shapes the timings."""
    if meta.get("engine") != "vllm":
        return f"{meta.get('engine', '?')} (attention: {meta.get('attention', '?')})"
    facts = meta.get("engine_facts") or {}
    version = (meta.get("versions") or {}).get("vllm", "?")
    backend = "CPU backend" if facts.get("device", meta.get("device")) == "cpu" else "CUDA"
    caching = "on" if meta.get("prefix_caching", True) else "off"
    block = facts.get("block_size", "?")
    return f"vllm {version} ({backend}, prefix caching {caching}, KV block {block}, eager)"


ERRORS = ("r2", "adj_r2", "rmse_ms", "mae_ms", "mape_pct", "max_error_ms")


def _errors(res: FitResult) -> dict[str, Any]:
    return {key: {"train": _r(res.train.get(key)), "test": _r(res.test.get(key))} for key in ERRORS}


def _by_category(res: FitResult) -> dict[str, Any]:
    return {
        f"{r['split']}/{r['category']}": {
            "n": int(r["n"]),
            "mae_ms": _r(r["mae_ms"]),
            "mape_pct": _r(r["mape_pct"]),
        }
        for r in res.by_category.to_dict("records")
    }


def engine_layout(meta: dict[str, Any]) -> str | None:
    """Where vLLM's engine core ran for a recording: what a deployment's server reported
    (``engine_in_process``), else the recorder's ``VLLM_ENABLE_V1_MULTIPROCESSING`` (vLLM's
    default, unset, is a process of its own); None for other engines."""
    if "vllm" not in str(meta.get("engine", "")).lower():
        return None
    facts = meta.get("engine_facts") or {}
    in_process = facts.get("engine_in_process")
    if in_process is None:  # `profile record` keeps the vLLM environment with the engine's facts
        env = facts.get("vllm_env") or meta.get("vllm_env") or {}
        in_process = env.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
    return "in-process" if in_process else "multiprocess"


def profile_dict(
    res: FitResult,
    data: Path,
    out: Path,
    meta: dict[str, Any],
    *,
    name: str,
    command: str,
    gpu: str | None = None,
    gpu_count: int = 1,
    memory_gib: float | None = None,
    others: list[FitResult] | None = None,
) -> dict[str, Any]:
    """The fitted profile as a mapping that :func:`wispsim.model.profiles.parse_profile` accepts:
    ``res`` (the paper's additive form) gives its coefficients; each of ``others`` (other forms
    fitted on the same rows) goes under ``forms`` with its coefficients and errors."""
    facts = meta.get("model_facts") or {}
    host = meta.get("host") or {}
    need = ("parameters", "layers", "kv_heads", "head_dim", "kv_dtype_bytes", "weight_bytes")
    missing = [k for k in need if k not in facts]
    if missing:
        raise WispsimError(
            f"{data}.meta.json: no model facts ({', '.join(missing)} missing); record with "
            "`wispsim profile record`, which writes them"
        )
    numeric = (*need, "attention_heads", "hidden_size", "intermediate_size", "vocab_size")
    for k, v in facts.items():  # counts whole, sizes finite and >= 0 (never truncated or cast)
        if k not in numeric:
            continue
        whole = k not in ("parameters", "weight_bytes")
        number = isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 1e18
        if not number or (whole and v != int(v)):
            what = "a whole number" if whole else "a number"
            raise ConfigError(f"{data}.meta.json", f"model_facts.{k}", f"got {v!r}; allowed: {what} >= 0")
    device = str(meta.get("device", "cpu"))
    if gpu is None:
        if device.startswith("cuda"):
            gpu = str(host.get("gpu", "GPU"))
        else:
            gpu = f"CPU: {host.get('cpu', '?')} ({host.get('torch_threads', '?')} threads)"
    if memory_gib is None:
        memory_gib = host.get("gpu_memory_gib") if device.startswith("cuda") else host.get("memory_gib")
    if not memory_gib:
        raise WispsimError(
            "the data's meta file does not say how much memory the device has: give --memory-gib"
        )
    rel = os.path.relpath(data.resolve(), out.resolve().parent)
    forms = {
        o.form: {
            "coefficients": _coefficients(o),
            "fit": {
                "method": o.method,
                **({"note": o.note} if o.note else {}),
                **_errors(o),
                "noise_sigma": _r(o.sigma),
                "by_category": _by_category(o),
            },
        }
        for o in others or []
    }
    return {
        "name": name,
        "description": (
            f"{facts.get('name', '?')} {meta.get('dtype', '?')} on {gpu_count}x {gpu}, "
            f"{meta.get('engine', '?')} engine (measured and fitted by wispsim)"
        ),
        "hardware": {"gpu": gpu, "count": gpu_count, "memory_gib": _r(float(memory_gib))},
        "engine": _engine_label(meta),
        "precision": str(meta.get("dtype", "?")),
        "model": {
            "name": str(facts.get("name", "?")),
            **({"arch": facts["arch"]} if facts.get("arch") else {}),
            "parameters": float(facts["parameters"]),
            "layers": int(facts["layers"]),
            **({"attention_heads": int(facts["attention_heads"])} if "attention_heads" in facts else {}),
            "kv_heads": int(facts["kv_heads"]),
            "head_dim": int(facts["head_dim"]),
            **({"hidden_size": int(facts["hidden_size"])} if "hidden_size" in facts else {}),
            **(
                {"intermediate_size": int(facts["intermediate_size"])} if "intermediate_size" in facts else {}
            ),
            "vocab_size": int(facts.get("vocab_size", 151936)),
            "kv_dtype_bytes": int(facts["kv_dtype_bytes"]),
            "weight_bytes": float(facts["weight_bytes"]),
        },
        **(
            {"kv_block_size": int(block)}
            if (block := (meta.get("engine_facts") or {}).get("block_size"))
            else {}
        ),
        **({"engine_layout": layout} if (layout := engine_layout(meta)) else {}),
        "coefficients": _coefficients(res),
        **({"forms": forms} if forms else {}),
        "fit": {
            "method": res.method,
            **({"note": res.note} if res.note else {}),
            "configurations": {"train": int(res.train["n"]), "test": int(res.test["n"])},
            "bootstrap_resamples": res.bootstrap,
            "seed": res.seed,
            **_errors(res),
            f"cv{res.cv['folds']}_r2": {"mean": _r(res.cv["r2_mean"]), "std": _r(res.cv["r2_std"])},
            "run_cv_median": _r(res.run_cv_median),
            "by_category": _by_category(res),
        },
        "noise": {
            "model": "lognormal",
            "sigma": _r(res.sigma),
            "basis": "standard deviation of log(actual / predicted) over the training configurations",
        },
        "provenance": {
            "kind": "measured",
            "data": rel,
            "command": command,
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "recorded_command": meta.get("command"),
            "recorded_date": meta.get("date"),
            "plan": meta.get("plan"),
            "plan_command": (meta.get("plan_meta") or {}).get("command"),
            "random_weights": bool(facts.get("random_weights", False)),
            "host": {k: host[k] for k in ("cpu", "cpu_count", "isa", "gpu", "platform") if k in host},
            "versions": meta.get("versions"),
        },
    }


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def _regimes(res: FitResult) -> list[str]:
    lines = [
        "| split | category | n | mean latency (ms) | MAE (ms) | MAPE (%) | max error (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res.by_category.itertuples():
        lines.append(
            f"| {r.split} | {r.category} | {r.n} | {_fmt(r.mean_latency_ms)} | {_fmt(r.mae_ms)} | "
            f"{_fmt(r.mape_pct)} | {_fmt(r.max_error_ms)} |"
        )
    return lines


def forms_table(results: list[FitResult]) -> list[str]:
    """Markdown: every fitted form's held-out (and training) errors, side by side."""
    lines = [
        "| form | coefficients | test R^2 | test MAPE (%) | test MAE (ms) | test max error (ms) | "
        "train R^2 | train MAPE (%) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        coefs = ", ".join(f"{k}={v:.3g}" for k, v in r.coef.items())
        t, tr = r.test, r.train
        lines.append(
            f"| {r.form} | {coefs} | {_fmt(t.get('r2', float('nan')))} | "
            f"{_fmt(t.get('mape_pct', float('nan')))} | {_fmt(t.get('mae_ms', float('nan')))} | "
            f"{_fmt(t.get('max_error_ms', float('nan')))} | {_fmt(tr['r2'])} | {_fmt(tr['mape_pct'])} |"
        )
    return lines


def report_markdown(
    res: FitResult,
    prof: dict[str, Any],
    data: Path,
    folder: Path,
    profile_path: Path,
    others: list[FitResult] | None = None,
) -> str:
    rel = os.path.relpath(folder.resolve(), profile_path.resolve().parent)
    lines = [
        f"# Fit report: {prof['name']}",
        "",
        f"Profile: `{profile_path.name}`. Data: `{data}` ({res.train['n']} train and "
        f"{res.test.get('n', 0)} test configurations timed). Model: {prof['model']['name']}, "
        f"{prof['precision']}, on "
        f"{prof['hardware']['count']}x {prof['hardware']['gpu']}, engine {prof['engine']}.",
        "",
        f"Fit: {res.method.upper()} on the training configurations; 95% intervals from {res.bootstrap} "
        "bootstrap resamples (percentile).",
    ]
    if res.note:
        lines += ["", f"Note: {res.note}."]
    lines += ["", "| coefficient | value | 95% CI |", "|---|---|---|"]
    for k in res.coef:
        ci = res.ci95.get(k)
        lines.append(f"| {k} | {res.coef[k]:.4g} | " + (f"[{ci[0]:.4g}, {ci[1]:.4g}] |" if ci else "- |"))
    lines += ["", "| metric | train | test |", "|---|---|---|"]
    for key in ("n", "r2", "adj_r2", "rmse_ms", "mae_ms", "mape_pct", "max_error_ms"):
        lines.append(
            f"| {key} | {_fmt(res.train.get(key, float('nan')))} | {_fmt(res.test.get(key, float('nan')))} |"
        )
    lines += [
        "",
        f"{res.cv['folds']}-fold cross-validation on train: R^2 {_fmt(res.cv['r2_mean'])} +- "
        f"{_fmt(res.cv['r2_std'])}, MAPE {_fmt(res.cv.get('mape_pct_mean', float('nan')))}%.",
        f"Noise model: log-normal, sigma {res.sigma:.4g} (std of log(measured / predicted) on train). "
        f"Median run-to-run coefficient of variation: {_fmt(res.run_cv_median)}.",
        "",
        "Errors by regime:",
        "",
        *_regimes(res),
    ]
    if others:
        lines += [
            "",
            "Estimator forms fitted on the same training rows and scored on the same held-out rows "
            f"(the profile's coefficients are the paper's `{DEFAULT_FORM}` form; the others are under "
            "`forms:`, and a scenario picks one with `server.estimator_form`):",
            "",
            *forms_table([res, *others]),
        ]
        for o in others:
            lines += ["", f"`{o.form}` errors by regime:", "", *_regimes(o)]
    lines += [
        "",
        f"![measured vs predicted]({rel}/actual_vs_predicted.png)",
        "",
        f"![residuals]({rel}/residuals.png)",
        "",
        f"Per-configuration predictions: `{rel}/predictions.csv`.",
        "",
    ]
    return "\n".join(lines)


def report_path(profile: Path) -> Path:
    """The markdown fit report, beside the profile: ``profiles/NAME.report.md``."""
    return profile.with_name(profile.stem + ".report.md")


def fit_command(
    data: Path,
    out: Path,
    *,
    name: str | None = None,
    method: str = "auto",
    bootstrap: int = 1000,
    folds: int = 5,
    seed: int = 0,
    gpu: str | None = None,
    gpu_count: int = 1,
    memory_gib: float | None = None,
    plots: bool = True,
    command: str = "",
    forms: tuple[str, ...] | None = None,
) -> tuple[FitResult, dict[str, Any]]:
    """Fit ``data``; write the profile YAML to ``out``, ``NAME.report.md`` and ``NAME.fit/`` beside it.

    Every estimator form in ``forms`` (default: all registered) is fitted on the same rows; the
    paper's additive form gives the profile's coefficients, the others go under ``forms``."""
    import yaml

    from wispsim.model.profiles import parse_profile

    df = read_measurements(data)
    names = list(LINEAR_FORMS) if forms is None else list(dict.fromkeys(forms))
    for f in names:
        FORMS.get(f, "--forms", "forms")
        if f not in LINEAR_FORMS:
            raise ConfigError(
                "--forms", f, f"is not fitted from a table here; allowed: {', '.join(LINEAR_FORMS)}"
            )
    res = fit(df, method, bootstrap, folds, seed)
    n_train = int((df.split == "train").sum())
    # a form with more coefficients than the training rows can pin is left out (the additive one,
    # the profile's own, must fit: its error says so)
    others = [
        fit(df, method, bootstrap, folds, seed, form=f)
        for f in names
        if f != DEFAULT_FORM and n_train >= len(FORMS.get(f).terms) + 1
    ]
    name = name or out.stem
    prof = profile_dict(
        res,
        data,
        out,
        read_meta(data),
        name=name,
        command=command
        or f"wispsim profile fit {data} --out {out} --method {method} --bootstrap {bootstrap}",
        gpu=gpu,
        gpu_count=gpu_count,
        memory_gib=memory_gib,
        others=others,
    )
    if df.attrs.get("not_timed"):  # configurations the recording could not time (OOM, error): left out
        prof["fit"]["not_timed"] = df.attrs["not_timed"]
    out.parent.mkdir(parents=True, exist_ok=True)
    text = (
        f"# Verification-time profile fitted by wispsim from {data.name}; see {out.stem}.report.md\n"
        + yaml.safe_dump(prof, sort_keys=False, width=100)
    )
    parse_profile(yaml.safe_load(text), str(out))  # never write a profile that does not load
    out.write_text(text)
    folder = out.parent / f"{out.stem}.fit"
    folder.mkdir(exist_ok=True)
    res.predictions.to_csv(folder / "predictions.csv", index=False)
    res.by_category.to_csv(folder / "by_category.csv", index=False)
    if plots:
        plot_fit(res.predictions, folder, name)
    for o in others:
        o.predictions.to_csv(folder / f"predictions-{o.form}.csv", index=False)
    report_path(out).write_text(report_markdown(res, prof, data, folder, out, others))
    return res, prof

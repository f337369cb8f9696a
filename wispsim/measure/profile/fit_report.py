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
from wispsim.model.measured import read_measurements
from wispsim.model.profiles import COEFFICIENTS
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
) -> dict[str, Any]:
    """The fitted profile as a mapping that :func:`wispsim.model.profiles.parse_profile` accepts."""
    facts = meta.get("model_facts") or {}
    host = meta.get("host") or {}
    need = ("parameters", "layers", "kv_heads", "head_dim", "kv_dtype_bytes", "weight_bytes")
    missing = [k for k in need if k not in facts]
    if missing:
        raise WispsimError(
            f"{data}.meta.json: no model facts ({', '.join(missing)} missing); record with "
            "`wispsim profile record`, which writes them"
        )
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
    coefficients: dict[str, dict[str, Any]] = {}
    for k in COEFFICIENTS:
        value = float(f"{res.coef[k]:.6g}")
        coefficients[k] = {"value": value}
        if k in res.ci95:  # rounding must not push the value out of its interval
            lo, hi = (float(f"{v:.6g}") for v in res.ci95[k])
            coefficients[k]["ci95"] = [min(lo, value), max(hi, value)]

    by_cat = {
        f"{r['split']}/{r['category']}": {
            "n": int(r["n"]),
            "mae_ms": _r(r["mae_ms"]),
            "mape_pct": _r(r["mape_pct"]),
        }
        for r in res.by_category.to_dict("records")
    }
    return {
        "name": name,
        "description": (
            f"{facts.get('name', '?')} {meta.get('dtype', '?')} on {gpu_count}x {gpu}, "
            f"{meta.get('engine', '?')} engine (measured and fitted by wispsim)"
        ),
        "hardware": {"gpu": gpu, "count": gpu_count, "memory_gib": _r(float(memory_gib))},
        "engine": f"{meta.get('engine', '?')} (attention: {meta.get('attention', '?')})",
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
        "coefficients": coefficients,
        "fit": {
            "method": res.method,
            **({"note": res.note} if res.note else {}),
            "configurations": {"train": int(res.train["n"]), "test": int(res.test["n"])},
            "bootstrap_resamples": res.bootstrap,
            "seed": res.seed,
            **{
                key: {"train": _r(res.train.get(key)), "test": _r(res.test.get(key))}
                for key in ("r2", "adj_r2", "rmse_ms", "mae_ms", "mape_pct", "max_error_ms")
            },
            f"cv{res.cv['folds']}_r2": {"mean": _r(res.cv["r2_mean"]), "std": _r(res.cv["r2_std"])},
            "run_cv_median": _r(res.run_cv_median),
            "by_category": by_cat,
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
            "host": {k: host[k] for k in ("cpu", "cpu_count", "gpu", "platform") if k in host},
            "versions": meta.get("versions"),
        },
    }


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def report_markdown(
    res: FitResult, prof: dict[str, Any], data: Path, folder: Path, profile_path: Path
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
    for k in COEFFICIENTS:
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
        "| split | category | n | mean latency (ms) | MAE (ms) | MAPE (%) | max error (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res.by_category.itertuples():
        lines.append(
            f"| {r.split} | {r.category} | {r.n} | {_fmt(r.mean_latency_ms)} | {_fmt(r.mae_ms)} | "
            f"{_fmt(r.mape_pct)} | {_fmt(r.max_error_ms)} |"
        )
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
) -> tuple[FitResult, dict[str, Any]]:
    """Fit ``data``; write the profile YAML to ``out``, ``NAME.report.md`` and ``NAME.fit/`` beside it."""
    import yaml

    from wispsim.model.profiles import parse_profile

    df = read_measurements(data)
    res = fit(df, method, bootstrap, folds, seed)
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
    )
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
    report_path(out).write_text(report_markdown(res, prof, data, folder, out))
    return res, prof

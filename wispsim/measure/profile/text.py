"""What the ``wispsim profile`` commands print about a profile or a fit, as plain text.

The command module prints these lines; composing them here keeps the command a thin
parse-call-print layer and lets ``show``, ``fit`` and ``derive`` describe an estimator the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd


def finite(v: Any) -> bool:
    """A number that is not NaN (a fit metric of an empty split is None or NaN)."""
    return isinstance(v, int | float) and v == v


def estimator_line(p: Any) -> str:
    """The estimator in one line: the coefficients, or the roofline's parameters and two passes."""
    from wispsim.model.estimator import LINEAR_FORMS

    e = p.estimator
    if e.form in LINEAR_FORMS:
        return f"a={e.a:.4g} b_compute={e.b_compute:.4g} b_read={e.b_read:.4g} c={e.c:.4g}"
    decode = e.batch(1, 501, 500, 1, 0) * 1e3
    floor = e.floor(1, 501, 500) * 1e3
    experts = ""
    if getattr(e, "expert_bandwidth_eff", None) is not None:  # a mixture's grouped expert kernels
        experts = f" (routed experts grouped: {e.expert_bandwidth_eff:.3g}, {e.expert_compute_eff:.3g})"
    quant = [  # quantized layers: converted inside each GEMM, or on their own 8-bit tensor cores
        f"{what} {v:.3g}"
        for what, v in (
            ("weight-only layers converted at", getattr(e, "dequant_eff", 1.0)),
            ("weight-only experts converted at", getattr(e, "expert_dequant_eff", 1.0)),
            ("W8A8 layers at the 16-bit rate x", getattr(e, "quant_rate", 1.0)),
        )
        if v != 1.0
    ]
    if quant:
        experts += f"; {', '.join(quant)}"
    return (
        f"roofline: efficiency bandwidth {e.bandwidth_eff:.3g}, compute {e.compute_eff:.3g}{experts}; "
        f"overheads step {e.step * 1e3:.3g} ms, request {e.request * 1e3:.3g} ms, "
        f"arrival {e.arrival * 1e3:.3g} ms, "
        f"front end {p.host.frontend * 1e3:.3g} ms; one decode over 500 cached tokens {decode:.1f} ms "
        f"(physical floor {floor:.1f} ms)"
    )


def coefficient_table(coef: dict[str, float], ci95: dict[str, Any]) -> pd.DataFrame:
    """Coefficient, value and 95% interval as printed text, one row per coefficient."""
    rows = []
    for k, v in coef.items():
        ci = ci95.get(k)
        rows.append((k, f"{v:.4g}", f"[{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "-"))
    return pd.DataFrame(rows, columns=["coefficient", "value", "95% CI"])


def provenance_line(prov: dict[str, Any]) -> str:
    """A profile's provenance in one line: its citation, the rule that derived it, or its data."""
    text = prov.get("citation") or prov.get("rule") or prov.get("data") or ""
    return " ".join(str(text).split())


def fit_summary(res: Any, prof: dict[str, Any], out: Path) -> tuple[pd.DataFrame, str, list[str]]:
    """A fit's coefficient table and its title, then lines: its train/test scores, every other
    form's, and where the profile and its report went."""
    title = f"profile {prof['name']} ({res.method})"
    tr, te = res.train, res.test
    held_out = (
        f"test {te['r2']:.4f}"
        if finite(te.get("r2"))
        else "test: none (the recording has no held-out rows: an interrupted `profile record`? "
        "nothing checks this fit)"
    )
    mape = f", test {te['mape_pct']:.2f}%" if finite(te.get("mape_pct")) else ""
    lines = [
        f"R^2 train {tr['r2']:.4f}, {held_out}; MAPE train {tr['mape_pct']:.2f}%{mape}; "
        f"{res.cv['folds']}-fold CV R^2 {res.cv['r2_mean']:.4f}"
    ]
    if res.note:
        lines.append(f"note: {res.note}")
    for name, section in (prof.get("forms") or {}).items():
        f = section["fit"]
        r2, mape_t = f["r2"]["test"], f["mape_pct"]["test"]
        scores = f"R^2 test {r2}, MAPE test {mape_t}%" if finite(r2) else "no held-out rows to score it"
        lines.append(
            f"form {name}: {scores} (in the profile under forms.{name}; scenarios pick it with "
            "server.estimator_form)"
        )
    lines.append(f"profile: {out}; report: {out.with_name(out.stem + '.report.md')}")
    return coefficient_table(res.coef, res.ci95), title, lines


def default_kv_line(p: Any) -> str:
    """The KV cache a default server gets from this profile: utilization 0.9, max_num_seqs 256,
    max_num_batched_tokens 2048 (server.engine's defaults), vLLM's start-up profile reserved."""
    from wispsim.config.server import EngineConfig
    from wispsim.model.startup import profile_startup

    eng = EngineConfig()
    start = profile_startup(p, eng.max_num_seqs, eng.max_num_batched_tokens)
    tokens = p.kv_capacity_tokens(eng.gpu_memory_utilization, start.reserve_gib)
    return (
        f"KV cache at utilization {eng.gpu_memory_utilization:g}, max_num_seqs {eng.max_num_seqs}, "
        f"max_num_batched_tokens {eng.max_num_batched_tokens}: {tokens:,} tokens; reserve {start.describe()}"
    )

"""``wispsim predictor ...``: train, export, benchmark and cross-evaluate rejection predictors.

Commands: ``train`` (label a trace, fit MLP / XGBoost / LightGBM / random forest, pick the
low-FPR operating threshold, export each as ``.npz`` with a JSON and Markdown report beside it),
``bench`` (single-sample latency of the exported NumPy predictors and their native models) and
``eval`` (distribution-shift matrix: train on one trace, test on others). Training needs the
optional extra ``ml``; bad input is a :class:`~wispsim.errors.WispsimError` (one line, exit 2
through ``wispsim.cli.main.main``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
import yaml

from wispsim.cli.common import console, markdown_table, status, table
from wispsim.cli.options import FRACTION, MAX_REPEATS, SEED, whole
from wispsim.config.limits import MAX_DRAFT
from wispsim.errors import ConfigError, WispsimError
from wispsim.results import check_output_file, writing

predictor_app = typer.Typer(
    help="Train, export, benchmark and evaluate rejection predictors (needs the ml extra).",
    no_args_is_help=True,
)

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="mlp, xgboost, lightgbm, rf, or all.")]
KOpt = Annotated[
    int,
    typer.Option(
        "--k", help="Verification window K (K_max) used to build labels.", parser=whole(1, MAX_DRAFT)
    ),
]
MaxFprOpt = Annotated[
    float,
    typer.Option(
        "--max-fpr", help="Operating point: largest Rec1 with FPR on rejected <= this.", parser=FRACTION
    ),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of splits, models and beta labels.", parser=SEED)]
LabelOpt = Annotated[
    str, typer.Option("--label-from", help="Acceptance for labels: accept (realized flag), greedy, beta.")
]
FastOpt = Annotated[bool, typer.Option("--fast", help="Tiny models (smoke tests), not for results.")]
ParamOpt = Annotated[
    list[str] | None,
    typer.Option("--param", help="Override a model argument, e.g. --param max_depth=6 (repeatable)."),
]


def parse_models(text: str) -> list[str]:
    from wispsim.measure.predictor import MODEL_KINDS

    if text == "all":
        return list(MODEL_KINDS)
    kinds = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in kinds if t not in MODEL_KINDS]
    if bad or not kinds:
        raise ConfigError("--model", "", f"unknown model {text!r}; allowed: {', '.join(MODEL_KINDS)}, all")
    return kinds


def parse_params(items: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--param", "", f"expected KEY=VALUE, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _report_md(report: dict[str, Any], metrics: pd.DataFrame) -> str:
    traces = ", ".join(f"`{t['path']}`" for t in report["traces"])
    synthetic = any(t["metadata"].get("wispsim.trace.synthetic") == "true" for t in report["traces"])
    split = report["split"]
    lines = [
        "# Rejection predictor training report",
        "",
        f"- traces: {traces}" + (" (**SYNTHETIC** fixture: do not quote these numbers)" if synthetic else ""),
        f"- command: `{report['command']}`",
        f"- date: {report['date']}; versions: "
        + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        f"- labels: from `{report['label_from']}`, windows of K = {report['k']}; features: "
        + ", ".join(report["features"]),
        "- split by sample (seed {seed}): ".format(seed=report["seed"])
        + "; ".join(f"{p} {s['samples']} samples / {s['positions']} positions" for p, s in split.items()),
        f"- operating point: largest Rec1 with FPR <= {report['max_fpr']} on the validation samples",
        "",
        "Metrics on the held-out test samples (positive = accepted; cm_XY = share of true X predicted Y,"
        " r = rejected, a = accepted):",
        "",
        markdown_table(metrics),
        "",
    ]
    return "\n".join(lines)


@predictor_app.command("train")
def train_cmd(
    trace: Annotated[list[str], typer.Option("--trace", "-t", help="Acceptance trace (repeatable).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output .npz (NAME-KIND.npz for several models).")],
    model: ModelOpt = "all",
    k: KOpt = 8,
    max_fpr: MaxFprOpt = 0.15,
    seed: SeedOpt = 0,
    label_from: LabelOpt = "accept",
    window_position: Annotated[
        bool,
        typer.Option(
            "--window-position", help="Add the position in the window (not usable by the simulator)."
        ),
    ] = False,
    fast: FastOpt = False,
    param: ParamOpt = None,
) -> None:
    """Train predictors on traces, export them as .npz and write a JSON and Markdown report beside."""
    from wispsim.measure.predictor import metrics_frame, train

    if out.suffix != ".npz":
        raise ConfigError("--out", "", f"must end in .npz, got {str(out)!r}")
    check_output_file(out, "--out")  # before any work
    kinds = parse_models(model)
    params = parse_params(param)
    with writing("--out", out):
        with status(f"training {', '.join(kinds)} ..."):
            results, report = train(
                trace, kinds, out, k, max_fpr, seed, label_from, window_position, fast, params
            )
        metrics = metrics_frame(results)
        stem = out.with_name(out.name.removesuffix(".npz"))
        json_path = stem.with_name(stem.name + ".report.json")
        md_path = stem.with_name(stem.name + ".report.md")
        json_path.write_text(json.dumps(report, indent=1, default=str))
        md_path.write_text(_report_md(report, metrics))
    title = f"held-out test metrics (threshold for max FPR {max_fpr} on the validation split, K = {k})"
    console.print(table(metrics, title))
    for r in results:
        console.print(f"{r.kind}: {r.npz} (threshold {r.threshold:.4f})")
    console.print(f"report: {json_path}, {md_path}")


@predictor_app.command("bench")
def bench_cmd(
    predictor: Annotated[
        list[Path] | None,
        typer.Option("--predictor", "-p", help="Exported .npz (repeatable; default: all in predictors/)."),
    ] = None,
    calls: Annotated[
        int,
        typer.Option("--calls", help="Timed single-sample calls per model.", parser=whole(1, MAX_REPEATS)),
    ] = 1000,
    native: Annotated[
        bool, typer.Option("--native/--no-native", help="Also time the saved native library model.")
    ] = True,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the figures as CSV.")] = None,
) -> None:
    """Single-sample inference latency (microseconds) of exported predictors and their native models."""
    from wispsim.measure.predictor import bench, cpu_name
    from wispsim.paths import predictors_dir

    if out is not None:
        check_output_file(out, "--out")  # before any work
    paths = predictor or sorted(predictors_dir().glob("*.npz"))
    if not paths:
        raise WispsimError(f"no predictors given and none in {predictors_dir()}; use --predictor PATH")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ConfigError("--predictor", "", f"no such file: {', '.join(missing)}")
    df = bench(paths, calls, native)
    if out is not None:
        with writing("--out", out):
            out.parent.mkdir(parents=True, exist_ok=True)
            df.to_csv(out, index=False)
    console.print(table(df, f"single-sample latency, us ({calls} calls, {cpu_name()})"))


@predictor_app.command("eval")
def eval_cmd(
    train: Annotated[str, typer.Option("--train", help="Trace to train on (one prompt family).")],
    test: Annotated[list[str], typer.Option("--test", help="Trace to test on (repeatable).")],
    model: ModelOpt = "all",
    k: KOpt = 8,
    max_fpr: MaxFprOpt = 0.15,
    seed: SeedOpt = 0,
    label_from: LabelOpt = "accept",
    fast: FastOpt = False,
    param: ParamOpt = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the matrix as CSV.")] = None,
) -> None:
    """Distribution shift: train on one trace, score on each test trace at the chosen threshold."""
    from wispsim.measure.predictor import shift_matrix

    if out is not None:
        check_output_file(out, "--out")  # before any work
    kinds = parse_models(model)
    with status("training and scoring ..."):
        df = shift_matrix(train, test, kinds, k, max_fpr, seed, label_from, fast, parse_params(param))
    if out is not None:
        with writing("--out", out):
            out.parent.mkdir(parents=True, exist_ok=True)
            df.to_csv(out, index=False)
    console.print(table(df, f"trained on {Path(train).stem}; metrics at the max-FPR {max_fpr} threshold"))

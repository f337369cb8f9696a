"""`wispsim experiment run --all --quick`: every study runs, writes its data, figures and section,
and the report links only figures that exist."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from tests.support import ROOT
from wispsim.cli.main import app
from wispsim.errors import ConfigError


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("exp")
    skip = shutil.ignore_patterns("data", "quick", "*.md")
    shutil.copytree(ROOT / "experiments", work / "experiments", ignore=skip)
    # the validation study reads the stored real-vs-simulated tables (its real side needs vLLM
    # servers and half an hour; experiments/validation.yaml lists the commands)
    for name in ("validation", "validation-resident", "validation-grpc"):
        shutil.copytree(
            ROOT / "experiments" / "data" / name,
            work / "experiments" / "data" / name,
            ignore=shutil.ignore_patterns("real", "points", "scenarios", "logs"),
        )
    # the scale validation reads the tables its summarize.py wrote from the real runs
    scale = work / "experiments" / "data" / "validation-scale"
    scale.mkdir(parents=True)
    for f in ("errors.csv", "capacity.csv", "wisp_vs_fcfs.csv", "drift.csv", "violation_vs_n.png"):
        shutil.copyfile(ROOT / "experiments" / "data" / "validation-scale" / f, scale / f)
    # the public study reads the shipped public measurements (not its own results)
    shutil.copytree(
        ROOT / "experiments" / "data" / "public",
        work / "experiments" / "data" / "public",
        ignore=shutil.ignore_patterns(
            "*.png", "errors.csv", "summary.csv", "section.md", "run.json", "calibration.yaml"
        ),
    )
    # the round-cost study reads the benchmark's measurements (benchmarks/vllm/round_cost.py)
    cost = work / "experiments" / "data" / "round-cost"
    cost.mkdir(parents=True)
    for f in ("cpu.csv", "cpu.json", "api.csv", "api-cpu.csv", "api-load.csv", "api.json", "tokenize.csv",
              "stream.csv", "stream.json", "transport.csv", "transport.json", "merge.csv",
              "merge.json"):  # fmt: skip
        shutil.copyfile(ROOT / "experiments" / "data" / "round-cost" / f, cost / f)
    mp = pytest.MonkeyPatch()
    mp.chdir(work)
    try:
        r = CliRunner().invoke(app, ["experiment", "run", "--all", "--quick"])
        assert r.exit_code == 0, r.output + repr(r.exception)
    finally:
        mp.undo()
    return work / "experiments" / "quick"


@pytest.mark.slow
def test_every_study_writes_its_section_and_figures(quick_run: Path) -> None:
    from wispsim.study.experiments.spec import list_experiments

    names = sorted(p.stem for p in (ROOT / "experiments").glob("*.yaml"))
    assert names == sorted(list_experiments()) and len(names) >= 15
    for name in names:
        sec = (quick_run / name / "section.md").read_text()
        assert (
            sec.startswith("## ") and "quick size" in sec and f"wispsim experiment run {name} --quick" in sec
        )
        assert (quick_run / name / "run.json").is_file()
    report = (quick_run / "REPORT.md").read_text()
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert len(figures) >= 8
    for fig in figures:
        assert (quick_run / fig).is_file() and (quick_run / fig).stat().st_size > 1000, fig
    assert "Not run yet" not in report


@pytest.mark.slow
def test_quick_capacity_and_mix_tables_have_numbers(quick_run: Path) -> None:
    cap = pd.read_csv(quick_run / "capacity" / "a100-qwen3-32b" / "capacity.csv")
    assert set(cap.policy) == {"wisp", "sled"} and (cap.capacity > 0).all()
    mix = pd.read_csv(quick_run / "mix" / "curve_pooled.csv")
    assert set(mix.policy) == {"wisp", "fcfs", "wisp-lru"}
    acc = pd.read_csv(quick_run / "acceptance" / "capacity.csv")
    assert set(acc.acceptance) == {"trace", "bernoulli"}
    # a target's ``set`` reaches its scenario (the crossover's verifier kinds)
    for target, kind in (("a100-resubmit", "resubmit"), ("a100-resident", "resident")):
        sc = yaml.safe_load((quick_run / "crossover" / target / "scenario.yaml").read_text())
        srv = sc["server"]
        assert srv["verifier"]["kind"] == kind and srv["engine"]["async_scheduling"] is True
    assert set(pd.read_csv(quick_run / "mix-resident" / "curve_pooled.csv").policy) == {"wisp", "fcfs"}


@pytest.mark.slow
def test_quick_decision_paper_and_regimes_tables(quick_run: Path) -> None:
    """Issue 46: the decision study names each arm's build, prices it from the shipped table, and
    bounds it by its bands; the paper study sets the paper's figures beside ours per baseline; the
    regimes study searches the shared mix per regime."""
    from wispsim.model.prices import shipped_price

    dec = pd.read_csv(quick_run / "decision" / "decision.csv")
    assert set(dec.arm) == {"wisp@wisp-grpc", "centralized"}
    assert dict(zip(dec.arm, dec.build, strict=True)) == {"wisp@wisp-grpc": "wisp-grpc", "centralized": "-"}
    price = shipped_price("a100-80gb").usd_per_gpu_hour
    for r in dec.itertuples():
        assert r.capacity > 0 and r.gpus == 1
        assert r.gpu_hours_per_device_hour == pytest.approx(1 / r.capacity)
        assert r.usd_per_device_hour == pytest.approx(price / r.capacity)
        assert r.usd_per_mtok == pytest.approx(price * 1e6 / (r.goodput_tps * 3600))
    bands = pd.read_csv(quick_run / "decision" / "bands.csv")
    assert set(bands.variant) == {"cpu-2.46x"} and set(bands.band) == {"host CPU"}
    sec = (quick_run / "decision" / "section.md").read_text()
    assert "| a100-qwen3-32b | 8 | wisp-grpc" in sec and "mercatus" in sec
    ours = pd.read_csv(quick_run / "paper" / "ours.csv")
    assert set(ours.baseline) == {
        "vllm",
        "paper-coefficients",
        "paper-coefficients+512-token-prompts",
        "paper-coefficients+max-reservation",
        "static",
        "paper-coefficients+static",
    }
    cen = ours[ours.policy == "centralized"].set_index("baseline").capacity
    assert cen["static"] < cen["vllm"]  # request-level batching serves fewer devices
    reg = pd.read_csv(quick_run / "regimes" / "regimes.csv")
    assert set(reg.policy) == {"wisp", "fcfs", "wisp-fixed"} and set(reg.regime) == {"compute-bound", "slow"}
    assert set(reg[reg.regime == "slow"].classes.astype(str)) == {"2"}  # a regime keeps its own classes


def test_unknown_experiment_lists_the_known_ones() -> None:
    from wispsim.study.experiments.spec import load_spec

    with pytest.raises(ConfigError, match=r"known: .*capacity"):
        load_spec("nope")


@pytest.mark.slow
def test_a_rerun_loads_points_and_reports_who_computed_them(quick_run: Path) -> None:
    """The header of a study built from stored points names the git commit in their meta.json."""
    import json

    metas = list((quick_run / "capacity").glob("*/points/*/meta.json"))
    assert metas
    meta = json.loads(metas[0].read_text())
    assert meta["commit"] and "inputs" in meta and meta["inputs"]["profile:a100-qwen3-32b"] != "missing"
    sec = (quick_run / "capacity" / "section.md").read_text()
    assert f"points computed by commit {meta['commit']}" in sec
    run = json.loads((quick_run / "capacity" / "run.json").read_text())
    assert run["simulations_computed_total"] > 0 and len(run["results_hash"]) == 12


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("classes", ["a"], "classes: must be a list of positive numbers"),
        ("classes", [], "classes: must be a non-empty list"),
        ("seeds", "x", "seeds: must be an integer >= 1"),
        ("seeds", 0, "seeds: must be an integer >= 1"),
        ("epsilon", 1.5, r"epsilon: must be in \[0, 1\)"),
        ("policies", ["wisp", "nope"], "policies: unknown policy 'nope'; allowed: .*centralized"),
        ("targets", ["no-such-profile"], "targets: no profile 'no-such-profile'"),
        (
            "targets",
            [{"name": "x", "profile": "a100-qwen3-32b", "set": [1]}],
            "targets: x: set must be a mapping",
        ),
        (
            "targets",
            [{"name": "x", "profile": "a100-qwen3-32b", "sets": {}}],
            "targets: a variant is {name, profile, roofline, set}",
        ),
        ("devices", [10, -1], "devices: must be a list of positive integers"),
        ("quick", [1], "quick: must be a mapping"),
        ("thresholds", [0.5, 2], r"thresholds: must be numbers in \[0, 1\] or null"),
        ("thresholds", "x", "thresholds: must be a non-empty list"),
        ("k_max", [0], "k_max: must be a list of positive integers"),
        ("references", ["nope"], "references: unknown policy 'nope'"),
        ("traces", [], "traces: must be a non-empty list of request trace names"),
        ("replicas", [0], "replicas: must be a list of positive integers"),
        ("window_s", -5, r"window_s: must be a number of seconds > 0 or null"),
        ("stop", "never", "stop: got .never.; allowed: sequential, horizon"),
        ("search", "fast", "search: got .fast.; allowed: knee, exact"),
    ],
)
def test_bad_experiment_specs_are_one_line_errors(field: str, value: object, message: str) -> None:
    from wispsim.study.experiments.spec import resolve

    spec = {"study": "capacity", "name": "capacity", field: value}
    with pytest.raises(ConfigError, match=f"experiments/capacity.yaml: {message}") as e:
        resolve(spec, quick=False)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("name", "body", "words"),
    [
        ("capacity", "classes: [fast]\n", "experiments/capacity.yaml: classes"),
        ("decision", "arms: [{build: wisp-grpc}]\n", "experiments/decision.yaml: arms: an arm is a policy"),
        (
            "decision",
            "arms: [wisp]\ntargets: [a100-qwen3-32b]\nprices: {a100-80gb: -1}\n",
            "experiments/decision.yaml: prices.a100-80gb: must be a price in USD per GPU-hour > 0",
        ),
        ("decision", "arms: [wisp]\ntargets: [cpu-qwen2.5-0.5b]\n", "names no GPU"),
        (
            "decision",
            "arms: [wisp]\ntargets: [a100-qwen3-32b]\nprice_tier: cheap\n",
            "experiments/decision.yaml: price_tier: 'a100-80gb' has no 'cheap' price",
        ),
        (
            "decision",
            "arms: [wisp]\ntargets: [a100-qwen3-32b]\n"
            "bands: {variants: [{band: x, name: y, set: {}, arms: [sled]}]}\n",
            "unknown arm(s) ['sled']",
        ),
        ("decision", "arms: [wisp, wisp]\n", "experiments/decision.yaml: arms: two arms are named 'wisp'"),
        (
            "decision",
            "arms: [wisp]\ntargets: [a100-qwen3-32b]\nprices: {a100: 1.8}\n",
            "prices.a100: no target runs on it; the targets' GPUs: a100-80gb",
        ),
        (
            "decision",
            "arms: [wisp]\ntargets: [a100-qwen3-32b]\n"
            "bands: {variants: [{band: x, name: y, set: {}}, {band: z, name: y, set: {}}]}\n",
            "bands.variants[1]: two entries are named 'y'",
        ),
        (
            "regimes",
            "regimes: [{name: a, profile: a100-qwen3-32b, why: w, classes: 2}]\n",
            "regimes[0].classes",
        ),
        ("regimes", "regimes: [{name: a, profile: a100-qwen3-32b, why: w, set: [1]}]\n", "regimes[0].set"),
        ("regimes", "light: 16\nregimes: [{name: a, profile: a100-qwen3-32b, why: w}]\n", "light: must be"),
        ("regimes", "policies: [wisp]\n", "regimes: must be a non-empty list"),
        (
            "paper",
            "classes: [8]\nbaselines: [{name: b, profile: a100-qwen3-32b, policies: [wisp]}]\n"
            "published: {headline: [{metric: capacity, paper: 2, num: [wisp, b], den: [centralized, b]}]}\n",
            "published.headline[0].den: must be a [policy, baseline] the study runs",
        ),
        ("decision", "arms: [wisp]\ntargets: [a100-qwen3-32b]\nbands: [1]\n", "bands: must be a mapping"),
        (
            "paper",
            "published: {capacity: {wisp: [1, 2]}}\nclasses: [8]\n",
            "published.capacity.wisp: needs one figure per class",
        ),
        (
            "regimes",
            "regimes: [{name: a, profile: a100-qwen3-32b}]\n",
            "regimes[0]: needs name, profile, why",
        ),
    ],
)
def test_bad_specs_exit_2_in_one_line(tmp_path: Path, name: str, body: str, words: str) -> None:
    import subprocess
    import sys

    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / f"{name}.yaml").write_text(f"study: {name}\n{body}")
    r = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", "experiment", "run", name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_saturated_capacity_is_a_lower_bound_and_has_no_ratio() -> None:
    from wispsim.study.experiments.sweeps import cap_cell as _cap_cell
    from wispsim.study.experiments.sweeps import measured_only as _measured

    cap = pd.DataFrame(
        {
            "policy": ["wisp", "sled"],
            "class": ["2", "2"],
            "capacity": [4096, 70],
            "ci_low": [4096, 64],
            "ci_high": [4096, 79],
            "saturated": [True, False],
        }
    )
    cells = [_cap_cell(r) for r in cap.itertuples()]
    assert cells == [">= 4096 (search ceiling)", "70 [64, 79]"]
    measured = _measured(cap).capacity
    assert measured.isna().tolist() == [True, False]


def test_discussion_written_for_other_numbers_is_flagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A discussion whose ``discussion_for`` does not match the section's results hash gets a caution."""
    import json

    from wispsim.study.experiments.run import run_experiment

    (tmp_path / "experiments").mkdir()
    spec = "study: estimator\ndiscussion: The fit is good.\n"
    (tmp_path / "experiments" / "est.yaml").write_text(spec)
    monkeypatch.chdir(tmp_path)
    out = run_experiment("est", False, lambda folder: None)
    sec = (out / "section.md").read_text()
    digest = json.loads((out / "run.json").read_text())["results_hash"]
    assert "The fit is good." in sec and f"set `discussion_for: {digest}`" in sec
    (tmp_path / "experiments" / "est.yaml").write_text(spec + f"discussion_for: {digest}\n")
    sec = (run_experiment("est", False, lambda folder: None) / "section.md").read_text()
    assert "The fit is good." in sec and "Caution" not in sec


def test_a_discussion_is_re_rendered_under_the_stored_tables_without_a_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wispsim experiment discuss``: the edited prose and its pin replace the stored discussion;
    the tables, the results hash and the report come from the stored run; a study never run is
    refused by name (a one-line ConfigError)."""
    import json

    from wispsim.study.experiments.run import run_experiment

    (tmp_path / "experiments").mkdir()
    spec = "study: estimator\ndiscussion: The fit is good.\n"
    (tmp_path / "experiments" / "est.yaml").write_text(spec)
    monkeypatch.chdir(tmp_path)
    out = run_experiment("est", False, lambda folder: None)
    tables = (out / "section.md").read_text().split("**What it shows.**")[0]
    digest = json.loads((out / "run.json").read_text())["results_hash"]
    (tmp_path / "experiments" / "est.yaml").write_text(
        "study: estimator\ndiscussion: The fit is better.\n" + f"discussion_for: {digest}\n"
    )
    r = CliRunner().invoke(app, ["experiment", "discuss", "est"])
    assert r.exit_code == 0, r.output
    sec = (out / "section.md").read_text()
    assert sec.startswith(tables) and "The fit is better." in sec
    assert "good" not in sec and "Caution" not in sec
    assert "The fit is better." in (tmp_path / "experiments" / "REPORT.md").read_text()
    (tmp_path / "experiments" / "new.yaml").write_text(spec)
    r = CliRunner().invoke(app, ["experiment", "discuss", "new"])
    assert "has no stored results" in str(r.exception)  # a ConfigError: `wispsim` exits 2 on it


def test_point_key_follows_the_contents_of_the_files_it_reads(tmp_path: Path) -> None:
    """Editing a profile in place must not let stored points of the old profile be reused."""
    import dataclasses
    import shutil as sh

    from wispsim.model.profiles import find_profile
    from wispsim.sim.scenarios import load_scenario
    from wispsim.study.points import Point

    prof = tmp_path / "mine.yaml"
    sh.copy(find_profile("a100-qwen3-32b-paper"), prof)
    sc = load_scenario(None)
    sc = sc.replace(server=dataclasses.replace(sc.server, profile=str(prof)))
    before = Point(sc, 10, 0).key
    assert Point(sc, 10, 0).key == before
    prof.write_text(prof.read_text() + "\n# edited\n")
    assert Point(sc, 10, 0).key != before


def test_a_study_field_no_study_reads_is_refused(tmp_path: Path) -> None:
    from wispsim.study.experiments.spec import list_experiments, load_spec

    for name in list_experiments():  # every shipped study loads
        load_spec(name)
    f = tmp_path / "typo.yaml"
    f.write_text("study: capacity\ndevcies: 3\nquick: {seedz: 1}\n")
    with pytest.raises(ConfigError, match="devcies: unknown field; allowed: about"):
        load_spec(str(f))
    f.write_text("study: capacity\nquick: {seedz: 1}\n")
    with pytest.raises(ConfigError, match=r"quick\.seedz: unknown field"):
        load_spec(str(f))

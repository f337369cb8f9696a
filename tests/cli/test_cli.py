"""The command line: outputs, reproducibility, and one-line errors with exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

QUICK = ["--set", "workload.warmup_s=2", "--set", "workload.duration_s=8"]


def wispsim(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wispsim.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def test_run_writes_records_summary_and_resolved_scenario(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = wispsim(
        "run",
        "--policy",
        "wisp",
        "--devices",
        "12",
        "--classes",
        "4,8",
        "--seed",
        "3",
        "--out",
        str(out),
        *QUICK,
    )
    assert p.returncode == 0, p.stderr
    for f in (
        "scenario.yaml",
        "rounds.parquet",
        "batches.parquet",
        "responses.parquet",
        "summary.csv",
        "manifest.json",
    ):
        assert (out / f).is_file(), f
    summary = pd.read_csv(out / "summary.csv", dtype={"class": str})
    assert list(summary["class"]) == ["4", "8", "all"]
    # what binds, with its headroom, printed from the summary's all row (wispsim.analysis.binding)
    line = next(x for x in p.stdout.splitlines() if x.startswith("binds: "))
    assert summary.binds.iloc[-1] in {"device", "gpu", "kv", "max_num_seqs", "engine_cpu", "api_server"}
    assert "headroom" in line and "other loads:" in line
    rounds = pd.read_parquet(out / "rounds.parquet")
    assert set(rounds.slo) == {4.0, 8.0}
    # the resolved scenario reruns to the same records
    out2 = tmp_path / "rerun"
    p2 = wispsim("run", str(out / "scenario.yaml"), "--out", str(out2))
    assert p2.returncode == 0, p2.stderr
    assert (out / "summary.csv").read_bytes() == (out2 / "summary.csv").read_bytes()


@pytest.mark.slow
def test_sweep_is_byte_reproducible(tmp_path: Path) -> None:
    args = [
        "sweep",
        "--policy",
        "wisp",
        "--classes",
        "8",
        "--seeds",
        "2",
        "--start",
        "8",
        "--max-devices",
        "64",
        "--jobs",
        "2",
        *QUICK,
    ]
    a = wispsim(*args, "--out", str(tmp_path / "a"))
    b = wispsim(*args, "--out", str(tmp_path / "b"))
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    for f in ("capacity.csv", "curve.csv", "curve_pooled.csv"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    cap = pd.read_csv(tmp_path / "a" / "capacity.csv")
    assert list(cap.columns[:6]) == ["policy", "profile", "class", "capacity", "ci_low", "ci_high"]
    assert {"saturated", "evaluated", "estimate", "estimate_binds", "binds", "headroom"} <= set(cap.columns)
    assert cap.binds.iloc[0] == "kv"  # the default scenario past 8 tok/s: KV reservations (A100)


def test_compare_writes_speedups(tmp_path: Path) -> None:
    p = wispsim(
        "compare",
        "--policies",
        "wisp,sled",
        "--classes",
        "8",
        "--seeds",
        "1",
        "--max-devices",
        "64",
        "--out",
        str(tmp_path),
        *QUICK,
    )
    assert p.returncode == 0, p.stderr
    first = p.stdout.split("by policy")[0]  # the capacity table, before the wide one
    assert "class" in first and "binds" in first  # each policy's rows say their class
    cmp = pd.read_csv(tmp_path / "compare.csv")
    assert list(cmp.columns) == ["class", "wisp", "sled", "wisp/sled"]
    assert cmp["wisp/sled"].iloc[0] == pytest.approx(cmp.wisp.iloc[0] / cmp.sled.iloc[0])


@pytest.mark.parametrize(
    ("args", "yaml_text", "expected"),
    [
        (["run", "--policy", "nope"], None, "unknown policy 'nope'; allowed: wisp, wisp-lru, sled"),
        (["run", "--devices", "0"], None, "--devices: must be >= 1"),
        (["sweep", "--classes", "2,x"], None, "--classes: expected comma-separated"),
        (["sweep", "--devices", "10:5"], None, "--devices: expected LO:HI:STEP"),
        (["sweep", "--stop", "never"], None, "--stop: got 'never'; allowed: sequential, horizon"),
        (
            ["compare", "--policies", "wisp,sled", "--search", "fast"],
            None,
            "--search: got 'fast'; allowed: knee, exact",
        ),
        (["run", "--set", "server.verifier.delta_ms=-1"], None, "server.verifier.delta_ms: must be >= 0"),
        (["run"], "workload: [1, 2\n", "malformed YAML at line"),
        (["run"], "server:\n  delta: 1\n", "server.delta: unknown field; allowed:"),
        (["run"], "acceptance:\n  mean: 1.5\n", "acceptance.mean: must be in (0, 1)"),
        (
            ["run"],
            "network:\n  link_types:\n    wifi: {up_mbps: -3}\n",
            "network.link_types.wifi.up_mbps: must be > 0",
        ),
        (
            ["run"],
            "server:\n  profile: no-such-gpu\n",
            "no profile 'no-such-gpu'; shipped profiles: 2xa100-llama-3.1-70b, "
            "2xa100-llama-3.1-70b-paper, 2xh100-llama-3.1-70b, a100-qwen3-14b",
        ),
        (
            ["run"],
            "acceptance:\n  model: nope\n",
            "unknown acceptance model 'nope'; known: bernoulli, latent, trace",
        ),
        (["run"], "acceptance:\n  model: trace\n  trace: CORRUPT\n", "not a readable Parquet trace"),
        (
            ["scenario", "validate"],
            "workload:\n  output_tokens: {dist: constant, value: 900000, max: 900000}\n",
            "does not fit in the KV cache",
        ),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(tmp_path: Path, args, yaml_text, expected) -> None:
    if yaml_text is not None:
        (tmp_path / "corrupt.parquet").write_bytes(b"PAR1 this is not parquet")
        text = yaml_text.replace("CORRUPT", str(tmp_path / "corrupt.parquet"))
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        args = [args[0], *args[1:], str(path)] if args[0] != "scenario" else [*args, str(path)]
    p = wispsim(*args, "--out", str(tmp_path / "o")) if args[0] == "run" else wispsim(*args)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert expected in " ".join(p.stderr.split()), p.stderr
    if yaml_text is not None and args[0] == "run":
        assert "bad.yaml" in p.stderr or "corrupt.parquet" in p.stderr


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_scenario_show_and_profile_show() -> None:
    p = wispsim("scenario", "show")
    assert p.returncode == 0 and "profile: a100-qwen3-32b\n" in p.stdout
    q = wispsim("profile", "show", "a100-qwen3-32b-paper")
    assert q.returncode == 0 and "3.314e-05" in q.stdout and "published" in q.stdout
    r = wispsim("profile", "show")  # the default: physics, never below its floor
    assert r.returncode == 0 and "roofline" in r.stdout and "physical floor" in r.stdout


def test_a_piped_summary_keeps_every_column_and_number(tmp_path: Path) -> None:
    """Not a terminal (piped, logged): the table is printed at its full width, not cut to 80
    columns with its numbers turned into "0.0…" (COLUMNS unset)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    p = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", "run", "--devices", "8", "--classes", "2,4,6,8",
         "--set", "workload.duration_s=5", "--set", "workload.warmup_s=1", "--out", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "…" not in p.stdout
    header = next(line for line in p.stdout.splitlines() if "class" in line and "devices" in line)
    for name in ("violation_rate", "budget_miss_rate", "acceptance_ratio", "mean_batch_size"):
        assert name in header
    summary = pd.read_csv(tmp_path / "r" / "summary.csv", dtype={"class": str}).set_index("class")
    row = next(line for line in p.stdout.splitlines() if line.strip("│ ").startswith("all"))
    assert f"{summary.loc['all', 'goodput_tps']:.0f}" in row


def test_the_verifier_kind_reaches_compare_and_refuses_a_policy_without_pinned_kv(tmp_path: Path) -> None:
    """``--set server.verifier.kind=resident`` (issue 36) runs through compare (centralized serving
    ignores it); SLED, whose verifier has no prefix cache to keep a session in, is a one-line error."""
    p = wispsim(
        "compare", "--policies", "wisp,centralized", "--classes", "8", "--seeds", "1", "--max-devices", "64",
        "--set", "server.verifier.kind=resident", "--out", str(tmp_path), *QUICK,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "kind: resident" in (tmp_path / "scenario-wisp.yaml").read_text()
    bad = wispsim(
        "run", "--policy", "sled", "--devices", "4", "--set", "server.verifier.kind=resident", *QUICK
    )
    last = bad.stderr.strip().splitlines()[-1]
    assert bad.returncode == 2 and "server.verifier.kind" in last and "kv_policy: admission" in last

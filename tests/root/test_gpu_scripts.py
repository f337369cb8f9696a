"""The prepared device scripts run end to end on a CPU (``--dry-run``: tiny shapes), so the first
lent GPU spends its minutes timing, not debugging (issue 45's shapes)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a subprocess importing torch
def test_shapes_2026_dry_run_writes_every_kind(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu" / "shapes_2026.py"),
            "--out",
            str(tmp_path),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader((tmp_path / "shapes_2026.csv").open()))
    kinds = {r["kind"] for r in rows}
    assert {"expert_gemm", "routing", "lm_head", "sampling", "mla_decode", "layer_graph"} <= kinds
    assert all(float(r["seconds"]) > 0 for r in rows if r["seconds"])
    assert (tmp_path / "shapes_2026_meta.json").is_file()


@pytest.mark.slow  # a subprocess importing torch
def test_shapes_2026_graph_experts_only_dry_run(tmp_path: Path) -> None:
    """``--graph --experts-only`` (what the expert fit reads) writes its own file, experts and
    routing alone; on a CPU the graph capture is skipped and the calls are timed eagerly."""
    pytest.importorskip("torch")
    script = str(ROOT / "benchmarks" / "gpu" / "shapes_2026.py")
    p = subprocess.run(
        [sys.executable, script, "--out", str(tmp_path), "--dry-run", "--graph", "--experts-only"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader((tmp_path / "shapes_2026_graph_experts.csv").open()))
    assert {r["kind"] for r in rows} == {"expert_gemm", "routing"}
    meta = (tmp_path / "shapes_2026_graph_experts_meta.json").read_text()
    assert "CUDA graph" in meta

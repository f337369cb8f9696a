"""The optional mypyc build of the hot path (wispsim.native, scripts/compile.py): used only while
current, the same records as the pure Python."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest
import simpy.core
from typer.testing import CliRunner

from wispsim import native
from wispsim.cli.main import app
from wispsim.native import MODULES, source, source_hash, state

ROOT = Path(__file__).resolve().parents[2]


def _package(tmp: Path) -> Path:
    """A stand-in package: the compiled modules' sources, and empty files where a build puts its
    extensions for this Python and the library they share."""
    pkg = tmp / "wispsim"
    ext = EXTENSION_SUFFIXES[0]
    for n in MODULES:
        f = source(n, pkg)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"# {n}\n")
        f.with_suffix(ext).touch()
    (tmp / f"{native.GROUP}__mypyc{ext}").touch()
    return pkg


def test_a_build_is_used_only_while_its_sources_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    pkg = _package(tmp_path)
    assert state(pkg)[0] == "none"
    manifest = pkg / "native.json"
    manifest.write_text(json.dumps({"sources": {n: source_hash(source(n, pkg)) for n in MODULES}}))
    assert state(pkg)[0] == "compiled"
    monkeypatch.setenv(native.PURE_ENV, "1")
    assert state(pkg) == ("pure", "WISPSIM_PURE=1")
    monkeypatch.setenv(native.PURE_ENV, "0")
    assert state(pkg)[0] == "compiled"
    source("wispsim.model.roofline", pkg).write_text("# edited\n")
    assert state(pkg) == ("stale", "changed since the build: roofline")
    manifest.write_text("{not json")
    assert state(pkg)[0] == "stale"
    # a build whose files for this Python are not all there (another Python's, or one removed)
    manifest.write_text(json.dumps({"sources": {n: source_hash(source(n, pkg)) for n in MODULES}}))
    assert state(pkg)[0] == "compiled"
    next(pkg.rglob(f"*{EXTENSION_SUFFIXES[0]}")).unlink()
    assert state(pkg)[0] == "stale" and "not all there" in state(pkg)[1]


PROBE = """
import pandas as pd
import wispsim.sim.round as r
from wispsim import check, load_scenario, simulate
digest = []
for policy in ("wisp", "centralized"):
    sc = load_scenario(overrides={"policy": policy, "devices": {"classes": [4.0]},
                                  "workload": {"warmup_s": 5.0, "duration_s": 20.0}})
    res = simulate(check(sc), devices=60, seed=3)
    digest += [int(pd.util.hash_pandas_object(df, index=False).sum())
               for df in (res.rounds, res.batches, res.responses)]
print(r.__file__.rsplit(".", 1)[1], digest)
"""


def _probe(root: Path, **env: str) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=root, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(root), "PYTHONPATH": str(root), **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip(), done.stderr


@pytest.mark.slow
def test_the_compiled_build_gives_the_pure_pythons_records(tmp_path: Path) -> None:
    """Compile a copy of the package, run one small simulation compiled and pure: the round,
    batch and response records hash alike; an edited source sends the copy back to pure Python
    with one line saying why."""
    pytest.importorskip("mypyc.build")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        pytest.skip("no Python headers to compile against")
    root = tmp_path / "checkout"
    shutil.copytree(
        ROOT / "wispsim",
        root / "wispsim",
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "native.json"),
    )
    for data in ("profiles", "traces", "predictors", "scenarios"):
        (root / data).symlink_to(ROOT / data, target_is_directory=True)
    built = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compile.py"), "--root", str(root)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    compiled, _ = _probe(root)
    pure, _ = _probe(root, WISPSIM_PURE="1")
    assert compiled.startswith("so ") and pure.startswith("py ")
    assert compiled[3:] == pure[3:]
    with source("wispsim.sim.round", root / "wispsim").open("a") as f:
        f.write("\n# edited after the build\n")
    edited, said = _probe(root)
    assert edited == pure
    assert "compiled modules not used, changed since the build: round" in said


def test_the_simulated_clock_runs_on_python_floats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every delay handed to SimPy is a Python float or int, never a NumPy scalar: a NumPy time
    turns ``env.now`` into one, and the compiled modules, which read it as a float, then meet
    NumPy's booleans (and the pure Python computes in NumPy's slower scalars). The paths that
    read times from arrays: a bursty arrival trace, Poisson arrivals, a benchmark's send times."""
    seen: set[str] = set()
    schedule = simpy.core.Environment.schedule

    def checked(self: simpy.core.Environment, event: object, priority: int = 1, delay: float = 0) -> None:
        if type(delay) not in (float, int):
            seen.add(type(delay).__name__)
        schedule(self, event, priority, delay)  # type: ignore[arg-type]

    monkeypatch.setattr(simpy.core.Environment, "schedule", checked)
    runner = CliRunner()
    trace = tmp_path / "bursty.csv"
    quick = ["--set", "workload.warmup_s=5", "--set", "workload.duration_s=20"]
    commands = [
        ["arrivals", "generate", "--out", str(trace), "--duration", "60", "--low", "2", "--high", "6",
         "--period", "60", "--peaks", "20:15", "--hold", "5", "--decay", "10"],
        ["run", "--arrivals", str(trace), *quick, "-o", str(tmp_path / "trace")],
        ["run", "--devices", "40", "--set", "arrivals.process=poisson", "--set", "arrivals.rate=2", *quick,
         "-o", str(tmp_path / "poisson")],
        ["bench", "--model", "qwen3-14b", "--gpu", "h100-80gb", "--num-prompts", "40", "--request-rate", "8"],
    ]  # fmt: skip
    for args in commands:
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (args, r.output)
    assert not seen, f"NumPy times reached the SimPy clock: {sorted(seen)}"

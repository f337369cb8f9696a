"""Property-based fuzzing of every input family of issue 13, in process.

Bad input of any kind must give a :class:`~wispsim.errors.WispsimError` whose message is one line
(the CLI prints it as ``error: ...`` and exits 2): never another exception, a hang or a silently
accepted nonsense value. Valid input must load.

Readers are called where the CLI calls them (``load_scenario`` + ``parse_set``, ``load_profile``,
``load_trace``, ``load_arrival_trace``, ``read_log``, the results-folder readers); options,
usage errors and output paths go through the console entry point :func:`wispsim.cli.main.main`
itself (argv patched, stdout/stderr captured), which is what ``wispsim`` runs, so the exit code
and the one ``error:`` line are checked exactly as a user sees them. Every example has a time
limit (SIGALRM): running past it is a hang.

Hypothesis runs derandomized (the same examples every run); ``scripts/fuzz.py`` is the
subprocess counterpart with many more inputs.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.support import ROOT
from wispsim.errors import WispsimError
from wispsim.paths import profiles_dir, traces_dir

pytestmark = pytest.mark.slow  # hypothesis runs every input family: minutes

QUICK = ["--devices", "4", "--set", "workload.duration_s=3", "--set", "workload.warmup_s=0"]


def fuzz_settings(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        # no shrinking: a failing example is reported as found (shrinking re-runs slow examples)
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


class Hang(BaseException):
    """An example ran past its time limit (BaseException: nothing under test may swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


_counter = itertools.count()


def fresh(folder: Path, name: str) -> Path:
    """A new path per example (readers cache by path and mtime)."""
    d = folder / f"x{next(_counter)}"
    d.mkdir(parents=True, exist_ok=True)
    return d / name


def outcome(fn: Callable[..., Any], *args: Any, limit: int = 10, **kwargs: Any) -> str:
    """'ok' or 'error' (a WispsimError with a one-line message); anything else fails the test."""
    try:
        with time_limit(limit):
            fn(*args, **kwargs)
    except WispsimError as e:
        msg = str(e)
        assert msg.strip(), f"{type(e).__name__} with an empty message"
        assert "\n" not in msg and "\r" not in msg, f"message is not one line: {msg!r}"
        return "error"
    return "ok"


def cli(args: list[str], limit: int = 20) -> tuple[int, str, str]:
    """Run the console entry point in process: (exit code, stdout, stderr)."""
    from wispsim.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with (
        mock.patch.object(sys, "argv", ["wispsim", *args]),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        time_limit(limit),
    ):
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def cli_outcome(args: list[str], limit: int = 20) -> str:
    """'ok' (exit 0) or 'error' (exit 2 with one stderr line ``error: ...``); else a failure."""
    code, _, err = cli(args, limit)
    if code == 0:
        return "ok"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, f"exit code {code}; stderr: {err[-800:]!r}"
    assert len(lines) == 1, f"{len(lines)} stderr lines: {err[-800:]!r}"
    assert lines[0].startswith("error:"), f"does not start with 'error:': {lines[0]!r}"
    return "error"


def assert_error(args: list[str], *needles: str, limit: int = 20) -> None:
    code, _, err = cli(args, limit)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, f"exit code {code} (want 2); stderr: {err[-800:]!r}"
    assert len(lines) == 1 and lines[0].startswith("error:"), f"not one 'error:' line: {err[-800:]!r}"
    for n in needles:
        assert n in lines[0], f"{n!r} not named in {lines[0]!r}"


def load_with(path: Path | None = None, sets: list[str] | None = None) -> Any:
    """What every scenario-taking command does: the file, then ``--set`` overrides."""
    from wispsim.config.parse import parse_set
    from wispsim.sim.scenarios import load_scenario

    return load_scenario(path, parse_set(sets or []))


def leaves(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*prefix, k))
            out.extend(leaves(v, (*prefix, k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append((*prefix, i))
            out.extend(leaves(v, (*prefix, i)))
    return out


def set_path(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    doc = json.loads(json.dumps(doc))  # a deep copy (the documents are plain JSON types)
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return doc


def dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1000)


def numeric_paths(doc: Any) -> list[tuple[Any, ...]]:
    def at(p: tuple[Any, ...]) -> Any:
        node = doc
        for x in p:
            node = node[x]
        return node

    return [p for p in leaves(doc) if isinstance(at(p), int | float) and not isinstance(at(p), bool)]


# ------------------------------------------------------------------------------------------
# hostile values
# ------------------------------------------------------------------------------------------

HOSTILE: list[Any] = [
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -1e308,
    -1,
    0,
    10**30,
    -(10**30),
    2**63,
    2**64,
    1.5,
    "abc",
    "",
    "é☃",
    "x" * 2000,
    True,
    None,
    [],
    {},
    [1, [2, [3]]],
    {"a": {"b": 1}},
    {"dist": "bogus"},
]
hostile_values = st.one_of(
    st.sampled_from(HOSTILE),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
HOSTILE_TEXT = [
    ".nan",
    ".inf",
    "-.inf",
    "nan",
    "1" + "0" * 400,
    "-1",
    "0",
    "1e308",
    "1.0e+308",
    "99999999999999999999999",
    "abc",
    "",
    "~",
    "true",
    "[",
    "{a: 1}",
    "[[[[]]]]",
    "0x10",
    "&a 1",
    "*a",
    "!!binary AAAA",
    "!!python/object/apply:os.getcwd []",
]
hostile_text = st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(max_size=30))
NUM_OPTION = [
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "1e400",
    "99999999999999999999999",
    "9223372036854775808",
    "abc",
    "",
    "1.5",
    "0x1F",
    "1,2",
]
num_option = st.one_of(st.sampled_from(NUM_OPTION), st.text(max_size=12))


# ------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def default_doc() -> dict[str, Any]:
    """The resolved default scenario, as `wispsim scenario show` prints it."""
    code, out, err = cli(["scenario", "show"])
    assert code == 0, err
    doc = yaml.safe_load(out)
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def profile_doc() -> dict[str, Any]:
    return yaml.safe_load((profiles_dir() / "a100-qwen3-32b.yaml").read_text())


@pytest.fixture(scope="module")
def trace_df() -> pd.DataFrame:
    return pd.read_parquet(traces_dir() / "fixture-synthetic.parquet")


@pytest.fixture(scope="module")
def run_log(work: Path) -> Path:
    """A small run's per-round log (with its JSON sidecar) for the replay readers."""
    log = work / "fixture-log" / "log.parquet"
    log.parent.mkdir()
    code, _, err = cli(["run", *QUICK, "-o", str(work / "fixture-run"), "--log", str(log)], limit=120)
    assert code == 0, err
    return log


@pytest.fixture(scope="module")
def sweep_folder(work: Path) -> Path:
    """A small sweep's results folder for the plot readers."""
    out = work / "fixture-sweep"
    args = ["sweep", "--classes", "8", "--seeds", "1", "-j", "1", "--start", "2", "--max-devices", "4"]
    code, _, err = cli(
        [*args, "--set", "workload.duration_s=3", "--set", "workload.warmup_s=0", "-o", str(out)], limit=180
    )
    assert code == 0, err
    return out


# ------------------------------------------------------------------------------------------
# scenario files
# ------------------------------------------------------------------------------------------


@fuzz_settings(60)
@given(data=st.data())
def test_scenario_file_any_mutation(work: Path, default_doc: dict[str, Any], data: st.DataObject) -> None:
    """A hostile value anywhere in a scenario file: it loads or gives a one-line error."""
    path = data.draw(st.sampled_from(leaves(default_doc)), label="path")
    value = data.draw(hostile_values, label="value")
    f = fresh(work, "s.yaml")
    f.write_text(dump(set_path(default_doc, path, value)))
    outcome(load_with, f)


@fuzz_settings(40)
@given(data=st.data())
def test_scenario_file_nan_is_refused(work: Path, default_doc: dict[str, Any], data: st.DataObject) -> None:
    """NaN is never a valid number: every numeric field refuses it."""
    path = data.draw(st.sampled_from(numeric_paths(default_doc)), label="path")
    f = fresh(work, "s.yaml")
    f.write_text(dump(set_path(default_doc, path, math.nan)))
    assert outcome(load_with, f) == "error", f"{'.'.join(map(str, path))}: NaN accepted"


@fuzz_settings(30)
@given(raw=st.binary(min_size=1, max_size=400))
@example(raw=b"name: caf\xe9\n")
@example(raw=b"\xff\xfe\x00n\x00a\x00m\x00e\x00")
def test_scenario_file_bytes(work: Path, raw: bytes) -> None:
    """Arbitrary bytes (non-UTF-8 included) as a scenario file."""
    f = fresh(work, "s.yaml")
    f.write_bytes(raw)
    result = outcome(load_with, f)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        assert result == "error", "a non-UTF-8 scenario file was accepted"


@pytest.mark.parametrize("depth", [100, 3000])
@pytest.mark.parametrize("brackets", [("[", "]"), ("{a: ", "}")])
def test_scenario_deep_nesting(work: Path, depth: int, brackets: tuple[str, str]) -> None:
    o, c = brackets
    f = fresh(work, "s.yaml")
    f.write_text(f"devices:\n  classes: {o * depth}{c * depth}\n")
    assert outcome(load_with, f) == "error"


@pytest.mark.parametrize(
    "text",
    [
        "seed: 1\nseed: 2\n",
        "server:\n  delta_ms: 3\nserver:\n  block_size: 32\n",
        "workload: {warmup_s: 1, warmup_s: 2}\n",
    ],
)
def test_scenario_duplicate_keys_refused(work: Path, text: str) -> None:
    f = fresh(work, "s.yaml")
    f.write_text(text)
    assert outcome(load_with, f) == "error", "a duplicate key silently kept one of its values"


@fuzz_settings(30)
@given(
    key=st.text(min_size=1, max_size=20),
    value=hostile_values,
    section=st.sampled_from(["", "server", "workload", "devices"]),
)
def test_scenario_unknown_keys_refused(
    work: Path, default_doc: dict[str, Any], key: str, value: Any, section: str
) -> None:
    known = set(default_doc) if not section else set(default_doc[section])
    doc: dict[str, Any] = {key: value} if not section else {section: {key: value}}
    f = fresh(work, "s.yaml")
    f.write_text(dump(doc))
    result = outcome(load_with, f)
    if key not in known:
        assert result == "error"


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "scenarios").glob("*.yaml")))
def test_shipped_scenarios_load(name: str) -> None:
    assert outcome(load_with, ROOT / "scenarios" / name) == "ok"


def test_replica_profiles_unknown_names_the_field(work: Path) -> None:
    f = fresh(work, "s.yaml")
    f.write_text("server:\n  replicas: 2\n  replica_profiles: [a100-qwen3-32b-paper, nope]\n")
    with pytest.raises(WispsimError, match=r"server\.replica_profiles"):
        load_with(f)


# ------------------------------------------------------------------------------------------
# --set overrides
# ------------------------------------------------------------------------------------------


@fuzz_settings(80)
@given(data=st.data())
def test_set_any_value(default_doc: dict[str, Any], data: st.DataObject) -> None:
    """``--set PATH=VALUE`` with a schema path (or a junk path) and a hostile YAML text."""
    paths = [".".join(map(str, p)) for p in leaves(default_doc)]
    junk = [
        "bogus",
        "server.bogus",
        "server..delta_ms",
        "",
        ".",
        "server.verifier.delta_ms.x",
        "devices.classes.0",
    ]
    n = data.draw(st.integers(1, 3), label="count")
    items = []
    for _ in range(n):
        path = data.draw(st.one_of(st.sampled_from(paths), st.sampled_from(junk), st.text(max_size=10)))
        items.append(f"{path}={data.draw(hostile_text, label='value')}")
    outcome(load_with, None, items)


@fuzz_settings(40)
@given(data=st.data())
def test_set_nan_is_refused(default_doc: dict[str, Any], data: st.DataObject) -> None:
    path = ".".join(map(str, data.draw(st.sampled_from(numeric_paths(default_doc)))))
    assert outcome(load_with, None, [f"{path}=.nan"]) == "error", f"{path}=.nan accepted"


@pytest.mark.parametrize(
    "sets",
    [
        ["devices.count=.inf"],
        ["drafting.k=.nan"],
        ["workload.duration_s=1" + "0" * 400],
        ["server.engine.activation_reserve_gib=.inf"],
        ["server=1", "server.verifier.delta_ms=3"],
        ["server.engine.enable_prefix_caching=false"],  # the wisp preset overrode it silently
        ["server.scheduler=bogus"],
        ["workload.output_tokens.max=.inf"],
        ["server.engine.block_size=40000"],
        ["devices.start_spread_s=.inf"],
        ["server.replicas=10000000000000000000"],
        ["arrivals.process=poisson", "arrivals.rate=.inf"],
        ["server.verifier.max_batch_tokens=1"],
        ["seed=-1"],
        ["server.verifier.delta_ms"],
        ["=3"],
    ],
    ids=lambda s: " ".join(s)[:40],
)
def test_set_issue_cases_refused(sets: list[str]) -> None:
    assert outcome(load_with, None, sets) == "error"


@pytest.mark.parametrize(
    "sets", [["workload.duration_s=1e3"], ["server.verifier.delta_ms=3"], ["seed=7"], ["epsilon=0.1"]]
)
def test_set_valid_values_load(sets: list[str]) -> None:
    assert outcome(load_with, None, sets) == "ok"


def test_set_exponent_without_dot_is_a_number() -> None:
    assert load_with(None, ["workload.duration_s=1e3"]).workload.duration_s == 1000.0


# ------------------------------------------------------------------------------------------
# CLI options and usage errors (validation-only commands, through the entry point)
# ------------------------------------------------------------------------------------------


@fuzz_settings(40)
@given(
    k=num_option,
    accept_from=st.one_of(st.sampled_from(["flag", "greedy", "beta", "bogus", ""]), st.text(max_size=8)),
)
def test_trace_inspect_options(k: str, accept_from: str) -> None:
    cli_outcome(["trace", "inspect", "fixture-synthetic", "--k", k, "--accept-from", accept_from])


@fuzz_settings(50)
@given(
    opt=st.sampled_from(
        [
            "--duration",
            "--step",
            "--low",
            "--high",
            "--period",
            "--rise",
            "--hold",
            "--decay",
            "--noise",
            "--seed",
        ]
    ),
    value=num_option,
)
def test_arrivals_generate_options(work: Path, opt: str, value: str) -> None:
    out = fresh(work, "g.csv")
    cli_outcome(["arrivals", "generate", "-o", str(out), "--duration", "120", opt, value], limit=15)


@fuzz_settings(30)
@given(
    peaks=st.one_of(
        st.sampled_from(["abc", "1:2:3", "nan:5", "5:inf", "-5:10", "1e300:5", "", "5:"]),
        st.text(max_size=15),
    )
)
def test_arrivals_generate_peaks(work: Path, peaks: str) -> None:
    cli_outcome(
        ["arrivals", "generate", "-o", str(fresh(work, "g.csv")), "--duration", "120", "--peaks", peaks]
    )


@fuzz_settings(40)
@given(
    opt=st.sampled_from(["--test", "--seed", "--scale", "--max-context", "--max-batch", "--counts"]),
    value=st.one_of(num_option, st.sampled_from(["1,2", "a,b,c,d,e", "-1,0,0,0,0", "1e9,1,1,1,1"])),
)
def test_profile_plan_options(work: Path, opt: str, value: str) -> None:
    cli_outcome(["profile", "plan", "-o", str(fresh(work, "p.csv")), opt, value], limit=15)


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--bogus"],
        ["run", "--devices", "abc"],
        ["frobnicate"],
        ["trace", "inspect"],
        ["scenario", "validate", "--set"],
        ["trace", "inspect", "fixture-synthetic", "--k", "1.5"],
    ],
    ids=lambda a: " ".join(a),
)
def test_usage_errors_are_one_line(args: list[str]) -> None:
    assert_error(args)


SWEEP = ["--classes", "8", "--seeds", "1", "-j", "1", "--start", "2", "--max-devices", "8", *QUICK[2:]]
PLAN = ["--max-replicas", "2", "-j", "1", *QUICK[2:]]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", *QUICK, "--classes", "nan"], "--classes"),
        (["run", *QUICK, "--classes", "500"], "--classes"),
        (["run", *QUICK, "--step", "nan"], "--step"),
        (["run", *QUICK, "--window", "-5"], "--window"),
        (["run", *QUICK, "--devices", "100000000000000000000"], "--devices"),
        (["run", *QUICK, "--seed", "-1"], "--seed"),
        (["sweep", *SWEEP, "--seed", "-1"], "--seed"),
        (["sweep", *SWEEP, "--policy", "bogus"], "--policy"),
        (["sweep", *SWEEP, "-j", "0"], "--jobs"),
        (["plan", *PLAN, "--fleet", "2:4", "--epsilon", "nan"], "--epsilon"),
        (["plan", *PLAN, "--fleet", "inf:4"], "--fleet"),
        (["plan", *PLAN, "--fleet", "2:4", "--method", "bogus"], "--method"),
        (["plan", *PLAN, "--fleet", "2:4", "--confirm-devices", "nan"], "--confirm-devices"),
        (["plan", *PLAN, "--fleet", "2:4", "--router", "round-robin", "--method", "decomposed"], "--method"),
        (["profile", "plan", "-o", "p.csv", "--scale", "nan"], "--scale"),
    ],
    ids=lambda a: " ".join(x for x in a if x not in QUICK + SWEEP)[:50] if isinstance(a, list) else a,
)
def test_option_errors_name_the_option(work: Path, args: list[str], needle: str) -> None:
    """Hostile option values: a one-line error naming the option (a run past 30 s is a hang)."""
    args = [a if a != "p.csv" else str(fresh(work, "p.csv")) for a in args]
    if args[0] in ("run", "sweep", "plan"):
        args += ["-o", str(fresh(work, "out"))]
    assert_error(args, needle, limit=20)


# ------------------------------------------------------------------------------------------
# latency profiles
# ------------------------------------------------------------------------------------------


@fuzz_settings(60)
@given(data=st.data())
def test_profile_any_mutation(work: Path, profile_doc: dict[str, Any], data: st.DataObject) -> None:
    from wispsim.model.profiles import load_profile

    path = data.draw(st.sampled_from(leaves(profile_doc)), label="path")
    value = data.draw(hostile_values, label="value")
    f = fresh(work, "p.yaml")
    f.write_text(dump(set_path(profile_doc, path, value)))
    outcome(load_profile, str(f))
    outcome(load_with, None, [f"server.profile={f}"])


@fuzz_settings(40)
@given(data=st.data())
def test_profile_non_finite_refused(work: Path, profile_doc: dict[str, Any], data: st.DataObject) -> None:
    """A NaN or infinite coefficient, memory size or model fact is refused."""
    from wispsim.model.profiles import load_profile

    paths = [p for p in numeric_paths(profile_doc) if p[0] in ("coefficients", "hardware", "model", "noise")]
    path = data.draw(st.sampled_from(paths), label="path")
    value = data.draw(st.sampled_from([math.nan, math.inf, -math.inf]), label="value")
    f = fresh(work, "p.yaml")
    f.write_text(dump(set_path(profile_doc, path, value)))
    assert outcome(load_profile, str(f)) == "error", f"{'.'.join(map(str, path))}={value} accepted"


def test_profile_non_utf8_refused(work: Path) -> None:
    from wispsim.model.profiles import load_profile

    raw = (
        (profiles_dir() / "a100-qwen3-32b.yaml")
        .read_bytes()
        .replace(b"description:", b"description: caf\xe9", 1)
    )
    f = fresh(work, "p.yaml")
    f.write_bytes(raw)
    assert outcome(load_profile, str(f)) == "error"
    assert outcome(load_with, None, [f"server.profile={f}"]) == "error"


@pytest.mark.parametrize("name", sorted(p.stem for p in profiles_dir().glob("*.yaml")))
def test_shipped_profiles_load(name: str) -> None:
    from wispsim.model.profiles import load_profile

    assert outcome(load_profile, name) == "ok"


# ------------------------------------------------------------------------------------------
# acceptance traces
# ------------------------------------------------------------------------------------------

TRACE_OPS = ["str", "nan", "inf", "neg", "huge", "yesno", "drop", "empty", "float", "none"]


def mutate_trace(df: pd.DataFrame, col: str, op: str, rows: int) -> pd.DataFrame:
    df = df.copy()
    idx = df.index[: max(1, len(df) // rows)]
    if op == "str":
        df[col] = df[col].astype(str)
    elif op in ("nan", "inf", "neg", "huge"):
        v = {"nan": math.nan, "inf": math.inf, "neg": -5.0, "huge": 1e300}[op]
        df[col] = df[col].astype(float)
        df.loc[idx, col] = v
    elif op == "yesno":
        df[col] = ["yes" if i % 2 else "no" for i in range(len(df))]
    elif op == "drop":
        df = df.drop(columns=[col])
    elif op == "empty":
        df = df.iloc[:0]
    elif op == "float":
        df[col] = df[col].astype(float) + 0.5
    elif op == "none":
        df[col] = df[col].astype(object)
        df.loc[idx, col] = None
    return df


@fuzz_settings(60)
@given(data=st.data())
def test_trace_any_mutation(work: Path, trace_df: pd.DataFrame, data: st.DataObject) -> None:
    col = data.draw(st.sampled_from(list(trace_df.columns)), label="column")
    op = data.draw(st.sampled_from(TRACE_OPS), label="op")
    rows = data.draw(st.sampled_from([1, 10, 1000]), label="rows")
    f = fresh(work, "t.parquet")
    mutate_trace(trace_df, col, op, rows).to_parquet(f)
    cli_outcome(
        ["trace", "inspect", str(f), "--accept-from", data.draw(st.sampled_from(["flag", "greedy", "beta"]))]
    )


@pytest.mark.parametrize(
    ("col", "op"),
    [
        ("beta", "str"),
        ("accept", "yesno"),
        ("greedy_agree", "yesno"),
        ("beta", "nan"),
        ("beta", "neg"),
        ("entropy", "inf"),
        ("position", "float"),
        ("beta", "drop"),
        ("beta", "empty"),
        ("sample_id", "none"),
    ],
)
def test_trace_bad_columns_refused(work: Path, trace_df: pd.DataFrame, col: str, op: str) -> None:
    f = fresh(work, "t.parquet")
    mutate_trace(trace_df, col, op, 10).to_parquet(f)
    assert cli_outcome(["trace", "inspect", str(f)]) == "error", f"{col} {op} accepted"


@fuzz_settings(25)
@given(cut=st.floats(0, 0.99), junk=st.binary(max_size=200))
def test_trace_damaged_file(work: Path, cut: float, junk: bytes) -> None:
    raw = (traces_dir() / "fixture-synthetic.parquet").read_bytes()
    f = fresh(work, "t.parquet")
    f.write_bytes(raw[: int(len(raw) * cut)] + junk)
    assert cli_outcome(["trace", "inspect", str(f)]) == "error"


def test_trace_valid() -> None:
    assert cli_outcome(["trace", "inspect", "fixture-synthetic"]) == "ok"


# ------------------------------------------------------------------------------------------
# arrival traces
# ------------------------------------------------------------------------------------------

ARRIVAL_CELLS = [
    "nan",
    "inf",
    "-inf",
    "-1",
    "1e300",
    "1e7",
    "1.2",
    "abc",
    "",
    "1e400",
    "0",
    "99999999999999999999",
]


@fuzz_settings(60)
@given(
    rows=st.lists(
        st.tuples(
            st.one_of(st.sampled_from(ARRIVAL_CELLS), st.floats(allow_nan=False).map(repr)),
            st.one_of(st.sampled_from(ARRIVAL_CELLS), st.floats(allow_nan=False).map(repr)),
        ),
        max_size=6,
    ),
    header=st.sampled_from(["time_s,value", "time_s,value", "time,value", "value,time_s", "", "time_s"]),
)
def test_arrival_csv_any(work: Path, rows: list[tuple[str, str]], header: str) -> None:
    from wispsim.sim.arrivals import load_arrival_trace

    f = fresh(work, "a.csv")
    f.write_text(header + "\n" + "".join(f"{t},{v}\n" for t, v in rows))
    outcome(load_arrival_trace, str(f))
    cli_outcome(["arrivals", "show", str(f)])


@fuzz_settings(20)
@given(raw=st.binary(max_size=300))
@example(raw=b"time_s,value\n0,4\xe9\n")
def test_arrival_csv_bytes(work: Path, raw: bytes) -> None:
    from wispsim.sim.arrivals import load_arrival_trace

    f = fresh(work, "a.csv")
    f.write_bytes(raw)
    outcome(load_arrival_trace, str(f))


@pytest.mark.parametrize(
    "body",
    ["0,4\n1e300,4\n", "0,10000000\n5,10000000\n", "0,1.2\n5,1.2\n", "0,4\n5,-1\n", "5,4\n0,4\n", "0,nan\n"],
    ids=["end-1e300", "value-1e7", "concurrency-1.2", "negative", "not-increasing", "nan"],
)
def test_arrival_trace_in_scenario_refused(work: Path, body: str) -> None:
    f = fresh(work, "a.csv")
    f.write_text("time_s,value\n" + body)
    sets = ["arrivals.process=trace", f"arrivals.trace={f}", "arrivals.kind=concurrency"]
    assert outcome(load_with, None, sets) == "error"


# ------------------------------------------------------------------------------------------
# replay logs and sidecars
# ------------------------------------------------------------------------------------------

SIDECAR_VALUES = [-3, -1, 0, 2**64, 1e308, "x", None, [], {}, [5, 1], [0, "a"], True, 1.5, [{"a": 1}]]


@fuzz_settings(50)
@given(
    key=st.sampled_from(
        ["seed", "window", "policy", "devices", "unfinished", "scenario", "sim_end", "format"]
    ),
    value=st.one_of(st.sampled_from(SIDECAR_VALUES), hostile_values),
)
def test_replay_sidecar_any(work: Path, run_log: Path, key: str, value: Any) -> None:
    from wispsim.study.replay.read import read_log

    log = fresh(work, "log.parquet")
    shutil.copy(run_log, log)
    meta = json.loads(run_log.with_name(run_log.name + ".meta.json").read_text())
    meta[key] = value
    log.with_name(log.name + ".meta.json").write_text(json.dumps(meta))
    outcome(read_log, log)


@fuzz_settings(30)
@given(raw=st.binary(max_size=200))
@example(raw=b"\x00\xff\xfe{")
def test_replay_sidecar_bytes(work: Path, run_log: Path, raw: bytes) -> None:
    from wispsim.study.replay.read import read_log

    log = fresh(work, "log.parquet")
    shutil.copy(run_log, log)
    log.with_name(log.name + ".meta.json").write_bytes(raw)
    assert outcome(read_log, log) == "error"


@fuzz_settings(30)
@given(
    col=st.sampled_from(
        [
            "device",
            "slo",
            "response",
            "round",
            "response_start",
            "t_start",
            "accepted",
            "committed",
            "drafted",
            "measured",
            "position",
            "output_tokens",
        ]
    ),
    op=st.sampled_from(["nan", "neg", "str", "drop", "huge", "empty"]),
)
def test_replay_log_columns(work: Path, run_log: Path, col: str, op: str) -> None:
    from wispsim.study.replay.read import read_log

    df = pd.read_parquet(run_log)
    if op == "drop":
        df = df.drop(columns=[col])
    elif op == "empty":
        df = df.iloc[:0]
    elif op == "str":
        df[col] = df[col].astype(str)
    else:
        df[col] = df[col].astype(float)
        df.loc[df.index[:5], col] = {"nan": math.nan, "neg": -7.0, "huge": 1e300}[op]
    log = fresh(work, "log.parquet")
    df.to_parquet(log)
    shutil.copy(run_log.with_name(run_log.name + ".meta.json"), log.with_name(log.name + ".meta.json"))
    outcome(read_log, log)


@pytest.mark.parametrize(
    ("key", "value"),
    [("seed", -3), ("seed", "x"), ("window", [5, 1]), ("scenario", "x"), ("policy", "bogus")],
)
def test_replay_bad_sidecar_refused(work: Path, run_log: Path, key: str, value: Any) -> None:
    """Through the command: a sidecar the replay cannot honour is a one-line error."""
    log = fresh(work, "log.parquet")
    shutil.copy(run_log, log)
    meta = json.loads(run_log.with_name(run_log.name + ".meta.json").read_text())
    meta[key] = value
    log.with_name(log.name + ".meta.json").write_text(json.dumps(meta))
    assert_error(["replay", str(log), "-o", str(fresh(work, "rp"))], limit=30)


# ------------------------------------------------------------------------------------------
# results folders
# ------------------------------------------------------------------------------------------


def damaged_copy(work: Path, sweep_folder: Path, name: str, data: bytes) -> Path:
    d = fresh(work, "sw")
    shutil.copytree(sweep_folder, d)
    (d / name).write_bytes(data)
    return d


@fuzz_settings(40)
@given(
    name=st.sampled_from(["manifest.json", "capacity.csv", "curve.csv", "curve_pooled.csv", "scenario.yaml"]),
    raw=st.binary(max_size=300),
)
@example(name="manifest.json", raw=b"\x9f\x92\x00\xff")
def test_results_folder_damaged_file_readers(work: Path, sweep_folder: Path, name: str, raw: bytes) -> None:
    from wispsim.results import Results

    d = damaged_copy(work, sweep_folder, name, raw)
    outcome(lambda f: Results.existing(f).meta(), d)
    if name.endswith(".csv"):
        outcome(lambda f, n: Results.existing(f).read_csv(n), d, name)


@fuzz_settings(20)
@given(
    name=st.sampled_from(["manifest.json", "capacity.csv", "curve.csv"]),
    cell=st.sampled_from(["abc", "nan", "inf", "-1", "", "1e300"]),
    command=st.sampled_from(["capacity", "curves"]),
)
def test_results_folder_plots(work: Path, sweep_folder: Path, name: str, cell: str, command: str) -> None:
    """``plot capacity|curves`` over a folder with one damaged cell or manifest value."""
    orig = (sweep_folder / name).read_bytes()
    if name.endswith(".csv"):
        df = pd.read_csv(io.BytesIO(orig))
        col = df.columns[len(df.columns) // 2]
        df[col] = df[col].astype(object)
        df.loc[0, col] = cell
        data = df.to_csv(index=False).encode()
    else:
        m = json.loads(orig)
        m["epsilon"] = cell
        data = json.dumps(m).encode()
    d = damaged_copy(work, sweep_folder, name, data)
    cli_outcome(["plot", command, str(d), "-o", str(fresh(work, "c.png"))])


def test_results_binary_manifest_refused(work: Path, sweep_folder: Path) -> None:
    d = damaged_copy(work, sweep_folder, "manifest.json", b"\x9f\x92\x00\xff" * 50)
    assert_error(["plot", "capacity", str(d), "-o", str(fresh(work, "c.png"))])


def test_results_valid_plot(work: Path, sweep_folder: Path) -> None:
    assert cli_outcome(["plot", "capacity", str(sweep_folder), "-o", str(fresh(work, "c.png"))]) == "ok"


# ------------------------------------------------------------------------------------------
# output paths
# ------------------------------------------------------------------------------------------

BAD_OUT = [
    "/proc/wispsim-out/x.csv",
    "/sys/wispsim-out.csv",
    "/etc/hostname/x.csv",
    "FILE/sub.csv",
    "DIR",
    "nodir/x.csv",
    "x" * 300 + ".csv",
    "/",
]


def _out_path(work: Path, template: str) -> str:
    base = fresh(work, "o")
    base.mkdir()
    (base / "FILE").write_text("x")
    (base / "DIR").mkdir()
    if template.startswith("/"):
        return template
    return str(base / template)


@pytest.mark.parametrize("template", BAD_OUT, ids=lambda t: t[:24])
@pytest.mark.parametrize(
    "command",
    [
        ["arrivals", "generate", "--duration", "60", "-o"],
        ["profile", "plan", "-o"],
        ["trace", "inspect", "fixture-synthetic", "--plot"],
    ],
    ids=["arrivals-generate", "profile-plan", "trace-plot"],
)
def test_bad_output_paths_refused(work: Path, command: list[str], template: str) -> None:
    path = _out_path(work, template)
    if command[0] == "trace":
        path = path.replace(".csv", ".png")
    if template == "nodir/x.csv":  # the rule (docs/inputs.md): missing parents are created
        code, _, err = cli([*command, path])
        assert code == 0 and Path(path).is_file(), err[-400:]
        return
    assert_error([*command, path])


@pytest.mark.parametrize("template", ["/proc/wispsim-out", "/etc/hostname", "FILE/sub"])
def test_bad_run_output_refused(work: Path, template: str) -> None:
    assert_error(["run", *QUICK, "-o", _out_path(work, template)], limit=30)


def test_bad_run_log_path_refused(work: Path) -> None:
    assert_error(
        ["run", *QUICK, "-o", str(fresh(work, "out")), "--log", "/proc/wispsim-out/l.parquet"], limit=30
    )

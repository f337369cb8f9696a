"""Fuzz the wispsim command line with generated bad input (issue 13).

Every input is one ``python -m wispsim.cli ...`` subprocess in a fresh temporary folder, with a
timeout (a timeout is a hang). Families: scenario YAML files, ``--set`` overrides, CLI options,
acceptance traces, arrival CSVs, latency profiles, replay logs and sidecars, results folders and
output paths; each mixes in unmutated inputs as controls, which must exit 0.

Classes: ``ok-error`` (exit 2, one stderr line starting ``error:``, no Traceback), ``ok-valid``
(exit 0), ``traceback``, ``hang``, ``crash`` (a signal or another exit code), ``multi-line``
(exit 2 without a clean one-line error), ``control-fail`` (a control input did not exit 0).
A mutated input that exits 0 counts as ``ok-valid``: a random mutation may well be valid.

Inputs are generated from ``--seed`` with :class:`random.Random`, so a run is reproducible.
Every failing input is saved under ``--save`` (default: next to ``--out``) with its files, the
command (``repro.sh``) and its stderr.

Usage::

    python scripts/fuzz.py --tree /work/main --n 1000 --seed 0 --out fuzz.tsv
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import io
import json
import math
import os
import random
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "hostile"))
from run import QUICK, env_for, make_fixtures, run_shell

QUICK_ARGS = shlex.split(QUICK)
CLASSES = ["ok-error", "ok-valid", "traceback", "hang", "crash", "multi-line", "control-fail"]


@dataclass
class Case:
    family: str
    args: list[str]  # after `wispsim`
    files: dict[str, bytes] = field(default_factory=dict)
    fixtures: tuple[str, ...] = ()  # "log" (log.parquet + sidecar), "sweep" (sw/), "run" (rn/)
    control: bool = False
    pre: str = ""  # shell run before the command (e.g. rm a fixture file)
    note: str = ""


# ------------------------------------------------------------------------------------------
# hostile values
# ------------------------------------------------------------------------------------------

HOSTILE_PY: list[Any] = [
    float("nan"),
    float("inf"),
    float("-inf"),
    1e308,
    -1e308,
    1e-320,
    -1,
    0,
    -0.0,
    10**30,
    -(10**30),
    2**63,
    2**64,
    1.5,
    "abc",
    "",
    " ",
    "1e3",
    "\u00e9\u2603",
    "x" * 5000,
    True,
    False,
    None,
    [],
    {},
    [1, [2, [3]]],
    {"a": {"b": 1}},
    [float("nan")],
    {"dist": "bogus"},
]

HOSTILE_TEXT = [
    ".nan",
    ".inf",
    "-.inf",
    "nan",
    "inf",
    "1" + "0" * 400,
    "-1",
    "0",
    "-0",
    "1e308",
    "1.0e+308",
    "1e-320",
    "99999999999999999999999",
    "9223372036854775808",
    "abc",
    "",
    "~",
    "null",
    "true",
    "[",
    "{a: 1}",
    "[1, 2]",
    "[[[[]]]]",
    "0x10",
    "1_000",
    "'3'",
    "&a 1",
    "*a",
    "!!binary AAAA",
    "é",
    "x" * 3000,
]

NUM_OPTION_TEXT = [
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "1e400",
    "1e308",
    "99999999999999999999999",
    "9223372036854775808",
    "abc",
    "",
    "1.5",
    "0x1F",
    " 3",
    "1,2",
    "-0",
    "1e-320",
    "100000",
]


def yaml_dump(doc: Any) -> bytes:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1000).encode()


def leaves(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every leaf (and every container) of a YAML document."""
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


def set_path(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


def del_path(doc: Any, path: tuple[Any, ...]) -> None:
    node = doc
    for p in path[:-1]:
        node = node[p]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    else:
        del node[path[-1]]


def mutate_yaml(rng: random.Random, doc: dict[str, Any]) -> tuple[bytes, str]:
    """A hostile variant of a YAML mapping, as bytes, with a note saying what changed."""
    doc = copy.deepcopy(doc)
    paths = leaves(doc)
    kind = rng.choice(
        ["value"] * 6 + ["unknown-key", "delete", "non-utf8", "duplicate", "deep", "raw-junk", "many"]
    )
    if kind == "value" or kind == "many":
        notes = []
        for _ in range(1 if kind == "value" else rng.randint(2, 5)):
            p = rng.choice(paths)
            v = rng.choice(HOSTILE_PY)
            try:
                set_path(doc, p, v)
            except (KeyError, IndexError, TypeError):
                continue
            notes.append(f"{'.'.join(map(str, p))}={str(v)[:40]!r}")
        return yaml_dump(doc), f"{kind}: " + ", ".join(notes)
    if kind == "unknown-key":
        p = rng.choice([q for q in paths if isinstance(doc_at(doc, q[:-1]), dict)] or [("x",)])
        parent = doc_at(doc, p[:-1])
        key = rng.choice(["bogus", "Server", "", "1", "k" * 300, "é"])
        parent[key] = rng.choice(HOSTILE_PY)
        return yaml_dump(doc), f"unknown key {key[:20]!r} under {'.'.join(map(str, p[:-1])) or '<top>'}"
    if kind == "delete":
        p = rng.choice(paths)
        del_path(doc, p)
        return yaml_dump(doc), f"deleted {'.'.join(map(str, p))}"
    text = yaml_dump(doc)
    if kind == "non-utf8":
        i = rng.randrange(len(text))
        return text[:i] + bytes([rng.choice([0xE9, 0xFF, 0xC3, 0x80, 0x00])]) + text[i:], f"byte at {i}"
    if kind == "duplicate":
        lines = text.splitlines(keepends=True)
        i = rng.randrange(len(lines))
        return b"".join([*lines[: i + 1], lines[i], *lines[i + 1 :]]), f"duplicated line {i + 1}"
    if kind == "deep":
        n = rng.choice([50, 500, 1000, 3000, 10000])
        opener, closer = rng.choice([("[", "]"), ("{a: ", "}")])
        return text + f"extra: {opener * n}{closer * n}\n".encode(), f"{n} nested {opener}"
    # raw junk: truncate, or overwrite a slice with random bytes
    if rng.random() < 0.5:
        return text[: rng.randrange(len(text))], "truncated"
    i = rng.randrange(len(text))
    return text[:i] + rng.randbytes(rng.randint(1, 40)) + text[i + 40 :], "random bytes"


def doc_at(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        doc = doc[p]
    return doc


# ------------------------------------------------------------------------------------------
# families
# ------------------------------------------------------------------------------------------


class Generator:
    def __init__(self, rng: random.Random, tree: Path, default: dict[str, Any]) -> None:
        self.rng = rng
        self.tree = tree
        self.default = default
        self.profile_doc = yaml.safe_load((tree / "profiles" / "a100-qwen3-32b.yaml").read_text())
        self.trace_df = pd.read_parquet(tree / "traces" / "fixture-synthetic.parquet")
        self.fit_csv = (tree / "profiles" / "data" / "cpu-qwen2.5-0.5b.csv").read_bytes()
        self.fit_meta = (tree / "profiles" / "data" / "cpu-qwen2.5-0.5b.csv.meta.json").read_bytes()
        self.set_paths = [
            ".".join(map(str, p))
            for p in leaves(default)
            if all(isinstance(x, str) for x in p) and not isinstance(doc_at(default, p), list)
        ]

    # -- scenario files ------------------------------------------------------------------
    def scenario(self, control: bool) -> Case:
        r = self.rng
        if control:
            data, note = yaml_dump(self.default), "control: the default scenario"
        else:
            data, note = mutate_yaml(r, self.default)
        if r.random() < 0.15:
            return Case(
                "scenario",
                ["run", "s.yaml", *QUICK_ARGS, "-o", "out"],
                {"s.yaml": data},
                control=control,
                note=note,
            )
        cmd = r.choice(["validate", "validate", "show"])
        return Case("scenario", ["scenario", cmd, "s.yaml"], {"s.yaml": data}, control=control, note=note)

    # -- --set ----------------------------------------------------------------------------
    def set_(self, control: bool) -> Case:
        r = self.rng
        if control:
            k = r.choice(
                [
                    "server.delta_ms=3",
                    "workload.duration_s=60",
                    "seed=7",
                    "devices.count=12",
                    "epsilon=0.1",
                    "drafting.k=4",
                    "server.block_size=32",
                ]
            )
            return Case("set", ["scenario", "validate", "--set", k], control=True, note="control")
        sets = []
        for _ in range(r.choice([1, 1, 1, 2, 3])):
            roll = r.random()
            path = r.choice(self.set_paths)
            if roll < 0.1:
                path = r.choice(
                    [
                        "bogus",
                        "server.bogus",
                        "server..delta_ms",
                        "",
                        ".",
                        "server.delta_ms.x",
                        "devices.classes.0",
                        " server.delta_ms",
                        "é.x",
                        "a" * 500,
                    ]
                )
            elif roll < 0.15:
                path = path.rsplit(".", 1)[0]  # a whole section replaced by a scalar
            value = r.choice(HOSTILE_TEXT)
            sets.append(f"{path}={value}" if r.random() > 0.03 else path)
        args = ["scenario", r.choice(["validate", "validate", "show"])]
        for s in sets:
            args += ["--set", s]
        if r.random() < 0.12:
            args = ["run", *QUICK_ARGS, *args[2:], "-o", "out"]
        return Case("set", args, note=" ".join(sets)[:200])

    # -- CLI options ------------------------------------------------------------------------
    def cli(self, control: bool) -> Case:
        r = self.rng
        sweep_base = [
            "--classes",
            "8",
            "--seeds",
            "1",
            "-j",
            "1",
            "--start",
            "2",
            "--max-devices",
            "8",
            "--set",
            "workload.duration_s=3",
            "--set",
            "workload.warmup_s=0",
        ]
        templates: list[tuple[list[str], list[tuple[str, list[str]]]]] = [
            (
                ["run", *QUICK_ARGS, "-o", "out"],
                [
                    ("--devices", NUM_OPTION_TEXT),
                    ("--classes", [*NUM_OPTION_TEXT, "2,,4", "2,-4", "500"]),
                    ("--seed", NUM_OPTION_TEXT),
                    ("--replicas", NUM_OPTION_TEXT),
                    ("--router", ["bogus", "", "round-robin"]),
                    ("--policy", ["bogus", "", "WISP", "custom"]),
                    ("--tail", NUM_OPTION_TEXT),
                    ("--step", NUM_OPTION_TEXT),
                    ("--window", NUM_OPTION_TEXT),
                    (
                        "--arrivals",
                        [
                            "poisson:nan",
                            "poisson:inf",
                            "poisson:-1",
                            "poisson:",
                            "poisson:1e9",
                            "rate:",
                            "concurrency:nofile",
                            "nofile.csv",
                            ":",
                            "bursty",
                        ],
                    ),
                ],
            ),
            (
                ["sweep", *sweep_base, "-o", "sw"],
                [
                    ("--seed", NUM_OPTION_TEXT),
                    ("--seeds", NUM_OPTION_TEXT),
                    ("--epsilon", NUM_OPTION_TEXT),
                    ("-j", NUM_OPTION_TEXT),
                    ("--start", NUM_OPTION_TEXT),
                    ("--max-devices", NUM_OPTION_TEXT),
                    ("--devices", ["8:2", "0:4", "1:4:0", "a:b", "-3", "1e9", "4,,8", "2:99999999999999999"]),
                    ("--policy", ["bogus", ""]),
                    ("--mix", ["bogus", ""]),
                    ("--records", ["bogus", ""]),
                    ("--backend", ["bogus", ""]),
                    ("--classes", ["nan", "0", "-2", "abc", "inf"]),
                ],
            ),
            (
                [
                    "plan",
                    "--fleet",
                    "8:2",
                    "--max-replicas",
                    "2",
                    "--set",
                    "workload.duration_s=3",
                    "--set",
                    "workload.warmup_s=0",
                    "-j",
                    "1",
                    "-o",
                    "pl",
                ],
                [
                    ("--fleet", ["2:abc", "inf:4", "nan:4", "2:-1", "2:0", "", "2", "2:1e30", "0:4"]),
                    ("--epsilon", NUM_OPTION_TEXT),
                    ("--max-replicas", NUM_OPTION_TEXT),
                    ("--start", NUM_OPTION_TEXT),
                    ("--seeds", NUM_OPTION_TEXT),
                    ("--price-per-gpu-hour", NUM_OPTION_TEXT),
                    ("--profile", ["nope", "", "/etc/passwd"]),
                    ("--method", ["bogus", "", "FULL"]),
                    ("--confirm-devices", NUM_OPTION_TEXT),
                ],
            ),
            (
                ["arrivals", "generate", "-o", "g.csv", "--duration", "60"],
                [
                    ("--duration", NUM_OPTION_TEXT),
                    ("--step", NUM_OPTION_TEXT),
                    ("--low", NUM_OPTION_TEXT),
                    ("--high", NUM_OPTION_TEXT),
                    ("--period", NUM_OPTION_TEXT),
                    ("--rise", NUM_OPTION_TEXT),
                    ("--hold", NUM_OPTION_TEXT),
                    ("--decay", NUM_OPTION_TEXT),
                    ("--noise", NUM_OPTION_TEXT),
                    ("--seed", NUM_OPTION_TEXT),
                    ("--peaks", ["abc", "1:2:3", "nan:5", "5:inf", "-5:10", "1e300:5", "", "none", "5:"]),
                ],
            ),
            (
                ["profile", "plan", "-o", "p.csv"],
                [
                    ("--counts", ["1,2", "a,b,c,d,e", "-1,0,0,0,0", "0,0,0,0,0", "1e9,1,1,1,1", ""]),
                    ("--test", NUM_OPTION_TEXT),
                    ("--seed", NUM_OPTION_TEXT),
                    ("--scale", NUM_OPTION_TEXT),
                    ("--max-context", NUM_OPTION_TEXT),
                    ("--max-batch", NUM_OPTION_TEXT),
                ],
            ),
            (
                ["trace", "inspect", "fixture-synthetic"],
                [
                    ("--k", NUM_OPTION_TEXT),
                    ("--accept-from", ["bogus", "", "BETA"]),
                ],
            ),
            (["profile", "show"], [("", ["nope", "", "/etc/passwd", "/proc/self/status", "../x", "é"])]),
            (["arrivals", "show"], [("", ["nope", "", "/etc/passwd", "/dev/null", "/proc/self/status"])]),
        ]
        weights = [4, 1, 1, 3, 2, 3, 1, 1]
        base, opts = r.choices(templates, weights)[0]
        if control:
            return Case(
                "cli",
                list(base) + (["bursty"] if base == ["arrivals", "show"] else []),
                control=True,
                note="control",
            )
        args = list(base)
        notes = []
        for _ in range(r.choice([1, 1, 2])):
            opt, values = r.choice(opts)
            v = r.choice(values)
            args += [v] if not opt else [opt, v]
            notes.append(f"{opt} {v!r}")
        if r.random() < 0.05:
            args.append(r.choice(["--bogus", "extra-arg", "--help=3", "-o"]))
        return Case("cli", args, note=", ".join(notes))

    # -- acceptance traces ----------------------------------------------------------------------
    def trace(self, control: bool) -> Case:
        r = self.rng
        df = self.trace_df.copy()
        note = "control"
        if not control:
            col = r.choice(list(df.columns))
            op = r.choice(
                [
                    "str",
                    "nan",
                    "inf",
                    "neg",
                    "huge",
                    "yesno",
                    "drop",
                    "empty",
                    "dup",
                    "shuffle",
                    "float-pos",
                    "truncate",
                    "junk",
                    "none",
                    "object-mix",
                ]
            )
            note = f"{op} {col}"
            n = len(df)
            idx = r.sample(range(n), k=max(1, n // r.choice([1, 10, 1000])))
            try:
                if op == "str":
                    df[col] = df[col].astype(str)
                elif op == "nan":
                    df[col] = df[col].astype(float)
                    df.loc[idx, col] = float("nan")
                elif op == "inf":
                    df[col] = df[col].astype(float)
                    df.loc[idx, col] = r.choice([math.inf, -math.inf])
                elif op == "neg":
                    df[col] = df[col].astype(float)
                    df.loc[idx, col] = -r.choice([1, 5, 1e9])
                elif op == "huge":
                    df[col] = df[col].astype(float)
                    df.loc[idx, col] = r.choice([1e18, 1e300, 2.0**63])
                elif op == "yesno":
                    df[col] = ["yes" if i % 2 else "no" for i in range(n)]
                elif op == "drop":
                    df = df.drop(columns=[col])
                elif op == "empty":
                    df = df.iloc[:0]
                elif op == "dup":
                    df = pd.concat([df, df.iloc[: n // 3]])
                elif op == "shuffle":
                    df[col] = df[col].sample(frac=1, random_state=r.randrange(1000)).to_numpy()
                elif op == "float-pos":
                    df["position"] = df["position"] * r.choice([0.5, 1.5, -1])
                elif op == "none":
                    df[col] = df[col].astype(object)
                    df.loc[idx, col] = None
                elif op == "object-mix":
                    df[col] = df[col].astype(object)
                    df.loc[idx, col] = "x"
            except (ValueError, TypeError) as e:
                note += f" (mutation failed: {type(e).__name__})"
        buf = io.BytesIO()
        try:
            df.to_parquet(buf)
            data = buf.getvalue()
        except Exception as e:  # pyarrow refuses some mixes: write the junk as bytes then
            data = repr(e).encode()
            note += " (not Parquet)"
        if not control and "truncate" in note:
            data = data[: r.randrange(len(data))]
        if not control and "junk" in note:
            i = r.randrange(len(data))
            data = data[:i] + r.randbytes(64) + data[i + 64 :]
        if r.random() < 0.2:
            args = ["run", *QUICK_ARGS, "--set", "acceptance.trace=t.parquet", "-o", "out"]
            if r.random() < 0.5:
                args += ["--set", "acceptance.accept_from=" + r.choice(["flag", "greedy", "beta"])]
        else:
            args = ["trace", "inspect", "t.parquet", "--accept-from", r.choice(["flag", "greedy", "beta"])]
        return Case("trace", args, {"t.parquet": data}, control=control, note=note)

    # -- arrival CSVs -----------------------------------------------------------------------------
    def arrivals(self, control: bool) -> Case:
        r = self.rng
        rows = [(0.0, 2.0), (2.0, 3.0), (4.0, 1.0)]
        header = "time_s,value"
        note = "control"
        text = None
        if not control:
            op = r.choice(["value", "value", "time", "header", "bytes", "empty", "extra-cols", "many"])
            note = op
            vals = [
                "nan",
                "inf",
                "-inf",
                "-1",
                "1e300",
                "1e7",
                "1.2",
                "0.5",
                "abc",
                "",
                "1e400",
                "0",
                "99999999999999999999",
                "1,5",
                '"3"',
                "true",
            ]
            rows_s = [[f"{t:g}", f"{v:g}"] for t, v in rows]
            if op in ("value", "time", "many"):
                for _ in range(1 if op != "many" else r.randint(2, 5)):
                    i = r.randrange(len(rows_s))
                    j = 1 if op == "value" else (0 if op == "time" else r.randrange(2))
                    rows_s[i][j] = r.choice(vals)
                    note += f" row{i}[{j}]={rows_s[i][j]!r}"
            elif op == "header":
                header = r.choice(["time,value", "value,time_s", "time_s", "", "time_s,value,time_s", "é,x"])
                note += f" {header!r}"
            elif op == "extra-cols":
                header = "time_s,value,extra"
                rows_s = [[*row, r.choice(vals)] for row in rows_s]
            body = header + "\n" + "".join(",".join(x) + "\n" for x in rows_s)
            text = body.encode()
            if op == "bytes":
                i = r.randrange(len(text))
                text = text[:i] + r.randbytes(r.randint(1, 20)) + text[i:]
            elif op == "empty":
                text = r.choice([b"", b"time_s,value\n", b"\n\n", b"#only a comment\n"])
        if text is None:
            text = (header + "\n" + "".join(f"{t:g},{v:g}\n" for t, v in rows)).encode()
        if r.random() < 0.35:
            spec = r.choice(["a.csv", "a.csv", "concurrency:a.csv", "rate:a.csv"])
            args = ["run", "--devices", "4", "--arrivals", spec, "--tail", "1", "-o", "out"]
        else:
            args = ["arrivals", "show", "a.csv"]
        return Case("arrivals", args, {"a.csv": text}, control=control, note=note)

    # -- latency profiles -------------------------------------------------------------------------
    def profile(self, control: bool) -> Case:
        r = self.rng
        if control:
            data, note = yaml_dump(self.profile_doc), "control"
        else:
            data, note = mutate_yaml(r, self.profile_doc)
        roll = r.random()
        if roll < 0.45:
            args = ["profile", "show", "p.yaml"]
        elif roll < 0.85:
            args = ["scenario", "validate", "--set", "server.profile=p.yaml"]
        else:
            args = ["run", *QUICK_ARGS, "--set", "server.profile=p.yaml", "-o", "out"]
        return Case("profile", args, {"p.yaml": data}, control=control, note=note)

    # -- profile fit measurements ---------------------------------------------------------------
    def fit(self, control: bool) -> Case:
        r = self.rng
        df = pd.read_csv(io.BytesIO(self.fit_csv))
        note = "control"
        if not control:
            col = r.choice(["latency_s", *r.sample(list(df.columns), 3)])
            v = r.choice(["slow", float("nan"), float("inf"), -1.0, 0.0, 1e300, ""])
            idx = r.sample(range(len(df)), k=max(1, len(df) // r.choice([1, 5, 100])))
            df[col] = df[col].astype(object)
            df.loc[idx, col] = v
            note = f"{col}={v!r} in {len(idx)} rows"
        files = {"m.csv": df.to_csv(index=False).encode(), "m.csv.meta.json": self.fit_meta}
        args = ["profile", "fit", "m.csv", "-o", "fo.yaml", "--bootstrap", "10", "--no-plots"]
        return Case("profile-fit", args, files, control=control, note=note)

    # -- replay logs and sidecars -----------------------------------------------------------------
    def replay(self, control: bool, meta: dict[str, Any], log: pd.DataFrame) -> Case:
        r = self.rng
        note = "control"
        files: dict[str, bytes] = {}
        pre = ""
        if not control:
            if r.random() < 0.65:
                m = copy.deepcopy(meta)
                top = ["seed", "window", "policy", "devices", "unfinished", "scenario", "sim_end", "format"]
                if r.random() < 0.6:
                    path: tuple[Any, ...] = (r.choice(top),)
                else:
                    path = r.choice([p for p in leaves(m) if p[0] == "scenario"])
                v = r.choice(
                    [-3, -1, 0, 2**64, 1e308, "x", None, [], {}, [5, 1], [0, "a"], True, 1.5, [{"a": 1}]]
                )
                with contextlib.suppress(KeyError, IndexError, TypeError):
                    set_path(m, path, v)
                note = f"sidecar {'.'.join(map(str, path))}={v!r}"
                text = json.dumps(m).encode()
                if r.random() < 0.1:
                    text = r.choice([b"", b"\xff\xfe\x00", text[: len(text) // 2], b"[]", b"NaN"])
                    note = f"sidecar bytes {text[:20]!r}"
                files["log.parquet.meta.json"] = text
            else:
                df = log.copy()
                col = r.choice(list(df.columns))
                op = r.choice(["nan", "neg", "str", "drop", "huge", "empty", "junk"])
                note = f"log {op} {col}"
                idx = r.sample(range(len(df)), k=max(1, len(df) // r.choice([1, 20, 500])))
                try:
                    if op == "nan":
                        df[col] = df[col].astype(float)
                        df.loc[idx, col] = float("nan")
                    elif op == "neg":
                        df[col] = df[col].astype(float)
                        df.loc[idx, col] = -7.0
                    elif op == "huge":
                        df[col] = df[col].astype(float)
                        df.loc[idx, col] = 1e300
                    elif op == "str":
                        df[col] = df[col].astype(str)
                    elif op == "drop":
                        df = df.drop(columns=[col])
                    elif op == "empty":
                        df = df.iloc[:0]
                except (ValueError, TypeError):
                    note += " (mutation failed)"
                buf = io.BytesIO()
                df.to_parquet(buf)
                data = buf.getvalue()
                if op == "junk":
                    data = data[: r.randrange(len(data))]
                files["log.parquet"] = data
        args = ["replay", "log.parquet", "-o", "rp"]
        if not control and r.random() < 0.15:
            args += r.choice(
                [
                    ["--seed", r.choice(NUM_OPTION_TEXT)],
                    ["--policy", "bogus"],
                    ["--set", f"{r.choice(self.set_paths)}={r.choice(HOSTILE_TEXT)}"],
                ]
            )
            note += f" + {args[-2:]}"
        return Case("replay", args, files, fixtures=("log",), control=control, pre=pre, note=note)

    # -- results folders ------------------------------------------------------------------------------
    def results(self, control: bool, sweep_files: dict[str, bytes]) -> Case:
        r = self.rng
        files: dict[str, bytes] = {}
        note = "control"
        if not control:
            name = r.choice(
                ["manifest.json", "capacity.csv", "curve.csv", "curve_pooled.csv", "scenario.yaml"]
            )
            orig = sweep_files[name]
            op = r.choice(["junk", "truncate", "empty", "cell", "cell", "binary"])
            if op == "junk":
                i = r.randrange(len(orig))
                data = orig[:i] + r.randbytes(r.randint(1, 50)) + orig[i:]
            elif op == "truncate":
                data = orig[: r.randrange(len(orig))]
            elif op == "empty":
                data = b""
            elif op == "binary":
                data = r.randbytes(r.randint(10, 2000))
            else:
                if name.endswith(".csv"):
                    df = pd.read_csv(io.BytesIO(orig))
                    col = r.choice(list(df.columns))
                    df[col] = df[col].astype(object)
                    df.loc[r.randrange(len(df)), col] = r.choice(["abc", "nan", "inf", "-1", "", "1e300"])
                    data = df.to_csv(index=False).encode()
                    op += f" {col}"
                elif name.endswith(".json"):
                    m = json.loads(orig)
                    k = r.choice([*list(m), "bogus"])
                    m[k] = r.choice(["abc", -1, None, [], {}, 1e308, [1, "x"]])
                    data = json.dumps(m).encode()
                    op += f" {k}={m[k]!r}"
                else:
                    data, op2 = mutate_yaml(r, yaml.safe_load(orig))
                    op += " " + op2
            files[f"sw/{name}"] = data
            note = f"{name}: {op}"
        cmd = r.choice([["plot", "capacity", "sw", "-o", "c.png"], ["plot", "curves", "sw", "-o", "c.png"]])
        if not control and r.random() < 0.1 and cmd[1] == "curves":
            cmd += ["--epsilon", r.choice(NUM_OPTION_TEXT)]
        return Case("results", cmd, files, fixtures=("sweep",), control=control, note=note)

    # -- output paths -----------------------------------------------------------------------------
    def output(self, control: bool) -> Case:
        r = self.rng
        bad = [
            "/proc/wispsim-out",
            "/proc/wispsim-out/x",
            "/sys/wispsim-out",
            "/etc/hostname",
            "/etc/hostname/x",
            "file",
            "file/sub",
            "dir",
            "nodir/x",
            "/",
            ".",
            "",
            "x" * 300,
            "/dev/null",
            "/proc/self/status",
            "dir/" + "y" * 300,
        ]
        path = r.choice(bad) if not control else None
        cmds: list[tuple[list[str], str, list[str]]] = [
            (["run", *QUICK_ARGS, "-o"], "out", []),
            (["run", *QUICK_ARGS, "-o", "out", "--log"], "l.parquet", []),
            (["arrivals", "generate", "--duration", "60", "-o"], "g.csv", []),
            (["profile", "plan", "-o"], "p.csv", []),
            (["trace", "inspect", "fixture-synthetic", "--plot"], "x.png", []),
            (["plot", "capacity", "sw", "-o"], "c.png", ["sweep"]),
            (["replay", "log.parquet", "-o"], "rp", ["log"]),
        ]
        base, good, fx = r.choice(cmds)
        if path is None:
            path = good
        elif r.random() < 0.2 and path not in ("", "/", "."):
            path = path + r.choice([".txt", ".xyz", ".csv", ".png", ".parquet"])
        args = [*base, path]
        files = {"file": b"x", "dir/.keep": b""}
        return Case("output", args, files, fixtures=tuple(fx), control=control, note=f"path {path[:60]!r}")


FAMILIES: dict[str, float] = {  # relative weights (cheap, validation-only families weigh more)
    "scenario": 2.0,
    "set": 2.0,
    "cli": 1.6,
    "trace": 1.2,
    "arrivals": 1.2,
    "profile": 1.2,
    "profile-fit": 0.4,
    "replay": 0.6,
    "results": 0.8,
    "output": 0.7,
}


def generate(
    n: int, seed: int, tree: Path, default: dict[str, Any], fix: Path, control_share: float = 0.08
) -> list[Case]:
    rng = random.Random(seed)
    g = Generator(rng, tree, default)
    meta = json.loads((fix / "log.parquet.meta.json").read_text())
    log = pd.read_parquet(fix / "log.parquet")
    sweep_files = {p.name: p.read_bytes() for p in (fix / "sw").iterdir() if p.is_file()}
    makers: dict[str, Callable[[bool], Case]] = {
        "scenario": g.scenario,
        "set": g.set_,
        "cli": g.cli,
        "trace": g.trace,
        "arrivals": g.arrivals,
        "profile": g.profile,
        "profile-fit": g.fit,
        "replay": lambda c: g.replay(c, meta, log),
        "results": lambda c: g.results(c, sweep_files),
        "output": g.output,
    }
    names = list(FAMILIES)
    cases = []
    # every family gets at least one control, then a weighted draw
    for fam in names:
        cases.append(makers[fam](True))
    while len(cases) < n:
        fam = rng.choices(names, [FAMILIES[f] for f in names])[0]
        cases.append(makers[fam](rng.random() < control_share))
    return cases


# ------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------


def classify(case: Case, rc: int | None, err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if rc is None:
        return "hang"
    if "Traceback (most recent call last)" in err:
        return "traceback"
    if case.control and rc != 0:
        return "control-fail"
    if rc == 0:
        return "ok-valid"
    if rc == 2:
        return "ok-error" if len(lines) == 1 and lines[0].startswith("error:") else "multi-line"
    return "crash"


def command_line(case: Case) -> str:
    cmd = "wispsim " + " ".join(shlex.quote(a) for a in case.args)
    return f"{case.pre}; {cmd}" if case.pre else cmd


def stage(case: Case, d: Path, fix: Path) -> None:
    if "log" in case.fixtures:
        shutil.copy(fix / "log.parquet", d / "log.parquet")
        shutil.copy(fix / "log.parquet.meta.json", d / "log.parquet.meta.json")
    if "sweep" in case.fixtures:
        shutil.copytree(fix / "sw", d / "sw")
    for name, data in case.files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def save_failure(save: Path, i: int, case: Case, d: Path, err: str, cls: str) -> None:
    out = save / f"{i:05d}-{case.family}-{cls}"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(d, out / "files", ignore=shutil.ignore_patterns("out", "rp", "sw", "pl", "*.png"))
    for name, data in case.files.items():  # the inputs exactly as given, whatever the run left
        p = out / "files" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (out / "stderr.txt").write_text(err[-20000:])
    fixtures = " ".join(case.fixtures)
    (out / "repro.sh").write_text(
        "#!/bin/bash\n# run from this folder's files/ with PYTHONPATH at the tree under test\n"
        f"# family {case.family}; {case.note}\n"
        + (f"# needs fixtures: {fixtures} (scripts/hostile/run.py make_fixtures)\n" if fixtures else "")
        + 'wispsim() { python -m wispsim.cli "$@"; }\n'
        + command_line(case)
        + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, required=True, help="wispsim checkout to test (PYTHONPATH)")
    ap.add_argument("--n", type=int, default=1000, help="inputs to run (controls included)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("fuzz.tsv"))
    ap.add_argument(
        "--save", type=Path, default=None, help="folder for failing inputs (default OUT.failures)"
    )
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--families", default="", help="comma-separated families to keep (after generation)")
    args = ap.parse_args()
    tree = args.tree.resolve()
    save = args.save or args.out.with_suffix(".failures")
    if save.exists():
        shutil.rmtree(save)
    save.mkdir(parents=True)

    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="wispsim-fuzz-") as tmp:
        fix = Path(tmp) / "fixtures"
        fix.mkdir()
        print(f"making fixtures with {tree} ...", file=sys.stderr)
        make_fixtures(tree, fix)
        env = env_for(tree, fix)
        rc, out, err = run_shell("wispsim scenario show", fix, env, 60)
        if rc != 0:
            sys.exit(f"`wispsim scenario show` failed: {err[-2000:]}")
        default = yaml.safe_load(out)
        cases = generate(args.n, args.seed, tree, default, fix)
        if args.families:
            keep = set(args.families.split(","))
            cases = [c for c in cases if c.family in keep]
        total = len(cases)
        done = Counter[str]()

        def one(ic: tuple[int, Case]) -> dict[str, str]:
            i, case = ic
            d = Path(tmp) / f"in-{i:05d}"
            d.mkdir()
            stage(case, d, fix)
            start = time.time()
            rc, _, err = run_shell(command_line(case), d, env, args.timeout)
            cls = classify(case, rc, err)
            lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
            first = (lines[-1] if cls == "traceback" else lines[0]) if lines else ""
            if cls not in ("ok-error", "ok-valid"):
                save_failure(save, i, case, d, err, cls)
            shutil.rmtree(d, ignore_errors=True)
            done[cls] += 1
            n = sum(done.values())
            if n % 25 == 0 or n == total:
                bad = sum(v for k, v in done.items() if k not in ("ok-error", "ok-valid"))
                print(
                    f"[{n}/{total}] {time.time() - t0:.0f} s, failing so far: {bad}  {dict(done)}",
                    file=sys.stderr,
                    flush=True,
                )
            return dict(
                index=str(i),
                family=case.family,
                control="yes" if case.control else "no",
                cls=cls,
                exit="timeout" if rc is None else str(rc),
                seconds=f"{time.time() - start:.1f}",
                stderr_lines=str(len(lines)),
                first_stderr_line=first[:160],
                note=case.note[:160],
                command=command_line(case)[:400],
            )

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
            rows = list(ex.map(one, enumerate(cases)))

    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]), delimiter="\t", lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow({k: v.replace("\t", " ").replace("\n", " ") for k, v in row.items()})

    per: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        per[row["family"]][row["cls"]] += 1
        per["ALL"][row["cls"]] += 1
    print(f"\n{'family':12}{'inputs':>7}" + "".join(f"{c:>13}" for c in CLASSES))
    for fam in [*sorted(k for k in per if k != "ALL"), "ALL"]:
        cnt = per[fam]
        print(f"{fam:12}{sum(cnt.values()):>7}" + "".join(f"{cnt[c]:>13}" for c in CLASSES))
    failing = sum(v for k, v in per["ALL"].items() if k not in ("ok-error", "ok-valid"))
    print(
        f"\n{len(rows)} inputs in {time.time() - t0:.0f} s; {failing} failing, saved under {save}; "
        f"table: {args.out}"
    )
    if os.environ.get("FUZZ_STRICT"):
        sys.exit(1 if failing else 0)


if __name__ == "__main__":
    main()

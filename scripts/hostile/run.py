"""Run the hostile-input cases of issue 13 against a wispsim tree and write a verdict table.

Each row of ``cases.tsv`` (next to this file) is one reproducible command: a family, an id, an
expectation, setup steps and a bash command line. ``wispsim`` in the command is a bash function
running ``python -m wispsim.cli`` from the tree under test. Every case runs in a fresh temporary
folder with a timeout (a timeout is a hang) and a memory cap.

Expectations:

* ``error``: exit code 2, exactly one non-blank stderr line, starting ``error:``, no Traceback;
  ``error~TEXT`` also needs TEXT in that line.
* ``ok``: exit code 0 and no Traceback.
* ``either``: a pending decision: exit 0, or an ``error`` as above; a pass is reported as
  ``check`` so a person looks at it.

Setup steps (``;;``-separated, run in the case folder before the command):

* ``write:NAME=TEXT``: write TEXT (Python escapes: ``\\n``, ``\\xe9`` is the byte 0xE9).
* ``deep:NAME=N``: a scenario whose ``devices.classes`` is N nested YAML lists.
* ``profile:NAME=KEY=VALUE,...``: a copy of profiles/a100-qwen3-32b-paper.yaml (the linear form,
  fitted coefficients) with dotted KEYs set to YAML VALUEs (``-KEY`` deletes the key);
  ``roofprofile:`` the same on profiles/a100-qwen3-32b.yaml (the physical roofline form).
* ``trace:NAME=OP``: a copy of traces/fixture-synthetic.parquet changed by OP (see ``_trace``).
* ``fitcsv:NAME=OP``: a copy of profiles/data/cpu-qwen2.5-0.5b.csv (+ its sidecar) changed by OP.
* ``log``: the fixture replay log as ``log.parquet`` + ``log.parquet.meta.json``.
* ``sidecar:KEY=JSON``: set a (dotted) key of ``log.parquet.meta.json``; ``sidecar:=BYTES``
  replaces the whole file with escaped bytes.
* ``sweep`` / ``runfolder``: the fixture sweep results folder as ``sw`` / run folder as ``rn``.
* ``junk:NAME=N``: N seeded random bytes.
* ``mkdir:NAME``.

Fixtures (a small run with ``--log`` and a small sweep) are made once per invocation with the
tree under test; ``$FIX`` points at them, ``$REPO`` at the tree, ``$Q`` holds
``--devices 4 --set workload.duration_s=5 --set workload.warmup_s=0`` for quick runs.

Usage::

    python scripts/hostile/run.py --tree /work/main --out scripts/hostile/after.tsv
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import csv
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

HERE = Path(__file__).resolve().parent
QUICK = "--devices 4 --set workload.duration_s=5 --set workload.warmup_s=0"
MEM_LIMIT = 4 << 30  # bytes of address space per case: a blow-up is a failure, not a swap storm


# ------------------------------------------------------------------------------------------
# setup steps
# ------------------------------------------------------------------------------------------


def _unescape(text: str) -> bytes:
    return codecs.escape_decode(text.encode("utf-8"))[0]  # type: ignore[attr-defined]


def _set_dotted(doc: Any, key: str, value: Any) -> None:
    parts = key.split(".")
    node = doc
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def _del_dotted(doc: Any, key: str) -> None:
    parts = key.split(".")
    node = doc
    for p in parts[:-1]:
        node = node[p]
    node.pop(parts[-1], None)


def _trace(df: pd.DataFrame, op: str) -> pd.DataFrame | bytes:
    """Trace mutations: COLUMN_str, accept_yesno, COLUMN_nan, COLUMN_inf, COLUMN_neg,
    position_float, empty, truncated, drop_COLUMN, shuffle_positions."""
    df = df.copy()
    if op == "accept_yesno":
        df["accept"] = ["yes" if a else "no" for a in df["accept"]]
    elif op.endswith("_str"):
        col = op[: -len("_str")]
        df[col] = df[col].astype(str)
    elif op.endswith("_nan"):
        col = op[: -len("_nan")]
        df[col] = df[col].astype(float)
        df.loc[df.index[::7], col] = float("nan")
    elif op.endswith("_inf"):
        col = op[: -len("_inf")]
        df[col] = df[col].astype(float)
        df.loc[df.index[3], col] = float("inf")
    elif op.endswith("_neg"):
        col = op[: -len("_neg")]
        df.loc[df.index[3], col] = -5
    elif op == "position_float":
        df["position"] = df["position"] + 0.5
    elif op == "empty":
        df = df.iloc[:0]
    elif op.startswith("drop_"):
        df = df.drop(columns=[op[len("drop_") :]])
    elif op == "context_huge":
        df["context_length"] = 10**18
    else:
        raise ValueError(f"unknown trace op {op}")
    return df


def setup_case(steps: str, d: Path, repo: Path, fix: Path, seed: int) -> None:
    for step in filter(None, (s.strip() for s in steps.split(";;"))):
        kind, _, arg = step.partition(":")
        name, _, rest = arg.partition("=")
        if kind == "write":
            (d / name).write_bytes(_unescape(rest))
        elif kind == "deep":
            n = int(rest)
            (d / name).write_text("devices:\n  classes: " + "[" * n + "]" * n + "\n")
        elif kind in ("profile", "roofprofile"):
            base = "a100-qwen3-32b-paper.yaml" if kind == "profile" else "a100-qwen3-32b.yaml"
            doc = yaml.safe_load((repo / "profiles" / base).read_text())
            for kv in filter(None, rest.split(",")):
                k, _, v = kv.partition("=")
                if k.startswith("-"):
                    _del_dotted(doc, k[1:])
                else:
                    _set_dotted(doc, k, yaml.safe_load(v))
            text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
            (d / name).write_text(text)
        elif kind == "profilebytes":  # the shipped profile with a non-UTF-8 description
            raw = (repo / "profiles" / "a100-qwen3-32b.yaml").read_bytes()
            (d / name).write_bytes(raw.replace(b"description:", b"description: caf\xe9", 1))
        elif kind == "trace":
            src = repo / "traces" / "fixture-synthetic.parquet"
            if rest == "truncated":
                raw = src.read_bytes()
                (d / name).write_bytes(raw[: len(raw) // 2])
            else:
                out = _trace(pd.read_parquet(src), rest)
                assert isinstance(out, pd.DataFrame)
                out.to_parquet(d / name)
        elif kind == "fitcsv":
            src = repo / "profiles" / "data" / "cpu-qwen2.5-0.5b.csv"
            df = pd.read_csv(src)
            if rest == "latency_text":
                df["latency_s"] = "slow"
            elif rest == "latency_nan":
                df["latency_s"] = float("nan")
            elif rest == "latency_neg":
                df["latency_s"] = -df["latency_s"]
            elif rest == "empty":
                df = df.iloc[:0]
            elif rest != "copy":
                raise ValueError(f"unknown fitcsv op {rest}")
            df.to_csv(d / name, index=False)
            meta = src.with_name(src.name + ".meta.json")
            if meta.is_file():
                shutil.copy(meta, d / (name + ".meta.json"))
        elif kind == "log":
            shutil.copy(fix / "log.parquet", d / "log.parquet")
            shutil.copy(fix / "log.parquet.meta.json", d / "log.parquet.meta.json")
        elif kind == "sidecar":
            p = d / "log.parquet.meta.json"
            if not name:
                p.write_bytes(_unescape(rest))
            else:
                meta = json.loads(p.read_text())
                _set_dotted(meta, name, json.loads(rest))
                p.write_text(json.dumps(meta))
        elif kind == "sweep":
            shutil.copytree(fix / "sw", d / "sw")
        elif kind == "runfolder":
            shutil.copytree(fix / "rn", d / "rn")
        elif kind == "junk":
            (d / name).write_bytes(random.Random(seed).randbytes(int(rest)))
        elif kind == "mkdir":
            (d / name).mkdir(parents=True, exist_ok=True)
        else:
            raise ValueError(f"unknown setup step {step!r}")


# ------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------


def _limits() -> None:
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))


def env_for(tree: Path, fix: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(tree),
        REPO=str(tree),
        Q=QUICK,
        MPLBACKEND="Agg",
        PYTHONWARNINGS="ignore",
        COLUMNS="200",
        TERM="dumb",
        NO_COLOR="1",
    )
    if fix is not None:
        env["FIX"] = str(fix)
    return env


def run_shell(command: str, cwd: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str, str]:
    """Run ``command`` in bash with ``wispsim`` defined; (exit code or None on timeout, out, err)."""
    script = f'wispsim() {{ "{sys.executable}" -m wispsim.cli "$@"; }}\n{command}\n'
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_limits,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out.decode(errors="replace"), err.decode(errors="replace")


def make_fixtures(tree: Path, fix: Path) -> None:
    """A run folder with a replay log, and a small sweep folder, made with the tree under test."""
    env = env_for(tree, fix)
    cmds = [
        f"wispsim run {QUICK} -o rn --log log.parquet",
        "wispsim sweep --classes 8 --seeds 1 -j 1 --start 2 --max-devices 8 "
        "--set workload.duration_s=5 --set workload.warmup_s=0 -o sw",
    ]
    for c in cmds:
        rc, _, err = run_shell(c, fix, env, 300)
        if rc != 0:
            sys.exit(f"fixture command failed ({rc}): {c}\n{err[-2000:]}")


def classify(expect: str, rc: int | None, err: str) -> tuple[str, str]:
    """(class, verdict). Classes: good, traceback, hang, exit0 (accepted nonsense),
    rejected (valid input refused), unclear (exit 2 but not one clean line), crash (other code)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    tb = "Traceback (most recent call last)" in err
    want, _, needs = expect.partition("~")
    clean_error = (
        rc == 2
        and len(lines) == 1
        and lines[0].startswith("error:")
        and not tb
        and (not needs or needs in lines[0])
    )
    if rc is None:
        cls = "hang"
    elif tb:
        cls = "traceback"
    elif want == "ok":
        cls = "good" if rc == 0 else ("rejected" if rc == 2 else "crash")
    elif want == "either":
        cls = "good" if rc == 0 or clean_error else ("unclear" if rc == 2 else "crash")
    elif rc == 0:
        cls = "exit0"
    elif clean_error:
        cls = "good"
    elif rc == 2:
        cls = "unclear"
    else:
        cls = "crash"
    verdict = "pass" if cls == "good" else "fail"
    if want == "either" and cls == "good":
        verdict = "check"
    return cls, verdict


def read_cases(path: Path) -> list[dict[str, str]]:
    rows = []
    with path.open() as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if parts[0] == "family":
                continue
            family, cid, expect, setup, command = (parts + [""] * 5)[:5]
            rows.append(dict(family=family, id=cid, expect=expect, setup=setup, command=command))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, required=True, help="wispsim checkout to test (PYTHONPATH)")
    ap.add_argument("--cases", type=Path, default=HERE / "cases.tsv")
    ap.add_argument("--out", type=Path, default=Path("hostile.tsv"), help="verdict TSV to write")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a case is a hang")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated case ids or families to run")
    args = ap.parse_args()
    tree = args.tree.resolve()
    cases = read_cases(args.cases)
    if args.only:
        keep = set(args.only.split(","))
        cases = [c for c in cases if c["id"] in keep or c["family"] in keep]
    ids = Counter(c["id"] for c in cases)
    dup = [i for i, n in ids.items() if n > 1]
    if dup:
        sys.exit(f"duplicate case ids: {dup}")

    with tempfile.TemporaryDirectory(prefix="wispsim-hostile-") as tmp:
        fix = Path(tmp) / "fixtures"
        fix.mkdir()
        t0 = time.time()
        print(f"making fixtures with {tree} ...", file=sys.stderr)
        make_fixtures(tree, fix)
        env = env_for(tree, fix)

        def one(i_case: tuple[int, dict[str, str]]) -> dict[str, Any]:
            i, case = i_case
            d = Path(tmp) / f"case-{i:03d}"
            d.mkdir()
            setup_case(case["setup"], d, tree, fix, seed=i)
            start = time.time()
            rc, _, err = run_shell(case["command"], d, env, args.timeout)
            cls, verdict = classify(case["expect"], rc, err)
            lines = [ln for ln in err.splitlines() if ln.strip()]
            first = lines[0].strip() if lines else ""
            if "Traceback (most recent call last)" in err:  # the exception line says more
                first = lines[-1].strip()
            row = dict(
                id=case["id"],
                family=case["family"],
                expect=case["expect"],
                command=case["command"],
                exit="timeout" if rc is None else str(rc),
                stderr_lines=str(len(lines)),
                traceback="yes" if "Traceback (most recent call last)" in err else "no",
                first_stderr_line=first[:160].replace("\t", " "),
                cls=cls,
                verdict=verdict,
                seconds=f"{time.time() - start:.1f}",
            )
            print(f"{verdict:5} {cls:9} {case['id']:28} {row['exit']:>7}  {row['first_stderr_line'][:80]}")
            sys.stdout.flush()
            shutil.rmtree(d, ignore_errors=True)
            return row

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
            rows = list(ex.map(one, enumerate(cases)))

    fields = list(rows[0]) if rows else []
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(
            f, fields, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_NONE, escapechar="\\"
        )
        w.writeheader()
        w.writerows(rows)

    per: dict[str, Counter[str]] = defaultdict(Counter)
    for r in rows:
        per[r["family"]][r["cls"]] += 1
        per["ALL"][r["cls"]] += 1
    classes = ["traceback", "hang", "exit0", "unclear", "crash", "rejected", "good"]
    print(f"\n{'family':10}" + "".join(f"{c:>10}" for c in classes) + f"{'total':>8}")
    for fam in [*sorted(k for k in per if k != "ALL"), "ALL"]:
        cnt = per[fam]
        print(f"{fam:10}" + "".join(f"{cnt[c]:>10}" for c in classes) + f"{sum(cnt.values()):>8}")
    verdicts = Counter(r["verdict"] for r in rows)
    print(f"\nverdicts: {dict(verdicts)}; {len(rows)} cases in {time.time() - t0:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()

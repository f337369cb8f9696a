"""The results folder: the one place that knows its layout, writes it and reads it back.

Every command that writes results (``run``, ``replay``, ``sweep``, ``compare``, ``plan``,
``estimator compare``, ``swarm``, ``validate``) goes through :class:`Results`, and so do the
readers (``plot``, the tables of :mod:`wispsim.analysis.tables`, the studies). The rules:

- the folder is checked before any work starts (:meth:`Results.planned`: not a file, writable,
  disk not full) and created when the first result is written;
- writing starts by removing an old ``manifest.json`` (:meth:`Results.writing`), so a folder whose
  writing fails or is interrupted never looks complete;
- ``manifest.json`` is written last, atomically (:meth:`Results.finish`): a folder holding it is
  complete, one without it was interrupted or failed;
- an OSError while writing becomes one line naming the option (``--out``) and the file.

:data:`LAYOUT` says what each file holds.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from wispsim.errors import ConfigError, WispsimError
from wispsim.provenance import write_manifest
from wispsim.tabular import read_json, reading

MANIFEST = "manifest.json"
# the commands that write a results folder through Results.planned
KNOWN = ("run", "sweep", "compare", "replay", "plan", "swarm", "validate", "ablate", "estimator-compare")
LABEL_COLUMNS = {"policy": str, "class": str, "group": str}  # read as text: a class is "4" or "mix:4,8"

#: What each file of a results folder holds (the README's tour has the columns).
LAYOUT: dict[str, str] = {
    MANIFEST: "the command, versions, date, seed, commit and run facts; written last, atomically",
    "scenario.yaml": "the resolved scenario the command ran (file + --set + options)",
    "rounds.parquet": "one row per verification round (run, replay, swarm)",
    "batches.parquet": "one row per server batch",
    "responses.parquet": "one row per response",
    "summary.csv": "per SLO class: violation rate, speeds, goodput, queue and verify percentiles",
    "replicas.csv": "per replica: load, batch sizes, utilization",
    "timeseries.csv": "violation rate, speed and server load over time (run)",
    "comparison.csv": "recorded (or real) against simulated, per class (replay, validate)",
    "capacity.csv": "per policy and class: the largest N within epsilon, with its interval",
    "curve_pooled.csv": "per policy, class and N: violation rate with its Wilson interval",
    "points/": "one stored simulation per point (key, meta.json, summary), and any a spare worker "
    "simulated ahead that the search did not ask for: resumable sweeps",
}


def _results_of(manifest: Path) -> str | None:
    """The command whose results a folder holds, from its manifest (None: no readable manifest)."""
    try:
        info = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    if isinstance(info.get("results_of"), str):
        return str(info["results_of"])
    words = str(info.get("command", "")).split()  # an older manifest: "wispsim COMMAND ..."
    return words[1] if len(words) > 1 and words[0].endswith("wispsim") and words[1] in KNOWN else None


class Results:
    """A results folder, for writing (:meth:`planned`, :meth:`writing`, :meth:`table`,
    :meth:`finish`) and for reading (:meth:`existing`, :meth:`read_table`, :attr:`manifest`)."""

    def __init__(self, path: Path | str, source: str = "--out") -> None:
        self.path = Path(path)
        self.source = source
        self.command: str | None = None  # the command writing it (manifest.json's results_of)
        self._current: Path | None = None  # the file being written, for an OSError without a name

    # -- where -----------------------------------------------------------------------------
    @classmethod
    def planned(cls, out: Path | str | None, command: str, source: str = "--out") -> Results:
        """The folder a command will write: ``out``, or ``results/COMMAND-YYYYmmdd-HHMMSS``;
        checked (not yet created). Call it before any work starts."""
        if out is None:
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            out = Path("results") / f"{command}-{stamp}"
        folder = cls(check_output_dir(out, source), source)
        folder.command = command
        theirs = _results_of(folder.path / MANIFEST)
        if theirs is not None and theirs != command:  # its files and this command's would mix
            raise ConfigError(
                source,
                "",
                f"{folder.path} holds the results of `wispsim {theirs}`; a {command} there would mix with "
                "them: choose another folder, or remove that one",
            )
        return folder

    def create(self) -> Results:
        """The folder, created (with its parents)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise write_error(self.source, self.path, e) from None
        return self

    def __truediv__(self, name: str) -> Path:
        """A path inside the folder (no side effect; write through :meth:`file` or :meth:`table`)."""
        return self.path / name

    # -- writing ---------------------------------------------------------------------------
    @contextmanager
    def writing(self) -> Iterator[Results]:
        """Write results: the old manifest goes first (the folder is incomplete until
        :meth:`finish`), and an OSError becomes one line naming the option and the file."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / MANIFEST).unlink(missing_ok=True)
            yield self
        except OSError as e:
            if not e.filename and self._current is not None:
                e.filename = str(self._current)
            raise write_error(self.source, self.path, e) from None
        finally:
            self._current = None

    @contextmanager
    def file(self, name: str) -> Iterator[Path]:
        """A file another writer fills (a figure, a log): ``with r.file("x.png") as p: fig(p)``;
        an OSError there names it."""
        self._current = self.path / name
        self._current.parent.mkdir(parents=True, exist_ok=True)
        yield self._current
        self._current = None

    def table(self, name: str, df: pd.DataFrame, index: bool = False) -> Path:
        """Write ``df`` as ``name`` (.csv or .parquet by its suffix)."""
        with self.file(name) as p:
            if p.suffix == ".parquet":
                df.to_parquet(p, index=index)
            else:
                df.to_csv(p, index=index)
        return p

    def text(self, name: str, text: str) -> Path:
        """Write ``text`` (a scenario's YAML, a markdown table) as ``name``."""
        with self.file(name) as p:
            p.write_text(text)
        return p

    def finish(self, extra: dict[str, Any]) -> None:
        """``manifest.json``, last and atomically (:func:`wispsim.provenance.write_manifest`)."""
        with self.file(MANIFEST):
            write_manifest(self.path, {"results_of": self.command, **extra} if self.command else extra)

    # -- reading ---------------------------------------------------------------------------
    @classmethod
    def existing(cls, path: Path | str, source: str = "folder") -> Results:
        """A results folder to read; a one-line error when it is not an existing folder."""
        p = Path(path)
        if not p.is_dir():
            raise WispsimError(f"{p}: no such results folder")
        return cls(p, source)

    @property
    def complete(self) -> bool:
        """Did the command that wrote it finish (its manifest is there)?"""
        return (self.path / MANIFEST).is_file()

    def has(self, *names: str) -> bool:
        """Does the folder hold every one of ``names``?"""
        return all((self.path / n).is_file() for n in names)

    def read_csv(self, name: str, columns: Iterable[str] = ()) -> pd.DataFrame:
        """``name`` as a DataFrame with at least ``columns``; one-line errors naming the file.

        Label columns (policy, class, group) are read as strings: a class is "4" or "mix:4,8".
        """
        path = self.path / name
        if not path.is_file():
            raise WispsimError(f"{path}: not found (is {path.parent} the right results folder?)")
        with reading(str(path), "CSV", WispsimError):
            df = pd.read_csv(path, dtype=LABEL_COLUMNS, encoding="utf-8")
        columns = list(columns)
        check_columns(df, columns, str(path))
        if columns and df.empty:
            raise WispsimError(f"{path}: no rows (was the command that writes it interrupted?)")
        for c in columns:  # the numbers a figure reads must be numbers (empty cells are fine)
            if c in LABEL_COLUMNS or df[c].dtype != object:
                continue
            as_num = pd.to_numeric(df[c], errors="coerce")
            bad = df[c].notna() & as_num.isna() & ~df[c].astype(str).str.lower().isin(("true", "false"))
            if bad.any():
                row = int(bad.to_numpy().argmax())
                got = str(df[c].iloc[row])[:40]
                raise WispsimError(f"{path}: {c}: row {row + 1}: not a number, got {got!r}")
        return df

    def read_parquet(self, name: str, columns: Iterable[str] = ()) -> pd.DataFrame:
        """``name`` (Parquet records) with at least ``columns``."""
        path = self.path / name
        if not path.is_file():
            raise WispsimError(f"{path}: not found (is {path.parent} a run folder?)")
        with reading(str(path), "Parquet", WispsimError):  # pyarrow raises several kinds
            df = pd.read_parquet(path)
        return check_columns(df, columns, str(path))

    def read_table(self, name: str, columns: Iterable[str] = ()) -> pd.DataFrame:
        """``name`` read by its suffix: :meth:`read_parquet` or :meth:`read_csv`."""
        return self.read_parquet(name, columns) if name.endswith(".parquet") else self.read_csv(name, columns)

    def meta(self) -> dict[str, Any]:
        """What was run: manifest.json merged over the scenario's policy, seed, epsilon, profile,
        trace. Missing files give an empty dict; a damaged one is an error naming it."""
        p = self.path
        meta: dict[str, Any] = {}
        for s in [p / "scenario.yaml", *sorted(p.glob("scenario-*.yaml"))]:
            if not s.is_file():
                continue
            with reading(str(s), "YAML", WispsimError):
                doc = yaml.safe_load(s.read_bytes().decode("utf-8"))
            if isinstance(doc, dict):
                server, arrivals = doc.get("server"), doc.get("arrivals")
                found = {
                    "policy": doc.get("policy"),
                    "seed": doc.get("seed"),
                    "epsilon": doc.get("epsilon"),
                    "profile": server.get("profile") if isinstance(server, dict) else None,
                    "trace": arrivals.get("trace") if isinstance(arrivals, dict) else None,
                }
                _check_meta(found, s)
                for k, v in found.items():
                    meta.setdefault(k, v)
            break
        m = p / MANIFEST
        if m.is_file():
            man = read_json(m, error=WispsimError)
            if isinstance(man, dict):
                _check_meta(man, m)
                meta.update({k: v for k, v in man.items() if v is not None})
        return {k: v for k, v in meta.items() if v is not None}

    def label(self) -> str:
        """The run's name in legends: its policy (scenario.yaml or manifest.json), else the folder's."""
        return str(self.meta().get("policy") or self.path.name)


def newest_with(root: Path | str, files: Iterable[str], hint: str) -> Path:
    """The newest folder under ``root`` (a ``results/``) holding every one of ``files``, or a
    one-line error saying what is needed (``hint``: which commands write them)."""
    names = list(files)
    base = Path(root)
    found = [p for p in base.iterdir() if all((p / f).is_file() for f in names)] if base.is_dir() else []
    if not found:
        raise WispsimError(f"{base}: no folder with {' and '.join(names)} ({hint})")
    return max(found, key=lambda p: (p / names[0]).stat().st_mtime)


def check_columns(df: pd.DataFrame, columns: Iterable[str], what: str) -> pd.DataFrame:
    """``df`` itself, or a WispsimError naming ``what`` and the columns it lacks."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise WispsimError(f"{what}: missing column(s) {', '.join(missing)}")
    return df


def _check_meta(meta: Mapping[str, Any], path: Path) -> None:
    """The run facts figures use: ``epsilon`` a number in [0, 1), ``seed`` a whole number >= 0,
    ``policy``, ``profile`` and ``trace`` text."""
    eps = meta.get("epsilon")
    if eps is not None and not (isinstance(eps, int | float) and not isinstance(eps, bool) and 0 <= eps < 1):
        raise WispsimError(f"{path}: epsilon: must be a number in [0, 1), got {str(eps)[:40]!r}")
    seed = meta.get("seed")
    if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
        raise WispsimError(f"{path}: seed: must be a whole number >= 0, got {str(seed)[:40]!r}")
    for key in ("policy", "profile", "trace"):
        v = meta.get(key)
        if v is not None and not isinstance(v, str):
            raise WispsimError(f"{path}: {key}: must be text, got {str(v)[:40]!r}")


# -- output paths: checked before any work, written with one-line errors ----------------------

#: Free space an output location must have before a command starts writing (50 MiB).
MIN_FREE_BYTES = 50 * 1024 * 1024


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (``.`` for a relative path's root)."""
    p = path
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    return p


def _check_location(path: Path, source: str, what: str) -> None:
    """The folder that will hold ``path`` (it, or its missing parents once created) is usable."""
    anc = _nearest_existing(path.parent if what == "file" else path)
    if not anc.exists():
        raise ConfigError(source, "", f"{path}: no existing folder above it")
    if not anc.is_dir():
        raise ConfigError(source, "", f"{path}: cannot create the {what}: {anc} is a file, not a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise ConfigError(source, "", f"{path}: cannot write there: folder {anc} is not writable")
    try:
        usage = shutil.disk_usage(anc)
    except OSError:  # pragma: no cover - a file system that cannot say; let the write tell
        return
    free = usage.free
    if not usage.total:  # /proc, /sys and the like: no room for files at all
        raise ConfigError(source, "", f"{path}: cannot write there: {anc} is a virtual file system")
    if free < MIN_FREE_BYTES:
        raise ConfigError(
            source,
            "",
            f"{path}: only {free / 2**20:.1f} MiB free on that disk; "
            f"needs at least {MIN_FREE_BYTES // 2**20} MiB",
        )


def check_output_dir(path: Path | str, source: str) -> Path:
    """Refuse an output folder before any work: a file in its place, a read-only folder, a disk
    with less than :data:`MIN_FREE_BYTES` free. Missing folders (and parents) are created later by
    the writer. ``source`` is the option (``--out``) the message names."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(source, "", f"{p} exists and is a file; give a folder")
    _check_location(p, source, "folder")
    return p


def check_output_file(path: Path | str, source: str, suffixes: tuple[str, ...] = ()) -> Path:
    """Refuse an output file before any work: an existing folder in its place, a parent that is a
    file, a read-only folder, a nearly full disk, or (with ``suffixes``) a wrong file type.
    Missing parent folders are created by the writer."""
    p = Path(path)
    if str(path) == "" or p.name in ("", ".", ".."):
        raise ConfigError(source, "", f"{str(path)!r} is not a file name")
    if p.is_dir():
        raise ConfigError(source, "", f"{p} is an existing folder; give a file name")
    if suffixes and p.suffix.lower() not in suffixes:
        raise ConfigError(source, "", f"{p}: the name must end in {', '.join(suffixes)}")
    _check_location(p, source, "file")
    return p


def write_error(source: str, path: Path | str, err: OSError) -> Exception:
    """An OSError while writing under ``path`` as a one-line error naming ``source`` and the file."""
    name = ""
    if err.filename:
        f = Path(os.fsdecode(err.filename))
        try:
            name = " " + str(f.relative_to(path)) if f != Path(path) else ""
        except ValueError:
            name = f" {f}"
    why = err.strerror or str(err) or type(err).__name__
    return WispsimError(f"{source} {path}: cannot write{name}: {why}")


@contextmanager
def writing(source: str, path: Path | str) -> Iterator[None]:
    """Write one output file (``--log``, ``--plot``, ``--out FILE``): an OSError becomes a one-line
    error naming ``source`` and the file."""
    try:
        yield
    except OSError as e:
        raise write_error(source, path, e) from None

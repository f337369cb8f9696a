"""Where a result came from: library versions, file hashes, the git commit, the command line.

Every file wispsim writes (run and sweep manifests, stored points, traces, profiles, predictors,
experiment sections) records its provenance with these helpers, so any number can be traced to
the config, seed, code and inputs that produced it.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from wispsim.native import used
from wispsim.paths import PACKAGE_DIR
from wispsim.version import __version__

NOT_INSTALLED = "not installed"


def command_line() -> str:
    """The command being run, as the user typed it (``wispsim sweep ...``)."""
    return " ".join(["wispsim", *sys.argv[1:]])


def now_iso() -> str:
    return _dt.datetime.now().isoformat(timespec="seconds")


def module_versions(modules: Iterable[str], loaded_only: Iterable[str] = ()) -> dict[str, str]:
    """``python`` and each module's ``__version__`` (``not installed`` when it cannot be imported).

    Modules named in ``loaded_only`` are reported only when already imported (importing vLLM just
    to print its version would start its engine machinery).
    """
    skip = set(loaded_only)
    out = {"python": platform.python_version()}
    for mod in modules:
        if mod in skip and mod not in sys.modules:
            continue
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            out[mod] = NOT_INSTALLED
    return out


def distribution_versions(names: Iterable[str]) -> dict[str, str]:
    """Installed versions of distributions by their PyPI names (``scikit-learn``, ``simpy``)."""
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:  # a build under another name (xgboost-cpu, torch's +cpu wheels)
            try:
                out[name] = version(f"{name}-cpu")
            except PackageNotFoundError:
                out[name] = NOT_INSTALLED
    return out


def file_sha256(path: Path | str) -> str:
    """SHA-256 of a file, or of a folder's files (relative names and contents, sorted)."""
    path = Path(path)
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            h.update(f.relative_to(path).as_posix().encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


@functools.lru_cache(maxsize=256)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(path)[:16]


def file_digest(path: Path) -> str:
    """A short content hash of a file, cached while its size and mtime stay the same."""
    st = path.stat()
    return _digest(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=1)
def code_commit() -> str:
    """The git commit of the wispsim checkout running now (``+changes`` when ``wispsim/`` has
    uncommitted edits), or ``unknown`` outside a git checkout (an installed wheel)."""
    here = PACKAGE_DIR.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--", "wispsim"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty else "")


def write_manifest(out: Path, extra: dict[str, Any]) -> None:
    """``out/manifest.json``: the command, wispsim and Python versions, the git commit of the code
    (:func:`code_commit`), the date, and ``extra``.

    Commands write it after every other result file; it marks the folder as complete."""
    info = {
        "command": command_line(),
        "wispsim_version": __version__,
        "commit": code_commit(),
        "python": platform.python_version(),
        "hot_path": used()[0],  # compiled or pure (wispsim.native): the same numbers, not times
        "date": now_iso(),
        **extra,
    }
    # written last by every command and atomically (a temporary file renamed over it): a folder
    # holding manifest.json is complete, one without it was interrupted or failed
    final = Path(out) / "manifest.json"
    tmp = final.with_name(".manifest.json.tmp")
    try:
        tmp.write_text(json.dumps(info, indent=1, default=str))
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

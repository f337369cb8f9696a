"""Where shipped data lives: profiles, traces, predictors and the default scenario.

In a source checkout (or an editable install) profiles, traces and exported predictors are the
top-level ``profiles/``, ``traces/`` and ``predictors/`` folders; a wheel carries copies as
``wispsim/_profiles``, ``wispsim/_traces`` (and ``wispsim/_predictors`` once it ships any).
The default scenario is package data of ``wispsim`` itself.

Output paths: every command that writes checks its ``--out`` / ``--plot`` / ``--log`` path with
:func:`check_output_dir` or :func:`check_output_file` before any work (a file where a folder is
wanted or the reverse, a read-only folder, less than :data:`MIN_FREE_BYTES` free: one-line
errors naming the option); missing parent folders are created. A results folder is written
and read through :class:`wispsim.results.Results`, its one owner.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from wispsim.errors import ConfigError, WispsimError

PACKAGE_DIR = Path(__file__).resolve().parent
_PKG = PACKAGE_DIR


def _first_existing(*candidates: Path) -> Path:
    for c in candidates:
        if c.is_dir():
            return c
    return candidates[0]


def profiles_dir() -> Path:
    return _first_existing(_PKG.parent / "profiles", _PKG / "_profiles")


def scenarios_dir() -> Path:
    """The shipped scenarios (``scenarios/`` in a checkout, ``wispsim/_scenarios`` in the wheel)."""
    return _first_existing(_PKG.parent / "scenarios", _PKG / "_scenarios")


def traces_dir() -> Path:
    return _first_existing(_PKG.parent / "traces", _PKG / "_traces")


def predictors_dir() -> Path:
    """Exported rejection predictors (``.npz``; see :mod:`wispsim.model.predictor`)."""
    return _first_existing(_PKG.parent / "predictors", _PKG / "_predictors")


def data_dir() -> Path:
    """Package data: the default scenario, architectures, GPU facts."""
    return _PKG / "data"


def default_scenario_path() -> Path:
    return data_dir() / "scenarios" / "default.yaml"


def checkout_dir() -> Path:
    """The folder above the package: the repository root in a source checkout."""
    return _PKG.parent


def resolve_named(name_or_path: str, folder: Path, suffixes: tuple[str, ...]) -> Path | None:
    """A path as given if it exists, else ``folder/name+suffix`` for the first suffix that exists."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    for s in ("", *suffixes):
        q = folder / f"{name_or_path}{s}"
        if q.is_file():
            return q
    return None


# ------------------------------------------------------------------------------------------
# output paths: checked before any work starts, written so a failure leaves nothing complete
# ------------------------------------------------------------------------------------------

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
    if usage.total and free < MIN_FREE_BYTES:  # total 0: /proc and the like; the write will tell
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

"""Where shipped data lives: profiles, traces, predictors and the default scenario.

In a source checkout (or an editable install) profiles, traces and exported predictors are the
top-level ``profiles/``, ``traces/`` and ``predictors/`` folders; a wheel carries copies as
``wispsim/_profiles``, ``wispsim/_traces`` (and ``wispsim/_predictors`` once it ships any).
The default scenario is package data of ``wispsim`` itself.

Where output goes (results folders, ``--out`` / ``--plot`` / ``--log`` files, their checks) is
:mod:`wispsim.results`.
"""

from __future__ import annotations

from pathlib import Path

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

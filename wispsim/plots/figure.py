"""Figure set-up in one place: the headless backend, one DPI, and saving with one-line errors.

Every figure wispsim draws goes through :func:`pyplot` and :func:`save`, so the backend is set
once (Agg: no display needed) and every PNG is written the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wispsim.errors import WispsimError

DPI = 110
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")


def pyplot() -> Any:
    """matplotlib.pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_path(path: Path | str, default_name: str) -> Path:
    """Where a figure goes: ``path`` itself, or ``path/default_name`` when ``path`` is an existing
    folder. Its name must end in one of :data:`FIGURE_SUFFIXES` (checked before anything is drawn).
    """
    out = Path(path)
    if out.is_dir():
        out = out / default_name
    if out.suffix.lower() not in FIGURE_SUFFIXES:
        allowed = ", ".join(FIGURE_SUFFIXES)
        raise WispsimError(
            f"{out}: cannot write a figure there: the name must end in {allowed} "
            f"(or be an existing folder, to write {default_name} in it)"
        )
    return out


def save(fig: Any, path: Path | str, default_name: str) -> Path:
    """Write ``fig`` to :func:`figure_path` and close it; the path written, or a one-line error."""
    plt = pyplot()
    try:
        out = figure_path(path, default_name)
        if out.parent.exists() and not out.parent.is_dir():
            raise WispsimError(f"{out}: cannot write the figure: {out.parent} is a file, not a folder")
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=DPI, format=out.suffix[1:].lower())
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip()
        why = why.splitlines()[0] if why else type(e).__name__
        raise WispsimError(f"{path}: cannot write the figure: {why}") from None
    finally:
        plt.close(fig)
    return out

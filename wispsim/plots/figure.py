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


INTEGER_AXIS_WORDS = ("devices", "replicas", "concurrency", "peak")  # axis labels of counts


def tidy(fig: Any) -> None:
    """What every figure gets before it is written: log axes labelled with plain numbers (``60``,
    not ``6x10^1``), axes that count things (devices, replicas, concurrency) with whole ticks,
    and titles wrapped to fit the figure's width instead of running off its edges."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter

    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    for ax in fig.axes:
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log":
                axis.set_major_formatter(plain)
                axis.set_minor_formatter(NullFormatter())
            elif (
                scale == "linear"
                and any(w in axis.get_label_text().lower() for w in INTEGER_AXIS_WORDS)
                and not isinstance(axis.get_major_locator(), FixedLocator)  # ticks set on purpose
            ):
                axis.set_major_locator(MaxNLocator(integer=True, nbins="auto"))
    _place_legends(fig)
    _fit_titles(fig)


LEGEND_PLACES = (
    "best", "upper right", "lower right", "center right", "upper left", "lower left", "upper center",
    "lower center", "center left", "center",
)  # fmt: skip


def _place_legends(fig: Any) -> None:
    """Move a legend that hides points of a plotted line: to the first place inside its axes
    where it hides none (matplotlib's ``best`` first), else outside its axes on the right (the
    layout then makes room for it, which moves the others: so twice)."""
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    for _ in range(2):
        fig.draw_without_rendering()
        moved = False
        for ax in fig.axes:
            leg = ax.get_legend()
            if leg is None or not _hidden_points(fig, leg):
                continue
            for place in LEGEND_PLACES:
                leg.set_loc(place)  # its box is found anew when asked for: nothing to redraw
                if not _hidden_points(fig, leg):
                    break
            else:
                leg.set_loc("upper left")
                leg.set_bbox_to_anchor((1.02, 1.0), transform=ax.transAxes)
                moved = True
        if not moved:
            return
        if isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine | None):  # not constrained
            fig.tight_layout()


def _hidden_points(fig: Any, legend: Any) -> list[str]:
    """The plotted lines (data lines, not reference lines such as axhline) with a point inside
    ``legend``'s box, as ``label (x, y)``; points outside their axes' view do not count."""
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    hidden = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for line in ax.lines:
            if not line.get_visible() or line.get_transform() is not ax.transData:
                continue
            xy = line.get_xydata()
            if not len(xy):
                continue
            pts = line.get_transform().transform(xy)
            for (x, y), data in zip(pts, xy, strict=True):
                if ax.bbox.contains(x, y) and box.contains(x, y):
                    hidden.append(f"{line.get_label()} ({data[0]:g}, {data[1]:g})")
                    break
    return hidden


def _fit_titles(fig: Any) -> None:
    """Wrap the suptitle and each axes title that is wider than the figure (or its axes)."""
    import textwrap

    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    fig_width = fig.bbox.width
    texts = [(fig._suptitle, fig_width)] if getattr(fig, "_suptitle", None) is not None else []
    texts += [(ax.title, max(ax.bbox.width, fig_width / 2)) for ax in fig.axes if ax.get_title()]
    for text, room in texts:
        for _ in range(4):
            width = text.get_window_extent(renderer).width
            if width <= room * 0.98:
                break
            lines = text.get_text().split("\n")
            chars = max(len(ln) for ln in lines)
            keep = max(12, int(chars * room * 0.95 / width))
            text.set_text("\n".join(textwrap.fill(ln, keep) for ln in lines))
            fig.draw_without_rendering()
    sup = getattr(fig, "_suptitle", None)
    if sup is not None and fig.axes:  # a wrapped suptitle grows down: keep it off the axes
        box = sup.get_window_extent(renderer)
        tops = [ax.get_tightbbox(renderer).y1 for ax in fig.axes if ax.get_visible()]
        if tops and max(tops) > box.y0:
            shift = (max(tops) - box.y0 + 6) / fig.bbox.height
            fig.subplots_adjust(top=max(0.4, fig.subplotpars.top - shift))
            fig.draw_without_rendering()


def figure_problems(fig: Any) -> list[str]:
    """What a reader would trip over in ``fig`` as drawn: a title wider than the figure,
    fractional ticks on an axis that counts things, and a legend that hides points of a plotted
    line (the checks :func:`tidy` is there to pass)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    titles = [fig._suptitle] if getattr(fig, "_suptitle", None) is not None else []
    titles += [ax.title for ax in fig.axes if ax.get_title()]
    for t in titles:
        box = t.get_window_extent(renderer)
        if box.x0 < -1 or box.x1 > fig.bbox.width + 1:
            problems.append(f"title {t.get_text()[:40]!r} runs off the figure")
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "linear" and any(
                w in axis.get_label_text().lower() for w in INTEGER_AXIS_WORDS
            ):
                lo, hi = sorted(axis.get_view_interval())
                bad = [v for v in axis.get_ticklocs() if lo <= v <= hi and abs(v - round(v)) > 1e-9]
                if bad:
                    problems.append(f"{axis.get_label_text()!r} has fractional ticks {bad[:3]}")
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    for leg in legends:
        hidden = _hidden_points(fig, leg)
        if hidden:
            problems.append(f"the legend hides points of {', '.join(hidden[:3])}")
    return problems


def save(fig: Any, path: Path | str, default_name: str) -> Path:
    """Write ``fig`` to :func:`figure_path` and close it; the path written, or a one-line error."""
    plt = pyplot()
    try:
        tidy(fig)
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

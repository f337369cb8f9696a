"""The validation figure: violation rate against N, real and simulated, per policy and regime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.errors import WispsimError
from wispsim.plots.figure import pyplot, save

NEEDED = ("regime", "policy", "devices", "metric", "real", "sim")


def validation_figure(table: pd.DataFrame, interval: str = "95% Wilson", sim_label: str = "simulated") -> Any:
    """One panel per (regime, policy): the real violation rate with its interval (``interval``
    names it), and the simulated one (``sim``, labelled ``sim_label``), against N. Besides ``sim``,
    every column ``sim:LABEL`` is another simulated side over the same real points (e.g. re-priced
    with a fitted profile)."""
    missing = [c for c in NEEDED if c not in table.columns]
    if missing:
        raise WispsimError(f"validation table: missing columns {', '.join(missing)}")
    plt = pyplot()
    sides = ["sim", *(c for c in table.columns if str(c).startswith("sim:"))]
    wide = table.pivot_table(index=["regime", "policy", "devices"], columns="metric", values=["real", *sides])
    regimes = list(dict.fromkeys(table.regime))
    policies = list(dict.fromkeys(table.policy))
    fig, axes = plt.subplots(
        len(regimes),
        len(policies),
        figsize=(3.2 * len(policies), 2.8 * len(regimes)),
        squeeze=False,
        sharey=True,
    )
    styles = ("s--", "d-.", "^:", "v--", "x-.")
    for i, regime in enumerate(regimes):
        for j, policy in enumerate(policies):
            ax = axes[i][j]
            try:
                g = wide.loc[(regime, policy)]
            except KeyError:
                ax.set_visible(False)
                continue
            n = g.index.to_numpy()
            real = g[("real", "violation_rate")].to_numpy()
            lo = g[("real", "violation_lo")].to_numpy()
            hi = g[("real", "violation_hi")].to_numpy()
            ax.fill_between(n, lo, hi, color="tab:blue", alpha=0.15, label=f"real, {interval}")
            ax.plot(n, real, "o-", color="tab:blue", label="real (vLLM)")
            for k, side in enumerate(sides):
                if (side, "violation_rate") not in g.columns:  # a side with no value anywhere
                    continue
                label = sim_label if side == "sim" else f"simulated, {side[4:]}"
                color = "tab:orange" if k == 0 else f"C{k + 1}"
                ax.plot(
                    n,
                    g[(side, "violation_rate")].to_numpy(),
                    styles[k % len(styles)],
                    color=color,
                    label=label,
                )
            ax.set_title(f"{policy} ({regime})", fontsize=9)
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("devices N")
            if j == 0:
                ax.set_ylabel("violation rate")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Violation rate against devices N: real (vLLM) and simulated", fontsize=10)
    fig.tight_layout()
    return fig


def validation_plot(table: pd.DataFrame, path: Path | str, **labels: str) -> Path:
    """Write :func:`validation_figure` to ``path`` (default name ``validation.png``); ``labels``:
    its ``interval`` and ``sim_label``."""
    return save(validation_figure(table, **labels), path, "validation.png")

"""The validation figure: violation rate against N, real and simulated, per policy and regime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.errors import WispsimError
from wispsim.plots.figure import pyplot, save

NEEDED = ("regime", "policy", "devices", "metric", "real", "sim")


def validation_figure(table: pd.DataFrame) -> Any:
    """One panel per (regime, policy): the real violation rate with its Wilson interval, and the
    simulated one, against N."""
    missing = [c for c in NEEDED if c not in table.columns]
    if missing:
        raise WispsimError(f"validation table: missing columns {', '.join(missing)}")
    plt = pyplot()
    wide = table.pivot_table(index=["regime", "policy", "devices"], columns="metric", values=["real", "sim"])
    regimes = list(dict.fromkeys(table.regime))
    policies = list(dict.fromkeys(table.policy))
    fig, axes = plt.subplots(
        len(regimes),
        len(policies),
        figsize=(3.2 * len(policies), 2.8 * len(regimes)),
        squeeze=False,
        sharey=True,
    )
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
            ax.fill_between(n, lo, hi, color="tab:blue", alpha=0.15, label="real, 95% Wilson")
            ax.plot(n, real, "o-", color="tab:blue", label="real (vLLM)")
            ax.plot(n, g[("sim", "violation_rate")].to_numpy(), "s--", color="tab:orange", label="simulated")
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


def validation_plot(table: pd.DataFrame, path: Path | str) -> Path:
    """Write :func:`validation_figure` to ``path`` (default name ``validation.png``)."""
    return save(validation_figure(table), path, "validation.png")

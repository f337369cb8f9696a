"""What the scripts that add public runs share: writing their rows into runs.csv."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

DIR = Path(__file__).resolve().parents[2] / "experiments" / "data" / "public"


def add_runs(rows: list[dict[str, object]], what: str) -> None:
    """Put ``rows`` into runs.csv: a rerun replaces its rows (by run_id), never duplicates them;
    a column the file lacks is added after its own (empty for the other rows)."""
    path = DIR / "runs.csv"
    runs = pd.read_csv(path)
    new = pd.DataFrame(rows)
    runs = runs[~runs.run_id.isin(new.run_id)]
    columns = [*runs.columns, *(c for c in new.columns if c not in runs.columns)]
    pd.concat([runs, new], ignore_index=True)[columns].to_csv(path, index=False)
    print(f"{path}: {len(new)} {what} added ({len(runs) + len(new)} in all)")

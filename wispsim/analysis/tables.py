"""Result-folder tables: reading and checking the CSVs that sweeps, compares and runs write."""

from __future__ import annotations

import pandas as pd


def saturated_mask(cap: pd.DataFrame) -> pd.Series:
    """Per row of a capacity table: did the search stop at its ceiling (capacity a lower bound)?

    Accepts the column as bools (a table in memory) or as text (read back from any CSV)."""
    if "saturated" not in cap:
        return pd.Series(False, index=cap.index)
    return cap["saturated"].astype(str).str.strip().str.lower().eq("true")

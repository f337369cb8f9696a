"""How figures name and order SLO classes.

Result tables spell one class several ways ("4", "4.0", "mix:4.0,8"); the figures of capacity
sweeps and of bursty runs normalise them the same way, order them numerically and label them in
words, so a class reads alike in every figure.
"""

from __future__ import annotations

import math
from typing import Any

from wispsim.analysis.metrics import class_label


def norm_class(c: Any) -> str:
    """A class label as the simulator writes it: "4.0" -> "4", "mix:4.0,8" -> "mix:4,8", "all"."""
    s = str(c).strip()
    if s == "all":
        return s
    if s.startswith("mix:"):
        return "mix:" + ",".join(norm_class(x) for x in s[4:].split(","))
    try:
        return class_label(float(s))
    except ValueError:
        return s


def class_title(c: str) -> str:
    """A class in words: "4 tok/s"; "all" and mixes as they are."""
    return c if c == "all" or c.startswith("mix") else f"{c} tok/s"


def class_key(c: str) -> tuple[int, float, str]:
    """Sort key: numeric classes by their rate, then the others ("all", mixes) by name."""
    try:
        return (0, float(c), c)
    except ValueError:
        return (1, math.inf, c)

"""One-line errors for the nested fields of a study's spec (lists of mappings, numbers, names),
checked before any simulation runs; :mod:`.spec` checks the top-level fields every study shares."""

from __future__ import annotations

from typing import Any

from wispsim.errors import ConfigError


def numbers(src: str, field: str, value: Any, integer: bool = False) -> list[float]:
    """A non-empty list of positive numbers (integers where ``integer``)."""
    kind = "positive integers" if integer else "positive numbers"
    if not isinstance(value, list) or not value:
        raise ConfigError(src, field, f"must be a non-empty list of {kind}, got {value!r}")
    for x in value:
        ok = isinstance(x, int) if integer else isinstance(x, int | float)
        if isinstance(x, bool) or not ok or not x > 0:
            raise ConfigError(src, field, f"must be a list of {kind}, got {x!r}")
    return [float(x) for x in value]


def mapping(src: str, field: str, value: Any) -> dict[str, Any]:
    """A mapping (None: empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(src, field, f"must be a mapping, got {value!r}")
    return value


def entries(src: str, field: str, value: Any, needs: set[str]) -> list[dict[str, Any]]:
    """A non-empty list of mappings, each with the keys ``needs`` and a name no other has."""
    if not isinstance(value, list) or not value:
        raise ConfigError(
            src, field, f"must be a non-empty list of {{{', '.join(sorted(needs))}}}, got {value!r}"
        )
    seen: set[str] = set()
    for i, e in enumerate(value):
        if not isinstance(e, dict) or not needs <= set(e):
            raise ConfigError(src, f"{field}[{i}]", f"needs {', '.join(sorted(needs))}")
        name = str(e.get("name", i))
        if name in seen:
            raise ConfigError(src, f"{field}[{i}]", f"two entries are named {name!r}")
        seen.add(name)
    return value

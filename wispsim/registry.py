"""Named registries for the simulator's plug-ins.

Schedulers, drafting controllers, acceptance models, latency models and predictors are chosen by
name in the scenario. A registry maps those names to factories; an unknown or duplicate name is an
error that lists the known names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from wispsim.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from plug-in names to factories of one kind (``kind`` names it in errors)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register ``obj`` under ``name``."""

        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str, source: str = "scenario", field: str = "") -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items))
            # an option (``--router``) is its own field; a file names the field that was wrong
            where = field or ("" if source.startswith("--") else self.kind)
            raise ConfigError(source, where, f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

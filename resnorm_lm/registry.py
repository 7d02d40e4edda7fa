"""Name -> class registries: how norms, placements and corpora are chosen.

Config files hold names (strings), never classes, so they stay serializable;
adding a variant is one class and one decorator line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of classes with an error that lists the valid names."""

    def __init__(self, kind: str, plural: str | None = None) -> None:
        self.kind = kind  # what the entries are, for messages: "norm", "placement"
        self.plural = plural or f"{kind}s"
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; valid {self.plural}: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

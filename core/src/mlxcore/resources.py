"""What plugins load once per model and their strategies share: :class:`ModelResources`.

A plugin whose strategy needs something heavy (a draft model, a prediction head) loads
it in ``mlxcore_model_resources``, which runs once when the model loads. The answers are
kept with the model (:attr:`mlxcore.runtime.Runtime.resources`) and handed to the
strategy hooks as ``resources``; those hooks run again at every engine restart and after
a failed decode step, so they only build cheap objects around what was loaded.
Resources are found by their type: a plugin asks for its own class.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from mlxcore.errors import UsageError

T = TypeVar("T")


class ModelResources:
    """The resources the plugins loaded for one model, one per type."""

    def __init__(self, answers: Iterable[tuple[str, Any]] = ()) -> None:
        """``answers``: ``(plugin, resource)`` pairs; two of one type are refused."""
        self._items: dict[type, tuple[str, Any]] = {}
        for plugin, item in answers:
            kind = type(item)
            if kind in self._items:
                other = self._items[kind][0]
                raise UsageError(
                    f"plugins {other!r} and {plugin!r} both loaded a {kind.__qualname__} "
                    "resource for this model"
                )
            self._items[kind] = (plugin, item)

    def get(self, kind: type[T]) -> T | None:
        """The resource of type ``kind`` (its plugin's own class), or ``None``."""
        found = self._items.get(kind)
        return None if found is None else found[1]

    def __iter__(self) -> Iterator[Any]:
        return (item for _, item in self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def owners(self) -> dict[str, str]:
        """Which plugin loaded each resource (type name -> plugin), for logs and tests."""
        return {kind.__qualname__: plugin for kind, (plugin, _) in self._items.items()}

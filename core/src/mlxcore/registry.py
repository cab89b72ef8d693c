"""Named registries that refuse duplicates.

Parsers and strategies are selected by name (``--tool-call-parser hermes``).
When two plugins offer the same name, silently keeping one would make the
choice depend on load order, so a :class:`Registry` raises instead and names
both contenders.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

import attrs

from mlxcore.errors import DuplicateNameError

T = TypeVar("T")


@attrs.frozen
class Entry(Generic[T]):
    """One registered item: the object, its name and the plugin that offered it."""

    name: str
    item: T
    plugin: str

    def describe(self) -> str:
        """A short ``name (module.Qualname from plugin X)`` text for messages."""
        obj = self.item
        qual = getattr(obj, "__qualname__", None) or type(obj).__qualname__
        module = getattr(obj, "__module__", None) or type(obj).__module__
        return f"{module}.{qual} from plugin {self.plugin!r}"


class Registry(Generic[T]):
    """An ordered name -> item mapping that refuses a second item under one name.

    Order is registration order; the engine uses it as priority (first = preferred).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, item: T, *, plugin: str) -> None:
        """Add ``item`` under ``name``; raise :class:`DuplicateNameError` if taken."""
        if not isinstance(name, str) or not name:
            raise DuplicateNameError(
                f"{self.kind} {item!r} from plugin {plugin!r} has no name (set a `name` attribute)"
            )
        new = Entry(name=name, item=item, plugin=plugin)
        old = self._entries.get(name)
        if old is not None:
            raise DuplicateNameError(
                f"{self.kind} name {name!r} is registered twice: by {old.describe()} "
                f"and by {new.describe()}; rename one or disable a plugin with --no-plugin"
            )
        self._entries[name] = new

    def get(self, name: str) -> T:
        """The item registered under ``name``; ``KeyError`` lists the known names."""
        try:
            return self._entries[name].item
        except KeyError:
            known = ", ".join(self._entries) or "none"
            raise KeyError(f"no {self.kind} named {name!r} (known: {known})") from None

    def plugin_of(self, name: str) -> str:
        """The plugin that offered ``name`` (for messages and ``mlxcore plugins``)."""
        return self._entries[name].plugin

    def names(self) -> list[str]:
        """Registered names, in priority order."""
        return list(self._entries)

    def items(self) -> list[T]:
        """Registered items, in priority order."""
        return [e.item for e in self._entries.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

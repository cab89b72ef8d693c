"""Exceptions shared across mlxcore.

Every error a user can cause has a message that names what was wrong (a plugin,
a path, a request field), so the CLI and the HTTP layer can show it as is.
"""

from __future__ import annotations


class MlxcoreError(Exception):
    """Base class of mlxcore's own errors."""


class UsageError(MlxcoreError):
    """The user asked for something that cannot be done (bad flag, unknown name)."""


class PluginError(MlxcoreError):
    """A plugin failed to load, to validate, or raised inside one of its hooks.

    Attributes:
        plugin: the plugin's name (entry-point name or module path).
        hook: the hook being called, when the error happened inside one.
    """

    def __init__(self, plugin: str, message: str, *, hook: str | None = None) -> None:
        self.plugin = plugin
        self.hook = hook
        where = f" in hook {hook}" if hook else ""
        super().__init__(f"plugin {plugin!r}{where}: {message}")


class DuplicateNameError(MlxcoreError):
    """Two registrations claimed the same name in one registry."""

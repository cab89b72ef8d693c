"""Exceptions shared across mlxcore.

Every error a user can cause has a message that names what was wrong (a plugin,
a path, a request field), so the CLI and the HTTP layer can show it as is.
"""

from __future__ import annotations


class MlxcoreError(Exception):
    """Base class of mlxcore's own errors."""


class RequestFault(MlxcoreError):
    """A request failed during generation because of what it asked for, not a server fault
    (a constraint the model's tokenizer cannot follow). Its message is safe to show the
    client; front ends answer it with a 400 (an error event once a stream has begun).

    Attributes:
        code: the API error code, e.g. ``unsatisfiable_constraint``.
    """

    code: str = "request_fault"


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


class OptionError(MlxcoreError, ValueError):
    """A per-request option a plugin reads has a bad value (``mlxcore_validate_options``).

    Attributes:
        field: the option's path in the request body, e.g. ``"specprefill.keep"``.
        message: what is wrong with it.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(field, message)

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class ModelLoadError(MlxcoreError):
    """A model could not be found, converted or loaded; the message names the path or repo."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MediaError(MlxcoreError):
    """An image or video part of a request cannot be used (a
    :class:`mlxcore.media.MediaHandler` raises it; the front end answers 400).

    Attributes:
        message: what is wrong with the part.
        field: the part's path in the request, e.g. ``"messages[0].content[1]"``.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        self.message = message
        self.field = field
        super().__init__(message)

"""Hook calls through pluggy, with every answer and every failure tied to its plugin.

mlxcore calls hooks the way every pluggy project does: ``pm.hook.NAME(**kwargs)``.
That keeps pluggy's own rules in force (``firstresult`` specs, ``tryfirst`` /
``trylast``, ``wrapper=True`` implementations, ``pm.trace`` and
``add_hookcall_monitoring``). What pluggy does not keep is *who* answered: its
result is a bare list, and an exception arrives without the plugin's name.

So what mlxcore registers with pluggy for a plugin is :func:`attributed_plugin`: an
object whose hook functions are the plugin's own, each wrapped once before pluggy sees
it (nothing of pluggy's is written to, nothing of the plugin's changed), and whose other
attributes are read from the plugin. The wrapper turns an unexpected exception into a
:class:`PluginError` naming the plugin and the hook, and records ``(plugin, result)`` in
the collector of the current :func:`call_hook`. Errors of mlxcore's own types (a
``UsageError``, an ``OptionError``, a ``ModelLoadError``) already say what is wrong and
pass through.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Generator
from typing import Any

import attrs
import pluggy

from mlxcore.errors import MlxcoreError, PluginError

_answers: contextvars.ContextVar[list[tuple[str, Any]] | None] = contextvars.ContextVar(
    "mlxcore_hook_answers", default=None
)
WRAPPER_NAME = "a hook wrapper"
"""Attribution of a result that no plain implementation returned (a wrapper made it)."""


@attrs.frozen
class HookAnswers:
    """What one hook call returned, each result with the plugin that returned it."""

    results: list[tuple[str, Any]]

    def values(self) -> list[Any]:
        """The results alone, in pluggy's call order."""
        return [value for _, value in self.results]


def _failure(plugin: str, hook: str, exc: Exception) -> Exception:
    if isinstance(exc, MlxcoreError):
        return exc
    return PluginError(plugin, f"{type(exc).__name__}: {exc}", hook=hook)


def _plain(function: Callable[..., Any], plugin: str, hook: str) -> Callable[..., Any]:
    def attributed(*args: Any, **kwargs: Any) -> Any:
        try:
            result = function(*args, **kwargs)
        except Exception as exc:
            failure = _failure(plugin, hook, exc)
            if failure is exc:
                raise
            raise failure from exc
        answers = _answers.get()
        if answers is not None and result is not None:
            answers.append((plugin, result))
        return result

    return attributed


def _wrapper(function: Callable[..., Any], plugin: str, hook: str) -> Callable[..., Any]:
    def attributed(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        inner = function(*args, **kwargs)
        try:
            return (yield from inner)
        except Exception as exc:
            failure = _failure(plugin, hook, exc)
            if failure is exc:
                raise
            raise failure from exc

    return attributed


class AttributedPlugin:
    """A plugin as pluggy sees it: its hook implementations, wrapped for attribution, in
    this object's own attributes; any other attribute is the plugin's."""

    def __init__(self, plugin: object, hooks: dict[str, Callable[..., Any]]) -> None:
        object.__setattr__(self, "_mlxcore_plugin", plugin)
        for name, function in hooks.items():
            object.__setattr__(self, name, function)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_mlxcore_plugin"), name)

    def __dir__(self) -> list[str]:
        return sorted(set(object.__dir__(self)) | set(dir(self._mlxcore_plugin)))

    def __repr__(self) -> str:
        return f"<attributed {self._mlxcore_plugin!r}>"


def attributed_plugin(pm: pluggy.PluginManager, plugin: object, name: str) -> AttributedPlugin:
    """What to register for ``plugin`` under ``name``: each of its hook implementations
    (the functions ``pm.parse_hookimpl_opts`` accepts) wrapped for attribution, with the
    same options, signature and name. New-style wrappers (``wrapper=True``) get a
    generator that forwards pluggy's ``send``/``throw``; old-style ``hookwrapper=True``
    ones are kept as written."""
    hooks: dict[str, Callable[..., Any]] = {}
    marker = f"{pm.project_name}_impl"
    for attr in dir(plugin):
        opts = pm.parse_hookimpl_opts(plugin, attr)
        if opts is None:
            continue
        function = getattr(plugin, attr)
        if opts.get("hookwrapper"):
            wrapped = function
        else:
            make = _wrapper if opts.get("wrapper") else _plain
            wrapped = functools.update_wrapper(
                make(function, name, opts.get("specname") or attr), function
            )
        setattr(wrapped, marker, dict(opts))
        hooks[attr] = wrapped
    return AttributedPlugin(plugin, hooks)


def call_hook(pm: pluggy.PluginManager, name: str, **kwargs: Any) -> HookAnswers:
    """Call hook ``name`` through pluggy; its non-``None`` results with their plugins.

    A ``firstresult`` hook yields at most one answer. A result that a wrapper
    replaced is attributed to :data:`WRAPPER_NAME`.
    """
    caller: pluggy.HookCaller = getattr(pm.hook, name)
    collected: list[tuple[str, Any]] = []
    token = _answers.set(collected)
    try:
        returned = caller(**kwargs)
    except MlxcoreError:
        raise
    except Exception as exc:  # an old-style hookwrapper, or pluggy itself
        raise PluginError(WRAPPER_NAME, f"{type(exc).__name__}: {exc}", hook=name) from exc
    finally:
        _answers.reset(token)
    firstresult = bool(caller.spec and caller.spec.opts.get("firstresult"))
    values = ([] if returned is None else [returned]) if firstresult else list(returned)
    return HookAnswers(_owned(values, collected))


def _owned(values: list[Any], collected: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Each value pluggy returned with the plugin whose implementation returned that very
    object (each answer claimed once), or :data:`WRAPPER_NAME` for one a wrapper made."""
    unclaimed = list(collected)
    owned = []
    for value in values:
        found = next((i for i, (_, mine) in enumerate(unclaimed) if mine is value), None)
        owned.append((WRAPPER_NAME, value) if found is None else unclaimed.pop(found))
    return owned

"""Hook calls through pluggy, with every answer and every failure tied to its plugin.

mlxcore calls hooks the way every pluggy project does: ``pm.hook.NAME(**kwargs)``.
That keeps pluggy's own rules in force (``firstresult`` specs, ``tryfirst`` /
``trylast``, ``wrapper=True`` implementations, ``pm.trace`` and
``add_hookcall_monitoring``). What pluggy does not keep is *who* answered: its
result is a bare list, and an exception arrives without the plugin's name.

So, when a plugin is registered, :func:`attribute_implementations` wraps each of
its implementations once (that implementation only, no pluggy class is touched):
the wrapper turns an unexpected exception into a :class:`PluginError` naming the
plugin and the hook, and records ``(plugin, result)`` in the collector of the
current :func:`call_hook`. Errors of mlxcore's own types (a ``UsageError``, an
``OptionError``, a ``ModelLoadError``) already say what is wrong and pass through.
"""

from __future__ import annotations

import contextvars
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


def attribute_implementations(pm: pluggy.PluginManager, plugin: object) -> None:
    """Wrap each hook implementation of ``plugin`` (just registered) for attribution.

    New-style wrappers (``wrapper=True``) get a generator that forwards pluggy's
    ``send``/``throw``; old-style ``hookwrapper=True`` ones are left as written.
    """
    for caller in pm.get_hookcallers(plugin) or []:
        for impl in caller.get_hookimpls():
            if impl.plugin is not plugin or impl.hookwrapper:
                continue
            make = _wrapper if impl.wrapper else _plain
            # HookImpl.function is declared Final for type checkers only; replacing it on
            # this one instance is how its calls are attributed without copying pluggy.
            impl.function = make(impl.function, impl.plugin_name, caller.name)  # type: ignore[misc]


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
    owners = {id(value): plugin for plugin, value in collected}
    return HookAnswers([(owners.get(id(value), WRAPPER_NAME), value) for value in values])

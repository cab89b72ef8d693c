"""Finding, choosing and registering plugins.

A plugin is a module. Installed plugins are entry points in the ``mlxcore`` group
(``[project.entry-points.mlxcore] name = "module"``); local ones are named by a
dotted module path. Built-in defaults are modules too, registered first, exactly
like pytest's built-ins.

Which plugins run (:class:`PluginSelection`):

* built-ins always, unless blocked with ``--no-plugin``;
* installed plugins autoload, except those that declare ``MLXCORE_AUTOLOAD = False``
  in their module (speed features that must be asked for, such as ``specprefill``);
* ``--plugin NAME`` enables one by entry-point name (or dotted module path);
* ``--no-plugin NAME`` blocks one; ``MLXCORE_PLUGINS=a,b`` restricts autoload to
  the listed names; ``MLXCORE_DISABLE_PLUGIN_AUTOLOAD=1`` (or
  ``--disable-plugin-autoload``) turns autoload off.

Nothing here runs at import time: :func:`create_plugin_manager` builds a fresh
manager each call, so tests and embedders never share state.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as md
import importlib.util
import os
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

import attrs
import pluggy

from mlxcore import PROJECT_NAME, hookspecs
from mlxcore.errors import PluginError, UsageError
from mlxcore.hookcalls import attributed_plugin

BUILTIN_PLUGINS: tuple[str, ...] = (
    "mlxcore.builtin.strategies",
    "mlxcore.builtin.parsers",
    "mlxcore.builtin.openai",
    "mlxcore.builtin.structured",
    "mlxcore.builtin.thinking",
    "mlxcore.builtin.speculative",
)
"""Module paths of the built-in plugins, registered before any other."""

ENV_ALLOW = "MLXCORE_PLUGINS"
ENV_DISABLE_AUTOLOAD = "MLXCORE_DISABLE_PLUGIN_AUTOLOAD"
HOOK_PREFIX = "mlxcore_"


class MlxcorePluginManager(pluggy.PluginManager):
    """A pluggy manager that also accepts unmarked ``mlxcore_*`` functions.

    Accepting them (as pytest does for ``pytest_*``) means a hook whose
    ``@hookimpl`` was forgotten still runs, and a misspelt one is caught by
    ``check_pending`` instead of being silently ignored. Hooks are called through
    ``pm.hook`` with pluggy's own rules; registration only adds attribution.
    """

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        """Register as pluggy does, with each implementation's answers and failures tied
        to this plugin (:func:`mlxcore.hookcalls.attributed_plugin`): pluggy is given
        the plugin with its hook functions wrapped. Registering an already registered
        plugin object again is refused, as pluggy does."""
        if plugin is None:
            return None
        name = name or self.get_canonical_name(plugin)
        if any(getattr(p, "_mlxcore_plugin", p) is plugin for p in self.get_plugins()):
            raise ValueError(f"Plugin already registered under a different name: {name}")
        return super().register(attributed_plugin(self, plugin, name), name)

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith(HOOK_PREFIX):
            method = getattr(plugin, name, None)
            if callable(method) and not isinstance(method, type):
                return {}
        return opts


def create_plugin_manager() -> MlxcorePluginManager:
    """A fresh plugin manager with mlxcore's hook specifications and no plugins."""
    pm = MlxcorePluginManager(PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


@attrs.frozen
class PluginSelection:
    """Which plugins to enable, from the command line and the environment."""

    enable: tuple[str, ...] = ()
    block: tuple[str, ...] = ()
    autoload: bool = True
    allow: tuple[str, ...] | None = None

    @classmethod
    def from_env(
        cls,
        enable: Iterable[str] = (),
        block: Iterable[str] = (),
        *,
        disable_autoload: bool = False,
        environ: Mapping[str, str] | None = None,
    ) -> PluginSelection:
        """Combine CLI choices with ``MLXCORE_PLUGINS`` and ``MLXCORE_DISABLE_PLUGIN_AUTOLOAD``."""
        env = os.environ if environ is None else environ
        allow_text = env.get(ENV_ALLOW)
        allow = None
        if allow_text is not None:
            allow = tuple(n.strip() for n in allow_text.split(",") if n.strip())
        off = env.get(ENV_DISABLE_AUTOLOAD, "").strip().lower() in {"1", "true", "yes", "on"}
        return cls(
            enable=tuple(enable),
            block=tuple(block),
            autoload=not (disable_autoload or off),
            allow=allow,
        )


@attrs.frozen
class InstalledPlugin:
    """An entry point in the ``mlxcore`` group."""

    name: str
    module: str
    distribution: str
    version: str


@attrs.frozen
class PluginStatus:
    """One row of ``mlxcore plugins``."""

    name: str
    distribution: str
    version: str
    hooks: tuple[str, ...]
    status: str


def installed_plugins() -> dict[str, InstalledPlugin]:
    """Every installed entry point of the ``mlxcore`` group, by name."""
    found: dict[str, InstalledPlugin] = {}
    for ep in md.entry_points(group=PROJECT_NAME):
        dist = ep.dist
        found[ep.name] = InstalledPlugin(
            name=ep.name,
            module=ep.value.split(":")[0],
            distribution=dist.name if dist is not None else "?",
            version=dist.version if dist is not None else "?",
        )
    return found


def command_providers() -> dict[str, str]:
    """Subcommand name -> installed plugin that declares it in ``MLXCORE_COMMANDS``."""
    found: dict[str, str] = {}
    for name, plugin in installed_plugins().items():
        try:
            module = importlib.import_module(plugin.module)
        except Exception:
            continue  # reported when (if) the plugin is actually loaded
        for command in getattr(module, "MLXCORE_COMMANDS", ()):
            found.setdefault(str(command), name)
    return found


def _import_plugin(name: str, module_path: str) -> ModuleType:
    try:
        return importlib.import_module(module_path)
    except Exception as exc:
        raise PluginError(name, f"failed to import {module_path!r}: {exc!r}") from exc


def _register(pm: pluggy.PluginManager, name: str, module: ModuleType) -> None:
    try:
        pm.register(module, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(name, str(exc)) from exc
    except ValueError as exc:  # already registered
        raise PluginError(name, str(exc)) from exc


def _hook_names(pm: pluggy.PluginManager, plugin: object) -> tuple[str, ...]:
    callers = pm.get_hookcallers(plugin) or []
    return tuple(sorted(c.name for c in callers))


def _check_pending(pm: pluggy.PluginManager) -> None:
    """Fail loudly, naming the plugin, for an implementation of an unknown hook."""
    known = [
        name
        for name in dir(pm.hook)
        if isinstance(getattr(pm.hook, name), pluggy.HookCaller)
        and getattr(pm.hook, name).spec is not None
    ]
    for name in dir(pm.hook):
        caller = getattr(pm.hook, name)
        if not isinstance(caller, pluggy.HookCaller) or caller.spec is not None:
            continue
        for impl in caller.get_hookimpls():
            if impl.optionalhook:
                continue
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PluginError(impl.plugin_name, f"implements unknown hook {name!r}{hint}")
    pm.check_pending()


def load_plugins(
    pm: pluggy.PluginManager,
    selection: PluginSelection,
    *,
    builtins: Iterable[str] = BUILTIN_PLUGINS,
) -> list[str]:
    """Register built-ins, then the selected installed and local plugins.

    Returns the names of the registered plugins in registration order. Raises
    :class:`UsageError` for an unknown ``--plugin`` name (listing the installed
    ones) and :class:`PluginError` naming the plugin for import or validation
    failures, or an implementation of a hook that does not exist.
    """
    blocked = set(selection.block)
    for name in blocked:
        pm.set_blocked(name)
    installed = installed_plugins()
    loaded: list[str] = []

    for path in builtins:
        if path in blocked:
            continue
        _register(pm, path, _import_plugin(path, path))
        loaded.append(path)

    chosen: dict[str, str] = {}
    if selection.autoload:
        for name, plugin in installed.items():
            if name in blocked or (selection.allow is not None and name not in selection.allow):
                continue
            module = _import_plugin(name, plugin.module)
            if getattr(module, "MLXCORE_AUTOLOAD", True) or name in selection.enable:
                chosen[name] = plugin.module
    for name in selection.enable:
        if name in blocked:
            raise UsageError(
                f"plugin {name!r} is both enabled (--plugin) and blocked (--no-plugin)"
            )
        if name in installed:
            chosen[name] = installed[name].module
        elif "." in name or _module_exists(name):
            chosen[name] = name
        else:
            names = ", ".join(sorted(installed)) or "none"
            raise UsageError(
                f"unknown plugin {name!r}: no installed plugin has that name and it is not an "
                f"importable module (installed plugins: {names})"
            )
    for name, module_path in chosen.items():
        if pm.has_plugin(name):
            continue
        _register(pm, name, _import_plugin(name, module_path))
        loaded.append(name)
    _check_pending(pm)
    return loaded


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def plugin_statuses(pm: pluggy.PluginManager) -> list[PluginStatus]:
    """What ``mlxcore plugins`` prints: installed plugins and built-ins, with status."""
    rows: list[PluginStatus] = []
    import mlxcore

    for name in BUILTIN_PLUGINS:
        plugin = pm.get_plugin(name)
        status = "enabled (built-in)" if plugin is not None else "blocked"
        hooks = _hook_names(pm, plugin) if plugin is not None else ()
        rows.append(PluginStatus(name, "mlxcore", mlxcore.__version__, hooks, status))
    for name, inst in sorted(installed_plugins().items()):
        plugin = pm.get_plugin(name)
        if plugin is not None:
            status, hooks = "enabled", _hook_names(pm, plugin)
        else:
            status = "blocked" if pm.is_blocked(name) else "installed (enable with --plugin)"
            hooks = _module_hooks(inst.module)
        rows.append(PluginStatus(name, inst.distribution, inst.version, hooks, status))
    for name, plugin in pm.list_name_plugin():
        if plugin is None or name in BUILTIN_PLUGINS or any(r.name == name for r in rows):
            continue
        rows.append(PluginStatus(name, "(local module)", "-", _hook_names(pm, plugin), "enabled"))
    return rows


def _module_hooks(module_path: str) -> tuple[str, ...]:
    try:
        module = importlib.import_module(module_path)
    except Exception:
        return ("<import failed>",)
    return tuple(sorted(n for n in dir(module) if n.startswith(HOOK_PREFIX)))

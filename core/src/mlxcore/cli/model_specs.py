"""From the command line to the models a server serves (:class:`ModelSpec` each).

``mlxcore serve MODEL`` serves one model, with the server's plugins and flags, exactly
as before. With ``--model`` or ``--models-config`` there are several: each gets its own
plugin manager (the server's plugins plus its own ``plugins``) and its own
configuration (the server's flags, then its own flags from the models file, parsed by
the same argparse definitions, so a per-model value is checked as the flag would be).
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence
from typing import Any

import attrs

from mlxcore.cli import options
from mlxcore.config import ServerConfig
from mlxcore.errors import UsageError
from mlxcore.hooks import PluginHooks
from mlxcore.models.catalog import Catalog, CatalogEntry, ModelSpec, parse_model_arg, read_catalog
from mlxcore.models.default import DEFAULT_MODEL_NAME
from mlxcore.models.names import model_name
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.settings import byte_size


@attrs.frozen
class ServedModels:
    """What ``mlxcore serve`` serves: the models (the first is the default) and the
    settings of the router that shares memory among them."""

    specs: tuple[ModelSpec, ...]
    memory_budget: int | None
    idle_unload: float


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting (a per-model flag error names the model)."""

    def error(self, message: str) -> Any:
        raise UsageError(message)


def served_models(
    config: ServerConfig,
    hooks: PluginHooks,
    args: argparse.Namespace,
    core_dests: set[str],
    selection: PluginSelection,
) -> ServedModels:
    """The models ``config`` asks for, each configured (plugins' ``mlxcore_configure``
    run per model, so a bad per-model option stops start-up with its message)."""
    catalog = read_catalog(config.models_config) if config.models_config else Catalog(())
    extra = [parse_model_arg(text) for text in config.extra_models] + list(catalog.entries)
    entries: list[CatalogEntry] = []
    if config.model is not None or not extra:
        entries.append(_default_entry(config))
    entries += extra
    _check_names(entries)
    budget: int | None = config.models_memory_budget
    if budget is None and catalog.memory_budget is not None:
        try:
            budget = byte_size(str(catalog.memory_budget))
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"--models-config: memory_budget: {exc}") from None
    idle = config.idle_unload or catalog.idle_unload or 0.0
    if len(entries) == 1 and not entries[0].flags and not entries[0].plugins:
        return ServedModels((ModelSpec(entries[0], config, hooks),), budget, idle)
    specs = tuple(_configure(entry, config, args, core_dests, selection) for entry in entries)
    return ServedModels(specs, budget, idle)


def _default_entry(config: ServerConfig) -> CatalogEntry:
    """The positional model (or the embedded default), named by ``--served-model-name``."""
    names = list(config.served_model_name)
    if not names:
        names = [model_name(config.model) if config.model else DEFAULT_MODEL_NAME]
    return CatalogEntry(name=names[0], source=config.model, aliases=tuple(names[1:]))


def _check_names(entries: Sequence[CatalogEntry]) -> None:
    seen: dict[str, str] = {}
    for entry in entries:
        for name in entry.names:
            if name in seen:
                raise UsageError(
                    f"the model name {name!r} is used twice (by {seen[name]!r} and {entry.name!r})"
                )
            seen[name] = entry.name


def _configure(
    entry: CatalogEntry,
    config: ServerConfig,
    args: argparse.Namespace,
    core_dests: set[str],
    selection: PluginSelection,
) -> ModelSpec:
    pm = create_plugin_manager()
    chosen = attrs.evolve(selection, enable=(*selection.enable, *entry.plugins))
    try:
        load_plugins(pm, chosen)
    except UsageError as exc:
        raise UsageError(f"model {entry.name!r}: {exc}") from None
    model_hooks = PluginHooks(pm)
    parser = _Parser(prog=f"model {entry.name!r}", add_help=False)
    options.add_model_options(parser)
    model_hooks.addoption(parser)
    namespace = copy.copy(args)
    try:
        parsed = parser.parse_args(list(entry.flags), namespace=namespace)
    except UsageError as exc:
        raise UsageError(f"model {entry.name!r}: {exc}") from None
    model_config = attrs.evolve(options.config_from_args(parsed, core_dests), model=entry.source)
    try:
        model_hooks.configure(model_config)
    except UsageError as exc:
        raise UsageError(f"model {entry.name!r}: {exc}") from None
    return ModelSpec(entry, model_config, model_hooks)

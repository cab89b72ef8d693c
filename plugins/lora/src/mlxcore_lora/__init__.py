"""mlxcore plugin `lora`: mlx-lm LoRA adapters served on the base model's shared weights.

``--plugin lora --lora NAME=PATH`` (repeatable; ``--lora-modules`` is vLLM's name) serves
each adapter folder written by ``mlx_lm.lora`` as a model of its own name: a request whose
``model`` is ``NAME`` runs on the base model with that adapter, in the same decode batch
as requests for other adapters and for the base model (each row gets its own adapter's
delta, see :mod:`mlxcore_lora.bank`). ``--allow-runtime-lora`` adds vLLM's
``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``. Adapter weights count
in the model's memory budget. See docs/plugins/lora.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import attrs

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.errors import UsageError
from mlxcore.hookspecs import OptionGroup
from mlxcore.model_info import ModelInfo
from mlxcore.settings import add_flags, positive_int, read_settings, setting

MLXCORE_AUTOLOAD = False
"""Not loaded unless named with `--plugin lora`."""

log = logging.getLogger("mlxcore.plugins.lora")
"""Under ``mlxcore`` so the CLI's log handler shows it."""


@attrs.frozen
class LoraSettings:
    """The lora plugin's settings; each default is stated here only."""

    lora: Sequence[str] | None = setting(
        None, metavar="NAME=PATH", nargs="+", action="extend", aliases=("--lora-modules",),
        help="serve the mlx-lm adapter folder PATH as the model NAME (repeatable; "
        "--lora-modules is vLLM's name for it)",
    )  # fmt: skip
    max_loras: int = setting(
        8, type=positive_int, metavar="N",
        help="the most LoRA adapters loaded at once (startup and runtime loads together)",
    )  # fmt: skip
    allow_runtime_lora: bool = setting(
        False, action="store_true",
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's admin "
        "routes; they read folders on the server's disk: keep them behind --api-key)",
    )  # fmt: skip


def adapter_specs(settings: LoraSettings) -> list[tuple[str, str]]:
    """``--lora`` as (name, path) pairs; raises :class:`UsageError` for a malformed one."""
    specs: list[tuple[str, str]] = []
    for item in settings.lora or []:
        name, sep, path = str(item).partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise UsageError(f"--lora {item!r}: expected NAME=PATH")
        if any(name == other for other, _ in specs):
            raise UsageError(f"--lora: the name {name!r} is given twice")
        specs.append((name, path))
    return specs


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """``--lora``, ``--max-loras`` and ``--allow-runtime-lora``."""
    add_flags(parser, LoraSettings)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """The adapters are named well and fit ``--max-loras``; the names are not the model's."""
    settings = read_settings(config, LoraSettings)
    specs = adapter_specs(settings)
    if config.distributed:
        raise UsageError("plugin 'lora' does not serve adapters on a --distributed model yet")
    if len(specs) > settings.max_loras:
        raise UsageError(
            f"--lora: {len(specs)} adapters, more than --max-loras {settings.max_loras}"
        )
    taken = set(config.served_model_name)
    for name, _ in specs:
        if name in taken:
            raise UsageError(f"--lora: {name!r} is already the model's name")
    if not specs and not settings.allow_runtime_lora:
        log.warning("plugin 'lora' is loaded without --lora or --allow-runtime-lora: no adapters")


@hookimpl
def mlxcore_model_resources(model: Any, info: ModelInfo, config: ServerConfig) -> Any:
    """Load every ``--lora`` adapter onto this model instance (start-up stops with the
    folder and the reason when one cannot serve this model)."""
    from mlxcore.engine.adapters import attach
    from mlxcore_lora.bank import AdapterBank
    from mlxcore_lora.folder import AdapterError, read_adapter

    settings = read_settings(config, LoraSettings)
    bank = AdapterBank(model, settings.max_loras)
    if not bank.targets:
        raise UsageError(f"plugin 'lora': {info.path} has no linear layers an adapter can adapt")
    for name, path in adapter_specs(settings):
        try:
            bank.install(read_adapter(name, path, bank.targets))
        except AdapterError as exc:
            raise UsageError(f"--lora {name}={path}: {exc}") from None
        log.info("lora: serving %s from %s", name, path)
    attach(model, bank)
    return bank


@hookimpl
def mlxcore_routes(config: ServerConfig) -> list[Any]:
    """The runtime load/unload routes, with ``--allow-runtime-lora`` only."""
    if not read_settings(config, LoraSettings).allow_runtime_lora:
        return []
    from mlxcore_lora.routes import lora_routes

    return lora_routes()

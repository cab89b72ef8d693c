"""A typed facade over the plugin manager: the only way core code calls hooks.

Each method calls one hook through pluggy (:func:`mlxcore.hookcalls.call_hook`),
which knows which plugin produced which result, so an exception or a duplicate
name is reported with the plugin's name. Hook results become registries
(parsers, strategies, routes) that refuse duplicate names.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, TypeVar

import pluggy

from mlxcore.config import ServerConfig
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import CacheStrategy, Decoder, LogitsProcessor, PrefillStrategy
from mlxcore.errors import UsageError
from mlxcore.hookcalls import HookAnswers, call_hook
from mlxcore.lifecycle import RequestRecord
from mlxcore.model_info import ModelInfo
from mlxcore.parsers.base import ReasoningParser, ToolParser
from mlxcore.registry import Registry
from mlxcore.resources import ModelResources
from mlxcore.routes import RouteTable

T = TypeVar("T")
log = logging.getLogger(__name__)


class PluginHooks:
    """Typed access to every hook in :mod:`mlxcore.hookspecs`."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm

    # -- calling machinery -------------------------------------------------

    def _call(self, hook_name: str, **kwargs: Any) -> HookAnswers:
        """Call ``hook_name`` through pluggy (see :mod:`mlxcore.hookcalls`)."""
        return call_hook(self.pm, hook_name, **kwargs)

    def _registry(self, kind: str, hook_name: str, **kwargs: Any) -> Registry[Any]:
        registry: Registry[Any] = Registry(kind)
        for plugin, items in self._call(hook_name, **kwargs).results:
            for item in items if isinstance(items, list | tuple) else [items]:
                registry.register(getattr(item, "name", ""), item, plugin=plugin)
        return registry

    @staticmethod
    def _choose(registry: Registry[T], wanted: str | None, flag: str) -> T:
        if wanted:
            try:
                return registry.get(wanted)
            except KeyError as exc:
                raise UsageError(f"{flag}: {exc.args[0]}") from None
        items = registry.items()
        if not items:
            raise UsageError(f"no plugin offers a {registry.kind} for this model")
        return items[0]

    # -- start-up ----------------------------------------------------------

    def addoption(self, parser: argparse.ArgumentParser) -> None:
        """``mlxcore_addoption``: one argument group per plugin, titled with its name
        (each plugin is called through its own subset of the hook, so pluggy's rules
        and tracing still apply)."""
        impls = self.pm.hook.mlxcore_addoption.get_hookimpls()
        plugins = [impl.plugin for impl in impls]
        for impl in reversed(impls):
            others = [p for p in plugins if p is not impl.plugin]
            group = parser.add_argument_group(f"plugin {impl.plugin_name}")
            self.pm.subset_hook_caller("mlxcore_addoption", remove_plugins=others)(parser=group)

    def add_commands(self, subparsers: Any) -> None:
        """``mlxcore_add_commands`` on every plugin."""
        self._call("mlxcore_add_commands", subparsers=subparsers)

    def configure(self, config: ServerConfig) -> None:
        """``mlxcore_configure`` on every plugin."""
        self._call("mlxcore_configure", config=config)

    def tool_parsers(self) -> Registry[type[ToolParser]]:
        """All tool parser classes, by name (duplicates refused)."""
        return self._registry("tool parser", "mlxcore_tool_parsers")

    def reasoning_parsers(self) -> Registry[type[ReasoningParser]]:
        """All reasoning parser classes, by name (duplicates refused)."""
        return self._registry("reasoning parser", "mlxcore_reasoning_parsers")

    def routes(self, config: ServerConfig, table: RouteTable | None = None) -> RouteTable:
        """Route handlers from every plugin added to ``table`` (e.g. holding the core's
        own routes), keyed by (method, path): a route two plugins claim stops
        start-up naming both. Plugins are added in registration order (pluggy calls
        the newest first), so the later plugin is the one refused."""
        table = RouteTable() if table is None else table
        for plugin, items in reversed(self._call("mlxcore_routes", config=config).results):
            table.add(plugin, list(items))
        return table

    # -- model load --------------------------------------------------------

    def load_model(self, model: Any, config: ServerConfig) -> Any:
        """The first ``mlxcore_load_model`` result (a ``LoadedModel``), or ``None``;
        plugins after the first that loads are not asked (``firstresult``)."""
        answers = self._call("mlxcore_load_model", model=model, config=config).results
        if not answers:
            return None
        plugin, loaded = answers[0]
        log.info("plugin %s loaded the model", plugin)
        return loaded

    def patch_model(self, model: Any, info: ModelInfo, config: ServerConfig) -> None:
        """``mlxcore_patch_model`` on every plugin."""
        self._call("mlxcore_patch_model", model=model, info=info, config=config)

    def chat_template(self, info: ModelInfo, template: str) -> str:
        """The first plugin's rewrite of the chat template (``firstresult``), or
        ``template`` unchanged."""
        answers = self._call("mlxcore_chat_template", info=info, template=template).results
        if not answers or not isinstance(answers[0][1], str) or answers[0][1] == template:
            return template
        log.info("plugin %s rewrote the chat template", answers[0][0])
        return str(answers[0][1])

    def model_resources(self, model: Any, info: ModelInfo, config: ServerConfig) -> ModelResources:
        """What every plugin loaded for this model (``mlxcore_model_resources``), once."""
        answers = self._call("mlxcore_model_resources", model=model, info=info, config=config)
        resources = ModelResources(answers.results)
        for kind, plugin in resources.owners().items():
            log.info("plugin %s loaded %s for this model", plugin, kind)
        return resources

    def cache_strategy(
        self, model: Any, info: ModelInfo, config: ServerConfig, resources: ModelResources
    ) -> CacheStrategy:
        """The cache strategy to use (``--cache-strategy`` or the first offered)."""
        kw = {"model": model, "info": info, "config": config, "resources": resources}
        reg = self._registry("cache strategy", "mlxcore_cache_strategy", **kw)
        return self._choose(reg, config.cache_strategy, "--cache-strategy")

    def watched_cache_strategy(
        self, model: Any, info: ModelInfo, config: ServerConfig, resources: ModelResources
    ) -> CacheStrategy:
        """:meth:`cache_strategy`, with every plugin's prefix-cache watcher attached
        (``mlxcore_prefix_cache_watcher``)."""
        strategy = self.cache_strategy(model, info, config, resources)
        answers = self._call("mlxcore_prefix_cache_watcher", info=info, config=config)
        for plugin, watcher in answers.results:
            if watcher is not None and not strategy.watch(watcher):
                log.warning(
                    "plugin %s watches the prefix cache, but the %s cache strategy tells "
                    "no changes",
                    plugin,
                    strategy.name,
                )
        return strategy

    def prefill_strategy(
        self, model: Any, info: ModelInfo, config: ServerConfig, resources: ModelResources
    ) -> PrefillStrategy:
        """The prefill strategy to use (``--prefill-strategy`` or the first offered)."""
        kw = {"model": model, "info": info, "config": config, "resources": resources}
        reg = self._registry("prefill strategy", "mlxcore_prefill_strategy", **kw)
        return self._choose(reg, config.prefill_strategy, "--prefill-strategy")

    def decoder(
        self, model: Any, info: ModelInfo, config: ServerConfig, resources: ModelResources
    ) -> Decoder:
        """The decoder to use (``--decoder`` or the first offered)."""
        kw = {"model": model, "info": info, "config": config, "resources": resources}
        reg = self._registry("decoder", "mlxcore_decoder", **kw)
        return self._choose(reg, config.decoder, "--decoder")

    # -- request set-up ----------------------------------------------------

    def validate_options(self, options: dict[str, Any], config: ServerConfig) -> None:
        """``mlxcore_validate_options`` on every plugin; an :class:`OptionError` passes
        through (the front end turns it into a 400 naming the field), anything else
        is a :class:`PluginError`."""
        self._call("mlxcore_validate_options", options=options, config=config)

    def model_architectures(self) -> frozenset[str]:
        """Architectures the plugins load without mlx-lm (``mlxcore_model_architectures``)."""
        answers = self._call("mlxcore_model_architectures")
        return frozenset(name for names in answers.values() for name in names)

    def request_options(self) -> frozenset[str]:
        """Every request field the plugins declared they read (``mlxcore_request_options``)."""
        answers = self._call("mlxcore_request_options")
        return frozenset(name for names in answers.values() for name in names)

    def logits_processors(
        self, request: GenerationRequest, info: ModelInfo
    ) -> list[LogitsProcessor]:
        """Processors every plugin adds for this request, in priority order."""
        answers = self._call("mlxcore_logits_processors", request=request, info=info)
        return [processor for items in answers.values() for processor in items]

    # -- observers ---------------------------------------------------------

    def request_finished(self, record: RequestRecord) -> None:
        """``mlxcore_request_finished`` on every plugin; a failing observer is logged,
        never raised (the request it observes is over)."""
        try:
            self._call("mlxcore_request_finished", record=record)
        except Exception:
            log.exception("a plugin failed observing request %s", record.request_id)

    def server_lifespans(self, app: Any) -> list[Any]:
        """The async context managers plugins run for the server's lifetime."""
        answers = self._call("mlxcore_server_lifespan", app=app)
        return [cm for _, cm in answers.results if cm is not None]

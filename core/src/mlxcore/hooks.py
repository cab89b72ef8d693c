"""A typed facade over the plugin manager: the only way core code calls hooks.

Each method calls one hook on every plugin, in priority order, and knows which
plugin produced which result, so an exception or a duplicate name is reported
with the plugin's name. Hook results become registries (parsers, strategies)
that refuse duplicate names.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, TypeVar

import pluggy

from mlxcore.config import ServerConfig
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import CacheStrategy, Decoder, LogitsProcessor, PrefillStrategy
from mlxcore.errors import MlxcoreError, PluginError, UsageError
from mlxcore.model_info import ModelInfo
from mlxcore.parsers.base import ReasoningParser, ToolParser
from mlxcore.registry import Registry

T = TypeVar("T")
log = logging.getLogger(__name__)


class PluginHooks:
    """Typed access to every hook in :mod:`mlxcore.hookspecs`."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm

    # -- calling machinery -------------------------------------------------

    def _call_each(self, hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call ``hook_name`` on each plugin in priority order; (plugin, result) pairs.

        ``None`` results are dropped. Exceptions become :class:`PluginError`
        naming the plugin (usage errors pass through unchanged).
        """
        caller: pluggy.HookCaller = getattr(self.pm.hook, hook_name)
        results: list[tuple[str, Any]] = []
        for impl in reversed(caller.get_hookimpls()):
            args = {name: kwargs[name] for name in impl.argnames}
            try:
                result = impl.function(**args)
            except (UsageError, PluginError):
                raise
            except Exception as exc:
                raise PluginError(
                    impl.plugin_name, f"{type(exc).__name__}: {exc}", hook=hook_name
                ) from exc
            if result is not None:
                results.append((impl.plugin_name, result))
        return results

    def _registry(self, kind: str, hook_name: str, **kwargs: Any) -> Registry[Any]:
        registry: Registry[Any] = Registry(kind)
        for plugin, items in self._call_each(hook_name, **kwargs):
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
        """``mlxcore_addoption``: one argument group per plugin, titled with its name."""
        caller: pluggy.HookCaller = self.pm.hook.mlxcore_addoption
        for impl in reversed(caller.get_hookimpls()):
            group = parser.add_argument_group(f"plugin {impl.plugin_name}")
            try:
                impl.function(**{name: group for name in impl.argnames})
            except argparse.ArgumentError as exc:
                raise PluginError(impl.plugin_name, str(exc), hook="mlxcore_addoption") from exc

    def add_commands(self, subparsers: Any) -> None:
        """``mlxcore_add_commands`` on every plugin."""
        self._call_each("mlxcore_add_commands", subparsers=subparsers)

    def configure(self, config: ServerConfig) -> None:
        """``mlxcore_configure`` on every plugin."""
        self._call_each("mlxcore_configure", config=config)

    def tool_parsers(self) -> Registry[type[ToolParser]]:
        """All tool parser classes, by name (duplicates refused)."""
        return self._registry("tool parser", "mlxcore_tool_parsers")

    def reasoning_parsers(self) -> Registry[type[ReasoningParser]]:
        """All reasoning parser classes, by name (duplicates refused)."""
        return self._registry("reasoning parser", "mlxcore_reasoning_parsers")

    def routes(self, config: ServerConfig) -> list[Any]:
        """Route handlers from every plugin, flattened."""
        return [r for _, items in self._call_each("mlxcore_routes", config=config) for r in items]

    # -- model load --------------------------------------------------------

    def load_model(self, model: Any, config: ServerConfig) -> Any:
        """The first ``mlxcore_load_model`` result (a ``LoadedModel``), or ``None``;
        plugins after the first that loads are not asked."""
        caller: pluggy.HookCaller = self.pm.hook.mlxcore_load_model
        args = {"model": model, "config": config}
        for impl in reversed(caller.get_hookimpls()):
            try:
                loaded = impl.function(**{name: args[name] for name in impl.argnames})
            except MlxcoreError:  # ModelLoadError, UsageError, ...: already clear
                raise
            except Exception as exc:
                raise PluginError(
                    impl.plugin_name, f"{type(exc).__name__}: {exc}", hook="mlxcore_load_model"
                ) from exc
            if loaded is not None:
                log.info("plugin %s loaded the model", impl.plugin_name)
                return loaded
        return None

    def patch_model(self, model: Any, info: ModelInfo, config: ServerConfig) -> None:
        """``mlxcore_patch_model`` on every plugin."""
        self._call_each("mlxcore_patch_model", model=model, info=info, config=config)

    def chat_template(self, info: ModelInfo, template: str) -> str:
        """``mlxcore_chat_template`` on every plugin, each rewriting the last result."""
        caller: pluggy.HookCaller = self.pm.hook.mlxcore_chat_template
        for impl in reversed(caller.get_hookimpls()):
            args = {"info": info, "template": template}
            try:
                result = impl.function(**{name: args[name] for name in impl.argnames})
            except Exception as exc:
                raise PluginError(
                    impl.plugin_name, f"{type(exc).__name__}: {exc}", hook="mlxcore_chat_template"
                ) from exc
            if isinstance(result, str) and result != template:
                log.info("plugin %s rewrote the chat template", impl.plugin_name)
                template = result
        return template

    def cache_strategy(self, model: Any, info: ModelInfo, config: ServerConfig) -> CacheStrategy:
        """The cache strategy to use (``--cache-strategy`` or the first offered)."""
        kw = {"model": model, "info": info, "config": config}
        reg = self._registry("cache strategy", "mlxcore_cache_strategy", **kw)
        return self._choose(reg, config.cache_strategy, "--cache-strategy")

    def prefill_strategy(
        self, model: Any, info: ModelInfo, config: ServerConfig
    ) -> PrefillStrategy:
        """The prefill strategy to use (``--prefill-strategy`` or the first offered)."""
        kw = {"model": model, "info": info, "config": config}
        reg = self._registry("prefill strategy", "mlxcore_prefill_strategy", **kw)
        return self._choose(reg, config.prefill_strategy, "--prefill-strategy")

    def decoder(self, model: Any, info: ModelInfo, config: ServerConfig) -> Decoder:
        """The decoder to use (``--decoder`` or the first offered)."""
        kw = {"model": model, "info": info, "config": config}
        reg = self._registry("decoder", "mlxcore_decoder", **kw)
        return self._choose(reg, config.decoder, "--decoder")

    # -- request set-up ----------------------------------------------------

    def validate_options(self, options: dict[str, Any], config: ServerConfig) -> None:
        """``mlxcore_validate_options`` on every plugin; a plugin's ``ValueError``
        passes through (the front end turns it into a 400), anything else is a
        :class:`PluginError`."""
        caller: pluggy.HookCaller = self.pm.hook.mlxcore_validate_options
        args = {"options": options, "config": config}
        for impl in reversed(caller.get_hookimpls()):
            try:
                impl.function(**{name: args[name] for name in impl.argnames})
            except ValueError:
                raise
            except Exception as exc:
                raise PluginError(
                    impl.plugin_name,
                    f"{type(exc).__name__}: {exc}",
                    hook="mlxcore_validate_options",
                ) from exc

    def logits_processors(
        self, request: GenerationRequest, info: ModelInfo
    ) -> list[LogitsProcessor]:
        """Processors every plugin adds for this request, in priority order."""
        out: list[LogitsProcessor] = []
        for _, items in self._call_each("mlxcore_logits_processors", request=request, info=info):
            out.extend(items)
        return out

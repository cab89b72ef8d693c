"""The model session every front end, command and test builds from: a loaded model,
its parsers, what plugins loaded for it, and its engine (the only way to run it).

``mlxcore serve``, ``mlxcore generate``, ``mlxcore bench`` and the tests all go
through :func:`build_runtime`, so there is exactly one engine and one way to load.
It sits below the server and the CLI (both import it; it imports neither).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn

from mlxcore.config import ServerConfig
from mlxcore.engine.engine import Engine, EngineParts
from mlxcore.engine.jobs import ModelJob
from mlxcore.engine.prefix_pool import PrefixPool
from mlxcore.hooks import PluginHooks
from mlxcore.model_info import ModelInfo
from mlxcore.output import OutputPipeline
from mlxcore.output.detokenize import continuation_detokenizer
from mlxcore.parsers.base import ToolParser
from mlxcore.parsers.selection import Parsers
from mlxcore.resources import ModelResources
from mlxcore.thinking import ThinkingMarkers, ThinkingTracker, thinking_markers

log = logging.getLogger(__name__)


@attrs.define
class Runtime:
    """A loaded model with its tokenizer, its engine and the plugin facade."""

    model: Any
    tokenizer: Any
    info: ModelInfo
    engine: Engine
    hooks: PluginHooks
    config: ServerConfig
    parsers: Parsers
    hidden_ids: frozenset[int]
    """Tokens never shown as text: EOS and the parsers' control markup."""
    media: Any = None
    """The model's :class:`mlxcore.media.MediaHandler`, ``None`` for text-only models."""
    resources: ModelResources = attrs.field(factory=ModelResources)
    """What the plugins loaded for this model (``mlxcore_model_resources``), once."""
    _request_options: frozenset[str] | None = attrs.field(default=None, init=False)
    _thinking: tuple[ThinkingMarkers | None] | None = attrs.field(default=None, init=False)

    def thinking_markers(self) -> ThinkingMarkers | None:
        """The reasoning parser's think-block tags as token ids (``None`` when the model
        has no tag-based reasoning parser), tokenized once."""
        if self._thinking is None:
            self._thinking = (thinking_markers(self.parsers.reasoning, self.tokenizer),)
        return self._thinking[0]

    def request_options(self) -> frozenset[str]:
        """The request fields the plugins read (``mlxcore_request_options``), asked once."""
        if self._request_options is None:
            self._request_options = self.hooks.request_options()
        return self._request_options

    def embed(
        self,
        inputs: Sequence[Sequence[int]],
        *,
        pooling: str = "last",
        dimensions: int | None = None,
    ) -> ModelJob:
        """Embeddings of ``inputs`` (token ids each, see :mod:`mlxcore.embeddings`),
        computed by the engine as a job, one forward pass per engine iteration between
        the steps of the running batch: admitted under its memory budget, watched by its
        watchdog. Raises what :meth:`Engine.submit_job` raises; the job's future holds
        the vectors, in order (``job.cancel()`` when nobody waits for them any more)."""
        work, cost = self.embedding_work(inputs, pooling=pooling, dimensions=dimensions)
        return self.engine.submit_job("embedding", work, cost)

    def embedding_work(
        self,
        inputs: Sequence[Sequence[int]],
        *,
        pooling: str = "last",
        dimensions: int | None = None,
    ) -> tuple[Callable[[], Generator[None, None, list[list[float]]]], int]:
        """The job :meth:`embed` submits: its work (a generator, a forward pass per
        piece) and the bytes it holds at most."""
        from mlxcore.embeddings import embedding_pieces, forward_bytes

        model, rows = self.model, [list(ids) for ids in inputs]
        # a plugin's model that embeds its own way (a BERT encoder) says how
        pieces = getattr(model, "mlxcore_embedding_pieces", None)

        def work() -> Generator[None, None, list[list[float]]]:
            if pieces is not None:
                out: Generator[None, None, list[list[float]]]
                out = pieces(rows, pooling=pooling, dimensions=dimensions)
                return out
            return embedding_pieces(model, rows, pooling=pooling, dimensions=dimensions)

        return work, forward_bytes(model, rows)

    def pipeline(
        self,
        *,
        stops: Sequence[str] = (),
        tools: Sequence[Mapping[str, Any]] | None = None,
        prompt_text: str = "",
        parse: bool = True,
        tool_parser: ToolParser | None = None,
    ) -> OutputPipeline:
        """A fresh output pipeline for one request, with this model's parsers
        (``parse=False``: raw text, as for text completions; ``tool_parser``: use this
        instance instead of the model's, e.g. for constrained tool choice)."""
        if tool_parser is None and parse:
            tool_parser = self.parsers.tool_parser(tools)
        reasoning = self.parsers.reasoning_parser(prompt_text) if parse else None
        markers = self.thinking_markers() if reasoning is not None else None
        return OutputPipeline(
            continuation_detokenizer(self.tokenizer),
            hidden_ids=self.hidden_ids,
            stops=stops,
            reasoning=reasoning,
            tools=tool_parser,
            thinking=None
            if markers is None or reasoning is None
            else ThinkingTracker(markers, starts_inside=reasoning.starts_in_reasoning),
        )


def resolve_model_path(
    model_arg: str | None, architectures: frozenset[str] = frozenset()
) -> tuple[str, Any]:
    """The model argument (or the embedded default) resolved to a local folder
    (``architectures``: those plugins load without mlx-lm, accepted by the check)."""
    from mlxcore.models.default import ensure_default_model
    from mlxcore.models.resolve import resolve_model

    if model_arg is None:
        path = ensure_default_model()
        log.info("no model given: serving the embedded default")
        log.debug("embedded default model folder: %s", path)
        return str(path), resolve_model(str(path))
    return model_arg, resolve_model(model_arg, architectures=architectures)


def materialize(obj: Any) -> None:
    """Evaluate every array reachable from ``obj`` (parameters and private attributes
    such as precomputed RoPE frequencies).

    MLX streams belong to a thread: an array still lazy on the loading thread cannot
    be evaluated on the engine's thread, so everything is computed before handing over.
    """
    arrays: list[mx.array] = []
    seen: set[int] = set()
    stack: list[Any] = [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, mx.array):
            arrays.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        if isinstance(item, nn.Module):
            stack.extend(vars(item).values())
    mx.eval(arrays)


def engine_parts(
    hooks: PluginHooks, loaded: Any, config: ServerConfig, resources: ModelResources
) -> EngineParts:
    """The engine's strategy factories and per-request processors, from the plugins
    (the factories are called again when the engine restarts with fresh strategies;
    they build around ``resources``, loaded once)."""
    model, info = loaded.model, loaded.info
    return EngineParts(
        cache=lambda: hooks.watched_cache_strategy(model, info, config, resources),
        prefill=lambda: hooks.prefill_strategy(model, info, config, resources),
        decoder=lambda: hooks.decoder(model, info, config, resources),
        processors_for=lambda request: hooks.logits_processors(request, info),
    )


def build_runtime(
    config: ServerConfig,
    hooks: PluginHooks,
    memory_elsewhere: Callable[[], int] | None = None,
    split: Callable[[Any], None] | None = None,
    prefix_pool: PrefixPool | None = None,
) -> Runtime:
    """Load the model, let plugins patch it, choose parsers, and build the engine
    (not yet started; ``memory_elsewhere``, ``prefix_pool``: see :class:`Engine`).
    ``split`` (a distributed rank) is given the model before any weight is read, to keep
    this rank's share of it."""
    from mlxcore.models.loader import load_model

    _, resolved = resolve_model_path(config.model, hooks.model_architectures())
    loaded = hooks.load_model(resolved, config) or load_model(resolved, lazy=split is not None)
    if split is not None:
        split(loaded.model)
    hooks.patch_model(loaded.model, loaded.info, config)
    info = loaded.info
    if info.chat_template:
        template = hooks.chat_template(info, info.chat_template)
        if template != info.chat_template:
            loaded.tokenizer.chat_template = template  # this tokenizer instance only
            info = attrs.evolve(info, chat_template=template)
            loaded = attrs.evolve(loaded, info=info)
    materialize(loaded.model)
    resources = hooks.model_resources(loaded.model, loaded.info, config)
    materialize(list(resources))
    parsers = Parsers.select(hooks, loaded.info, config.tool_call_parser, config.reasoning_parser)
    parts = engine_parts(hooks, loaded, config, resources)
    engine = Engine(loaded.model, loaded.info, config, parts, memory_elsewhere, prefix_pool)
    hidden = loaded.info.eos_token_ids | parsers.control_ids(loaded.info.vocab)
    return Runtime(
        loaded.model,
        loaded.tokenizer,
        loaded.info,
        engine,
        hooks,
        config,
        parsers,
        hidden,
        media=loaded.media,
        resources=resources,
    )

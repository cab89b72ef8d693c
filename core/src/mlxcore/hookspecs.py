"""The plugin contract: every hook mlxcore calls, typed and documented.

Hooks run at start-up, at model load and at request set-up, never per token: a
hook returns an object (a parser class, a strategy) that the core then calls
directly. Implement a hook by defining a function with the same name and the
same (or a subset of the) arguments in your plugin module, marked with
:data:`mlxcore.hookimpl` (an unmarked ``mlxcore_*`` function is accepted too)::

    from mlxcore import hookimpl

    @hookimpl
    def mlxcore_tool_parsers():
        return [MyToolParser]

Calling modes follow pluggy's rules and live on the specs: hooks are called
through ``pm.hook`` on each plugin in priority order (plugins named with
``--plugin`` and installed plugins first, built-ins last; ``tryfirst`` /
``trylast`` respected); ``firstresult=True`` specs (``mlxcore_load_model``,
``mlxcore_chat_template``) stop at the first non-``None`` answer; list-returning
hooks are concatenated; strategy hooks collect one candidate per plugin into a
name registry that refuses duplicates, and the engine takes the first candidate
unless a name is chosen on the command line. ``wrapper=True`` implementations
work as in any pluggy project, and ``pm.trace`` / ``add_hookcall_monitoring`` see
every call. An exception raised by a hook is reported with the plugin's name
and stops start-up (or fails only the one request, for request-time hooks).

The test ``tests/core/test_hookspecs.py`` fails when a hook here lacks a
docstring, or is missing from docs/hooks.md, or has no test exercising it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from mlxcore import hookspec

if TYPE_CHECKING:
    from mlxcore.config import ServerConfig
    from mlxcore.engine.prefix_tree import TreeWatcher
    from mlxcore.engine.request import GenerationRequest
    from mlxcore.engine.strategies import (
        CacheStrategy,
        Decoder,
        LogitsProcessor,
        PrefillStrategy,
    )
    from mlxcore.lifecycle import RequestRecord
    from mlxcore.model_info import ModelInfo
    from mlxcore.models.loader import LoadedModel
    from mlxcore.models.resolve import ResolvedModel
    from mlxcore.parsers.base import ReasoningParser, ToolParser
    from mlxcore.resources import ModelResources


class OptionGroup(Protocol):
    """What ``mlxcore_addoption`` receives: an argparse argument group."""

    def add_argument(self, *names: str, **kwargs: Any) -> Any:
        """``argparse``'s ``add_argument``."""


@hookspec
def mlxcore_addoption(parser: OptionGroup) -> None:
    """Add command-line options for this plugin.

    When: at start-up, before the command line is parsed, once per plugin. The
    ``parser`` is an argparse argument group titled with the plugin's name; its
    values reach the plugin as ``config.option(dest)`` in later hooks.

    Declare the settings once, as an attrs class whose fields say their defaults
    (:func:`mlxcore.settings.setting`), and let :func:`mlxcore.settings.add_flags` make
    the flags; :func:`mlxcore.settings.read_settings` reads them back typed.

    Example::

        @attrs.frozen
        class SparseSettings:
            sparse_threshold: int = setting(8192, help="prompts shorter than this prefill densely")

        @hookimpl
        def mlxcore_addoption(parser):
            add_flags(parser, SparseSettings)
    """


@hookspec
def mlxcore_add_commands(subparsers: Any) -> None:
    """Add ``mlxcore`` subcommands (e.g. ``mlxcore mtp extract``).

    When: at start-up, while the command line parser is built. ``subparsers`` is
    argparse's subparsers action: call ``subparsers.add_parser(name, help=...)``,
    add arguments, and ``set_defaults(mlxcore_handler=fn)`` where ``fn(args) -> int``
    runs the command and returns the exit code. An opt-in plugin
    (``MLXCORE_AUTOLOAD = False``) that lists the command names in a module attribute
    ``MLXCORE_COMMANDS`` is loaded automatically when one of them is invoked.

    Example::

        MLXCORE_COMMANDS = ("mtp",)

        @hookimpl
        def mlxcore_add_commands(subparsers):
            cmd = subparsers.add_parser("mtp", help="MTP head tools")
            cmd.add_argument("source")
            cmd.set_defaults(mlxcore_handler=run_mtp_command)
    """


@hookspec
def mlxcore_configure(config: ServerConfig) -> None:
    """Validate and take note of the parsed configuration.

    When: once, after the command line is parsed and before the model loads.
    Raise :class:`mlxcore.errors.UsageError` for a bad option value: start-up
    stops with your message.

    Example::

        @hookimpl
        def mlxcore_configure(config):
            if read_settings(config, SparseSettings).sparse_threshold < 1:
                raise UsageError("--sparse-threshold must be at least 1")
    """


@hookspec(firstresult=True)
def mlxcore_load_model(model: ResolvedModel, config: ServerConfig) -> LoadedModel | None:
    """Load the model yourself (a checkpoint mlx-lm alone cannot serve), or ``None`` to pass.

    When: once, at start-up, before ``mlxcore_patch_model``; the first plugin that
    returns a :class:`~mlxcore.models.loader.LoadedModel` wins, otherwise mlx-lm loads
    the folder. The returned ``model`` is what the engine and strategies call (the
    ``mlx_lm`` model interface: ``model(tokens, cache=...)`` -> logits); set ``media``
    to a :class:`mlxcore.media.MediaHandler` when requests may carry images or video.

    Example::

        @hookimpl
        def mlxcore_load_model(model, config):
            if "vision_config" in read_config(model.path):
                return load_vision_language_model(model, config)
            return None
    """


@hookspec
def mlxcore_model_architectures() -> list[str] | None:
    """Name the checkpoint architectures (``config.json``'s ``architectures`` entries, or
    its ``model_type`` for checkpoints that list none) that this plugin's
    :func:`mlxcore_load_model` loads although mlx-lm has no module for them, so the
    model folder check before loading accepts them.

    When: once per model, before its folder is checked and loaded.

    Example::

        @hookimpl
        def mlxcore_model_architectures():
            return ["BertForSequenceClassification"]
    """


@hookspec
def mlxcore_patch_model(model: Any, info: ModelInfo, config: ServerConfig) -> None:
    """Adjust a freshly loaded model in place (attach an MTP head, fix a cache bug).

    When: once per model, right after mlx-lm loaded it and before any strategy is
    built. Patch this model object only (set attributes, wrap its own methods);
    never patch mlx-lm or mlx-vlm classes for the whole process.

    Example::

        @hookimpl
        def mlxcore_patch_model(model, info, config):
            if "mtp.fc.weight" in info.weight_keys:
                model.mtp_head = build_mtp_head(info.path, model)
    """


@hookspec(firstresult=True)
def mlxcore_chat_template(info: ModelInfo, template: str) -> str | None:
    """Rewrite the model's chat template, or return ``None`` to leave it alone.

    When: once per model at load, after ``mlxcore_patch_model``; the first plugin
    that returns a template wins (``firstresult``), so return ``None`` for models that
    are not yours. For template quirks that break prefix
    reuse across the turns of a conversation (a template that re-renders earlier
    turns differently once a new message arrives): return a prefix-stable variant.
    Model-family plugins implement this; the core has no per-family cases.

    Example::

        @hookimpl
        def mlxcore_chat_template(info, template):
            if info.model_type == "qwen3_5" and QUIRK in template:
                return template.replace(QUIRK, STABLE)
            return None
    """


@hookspec
def mlxcore_model_resources(model: Any, info: ModelInfo, config: ServerConfig) -> object | None:
    """Load what your strategies need for this model (a draft model, a head), or ``None``.

    When: once per model load, after ``mlxcore_patch_model`` and the chat template,
    before any strategy is built. The strategy hooks (``mlxcore_cache_strategy``,
    ``mlxcore_prefill_strategy``, ``mlxcore_decoder``) run again at every engine restart
    and after a failed decode step: they receive the answers as ``resources`` and find
    theirs by type (``resources.get(MyDraft)``), so nothing heavy is loaded twice. Return
    an instance of a class of your own; raise :class:`mlxcore.errors.UsageError` for a
    resource that cannot serve this model (start-up stops with your message).

    Example::

        @hookimpl
        def mlxcore_model_resources(model, info, config):
            return MyDraft(load_draft(read_settings(config, MySettings).my_draft, info))

        @hookimpl
        def mlxcore_decoder(model, info, config, resources):
            draft = resources.get(MyDraft)
            return None if draft is None else MyDecoder(model, draft.model)
    """


@hookspec
def mlxcore_tool_parsers() -> list[type[ToolParser]]:
    """Offer tool-call parser classes (subclasses of :class:`~mlxcore.parsers.ToolParser`).

    When: once at start-up. Each class has a unique ``name`` (selectable with
    ``--tool-call-parser NAME``) and a ``matches(info)`` classmethod used for
    ``auto`` detection. Two classes with the same name stop start-up with an error
    naming both.

    Example::

        @hookimpl
        def mlxcore_tool_parsers():
            return [HelloToolParser]
    """
    raise NotImplementedError


@hookspec
def mlxcore_reasoning_parsers() -> list[type[ReasoningParser]]:
    """Offer reasoning parser classes (subclasses of :class:`~mlxcore.parsers.ReasoningParser`).

    When: once at start-up; same naming and detection rules as tool parsers
    (``--reasoning-parser NAME``).

    Example::

        @hookimpl
        def mlxcore_reasoning_parsers():
            return [ThinkTagParser]
    """
    raise NotImplementedError


@hookspec
def mlxcore_cache_strategy(
    model: Any, info: ModelInfo, config: ServerConfig, resources: ModelResources
) -> CacheStrategy | None:
    """Offer a prefix-cache strategy for this model, or ``None`` to pass.

    When: once per model, after ``mlxcore_patch_model``, and again each time the engine
    restarts after a fault (a fresh instance: nothing survives a fault). The engine uses the first
    candidate (plugins before the built-in LRU cache) unless ``--cache-strategy NAME``
    picks one.

    Example::

        @hookimpl
        def mlxcore_cache_strategy(model, info, config):
            return SnapshotCache(model) if info.model_type == "qwen3_5" else None
    """


@hookspec
def mlxcore_prefix_cache_watcher(info: ModelInfo, config: ServerConfig) -> TreeWatcher | None:
    """Watch this model's prefix cache: return a :class:`~mlxcore.engine.prefix_tree.TreeWatcher`
    (or ``None``) told of every prefix the cache stores, splits and drops.

    When: each time ``mlxcore_cache_strategy`` gave the engine a fresh strategy (at
    start-up and after each restart); the watcher's ``cleared`` is called when that
    strategy closes. Strategies that keep no radix tree (``--cache-strategy lru``) tell
    nothing. The watcher runs on the engine's thread under the cache's lock: hand the
    work to a thread of your own. A watcher that also has ``watch_tier(medium, entries)``
    (:class:`~mlxcore.engine.prefix_tree.TierWatcher`) is handed each slower tier behind
    the tree: the ``disk-cache`` plugin calls it with ``"DISK"`` and a function returning
    its entries' tokens by key (``None`` once closed), to read when the watcher likes.
    The ``kv-events`` plugin publishes both as vLLM's KV events.

    Example::

        @hookimpl
        def mlxcore_prefix_cache_watcher(info, config):
            return MyMirror(info.path)
    """


@hookspec
def mlxcore_prefill_strategy(
    model: Any, info: ModelInfo, config: ServerConfig, resources: ModelResources
) -> PrefillStrategy | None:
    """Offer a prefill strategy for this model, or ``None`` to pass.

    When: once per model, and again after an engine restart (build it around what
    ``mlxcore_model_resources`` loaded: ``resources``). First candidate wins unless
    ``--prefill-strategy NAME``.
    A strategy that does not apply to one request (a short prompt, an option
    turned off) delegates to chunked prefill itself.

    Example::

        @hookimpl
        def mlxcore_prefill_strategy(model, info, config, resources):
            draft = resources.get(MyDraft)
            return None if draft is None else SparsePrefill(model, draft.model)
    """


@hookspec
def mlxcore_decoder(
    model: Any, info: ModelInfo, config: ServerConfig, resources: ModelResources
) -> Decoder | None:
    """Offer a decoder (plain or speculative) for this model, or ``None`` to pass.

    When: once per model, again after an engine restart, and after a decode step that
    raised (the batch state is unknown then): build it around what
    ``mlxcore_model_resources`` loaded (``resources``), never load anything here. First
    candidate wins unless ``--decoder NAME``; the built-in plain batched decoder comes
    last. A speculative decoder proposes, verifies and rolls back per sequence inside the
    running batch.

    Example::

        @hookimpl
        def mlxcore_decoder(model, info, config):
            return MTPDecoder(model) if hasattr(model, "mtp_head") else None
    """


@hookspec
def mlxcore_logits_processors(
    request: GenerationRequest, info: ModelInfo
) -> list[LogitsProcessor] | None:
    """Add logits processors for one request (constraints, biases).

    When: at request set-up, once per request, on the engine thread; the
    processors then run on every step of that request only. Processors from all
    plugins are applied in plugin priority order.

    Example::

        @hookimpl
        def mlxcore_logits_processors(request, info):
            if request.options.get("ban_token") is not None:
                return [make_ban(request.options["ban_token"])]
            return None
    """


@hookspec
def mlxcore_validate_options(options: dict[str, Any], config: ServerConfig) -> None:
    """Check the per-request options this plugin reads; raise ``OptionError`` if bad.

    When: at request set-up, in the front end, before the request reaches the
    engine. ``options`` are the request body's top-level fields that the API does
    not define (they become ``GenerationRequest.options``). Raise
    :class:`mlxcore.errors.OptionError` with the field (e.g. ``"specprefill.keep"``)
    and a message saying what is wrong: the client gets a 400 naming it. Any other
    exception is a fault of the plugin. Ignore keys that are not yours.

    Example::

        @hookimpl
        def mlxcore_validate_options(options, config):
            keep = options.get("specprefill", {}).get("keep")
            if keep is not None and not 0 < keep <= 1:
                raise OptionError("specprefill.keep", "must be in (0, 1]")
    """


@hookspec
def mlxcore_request_options() -> list[str] | None:
    """Name the top-level request body fields this plugin reads (its per-request options).

    When: once per loaded model, when the first request is built. A body field that no
    API schema defines and no plugin names here is reported (a warning once per field
    name: "not known to this server or its plugins; ignored") instead of being dropped
    in silence; declare every field your plugin reads from ``GenerationRequest.options``.

    Example::

        @hookimpl
        def mlxcore_request_options():
            return ["specprefill"]
    """


@hookspec
def mlxcore_routes(config: ServerConfig) -> list[Any] | None:
    """Offer extra HTTP route handlers (Litestar handlers or controllers).

    When: once at server start-up. The built-in OpenAI routes come through this
    hook too. A path registered twice stops start-up with an error naming both.

    Example::

        @hookimpl
        def mlxcore_routes(config):
            return [MessagesController]
    """


@hookspec
def mlxcore_request_finished(record: RequestRecord) -> None:
    """Observe a generation that ended: its timeline (arrived, handed to the engine,
    admitted, first token, finished), usage and finish reason, with the HTTP request's id
    and W3C ``traceparent`` (:class:`~mlxcore.lifecycle.RequestRecord`).

    When: once per generation (``n`` choices: once each), on the server's event loop,
    right after its last event, whether it finished, failed or was cancelled. Must not
    block: hand slow work (exporting, writing) to a thread. An exception is logged and
    ignored; it never reaches the client. The ``otel`` plugin turns records into
    OpenTelemetry spans.

    Example::

        @hookimpl
        def mlxcore_request_finished(record):
            queue.put((record.http_request_id, record.finished_ns - record.received_ns))
    """


@hookspec
def mlxcore_server_lifespan(app: Any) -> Any:
    """Run something for as long as the server serves: return an async context manager
    (or ``None``), entered once the models have started and exited before they stop.

    When: once, at server start-up, with the Litestar app (``app.state.router`` holds the
    models). A background worker (a batch runner, a cache warmer) starts on entry and
    stops on exit. To call the server's own routes in process, use
    :func:`mlxcore.server.internal.internal_client`.

    Example::

        @hookimpl
        def mlxcore_server_lifespan(app):
            return my_worker(app)  # an @asynccontextmanager
    """

"""One request builder for every front end: HTTP routes, ``mlxcore generate``, the bench.

A front end (OpenAI chat, OpenAI completions, Anthropic Messages, the CLI) checks the
fields only its API has, then describes the request in API-neutral terms, a
:class:`RequestSpec`, and :func:`build_generations` does the rest the same way for all
of them, against the model session (:class:`~mlxcore.runtime.Runtime`):

1. the plugins check their per-request options (``mlxcore_validate_options``);
2. the prompt is rendered with the chat template and tokenized once (or the raw
   text is tokenized), and media parts are expanded by the model's media handler;
3. the generation budget is checked against the context left after the prompt;
4. a constraint (``response_format``, a forced tool choice) becomes engine options,
   starting after the reasoning when the model thinks first; its grammar is
   compiled here, never on the engine thread; so does a thinking budget;
5. one :class:`GenerationRequest` and output pipeline per choice (``n``).

What cannot be served raises :class:`~mlxcore.engine.validation.RequestRejected` (the
field at fault and a code; the server answers it as a 400 in the API's own shape, the
CLI prints it), or :class:`~mlxcore.errors.MediaError` for media parts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs

from mlxcore import structured, thinking
from mlxcore.engine.adapters import ADAPTER_OPTION
from mlxcore.engine.events import RequestHandle, Usage
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.engine.strategies import StepToken
from mlxcore.engine.validation import RequestRejected, check_request, check_stops
from mlxcore.errors import OptionError
from mlxcore.media import MediaPart
from mlxcore.output import OutputPipeline
from mlxcore.parsers.base import ToolParser
from mlxcore.prompts import RenderedPrompt, render_chat
from mlxcore.runtime import Runtime
from mlxcore.tool_grammar import tool_call_constraint

RESERVED_OPTIONS = (
    ADAPTER_OPTION,
    structured.OPTION,
    structured.START_AFTER_OPTION,
    structured.MAY_OPEN_OPTION,
    structured.EXIT_OPTION,
    thinking.OPTION,
)
"""Engine options the builder sets itself (a body field of these names is dropped)."""

MAX_CHARS_PER_TOKEN = 32
"""A prompt longer than ``context x this`` characters cannot fit whatever the
tokenizer: it is refused before it is templated or tokenized."""

CONTEXT_CODE = "context_length_exceeded"
"""The error code of a prompt or budget that does not fit the model's context."""

WARNED_KEYS = 256
"""How many distinct keys of one case :func:`warn_once` remembers (client input names
many of them, e.g. unknown field names: the set must not grow with what clients send)."""

NEW_CASES_EVERY_S = 60.0
"""Once a case has :data:`WARNED_KEYS` keys remembered, its new keys are summed up in at
most one warning line per this many seconds."""

_log = logging.getLogger("mlxcore.server")


@attrs.define
class _Case:
    """The keys logged for one case (the part of a key before ``:``, fixed by the code)."""

    keys: set[str] = attrs.field(factory=set)
    unlisted: int = 0
    last_summary: float = -NEW_CASES_EVERY_S


class _OnceLog:
    """The keys :func:`warn_once` has logged, per case: bounded, and thread-safe."""

    def __init__(self) -> None:
        self.cases: dict[str, _Case] = {}
        self.lock = threading.Lock()

    def level(self, key: str) -> tuple[int, int]:
        """The log level for ``key`` and, when this line is a summary, how many warnings
        of its case's unremembered keys came before it since the last one (else 0)."""
        with self.lock:
            case = self.cases.setdefault(key.split(":", 1)[0], _Case())
            if key in case.keys:
                return logging.DEBUG, 0
            if len(case.keys) < WARNED_KEYS:
                case.keys.add(key)
                return logging.WARNING, 0
            case.unlisted += 1
            now = time.monotonic()
            if now - case.last_summary < NEW_CASES_EVERY_S:
                return logging.DEBUG, 0
            case.last_summary, unlisted, case.unlisted = now, case.unlisted, 0
            return logging.WARNING, unlisted


_warned = _OnceLog()


def warn_once(key: str, message: str, *args: Any) -> None:
    """Log a warning about what clients keep sending once per process; later occurrences
    go to the debug log, so an agent that sends the same thing every turn does not flood
    the log. ``key`` is ``case`` or ``case:detail``, where ``case`` is fixed by the calling
    code and ``detail`` may come from the client: each case remembers at most
    :data:`WARNED_KEYS` details, and past them logs a new one with a count of those left
    unlogged, at most once per :data:`NEW_CASES_EVERY_S` seconds (so a flood of one case
    never hides another)."""
    level, unlisted = _warned.level(key)
    if unlisted > 1:
        message += " (and %d more such warnings since the last one)"
        args = (*args, unlisted - 1)
    _log.log(level, message, *args)


def rejected(message: str, field: str | None = None) -> RequestRejected:
    """A request error naming ``field`` (code ``invalid_value`` when there is one)."""
    return RequestRejected(message, field, "invalid_value" if field else None)


@attrs.frozen
class ChatPrompt:
    """Messages for the model's chat template (already in the template's shape)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    template_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    media_parts: Sequence[MediaPart] = ()


@attrs.frozen
class TextPrompt:
    """A raw prompt (text completions): text to tokenize, or token ids as given."""

    text: str | None = None
    ids: Sequence[int] | None = None
    field: str = "prompt"


@attrs.frozen
class OutputConstraint:
    """What the output must match (a compiled-on-preparation grammar source), and for a
    forced tool choice a factory of the parser that reads the constrained output."""

    value: Any
    tool_parser: Callable[[], ToolParser] | None = None
    field: str = "response_format"
    """The request field it came from (named by the error when it cannot be compiled)."""
    tool_mode: Literal["required", "named"] | None = None
    """``"required"`` or ``"named"`` for a forced tool choice (the model's own call
    grammar may then replace ``value``, see :mod:`mlxcore.tool_grammar`)."""
    tool_name: str | None = None
    """The function of a named choice."""
    parallel: bool = True
    """A forced choice may make several calls."""
    lazy: bool = False
    """The constraint holds only inside tool calls (``tool_choice: auto``)."""
    exit_marker: tuple[str, str] | None = None
    """A tool-call opener that ends unclosed reasoning and starts the constrained part
    (``"anywhere"`` or at a ``"line"`` start), for native forced tool choices."""


@attrs.frozen
class RequestSpec:
    """A request in API-neutral terms: what :func:`build_generations` needs."""

    prompt: ChatPrompt | TextPrompt
    sampling: SamplingParams
    new_id: Callable[[], str]
    """Makes each choice's request id in the API's own format (``chatcmpl-...``)."""
    max_tokens: int | None = None
    """What the client asked for (``None``: ``default_max_tokens``, cut to the room left)."""
    default_max_tokens: int = 16
    max_tokens_field: str = "max_tokens"
    cap_max_tokens: bool = False
    """Cut a ``max_tokens`` beyond the context left to what is left, instead of a 400
    (Anthropic's required ``max_tokens``: Claude Code asks for 32,000 whatever the
    model's context)."""
    stops: Sequence[str] = ()
    stops_field: str = "stop"
    stop_token_ids: Sequence[int] = ()
    """Token ids that end the generation besides the model's end of sequence (vLLM's)."""
    extras: Mapping[str, Any] = attrs.field(factory=dict)
    """Body fields outside the API's schema: the plugins' per-request options."""
    constraint: OutputConstraint | None = None
    n: int = 1
    parse: bool = True
    """Run the model's reasoning and tool parsers (``False``: raw text)."""
    thinking_budget: int | None = None
    """Most tokens the model may think before the server closes its think block
    (``None``: ``--thinking-token-budget``, by default no limit)."""
    priority: int | None = None
    """Where the request queues (lower first; ``None``: the API key's default, else 0)."""
    parallel_tool_calls: bool = True
    """``tool_choice: auto`` may make several calls."""
    cache_salt: str | None = None
    """vLLM's ``cache_salt``: the request reuses only prefixes computed with the same salt
    (and the same API key or cache group; :mod:`mlxcore.engine.cache_partition`)."""


@attrs.frozen
class Prompt:
    """A prompt ready for the engine."""

    ids: list[int]
    text: str = ""
    checkpoints: tuple[int, ...] = ()
    boundaries: tuple[int, ...] = ()
    media: Any = None
    cache_key: tuple[int, ...] | None = None


@attrs.define
class Generation:
    """One generation as its front end sees it: the engine request, the output pipeline
    that turns its tokens into text, and what it has used so far."""

    request: GenerationRequest
    pipeline: OutputPipeline
    usage: Usage = attrs.field(factory=Usage)
    created_at: float = attrs.field(factory=time.perf_counter)
    first_token_at: float | None = None
    handle: RequestHandle | None = None
    generated: int = 0
    """Tokens generated so far (``usage`` is final only at the end)."""
    prompt_logprobs: list[StepToken] | None = None
    """Every prompt token's logprob after the first, once the prefill computed them (for
    a request with ``sampling.prompt_logprobs``)."""
    scored_by: Generation | None = None
    """The choice that scores this one's prompt (``n`` > 1 with prompt logprobs: the first
    choice computes them once; the others reuse its prefill and its logprobs)."""
    scored: asyncio.Event = attrs.field(factory=asyncio.Event)
    """Set once this generation's prompt logprobs arrived or its stream ended."""

    async def prompt_scores(self) -> list[StepToken] | None:
        """The prompt logprobs of this choice (its own, or its first sibling's), waiting
        for them to be computed; ``None`` when the scoring generation ended without."""
        source = self.scored_by or self
        await source.scored.wait()
        return source.prompt_logprobs


# -- prompts -------------------------------------------------------------------


def check_prompt_size(rt: Runtime, chars: int, field: str = "messages") -> None:
    """Refuse a prompt of ``chars`` characters that cannot fit the context whatever it
    tokenizes to, before spending time on it."""
    limit = rt.engine.max_context
    if limit is not None and chars > limit * MAX_CHARS_PER_TOKEN:
        raise RequestRejected(
            f"the prompt ({chars} characters) is far longer than the model's context of "
            f"{limit} tokens",
            field,
            CONTEXT_CODE,
        )


def encode(rt: Runtime, text: str, field: str = "prompt") -> list[int]:
    """Tokenize raw text (completions), after the size check."""
    check_prompt_size(rt, len(text), field)
    ids: list[int] = rt.tokenizer.encode(text)
    return ids


def check_chat_size(rt: Runtime, prompt: ChatPrompt) -> None:
    """:func:`check_prompt_size` for a chat prompt's messages and tools."""
    try:
        check_prompt_size(rt, _text_size(prompt.messages) + _text_size(prompt.tools))
    except RecursionError:
        raise rejected("the messages are nested too deeply", "messages") from None


def render_prompt(rt: Runtime, prompt: ChatPrompt) -> RenderedPrompt:
    """Render and tokenize a chat prompt; a template that refuses the messages is a
    request error on ``messages``."""
    check_chat_size(rt, prompt)
    try:
        kwargs = dict(prompt.template_kwargs)
        return render_chat(rt.tokenizer, prompt.messages, tools=prompt.tools, **kwargs)
    except RequestRejected:
        raise
    except Exception as exc:
        raise rejected(
            f"the chat template could not render these messages: {exc}", "messages"
        ) from None


def prepare_prompt(
    rt: Runtime, prompt: ChatPrompt | TextPrompt, options: Mapping[str, Any]
) -> Prompt:
    """Render and tokenize ``prompt`` (and expand its media parts with ``options``)."""
    if isinstance(prompt, TextPrompt):
        if prompt.ids is not None:
            vocab = len(rt.tokenizer)
            if any(not 0 <= t < vocab for t in prompt.ids):
                raise rejected("prompt token ids must be inside the vocabulary", prompt.field)
            ids = list(prompt.ids)
        else:
            ids = encode(rt, prompt.text or "", prompt.field)
        if not ids:
            raise rejected("prompt must not be empty", prompt.field)
        return Prompt(ids)
    rendered = render_prompt(rt, prompt)
    if not prompt.media_parts:
        return Prompt(rendered.ids, rendered.text, rendered.checkpoints(), rendered.boundaries)
    media = rt.media
    assert media is not None, "media parts are only collected when the model has a handler"
    prepared = media.prepare(rendered.text, prompt.media_parts, options)
    key = None if prepared.cache_key is None else tuple(prepared.cache_key)
    return Prompt(prepared.ids, rendered.text, (), (), prepared.payload, key)


def with_server_defaults(rt: Runtime, prompt: ChatPrompt) -> ChatPrompt:
    """``prompt`` with the server's default template variables under its own
    (``--default-chat-template-kwargs``), and its tools dropped (with a warning, or an
    error under ``--refuse-unrenderable-tools``) when the template cannot show tools."""
    defaults = rt.config.default_chat_template_kwargs
    if defaults:
        prompt = attrs.evolve(prompt, template_kwargs={**defaults, **prompt.template_kwargs})
    if prompt.tools and not rt.info.template_mentions("tools"):
        if rt.config.refuse_unrenderable_tools:
            raise rejected("this model's chat template cannot show tools to the model", "tools")
        warn_once(
            "unrenderable-tools",
            "a request has %d tools but the model's chat template does not render tools; "
            "serving it without them (--refuse-unrenderable-tools makes this a 400)",
            len(prompt.tools),
        )
        prompt = attrs.evolve(prompt, tools=None)
    return prompt


# -- options, budget, constraint ----------------------------------------------------


def validated_options(rt: Runtime, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` after every plugin checked its own keys (a plugin's
    :class:`OptionError` becomes a request error naming the field); fields no plugin
    declared are logged once and ignored."""
    try:
        rt.hooks.validate_options(options, rt.config)
    except OptionError as exc:
        raise rejected(str(exc), exc.field) from None
    known = rt.request_options()
    for name in options:
        if name not in known and name not in RESERVED_OPTIONS:
            warn_once(
                f"unknown-field:{name}",
                "request field %r is not known to this server or its plugins; it is ignored",
                name,
            )
    return options


def generation_budget(
    value: int | None,
    default: int,
    limit: int | None,
    field: str = "max_tokens",
    *,
    prompt_len: int = 0,
    prompt_field: str = "messages",
    cap: bool = False,
) -> int:
    """The generation budget, checked against the context ``limit`` left after the prompt.

    Without a value the default is cut to the room left; a value below 1, or beyond that
    room, is refused (``field`` is the one the client used). A prompt that fills the
    context by itself is refused naming ``prompt_field``. With ``cap`` a value beyond the
    room is cut to it (an API whose limit is a required upper bound, not a request).
    """
    room = None if limit is None else limit - prompt_len
    if room is not None and room < 1:
        raise RequestRejected(
            f"the prompt ({prompt_len} tokens) fills the model's context of {limit} tokens",
            prompt_field,
            CONTEXT_CODE,
        )
    if value is None:
        return default if room is None else min(default, room)
    if value < 1:
        raise rejected(f"{field} must be at least 1", field)
    if cap and room is not None:
        return min(value, room)
    if room is not None and value > room:
        raise RequestRejected(
            f"{field} {value} plus the prompt's {prompt_len} tokens exceeds the model's "
            f"context of {limit} tokens",
            field,
            CONTEXT_CODE,
        )
    return value


def token_budget(rt: Runtime, spec: RequestSpec, prompt: Prompt) -> int:
    """The tokens ``spec`` may generate after ``prompt``; raises the 400 when the prompt
    leaves no room in the context."""
    prompt_field = spec.prompt.field if isinstance(spec.prompt, TextPrompt) else "messages"
    return generation_budget(
        spec.max_tokens,
        spec.default_max_tokens,
        rt.engine.max_context,
        spec.max_tokens_field,
        prompt_len=len(prompt.ids),
        prompt_field=prompt_field,
        cap=spec.cap_max_tokens,
    )


def with_tool_grammar(rt: Runtime, spec: RequestSpec) -> RequestSpec:
    """``spec`` with its tool calls constrained in the model's own format where the
    model's tool parser declares a grammar (:mod:`mlxcore.tool_grammar`)."""
    if not spec.parse or not isinstance(spec.prompt, ChatPrompt):
        return spec
    planned = tool_call_constraint(
        rt.parsers.tool,
        rt.tokenizer,
        spec.prompt.tools,
        spec.constraint,
        enabled=rt.config.tool_call_grammar == "on",
        parallel=spec.parallel_tool_calls,
        reasoning=rt.parsers.reasoning,
    )
    if planned is None:
        return spec
    constraint = OutputConstraint(
        planned.value, field=planned.field, lazy=planned.lazy, exit_marker=planned.exit_marker
    )
    return attrs.evolve(spec, constraint=constraint)


def reasoning_gate(rt: Runtime, prompt: ChatPrompt | TextPrompt, text: str) -> dict[str, str]:
    """Options that let a constraint hold whether or not the model thinks first: free
    until the think block closes when the rendered prompt opened one; else constrained
    from the first token, unless the output opens a block there. Empty without a
    reasoning parser, for raw prompts, or with thinking turned off."""
    parser = rt.parsers.reasoning
    if not isinstance(prompt, ChatPrompt) or parser is None:
        return {}
    if prompt.template_kwargs.get("enable_thinking") is False:
        return {}
    close = str(getattr(parser, "close_tag", "</think>"))
    if parser.prompt_opens_reasoning(text):
        return {structured.START_AFTER_OPTION: close}
    opener = str(getattr(parser, "open_tag", "<think>"))
    return {structured.START_AFTER_OPTION: close, structured.MAY_OPEN_OPTION: opener}


def thinking_options(
    rt: Runtime,
    prompt: ChatPrompt | TextPrompt,
    text: str,
    budget: int | None,
    *,
    constrained: bool = False,
) -> dict[str, Any]:
    """The engine option that holds the thinking ``budget`` (the server's when
    ``None``): empty without a budget, for raw prompts, or for a model whose reasoning
    parser has no tags to close. With an output constraint (``constrained``) only the
    closing tag is forced: the constraint starts right after it."""
    if budget is None:
        budget = rt.config.thinking_token_budget
    markers = rt.thinking_markers()
    if budget is None or markers is None or not isinstance(prompt, ChatPrompt):
        return {}
    parser = rt.parsers.reasoning
    opened = parser is not None and parser.prompt_opens_reasoning(text)
    plan = thinking.ThinkingBudget(budget, markers, opened, tag_only=constrained)
    return {thinking.OPTION: plan}


def check_constraint(
    rt: Runtime, request: GenerationRequest, field: str = "response_format"
) -> None:
    """Check ``request`` against the model and compile its output constraint here (a
    schema llguidance cannot compile is a request error naming ``field``, not a failure
    on the engine thread)."""
    check_request(request, rt.engine.limits)
    constraint = request.options.get(structured.OPTION)
    if constraint is not None:
        try:
            structured.prepare(rt.tokenizer, constraint)
        except structured.ConstraintError as exc:
            raise RequestRejected(str(exc), field, structured.CONSTRAINT_CODE) from None


def output_pipeline(rt: Runtime, spec: RequestSpec, prompt_text: str) -> OutputPipeline:
    """A fresh output pipeline for one choice of ``spec`` (see :meth:`Runtime.pipeline`):
    its stop strings checked with the same limits for every front end, the model's
    parsers unless the spec asks for raw text, a forced tool's own parser."""
    factory = spec.constraint.tool_parser if spec.constraint else None
    return rt.pipeline(
        stops=check_stops(spec.stops, spec.stops_field),
        tools=spec.prompt.tools if isinstance(spec.prompt, ChatPrompt) else None,
        prompt_text=prompt_text,
        parse=spec.parse,
        tool_parser=factory() if factory else None,
    )


# -- the builder -------------------------------------------------------------------


def prepared_prompt(rt: Runtime, spec: RequestSpec) -> tuple[RequestSpec, dict[str, Any], Prompt]:
    """``spec`` with the server's defaults, its plugin options checked, and its prompt
    rendered and tokenized: what a generation starts from, and what a router's render
    endpoint answers. Raises the 400s a generation of it would (the context included)."""
    if isinstance(spec.prompt, ChatPrompt):
        spec = attrs.evolve(spec, prompt=with_server_defaults(rt, spec.prompt))
    extras = {k: v for k, v in spec.extras.items() if k not in RESERVED_OPTIONS}
    plugin_options = validated_options(rt, extras)
    prompt = prepare_prompt(rt, spec.prompt, plugin_options)
    if prompt.media is not None and spec.sampling.prompt_logprobs is not None:
        raise rejected("prompt logprobs are not computed for prompts with media", "prompt_logprobs")
    return spec, plugin_options, prompt


def build_generations(rt: Runtime, spec: RequestSpec) -> list[Generation]:
    """One :class:`Generation` per choice of ``spec`` (blocking: rendering and
    tokenizing take a while; the server runs it on its preparation pool)."""
    spec, plugin_options, prompt = prepared_prompt(rt, spec)
    spec = with_tool_grammar(rt, spec)
    budget = token_budget(rt, spec, prompt)
    options = dict(plugin_options)
    if spec.constraint is not None:
        options[structured.OPTION] = spec.constraint.value
        options.update(reasoning_gate(rt, spec.prompt, prompt.text))
        if spec.constraint.exit_marker is not None:
            options[structured.EXIT_OPTION] = spec.constraint.exit_marker
    options.update(
        thinking_options(
            rt,
            spec.prompt,
            prompt.text,
            spec.thinking_budget,
            constrained=spec.constraint is not None and not spec.constraint.lazy,
        )
    )
    gens: list[Generation] = []
    for i in range(spec.n):
        sampling = spec.sampling
        if i and sampling.prompt_logprobs is not None:
            # the first choice scores the prompt once; the others park behind its prefill
            # (engine/parking.py) and share its logprobs (Generation.prompt_scores)
            sampling = attrs.evolve(sampling, prompt_logprobs=None)
        if spec.constraint is not None and not spec.constraint.lazy and sampling.ignore_eos:
            # the constraint's end is the output's end (its matcher takes nothing after)
            sampling = attrs.evolve(sampling, ignore_eos=False)
        if i and sampling.seed is not None:  # each choice its own, reproducible, stream
            sampling = attrs.evolve(sampling, seed=(sampling.seed + i) & (2**64 - 1))
        request = GenerationRequest(
            prompt_tokens=tuple(prompt.ids),
            checkpoints=prompt.checkpoints,
            boundaries=prompt.boundaries,
            stop_token_ids=frozenset(spec.stop_token_ids),
            max_tokens=budget,
            sampling=sampling,
            options=options,
            request_id=spec.new_id(),
            media=prompt.media,
            cache_key=prompt.cache_key,
            priority=spec.priority,
            cache_salt=spec.cache_salt,
        )
        check_constraint(
            rt, request, spec.constraint.field if spec.constraint else "response_format"
        )
        gen = Generation(request, output_pipeline(rt, spec, prompt.text))
        if i and spec.sampling.prompt_logprobs is not None:
            gen.scored_by = gens[0]
        gens.append(gen)
    return gens


def _text_size(value: Any) -> int:
    """Characters of text in a JSON-like value (strings counted, structure ignored)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(_text_size(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_text_size(v) for v in value)
    return 0

"""One request builder for every front end.

A front end (OpenAI chat, OpenAI completions, Anthropic Messages, the next one)
checks the fields only its API has, then describes the request in API-neutral
terms, a :class:`RequestSpec`, and :func:`build_generations` does the rest the
same way for all of them, on the service's preparation pool:

1. the plugins check their per-request options (``mlxcore_validate_options``);
2. the prompt is rendered with the chat template and tokenized once (or the raw
   text is tokenized), and media parts are expanded by the model's media handler;
3. the generation budget is checked against the context left after the prompt;
4. a constraint (``response_format``, a forced tool choice) becomes engine options,
   starting after the reasoning when the model thinks first; its grammar is
   compiled here, never on the engine thread (:meth:`GenerationService.validate`);
5. one :class:`GenerationRequest` and output pipeline per choice (``n``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from mlxcore import structured
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.media import MediaPart
from mlxcore.parsers.base import ToolParser
from mlxcore.server.errors import APIError, invalid
from mlxcore.server.frontend import validated_options, warn_once
from mlxcore.server.service import RESERVED_OPTIONS, Generation, GenerationService

"""Engine options only the builder sets (never taken from a client's body)."""


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
class Constraint:
    """What the output must match (a compiled-on-preparation grammar source), and for a
    forced tool choice a factory of the parser that reads the constrained output."""

    value: Any
    tool_parser: Callable[[], ToolParser] | None = None


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
    constraint: Constraint | None = None
    n: int = 1
    parse: bool = True
    """Run the model's reasoning and tool parsers (``False``: raw text)."""


@attrs.frozen
class Prompt:
    """A prompt ready for the engine."""

    ids: list[int]
    text: str = ""
    checkpoints: tuple[int, ...] = ()
    boundaries: tuple[int, ...] = ()
    media: Any = None
    cache_key: tuple[int, ...] | None = None


def prepare_prompt(
    svc: GenerationService, prompt: ChatPrompt | TextPrompt, options: Mapping[str, Any]
) -> Prompt:
    """Render and tokenize ``prompt`` (and expand its media parts with ``options``)."""
    if isinstance(prompt, TextPrompt):
        if prompt.ids is not None:
            vocab = len(svc.runtime.tokenizer)
            if any(not 0 <= t < vocab for t in prompt.ids):
                raise invalid("prompt token ids must be inside the vocabulary", prompt.field)
            ids = list(prompt.ids)
        else:
            ids = svc.encode(prompt.text or "")
        if not ids:
            raise invalid("prompt must not be empty", prompt.field)
        return Prompt(ids)
    rendered = svc.chat_prompt(prompt.messages, prompt.tools, prompt.template_kwargs)
    if not prompt.media_parts:
        return Prompt(rendered.ids, rendered.text, rendered.checkpoints(), rendered.boundaries)
    media = svc.runtime.media
    assert media is not None, "media parts are only collected when the model has a handler"
    prepared = media.prepare(rendered.text, prompt.media_parts, options)
    key = None if prepared.cache_key is None else tuple(prepared.cache_key)
    return Prompt(prepared.ids, rendered.text, (), (), prepared.payload, key)


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
        raise APIError(
            400,
            f"the prompt ({prompt_len} tokens) fills the model's context of {limit} tokens",
            param=prompt_field,
            code="context_length_exceeded",
        )
    if value is None:
        return default if room is None else min(default, room)
    if value < 1:
        raise invalid(f"{field} must be at least 1", field)
    if cap and room is not None:
        return min(value, room)
    if room is not None and value > room:
        raise invalid(
            f"{field} {value} plus the prompt's {prompt_len} tokens exceeds the model's "
            f"context of {limit} tokens",
            field,
        )
    return value


def reasoning_gate(
    svc: GenerationService, prompt: ChatPrompt | TextPrompt, text: str
) -> dict[str, str]:
    """Options that let a constraint hold whether or not the model thinks first: free
    until the think block closes when the rendered prompt opened one; else constrained
    from the first token, unless the output opens a block there. Empty without a
    reasoning parser, for raw prompts, or with thinking turned off."""
    parser = svc.runtime.parsers.reasoning
    if not isinstance(prompt, ChatPrompt) or parser is None:
        return {}
    if prompt.template_kwargs.get("enable_thinking") is False:
        return {}
    close = str(getattr(parser, "close_tag", "</think>"))
    if parser.prompt_opens_reasoning(text):
        return {structured.START_AFTER_OPTION: close}
    opener = str(getattr(parser, "open_tag", "<think>"))
    return {structured.START_AFTER_OPTION: close, structured.MAY_OPEN_OPTION: opener}


def with_server_defaults(svc: GenerationService, prompt: ChatPrompt) -> ChatPrompt:
    """``prompt`` with the server's default template variables under its own
    (``--default-chat-template-kwargs``), and its tools dropped (with a warning, or a
    400 under ``--refuse-unrenderable-tools``) when the template cannot show tools."""
    defaults = svc.config.default_chat_template_kwargs
    if defaults:
        prompt = attrs.evolve(prompt, template_kwargs={**defaults, **prompt.template_kwargs})
    if prompt.tools and not svc.runtime.info.template_mentions("tools"):
        if svc.config.refuse_unrenderable_tools:
            raise invalid("this model's chat template cannot show tools to the model", "tools")
        warn_once(
            "unrenderable-tools",
            "a request has %d tools but the model's chat template does not render tools; "
            "serving it without them (--refuse-unrenderable-tools makes this a 400)",
            len(prompt.tools),
        )
        prompt = attrs.evolve(prompt, tools=None)
    return prompt


def build_generations(svc: GenerationService, spec: RequestSpec) -> list[Generation]:
    """Prepare one :class:`Generation` per choice of ``spec`` (runs on the preparation
    pool: see :meth:`GenerationService.prepare`)."""
    if isinstance(spec.prompt, ChatPrompt):
        spec = attrs.evolve(spec, prompt=with_server_defaults(svc, spec.prompt))
    extras = {k: v for k, v in spec.extras.items() if k not in RESERVED_OPTIONS}
    plugin_options = validated_options(svc, extras)
    prompt = prepare_prompt(svc, spec.prompt, plugin_options)
    prompt_field = spec.prompt.field if isinstance(spec.prompt, TextPrompt) else "messages"
    budget = generation_budget(
        spec.max_tokens,
        spec.default_max_tokens,
        svc.context_length,
        spec.max_tokens_field,
        prompt_len=len(prompt.ids),
        prompt_field=prompt_field,
        cap=spec.cap_max_tokens,
    )
    options = dict(plugin_options)
    if spec.constraint is not None:
        options[structured.OPTION] = spec.constraint.value
        options.update(reasoning_gate(svc, spec.prompt, prompt.text))
    tools = spec.prompt.tools if isinstance(spec.prompt, ChatPrompt) else None
    factory = spec.constraint.tool_parser if spec.constraint else None
    gens = []
    for i in range(spec.n):
        sampling = spec.sampling
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
        )
        svc.validate(request)
        pipeline = svc.pipeline(
            stops=spec.stops,
            stops_field=spec.stops_field,
            tools=tools,
            prompt_text=prompt.text,
            parse=spec.parse,
            tool_parser=factory() if factory else None,
        )
        gens.append(Generation(request, pipeline))
    return gens

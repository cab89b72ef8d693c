"""From Ollama requests to the engine's terms: options to sampling settings, messages to
chat-template messages, ``format`` to a constraint, ``think`` to the template switch.

Ollama's messages map one to one onto the OpenAI-style list the chat templates read
(``images`` become image parts for the vision plugin's media handler, ``thinking``
becomes ``reasoning_content``, ``tool_name`` names a tool result), so the OpenAI route's
normalisation does the rest: the same templates, the same prefix-cache behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from mlxcore import structured, thinking
from mlxcore.builtin.openai import convert as openai
from mlxcore.builtin.openai.schemas import Message as OpenAIMessage
from mlxcore.builtin.openai.schemas import SamplerFields
from mlxcore.engine.request import SamplingParams
from mlxcore.media import MediaHandler, MediaPart
from mlxcore.request_builder import OutputConstraint
from mlxcore.server.errors import APIError, constraint_error, invalid
from mlxcore_ollama.schemas import GenerationFields, Message

FLOAT_OPTIONS = ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                 "frequency_penalty")  # fmt: skip
INT_OPTIONS = ("top_k", "seed", "num_predict", "num_ctx")
IGNORED_OPTIONS = frozenset(
    {
        # how Ollama's runner uses the machine: MLX decides these itself
        "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
        "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep",
        # the repetition penalty's window and newline exemption (llama.cpp's)
        "repeat_last_n", "penalize_newline",
    }
)  # fmt: skip
"""Options Ollama defines that change nothing here: accepted and ignored."""
NEUTRAL_OPTIONS: dict[str, float] = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0}
"""Samplers mlxcore does not have: accepted only at the value that turns them off."""
MIROSTAT_TUNING = frozenset({"mirostat_tau", "mirostat_eta"})
OPENAI_NAMES = {"repetition_penalty": "repeat_penalty"}
"""Sampling settings Ollama names differently from OpenAI."""
NO_LIMIT = 2**31 - 1
"""``num_predict`` -1 or -2: as many tokens as the context leaves."""
ROLES = ("system", "user", "assistant", "tool")


@attrs.frozen
class Options:
    """A request's ``options`` in the engine's terms."""

    sampling: SamplingParams
    max_tokens: int | None
    stops: list[str]
    num_ctx: int | None
    extras: dict[str, Any]
    """Options Ollama does not define: plugins' per-request options, as the other front
    ends' body fields outside their schema."""


def _number(name: str, value: Any, kind: type) -> Any:
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON does not tell 1 from 1.0
    ok = isinstance(value, kind | int) if kind is float else isinstance(value, int)
    if not ok or isinstance(value, bool):
        what = "a number" if kind is float else "an integer"
        raise invalid(f"option {name} must be {what}, got {value!r}", f"options.{name}")
    return value


def _stops(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise invalid("option stop must be a string or a list of strings", "options.stop")


def options(body: GenerationFields, vocab_size: int, context: int | None) -> Options:
    """Check ``body.options`` and turn them into sampling settings, a token budget and
    stop strings; a wrong type or range is a 400 naming ``options.NAME``."""
    given = dict(body.options or {})
    values: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for name, value in given.items():
        if name in FLOAT_OPTIONS:
            values[name] = float(_number(name, value, float))
        elif name in INT_OPTIONS:
            values[name] = _number(name, value, int)
        elif name == "stop":
            values[name] = _stops(value)
        elif name in NEUTRAL_OPTIONS:
            off = NEUTRAL_OPTIONS[name]
            if _number(name, value, float) != off:
                raise invalid(
                    f"option {name} is not supported (only {off:g}, which turns it off)",
                    f"options.{name}",
                )
        elif name not in IGNORED_OPTIONS and name not in MIROSTAT_TUNING:
            extras[name] = value
    sampler = SamplerFields(
        temperature=values.get("temperature"),
        top_p=values.get("top_p"),
        top_k=values.get("top_k"),
        min_p=values.get("min_p"),
        repetition_penalty=values.get("repeat_penalty"),
        presence_penalty=values.get("presence_penalty"),
        frequency_penalty=values.get("frequency_penalty"),
        seed=values.get("seed"),
    )
    try:
        sampling = openai.sampling_params(
            sampler,
            vocab_size=vocab_size,
            logprobs=bool(body.logprobs),
            top_logprobs=body.top_logprobs or 0,
        )
    except APIError as exc:  # named as OpenAI's fields: say which option it was
        name = OPENAI_NAMES.get(exc.param or "", exc.param)
        raise invalid(f"option {name}: {exc.message}", f"options.{name}") from None
    predict = values.get("num_predict")
    if predict is not None and predict in (-1, -2):
        predict = NO_LIMIT
    elif predict is not None and predict < 1:
        raise invalid(
            "option num_predict must be at least 1, or -1 (no limit) or -2 (fill the context)",
            "options.num_predict",
        )
    num_ctx = values.get("num_ctx")
    if num_ctx is not None and (num_ctx < 1 or (context is not None and num_ctx > context)):
        raise invalid(
            f"option num_ctx must be between 1 and the model's context of {context} tokens",
            "options.num_ctx",
        )
    return Options(sampling, predict, values.get("stop", []), num_ctx, extras)


def template_messages(
    messages: list[Message], media: MediaHandler | None
) -> tuple[list[dict[str, Any]], list[MediaPart]]:
    """Ollama messages as chat-template messages, and their images for the media handler."""
    converted = []
    for i, msg in enumerate(messages):
        if msg.role not in ROLES:
            raise invalid(f"unknown role {msg.role!r}", f"messages[{i}].role")
        content: Any = msg.content or ""
        if msg.images and media is None:
            raise invalid("this model does not take images", f"messages[{i}].images")
        if msg.images:  # the images first, then the text (as Ollama renders them)
            content = [
                _image(image, f"messages[{i}].images[{j}]") for j, image in enumerate(msg.images)
            ]
            if msg.content:
                content.append({"type": "text", "text": msg.content})
        converted.append(
            OpenAIMessage(
                role=msg.role,
                content=content,
                name=msg.tool_name if msg.role == "tool" else None,
                tool_calls=_calls(msg.tool_calls, i),
                reasoning_content=msg.thinking or None,
            )
        )
    return openai.normalize_chat(converted, media)


def _image(image: str, where: str) -> dict[str, Any]:
    if not isinstance(image, str) or not image:
        raise invalid("an image must be base64 text", where)
    return {"type": "image_url", "image_url": {"url": f"data:image;base64,{image}"}}


def _calls(calls: list[dict[str, Any]] | None, index: int) -> list[dict[str, Any]] | None:
    """An assistant message's tool calls in the OpenAI shape (Ollama's carry no id and
    their arguments as an object)."""
    if not calls:
        return None
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            raise invalid("a tool call needs a function", f"messages[{index}].tool_calls[{j}]")
        if not isinstance(fn.get("arguments", {}), Mapping):
            at = f"messages[{index}].tool_calls[{j}].function.arguments"
            raise invalid("tool call arguments must be an object", at)
        out.append({"type": "function", "function": dict(fn)})
    return out


def check_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The request's tools, each ``{type: function, function: {name, ...}}``."""
    openai.check_tools(tools)
    return tools or None


def constraint(fmt: str | dict[str, Any] | None) -> OutputConstraint | None:
    """What ``format`` requires of the output: ``"json"`` any JSON object, an object
    a JSON schema, ``""`` or nothing no constraint."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        response_format: dict[str, Any] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        response_format = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    else:
        raise invalid('format must be "json" or a JSON schema object', "format")
    try:
        value = structured.from_response_format(response_format)
    except structured.ConstraintError as exc:
        raise constraint_error(f"format: {exc}", "format") from None
    return None if value is None else OutputConstraint(value, field="format")


def think(value: bool | str | None) -> tuple[bool | None, int | None]:
    """``think`` as the template's ``enable_thinking`` (``None``: the server's default)
    and a thinking budget for an effort (``"low"``, ``"medium"``, ``"high"``)."""
    if value is None or isinstance(value, bool):
        return value, None
    try:
        return True, thinking.effort_budget(value)
    except ValueError:
        raise invalid('think must be true, false, "low", "medium" or "high"', "think") from None

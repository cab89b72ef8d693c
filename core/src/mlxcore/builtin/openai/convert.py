"""From OpenAI request bodies to engine requests: validation, sampling, messages.

Every value that cannot be honoured is refused with a 400 naming the field.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from mlxcore import structured, thinking
from mlxcore.builtin.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    Message,
    SamplerFields,
)
from mlxcore.engine.request import SamplingParams
from mlxcore.engine.validation import MAX_TOP_LOGPROBS
from mlxcore.media import MediaHandler, MediaPart
from mlxcore.request_builder import OutputConstraint
from mlxcore.server.errors import constraint_error, invalid

MAX_N = 16


def _range(name: str, value: float | None, low: float, high: float) -> None:
    if value is not None and not (low <= value <= high):
        raise invalid(f"{name} must be between {low} and {high}, got {value}", name)


def sampling_params(
    body: SamplerFields,
    *,
    vocab_size: int,
    logprobs: bool,
    top_logprobs: int,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """Validate the sampling fields and build :class:`SamplingParams`."""
    _range("temperature", body.temperature, 0.0, 2.0)
    _range("top_p", body.top_p, 0.0, 1.0)
    _range("min_p", body.min_p, 0.0, 1.0)
    _range("presence_penalty", body.presence_penalty, -2.0, 2.0)
    _range("frequency_penalty", body.frequency_penalty, -2.0, 2.0)
    _range("repetition_penalty", body.repetition_penalty, 0.01, 10.0)
    if body.top_p is not None and body.top_p == 0.0:
        raise invalid("top_p must be greater than 0", "top_p")
    top_k = body.top_k or 0
    if top_k < -1:
        raise invalid("top_k must be -1 (off), 0 (off) or a positive integer", "top_k")
    if top_k >= vocab_size:
        top_k = 0  # keeping every token is no top-k at all (the sampler refuses k >= vocab)
    _range("top_logprobs", top_logprobs, 0, MAX_TOP_LOGPROBS)
    if body.n < 1 or body.n > MAX_N:
        raise invalid(f"n must be between 1 and {MAX_N}", "n")
    bias: dict[int, float] | None = None
    if body.logit_bias:
        bias = {}
        for key, value in body.logit_bias.items():
            try:
                token = int(key)
            except ValueError:
                raise invalid(f"logit_bias key {key!r} is not a token id", "logit_bias") from None
            if not 0 <= token < vocab_size:
                raise invalid(f"logit_bias token {token} is outside the vocabulary", "logit_bias")
            _range("logit_bias", value, -100.0, 100.0)
            bias[token] = value
    seed = None
    if body.seed is not None:
        if not -(2**63) <= body.seed < 2**64:
            raise invalid("seed must fit in 64 bits", "seed")
        seed = body.seed & (2**64 - 1)
    least = getattr(body, "min_tokens", 0)  # vLLM's extras (chat and completions)
    if not isinstance(least, int) or least < 0:
        raise invalid("min_tokens must be 0 or more", "min_tokens")
    return SamplingParams(
        min_tokens=least,
        ignore_eos=bool(getattr(body, "ignore_eos", False)),
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(top_k, 0),
        min_p=body.min_p or 0.0,
        repetition_penalty=body.repetition_penalty,
        presence_penalty=body.presence_penalty or None,
        frequency_penalty=body.frequency_penalty or None,
        logit_bias=bias,
        seed=seed,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        top_logprobs=top_logprobs,
    )


def stop_list(stop: str | list[str] | None) -> list[str]:
    """The request's stop strings as a list (checked with every route's limits by
    :meth:`GenerationService.pipeline`)."""
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def text_of(content: str | list[dict[str, Any]] | None, where: str) -> str:
    """The text of a message's content (text parts joined; any other part is a 400)."""
    text = message_content(content, where, None, [])
    assert isinstance(text, str)
    return text


def message_content(
    content: str | list[dict[str, Any]] | None,
    where: str,
    media: MediaHandler | None,
    parts: list[MediaPart],
) -> str | list[dict[str, Any]]:
    """The message content for the template: text, or (when it holds media parts the
    ``media`` handler accepts) a list of text parts and placeholders; the media parts
    are appended to ``parts`` in order."""
    if content is None or isinstance(content, str):
        return content or ""
    pieces: list[dict[str, Any]] = []
    has_media = False
    for i, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise invalid("a content part must be an object", f"{where}.content[{i}]")
        kind = part.get("type")
        if not isinstance(kind, str):
            raise invalid("a content part needs a type", f"{where}.content[{i}].type")
        if kind in ("text", "input_text", "output_text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise invalid(f"content part {i} has no text", f"{where}.content[{i}].text")
            pieces.append({"type": "text", "text": text})
        elif media is not None and kind in media.part_types:
            parts.append(MediaPart(part, f"{where}.content[{i}]"))
            pieces.append(media.placeholder(part))
            has_media = True
        else:
            what = "this model" if media is not None else "this text-only model"
            raise invalid(
                f"content part type {kind!r} is not supported by {what}",
                f"{where}.content[{i}].type",
            )
    if has_media:
        return pieces
    texts = [p["text"] for p in pieces]
    return "\n".join(texts) if len(texts) > 1 else "".join(texts)


def _tool_calls(calls: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Assistant tool calls for the template, with arguments as a mapping."""
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise invalid("a tool call needs function.name", f"{where}.tool_calls[{i}]")
        if call.get("type", "function") != "function":
            raise invalid("a tool call's type must be function", f"{where}.tool_calls[{i}].type")
        if not isinstance(call.get("id"), str | None):
            raise invalid("a tool call's id must be a string", f"{where}.tool_calls[{i}].id")
        args: Any = fn.get("arguments", "{}")
        if not isinstance(args, str | Mapping):
            at = f"{where}.tool_calls[{i}].function.arguments"
            raise invalid("tool call arguments must be a JSON string or an object", at)
        if isinstance(args, str):
            with contextlib.suppress(json.JSONDecodeError):
                args = json.loads(args) if args.strip() else {}
        out.append(
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": fn["name"], "arguments": args},
            }
        )
    return out


def normalize_chat(
    messages: list[Message], media: MediaHandler | None
) -> tuple[list[dict[str, Any]], list[MediaPart]]:
    """Messages as chat templates expect them, and their media parts.

    ``developer`` becomes ``system``; the system messages before the first other message
    become one. Later system messages and consecutive user messages stay where they are:
    the conversation already sent must render the same way next turn (the prefix cache
    depends on it); :func:`mlxcore.prompts.render_chat` rearranges only when the
    model's template cannot render them. Without a media handler (``media`` is
    ``None``) content-part lists are flattened to text and a media part is refused;
    with one, user, assistant and tool messages may hold the parts ``media`` accepts:
    they are replaced by the handler's placeholders for the template and returned in
    prompt order."""
    parts: list[MediaPart] = []
    if not messages:
        raise invalid("messages must not be empty", "messages")
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        role = "system" if msg.role == "developer" else msg.role
        if role not in ROLES:
            raise invalid(f"unknown role {msg.role!r}", f"{where}.role")
        calls = _tool_calls(msg.tool_calls, where) if msg.tool_calls else None  # any role
        if role == "system":
            if media is not None and isinstance(msg.content, list):
                for j, part in enumerate(msg.content):
                    if isinstance(part, Mapping) and str(part.get("type")) in media.part_types:
                        raise invalid(
                            "system messages cannot contain media", f"{where}.content[{j}]"
                        )
            instruction = text_of(msg.content, where)
            if out:
                out.append({"role": "system", "content": instruction})
            else:
                system.append(instruction)
            continue
        text = message_content(msg.content, where, media, parts)
        item: dict[str, Any] = {"role": "tool" if role == "function" else role, "content": text}
        if msg.name is not None:
            item["name"] = msg.name
        if calls:
            item["tool_calls"] = calls
        if msg.tool_call_id is not None:
            item["tool_call_id"] = msg.tool_call_id
        thinking = msg.reasoning_content or msg.reasoning
        if thinking:
            item["reasoning_content"] = thinking
        out.append(item)
    if system:
        out.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return out, parts


def thinking_budget(body: ChatCompletionRequest) -> int | None:
    """The request's thinking budget: the first of ``thinking_token_budget``,
    ``reasoning_max_tokens`` and ``thinking_budget`` given, else what
    ``reasoning_effort`` stands for (``None``: the server's default)."""
    for name in thinking.BUDGET_FIELDS:
        value = getattr(body, name)
        if value is not None:
            return int(value)
    return thinking.effort_budget(body.reasoning_effort)


def check_chat_fields(body: ChatCompletionRequest) -> None:
    """Refuse chat fields this server cannot honour, naming them."""
    choice = body.tool_choice
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise invalid(f"tool_choice {choice!r} is not one of none, auto, required", "tool_choice")
    if body.chat_template_kwargs and "chat_template" in body.chat_template_kwargs:
        # A template from the request would run on the server: a loop in it stalls the
        # event loop for everyone (vLLM refuses these unless told to trust requests).
        raise invalid(
            "a chat template in the request is not accepted; the model's template is used",
            "chat_template_kwargs.chat_template",
        )
    check_tools(body.tools)


def check_tools(tools: list[dict[str, Any]] | None) -> None:
    """Refuse tools that are not ``{type: function, function: {name, ...}}``, naming the
    tool (the chat routes of every front end take tools in this shape)."""
    for i, tool in enumerate(tools or []):
        fn = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(fn, Mapping):
            raise invalid("each tool must be {type: function, function: {...}}", f"tools[{i}]")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise invalid("a tool function needs a name", f"tools[{i}].function.name")
        if not isinstance(fn.get("description", ""), str | None):
            raise invalid(
                "a tool's description must be a string", f"tools[{i}].function.description"
            )
        if not isinstance(fn.get("parameters", {}), Mapping | None):
            raise invalid(
                "a tool's parameters must be a JSON Schema object",
                f"tools[{i}].function.parameters",
            )


def output_constraint(body: ChatCompletionRequest | CompletionRequest) -> OutputConstraint | None:
    """What ``response_format``, or vLLM's ``structured_outputs`` / ``guided_*`` fields,
    require of the output (one of them; both at once are refused)."""
    try:
        value = structured.from_response_format(body.response_format)
        requested = structured.structured_outputs_constraint(
            body.structured_outputs,
            guided_json=body.guided_json,
            guided_regex=body.guided_regex,
            guided_choice=body.guided_choice,
            guided_grammar=body.guided_grammar,
        )
    except structured.ConstraintError as exc:
        raise constraint_error(str(exc), exc.field or "response_format") from None
    if requested is None:
        return None if value is None else OutputConstraint(value)
    if value is not None:
        raise invalid(f"give response_format or {requested[1]}, not both", requested[1])
    return OutputConstraint(requested[0], field=requested[1])


def constraint(body: ChatCompletionRequest) -> OutputConstraint | None:
    """What ``tool_choice`` or :func:`output_constraint` require of the output, with, for
    a forced tool choice, a factory of the parser that reads the constrained output back
    (a forced tool choice wins over ``response_format``, as in vLLM)."""
    try:
        forced = structured.tool_choice_constraint(
            body.tools, body.tool_choice, parallel=body.parallel_tool_calls is not False
        )
    except structured.ConstraintError as exc:
        raise constraint_error(str(exc), exc.field or "tool_choice") from None
    if forced is None:
        return output_constraint(body)
    value = forced[0]
    tools, choice = list(body.tools or []), body.tool_choice
    parallel = body.parallel_tool_calls is not False
    if isinstance(choice, Mapping):
        name = choice["function"]["name"]
        return OutputConstraint(
            value,
            lambda: structured.ConstrainedToolCallParser(tools, mode="named", name=name),
            tool_mode="named",
            tool_name=name,
            parallel=False,
        )
    return OutputConstraint(
        value,
        lambda: structured.ConstrainedToolCallParser(tools, mode="required"),
        tool_mode="required",
        parallel=parallel,
    )

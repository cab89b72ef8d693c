"""From Anthropic Messages requests to chat-template messages and engine settings.

The chat templates speak the OpenAI-style message list (``system`` / ``user`` /
``assistant`` with ``tool_calls`` / ``tool``), so Anthropic content blocks are
mapped onto it: ``tool_result`` blocks become ``tool`` messages, ``tool_use``
blocks become assistant ``tool_calls``, ``thinking`` blocks become
``reasoning_content``, and ``image`` blocks (on a model with a media handler, e.g.
the ``vision`` plugin's) become the OpenAI ``image_url`` parts that handler reads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mlxcore.engine.request import SamplingParams
from mlxcore.media import MediaHandler, MediaPart
from mlxcore.server.errors import invalid
from mlxcore_anthropic.schemas import CountTokensRequest, Message, MessagesRequest, Tool


def _text(blocks: str | list[dict[str, Any]], where: str) -> str:
    """The text of a string or of a list of ``text`` blocks."""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        if kind != "text" or not isinstance(block.get("text"), str):
            raise invalid(f"expected a text block, got type {kind!r}", f"{where}[{i}]")
        parts.append(block["text"])
    return "\n".join(parts) if len(parts) > 1 else "".join(parts)


def system_text(system: str | list[dict[str, Any]] | None) -> str | None:
    """The system prompt as one string (``None`` when absent)."""
    if system is None:
        return None
    return _text(system, "system")


def _tool_result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return _text(content, f"{where}.content")
    raise invalid("tool_result content must be a string or text blocks", f"{where}.content")


def _image_part(block: dict[str, Any], at: str) -> dict[str, Any]:
    """An Anthropic image block as the equivalent OpenAI ``image_url`` part."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise invalid("an image block needs a source object", f"{at}.source")
    kind = source.get("type")
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not media_type.startswith("image/"):
            raise invalid("source.media_type must be an image type", f"{at}.source.media_type")
        if not isinstance(data, str) or not data:
            raise invalid("source.data must be base64 text", f"{at}.source.data")
        url = f"data:{media_type};base64,{data}"
    elif kind == "url":
        link = source.get("url")
        if not isinstance(link, str) or not link:
            raise invalid("source.url must be a URL", f"{at}.source.url")
        url = link
    else:
        raise invalid(f"image source type {kind!r} is not base64 or url", f"{at}.source.type")
    return {"type": "image_url", "image_url": {"url": url}}


class _UserContent:
    """The text and image blocks of one user message, in order."""

    def __init__(self, media: MediaHandler | None, parts: list[MediaPart]) -> None:
        self.media, self.parts = media, parts
        self.items: list[dict[str, Any]] = []
        self.has_media = False

    def text(self, text: str) -> None:
        self.items.append({"type": "text", "text": text})

    def image(self, block: dict[str, Any], at: str) -> None:
        part = _image_part(block, at)
        if self.media is None or part["type"] not in self.media.part_types:
            raise invalid("this model does not take images", f"{at}.type")
        self.parts.append(MediaPart(part, at))
        self.items.append(self.media.placeholder(part))
        self.has_media = True

    def message(self) -> dict[str, Any] | None:
        if not self.items:
            return None
        if not self.has_media:
            return {"role": "user", "content": "\n".join(i["text"] for i in self.items)}
        joined: list[dict[str, Any]] = []
        for item in self.items:  # adjacent texts joined with a newline, as without images
            if item["type"] == "text" and joined and joined[-1]["type"] == "text":
                joined[-1] = {"type": "text", "text": joined[-1]["text"] + "\n" + item["text"]}
            else:
                joined.append(item)
        return {"role": "user", "content": joined}


def _block_text(block: dict[str, Any], at: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid("a text block needs text", f"{at}.text")
    return text


def _user(
    message: Message, where: str, media: MediaHandler | None, parts: list[MediaPart]
) -> list[dict[str, Any]]:
    if isinstance(message.content, str) or not message.content:  # [] reads as ""
        return [{"role": "user", "content": message.content or ""}]
    out: list[dict[str, Any]] = []
    content = _UserContent(media, parts)
    for i, block in enumerate(message.content):
        kind = block.get("type")
        at = f"{where}.content[{i}]"
        if kind == "text":
            content.text(_block_text(block, at))
        elif kind == "image":
            content.image(block, at)
        elif kind == "tool_result":
            tool_id = block.get("tool_use_id")
            if not isinstance(tool_id, str):
                raise invalid("tool_result needs a tool_use_id", f"{at}.tool_use_id")
            text = _tool_result_text(block.get("content"), at)
            if block.get("is_error"):
                text = f"Error: {text}"
            out.append({"role": "tool", "tool_call_id": tool_id, "content": text})
        else:
            raise invalid(f"content block type {kind!r} is not supported here", f"{at}.type")
    user = content.message()
    if user is not None:
        out.append(user)
    return out


def _assistant(message: Message, where: str) -> dict[str, Any]:
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(message.content):
        kind = block.get("type")
        at = f"{where}.content[{i}]"
        if kind == "text":
            texts.append(_block_text(block, at))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            name = block.get("name")
            if not isinstance(name, str) or not name:
                raise invalid("tool_use needs a name", f"{at}.name")
            arguments = block.get("input", {})
            if not isinstance(arguments, dict):
                raise invalid("tool_use input must be an object", f"{at}.input")
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        else:
            raise invalid(f"content block type {kind!r} is not supported here", f"{at}.type")
    item: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        item["reasoning_content"] = "\n".join(thinking)
    if calls:
        item["tool_calls"] = calls
    return item


def chat_messages(
    body_messages: Sequence[Message],
    system: str | None,
    media: MediaHandler | None = None,
    parts: list[MediaPart] | None = None,
) -> list[dict[str, Any]]:
    """Anthropic messages as a chat-template message list.

    With a ``media`` handler, user ``image`` blocks become the handler's placeholders and
    their parts are appended to ``parts`` in prompt order; without one they are a 400.
    """
    parts = [] if parts is None else parts
    if not body_messages:
        raise invalid("messages must not be empty", "messages")
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for i, message in enumerate(body_messages):
        where = f"messages[{i}]"
        if message.role == "user":
            out.extend(_user(message, where, media, parts))
        elif message.role == "assistant":
            out.append(_assistant(message, where))
        elif message.role == "system":
            # Claude Code puts system reminders among the messages for models it does
            # not know; they stay in place (see mlxcore.prompts.arrangements)
            out.append({"role": "system", "content": _text(message.content, f"{where}.content")})
        else:
            raise invalid(
                f"role must be user, assistant or system, got {message.role!r}", f"{where}.role"
            )
    return out


def template_tools(tools: Sequence[Tool] | None) -> list[dict[str, Any]] | None:
    """Anthropic tool definitions in the OpenAI function form chat templates expect."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not tool.name:
            raise invalid("a tool needs a name", f"tools[{i}].name")
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema or {}}
        if tool.description:
            function["description"] = tool.description
        out.append({"type": "function", "function": function})
    return out


def sampling(body: MessagesRequest) -> SamplingParams:
    """Sampling settings; Anthropic's defaults (temperature 1) and ranges."""
    temperature = 1.0 if body.temperature is None else body.temperature
    if not 0.0 <= temperature <= 1.0:
        raise invalid("temperature must be between 0 and 1", "temperature")
    top_p = 1.0 if body.top_p is None else body.top_p
    if not 0.0 < top_p <= 1.0:
        raise invalid("top_p must be in (0, 1]", "top_p")
    top_k = body.top_k or 0
    if top_k < 0:
        raise invalid("top_k must be positive", "top_k")
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)


THINKING_ON = ("enabled", "adaptive")
"""``thinking.type`` values that turn the model's thinking on (``adaptive``: the model
decides how much to think; a local template has only on and off)."""


def thinking_enabled(body: MessagesRequest | CountTokensRequest) -> bool:
    """True when the request asks for extended (or adaptive) thinking."""
    return body.thinking is not None and body.thinking.type in THINKING_ON


def tool_input(arguments: str) -> dict[str, Any]:
    """A parsed tool call's JSON arguments as the ``input`` object."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"value": value}

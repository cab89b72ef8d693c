"""Responses API items: input items to chat-template messages, tools to template tools,
and the reasoning item's portable form.

An input is a string (one user message) or a list of items: messages (``input_text`` /
``output_text`` / ``input_image`` parts; roles user, assistant, system, developer),
``function_call`` and ``function_call_output`` items, ``reasoning`` items. They become
the OpenAI-style message list the chat templates read: a ``function_call`` joins the
assistant message before it as a ``tool_calls`` entry, a ``reasoning`` item becomes the
next assistant message's ``reasoning_content``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from mlxcore.builtin.openai import convert
from mlxcore.media import MediaHandler, MediaPart
from mlxcore.request_builder import warn_once
from mlxcore.server.errors import invalid

MESSAGE_ROLES = {"user", "assistant", "system", "developer"}
TEXT_PARTS = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}
REASONING_PREFIX = "mlxcore-reasoning:"
"""``encrypted_content`` of our reasoning items: the text, base64, readable back by us."""


def encode_reasoning(text: str) -> str:
    """The reasoning text in the form a client sends back (``encrypted_content``)."""
    return REASONING_PREFIX + base64.b64encode(text.encode()).decode()


def decode_reasoning(value: str) -> str | None:
    """The text of :func:`encode_reasoning`, or ``None`` for another server's blob."""
    if not value.startswith(REASONING_PREFIX):
        return None
    try:
        return base64.b64decode(value[len(REASONING_PREFIX) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def _chat_part(part: Any) -> Any:
    """A Responses content part under its Chat Completions name (others unchanged)."""
    if not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if not isinstance(kind, str):
        return part  # refused by the chat reader, naming the part
    if kind in TEXT_PARTS or kind == "refusal":
        return {"type": "text", "text": part.get("text", part.get("refusal"))}
    if kind == "input_image":
        return {"type": "image_url", "image_url": {"url": part.get("image_url")}}
    return part


def as_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` as a list of items (a string is one user message; an empty one, none)."""
    if isinstance(value, str):
        if not value:
            return []
        return [{"type": "message", "role": "user", "content": value}]
    items = list(value)
    if items and all(isinstance(i, Mapping) and i.get("type") == "reasoning" for i in items):
        raise invalid(
            "input holds only reasoning items: add a message or a function_call_output "
            "for the model to answer",
            "input",
        )
    return items


class _Messages:
    """Builds the message list, attaching calls and reasoning to assistant turns."""

    def __init__(self, media: MediaHandler | None, parts: list[MediaPart]) -> None:
        self.out: list[dict[str, Any]] = []
        self.media, self.parts = media, parts
        self.reasoning: list[str] = []

    def _assistant(self) -> dict[str, Any]:
        """The assistant message to extend: the last one, unless a user turn followed."""
        last = self.out[-1] if self.out else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant", "content": ""}
            self.out.append(last)
        if self.reasoning:
            last["reasoning_content"] = "\n".join(self.reasoning)
            self.reasoning = []
        return last

    def message(self, item: Mapping[str, Any], where: str) -> None:
        role = item.get("role")
        if not isinstance(role, str) or role not in MESSAGE_ROLES:
            raise invalid(
                f"role must be one of {', '.join(sorted(MESSAGE_ROLES))}, got {role!r}",
                f"{where}.role",
            )
        if item.get("content") is None:
            raise invalid("a message item needs content (a string or a list of parts)",
                          f"{where}.content")  # fmt: skip
        content = self._content(item["content"], where, media_ok=role == "user")
        if role == "assistant":
            target = self._assistant()
            if target["content"] or target.get("tool_calls"):
                target = {"role": "assistant", "content": ""}
                self.out.append(target)
            target["content"] = content
            return
        self.out.append({"role": "system" if role == "developer" else role, "content": content})

    def _content(self, content: Any, where: str, *, media_ok: bool) -> Any:
        """Content as the chat front end reads it (:func:`convert.message_content`):
        Responses' part types are first given their Chat Completions names."""
        if isinstance(content, list):
            content = [_chat_part(part) for part in content]
        elif content is not None and not isinstance(content, str):
            raise invalid("content must be a string or a list of parts", f"{where}.content")
        media = self.media if media_ok else None
        return convert.message_content(content, where, media, self.parts)

    def function_call(self, item: Mapping[str, Any], where: str) -> None:
        name, call_id = item.get("name"), item.get("call_id")
        if not isinstance(name, str) or not name:
            raise invalid("a function_call item needs a name", f"{where}.name")
        if not isinstance(call_id, str) or not call_id:
            raise invalid("a function_call item needs a call_id", f"{where}.call_id")
        arguments: Any = item.get("arguments", "")
        if not isinstance(arguments, str):
            raise invalid("function_call arguments must be a JSON string", f"{where}.arguments")
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            parsed = arguments
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}
        self._assistant().setdefault("tool_calls", []).append(call)

    def function_call_output(self, item: Mapping[str, Any], where: str) -> None:
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise invalid("a function_call_output item needs a call_id", f"{where}.call_id")
        output = item.get("output", "")
        if isinstance(output, list):
            output = self._content(output, where + ".output", media_ok=False)
        elif not isinstance(output, str):
            output = json.dumps(output)
        self.out.append({"role": "tool", "tool_call_id": call_id, "content": output})

    def reasoning_item(self, item: Mapping[str, Any], where: str) -> None:
        texts = [
            str(part.get("text", ""))
            for part in (item.get("content") or [])
            if isinstance(part, Mapping) and part.get("type") == "reasoning_text"
        ]
        if not texts and isinstance(item.get("encrypted_content"), str):
            decoded = decode_reasoning(item["encrypted_content"])
            texts = [decoded] if decoded else []
        if not texts:
            texts = [
                str(part.get("text", ""))
                for part in (item.get("summary") or [])
                if isinstance(part, Mapping)
            ]
        if not isinstance(item.get("summary", []), list):
            raise invalid("a reasoning item's summary must be a list", f"{where}.summary")
        self.reasoning.extend(t for t in texts if t)


def chat_messages(
    items: Sequence[Mapping[str, Any]],
    media: MediaHandler | None = None,
    parts: list[MediaPart] | None = None,
    *,
    field: str = "input",
) -> list[dict[str, Any]]:
    """Input items as a chat-template message list (media parts appended to ``parts``)."""
    builder = _Messages(media, [] if parts is None else parts)
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        if not isinstance(item, Mapping):
            raise invalid("each input item must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            builder.message(item, where)
        elif kind == "function_call":
            builder.function_call(item, where)
        elif kind == "function_call_output":
            builder.function_call_output(item, where)
        elif kind == "reasoning":
            builder.reasoning_item(item, where)
        else:
            raise invalid(
                f"input item type {kind!r} is not supported (message, function_call, "
                "function_call_output, reasoning)",
                f"{where}.type",
            )
    return builder.out


HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "file_search",
        "code_interpreter",
        "computer_use_preview",
        "image_generation",
        "local_shell",
        "mcp",
        "custom",
        "tool_search",
    }
)


def template_tools(
    tools: Sequence[Mapping[str, Any]] | None,
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Function tools (``namespace`` groups flattened) in the chat templates' shape, and
    each namespaced function's namespace. Tools this server cannot run locally (hosted
    ones such as ``web_search``, freeform ``custom`` tools) are skipped with a warning."""
    out: list[dict[str, Any]] = []
    namespaces: dict[str, str] = {}
    skipped: list[str] = []

    def add(tool: Mapping[str, Any], where: str, namespace: str | None) -> None:
        kind = tool.get("type", "function")
        if not isinstance(kind, str):
            raise invalid("a tool's type must be a string", f"{where}.type")
        if kind == "namespace":
            if namespace is not None:
                raise invalid("a namespace cannot hold another namespace", f"{where}.type")
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise invalid("a namespace tool needs a tools list", f"{where}.tools")
            for j, sub in enumerate(inner):
                if not isinstance(sub, Mapping):
                    raise invalid("each tool must be an object", f"{where}.tools[{j}]")
                add(sub, f"{where}.tools[{j}]", str(tool.get("name") or ""))
            return
        if kind != "function":
            skipped.append(str(kind))
            return
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid("a function tool needs a name", f"{where}.name")
        parameters = tool.get("parameters")
        parameters = {} if parameters is None else parameters
        if not isinstance(parameters, Mapping):
            raise invalid("a tool's parameters must be a JSON Schema object", f"{where}.parameters")
        function: dict[str, Any] = {"name": name, "parameters": parameters}
        if not isinstance(tool.get("description", ""), str | None):
            raise invalid("a tool's description must be a string", f"{where}.description")
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
        if namespace:
            namespaces[name] = namespace

    for i, tool in enumerate(tools or []):
        if not isinstance(tool, Mapping):
            raise invalid("each tool must be an object", f"tools[{i}]")
        add(tool, f"tools[{i}]", None)
    if skipped:
        kinds = ", ".join(sorted(set(skipped)))
        warn_once(
            f"hosted-tools:{kinds}", "skipped tools this server cannot run locally: %s", kinds
        )
    return out, namespaces


def item_size(item: Any) -> int:
    """Bytes of an item as JSON (what the response store counts)."""
    return len(msgspec.json.encode(item))

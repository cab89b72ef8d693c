"""Ollama request bodies as msgspec structs (decoded strictly; unknown fields ignored).

The fields are Ollama's (``docs/api.md`` of the Ollama repository and the ``ollama``
Python client's types); ``options`` stays a mapping, checked key by key in
:mod:`mlxcore_ollama.convert` so an error names the option.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec

from mlxcore.builtin.openai.schemas import CacheSalt
from mlxcore.server.openapi import CONTEXT_TITLE, DIMENSIONS_TITLE, OBJECT, given, implies

Name = Annotated[str, msgspec.Meta(min_length=1)]
MAX_INPUTS = 2048
"""The most texts one ``/api/embed`` request embeds."""
Format = Literal["json", ""] | dict[str, Any]
"""``"json"``, ``""`` (none) or a JSON schema."""
DURATION_PATTERN = r"^-?[0-9]+(\.[0-9]+)?(ms|s|m|h)?$"
"""A ``keep_alive`` duration: a number and a unit (none: seconds)."""
_REPO_PART = r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
REPO_PATTERN = rf"^(?!.*(\.\.|--)){_REPO_PART}/{_REPO_PART}(:latest)?$"
"""What ``/api/pull`` and ``/api/delete`` take: a Hugging Face repo id as the Hub
validates it (letters, digits, ``_ . -``; no ``..`` or ``--``; neither part starts or
ends with ``.`` or ``-``; at most 96 characters each), ``:latest`` allowed."""
KeepAlive = Annotated[str, msgspec.Meta(pattern=DURATION_PATTERN)] | float
"""A duration (``"5m"``, ``"1h"``) or seconds; ``0`` unloads once the request is done."""
Think = bool | Literal["low", "medium", "high"]
"""``true`` / ``false``, or an effort: ``"low"``, ``"medium"``, ``"high"``."""


TOOL_CALL: dict[str, Any] = {
    "type": "object",
    "properties": {
        "function": {
            "type": "object",
            "properties": {"name": {"type": "string", "minLength": 1}, "arguments": OBJECT},
            "required": ["name"],
        }
    },
    "required": ["function"],
}
"""An assistant message's tool call (arguments as an object, as Ollama sends them)."""

_RANGE = {  # the sampler's bounds, as the OpenAI routes state them
    "temperature": (0.0, 2.0), "min_p": (0.0, 1.0), "repeat_penalty": (0.01, 10.0),
    "presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0),
}  # fmt: skip
OPTIONS: dict[str, Any] = {
    "type": "object",
    "description": "Ollama's model options; names Ollama defines for its runner are "
    "accepted and ignored; other names are the server's plugins' per-request options",
    "properties": {
        **{name: {"type": "number", "minimum": low, "maximum": high}
           for name, (low, high) in _RANGE.items()},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": -1},
        "seed": {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1},
        "num_predict": {"type": "integer", "anyOf": [{"minimum": 1}, {"enum": [-1, -2]}]},
        "num_ctx": {"type": "integer", "minimum": 1, "title": CONTEXT_TITLE},
        "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "mirostat": {"type": "number", "const": 0},
        "tfs_z": {"type": "number", "const": 1},
        "typical_p": {"type": "number", "const": 1},
    },
}  # fmt: skip
"""``options``, with the bounds the server checks."""
_OPTIONS_SCHEMA = msgspec.Meta(
    extra_json_schema={"allOf": [{"anyOf": [{"type": "null"}, OPTIONS]}]}
)


class Message(msgspec.Struct, kw_only=True):
    """One chat message."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = None
    images: list[Name] | None = None
    """Base64-encoded images (the client encodes files and bytes)."""
    tool_calls: Annotated[
        list[dict[str, Any]] | None, msgspec.Meta(extra_json_schema={"items": TOOL_CALL})
    ] = None
    tool_name: str | None = None


class GenerationFields(msgspec.Struct, kw_only=True):
    """What ``/api/chat`` and ``/api/generate`` share."""

    model: Name
    stream: bool = True
    format: Format | None = None
    options: Annotated[dict[str, Any] | None, _OPTIONS_SCHEMA] = None
    think: Think | None = None
    keep_alive: KeepAlive | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    cache_salt: CacheSalt | None = None
    """vLLM's ``cache_salt`` (mlxcore's extension here): cached prefixes are reused only
    under the same salt."""


class ChatRequest(GenerationFields, kw_only=True):
    """``POST /api/chat``."""

    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None


_EMPTY = msgspec.Meta(extra_json_schema={"maxLength": 0, "maxItems": 0})
"""In the document only: the field, when given, is empty."""


class GenerateRequest(GenerationFields, kw_only=True):
    """``POST /api/generate``."""

    schema_rules: ClassVar[dict[str, Any]] = implies(
        given("raw", {"const": True}), {"properties": {"images": {"not": {"minItems": 1}}}}
    )
    """Images need the chat template (``raw`` off)."""
    prompt: str | None = None
    # not supported: each empty when given (the route's 400 says what to do instead)
    suffix: Annotated[str | None, _EMPTY] = None
    system: str | None = None
    template: Annotated[str | None, _EMPTY] = None
    context: Annotated[list[int] | None, _EMPTY] = None
    raw: bool = False
    images: list[Name] | None = None


class EmbedRequest(msgspec.Struct, kw_only=True):
    """``POST /api/embed``."""

    model: Name
    input: str | Annotated[list[str], msgspec.Meta(min_length=1, max_length=MAX_INPUTS)]
    truncate: bool = True
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None
    dimensions: Annotated[int, msgspec.Meta(ge=1, title=DIMENSIONS_TITLE)] | None = None


class EmbeddingsRequest(msgspec.Struct, kw_only=True):
    """``POST /api/embeddings`` (Ollama's older route: one prompt, one vector)."""

    model: Name
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None


NAMES_A_REPO: dict[str, Any] = {
    "anyOf": [
        given("model", {"pattern": REPO_PATTERN}),
        {
            "not": given("model", {"minLength": 1}),
            **given("name", {"pattern": REPO_PATTERN}),
        },
    ]
}
"""``model`` (or, when it is empty, ``name``) is a repo id."""


class ShowRequest(msgspec.Struct, kw_only=True):
    """``POST /api/show`` (``name`` is the older spelling of ``model``)."""

    schema_rules: ClassVar[dict[str, Any]] = {
        "anyOf": [given("model", {"minLength": 1}), given("name", {"minLength": 1})]
    }
    model: str | None = None
    name: str | None = None
    verbose: bool = False


class PullRequest(msgspec.Struct, kw_only=True):
    """``POST /api/pull`` (``model``: a Hugging Face repo id; ``name``: older spelling)."""

    schema_rules: ClassVar[dict[str, Any]] = NAMES_A_REPO
    model: str | None = None
    name: str | None = None
    insecure: bool = False
    stream: bool = True


class DeleteRequest(msgspec.Struct, kw_only=True):
    """``DELETE /api/delete``."""

    schema_rules: ClassVar[dict[str, Any]] = NAMES_A_REPO
    model: str | None = None
    name: str | None = None

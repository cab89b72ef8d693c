"""Ollama request bodies as msgspec structs (decoded strictly; unknown fields ignored).

The fields are Ollama's (``docs/api.md`` of the Ollama repository and the ``ollama``
Python client's types); ``options`` stays a mapping, checked key by key in
:mod:`mlxcore_ollama.convert` so an error names the option.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

Name = Annotated[str, msgspec.Meta(min_length=1)]
Format = str | dict[str, Any]
"""``"json"``, ``""`` (none) or a JSON schema."""
KeepAlive = str | float
"""A duration (``"5m"``, ``"1h"``) or seconds; ``0`` unloads once the request is done."""
Think = bool | str
"""``true`` / ``false``, or an effort: ``"low"``, ``"medium"``, ``"high"``."""


class Message(msgspec.Struct, kw_only=True):
    """One chat message."""

    role: str
    content: str | None = None
    thinking: str | None = None
    images: list[str] | None = None
    """Base64-encoded images (the client encodes files and bytes)."""
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None


class GenerationFields(msgspec.Struct, kw_only=True):
    """What ``/api/chat`` and ``/api/generate`` share."""

    model: Name
    stream: bool = True
    format: Format | None = None
    options: dict[str, Any] | None = None
    think: Think | None = None
    keep_alive: KeepAlive | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None


class ChatRequest(GenerationFields, kw_only=True):
    """``POST /api/chat``."""

    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(GenerationFields, kw_only=True):
    """``POST /api/generate``."""

    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None


class EmbedRequest(msgspec.Struct, kw_only=True):
    """``POST /api/embed``."""

    model: Name
    input: str | list[str]
    truncate: bool = True
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None


class EmbeddingsRequest(msgspec.Struct, kw_only=True):
    """``POST /api/embeddings`` (Ollama's older route: one prompt, one vector)."""

    model: Name
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None


class ShowRequest(msgspec.Struct, kw_only=True):
    """``POST /api/show`` (``name`` is the older spelling of ``model``)."""

    model: str | None = None
    name: str | None = None
    verbose: bool = False


class PullRequest(msgspec.Struct, kw_only=True):
    """``POST /api/pull`` (``model``: a Hugging Face repo id; ``name``: older spelling)."""

    model: str | None = None
    name: str | None = None
    insecure: bool = False
    stream: bool = True


class DeleteRequest(msgspec.Struct, kw_only=True):
    """``DELETE /api/delete``."""

    model: str | None = None
    name: str | None = None

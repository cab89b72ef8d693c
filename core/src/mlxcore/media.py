"""The seam for media (images, video) in chat requests.

A text-only model has no media handler: front ends refuse non-text content parts with a
400. A plugin that loads a multimodal checkpoint (``mlxcore_load_model``) returns a
:class:`~mlxcore.models.loader.LoadedModel` whose ``media`` is a :class:`MediaHandler`;
front ends then keep the media parts it accepts, render the chat template with a
placeholder part in their place (``{"type": "image"}``, ``{"type": "video"}``, the
shape Hugging Face chat templates expect), and ask the handler to turn the rendered
text plus the parts into prompt token ids and an opaque payload, which travels on
:attr:`GenerationRequest.media <mlxcore.engine.request.GenerationRequest.media>` to the
plugin's prefill strategy.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs


@attrs.frozen
class MediaPart:
    """One media content part of a request, in prompt order.

    Attributes:
        part: the content part as the client sent it (e.g. ``{"type": "image_url",
            "image_url": {"url": "data:image/png;base64,..."}}``).
        where: its location in the request body, for error messages
            (``"messages[0].content[1]"``).
    """

    part: Mapping[str, Any]
    where: str


@attrs.frozen
class PreparedPrompt:
    """A multimodal prompt ready for the engine.

    Attributes:
        ids: the prompt token ids, placeholders expanded to the model's media tokens.
        payload: what the prefill strategy needs (pixel values, grids, hashes, ...).
        cache_key: ``ids`` as the prefix cache should key them (media tokens replaced by
            ids derived from the media's content), or ``None`` to keep media prompts
            out of prefix reuse.
    """

    ids: list[int]
    payload: Any
    cache_key: list[int] | None = None


class MediaHandler(abc.ABC):
    """Turns a rendered chat prompt and its media parts into engine input.

    ``prepare`` runs on the server's preparation thread (not the engine thread): decode
    and check the media there, and raise :class:`mlxcore.errors.MediaError` (naming the
    part; the client gets a 400) for anything unusable.
    """

    part_types: ClassVar[frozenset[str]] = frozenset()
    """Content part types this handler accepts (e.g. ``{"image_url", "video_url"}``)."""

    @abc.abstractmethod
    def placeholder(self, part: Mapping[str, Any]) -> dict[str, Any]:
        """The part the chat template sees in place of ``part`` (e.g. ``{"type": "image"}``)."""

    @abc.abstractmethod
    def prepare(
        self, prompt_text: str, parts: Sequence[MediaPart], options: Mapping[str, Any]
    ) -> PreparedPrompt:
        """Expand the placeholders of ``prompt_text`` for ``parts`` and tokenize it;
        ``options`` are the request's plugin options (already validated by
        ``mlxcore_validate_options``), e.g. video sampling settings."""

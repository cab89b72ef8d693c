"""Weight adapters served on one model's shared weights (LoRA): what the core knows of them.

A plugin that serves adapters (``mlxcore-lora``) wraps the model's layers so that each
row of a batch can run with its own adapter, or none, and attaches an :class:`Adapters`
object to the model (:func:`attach`). The core then

- serves each adapter under its own model name: the router resolves the name to the base
  model's service, whose requests carry :data:`ADAPTER_OPTION` (the adapter's key) and a
  prefix-cache key that starts with it (:func:`adapter_request`), so a cached prefix is
  only reused under the same adapter weights;
- tells the adapters which row runs which adapter before every forward pass of the
  decoder and the prefill (:func:`forward`); a decoder or prefill strategy that does not
  do so says ``supports_adapters = False`` and the engine refuses to start with it;
- fails a queued request whose adapter was unloaded before it started (:func:`missing`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from mlxcore.engine.request import GenerationRequest

ADAPTER_OPTION = "adapter"
"""Engine option: the key (:meth:`Adapters.key`) of the adapter a request runs with. Set by
the server from the model name; a body field of this name is dropped."""

_ATTRIBUTE = "_mlxcore_adapters"


class Adapters(Protocol):
    """The adapters a plugin loaded onto one model instance."""

    def names(self) -> list[str]:
        """The served adapter names, in load order."""
        ...

    def key(self, name: str) -> int | None:
        """The key of the weights ``name`` serves now (a new key for every load, so a
        reloaded adapter never meets its predecessor's cache), ``None`` when not served."""
        ...

    def has_key(self, key: int) -> bool:
        """True while the weights of ``key`` are loaded."""
        ...

    def select(self, keys: Sequence[int | None] | None) -> None:
        """Which adapter each row of the next forward pass runs with (``None`` in a row:
        the base weights; ``None`` for all: no adapter anywhere)."""
        ...

    def describe(self, name: str) -> dict[str, Any]:
        """What ``/v1/models`` says of the adapter (e.g. ``{"root": path}``)."""
        ...


def attach(model: Any, adapters: Adapters) -> None:
    """Make ``adapters`` the adapters of this model instance (only this instance)."""
    object.__setattr__(model, _ATTRIBUTE, adapters)


def adapters_of(model: Any) -> Adapters | None:
    """The adapters attached to ``model``, or ``None``."""
    found: Adapters | None = getattr(model, _ATTRIBUTE, None)
    return found


def forward(model: Any, inputs: Any, cache: Any, requests: Sequence[GenerationRequest]) -> Any:
    """``model(inputs, cache=cache)`` with row ``i`` of ``inputs`` run under the adapter of
    ``requests[i]`` (the model's own call when no adapters are attached)."""
    adapters = adapters_of(model)
    if adapters is None:
        return model(inputs, cache=cache)
    keys = [r.options.get(ADAPTER_OPTION) for r in requests]
    adapters.select(keys if any(k is not None for k in keys) else None)
    try:
        return model(inputs, cache=cache)
    finally:
        adapters.select(None)


def missing(model: Any, request: GenerationRequest) -> str | None:
    """Why ``request`` cannot start (its adapter was unloaded after it was queued), or
    ``None`` when it can."""
    key = request.options.get(ADAPTER_OPTION)
    if key is None:
        return None
    adapters = adapters_of(model)
    if adapters is None or not adapters.has_key(key):
        return "the LoRA adapter this request names was unloaded before it started"
    return None


def cache_marker(key: int, first: int = 0) -> int:
    """The prefix-cache id that stands for the token ``first`` at position 0 under the
    adapter ``key``: negative (no token id is), apart from the media keys' range (those
    use 60 bits) and outside int32 (the disk tier never stores it: adapter keys start
    again with every process)."""
    digest = hashlib.sha256(f"adapter:{key}:{first}".encode()).digest()
    return -(1 << 62) - int.from_bytes(digest[:7], "big")


def adapter_request(request: GenerationRequest, key: int) -> GenerationRequest:
    """``request`` run under the adapter ``key``: the option set, and the prefix cache
    keyed by the adapter from the first position on (the adapter changes every
    position's state, so no prefix is shared with the base model or another adapter)."""
    tokens = request.prompt_tokens if request.cache_key is None else request.cache_key
    cache_key = (cache_marker(key, tokens[0]), *tokens[1:]) if tokens else None
    return attrs.evolve(
        request, options={**request.options, ADAPTER_OPTION: key}, cache_key=cache_key
    )

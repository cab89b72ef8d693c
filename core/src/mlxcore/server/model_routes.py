"""``/v1/models``: the models a server serves and their state, and the admin routes that
load, unload, pin and unpin them (admin routes: on a server with keys, an admin key's)."""

from __future__ import annotations

from typing import Any

from litestar import Request, get, post
from litestar.handlers import HTTPRouteHandler

from mlxcore.engine.adapters import adapters_of
from mlxcore.routes import ADMIN_OPTION
from mlxcore.server.errors import APIError
from mlxcore.server.metrics import MODEL_STATES
from mlxcore.server.openapi import (
    BOOLEAN,
    ERRORS_OPTION,
    INTEGER,
    REPLIES_OPTION,
    STRING,
    array,
    const,
    nullable,
    obj,
    reply,
)
from mlxcore.server.router import ModelRouter, ModelSlot

CREATED = 0
"""``created`` of every model entry (OpenAI's field; mlxcore does not track it)."""


_STATE = {
    "state": {"enum": list(MODEL_STATES)},
    "context_length": nullable(INTEGER),
    "aliases": array(STRING),
    "task": STRING,
    "pinned": BOOLEAN,
    "memory_bytes": INTEGER,
    "added": BOOLEAN,
}
MODEL_STATE = obj(
    {"id": STRING, "object": const("model"), **_STATE}, {"error": STRING}, title="ModelState"
)
"""What the load and unload routes answer: the model and its state."""
MODEL = obj(
    {
        "id": STRING,
        "object": const("model"),
        "created": INTEGER,
        "owned_by": STRING,
        "root": STRING,
        "parent": nullable(STRING),
        **_STATE,
    },
    {"error": STRING, "alias_of": STRING},
    title="Model",
)
"""One entry of ``/v1/models``."""
MODEL_LIST = obj({"object": const("list"), "data": array(MODEL)}, title="ModelList")


def _router(request: Request[Any, Any, Any]) -> ModelRouter:
    router: ModelRouter = request.app.state.router
    return router


def _entries(router: ModelRouter, slot: ModelSlot) -> list[dict[str, Any]]:
    """One entry per name of ``slot`` (aliases say whose alias they are)."""
    about = router.describe(slot)
    source = slot.spec.config.model
    entries = []
    for name in slot.spec.names:
        entry: dict[str, Any] = {
            "id": name,
            "object": "model",
            "created": CREATED,
            "owned_by": "mlxcore",
            # what the user passed (never a resolved cache path); the name for the default
            "root": source if source is not None else slot.spec.name,
            "parent": None,
            **about,
        }
        if name != slot.spec.name:
            entry["alias_of"] = slot.spec.name
        entries.append(entry)
    return entries


def _adapter_entry(router: ModelRouter, slot: ModelSlot, name: str) -> dict[str, Any]:
    """A LoRA adapter's entry: vLLM's shape (``parent``: the base model, ``root``: the
    adapter's folder), with its base model's state."""
    assert slot.service is not None
    adapters = adapters_of(slot.service.runtime.model)
    about = adapters.describe(name) if adapters is not None else {}
    return {
        "id": name,
        "object": "model",
        "created": CREATED,
        "owned_by": "mlxcore",
        "root": str(about.get("root", name)),
        **router.describe(slot),
        "parent": slot.spec.name,
        "aliases": [],
    }


@get("/v1/models", opt={REPLIES_OPTION: {200: reply("every model", MODEL_LIST)}})
async def list_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Every model and alias, with its state (``not_loaded``, ``loading``, ``loaded``,
    ``failed``) and context length, then the LoRA adapters the loaded models serve
    (``parent``: their base model)."""
    router = _router(request)
    data = [entry for slot in router.slots for entry in _entries(router, slot)]
    data += [_adapter_entry(router, slot, name) for slot, name in router.adapters()]
    return {"object": "list", "data": data}


def _known(router: ModelRouter, model_id: str) -> ModelSlot:
    slot = router.find(model_id)
    if slot is None:
        raise APIError(
            404,
            f"the model {model_id!r} does not exist; this server serves "
            f"{', '.join(router.names())}",
            param="model",
            code="model_not_found",
        )
    return slot


def _paths(suffix: str = "") -> list[str]:
    """A model route's paths: for a name, and for a Hugging Face style ``owner/name``."""
    return [
        f"/v1/models/{{model_id:str}}{suffix}",
        f"/v1/models/{{owner:str}}/{{model_id:str}}{suffix}",
    ]


def _name(model_id: str, owner: str | None) -> str:
    return model_id if owner is None else f"{owner}/{model_id}"


@get(_paths(), opt={REPLIES_OPTION: {200: reply("the model", MODEL)}})
async def retrieve_model(
    request: Request[Any, Any, Any], model_id: str, owner: str | None = None
) -> dict[str, Any]:
    """One model (or alias) by name."""
    model_id = _name(model_id, owner)
    router = _router(request)
    if router.find(model_id) is None and (base := router.find_adapter(model_id)) is not None:
        return _adapter_entry(router, base, model_id)
    slot = _known(router, model_id)
    return next(e for e in _entries(router, slot) if e["id"] == model_id)


@post(
    _paths("/load"),
    status_code=200,
    opt={ADMIN_OPTION: True, REPLIES_OPTION: {200: reply("loaded", MODEL_STATE)}},
)
async def load_model(
    request: Request[Any, Any, Any], model_id: str, owner: str | None = None
) -> dict[str, Any]:
    """Load a model now (after a failure too); answers once it is loaded."""
    router = _router(request)
    slot = _known(router, _name(model_id, owner))
    await router.load(slot, retry=True)
    return {"id": slot.spec.name, "object": "model", **router.describe(slot)}


@post(
    _paths("/unload"),
    status_code=200,
    opt={
        ADMIN_OPTION: True,
        REPLIES_OPTION: {200: reply("unloaded", MODEL_STATE)},
        ERRORS_OPTION: {409: "the model has requests in flight"},
    },
)
async def unload_model(
    request: Request[Any, Any, Any], model_id: str, owner: str | None = None
) -> dict[str, Any]:
    """Unload a model that is not in use (409 while it has requests in flight; a pinned
    model can be unloaded only this way)."""
    router = _router(request)
    slot = _known(router, _name(model_id, owner))
    if not await router.unload(slot, "asked through the admin route"):
        raise APIError(
            409,
            f"the model {slot.spec.name!r} has requests in flight; retry when they finish",
            code="model_busy",
        )
    return {"id": slot.spec.name, "object": "model", **router.describe(slot)}


def _set_pin(request: Request[Any, Any, Any], model_id: str, pinned: bool) -> dict[str, Any]:
    router = _router(request)
    slot = _known(router, model_id)
    slot.pin = pinned
    return {"id": slot.spec.name, "object": "model", **router.describe(slot)}


@post(
    _paths("/pin"),
    status_code=200,
    opt={ADMIN_OPTION: True, REPLIES_OPTION: {200: reply("pinned", MODEL_STATE)}},
)
async def pin_model(
    request: Request[Any, Any, Any], model_id: str, owner: str | None = None
) -> dict[str, Any]:
    """Pin a model until the server stops: it is never unloaded to make room or for
    idleness (the unload route still unloads it)."""
    return _set_pin(request, _name(model_id, owner), True)


@post(
    _paths("/unpin"),
    status_code=200,
    opt={ADMIN_OPTION: True, REPLIES_OPTION: {200: reply("unpinned", MODEL_STATE)}},
)
async def unpin_model(
    request: Request[Any, Any, Any], model_id: str, owner: str | None = None
) -> dict[str, Any]:
    """Unpin a model (models.toml's ``pinned`` included) until the server stops."""
    return _set_pin(request, _name(model_id, owner), False)


def model_routes() -> list[HTTPRouteHandler]:
    """The route handlers of this module."""
    return [list_models, retrieve_model, load_model, unload_model, pin_model, unpin_model]

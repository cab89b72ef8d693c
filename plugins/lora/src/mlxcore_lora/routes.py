"""vLLM's runtime adapter routes: ``POST /v1/load_lora_adapter`` and
``POST /v1/unload_lora_adapter`` (served with ``--allow-runtime-lora``).

A load reads and checks the folder on a worker thread (a bad folder is a 400 that says
why), then installs the adapter as an engine job between two decode steps: the adapter's
bytes must fit the memory budget, and they stay counted in it. An unload stops new
requests for the name at once (404), then removes the weights as an engine job once no
running request uses them; requests still queued for it end with a 503. If requests keep
running past :data:`UNLOAD_WAIT` seconds the adapter is served again and the answer is a
409 to retry.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import msgspec
from litestar import Request, post
from litestar.handlers import HTTPRouteHandler

from mlxcore.engine.adapters import ADAPTER_OPTION, adapters_of
from mlxcore.engine.engine import Engine
from mlxcore.routes import ADMIN_OPTION
from mlxcore.server.errors import APIError, invalid
from mlxcore.server.frontend import decode_body
from mlxcore.server.openapi import BODY_OPTION, ERRORS_OPTION, REPLIES_OPTION, STRING, obj, reply
from mlxcore.server.router import ModelRouter
from mlxcore.server.service import GenerationService
from mlxcore_lora.bank import AdapterBank
from mlxcore_lora.folder import AdapterError, AdapterWeights, read_adapter

UNLOAD_WAIT = 30.0
"""Seconds an unload waits for the adapter's running requests to finish."""
UNLOAD_POLL = 0.2

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[^\s/]+$")]


class LoadAdapterRequest(msgspec.Struct, kw_only=True):
    """vLLM's body; ``model`` (mlxcore's): the base model, by default the first."""

    lora_name: Name
    lora_path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    model: str | None = None


class UnloadAdapterRequest(msgspec.Struct, kw_only=True):
    """vLLM's body (``lora_int_id`` is accepted and ignored: names identify adapters)."""

    lora_name: Name
    lora_int_id: int | None = None


ADAPTER = obj(
    {"id": STRING, "object": STRING, "parent": STRING, "root": STRING}, title="LoraAdapter"
)


async def _base(request: Request[Any, Any, Any], model: str | None) -> GenerationService:
    router: ModelRouter = request.app.state.router
    if model and router.find(model) is None:
        raise APIError(
            404, f"the model {model!r} does not exist", param="model", code="model_not_found"
        )
    return await router.service(model)


def _bank(svc: GenerationService) -> AdapterBank:
    bank = adapters_of(svc.runtime.model)
    if not isinstance(bank, AdapterBank):
        raise invalid(f"the model {svc.names[:1]} serves no LoRA adapters", "model")
    return bank


async def _on_engine(svc: GenerationService, kind: str, work: Any, cost: int) -> Any:
    """``work()`` on the engine thread, between two steps (as a job)."""
    return await svc.run_job(None, kind, work, cost)


def _install(engine: Engine, bank: AdapterBank, weights: AdapterWeights) -> int:
    key = bank.install(weights)
    engine.memory.add_weights(weights.nbytes)
    return key


def _remove_if_idle(engine: Engine, bank: AdapterBank, name: str, key: int) -> bool:
    if any(r.options.get(ADAPTER_OPTION) == key for r in engine.live_requests()):
        return False
    engine.memory.add_weights(-bank.remove(name).nbytes)
    return True


@post(
    "/v1/load_lora_adapter",
    status_code=200,
    opt={
        ADMIN_OPTION: True,
        BODY_OPTION: LoadAdapterRequest,
        REPLIES_OPTION: {200: reply("the adapter, served from now on", ADAPTER)},
        ERRORS_OPTION: {409: "an adapter or model of that name is served already"},
    },
)
async def load_lora_adapter(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Serve an mlx-lm adapter folder as a new model name on a loaded base model."""
    body = await decode_body(request, LoadAdapterRequest)
    router: ModelRouter = request.app.state.router
    if body.lora_name in router.names():
        raise APIError(
            409, f"{body.lora_name!r} is served already", param="lora_name", code="adapter_exists"
        )
    svc = await _base(request, body.model)
    bank = _bank(svc)
    try:
        weights = await asyncio.to_thread(
            read_adapter, body.lora_name, body.lora_path, bank.targets
        )
    except AdapterError as exc:
        raise invalid(str(exc), "lora_path") from None
    engine = svc.runtime.engine
    try:
        await _on_engine(svc, "lora_load", lambda: _install(engine, bank, weights), weights.nbytes)
    except AdapterError as exc:  # the name was taken meanwhile, or --max-loras reached
        raise APIError(409, str(exc), param="lora_name", code="adapter_exists") from None
    parent = svc.names[0] if svc.names else router.default.spec.name
    return {"id": body.lora_name, "object": "model", "parent": parent, "root": weights.path}


@post(
    "/v1/unload_lora_adapter",
    status_code=200,
    opt={
        ADMIN_OPTION: True,
        BODY_OPTION: UnloadAdapterRequest,
        REPLIES_OPTION: {200: reply("the adapter, no longer served", ADAPTER)},
        ERRORS_OPTION: {409: "the adapter's requests kept running"},
    },
)
async def unload_lora_adapter(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Stop serving an adapter and free its weights once its running requests end."""
    body = await decode_body(request, UnloadAdapterRequest)
    router: ModelRouter = request.app.state.router
    slot = router.find_adapter(body.lora_name)
    if slot is None or slot.service is None:
        raise APIError(
            404, f"no LoRA adapter named {body.lora_name!r} is served", param="lora_name",
            code="model_not_found",
        )  # fmt: skip
    svc = slot.service
    bank = _bank(svc)
    key, root = bank.key(body.lora_name), bank.describe(body.lora_name).get("root", "")
    assert key is not None
    bank.hide(body.lora_name)
    engine = svc.runtime.engine
    deadline = time.monotonic() + UNLOAD_WAIT
    try:
        while not await _on_engine(
            svc, "lora_unload", lambda: _remove_if_idle(engine, bank, body.lora_name, key), 0
        ):
            if time.monotonic() > deadline:
                raise APIError(
                    409,
                    f"the LoRA adapter {body.lora_name!r} still has running requests after "
                    f"{UNLOAD_WAIT:g} s; it is served again: retry later",
                    code="adapter_busy",
                )
            await asyncio.sleep(UNLOAD_POLL)
    finally:
        bank.show(body.lora_name)  # a no-op once removed
    return {"id": body.lora_name, "object": "model", "parent": slot.spec.name, "root": root}


def lora_routes() -> list[HTTPRouteHandler]:
    """The route handlers of this module."""
    return [load_lora_adapter, unload_lora_adapter]

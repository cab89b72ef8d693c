"""Ollama's model routes: ``GET /api/tags`` (every model served), ``POST /api/show``
(one model's details, template and capabilities), ``GET /api/ps`` (the loaded ones),
``GET /api/version``, and the empty chat/generate request that loads or unloads a model.

Ollama names carry a tag (``llama3.2:latest``); mlxcore's served names have none, so a
name ending in ``:latest`` reaches the model of the name without it."""

from __future__ import annotations

import hashlib
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mlx.core as mx
from litestar import Request, get, post
from mlx.utils import tree_flatten

from mlxcore.errors import ModelLoadError
from mlxcore.models.folder import read_config
from mlxcore.server.errors import APIError
from mlxcore.server.frontend import decode_body, model_service
from mlxcore.server.openapi import BODY_OPTION, REPLIES_OPTION, reply
from mlxcore.server.router import ModelRouter, ModelSlot
from mlxcore.server.service import GenerationService
from mlxcore_ollama.encode import created_at
from mlxcore_ollama.replies import RUNNING, SHOW, TAGS, VERSION
from mlxcore_ollama.schemas import DURATION_PATTERN, KeepAlive, ShowRequest

OLLAMA_API_VERSION = "0.12.0"
"""What ``/api/version`` answers: the Ollama release whose API these routes follow
(clients gate features such as ``think`` on it)."""
TAG = ":latest"
FOREVER = "2318-01-01T00:00:00Z"
"""``expires_at`` of a model that is never unloaded for idleness (as Ollama writes
``keep_alive: -1``)."""


def _router(request: Request[Any, Any, Any]) -> ModelRouter:
    router: ModelRouter = request.app.state.router
    return router


def model_name(request: Request[Any, Any, Any], name: str) -> str:
    """``name`` as this server knows it (``NAME:latest`` is ``NAME``)."""
    router = _router(request)
    if router.find(name) is None and name.endswith(TAG) and router.find(name[: -len(TAG)]):
        return name[: -len(TAG)]
    return name


async def service(
    request: Request[Any, Any, Any], name: str, task: str | None = "generate"
) -> GenerationService:
    """The service of the model ``name`` (loaded on demand; a 404 for an unknown one)."""
    return await model_service(request, model_name(request, name), task)


_DURATION = re.compile(DURATION_PATTERN)


def keep_alive_seconds(value: KeepAlive | None) -> float | None:
    """``keep_alive`` in seconds (negative: forever; ``None``: not given); a 400 for text
    that is not a duration."""
    if value is None or isinstance(value, int | float):
        return None if value is None else float(value)
    match = _DURATION.fullmatch(value)
    if match is None:
        raise APIError(400, f"keep_alive {value!r} is not a duration such as 5m, 30s or -1")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[match.group(2)]
    return float(value.removesuffix(match.group(2) or "")) * scale


async def load_or_unload(
    request: Request[Any, Any, Any], name: str, keep_alive: KeepAlive | None, *, chat: bool
) -> dict[str, Any]:
    """Ollama's empty request: load the model (it is, by now), or unload it with
    ``keep_alive`` 0; answered as Ollama does, ``done_reason`` ``load`` or ``unload``."""
    router = _router(request)
    seconds = keep_alive_seconds(keep_alive)
    reason = "load"
    if seconds == 0:
        slot = router.slot_for(model_name(request, name))
        if not await router.unload(slot, "keep_alive 0"):
            raise APIError(409, f"the model {name!r} is busy; it was not unloaded")
        reason = "unload"
    body: dict[str, Any] = {"model": name, "created_at": created_at()}
    if chat:
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    return {**body, "done": True, "done_reason": reason}


def _config(slot: ModelSlot) -> dict[str, Any]:
    """The model's ``config.json``: the loaded model's, else a local folder's."""
    if slot.service is not None:
        return slot.service.runtime.info.config
    source = slot.spec.config.model
    if source is None:
        return {}
    try:
        return read_config(Path(source).expanduser())
    except ModelLoadError:
        return {}


def _parameters(slot: ModelSlot) -> int | None:
    """How many parameters the loaded model has (packed quantized weights unpacked)."""
    if slot.service is None:
        return None
    bits = _bits(_config(slot))
    total = 0
    leaves: list[tuple[str, Any]] = tree_flatten(slot.service.runtime.model.parameters())  # type: ignore[assignment]
    for name, array in leaves:
        if name.endswith((".scales", ".biases")) and bits:
            continue
        total += array.size * (32 // bits if bits and array.dtype == mx.uint32 else 1)
    return total


def _bits(config: dict[str, Any]) -> int | None:
    quant = config.get("quantization") or config.get("quantization_config")
    bits = quant.get("bits") if isinstance(quant, dict) else None
    return bits if isinstance(bits, int) and bits > 0 else None


def _size_label(count: int | None) -> str:
    if not count:
        return ""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}".replace(".0", "")
    return str(count)


def details(slot: ModelSlot) -> dict[str, Any]:
    """Ollama's ``details`` of a model: format, family, size and quantization."""
    config = _config(slot)
    family = str(config.get("model_type", ""))
    bits = _bits(config)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
    level = f"Q{bits}" if bits else {"bfloat16": "BF16", "float16": "F16"}.get(dtype, "F32")
    return {
        "parent_model": "",
        "format": "gguf" if str(slot.spec.config.model or "").endswith(".gguf") else "safetensors",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": _size_label(_parameters(slot)),
        "quantization_level": level if config else "",
    }


def _modified_at(slot: ModelSlot) -> str:
    source = slot.spec.config.model
    try:
        mtime = Path(source).expanduser().stat().st_mtime if source else time.time()
    except OSError:
        mtime = time.time()
    return datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _digest(slot: ModelSlot) -> str:
    """A stable id of the model (its name and where it comes from)."""
    return hashlib.sha256(f"{slot.spec.name}\0{slot.spec.config.model}".encode()).hexdigest()


def _entry(slot: ModelSlot) -> dict[str, Any]:
    return {
        "name": slot.spec.name,
        "model": slot.spec.name,
        "modified_at": _modified_at(slot),
        "size": slot.footprint,
        "digest": _digest(slot),
        "details": details(slot),
    }


@get("/tags", opt={REPLIES_OPTION: {200: reply("every model", TAGS)}})
async def tags(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Every model this server serves, loaded or not."""
    return {"models": [_entry(slot) for slot in _router(request).slots]}


@get("/ps", opt={REPLIES_OPTION: {200: reply("the loaded models", RUNNING)}})
async def running(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The models loaded now: their memory, context and when idleness unloads them."""
    router = _router(request)
    on_gpu = mx.default_device() == mx.gpu
    out = []
    for slot in router.loaded():
        assert slot.service is not None
        if router.idle_unload > 0 and not slot.pinned:
            expires = datetime.fromtimestamp(time.time() + router.idle_unload, UTC)
            expires_at = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
        else:
            expires_at = FOREVER
        out.append(
            {
                **_entry(slot),
                "expires_at": expires_at,
                "size_vram": slot.footprint if on_gpu else 0,
                "context_length": slot.service.context_length,
            }
        )
    return {"models": out}


def capabilities(svc: GenerationService) -> list[str]:
    """What a model can do, in Ollama's words."""
    if svc.task == "embed":
        return ["embedding"]
    rt = svc.runtime
    found = ["completion"]
    if rt.info.template_mentions("tools"):
        found.append("tools")
    if rt.parsers.reasoning is not None:
        found.append("thinking")
    if rt.media is not None:
        found.append("vision")
    return found


@post(
    "/show",
    status_code=200,
    opt={BODY_OPTION: ShowRequest, REPLIES_OPTION: {200: reply("the model", SHOW)}},
)
async def show(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """One model: details, chat template, capabilities (the model is loaded to tell)."""
    body = await decode_body(request, ShowRequest)
    name = body.model or body.name
    if not name:
        raise APIError(400, "model is required")
    svc = await service(request, name, task=None)
    slot = _router(request).slot_for(model_name(request, name))
    info = svc.runtime.info
    family = info.model_type
    model_info: dict[str, Any] = {"general.architecture": family}
    count = _parameters(slot)
    if count:
        model_info["general.parameter_count"] = count
    if svc.context_length:
        model_info[f"{family}.context_length"] = svc.context_length
    return {
        "modelfile": f"FROM {info.source or info.path}\n",
        "parameters": "",
        "template": info.chat_template or "",
        "details": details(slot),
        "model_info": model_info,
        "capabilities": capabilities(svc),
        "modified_at": _modified_at(slot),
    }


@get("/version", opt={REPLIES_OPTION: {200: reply("the version", VERSION)}})
async def version() -> dict[str, str]:
    """The Ollama API version these routes follow."""
    return {"version": OLLAMA_API_VERSION}


HANDLERS = [tags, running, show, version]

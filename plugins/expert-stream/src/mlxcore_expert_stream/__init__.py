"""mlxcore plugin ``expert-stream``: mixture-of-experts models with their routed experts
read from disk into a bounded cache (``--plugin expert-stream --expert-memory 6GB``).

The dense parts (attention, shared experts, norms, embeddings, the routers) load as
usual; every mlx-lm ``SwitchGLU`` of the model instance is replaced by a
:class:`~mlxcore_expert_stream.layer.StreamedSwitchGLU` whose experts come from the
checkpoint's safetensors one expert at a time (:mod:`mlxcore_expert_stream.store`)
into per-layer slot tables that share ``--expert-memory`` bytes, least recently used out
first (:mod:`mlxcore_expert_stream.cache`). The checkpoint must be in mlx-lm's own format
(experts stacked per projection, as ``mlx_lm.convert`` and ``save_model`` write them).
See docs/plugins/expert-stream.md.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import mlx.core as mx

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.errors import UsageError
from mlxcore.hookspecs import OptionGroup
from mlxcore.models.loader import LoadedModel, load_model
from mlxcore.models.resolve import ResolvedModel
from mlxcore.settings import add_flags, byte_size, read_settings, setting
from mlxcore_expert_stream.cache import Expert, ExpertCache
from mlxcore_expert_stream.layer import PROJECTIONS, StreamedSwitchGLU, array_keys
from mlxcore_expert_stream.store import ExpertFiles

log = logging.getLogger("mlxcore.plugins.expert_stream")

MLXCORE_AUTOLOAD = False
"""Loaded only when asked for (``--plugin expert-stream``): it changes how models load."""


@attrs.frozen
class ExpertStreamSettings:
    """The expert-stream plugin's settings; each default is stated here only."""

    expert_memory: int | None = setting(
        None, type=byte_size, metavar="SIZE",
        help="serve a mixture-of-experts model with its routed experts read from disk into "
        "a cache of SIZE (6GB; default: every expert loaded)",
    )  # fmt: skip


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """``--expert-memory``."""
    add_flags(parser, ExpertStreamSettings)


@hookimpl
def mlxcore_load_model(model: ResolvedModel, config: ServerConfig) -> LoadedModel | None:
    """With ``--expert-memory``: load lazily, put streamed experts in place, then read
    the rest."""
    settings = read_settings(config, ExpertStreamSettings)
    if settings.expert_memory is None:
        return None
    loaded = load_model(model, lazy=True)
    cache = stream_experts(loaded.model, model.path, settings.expert_memory, _top_k(loaded))
    mx.eval(loaded.model.parameters())
    info = attrs.evolve(loaded.info, reserved_bytes=cache.capacity, gauges=cache.gauges)
    return attrs.evolve(loaded, info=info)


def _top_k(loaded: LoadedModel) -> int:
    args = getattr(loaded.model, "args", None)
    text = getattr(args, "text_config", None) or {}
    for source in (args, text):
        for name in ("num_experts_per_tok", "moe_top_k", "num_experts_per_token"):
            value = source.get(name) if isinstance(source, dict) else getattr(source, name, None)
            if isinstance(value, int) and value > 0:
                return value
    return 1


def stream_experts(model: Any, folder: Any, capacity: int, top_k: int) -> ExpertCache:
    """Replace every ``SwitchGLU`` of ``model`` (this instance only) by a streamed one
    over one cache of ``capacity`` bytes; returns the cache.

    Raises:
        UsageError: the model has no routed experts, its checkpoint is not in mlx-lm's
            format, or ``capacity`` holds fewer than one token's experts (the message
            names the smallest size that works).
    """
    from mlx_lm.models.switch_layers import SwitchGLU

    found = [(path, m) for path, m in model.named_modules() if isinstance(m, SwitchGLU)]
    if not found:
        raise UsageError("--expert-memory: this model has no routed experts to stream")
    files = ExpertFiles(folder)
    names = {path: _tensor_names(path, module) for path, module in found}
    if not all(files.has(n for ns in layer.values() for n in ns) for layer in names.values()):
        raise UsageError(
            "--expert-memory: the checkpoint does not hold the experts stacked as mlx-lm "
            "saves them; convert it first (mlx_lm.convert, or mlxcore models quantize)"
        )
    per_expert = {
        path: sum(files.tensors[n].expert_bytes for ns in layer.values() for n in ns)
        for path, layer in names.items()
    }
    smallest = top_k * sum(per_expert.values())
    total = sum(per_expert[path] * int(m.gate_proj.weight.shape[0]) for path, m in found)
    if capacity < smallest:
        raise UsageError(
            f"--expert-memory {capacity} bytes holds fewer than one token's experts "
            f"({top_k} per layer x {len(found)} layers); the smallest that works is "
            f"{smallest} bytes ({smallest / 2**20:.1f} MiB)"
        )

    def load(layer: str, experts: list[int]) -> list[Expert]:
        """Read ``experts`` of ``layer``: every slice at once on the read threads (a
        queue deep enough for an SSD) into buffers made here, then the arrays."""
        jobs = [(e, n) for e in experts for ns in names[layer].values() for n in ns]
        buffers = {job: files.buffer(job[1]) for job in jobs}
        list(_readers().map(lambda job: files.read_into(job[1], job[0], buffers[job]), jobs))
        return [
            {
                proj: tuple(files.as_array(n, buffers.pop((e, n))) for n in tensor_names)
                for proj, tensor_names in names[layer].items()
            }
            for e in experts
        ]

    cache = ExpertCache(capacity, load, per_expert, top_k)
    for path, module in found:
        parent_path, _, attr = path.rpartition(".")
        parent = _module_at(model, parent_path)
        parent[attr] = StreamedSwitchGLU(path, module, cache)
    log.info(
        "expert-stream: %d layers of routed experts (%.1f MiB on disk), a cache of %.1f MiB "
        "(%.0f%%)",
        len(found),
        total / 2**20,
        capacity / 2**20,
        100 * capacity / max(total, 1),
    )
    return cache


READ_THREADS = 8
"""Expert slices read from disk at once (one process-wide pool: the disk is shared)."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _readers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="expert-read")
        return _pool


def cache_of(model: Any) -> ExpertCache | None:
    """The expert cache a streamed model reads through (None: not streamed)."""
    for _, module in model.named_modules():
        if isinstance(module, StreamedSwitchGLU):
            return module.cache
    return None


def _tensor_names(path: str, module: Any) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for proj in PROJECTIONS:
        out[proj] = tuple(f"{path}.{proj}.{k}" for k in array_keys(getattr(module, proj)))
    return out


def _module_at(model: Any, path: str) -> Any:
    node = model
    for part in path.split(".") if path else ():
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node

"""mlxcore plugin `disk-cache`: a prefix cache on disk behind the in-memory one.

``mlxcore serve MODEL --plugin disk-cache [--disk-cache-dir DIR] [--disk-cache-size SIZE]``:
every stored prefix (history checkpoints and finished sequences of at least
``--disk-cache-min-tokens``) is also written to ``DIR/<model fingerprint>/``, by a
thread of its own; a lookup that finds more of the prompt on disk than in memory loads
it from there. Entries survive restarts and model swaps, are bound to the exact model
(weights, tokenizer, dtype, cache layout), are checksummed, and the folder is kept
under its size, least recently used first. A folder that cannot take entries (full,
read-only, missing) turns the tier off with one warning. See docs/plugins/disk-cache.md.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs
from mlx_lm.models.cache import make_prompt_cache

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.defaults.radix_cache import prefix_cache_for
from mlxcore.engine.kv_quant import KVQuantization
from mlxcore.engine.strategies import CacheStrategy
from mlxcore.errors import UsageError
from mlxcore.model_info import ModelInfo
from mlxcore.models import resolve
from mlxcore.settings import add_flags, byte_size, non_negative_int, read_settings, setting
from mlxcore_disk_cache.fingerprint import layout_of, model_fingerprint
from mlxcore_disk_cache.store import DiskStore
from mlxcore_disk_cache.strategy import DiskTieredCache

MLXCORE_AUTOLOAD = False
"""Not loaded unless named with `--plugin disk-cache`."""

log = logging.getLogger("mlxcore.plugins.disk_cache")


def default_dir() -> Path:
    """``$MLXCORE_HOME/prefix-cache`` (``~/.cache/mlxcore/prefix-cache``)."""
    return resolve.mlxcore_home() / "prefix-cache"


@attrs.frozen
class DiskCacheSettings:
    """The tier's settings; each default is stated here only."""

    disk_cache_dir: str | None = setting(
        None, metavar="DIR",
        help="where entries are written (default $MLXCORE_HOME/prefix-cache); one "
        "subfolder per model fingerprint; servers may share it",
    )  # fmt: skip
    disk_cache_size: int = setting(
        20 * 10**9, type=byte_size, metavar="SIZE",
        help="most bytes kept on disk, least recently used deleted first (e.g. 20GB; "
        "default %(default)s)",
    )  # fmt: skip
    disk_cache_min_tokens: int = setting(
        512, type=non_negative_int, metavar="N",
        help="shorter entries stay in memory only (default %(default)s)",
    )  # fmt: skip
    disk_cache_pending: int = setting(
        2 * 2**30, type=byte_size, metavar="SIZE",
        help="most bytes waiting to be written; past it new entries are skipped "
        "(default %(default)s)",
    )  # fmt: skip


@hookimpl
def mlxcore_addoption(parser: Any) -> None:
    """``--disk-cache-dir``, ``--disk-cache-size``, ``--disk-cache-min-tokens``,
    ``--disk-cache-pending``."""
    add_flags(parser, DiskCacheSettings)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Check the sizes (also when set without the command line)."""
    settings = read_settings(config, DiskCacheSettings)
    if settings.disk_cache_size <= 0:
        raise UsageError("--disk-cache-size must be more than 0 bytes")


@hookimpl
def mlxcore_cache_strategy(model: Any, info: ModelInfo, config: ServerConfig) -> CacheStrategy:
    """The built-in prefix cache of ``--prefix-cache-size`` with the disk tier behind it."""
    settings = read_settings(config, DiskCacheSettings)
    memory = prefix_cache_for(model, config.prefix_cache_size, distributed=config.distributed)
    kv_quant = KVQuantization.from_config(config)
    root = Path(settings.disk_cache_dir).expanduser() if settings.disk_cache_dir else default_dir()
    store: DiskStore | None = None
    try:
        layout = layout_of(make_prompt_cache(model))
        if kv_quant is not None:
            layout.append(f"kv-cache {kv_quant.label}")  # quantized entries: their own folder
        fingerprint = model_fingerprint(info.path, model, layout)
        store = DiskStore(root / fingerprint[:24], settings.disk_cache_size)
        store.refresh()
        log.info(
            "disk-cache: %d entries (%.1f MB) for this model in %s",
            len(store.entries),
            store.nbytes() / 1e6,
            root,
        )
    except OSError as exc:
        log.warning(
            "disk-cache: %s cannot be used (%s); prefix reuse stays in memory only", root, exc
        )
    return DiskTieredCache(
        model,
        memory,
        store,
        min_tokens=settings.disk_cache_min_tokens,
        max_pending_bytes=settings.disk_cache_pending,
        kv_quant=kv_quant,
    )

"""Read a model folder without loading it: its config, its architecture, its
safetensors headers, and whether its weights fit in memory.

:func:`check_model_folder` validates a folder without reading tensors (config,
architecture known to mlx-lm, complete safetensors files, weights that fit in
memory). Nothing here imports mlx-lm's models or the rest of :mod:`mlxcore.models`.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Collection
from pathlib import Path
from typing import Any

from mlxcore.errors import ModelLoadError

logger = logging.getLogger(__name__)

_MAX_HEADER_BYTES = 100 * 1024 * 1024


def check_model_folder(
    path: Path, *, check_memory: bool = True, architectures: Collection[str] = ()
) -> dict[str, Any]:
    """Check an MLX/HF folder without loading tensors; return its ``config.json``
    (``architectures``: ones a plugin loads, accepted without an mlx-lm module: names
    from ``config.json``'s ``architectures`` or its ``model_type``).

    Raises:
        ModelLoadError: missing config, unsupported architecture, missing or corrupt
            safetensors, or weights too large for this machine's memory.
    """
    config = read_config(path)
    listed = config.get("architectures") or ()
    named = set(listed) if isinstance(listed, list) else set()
    named.add(str(config.get("model_type", "")))
    if not named & set(architectures):
        mlx_module_for(config, path)
    files = sorted(path.glob("model*.safetensors"))  # what mlx-lm loads
    if not files:
        raise ModelLoadError(f"no model*.safetensors weight files in model folder {path}")
    total = 0
    for file in files:
        read_safetensors_header(file)
        total += file.stat().st_size
    if check_memory:
        check_fits_in_memory(total, path)
    return config


def read_config(path: Path) -> dict[str, Any]:
    """Read ``config.json`` of a model folder, raising :class:`ModelLoadError` when unusable."""
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"model folder {path} has no config.json")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {config_path}: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_path} is not a JSON object")
    return config


def mlx_module_for(config: dict[str, Any], path: Path) -> str:
    """The ``mlx_lm.models`` module name that implements ``config``'s architecture.

    Applies mlx-lm's own model-type remapping (e.g. ``mistral`` -> ``llama``).
    """
    import importlib.util

    from mlx_lm import utils as mlx_utils

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelLoadError(f"{path / 'config.json'} has no model_type")
    name = model_type
    archs = config.get("architectures") or ()
    if isinstance(archs, str):
        archs = (archs,)
    arch_remap: dict[tuple[str, str], str] = getattr(mlx_utils, "MODEL_ARCHITECTURE_REMAPPING", {})
    for arch in archs:
        if (model_type, arch) in arch_remap:
            name = arch_remap[(model_type, arch)]
            break
    else:
        name = mlx_utils.MODEL_REMAPPING.get(model_type, model_type)
    try:
        spec = importlib.util.find_spec(f"mlx_lm.models.{name}")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ModelLoadError(
            f"unsupported architecture {model_type!r} in {path}: "
            f"mlx-lm has no module mlx_lm.models.{name}"
        )
    return name


def read_safetensors_header(file: Path) -> dict[str, Any]:
    """The tensor table of a ``.safetensors`` file (its JSON header), checked for truncation.

    Only the header is read. ``__metadata__`` is dropped.

    Raises:
        ModelLoadError: the file is unreadable, corrupt, or shorter than its header says.
    """
    try:
        size = file.stat().st_size
        with file.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ModelLoadError(f"weights file {file} is truncated or corrupt (too short)")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > min(_MAX_HEADER_BYTES, size - 8):
                raise ModelLoadError(f"weights file {file} is truncated or corrupt (bad header)")
            header = json.loads(fh.read(header_len))
    except OSError as exc:
        raise ModelLoadError(f"cannot read weights file {file}: {exc}") from exc
    except ValueError as exc:
        raise ModelLoadError(f"weights file {file} is corrupt (bad JSON header): {exc}") from exc
    if not isinstance(header, dict):
        raise ModelLoadError(f"weights file {file} is corrupt (header is not an object)")
    header.pop("__metadata__", None)
    end = 0
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise ModelLoadError(f"weights file {file} is corrupt (tensor {name!r})")
        end = max(end, int(offsets[1]))
    expected = 8 + header_len + end
    if size < expected:
        raise ModelLoadError(
            f"weights file {file} is truncated: {size} bytes on disk, header needs {expected}"
        )
    return header


def memory_bytes() -> tuple[int | None, int | None]:
    """(physical memory, currently available memory + free swap) in bytes; None if unknown."""
    total: int | None = None
    available: int | None = None
    try:
        info: dict[str, int] = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024
        total = info.get("MemTotal")
        if "MemAvailable" in info:
            available = info["MemAvailable"] + info.get("SwapFree", 0)
    except (OSError, ValueError, IndexError):
        pass
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = None
    return total, available


def check_fits_in_memory(weight_bytes: int, path: Path) -> None:
    """Refuse weights that clearly cannot fit in this machine's memory.

    Raises:
        ModelLoadError: when the weights exceed physical memory or the memory available now.
    """
    total, available = memory_bytes()
    gib = 1024**3
    if total is not None and weight_bytes > total:
        raise ModelLoadError(
            f"not enough memory for {path}: its weights take {weight_bytes / gib:.1f} GiB, "
            f"this machine has {total / gib:.1f} GiB of physical memory"
        )
    if available is not None and weight_bytes > available:
        raise ModelLoadError(
            f"not enough memory for {path}: its weights take {weight_bytes / gib:.1f} GiB, "
            f"only {available / gib:.1f} GiB is available now "
            "(set MLXCORE_SKIP_MEMORY_CHECK=1 to try anyway)"
        )


def read_weight_keys(path: Path) -> frozenset[str]:
    """Names of every tensor in the folder's ``*.safetensors`` files, read from their headers.

    Includes tensors mlx-lm's model class drops (e.g. ``mtp.*``); no tensor data is read.
    """
    keys: set[str] = set()
    for file in sorted(Path(path).glob("*.safetensors")):
        keys.update(read_safetensors_header(file))
    return frozenset(keys)


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds a whole model: ``config.json``, a tokenizer, and every
    weight file its index names (or one ``model.safetensors``)."""
    if not (path / "config.json").is_file():
        return False
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return False
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        return all((path / name).is_file() for name in names)
    return (path / "model.safetensors").is_file() or any(path.glob("model*.safetensors"))

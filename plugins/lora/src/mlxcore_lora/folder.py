"""Reading an mlx-lm adapter folder and checking it against the base model.

The folder is what ``mlx_lm.lora`` writes: ``adapter_config.json`` (``fine_tune_type``,
``lora_parameters`` with ``rank`` and ``scale``) and ``adapters.safetensors``, whose keys
are ``<module path>.lora_a`` (``input_dims x rank``) and ``<module path>.lora_b``
(``rank x output_dims``) for each adapted linear layer of the model. Every problem is an
:class:`AdapterError` that names the folder and what is wrong with it, before anything
is attached to the model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn

from mlxcore.errors import MlxcoreError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapters.safetensors"
MAX_RANK = 1024
"""The largest rank accepted (mlx-lm's defaults are 8 to 64)."""


class AdapterError(MlxcoreError):
    """An adapter folder that cannot be served on this model."""


@attrs.frozen
class AdapterWeights:
    """One adapter, read and checked: its low-rank pairs per adapted layer."""

    name: str
    path: str
    scale: float
    layers: dict[str, tuple[mx.array, mx.array]]
    """Module path -> (``lora_a``, ``lora_b``)."""
    rank: int

    @property
    def nbytes(self) -> int:
        """Bytes the adapter's weights hold."""
        return sum(a.nbytes + b.nbytes for a, b in self.layers.values())


def linear_dims(module: Any) -> tuple[int, int] | None:
    """(input, output) dims of a linear layer (plain or quantized), ``None`` otherwise."""
    if isinstance(module, nn.QuantizedLinear):
        out_dims, packed = module.weight.shape
        return packed * 32 // module.bits, out_dims
    if isinstance(module, nn.Linear):
        out_dims, in_dims = module.weight.shape
        return in_dims, out_dims
    return None


def _config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise AdapterError(f"{folder}: no {CONFIG_FILE} (not an mlx-lm adapter folder)")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path}: expected a JSON object")
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise AdapterError(
            f"{path}: fine_tune_type {kind!r} is not served; only 'lora' adapters are "
            "(fuse a DoRA or full fine-tune into the model with mlx_lm.fuse)"
        )
    return config


def _scale(config: dict[str, Any], folder: Path) -> float:
    params = config.get("lora_parameters")
    scale = params.get("scale") if isinstance(params, dict) else None
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
        raise AdapterError(
            f"{folder / CONFIG_FILE}: lora_parameters.scale must be a number (mlx-lm's "
            "config calls it 'scale', not 'alpha')"
        )
    return float(scale)


def _tensors(folder: Path) -> dict[str, mx.array]:
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise AdapterError(f"{folder}: no {WEIGHTS_FILE}")
    try:
        loaded = mx.load(str(path))
    except Exception as exc:  # MLX raises RuntimeError/ValueError for broken files
        raise AdapterError(f"{path}: not a readable safetensors file ({exc})") from None
    if not isinstance(loaded, dict) or not loaded:
        raise AdapterError(f"{path}: holds no tensors")
    return loaded


def read_adapter(
    name: str, folder: str | Path, targets: dict[str, tuple[int, int]]
) -> AdapterWeights:
    """The adapter in ``folder``, checked against ``targets`` (module path -> (input,
    output) dims of the model's linear layers); raises :class:`AdapterError`."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise AdapterError(f"{folder}: not a folder")
    config = _config(folder)
    scale = _scale(config, folder)
    tensors = _tensors(folder)
    pairs: dict[str, dict[str, mx.array]] = {}
    for key, value in tensors.items():
        path, _, leaf = key.rpartition(".")
        if leaf not in ("lora_a", "lora_b") or not path:
            raise AdapterError(f"{folder}: {key!r} is not a LoRA tensor (lora_a / lora_b)")
        pairs.setdefault(path, {})[leaf] = value
    layers: dict[str, tuple[mx.array, mx.array]] = {}
    ranks = set()
    for path, pair in sorted(pairs.items()):
        dims = targets.get(path)
        if dims is None:
            raise AdapterError(f"{folder}: {path!r} is not a linear layer of this model")
        if set(pair) != {"lora_a", "lora_b"}:
            raise AdapterError(f"{folder}: {path!r} needs both lora_a and lora_b")
        a, b = pair["lora_a"], pair["lora_b"]
        rank = a.shape[-1] if a.ndim == 2 else -1
        if a.shape != (dims[0], rank) or b.shape != (rank, dims[1]) or not 0 < rank <= MAX_RANK:
            raise AdapterError(
                f"{folder}: {path!r} has lora_a {tuple(a.shape)} and lora_b "
                f"{tuple(b.shape)}; this model's layer needs ({dims[0]}, r) and (r, {dims[1]}) "
                f"with 0 < r <= {MAX_RANK}"
            )
        if not (mx.issubdtype(a.dtype, mx.floating) and mx.issubdtype(b.dtype, mx.floating)):
            raise AdapterError(f"{folder}: {path!r} is not a floating-point tensor")
        layers[path] = (a, b)
        ranks.add(rank)
    mx.eval(list(layers.values()))
    for path, (a, b) in layers.items():
        if not (bool(mx.isfinite(a).all()) and bool(mx.isfinite(b).all())):
            raise AdapterError(f"{folder}: {path!r} holds NaN or infinite values")
    return AdapterWeights(name, str(folder), scale, layers, max(ranks))
